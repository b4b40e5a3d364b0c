"""The demo's residual stage (issue 23 items 1-3, 6): a residual on the best same-information
heuristic, built and gated inside ``linkwise demo``.

``build_residuals`` (before the evaluation): the base chosen on the validation windows
(``pipelines.residual.choose_base``: every same-information heuristic, warm-started from the
accounting), counterfactual labels under it on the windows before those
(``datasets.labels``), BC and CQL on the labels (``train_on_labels``), each one's margin
chosen on the validation windows (``choose_margin``: ``inf``, the base itself, is always a
candidate). ``gate_residual`` (after it): the promoted residual (the lower validation average
JCT at its margin; ties: BC) against the best same-information heuristic of the held-out
evaluation, by the challenger gate's own thresholds (``evaluation/gates.toml``): the avg-JCT
ratio and its interval, p99, decision latency, masked actions where they were counted. FQE
and the champion do not apply to a package that is at worst its base, nor the masked-action
count to one that is no step policy (its deviations are candidate rows of the base's own
state): they are left out of its verdict. ``learning_statement`` (the summary's last line and
``demo.json``'s ``residual.learning``): the teacher's headroom over the base in the labels the
stage built, and what the residual did with it, or plainly that there was nothing to learn.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Topology
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.backlog import backlog_from_store
from linkwise.datasets.labels import LabelTask, run_labels, write_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, cut_windows, jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.evaluation.benchmark import EvalCase, load_benchmark, make_cases
from linkwise.evaluation.gates import GateConfig, GateReport, check_challenger
from linkwise.models.residual import Deferral, topology_signature
from linkwise.models.training import AlgoConfig
from linkwise.pipelines.evaluate import gate_evidence
from linkwise.pipelines.experiment import Experiment, ResidualPlan
from linkwise.pipelines.residual import (
    BaseChoice,
    choose_base,
    choose_margin,
    label_deferral,
    label_headroom,
    train_on_labels,
)
from linkwise.pipelines.selection import validation_windows

__all__ = [
    "HEADROOM_MIN_GAIN_S",
    "HEADROOM_MIN_SHARE",
    "LEARNERS",
    "build_residuals",
    "gate_residual",
    "learning_statement",
    "residual_heldout",
    "residual_label",
    "residual_summary",
    "residual_windows",
]

LEARNERS: tuple[str, ...] = ("bc", "cql")
# the challenger gate's checks that apply to a residual (FQE and the champion do not)
RESIDUAL_CHECKS = (
    "better_than_best_heuristic",
    "p99_vs_best_heuristic",
    "decision_latency",
    "no_masked_actions",
)
# The teacher shows headroom over the base (``learning_statement``) when its labels find a
# better move at this share of the labelled decision points or more AND their gain, over
# every labelled point, averages this many jobs-in-system seconds or more: below either the
# base already does (almost) what the teacher would and the demo says there is nothing to
# learn. (The demo's default on 2026-12-05: 2 of 17 points, 57 s a point: nothing; issue
# 33's 64x8 1:1 ECMP all-flexible chain: 10 of 16 points, 1.055 h a point: headroom.)
HEADROOM_MIN_SHARE = 0.1
HEADROOM_MIN_GAIN_S = 360.0


def residual_label(algo: str) -> str:
    """The residual's name in the comparison table (``residual-BC``)."""
    return f"residual-{algo.upper()}"


def residual_windows(
    db: Path,
    slurm_cluster: str,
    topo: Topology,
    exp: Experiment,
    until: float,
    validation: Sequence[Window],
) -> tuple[list[Window], list[Window]]:
    """(validation windows, label windows): the run's validation windows (else the plan's
    last windows before ``until``) and the plan's ``label_windows`` busy windows before them."""
    plan = _plan(exp)
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con, cluster=slurm_cluster)
    cut = cut_windows(jobs, exp.windows.window_s, max_gpus=topo.total_gpus)
    val = list(validation) or validation_windows(
        cut, until, plan.validation_windows, exp.windows.min_jobs
    )
    start = min(w.start for w in val)
    before = [w for w in cut if w.end <= start and len(w.jobs) >= exp.windows.min_jobs]
    if not before:
        raise ValueError("no busy window before the validation windows to label")
    return val, before[-plan.label_windows :]


