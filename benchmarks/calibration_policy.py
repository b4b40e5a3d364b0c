"""Does a policy trained on the recovered simulator do as well as one trained on the truth?
(issue 34 item 4 and its "Expected" line)

The hidden-truth cluster of ``calibration_recovery.py`` (``datasets.hidden_truth``: 8x8
H100-class nodes, alpha 0.9, a 4 ms per-node overhead, six job names with invented profiles)
fills a store through the real exporters' text and ingest; its calibration is fitted from the
store alone (``datasets.contention_fit.fit.fit_cluster_calibration``, as ``linkwise calibrate``
does). Then the residual recipe (``pipelines.residual``: the base chosen on the validation
days among every same-information heuristic, counterfactual labels under it on the training
days, a d3rlpy learner on the labels, its margin chosen on the validation days) runs three
times with the same seed and config, on three simulators of the same cluster and workload:

- ``truth``: the hidden calibration, every job on its own hidden profile;
- ``recovered``: the fitted calibration, every job on its fitted profile
  (``history:name=NAME``);
- ``shipped``: the shipped calibration (DeepShare/Pollux testbeds), every job on a profile
  drawn from its default mix (it knows none of these job names).

All three policies and their bases are then evaluated on held-out days of the truth
(``evaluation.benchmark``; the cases carry the hidden calibration, so every policy's
contention belief at evaluation is the truth's: the calibration reaches a policy only through
its base choice, its labels and its training). Prints a markdown report and writes
``--out`` (JSON).

    PYTHONPATH=. nice -n 15 .venv/bin/python benchmarks/calibration_policy.py \
        --store /tmp/truth.duckdb [--out benchmarks/results/calibration_policy.json]

``--store`` keeps the filled store (a store that exists is fitted again without refilling;
it must come from the same truth arguments, e.g. ``calibration_recovery.py --store``).
``--flexible SHARE`` replays that share of the policies' workload's multi-GPU jobs as
flexible requests (``cluster.flexible.with_flexible``, seed ``--flexible-seed``, 0 by default
as ``residual_headline.py --flexible``), drawn once on the whole workload before it is cut:
the base choice, the labels, the training and the held-out cases all see the same forms (the
telemetry the calibration is fitted from keeps fixed shapes). ``--gpu-scale X`` makes the
policies' jobs larger: every job asks X times its GPUs (rounded), generated at load
``--load``/X so that the GPU load stays ``--load`` (e.g. 1.5: 3/6/12/24 GPUs, sizes that do
not fill a node's 8).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Topology
from linkwise.cluster.flexible import draw_summary, summary_text, with_flexible
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.datasets.comm_profiles import PROFILE_PREFIX
from linkwise.datasets.contention_fit.fit import fit_cluster_calibration
from linkwise.datasets.hidden_truth.recovery import recovery
from linkwise.datasets.hidden_truth.store import fill_truth_store
from linkwise.datasets.hidden_truth.truth import HiddenTruth, truth_workload
from linkwise.datasets.job_telemetry import build_job_telemetry
from linkwise.datasets.labels import LabelTask, run_labels, write_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, cut_windows, windows_predictor
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import jobs_frame
from linkwise.evaluation.benchmark import Benchmark, EvalCase, PolicyRef, make_cases, run_benchmark
from linkwise.evaluation.gates import same_information_heuristics
from linkwise.evaluation.stats import paired_arrays, paired_ratio
from linkwise.models.residual import format_margin, topology_signature
from linkwise.models.training import AlgoConfig
from linkwise.pipelines.residual import (
    best_actions,
    choose_base,
    choose_margin,
    label_deferral,
    train_on_labels,
)
from linkwise.policies.spec import PolicySpec

HOUR = 3600.0
ARMS: tuple[tuple[str, str, int], ...] = (
    ("truth", "truth", 0),
    ("recovered", "recovered", 0),
    ("shipped", "shipped", 0),
    # the truth's recipe again with another training seed: the learner's own spread
    ("truth-seed1", "truth", 1),
)
"""Each arm: its name, the simulator it trains on, its training seed's offset."""


