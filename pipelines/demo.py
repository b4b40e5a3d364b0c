"""The main job end to end: ``linkwise demo`` (and ``make demo``).

``run_demo`` runs the whole pipeline in order, with progress, on the embedded default workload
(the synthetic Philly-like generator) or a real trace given by path; nothing but this machine.
Its numbers are one experiment of ``pipelines.experiment`` (``ci`` or ``full``):

1. History (``pipelines.history``): the workload is replayed under a Slurm-like scheduler
   (``backfill``) in the simulator and stored as the cluster's accounting in DuckDB.
2. Dataset (``pipelines.build_dataset``): decision points from the logs plus simulator
   rollouts, both from the FIRST part of the history only (``until`` a window boundary).
   One run-time predictor (``datasets.predictor``) is fit on that part alone
   (``predictor.json``); every job the dataset, PPO, the evaluation and the shadow loop
   show a policy carries its predictions (``docs/INFORMATION.md``), and its accuracy on the
   held-out part is reported.
3. Training (``pipelines.learners``): DiscreteBC, then DiscreteCQL (ends as
   ``@challenger``); then the DeepShare-style online baseline, MaskablePPO in the simulator
   on the same training days of the workload, registered as ``linkwise-ppo``. With
   ``TrainingPlan.validation_windows`` the last windows of the first part are left out of
   the dataset (and PPO's days) and choose BC's and CQL's checkpoint (every alpha, training
   seed and epoch; ``pipelines.selection``), reported in ``demo.json``'s ``selection``.
4. Evaluation (``pipelines.evaluate``): every heuristic, BC, CQL and PPO on held-out later
   windows of the same accounting (the held-out check refuses any overlap with the
   dataset), each window warm-started from the history's running and queued jobs at its
   start (``datasets.backlog``); how often the learned policies' guard fired
   (``pipelines.evidence``).
5. Gates and promotion: FQE (``pipelines.evidence``) on the dataset's held-out episodes, then
   ``promote_from_evaluation``: pass or fail is recorded as it falls.
6. Shadow mode (``pipelines.sim_shadow``): the live loop's shadow backend over the simulator
   instead of Slurm. The shadow policy is ``@shadow`` (else ``@challenger``); with
   ``@shadow``, ``promote_from_shadow`` is tried on that log.
7. The comparison table (``pipelines.tables``), and where to look (report, ``mlflow ui``).

``run_pipeline`` is steps 2-7 on any store holding a cluster's accounting: the demo on a
real local Slurm (``pipelines.demo_slurm``) and the headline run (``pipelines.headline``)
use it too. ``linkwise demo`` (``linkwise/cli/demo.py``) calls ``run_demo``.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from linkwise.cluster.domain import Job, Topology
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.topology import load_topology
from linkwise.datasets.decisions import store_predictor
from linkwise.datasets.prediction import predictor_digest, write_predictor
from linkwise.datasets.predictor import RuntimePredictor, accuracy
from linkwise.datasets.rollouts import Window, cut_windows, jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import write_native
from linkwise.deployer.promote import current_aliases
from linkwise.evaluation.columns import MAX_WIDTH
from linkwise.evaluation.gates import load_gates
from linkwise.evaluation.shadow_replay import shadow_headline
from linkwise.models.registry import mlflow_env
from linkwise.pipelines.build_dataset import build_dataset
from linkwise.pipelines.console import Stages, history_progress, print_table
from linkwise.pipelines.demo_residual import build_residuals, gate_residual
from linkwise.pipelines.evaluate import evaluate, promote_from_evaluation, promote_from_shadow
from linkwise.pipelines.evidence import fqe_evidence, guard_overrides
from linkwise.pipelines.experiment import (
    Experiment,
    SyntheticWorkload,
    TrainingPlan,
    get_experiment,
)
from linkwise.pipelines.history import (
    HistoryReport,
    accounting_jobs,
    replay_history,
    workload_jobs,
)
from linkwise.pipelines.learners import heldout_share, train_offline, train_online
from linkwise.pipelines.selection import validate_packages, validation_windows
from linkwise.pipelines.sim_shadow import run_shadow
from linkwise.pipelines.tables import comparison_table, rich_table
from linkwise.policies.heuristics import policy_names
from linkwise.policies.spec import PolicySpec

__all__ = [
    "HEURISTICS",
    "DemoResult",
    "Workspace",
    "run_demo",
    "run_pipeline",
    "split_time",
    "training_plan",
    "workspace",
]

# every heuristic ``linkwise policies`` lists: the frontier (preemptive QSSF, Tiresias with
# consolidated placement, DeepShare's migration rule), QSSF and the oracle ceilings (marked
# ``oracle`` in the table, never a reference)
HEURISTICS: tuple[str, ...] = tuple(policy_names(predictions=True))
BASELINE = "backfill"


@dataclass(frozen=True)
class DemoResult:
    """Everything a demo run produced and where it is."""

    out_dir: str
    db: str
    tracking_uri: str
    experiment: str
    workload: str
    cluster: str
    history: dict[str, Any]
    split: dict[str, Any]
    dataset: dict[str, Any]
    models: dict[str, dict[str, Any]]
    evaluation: dict[str, Any]
    ope: dict[str, Any] | None
    gate: dict[str, Any]
    shadow: dict[str, Any]
    shadow_gate: dict[str, Any] | None
    aliases: dict[str, str]
    table: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)
    predictor: dict[str, Any] = field(default_factory=dict)
    # per learned algorithm with validation windows: every checkpoint's validation avg JCT
    # and the chosen one (``pipelines.selection.Selection.to_json``)
    selection: dict[str, Any] = field(default_factory=dict)
    # the residual stage (``pipelines.demo_residual``): the base and how it was chosen, the
    # labels, each learner's margin and validation figures, the promoted one, and per
    # residual its held-out avg JCT, ratio to its base and deviations per 1,000 decisions
    residual: dict[str, Any] = field(default_factory=dict)
    # the promoted residual against the best same-information heuristic (None: no residual)
    residual_gate: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Workspace:
    """Where a run writes: its folder, the DuckDB store, MLflow, and its console (stderr)."""

    out: Path
    db: Path
    uri: str
    console: Console
    wide: bool = False  # every column of the tables (--wide)


def workspace(
    out_dir: str | Path, tracking_uri: str | None, progress: bool, wide: bool = False
) -> Workspace:
    """``out_dir`` (created) with ``linkwise.duckdb`` and, unless ``tracking_uri``, MLflow's
    sqlite store in ``out_dir/mlflow``; a console that is quiet without ``progress``."""
    mlflow_env()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri or f"sqlite:///{out / 'mlflow' / 'mlflow.db'}"
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    # a log file or a pipe gets 120 columns, not 80 (print_table widens it for --wide)
    width = None if sys.stderr.isatty() else MAX_WIDTH
    console = Console(stderr=True, quiet=not progress, width=width)
    return Workspace(out, out / "linkwise.duckdb", uri, console, wide)


def split_time(
    first_submit: float, last_submit: float, window_s: float, eval_windows: int
) -> float:
    """The dataset's ``until``: a window boundary leaving the last ``eval_windows`` windows
    (on the evaluation's grid: windows of ``window_s`` from the first submit) held out."""
    n = max(1, math.ceil((last_submit - first_submit) / window_s + 1e-9))
    train = max(1, n - eval_windows)
    return first_submit + train * window_s


def training_plan(exp: Experiment) -> TrainingPlan:
    """The experiment's training budget; ValueError for one without (``DAILY``)."""
    if exp.training is None:
        raise ValueError(f"experiment {exp.name!r} has no training budget to run the demo with")
    return exp.training


# ------------------------------------------------------------------------ steps 2-7


def run_pipeline(
    ws: Workspace,
    exp: Experiment,
    *,
    slurm_cluster: str,
    history: HistoryReport,
    workload: str,
    stages: Stages,
    seed: int = 0,
    trace: str | None = None,
) -> DemoResult:
    """Steps 2-7 on a store that holds the cluster's accounting (``slurm_cluster``); with
    ``trace`` (the history's trace file) and PPO steps in the experiment, MaskablePPO is
    trained on the trace's training days and evaluated beside BC and CQL."""
    plan = training_plan(exp)
    console, out, uri = ws.console, ws.out, ws.uri
    topo = load_topology(exp.topology)
    split = _split(ws.db, slurm_cluster, topo, exp)
    first, until = split["first_submit"], split["until"]

    validation = _validation_windows(ws.db, slurm_cluster, topo, exp, until)
    if validation:  # left out of the dataset (and PPO's days): they choose the checkpoints
        split = _with_validation(split, validation)
    dataset_until = split["dataset_until"]

    stages.begin("dataset", "Build the dataset (logs + rollouts) from the first part")
    console.print(
        f"dataset from [{_utc(first)}, {_utc(dataset_until)}) UTC; "
        + (f"validation [{_utc(dataset_until)}, {_utc(until)}); " if validation else "")
        + "later windows held out"
    )
    predictor, predictor_info = _predictor(ws, slurm_cluster, topo, until)
    console.print(
        f"run-time predictor {predictor_info['sha256'][:16]} fit on {predictor.n_jobs} jobs "
        f"before the split; on the held-out jobs: {_accuracy_text(predictor_info)}"
    )
    dataset = _dataset(
        ws, exp, slurm_cluster=slurm_cluster, until=dataset_until, seed=seed, predictor=predictor
    )
    console.print(f"dataset {str(dataset['hash'])[:16]}: {dataset['counts']}")

    stages.begin("train", "Train BC and CQL (and MaskablePPO when budgeted)")

    def validate(packages: Mapping[str, str]) -> Mapping[str, float | None]:
        return validate_packages(
            packages, validation, db=ws.db, slurm_cluster=slurm_cluster, topology=topo,
            block_s=exp.windows.block_s, seed=seed, predictor=predictor, tracking_uri=uri,
        )  # fmt: skip

    models = train_offline(
        dataset["path"], plan, seed=seed, uri=uri, out=out, console=console,
        validate=validate if validation else None,
    )  # fmt: skip
    selection = {algo: m.pop("selection") for algo, m in models.items() if "selection" in m}
    if plan.ppo_steps > 0 and trace is not None:
        train_days = (dataset_until - first) / 86400.0
        models["ppo"] = train_online(
            trace,
            exp,
            train_days,
            seed=seed,
            uri=uri,
            out=out,
            console=console,
            predictor=predictor_info["path"],
        )

    residual: dict[str, Any] = {}
    if exp.residual is not None:
        stages.begin("residual", "The residual: base, counterfactual labels, BC and CQL, margins")
        residual = build_residuals(
            exp, topo, db=ws.db, slurm_cluster=slurm_cluster, until=until,
            validation=validation, predictor=predictor, out=out, uri=uri, seed=seed,
            console=console,
        )  # fmt: skip
    extra = {r["spec"]: r["label"] for r in residual.get("learners", {}).values()}

    stages.begin("evaluate", "Evaluate heuristics and the learned policies on held-out windows")
    table, evaluation, packages = _evaluate(
        ws,
        exp,
        topo,
        models,
        dataset["path"],
        slurm_cluster=slurm_cluster,
        seed=seed,
        predictor=predictor,
        extra=extra,
    )
    windows: list[dict[str, Any]] = evaluation["windows"] or []
    _check_disjoint(windows, split.get("validation_windows", []))

    stages.begin("gate", "Gate and promote the challenger (CQL)")
    ope, note = fqe_evidence(
        dataset["path"], packages, exp.evaluation, heldout_share(dataset["path"]), seed
    )
    console.print(note)
    gate = _gate(evaluation["out_dir"], uri, ope, console)
    residual_gate = None
    if residual:
        residual = _residual_heldout(residual, table)
        residual_gate = gate_residual(
            residual, evaluation["out_dir"], load_gates(), n_boot=exp.evaluation.n_boot, seed=seed
        )
        console.print(residual_gate.get("text", residual_gate))

    stages.begin("shadow", "Shadow mode: the live loop against the simulator")
    shadow, shadow_gate = _shadow(
        ws,
        exp,
        topo,
        windows,
        until=until,
        slurm_cluster=slurm_cluster,
        seed=seed,
        predictor=predictor,
    )

    stages.begin("table", "Comparison")
    title = f"held-out windows, {exp.topology}, baseline {BASELINE}"
    print_table(console, rich_table(table, title, wide=ws.wide), ws.wide)
    if residual:
        console.print(residual_summary(residual, residual_gate))
    seconds = stages.end()
    result = DemoResult(
        out_dir=str(out),
        db=str(ws.db),
        tracking_uri=uri,
        experiment=exp.name,
        workload=workload,
        cluster=exp.topology,
        history=history.to_json(),
        split=split,
        dataset=dataset,
        models=models,
        evaluation=evaluation,
        ope=ope,
        gate=gate,
        shadow=shadow,
        shadow_gate=shadow_gate,
        aliases=current_aliases(uri),
        table=table,
        seconds=seconds,
        predictor=predictor_info,
        selection=selection,
        residual=residual,
        residual_gate=residual_gate,
    )
    (out / "demo.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    console.print(
        f"\nreport:   {evaluation['report']}\n"
        f"store:    {ws.db} (tables jobs, job_nodes, nodes, decisions)\n"
        f"summary:  {out / 'demo.json'}\n"
        f"MLflow:   mlflow ui --backend-store-uri {uri}\n"
        f"aliases:  {', '.join(f'@{a}={v}' for a, v in sorted(result.aliases.items()))}"
    )
    return result


def _split(db: Path, slurm_cluster: str, topo: Topology, exp: Experiment) -> dict[str, Any]:
    """Where the history is cut: the dataset from its first submit ``until`` the held-out
    windows (the last ``exp.evaluation.heldout_windows`` of its window grid)."""
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con, cluster=slurm_cluster)
    jobs = jobs.filter(jobs["num_gpus"] <= topo.total_gpus)
    first = float(jobs["submit_time"].min())  # type: ignore[arg-type]
    last = float(jobs["submit_time"].max())  # type: ignore[arg-type]
    window_s = exp.windows.window_s
    until = split_time(first, last, window_s, exp.evaluation.heldout_windows)
    return {
        "first_submit": first,
        "until": until,
        "last_submit": last,
        "window_s": window_s,
        "train_windows": round((until - first) / window_s),
        "heldout_windows": exp.evaluation.heldout_windows,
        "dataset_until": until,
    }


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _validation_windows(
    db: Path, slurm_cluster: str, topo: Topology, exp: Experiment, until: float
) -> list[Window]:
    """The training span's last ``validation_windows`` windows before ``until`` on the
    evaluation's grid (``pipelines.selection.validation_windows``); none without. ValueError
    when the held-out part has fewer busy windows than the evaluation takes."""
    n = training_plan(exp).validation_windows
    if n <= 0:
        return []
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con, cluster=slurm_cluster)
    cut = cut_windows(jobs, exp.windows.window_s, max_gpus=topo.total_gpus)
    held = [w for w in cut if w.start >= until and len(w.jobs) >= exp.windows.min_jobs]
    if len(held) < exp.evaluation.heldout_windows:  # refused before training, not after
        raise ValueError(
            f"{len(held)} held-out windows of {exp.windows.min_jobs}+ jobs: the evaluation "
            f"would take validation windows to make {exp.evaluation.heldout_windows}"
        )
    return validation_windows(cut, until, n, exp.windows.min_jobs)