def _plan(exp: Experiment) -> ResidualPlan:
    if exp.residual is None:
        raise ValueError(f"experiment {exp.name!r} has no residual plan")
    return exp.residual


def build_residuals(
    exp: Experiment,
    topo: Topology,
    *,
    db: Path,
    slurm_cluster: str,
    until: float,
    validation: Sequence[Window],
    predictor: RuntimePredictor,
    out: Path,
    uri: str,
    seed: int,
    console: Console,
) -> dict[str, Any]:
    """The base, the labels and one residual package per learner, each at its margin chosen
    on the validation windows (module docstring): a JSON-able summary with every figure."""
    plan = _plan(exp)
    # the stage's folder is its own: a demo run again in the same place rebuilds it (packages
    # refuse a non-empty folder)
    shutil.rmtree(out / "residual", ignore_errors=True)
    val, label_ws = residual_windows(db, slurm_cluster, topo, exp, until, validation)
    with closing(open_store(db)) as con:
        backlogs = {
            w.window_id: backlog_from_store(con, topo, slurm_cluster, w.start, predictor)
            for w in [*val, *label_ws]
        }
    cal = load_calibration(None)
    val_cases = make_cases(
        val, (seed,), topo, calibration=cal, block_s=exp.windows.block_s,
        backlogs=backlogs, predictor=predictor,
    )  # fmt: skip
    base = _choose_base(val_cases, len(val), console)
    cfg: MdpConfig = exp.mdp
    policy = base.spec.build(AnalyticModel(cal))
    tasks = [
        LabelTask(
            base=policy,
            base_name=base.spec.label,
            window=w,
            topology=topo,
            seed=seed,
            config=cfg,
            calibration=cal,
            predictor=predictor,
            block_s=exp.windows.block_s,
            horizon_s=plan.horizon_s,
            n=plan.n,
            points=plan.points,
            alternatives=plan.alternatives,
            backlog=backlogs.get(w.window_id),
        )
        for w in label_ws
    ]
    labels, manifest = _labels(tasks, plan, cfg, base.spec.label, seed, out / "residual" / "labels")
    points = labels.select("episode", "point").unique().height
    better = manifest["counts"]["points_with_a_better_move"]
    console.print(
        f"labels {str(manifest['hash'])[:16]}: {labels.height} scored moves at {points} "
        f"decision points of {len(label_ws)} windows ({better} with a move better than the base's)"
    )
    sig = [topology_signature(topo)]
    deferral = label_deferral(labels, make_spec(cfg), sig, min_support=3)
    chosen_on = (base, deferral, val_cases)
    learners: dict[str, Any] = {}
    for algo in LEARNERS:
        learners[algo] = _learner(
            algo, labels, manifest, chosen_on, plan,
            predictor=predictor, out=out, uri=uri, seed=seed, console=console,
        )  # fmt: skip
    finite = [a for a in LEARNERS if learners[a]["validation_avg_jct_s"] is not None]
    promoted = min(finite, key=lambda a: learners[a]["validation_avg_jct_s"]) if finite else None
    return {
        "base": base.to_json(),
        "base_rule": (
            "the lowest avg JCT among the same-information heuristics on the validation "
            "windows (one seed, warm-started)"
        ),
        "validation_windows": [w.window_id for w in val],
        "label_windows": [w.window_id for w in label_ws],
        # the teacher's headroom over the base, from the label rows (``learning_statement``)
        "headroom": label_headroom(labels),
        "labels": {
            "hash": manifest["hash"],
            "rows": labels.height,
            "points": points,
            "points_with_a_better_move": better,
            "executor": plan.executor,
        },
        "learners": learners,
        "promoted": promoted,
    }


def _choose_base(val_cases: Sequence[EvalCase], n_windows: int, console: Console) -> BaseChoice:
    """The same-information heuristic with the lowest avg JCT on the validation cases."""
    base = choose_base(val_cases)
    ranked = sorted(base.figures.items(), key=lambda kv: math.inf if kv[1] is None else kv[1])
    console.print(
        f"base {base.spec.label}: the lowest avg JCT of {len(base.figures)} same-information "
        f"heuristics on {n_windows} validation windows ("
        + ", ".join(f"{k} {'-' if v is None else duration_text(v)}" for k, v in ranked[:4])
        + ", ...)"
    )
    return base