def the_truth(args: argparse.Namespace) -> HiddenTruth:
    """``calibration_recovery.py``'s truth for the same arguments (the store's)."""
    return HiddenTruth.default(
        alpha=args.alpha,
        overhead_s=args.overhead,
        topology_spec=f"{args.nodes}x8,leaf={min(4, args.nodes)},nic=50,intra=450,oversub=2",
        hours=args.hours,
        load=1.0,
        min_s=240.0,
        max_s=900.0,
        seed=args.seed,
        wrap_nodes=("gpu1",),
        reset_nodes=("gpu2",),
        port32_nodes=(f"gpu{args.nodes}",) if args.nodes > 4 else (),
        bad_rate=0.002,
        miss_rate=0.005,
    )


def fitted(truth: HiddenTruth, store: Path | None) -> tuple[Any, dict[str, Any]]:
    """The calibration fitted on the truth's store (filled first when new), with the fill's
    figures."""
    fresh = store is None or not store.exists()
    with closing(open_store(":memory:" if store is None else store)) as con:
        fill: dict[str, Any] = {"reused": not fresh}
        if fresh:
            t = time.perf_counter()
            fill.update(fill_truth_store(con, truth).to_dict())
            build_job_telemetry(con, interval_s=truth.interval_s)
            fill["fill_s"] = time.perf_counter() - t
        return fit_cluster_calibration(con, truth.topology()), fill


def profile_rule(arm: str, cal: Calibration) -> Callable[[str], str]:
    """How an arm's simulator names a job's profile from its job name: the truth its own, the
    fitted calibration ``history:name=NAME`` where it has one, the shipped none (its default
    mix draws one; so does the fitted calibration's for a name it lacks): "" for none."""
    if arm == "truth":
        return lambda name: name
    if arm == "recovered":
        return lambda name: (
            f"{PROFILE_PREFIX}name={name}" if f"{PROFILE_PREFIX}name={name}" in cal.profiles else ""
        )
    return lambda name: ""


def renamed(windows: Sequence[Window], rule: Callable[[str], str]) -> list[Window]:
    """The windows with every job's profile as ``rule`` names it from the job's name."""
    return [
        replace(w, jobs=tuple(replace(j, profile=rule(j.name)) for j in w.jobs)) for w in windows
    ]


def scaled(jobs: Sequence[Job], scale: float) -> tuple[Job, ...]:
    """The jobs asking ``scale`` times their GPUs (rounded, at least 1)."""
    if scale == 1.0:
        return tuple(jobs)
    return tuple(replace(j, num_gpus=max(1, round(j.num_gpus * scale))) for j in jobs)


def _h(x: float | None) -> str:
    return "-" if x is None else f"{x / HOUR:.4f}"