def _with_validation(split: Mapping[str, Any], windows: Sequence[Window]) -> dict[str, Any]:
    """The split with its validation windows: the dataset ends where the first begins."""
    return {
        **split,
        "dataset_until": min(w.start for w in windows),
        "validation_windows": [
            {"window_id": w.window_id, "start": w.start, "end": w.end, "jobs": len(w.jobs)}
            for w in windows
        ],
    }


def _check_disjoint(
    evaluated: Sequence[Mapping[str, Any]], validation: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse an evaluation window that overlaps a validation window (the evaluation picks
    the last windows outside the dataset, which the validation windows are too)."""
    for e in evaluated:
        for v in validation:
            if float(e["start"]) < float(v["end"]) and float(v["start"]) < float(e["end"]):
                raise ValueError(f"evaluation window {e} overlaps validation window {v}")


def _predictor(
    ws: Workspace, slurm_cluster: str, topo: Topology, until: float
) -> tuple[RuntimePredictor, dict[str, Any]]:
    """The run's one run-time predictor, fit on the accounting's jobs submitted before
    ``until`` (never on the held-out part), written to ``predictor.json``; and its summary
    with its accuracy on the held-out jobs (their true run times, for the report only)."""
    with closing(open_store(ws.db)) as con:
        predictor = store_predictor(con, slurm_cluster, until)
    path = write_predictor(predictor, ws.out / "predictor.json")
    heldout = accounting_jobs(ws.db, cluster=slurm_cluster, since=until, max_gpus=topo.total_gpus)
    with warnings.catch_warnings():  # constant predictions (no users or names): no Spearman
        warnings.simplefilter("ignore")
        measured = accuracy(predictor, heldout) if heldout else None
    return predictor, {
        "path": str(path),
        "sha256": predictor_digest(predictor),
        "fit_from": predictor.fit_from,
        "fit_until": predictor.fit_until,
        "n_jobs": predictor.n_jobs,
        "heldout_accuracy": measured,
    }


def _accuracy_text(info: Mapping[str, Any]) -> str:
    acc = info.get("heldout_accuracy")
    if not acc:
        return "no held-out jobs"
    cov = ", ".join(f"{k.removeprefix('coverage_')} covers {v:.0%}" for k, v in acc.items()
                    if k.startswith("coverage_"))  # fmt: skip
    rho = acc["spearman"]
    rank = "n/a (constant predictions)" if math.isnan(rho) else f"{rho:.2f}"
    return f"Spearman {rank}, MAE {duration_text(acc['mae_h'] * 3600.0)}, {cov}"


def _dataset(
    ws: Workspace,
    exp: Experiment,
    *,
    slurm_cluster: str,
    until: float,
    seed: int,
    predictor: RuntimePredictor,
) -> dict[str, Any]:
    """The dataset (log transitions and rollouts) from the history before ``until``, its jobs
    annotated by ``predictor``: its path, hash, counts and build time."""
    built = build_dataset(
        ws.db,
        out_dir=ws.out / "datasets",
        rollouts=exp.dataset.rollouts,
        policies=[PolicySpec.parse(s) for s in exp.dataset.policies],
        epsilons=exp.dataset.epsilons,
        seeds=exp.dataset.seeds,
        window_s=exp.windows.window_s,
        block_s=exp.windows.block_s,
        min_jobs=exp.windows.min_jobs,
        topology=exp.topology,
        slurm_cluster=slurm_cluster,
        until=until,
        log_window_s=exp.dataset.log_window_s,
        config=exp.mdp,
        executor="serial",
        max_steps=exp.dataset.max_steps,
        seed=seed,
        tracking_uri=ws.uri,
        warm_start=exp.windows.warm_start,
        predictor=predictor,
        log_share=exp.dataset.log_share,
    )
    return {
        "path": str(built["path"]),
        "hash": built["hash"],
        "counts": built.get("counts"),
        "seconds": built["seconds"],
    }


def _evaluate(
    ws: Workspace,
    exp: Experiment,
    topo: Topology,
    models: Mapping[str, Mapping[str, Any]],
    dataset_path: str,
    *,
    slurm_cluster: str,
    seed: int,
    predictor: RuntimePredictor,
    extra: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """Every heuristic and the learned policies on the held-out windows, with the run's one
    predictor, and the learned policies' guard counts there: (the comparison table, the
    evaluation's summary, each learned policy's package folder by its spec). ``extra``:
    more policies (spec -> display name: the residuals), in the table beside them."""
    # each learned policy by its pinned registry version, labelled BC, CQL, PPO
    labels = {
        f"model:models:/{m['model_name']}/{m['version']}": algo.upper()
        for algo, m in models.items()
    }
    extra = dict(extra or {})
    report, eval_run = evaluate(
        [PolicySpec.parse(s) for s in (*HEURISTICS, *labels, *extra)],
        out_dir=ws.out / "evaluation",
        db=ws.db,
        slurm_cluster=slurm_cluster,
        n_windows=exp.evaluation.heldout_windows,
        seeds=exp.evaluation.seeds,
        cluster=exp.topology,
        window_s=exp.windows.window_s,
        block_s=exp.windows.block_s,
        min_jobs=exp.windows.min_jobs,
        baseline=BASELINE,
        executor="serial",
        tracking_uri=ws.uri,
        wide=ws.wide,
        n_boot=exp.evaluation.n_boot,
        seed=seed,
        warm_start=exp.windows.warm_start,
        # the dataset itself, so held-out windows are chosen even when no model is evaluated
        holdout_from=[dataset_path.removesuffix(".parquet") + ".json"],
        # the run's one predictor (fit before the split), for heuristics and warm starts alike;
        # the learned packages carry the same one
        predictor=predictor,
    )
    failed: dict[str, Any] = report.context.get("failed", {})
    for spec, info in failed.items():
        name = labels.get(spec, extra.get(spec, spec))
        ws.console.print(
            f"[red]{name} failed[/red] {info['cases']} evaluation cases "
            f"({info['first']}); left out of the comparison"
        )
    windows: list[dict[str, Any]] = report.context.get("evaluation_windows") or []
    # spec -> package: FQE's table is keyed by spec (the gate looks the challenger up by it)
    packages = {spec: models[label.lower()]["package_dir"] for spec, label in labels.items()}
    evaluation: dict[str, Any] = {
        "out_dir": report.out_dir,
        "report": str(Path(report.out_dir) / "report.md"),
        "files": report.files,
        "run_id": eval_run,
        "windows": report.context.get("evaluation_windows"),
        "dataset_windows": report.context.get("dataset_windows"),
        "seeds": report.context.get("seeds"),
        "failed": {labels.get(x, extra.get(x, x)): info for x, info in failed.items()},
        "guard": guard_overrides(
            {labels[spec]: pkg for spec, pkg in packages.items()},
            windows,
            ws.db,
            cluster=slurm_cluster,
            topology=topo,
            seed=seed,
        ),
    }
    ws.console.print(f"the guard (aging) on the held-out windows: {evaluation['guard']}")
    return comparison_table(report, {**labels, **extra}), evaluation, packages


def _residual_heldout(
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
    return {**residual, "heldout": heldout}


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
    return "\n".join(lines)


def _gate(
    evaluation_dir: str, uri: str, ope: Mapping[str, Any] | None, console: Console
) -> dict[str, Any]:
    """Gate ``@challenger`` on its evaluation (and FQE) and promote it to ``@shadow`` if it
    passes; the decision."""
    try:
        decision = promote_from_evaluation(
            evaluation_dir, tracking_uri=uri, gates=load_gates(), ope=ope
        )
    except ValueError as exc:  # the challenger failed its evaluation cases
        console.print(f"challenger->shadow REFUSED: {exc}")
        return {"action": "challenger->shadow", "passed": False, "reasons": [str(exc)]}
    console.print(decision.format())
    return dict(decision.to_json())


def _shadow(
    ws: Workspace,
    exp: Experiment,
    topo: Topology,
    windows: Sequence[Mapping[str, Any]],
    *,
    until: float,
    slurm_cluster: str,
    seed: int,
    predictor: RuntimePredictor,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The shadow loop with ``@shadow`` (else ``@challenger``) over the first held-out window,
    its jobs annotated by ``predictor``, and with ``@shadow`` the shadow -> champion gate on
    its log: (summary, gate decision)."""
    aliases = current_aliases(ws.uri)
    alias = "shadow" if "shadow" in aliases else "challenger"
    lo, hi = (
        (float(windows[0]["start"]), float(windows[0]["end"]))
        if windows
        else (until, until + exp.windows.window_s)
    )
    shadow = run_shadow(
        ws.db,
        accounting_jobs(ws.db, cluster=slurm_cluster, since=lo, until=hi,
                        max_gpus=topo.total_gpus),
        topo,
        spec=PolicySpec.parse(f"model:{alias}"),
        tracking_uri=ws.uri,
        cluster=slurm_cluster,
        state_dir=ws.out / "serve",
        max_cycles=exp.evaluation.shadow_cycles,
        seed=seed,
        predictor=predictor,
    )  # fmt: skip
    ws.console.print(
        f"shadow loop (@{alias}, version {shadow['model_version']}): {shadow['cycles']} cycles, "
        f"{shadow['decisions']} decision rows ({shadow['shadow_starts']} would-be starts), "
        f"backfill started {shadow['slurm_starts']} jobs"
    )
    if alias != "shadow":
        ws.console.print(
            shadow_headline(ws.db, topology=topo, tracking_uri=ws.uri, cluster=slurm_cluster,
                            model_version=str(shadow["model_version"]), seed=seed)
        )  # fmt: skip
        ws.console.print("no @shadow (the challenger did not pass): shadow -> champion not tried")
        return shadow, None
    d = promote_from_shadow(
        ws.db, tracking_uri=ws.uri, cluster=exp.topology, slurm_cluster=slurm_cluster, seed=seed
    )
    ws.console.print(str(d.evidence.get("headline", "shadow report: none")))
    ws.console.print(d.format())
    return shadow, dict(d.to_json())


