"""The main job end to end: ``linkwise demo`` (and ``make demo``).

``run_demo`` runs the whole pipeline in order, with progress, on the embedded default workload
(the synthetic Philly-like generator) or a real trace given by path; nothing but this machine.
Its numbers are one experiment of ``pipelines.experiment`` (``ci`` or ``full``):

1. History (``pipelines.history``): the workload is replayed under a Slurm-like scheduler
   (``backfill``) in the simulator and stored as the cluster's accounting in DuckDB; then
   ``linkwise calibrate --db`` runs on it (``demo_data.calibrate_history``): what was
   fitted, or plainly why nothing was (the replayed history holds no telemetry).
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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Job, Topology
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window
from linkwise.datasets.traces import write_native
from linkwise.deployer.promote import current_aliases
from linkwise.evaluation.gates import load_gates
from linkwise.pipelines.console import Stages, history_progress, print_table
from linkwise.pipelines.demo_data import (
    accuracy_text,
    build_demo_dataset,
    calibrate_history,
    check_disjoint,
    fit_run_predictor,
    history_split,
    training_plan,
    utc_text,
    validation_split,
    with_validation,
)
from linkwise.pipelines.demo_evaluation import (
    BASELINE,
    evaluate_heldout,
    gate_challenger,
    shadow_stage,
)
from linkwise.pipelines.demo_residual import (
    build_residuals,
    gate_residual,
    residual_heldout,
    residual_summary,
)
from linkwise.pipelines.evidence import fqe_evidence
from linkwise.pipelines.experiment import (
    Experiment,
    SyntheticWorkload,
    TrainingPlan,
    get_experiment,
)
from linkwise.pipelines.history import HistoryReport, replay_history, workload_jobs
from linkwise.pipelines.learners import heldout_share, train_offline, train_online
from linkwise.pipelines.selection import validate_packages
from linkwise.pipelines.tables import rich_table
from linkwise.pipelines.workspace import Workspace, workspace

__all__ = ["DemoResult", "run_demo", "run_pipeline"]


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
    # labels and the teacher's headroom in them, each learner's margin and validation figures,
    # the promoted one, per residual its held-out avg JCT, ratio to its base and deviations
    # per 1,000 decisions, and ``learning``: what learning decided, in plain words
    residual: dict[str, Any] = field(default_factory=dict)
    # the promoted residual against the best same-information heuristic (None: no residual)
    residual_gate: dict[str, Any] | None = None
    # ``linkwise calibrate --db`` on the history (``demo_data.calibrate_history``): fitted or
    # why not, and what it printed
    calibration: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------ steps 2-7


@dataclass(frozen=True)
class _Data:
    """What step 2 leaves: where the history is cut, the validation windows, the run's one
    predictor (and its summary) and the dataset."""

    split: dict[str, Any]
    validation: list[Window]
    predictor: RuntimePredictor
    predictor_info: dict[str, Any]
    dataset: dict[str, Any]

    @property
    def until(self) -> float:
        """Where the held-out part begins."""
        return float(self.split["until"])


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
    calibration: Mapping[str, Any] | None = None,
) -> DemoResult:
    """Steps 2-7 on a store that holds the cluster's accounting (``slurm_cluster``); with
    ``trace`` (the history's trace file) and PPO steps in the experiment, MaskablePPO is
    trained on the trace's training days and evaluated beside BC and CQL; ``calibration``:
    what calibrating on the history gave (``DemoResult.calibration``)."""
    plan = training_plan(exp)
    console, out, uri = ws.console, ws.out, ws.uri
    topo = load_topology(exp.topology)
    data = _data(ws, exp, topo, slurm_cluster=slurm_cluster, seed=seed, stages=stages)
    split, validation, predictor = data.split, data.validation, data.predictor

    stages.begin("train", "Train BC and CQL (and MaskablePPO when budgeted)")
    models, selection = _train(ws, exp, plan, topo, data, slurm_cluster, seed, trace)

    residual: dict[str, Any] = {}
    if exp.residual is not None:
        stages.begin("residual", "The residual: base, counterfactual labels, BC and CQL, margins")
        residual = build_residuals(
            exp, topo, db=ws.db, slurm_cluster=slurm_cluster, until=data.until,
            validation=validation, predictor=predictor, out=out, uri=uri, seed=seed,
            console=console,
        )  # fmt: skip
    extra = {r["spec"]: r["label"] for r in residual.get("learners", {}).values()}

    stages.begin("evaluate", "Evaluate heuristics and the learned policies on held-out windows")
    table, evaluation, packages = evaluate_heldout(
        ws,
        exp,
        topo,
        models,
        data.dataset["path"],
        slurm_cluster=slurm_cluster,
        seed=seed,
        predictor=predictor,
        extra=extra,
    )
    windows: list[dict[str, Any]] = evaluation["windows"] or []
    check_disjoint(windows, split.get("validation_windows", []))

    stages.begin("gate", "Gate and promote the challenger (CQL)")
    ope, note = fqe_evidence(
        data.dataset["path"], packages, exp.evaluation, heldout_share(data.dataset["path"]), seed
    )
    console.print(note)
    gate = gate_challenger(evaluation["out_dir"], uri, ope, console)
    residual_gate = None
    if residual:
        residual = residual_heldout(residual, table)
        residual_gate = gate_residual(
            residual, evaluation["out_dir"], load_gates(), n_boot=exp.evaluation.n_boot, seed=seed
        )
        console.print(residual_gate.get("text", residual_gate))

    stages.begin("shadow", "Shadow mode: the live loop against the simulator")
    shadow, shadow_gate = shadow_stage(
        ws,
        exp,
        topo,
        windows,
        until=data.until,
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
        dataset=data.dataset,
        models=models,
        evaluation=evaluation,
        ope=ope,
        gate=gate,
        shadow=shadow,
        shadow_gate=shadow_gate,
        aliases=current_aliases(uri),
        table=table,
        seconds=seconds,
        predictor=data.predictor_info,
        selection=selection,
        residual=residual,
        residual_gate=residual_gate,
        calibration=dict(calibration or {}),
    )
    _write_result(ws, result, evaluation)
    return result


def _data(
    ws: Workspace,
    exp: Experiment,
    topo: Topology,
    *,
    slurm_cluster: str,
    seed: int,
    stages: Stages,
) -> _Data:
    """Step 2: the cut, the validation windows, the run's predictor, the dataset."""
    console = ws.console
    split = history_split(ws.db, slurm_cluster, topo, exp)
    first, until = split["first_submit"], split["until"]

    validation = validation_split(ws.db, slurm_cluster, topo, exp, until)
    if validation:  # left out of the dataset (and PPO's days): they choose the checkpoints
        split = with_validation(split, validation)
    dataset_until = split["dataset_until"]

    stages.begin("dataset", "Build the dataset (logs + rollouts) from the first part")
    console.print(
        f"dataset from [{utc_text(first)}, {utc_text(dataset_until)}) UTC; "
        + (f"validation [{utc_text(dataset_until)}, {utc_text(until)}); " if validation else "")
        + "later windows held out"
    )
    predictor, predictor_info = fit_run_predictor(ws, slurm_cluster, topo, until)
    console.print(
        f"run-time predictor {predictor_info['sha256'][:16]} fit on {predictor.n_jobs} jobs "
        f"before the split; on the held-out jobs: {accuracy_text(predictor_info)}"
    )
    dataset = build_demo_dataset(
        ws, exp, slurm_cluster=slurm_cluster, until=dataset_until, seed=seed, predictor=predictor
    )
    console.print(f"dataset {str(dataset['hash'])[:16]}: {dataset['counts']}")
    return _Data(split, validation, predictor, predictor_info, dataset)


def _train(
    ws: Workspace,
    exp: Experiment,
    plan: TrainingPlan,
    topo: Topology,
    data: _Data,
    slurm_cluster: str,
    seed: int,
    trace: str | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Step 3: BC and CQL (checkpoints chosen on the validation windows when there are
    any), MaskablePPO when budgeted and a trace is given; (models, selection)."""
    console, out, uri = ws.console, ws.out, ws.uri
    validation, predictor = data.validation, data.predictor

    def validate(packages: Mapping[str, str]) -> Mapping[str, float | None]:
        return validate_packages(
            packages, validation, db=ws.db, slurm_cluster=slurm_cluster, topology=topo,
            block_s=exp.windows.block_s, seed=seed, predictor=predictor, tracking_uri=uri,
        )  # fmt: skip

    models = train_offline(
        data.dataset["path"], plan, seed=seed, uri=uri, out=out, console=console,
        validate=validate if validation else None,
    )  # fmt: skip
    selection = {algo: m.pop("selection") for algo, m in models.items() if "selection" in m}
    if plan.ppo_steps > 0 and trace is not None:
        train_days = (data.split["dataset_until"] - data.split["first_submit"]) / 86400.0
        models["ppo"] = train_online(
            trace,
            exp,
            train_days,
            seed=seed,
            uri=uri,
            out=out,
            console=console,
            predictor=data.predictor_info["path"],
        )
    return models, selection


def _write_result(ws: Workspace, result: DemoResult, evaluation: Mapping[str, Any]) -> None:
    """``demo.json``, and where to look."""
    out = ws.out
    (out / "demo.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    ws.console.print(
        f"\nreport:   {evaluation['report']}\n"
        f"store:    {ws.db} (tables jobs, job_nodes, nodes, decisions)\n"
        f"summary:  {out / 'demo.json'}\n"
        f"MLflow:   mlflow ui --backend-store-uri {ws.uri}\n"
        f"aliases:  {', '.join(f'@{a}={v}' for a, v in sorted(result.aliases.items()))}"
    )


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
    stages = Stages(ws.console, 8 + (exp.residual is not None))
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
    stages.begin("calibrate", "Calibrate the contention model on the history (calibrate --db)")
    calibration = calibrate_history(ws.db, name, exp.topology)
    ws.console.print(calibration["text"], markup=False, end="")
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
        calibration=calibration,
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