def _labels(
    tasks: Sequence[LabelTask],
    plan: ResidualPlan,
    cfg: MdpConfig,
    base: str,
    seed: int,
    folder: Path,
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The counterfactual labels of ``tasks``, written to ``folder``; (labels, manifest)."""
    labels = run_labels(tasks, plan.executor)
    manifest = write_labels(
        labels,
        cfg,
        {"base": base, "horizon_s": plan.horizon_s, "n": plan.n,
         "windows": [t.window.window_id for t in tasks], "seed": seed},
        folder,
    )  # fmt: skip
    return labels, manifest


def _learner(
    algo: str,
    labels: pl.DataFrame,
    manifest: Mapping[str, Any],
    chosen_on: tuple[BaseChoice, Deferral, Sequence[EvalCase]],
    plan: ResidualPlan,
    *,
    predictor: RuntimePredictor,
    out: Path,
    uri: str,
    seed: int,
    console: Console,
) -> dict[str, Any]:
    """One learner on the labels and its margin chosen on the validation cases (``chosen_on``:
    the base, the deferral, the validation cases); its summary."""
    base, deferral, val_cases = chosen_on
    params = AlgoConfig(
        n_steps=plan.steps, n_steps_per_epoch=plan.steps, batch_size=64,
        hidden_units=(128, 128), alpha=1.0, gamma=0.0, target_update_interval=100,
    )  # fmt: skip
    trained = train_on_labels(
        labels, manifest, algo, params, out / "residual" / "packages",
        predictor=predictor, tracking_uri=uri, seed=seed,
    )  # fmt: skip
    m = choose_margin(
        trained.package_dir, base, deferral, val_cases, out / "residual" / algo,
        plan.margins,
    )  # fmt: skip
    chosen = m.figures[f"margin-{m.to_json()['margin']}"]
    console.print(
        f"{residual_label(algo)}: label match {trained.label_match:.2f}, margin "
        f"{m.to_json()['margin']} chosen on validation ("
        + ", ".join(
            f"{k.removeprefix('margin-')}: "
            + ("-" if f["avg_jct_s"] is None else duration_text(f["avg_jct_s"]))
            + f" {_dev(f['deviations_per_1000'])}/1k"
            for k, f in m.figures.items()
        )
        + ")"
    )
    return {
        "label": residual_label(algo),
        "package": m.package_dir,
        "spec": f"model:{m.package_dir}",
        "margin": m.to_json()["margin"],
        "validation_avg_jct_s": chosen["avg_jct_s"],
        "validation_deviations_per_1000": chosen["deviations_per_1000"],
        "margins": m.figures,
        "run_id": trained.run_id,
        "label_match": trained.label_match,
        "steps": trained.steps,
    }


def _dev(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def gate_residual(
    residual: Mapping[str, Any],
    evaluation_dir: str,
    gates: GateConfig,
    *,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """The promoted residual against the best same-information heuristic of the held-out
    evaluation (module docstring): the gate's report as JSON, with the reference named."""
    algo = residual["promoted"]
    if algo is None:
        return {"stage": "residual", "subject": None, "passed": False,
                "reasons": ["no residual finished its validation windows"]}  # fmt: skip
    spec = residual["learners"][algo]["spec"]
    bench = load_benchmark(evaluation_dir)
    if spec not in {r["policy"] for r in bench.summary()}:
        return {"stage": "residual", "subject": residual_label(algo), "passed": False,
                "reasons": [f"{residual_label(algo)} failed its held-out cases"]}  # fmt: skip
    ev = gate_evidence(bench, spec, champion=None, n_boot=n_boot, seed=seed)
    full = check_challenger(ev, gates.challenger)
    report = GateReport(
        "residual->promoted",
        residual_label(algo),
        tuple(
            c
            for c in full.checks
            if c.name in RESIDUAL_CHECKS
            and not (c.name == "no_masked_actions" and ev.masked_actions is None)
        ),
    )
    return {
        **report.to_json(),
        "reasons": report.reasons,
        "reference": ev.best_heuristic,
        "base": residual["base"]["base"],
        "text": report.format(),
    }


def residual_heldout(
    residual: Mapping[str, Any], table: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The residual summary with each residual's held-out figures from the table: avg JCT,
    ratio to its base's, deviations per 1,000 decisions (None: it failed its cases)."""
    rows = {r["spec"]: r for r in table}
    base = rows.get(residual["base"]["base"], {})
    heldout: dict[str, Any] = {}
    for algo, r in residual["learners"].items():
        row = rows.get(r["spec"])
        if row is None:
            heldout[algo] = None
            continue
        jct, base_jct = row["avg_jct_s"], base.get("avg_jct_s")
        heldout[algo] = {
            "avg_jct_s": jct,
            "ratio_to_base": jct / base_jct if jct is not None and base_jct else None,
            "avg_ratio_to_best_heuristic": row["avg_ratio_to_best_heuristic"],
            "deviations_per_1000": row.get("deviations_per_1000"),
        }
    out = {**residual, "heldout": heldout}
    return {**out, "learning": learning_statement(out)}


def learning_statement(residual: Mapping[str, Any]) -> str:
    """What learning decided, in plain words, from the labels the stage built (``headroom``)
    and the promoted residual's held-out figures (``heldout``): at how many labelled decision
    points the teacher found a better move than the base, their mean and total gain, then
    either what the residual did with it (deviations per 1,000 decisions, avg JCT against its
    base on the held-out days) or, below ``HEADROOM_MIN_SHARE`` / ``HEADROOM_MIN_GAIN_S``,
    that there was nothing to learn."""
    h = residual["headroom"]
    points, better = h["points"], h["points_with_a_better_move"]
    base = residual["base"]["base"]
    teacher = (
        f"the teacher (lookahead labels under {base}) found a better move than the base at "
        f"{better} of {points} labelled decision points (gain {_hours(h['mean_gain_s'])} of "
        f"jobs-in-system a point on average, {_hours(h['total_gain_s'])} in all)"
    )
    share = better / points if points else 0.0
    if share < HEADROOM_MIN_SHARE or h["mean_gain_s"] < HEADROOM_MIN_GAIN_S:
        return (
            f"{teacher}; nothing to learn here: the base already does what the teacher would "
            f"at {points - better} of {points} points"
        )
    algo = residual.get("promoted")
    held = None if algo is None else residual.get("heldout", {}).get(algo)
    if algo is None or held is None:
        return f"{teacher}; no residual finished its held-out days to follow it"
    dev, ratio = held["deviations_per_1000"], held["ratio_to_base"]
    followed = "did not follow it" if dev == 0 else "followed it"
    return (
        f"{teacher}; the residual ({residual_label(algo)}, margin "
        f"{residual['learners'][algo]['margin']}) {followed}: "
        f"{'-' if dev is None else f'{dev:.1f}'} deviations per 1,000 decisions, avg JCT "
        f"{'-' if ratio is None else f'{ratio:.3f}'}x its base on the held-out days"
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600.0:.2f} h"


def residual_summary(residual: Mapping[str, Any], gate: Mapping[str, Any] | None) -> str:
    """The residual's lines under the table: the base and how it was chosen, each residual's
    margin and deviations per 1,000 decisions, and the gate's verdict with its reasons."""
    base = residual["base"]
    lines = [
        f"residual base: {base['base']} "
        f"({residual['base_rule']}: {duration_text(base['avg_jct_s'])})"
    ]
    for algo, r in residual["learners"].items():
        held = residual.get("heldout", {}).get(algo)
        if held is None:
            lines.append(f"  {r['label']}: margin {r['margin']}, failed its held-out cases")
            continue
        dev = held["deviations_per_1000"]
        ratio = held["ratio_to_base"]
        lines.append(
            f"  {r['label']}: margin {r['margin']}, "
            f"{'-' if dev is None else f'{dev:.1f}'} deviations per 1,000 decisions on the "
            f"held-out days, avg JCT {'-' if ratio is None else f'{ratio:.3f}'}x its base"
        )
    if gate is not None:
        verdict = "PASSED" if gate["passed"] else "REFUSED"
        ref = gate.get("reference")
        lines.append(
            f"gate {gate['subject']} vs the best same-information heuristic"
            f"{f' ({ref})' if ref else ''}: {verdict}"
        )
        lines += [f"  {x}" for x in gate["reasons"]]
    if "headroom" in residual:  # what learning decided, last
        lines.append(f"learning: {learning_statement(residual)}")
    return "\n".join(lines)