# ------------------------------------------------------------------------ the demo


def run_demo(
    out_dir: str | Path = "linkwise-out/demo",
    *,
    trace: str | Path | None = None,
    trace_format: str = "auto",
    jobs: int | None = None,
    cluster: str | None = None,
    experiment: str | Experiment = "full",
    seed: int = 0,
    tracking_uri: str | None = None,
    progress: bool = True,
    wide: bool = False,
) -> DemoResult:
    """The whole pipeline (module docstring) into ``out_dir``: the store
    (``linkwise.duckdb``), datasets, packages, the evaluation report, MLflow (a sqlite store
    in ``out_dir/mlflow`` unless ``tracking_uri``) and ``demo.json``. ``jobs`` and
    ``cluster`` override the experiment's synthetic workload size and topology; ``wide``:
    every column in the tables (``evaluation.columns``)."""
    exp = get_experiment(experiment)
    if jobs is not None:
        load = exp.workload.load_scale if exp.workload is not None else 1.0
        exp = replace(exp, workload=SyntheticWorkload(jobs=jobs, load_scale=load))
    if cluster is not None:
        exp = replace(exp, topology=cluster)
    if trace is None and exp.workload is None:
        raise ValueError(f"experiment {exp.name!r} has no synthetic workload: give a trace")
    ppo = training_plan(exp).ppo_steps > 0
    ws = workspace(out_dir, tracking_uri, progress, wide)
    if ws.db.exists():
        ws.db.unlink()  # the history is replayed afresh: one demo, one cluster history
    topo = load_topology(exp.topology)
    name = "demo"
    stages = Stages(ws.console, 7 + (exp.residual is not None))
    stages.begin("history", f"Replay the history under backfill on {exp.topology} -> DuckDB")
    synthetic = exp.workload or SyntheticWorkload(jobs=0)
    history_jobs, workload = workload_jobs(
        trace, trace_format, jobs=synthetic.jobs, load_scale=synthetic.load_scale,
        max_gpus=topo.total_gpus, seed=seed, min_gpus=exp.min_gpus,
    )  # fmt: skip
    ws.console.print(workload)
    with history_progress(ws.console, progress) as bar:
        task = bar.add_task("replay (backfill)", total=len(history_jobs))
        history = replay_history(
            history_jobs,
            topo,
            ws.db,
            cluster=name,
            seed=seed,
            on_progress=lambda done, _t: bar.update(task, completed=done),
        )
    ws.console.print(
        f"{history.jobs} jobs stored as accounting of cluster {name!r}; queueing under backfill: "
        f"avg {duration_text(history.avg_queue_s)}, p99 {duration_text(history.p99_queue_s)}, "
        f"{history.queued_share:.0%} waited > 1 min"
    )
    whole = trace if exp.min_gpus <= 1 else None  # a filtered trace is written out for PPO
    return run_pipeline(
        ws,
        exp,
        slurm_cluster=name,
        history=history,
        workload=workload,
        stages=stages,
        seed=seed,
        trace=ppo_trace(whole, history_jobs, ws.out) if ppo else None,
    )


def ppo_trace(trace: str | Path | None, jobs: Sequence[Job], out: Path) -> str:
    """The trace MaskablePPO's environment replays: the given file, else the history's jobs
    (the synthetic workload, or a trace's jobs filtered by the experiment) written as a
    native trace into ``out``."""
    if trace is not None:
        return str(Path(trace).resolve())
    path = out / "workload.csv"
    write_native(jobs, path)
    return str(path)