def train_arm(
    arm: str,
    sim: str,
    seed: int,
    cal: Calibration,
    windows: dict[str, list[Window]],
    topo: Topology,
    predictor: RuntimePredictor,
    args: argparse.Namespace,
    work: Path,
    stamp: Callable[[], str],
) -> dict[str, Any]:
    """The residual recipe on one arm's simulator (``sim``): base, labels, learner (training
    seed ``seed``), margin; the labels ride along under ``"frame"``."""
    rule = profile_rule(sim, cal)
    val_cases = make_cases(
        renamed(windows["validation"], rule),
        args.val_seeds,
        topo,
        calibration=cal,
        predictor=predictor,
        block_s=args.block_s,
    )
    t = time.perf_counter()
    base = choose_base(val_cases)
    base_s = time.perf_counter() - t
    print(f"{arm}: base {base.spec.label} ({_h(base.avg_jct_s)} h) in {base_s:.0f} s {stamp()}")
    cfg = MdpConfig(
        k_slots=8,
        slot_order="mixed",
        running_slots=args.running_slots,
        generators=("bounded", "least_contention", "best_fit"),
    )
    base_policy = base.spec.build(AnalyticModel(cal))
    tasks = [
        LabelTask(
            base=base_policy,
            base_name=base.spec.label,
            window=w,
            topology=topo,
            seed=s,
            config=cfg,
            calibration=cal,
            predictor=predictor,
            block_s=args.block_s,
            horizon_s=args.horizon_h * HOUR,
            n=args.n,
            points=args.points,
            alternatives=args.alternatives,
        )
        for w in renamed(windows["train"], rule)
        for s in args.label_seeds
    ]
    t = time.perf_counter()
    labels = run_labels(tasks, args.executor)
    label_s = time.perf_counter() - t
    inputs = {
        "arm": sim,
        "calibration": cal.source,
        "base": base.spec.label,
        "horizon_s": args.horizon_h * HOUR,
        "n": args.n,
        "windows": [w.window_id for w in windows["train"]],
        "seeds": list(args.label_seeds),
    }
    manifest = write_labels(labels, cfg, inputs, work / arm / "labels")
    points = labels.select("episode", "point").unique().height
    print(f"{arm}: {labels.height} label rows at {points} points in {label_s:.0f} s {stamp()}")
    deferral = label_deferral(labels, make_spec(cfg), [topology_signature(topo)], min_support=3)
    params = AlgoConfig(
        n_steps=args.steps,
        n_steps_per_epoch=args.steps,
        batch_size=64,
        hidden_units=(128, 128),
        alpha=1.0,
        gamma=0.0,
        target_update_interval=100,
    )
    t = time.perf_counter()
    r = train_on_labels(
        labels,
        manifest,
        args.learner,
        params,
        work / arm / "pkgs",
        predictor=predictor,
        tracking_uri=f"sqlite:///{work / 'mlflow.db'}",
        seed=seed,
    )
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    m = choose_margin(r.package_dir, base, deferral, val_cases, work / arm / "res", args.margins)
    margin_s = time.perf_counter() - t
    print(
        f"{arm}: {args.learner} label match {r.label_match:.2f} ({train_s:.0f} s), "
        f"margin {m.margin} ({margin_s:.0f} s) {stamp()}"
    )
    return {
        "simulator": sim,
        "train_seed": seed,
        "frame": labels,
        "calibration": {"alpha": cal.alpha, "overhead_s": cal.overhead_s, "source": cal.source},
        "base": base.to_json(),
        "base_spec": base.spec,
        "base_s": base_s,
        "labels": {
            "rows": labels.height,
            "points": points,
            "hash": manifest["hash"],
            "seconds": label_s,
        },
        "train": {
            "learner": args.learner,
            "label_match": r.label_match,
            "run_id": r.run_id,
            "seconds": train_s,
            "transitions": r.transitions,
        },
        "margin": m.to_json(),
        "margin_s": margin_s,
        "package": m.package_dir,
    }


def agreement(labels: pl.DataFrame, truth: pl.DataFrame) -> dict[str, Any]:
    """How an arm's labels stand beside the truth's: the points with a better move than the
    base's (label below 0), the correlation of the labels of the moves both scored, and the
    share of points whose best move is the truth's."""
    keys = ["episode", "point", "action"]
    both = labels.select(*keys, "label_s").join(
        truth.select(*keys, pl.col("label_s").alias("truth_s")), on=keys, how="inner"
    )
    best = best_actions(labels).select("episode", "point", "action")
    tbest = best_actions(truth).select("episode", "point", pl.col("action").alias("truth_action"))
    same = best.join(tbest, on=["episode", "point"], how="inner")
    corr = (
        float(np.corrcoef(both["label_s"].to_numpy(), both["truth_s"].to_numpy())[0, 1])
        if both.height > 1
        else None
    )
    return {
        "points": best.height,
        "points_with_a_better_move": best_actions(labels).filter(pl.col("label_s") < 0).height,
        "moves_scored_by_both": both.height,
        "label_correlation": corr,
        "same_best_move": (
            float(np.mean(same["action"].to_numpy() == same["truth_action"].to_numpy()))
            if same.height
            else None
        ),
    }


def per_day(bench: Benchmark, policy: str, baseline: str) -> list[float]:
    """The ratio of average JCTs policy / baseline per held-out case (day x seed)."""
    pa, pb = paired_arrays(bench, policy, baseline)
    return [float(np.mean(a) / np.mean(b)) for a, b in zip(pa, pb, strict=True)]


def evaluate(
    arms: dict[str, dict[str, Any]],
    cases: list[EvalCase],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every arm's residual and base, and every same-information heuristic, on the truth's
    held-out cases; ratios to the truth-trained residual (and the truth's base), paired."""
    refs = [
        PolicyRef(f"residual-{a}", PolicySpec.parse(f"model:{c['package']}"))
        for a, c in arms.items()
    ]
    # the ungated residuals: each arm's package at a fixed margin, whatever its validation
    # days chose (what each arm's labels taught, before the margin defers it)
    fixed = format_margin(args.ungated) if args.ungated is not None else None
    if fixed is not None:
        refs += [
            PolicyRef(
                f"residual-{a}@{fixed}",
                PolicySpec.parse(f"model:{Path(c['package']).parent / f'margin-{fixed}'}"),
            )
            for a, c in arms.items()
        ]
    names = [str(n) for n in same_information_heuristics(predictions=True)]
    refs += [PolicyRef(n, PolicySpec.parse(n)) for n in names]
    t = time.perf_counter()
    bench = run_benchmark(refs, cases)
    seconds = time.perf_counter() - t
    rows = {r["policy"]: r for r in bench.summary()}
    out: dict[str, Any] = {"seconds": seconds, "cases": [c.case_id for c in cases], "policies": {}}
    for name, row in rows.items():
        out["policies"][name] = {
            "avg_jct_s": float(row["avg_jct_s"]),
            "p99_jct_s": float(row["p99_jct_s"]),
            "deviations_per_1000": row.get("deviations_per_1000"),
            "decisions": row.get("decisions"),
        }
    comparisons: dict[str, Any] = {}
    for a in arms:
        if a == "truth":
            continue
        pol, ref = f"residual-{a}", "residual-truth"
        ci = paired_ratio(bench, pol, ref, n_boot=args.n_boot)
        days = per_day(bench, pol, ref)
        comparisons[f"{pol} / {ref}"] = {**ci.to_json(), "per_case": days}
        b, bt = arms[a]["base"]["base"], arms["truth"]["base"]["base"]
        if b != bt:
            ci = paired_ratio(bench, b, bt, n_boot=args.n_boot)
            comparisons[f"{b} / {bt}"] = {**ci.to_json(), "per_case": per_day(bench, b, bt)}
        if fixed is not None:
            pol, ref = f"residual-{a}@{fixed}", f"residual-truth@{fixed}"
            ci = paired_ratio(bench, pol, ref, n_boot=args.n_boot)
            comparisons[f"{pol} / {ref}"] = {**ci.to_json(), "per_case": per_day(bench, pol, ref)}
    for a in arms:
        if fixed is not None:
            pol, b = f"residual-{a}@{fixed}", arms[a]["base"]["base"]
            ci = paired_ratio(bench, pol, b, n_boot=args.n_boot)
            comparisons[f"{pol} / {b}"] = {**ci.to_json(), "per_case": per_day(bench, pol, b)}
        pol, b = f"residual-{a}", arms[a]["base"]["base"]
        ci = paired_ratio(bench, pol, b, n_boot=args.n_boot)
        comparisons[f"{pol} / {b}"] = {**ci.to_json(), "per_case": per_day(bench, pol, b)}
    out["comparisons"] = comparisons
    return out


def report(out: dict[str, Any]) -> None:
    """The markdown tables."""
    held = out["heldout"]["policies"]
    comps = out["heldout"]["comparisons"]
    truth_res = held["residual-truth"]["avg_jct_s"]
    print(
        "\n| trained on | base (validation) | margin | label rows / points | label match |"
        " avg JCT h (truth, held-out) | / truth-trained [95% CI] | deviations / 1,000 |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for a, c in out["arms"].items():
        h = held[f"residual-{a}"]
        key = f"residual-{a} / residual-truth"
        ci = comps.get(key)
        ratio = "1" if ci is None else f"{ci['ratio']:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]"
        dev = h["deviations_per_1000"]
        print(
            f"| {a} | {c['base']['base']} | {c['margin']['margin']} | "
            f"{c['labels']['rows']} / {c['labels']['points']} | "
            f"{c['train']['label_match']:.2f} | {_h(h['avg_jct_s'])} | {ratio} | "
            f"{'-' if dev is None else f'{dev:.1f}'} |"
        )
    fixed = [k for k in held if k.startswith("residual-truth@")]
    if fixed:
        m = fixed[0].partition("@")[2]
        print(
            f"\nUngated: every arm's package at margin {m} (whatever its validation days chose), "
            "on the truth's held-out days:\n"
        )
        print("| trained on | avg JCT h | / truth-trained at the same margin [95% CI] | "
              "/ its base [95% CI] | deviations / 1,000 |")  # fmt: skip
        print("|---|---:|---|---|---:|")
        for a, c in out["arms"].items():
            pol, h = f"residual-{a}@{m}", held[f"residual-{a}@{m}"]
            cells = []
            for ref in (f"residual-truth@{m}", c["base"]["base"]):
                ci = comps.get(f"{pol} / {ref}")
                cells.append(
                    "1" if ci is None else f"{ci['ratio']:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]"
                )
            dev = h["deviations_per_1000"]
            print(
                f"| {a} | {_h(h['avg_jct_s'])} | {cells[0]} | {cells[1]} | "
                f"{'-' if dev is None else f'{dev:.1f}'} |"
            )
    print(
        "\nHeld-out days of the truth, every same-information heuristic (avg JCT h, "
        f"/ truth-trained residual {_h(truth_res)} h):\n"
    )
    print("| policy | avg JCT h | / truth-trained | p99 JCT h |")
    print("|---|---:|---:|---:|")
    for name, h in sorted(held.items(), key=lambda kv: kv[1]["avg_jct_s"]):
        print(
            f"| {name} | {_h(h['avg_jct_s'])} | {h['avg_jct_s'] / truth_res:.4f} | "
            f"{_h(h['p99_jct_s'])} |"
        )
    sims = [a for a in out["arms"] if a in ("truth", "recovered", "shipped")]
    figs = {a: out["arms"][a]["base"]["candidates"] for a in sims}
    print(
        "\nThe heuristics on the validation days as each simulator sees them (avg JCT h; the "
        "error against the truth's figure on the same cases), and on the truth's held-out "
        "days:\n"
    )
    print("| heuristic | " + " | ".join(sims) + " | held-out (truth) |")
    print("|---|" + "---:|" * (len(sims) + 1))
    for name, v in sorted(figs["truth"].items(), key=lambda kv: kv[1] or math.inf):
        cells = []
        for a in sims:
            x = figs[a].get(name)
            err = "" if a == "truth" or x is None or v is None else f" ({x / v - 1:+.1%})"
            cells.append(f"{_h(x)}{err}")
        h = held.get(name, {}).get("avg_jct_s")
        print(f"| {name} | " + " | ".join(cells) + f" | {_h(h)} |")
    chosen = {a: out["arms"][a]["base"]["base"] for a in sims}
    print(
        "\nBest heuristic on each simulator's validation days, on the truth's held-out days: "
        + "; ".join(
            f"{a}: {b} {_h(held[b]['avg_jct_s'])} h "
            f"({held[b]['avg_jct_s'] / held[chosen['truth']]['avg_jct_s']:.4f}x the truth's choice)"
            for a, b in chosen.items()
        )
    )
    print("\nLabels beside the truth's (the moves both scored at the points they share):\n")
    for a, g in out["label_agreement"].items():
        corr = g["label_correlation"]
        print(
            f"- {a}: {g['points_with_a_better_move']} of {g['points']} points with a better "
            f"move than the base's; label correlation with the truth's "
            f"{'-' if corr is None else f'{corr:.4f}'} over {g['moves_scored_by_both']} moves; "
            + (
                "no point in common (another base)"
                if g["same_best_move"] is None
                else f"same best move at {g['same_best_move']:.0%} of points"
            )
        )
    print("\nPaired ratios on the held-out cases (bootstrap over cases; per case min-max):\n")
    for k, c in comps.items():
        days = c["per_case"]
        print(
            f"- {k}: {c['ratio']:.4f} [{c['low']:.4f}, {c['high']:.4f}], lower in "
            f"{c['wins']:.0%} of {c['cases']} cases, per case {min(days):.4f}-{max(days):.4f}"
        )


def run(args: argparse.Namespace, t0: float) -> dict[str, Any]:
    def stamp() -> str:
        return f"[{time.perf_counter() - t0:.0f} s]"

    work = args.work or Path(tempfile.mkdtemp(prefix="lw-calib-policy-"))
    truth = the_truth(args)
    topo = truth.topology()
    fit, fill = fitted(truth, args.store)
    rec = {r.parameter: r for r in recovery(truth, fit.calibration, fit.reference)}
    print(
        f"fit: alpha {fit.calibration.alpha:.4g} (truth {truth.calibration.alpha:g}), "
        f"overhead {rec['overhead_s'].rel_error:+.1%} off {stamp()}"
    )
    cals = {"truth": truth.calibration, "recovered": fit.calibration, "shipped": load_calibration()}
    # the workload the policies see: the truth's job mix and arrival process, a different seed
    # than the telemetry's, cut into windows: training, validation, held-out
    workload = replace(
        truth,
        hours=args.window_h * args.windows,
        load=args.load / args.gpu_scale,
        seed=args.seed + 1,
    )
    jobs = scaled(truth_workload(workload), args.gpu_scale)
    flex = None
    if args.flexible is not None:
        jobs = with_flexible(jobs, args.flexible, seed=args.flexible_seed)
        flex = draw_summary(jobs, args.flexible, args.flexible_seed)
    cut = cut_windows(jobs_frame(jobs), args.window_h * HOUR, max_gpus=topo.total_gpus)
    held = cut[-args.heldout :]
    val = cut[-args.heldout - args.validation : -args.heldout]
    train = cut[: -args.heldout - args.validation][-args.label_windows :]
    windows = {"train": train, "validation": val, "heldout": held}
    predictor = windows_predictor(cut[: -args.heldout - args.validation])
    out: dict[str, Any] = {
        "truth": {
            "topology": truth.topology_spec,
            "alpha": truth.calibration.alpha,
            "overhead_s": truth.calibration.overhead_s,
            "telemetry_hours": truth.hours,
        },
        "fill": fill,
        "fit": {
            "alpha": fit.calibration.alpha,
            "overhead_s": fit.calibration.overhead_s,
            "reference": fit.reference,
            "recovery": {
                k: {
                    "truth": r.truth,
                    "fitted": r.fitted,
                    "rel_error": r.rel_error,
                    "status": r.status,
                }
                for k, r in rec.items()
            },
        },
        "workload": {
            "jobs": len(jobs),
            "load": args.load,
            "gpu_scale": args.gpu_scale,
            "gpu_counts": {str(g): n for g, n in sorted(Counter(j.num_gpus for j in jobs).items())},
            "window_h": args.window_h,
            "windows": {k: [w.window_id for w in v] for k, v in windows.items()},
            "jobs_per_window": {k: [len(w.jobs) for w in v] for k, v in windows.items()},
            "flexible": flex,
        },
    }
    if flex is not None:
        print(f"flexible: {summary_text(flex)}")
    print(
        f"workload: {len(jobs)} jobs, windows train {len(train)} / validation {len(val)} / "
        f"held-out {len(held)} {stamp()}"
    )
    arms = {
        a: train_arm(
            a, sim, args.train_seed + k, cals[sim], windows, topo, predictor, args, work, stamp
        )
        for a, sim, k in ARMS
    }
    out["label_agreement"] = {
        a: agreement(c["frame"], arms["truth"]["frame"]) for a, c in arms.items()
    }
    cases = make_cases(
        renamed(held, profile_rule("truth", truth.calibration)),
        args.seeds,
        topo,
        calibration=truth.calibration,
        predictor=predictor,
        block_s=args.block_s,
    )
    out["heldout"] = evaluate(arms, cases, args)
    print(f"held-out: {len(cases)} cases in {out['heldout']['seconds']:.0f} s {stamp()}")
    out["arms"] = {
        a: {k: v for k, v in c.items() if k not in ("base_spec", "frame")} for a, c in arms.items()
    }
    report(out)
    return out


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(","))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--hours", type=float, default=8.0, help="the telemetry's hours")
    p.add_argument("--seed", type=int, default=0, help="the truth's (telemetry) seed")
    p.add_argument("--alpha", type=float, default=0.9)
    p.add_argument("--overhead", type=float, default=0.004)
    p.add_argument("--store", type=Path, default=None)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/calibration_policy.json"))
    p.add_argument("--load", type=float, default=1.0, help="the policies' workload's load")
    p.add_argument(
        "--flexible",
        type=float,
        default=None,
        help="replay this share of the policies' multi-GPU jobs as flexible requests",
    )
    p.add_argument("--flexible-seed", type=int, default=0, help="the flexible draw's seed")
    p.add_argument(
        "--gpu-scale",
        type=float,
        default=1.0,
        help="the policies' jobs ask this many times their GPUs (at the same GPU load)",
    )
    p.add_argument("--window-h", type=float, default=2.0)
    p.add_argument("--windows", type=int, default=19, help="windows of workload in all")
    p.add_argument("--label-windows", type=int, default=10)
    p.add_argument("--validation", type=int, default=3)
    p.add_argument("--heldout", type=int, default=6)
    p.add_argument("--block-s", type=float, default=1800.0)
    p.add_argument("--val-seeds", type=_ints, default=(0, 1, 2))
    p.add_argument("--seeds", type=_ints, default=(0, 1, 2), help="held-out seeds")
    p.add_argument("--label-seeds", type=_ints, default=(0, 1))
    p.add_argument("--points", type=int, default=24)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--alternatives", type=int, default=5)
    p.add_argument("--horizon-h", type=float, default=1.0)
    p.add_argument("--running-slots", type=int, default=2)
    p.add_argument("--learner", choices=("bc", "cql"), default="cql")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--train-seed", type=int, default=0)
    p.add_argument(
        "--margins",
        type=lambda s: tuple(float(x) for x in s.split(",")),
        default=(math.inf, 1.0, 0.5, 0.25),
    )
    p.add_argument(
        "--ungated",
        type=float,
        default=0.25,
        help="also evaluate every arm's package at this margin of the sweep (nan: none)",
    )
    p.add_argument("--executor", default="serial", help="labelling executor")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument(
        "--report-from", type=Path, help="print the report of a results JSON, run nothing"
    )
    args = p.parse_args(argv)
    if args.ungated is not None and math.isnan(args.ungated):
        args.ungated = None
    elif args.ungated is not None and args.ungated not in args.margins:
        p.error("--ungated must be one of --margins")
    if not args.gpu_scale > 0:
        p.error("--gpu-scale must be positive")
    if args.flexible is not None and not 0.0 <= args.flexible <= 1.0:
        p.error("--flexible must be within [0, 1]")
    if args.report_from is not None:
        report(json.loads(args.report_from.read_text()))
        return 0
    t0 = time.perf_counter()
    out = run(args, t0)
    out["wall_s"] = time.perf_counter() - t0
    out["argv"] = sys.argv
    out["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out} [{out['wall_s']:.0f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
