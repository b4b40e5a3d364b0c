"""The main job end to end: ``linkwise demo`` (and ``make demo``).

``run_demo`` runs the whole pipeline in order, with progress, on the embedded default workload
(the synthetic Philly-like generator) or a real trace given by path; nothing but this machine:

1. History: the workload is replayed under a Slurm-like scheduler (``backfill``) in the
   simulator, and every job (submit, start, end, the node names and GPUs per node it ran on)
   is stored as a ``JobRun`` through ``datasets.ingest`` into the DuckDB store, exactly where
   real accounting goes (``pipelines.collect``); the nodes as ``NodeInfo``.
2. Dataset (``pipelines.build_dataset``): decision points from the logs plus simulator
   rollouts, both from the FIRST part of the history only (``until`` a window boundary).
3. Training (``pipelines.train``): DiscreteBC, then DiscreteCQL (``models/experiments/
   demo_bc.toml``, ``demo_cql.toml``; small budgets); CQL ends as ``@challenger``. Then the
   DeepShare-style online baseline (``pipelines.ppo``): MaskablePPO in the simulator on the
   same training days of the workload, registered as ``linkwise-ppo``.
4. Evaluation (``pipelines.evaluate``): every heuristic, BC, CQL and PPO on held-out later
   windows of the same accounting (the held-out check refuses any overlap with the
   dataset), each window warm-started from the history's running and queued jobs at its
   start (``datasets.backlog``).
5. Gates and promotion: FQE (``evaluation.ope``) on the dataset's held-out episodes when it
   is available, then ``promote_from_evaluation``: pass or fail is recorded as it falls.
6. Shadow mode: the live loop's own ``ShadowBackend`` code (decision rows, joins, the
   ``decisions`` table through its ``Recorder``) over the simulator instead of Slurm
   (``SimShadowBackend``, the minimal adapter: observe the simulator, let ``backfill`` act as
   Slurm between cycles, stamp rows with simulated time). The shadow policy is ``@shadow``
   (else ``@challenger``); with ``@shadow``, ``promote_from_shadow`` is tried on that log.
7. The comparison table, and where to look (report folder, ``mlflow ui``).

``run_demo_slurm`` is the same pipeline with the history collected from a real local Slurm
(a burst of jobs submitted to it, accounting read with ``pipelines.collect``; no PPO: there
is no trace to replay); root only.
``run_headline`` is the headline benchmark (``benchmarks/headline.md``) on a trace.
``cmd_demo`` / ``add_demo_parser`` are the ``linkwise demo`` CLI.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Policy, Topology
from linkwise.cluster.hostlist import compress
from linkwise.cluster.loop import drive
from linkwise.cluster.simulator import Simulator
from linkwise.cluster.slurm.records import JobRun, NodeInfo, QueuedJob
from linkwise.deployer.loop import (
    GuardedPolicy,
    LoadedPolicy,
    Observation,
    PolicyHolder,
    ServeConfig,
    ShadowBackend,
)

__all__ = [
    "BUDGETS",
    "DemoBudget",
    "DemoResult",
    "HistoryReport",
    "SimShadowBackend",
    "add_demo_parser",
    "cmd_demo",
    "guard_overrides",
    "headline_budget",
    "history_runs",
    "node_infos",
    "replay_history",
    "run_demo",
    "run_demo_slurm",
    "run_headline",
    "run_shadow",
]

LOG = logging.getLogger("linkwise.demo")
REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO_ROOT / "models" / "experiments"
PARTITION = "gpu"
DEMO_EPOCH = 1_704_067_200.0  # Monday 2024-01-01 00:00 UTC: the synthetic history's clock
HEURISTICS: tuple[str, ...] = ("fifo", "backfill", "best_fit", "sjf_bco", "tiresias_las", "random")


# ------------------------------------------------------------------------ budgets


@dataclass(frozen=True)
class DemoBudget:
    """The numbers of one demo run (``ci`` and ``full`` run the same code)."""

    name: str
    jobs: int  # synthetic default workload
    cluster: str
    load_scale: float
    window_s: float  # rollout and evaluation windows
    block_s: float
    eval_windows: int  # the last windows of the history, held out
    min_jobs: int
    rollouts: int
    rollout_seeds: tuple[int, ...]
    rollout_policies: tuple[str, ...]
    epsilons: tuple[float, ...]
    max_rollout_steps: int | None
    log_window_s: float | None
    k_slots: int
    bc_steps: int
    cql_steps: int
    steps_per_epoch: int
    eval_seeds: tuple[int, ...]
    n_boot: int
    ope_steps: int
    ope_seeds: tuple[int, ...]
    shadow_cycles: int
    # the MDP's slots: the first K pending jobs that fit the free GPUs ("fitting") rather than
    # the head of the queue ("head"), so fewer of a backfilling history's starts fall outside
    # the K slots (unslotted: applied without a step); one ObsSpec for building, training, serving
    slot_order: str = "fitting"
    # rollout and evaluation windows start from the accounting's state at their start (jobs
    # running and queued then, ``datasets.backlog``) rather than from an empty cluster
    warm_start: bool = True
    # MaskablePPO (the DeepShare-style online baseline) timesteps; 0: not trained. Its
    # environment replays the workload's training days (the trace, or the synthetic jobs)
    ppo_steps: int = 0


BUDGETS: Mapping[str, DemoBudget] = {
    "ci": DemoBudget(
        name="ci",
        jobs=500,
        cluster="8x8,leaf=2",
        load_scale=1.0,
        window_s=3 * 3600.0,
        block_s=1800.0,
        eval_windows=2,
        min_jobs=5,
        rollouts=2,
        rollout_seeds=(0,),
        rollout_policies=("best_fit", "sjf_bco"),
        epsilons=(0.0, 0.2),
        max_rollout_steps=400,
        log_window_s=3 * 3600.0,
        k_slots=4,
        bc_steps=100,
        cql_steps=100,
        steps_per_epoch=50,
        eval_seeds=(0, 1),
        n_boot=200,
        ope_steps=100,
        ope_seeds=(0,),
        shadow_cycles=120,
        ppo_steps=1024,
    ),
    "full": DemoBudget(
        name="full",
        jobs=3000,
        cluster="16x8,leaf=4",
        load_scale=1.0,
        window_s=24 * 3600.0,
        block_s=3600.0,
        eval_windows=3,
        min_jobs=20,
        rollouts=6,
        rollout_seeds=(0, 1),
        rollout_policies=("backfill", "best_fit", "sjf_bco", "tiresias_las"),
        epsilons=(0.0, 0.1),
        max_rollout_steps=None,
        log_window_s=24 * 3600.0,
        k_slots=4,
        bc_steps=1000,
        cql_steps=2000,
        steps_per_epoch=250,
        eval_seeds=(0, 1, 2),
        n_boot=2000,
        ope_steps=1000,
        ope_seeds=(0, 1),
        shadow_cycles=400,
        ppo_steps=10_240,
    ),
}


# ------------------------------------------------------------------------ step 1: history


@dataclass(frozen=True)
class HistoryReport:
    """What the replayed history put into the store."""

    cluster: str  # the accounting cluster name
    topology: str
    scheduler: str
    jobs: int
    first_submit: float
    last_end: float
    avg_queue_s: float
    p99_queue_s: float
    queued_share: float  # jobs that waited more than a minute
    inserted: int
    rejected: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_infos(topology: Topology, cpus: int = 64) -> list[NodeInfo]:
    """The topology's nodes as sinfo would describe them (idle, partition ``gpu``)."""
    return [NodeInfo(n.name, "IDLE", (PARTITION,), cpus, n.gpus, 0) for n in topology.nodes]


def history_runs(
    records: Sequence[Any], placements: Mapping[int, Placement], topology: Topology, cluster: str
) -> list[JobRun]:
    """One settled, completed ``JobRun`` per simulated job record (its last placement as the
    node names and GPUs per node Slurm would report)."""
    runs: list[JobRun] = []
    for r in records:
        job: Job = r.job
        pl_ = placements[job.job_id]
        names = tuple(topology.nodes[i].name for i in pl_.nodes)
        per = tuple(g for _, g in pl_.alloc)
        runs.append(
            JobRun(
                cluster=cluster,
                job_id=job.job_id,
                run_index=0,
                name=job.name or f"train-{job.job_id}",
                user=job.user or "demo",
                account="linkwise",
                partition=PARTITION,
                state="COMPLETED",
                exit_code=0,
                signal=None,
                submit_time=job.submit_time,
                start_time=r.first_start,
                end_time=r.end,
                time_limit_s=None,
                nodes=names,
                gpus=pl_.num_gpus,
                gpus_per_node=per,
                allocation_nodes=len(names),
                settled=True,
            )
        )
    return runs


def replay_history(
    jobs: Sequence[Job],
    topology: Topology,
    db: str | Path,
    *,
    cluster: str,
    scheduler: str = "backfill",
    calibration: str | None = None,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> HistoryReport:
    """Replay ``jobs`` under the heuristic ``scheduler`` in the simulator and store the result
    as the cluster's accounting (``ingest_job_runs``, ``ingest_nodes``, the watermark)."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.datasets.ingest import ingest_job_runs, ingest_nodes
    from linkwise.datasets.store import open_store
    from linkwise.models.heuristics import make_policy
    from linkwise.pipelines.collect import accounting_source_name

    t0 = time.perf_counter()
    cal = load_calibration(calibration)
    profiled = assign_profiles(jobs, cal, seed=seed)
    sim = Simulator(topology, profiled, AnalyticModel(cal))
    placements: dict[int, Placement] = {}
    total = len(profiled)

    def on_decision(_state: ClusterState, decision: Decision) -> None:
        for s in decision.starts:
            placements[s.job_id] = s.placement
        if on_progress is not None and sim.events % 500 == 0:
            on_progress(len(sim.records), total)

    drive(sim, make_policy(scheduler), on_decision=on_decision)
    if on_progress is not None:
        on_progress(len(sim.records), total)
    records = sim.records
    runs = history_runs(records, placements, topology, cluster)
    queue = np.array([r.queue_s for r in records]) if records else np.zeros(1)
    with closing(open_store(db)) as con:
        ingest_nodes(con, cluster, node_infos(topology))
        rep = ingest_job_runs(
            con,
            runs,
            source=accounting_source_name(cluster),
            watermark=max((r.end for r in records), default=None),
        )
    return HistoryReport(
        cluster=cluster,
        topology=topology.name,
        scheduler=scheduler,
        jobs=len(runs),
        first_submit=min((r.submit_time for r in runs), default=math.nan),
        last_end=max((r.end for r in records), default=math.nan),
        avg_queue_s=float(queue.mean()),
        p99_queue_s=float(np.percentile(queue, 99)),
        queued_share=float(np.mean(queue > 60.0)),
        inserted=rep.inserted,
        rejected=rep.rejected,
        seconds=time.perf_counter() - t0,
    )


def workload_jobs(
    trace: str | Path | None,
    trace_format: str,
    *,
    jobs: int,
    load_scale: float,
    max_gpus: int,
    seed: int,
) -> tuple[list[Job], str]:
    """The history's jobs on an epoch clock, with positive ids (Slurm's), and a description:
    the trace's valid jobs (at its origin epoch) or the synthetic default workload."""
    if trace is not None:
        from linkwise.datasets.traces import load_trace

        tr = load_trace(trace, trace_format)
        origin = tr.origin_epoch or DEMO_EPOCH
        raw = [j for j in tr.jobs if j.num_gpus <= max_gpus]
        what = f"trace {trace} ({tr.format}, {len(raw)} of {len(tr.jobs)} jobs fit)"
    else:
        from linkwise.datasets.synthetic import generate

        raw = list(generate(jobs, seed=seed, load_scale=load_scale, max_gpus=max_gpus))
        origin = DEMO_EPOCH
        what = f"synthetic default workload ({jobs} jobs, seed {seed}, load x{load_scale})"
    shift = 1 - min((j.job_id for j in raw), default=1)
    out = [
        replace(j, job_id=j.job_id + max(0, shift), submit_time=j.submit_time + origin) for j in raw
    ]
    return out, what


def split_time(
    first_submit: float, last_submit: float, window_s: float, eval_windows: int
) -> float:
    """The dataset's ``until``: a window boundary leaving the last ``eval_windows`` windows
    (on the evaluation's grid: windows of ``window_s`` from the first submit) held out."""
    n = max(1, math.ceil((last_submit - first_submit) / window_s + 1e-9))
    train = max(1, n - eval_windows)
    return first_submit + train * window_s


# ------------------------------------------------------------------------ step 3: training


def train_config(toml: str | Path, dataset_path: str, *, n_steps: int, per_epoch: int) -> Any:
    """A demo training configuration: the TOML with the built dataset and ``n_steps``."""
    from linkwise.models.training import TrainConfig

    data = tomllib.loads(Path(toml).read_text())
    data["dataset"] = {**data.get("dataset", {}), "path": dataset_path}
    per = min(per_epoch, n_steps)
    steps = max(per, n_steps // per * per)
    data["train"] = {**data.get("train", {}), "n_steps": steps, "n_steps_per_epoch": per}
    return TrainConfig.from_mapping(data, base=Path(toml).parent, source=str(toml))


# ------------------------------------------------------------------------ step 6: shadow


class SimShadowBackend(ShadowBackend):
    """The live loop's ``ShadowBackend`` over the simulator instead of Slurm.

    ``observe`` reads the simulator (pending jobs are the ones the shadow policy may start);
    ``apply`` is the live loop's own (decision rows, joins with what "Slurm" did, the
    ``decisions`` table through the ``Recorder``), with rows stamped in simulated time;
    ``advance`` lets ``scheduler`` (the Slurm-like heuristic) act on the simulator, then moves
    it to its next event. Nothing the shadow policy decides changes the simulation."""

    def __init__(
        self,
        sim: Simulator,
        scheduler: Policy,
        config: ServeConfig,
        policy: GuardedPolicy,
        recorder: Any,
        metrics: Any,
        *,
        cluster: str,
        logger: logging.Logger = LOG,
    ) -> None:
        super().__init__(
            None,  # type: ignore[arg-type]  # no Slurm: every client use is overridden
            sim.topology,
            config,
            policy,
            recorder,
            metrics,
            cluster=cluster,
            logger=logger,
            stop=threading.Event(),
            sleep=lambda _s: None,
        )
        self.sim = sim
        self.scheduler = scheduler
        self.slurm_starts = 0

    def observe(self) -> ClusterState:
        """The simulator's state, and the loop's ``Observation`` of it."""
        self.cycle_id += 1
        self.cycle_started = time.perf_counter()
        state = self.sim.observe()
        topo = self.sim.topology
        managed = {
            p.job.job_id: QueuedJob(
                p.job.job_id, p.job.name, p.job.user, PARTITION, "PENDING", "Priority",
                p.job.submit_time, None, None, 0, p.job.num_gpus, (), False,
            )
            for p in state.pending
        }  # fmt: skip
        started = {
            r.job.job_id: (
                r.start_time,
                compress(topo.nodes[i].name for i in r.placement.nodes),
            )
            for r in state.running
        }
        self.obs = Observation(
            state=state,
            managed=managed,
            shapes={},
            no_gpu=(),
            refused={},
            running_ids=frozenset(started),
            started=started,
            held_total=0,
        )
        self.metrics.pending_jobs.set(len(state.pending))
        return state

    def _row(
        self,
        now: float,
        job_id: int | None,
        action: str,
        nodes: str,
        gpus: int,
        note: str,
        info: Mapping[str, Any],
    ) -> dict[str, Any]:
        return super()._row(self.sim.time, job_id, action, nodes, gpus, note, info)

    def _sacct_joins(self, ids: Sequence[int]) -> list[tuple[int, float, str]]:
        """Jobs that started and ended between two observations (the simulator's records)."""
        want = set(ids)
        return [(r.job.job_id, r.first_start, "") for r in self.sim.records if r.job.job_id in want]

    def advance(self) -> bool:
        """Slurm (the scheduler) acts, then the simulator moves to its next event."""
        if self.cfg.max_cycles is not None and self.cycles_ok >= self.cfg.max_cycles:
            return False
        decision = self.scheduler.decide(self.sim.observe())
        self.slurm_starts += len(decision.starts)
        self.sim.apply(decision)
        return self.sim.advance()


def _shadow_loader(spec: str, tracking_uri: str, model: AnalyticModel) -> LoadedPolicy:
    """The registry model behind ``model:ALIAS`` with its registry version as provenance
    (what ``deployer.promote.shadow_evidence`` selects the decision log by)."""
    from linkwise.models.policy_spec import PolicySpec

    pinned = PolicySpec.parse(spec).pinned(tracking_uri)
    version = pinned.registry_version(tracking_uri)
    policy = pinned.build(model, tracking_uri=tracking_uri)
    obs = getattr(getattr(policy, "spec", None), "version", "")
    return LoadedPolicy(policy, spec, str(version), str(obs))


def run_shadow(
    db: str | Path,
    jobs: Sequence[Job],
    topology: Topology,
    *,
    spec: str,
    tracking_uri: str,
    cluster: str,
    state_dir: str | Path,
    scheduler: str = "backfill",
    max_cycles: int = 200,
    calibration: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the shadow loop (``spec``: ``model:ALIAS``) against the simulator over ``jobs``
    scheduled by ``scheduler``; a summary (cycles, decision rows, joined starts)."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.datasets.store import open_store
    from linkwise.deployer.metrics import ServeMetrics
    from linkwise.deployer.safety import Recorder
    from linkwise.models.heuristics import make_policy

    cal = load_calibration(calibration)
    model = AnalyticModel(cal)
    sim = Simulator(topology, assign_profiles(jobs, cal, seed=seed), model)
    cfg = ServeConfig(
        mode="shadow",
        partitions=(PARTITION,),
        policy=spec,
        fallback=scheduler,
        db=str(db),
        state_dir=str(state_dir),
        max_cycles=max_cycles,
        watchdog=False,
    )
    metrics = ServeMetrics()
    holder = PolicyHolder(
        spec,
        scheduler,
        metrics=metrics,
        logger=LOG,
        loader=lambda s: _shadow_loader(s, tracking_uri, model),
        probe=lambda _s: "fixed",
    )
    guarded = GuardedPolicy(holder, metrics, LOG)
    recorder = Recorder(str(db), cfg.spool_path, logger=LOG)
    backend = SimShadowBackend(
        sim, make_policy(scheduler), cfg, guarded, recorder, metrics, cluster=cluster
    )
    backend.start()
    t0 = time.perf_counter()
    drive(backend, guarded)
    seconds = time.perf_counter() - t0
    with closing(open_store(db)) as con:
        row = con.execute(
            "SELECT count(*), count(DISTINCT cycle_id), count(*) FILTER (action = 'start'), "
            "count(actual_start), min(ts), max(ts) FROM decisions WHERE run_id = ?",
            [backend.run_id],
        ).fetchone()
    assert row is not None
    return {
        "run_id": backend.run_id,
        "policy": spec,
        "model_version": holder.active.model_version,
        "fallback_reason": holder.fallback_reason,
        "cycles": backend.cycles_ok,
        "decisions": int(row[0]),
        "decision_cycles": int(row[1]),
        "shadow_starts": int(row[2]),
        "joined_starts": int(row[3]),
        "slurm_starts": backend.slurm_starts,
        "since": row[4],
        "until": row[5],
        "spooled": recorder.spooled(),
        "seconds": seconds,
    }


# ------------------------------------------------------------------------ result


@dataclass(frozen=True)
class DemoResult:
    """Everything a demo run produced and where it is."""

    out_dir: str
    db: str
    tracking_uri: str
    budget: str
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def comparison_table(report: Any, names: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per policy: avg and p99 JCT, their paired ratios to the baseline with
    intervals, queueing, masked actions (sorted by avg JCT)."""
    ratios = {(r.policy, r.stat): r for r in report.ratios}
    rows: list[dict[str, Any]] = []
    for s in report.summary:
        p = s["policy"]
        row: dict[str, Any] = {
            "policy": names.get(p, p),
            "spec": p,
            "cases": s["cases"],
            "avg_jct_s": s.get("avg_jct_s"),
            "p99_jct_s": s.get("p99_jct_s"),
            "avg_queue_s": s.get("avg_queue_s"),
            "masked_actions": s.get("masked_actions"),
        }
        for stat in ("avg", "p99"):
            r = ratios.get((p, stat))
            row[f"{stat}_ratio"] = None if r is None else r.ratio
            row[f"{stat}_low"] = None if r is None else r.low
            row[f"{stat}_high"] = None if r is None else r.high
            row[f"{stat}_wins"] = None if r is None else r.wins
        rows.append(row)
    rows.sort(key=lambda r: float(r["avg_jct_s"] or math.inf))
    return rows


def _fmt_ratio(row: Mapping[str, Any], stat: str) -> str:
    r = row.get(f"{stat}_ratio")
    if r is None:
        return "1 (baseline)" if row.get("policy") == "backfill" else "-"
    return f"{r:.3f} [{row[f'{stat}_low']:.3f}, {row[f'{stat}_high']:.3f}]"


def table_markdown(rows: Sequence[Mapping[str, Any]], baseline: str = "backfill") -> str:
    """The comparison table as Markdown."""
    lines = [
        f"| policy | avg JCT (h) | p99 JCT (h) | avg queue (h) | avg JCT / {baseline} [95% CI] "
        f"| p99 JCT / {baseline} [95% CI] | masked |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {float(r['avg_jct_s']) / 3600:.2f} | "
            f"{float(r['p99_jct_s']) / 3600:.2f} | {float(r['avg_queue_s'] or 0) / 3600:.2f} | "
            f"{_fmt_ratio(r, 'avg')} | {_fmt_ratio(r, 'p99')} | "
            f"{'-' if r['masked_actions'] is None else r['masked_actions']} |"
        )
    return "\n".join(lines)


def _print_table(console: Any, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    from rich.table import Table

    t = Table(title=title)
    for col in (
        "policy",
        "avg JCT h",
        "p99 JCT h",
        "avg queue h",
        "avg / backfill",
        "p99 / backfill",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        t.add_row(
            str(r["policy"]),
            f"{float(r['avg_jct_s']) / 3600:.2f}",
            f"{float(r['p99_jct_s']) / 3600:.2f}",
            f"{float(r['avg_queue_s'] or 0) / 3600:.2f}",
            _fmt_ratio(r, "avg"),
            _fmt_ratio(r, "p99"),
        )
    console.print(t)


# ------------------------------------------------------------------------ the pipeline


class _Stages:
    """Stage headings and timings on stderr."""

    def __init__(self, console: Any, total: int) -> None:
        self.console = console
        self.total = total
        self.n = 0
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()
        self._name = ""

    def begin(self, name: str, what: str) -> None:
        self._close()
        self.n += 1
        self._name = name
        self._t = time.perf_counter()
        self.console.rule(f"[bold]{self.n}/{self.total} {what}")

    def _close(self) -> None:
        if self._name:
            self.seconds[self._name] = time.perf_counter() - self._t
            self.console.print(f"[dim]{self._name}: {self.seconds[self._name]:.1f} s[/dim]")
            self._name = ""

    def end(self) -> dict[str, float]:
        self._close()
        return dict(self.seconds)


def _history_progress(console: Any, enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
    )


def _train_ppo(
    trace: str,
    budget: DemoBudget,
    topology_spec: str,
    train_days: float,
    seed: int,
    uri: str,
    out: Path,
    console: Any,
) -> dict[str, Any]:
    """MaskablePPO in the simulator on the trace's first ``train_days`` days (the dataset's
    span, so the evaluation windows stay held out), on the demo's cluster and decision
    problem; its model entry (registered as ``linkwise-ppo``)."""
    from linkwise.models.ppo import PpoConfig
    from linkwise.pipelines.ppo import train_ppo

    base = tomllib.loads((EXPERIMENTS / "ppo.toml").read_text())
    env = {
        **base["env"],
        "trace": trace,
        "topology": topology_spec,
        "window_s": budget.window_s,
        "block_s": budget.block_s,
        "min_jobs": budget.min_jobs,
        "max_jobs": None,
        "train_days": train_days,
        "mdp": {"k_slots": budget.k_slots, "slot_order": budget.slot_order},
    }
    n_steps = int(base["train"]["n_steps"])
    total = max(n_steps, budget.ppo_steps // n_steps * n_steps)
    data = {**base, "seed": seed, "env": env, "train": {**base["train"], "total_timesteps": total}}
    cfg = PpoConfig.from_mapping(data, base=EXPERIMENTS, source=str(EXPERIMENTS / "ppo.toml"))
    res = train_ppo(cfg, tracking_uri=uri, out_dir=out / "train", progress=False)
    console.print(
        f"ppo: {res.model_name} version {res.model_version}, {res.timesteps} steps in "
        f"{res.seconds:.0f} s ({res.env_steps_per_s:.0f} env steps/s), "
        f"on windows {list(res.windows)}"
    )
    return {
        "model_name": res.model_name,
        "version": res.model_version,
        "run_id": res.run_id,
        "package_dir": res.package_dir,
        "steps": res.timesteps,
        "seconds": res.seconds,
        "windows": list(res.windows),
        "train_days": train_days,
        "evaluation": res.evaluation,
    }


def _ope(
    dataset_path: str, labels: Mapping[str, str], budget: DemoBudget, holdout: float, seed: int
) -> tuple[dict[str, Any] | None, str]:
    """FQE of each learned policy (label -> package dir) on the dataset's held-out episodes;
    (table, note). None with the reason when FQE is not available."""
    try:
        from linkwise.evaluation.ope import FqeParams, ope_table, run_ope
    except ImportError as exc:
        return None, f"FQE unavailable ({exc}): the gate reports missing evidence"
    from linkwise.cluster.mdp import ObsSpec
    from linkwise.datasets.export import read_dataset
    from linkwise.models.training import split_episodes

    df, manifest = read_dataset(dataset_path)
    spec = ObsSpec.from_json(manifest["obs_spec"])
    _, held = split_episodes(df, holdout, seed)
    if held.height == 0:
        return None, "no held-out episodes for FQE"
    per = min(budget.ope_steps, 500)
    params = FqeParams(n_steps=max(per, budget.ope_steps // per * per), n_steps_per_epoch=per)
    try:
        results = run_ope(held, dict(labels), spec=spec, seeds=budget.ope_seeds, params=params)
    except Exception as exc:  # FQE is being finished; a failure is missing evidence, not a crash
        LOG.warning("FQE failed: %s", exc)
        return None, f"FQE failed ({type(exc).__name__}: {str(exc)[:200]})"
    return ope_table(results), f"FQE on {held.height} held-out transitions"


def guard_overrides(
    packages: Mapping[str, str],
    windows: Sequence[Mapping[str, Any]],
    db: str | Path,
    *,
    cluster: str,
    topology: Topology,
    seed: int = 0,
    calibration: str | None = None,
) -> dict[str, dict[str, int]]:
    """How often each learned policy's work-conserving guard fired (label -> counts): each
    package (label -> folder) is run over every window's original arrivals from the store
    (``windows``: ``start``/``end``), counting ``wait_overrides``, starts and decision points
    (the benchmark's own cases are block-bootstrapped and keep no policy state)."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator import simulate
    from linkwise.datasets.rollouts import jobs_from_store
    from linkwise.datasets.store import open_store
    from linkwise.models.learned import load_package

    cal = load_calibration(calibration)
    model = AnalyticModel(cal)
    window_jobs: list[list[Job]] = []
    with closing(open_store(db)) as con:
        for w in windows:
            frame = jobs_from_store(
                con, cluster=cluster, since=float(w["start"]), until=float(w["end"])
            )
            raw = [
                Job(int(r["job_id"]), float(r["submit_time"]), int(r["num_gpus"]),
                    float(r["duration"]))
                for r in frame.iter_rows(named=True)
                if int(r["num_gpus"]) <= topology.total_gpus
            ]  # fmt: skip
            window_jobs.append(list(assign_profiles(raw, cal, seed=seed)))
    out: dict[str, dict[str, int]] = {}
    for label, pkg in packages.items():
        policy = load_package(pkg, model=model)
        starts = points = 0

        def count(_state: ClusterState, decision: Decision) -> None:
            nonlocal starts, points
            starts += len(decision.starts)
            points += 1

        for jobs in window_jobs:
            if jobs:
                simulate(topology, jobs, model, _Counting(policy, count))
        out[label] = {
            "windows": sum(1 for j in window_jobs if j),
            "jobs": sum(len(j) for j in window_jobs),
            "decision_points": points,
            "starts": starts,
            "wait_overrides": policy.wait_overrides,
        }
    return out


@dataclass(frozen=True)
class _Counting:
    """A policy that reports every decision to ``on_decision``."""

    policy: Policy
    on_decision: Callable[[ClusterState, Decision], None]

    @property
    def name(self) -> str:
        return str(self.policy.name)

    def decide(self, state: ClusterState) -> Decision:
        decision = self.policy.decide(state)
        self.on_decision(state, decision)
        return decision


def _pipeline(
    out: Path,
    db: Path,
    *,
    topology_spec: str,
    slurm_cluster: str,
    history: HistoryReport,
    workload: str,
    budget: DemoBudget,
    seed: int,
    uri: str,
    console: Any,
    stages: _Stages,
    eval_seeds: Sequence[int] | None = None,
    trace: str | None = None,
) -> DemoResult:
    """Steps 2-7 on a store that holds the cluster's accounting (``slurm_cluster``); with
    ``trace`` (the history's trace file) and ``budget.ppo_steps``, MaskablePPO is trained on
    the trace's training days and evaluated beside BC and CQL."""
    from linkwise.cluster.mdp import MdpConfig
    from linkwise.cluster.topology import load_topology
    from linkwise.datasets.rollouts import jobs_from_store
    from linkwise.datasets.store import open_store
    from linkwise.deployer.promote import current_aliases
    from linkwise.evaluation.gates import load_gates
    from linkwise.models.registry import MODEL_NAME
    from linkwise.pipelines.build_dataset import build_dataset
    from linkwise.pipelines.evaluate import evaluate, promote_from_evaluation, promote_from_shadow
    from linkwise.pipelines.train import train

    topo = load_topology(topology_spec)
    with closing(open_store(db)) as con:
        all_jobs = jobs_from_store(con, cluster=slurm_cluster)
    all_jobs = all_jobs.filter(all_jobs["num_gpus"] <= topo.total_gpus)
    first = float(all_jobs["submit_time"].min())  # type: ignore[arg-type]
    last = float(all_jobs["submit_time"].max())  # type: ignore[arg-type]
    until = split_time(first, last, budget.window_s, budget.eval_windows)
    split = {
        "first_submit": first,
        "until": until,
        "last_submit": last,
        "window_s": budget.window_s,
        "train_windows": round((until - first) / budget.window_s),
        "heldout_windows": budget.eval_windows,
    }

    stages.begin("dataset", "Build the dataset (logs + rollouts) from the first part")
    console.print(
        f"dataset from [{time.strftime('%Y-%m-%d %H:%M', time.gmtime(first))}, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(until))}) UTC; later windows held out"
    )
    built = build_dataset(
        db,
        out_dir=out / "datasets",
        rollouts=budget.rollouts,
        policies=budget.rollout_policies,
        epsilons=budget.epsilons,
        seeds=budget.rollout_seeds,
        window_s=budget.window_s,
        block_s=budget.block_s,
        min_jobs=budget.min_jobs,
        topology=topology_spec,
        slurm_cluster=slurm_cluster,
        until=until,
        log_window_s=budget.log_window_s,
        config=MdpConfig(k_slots=budget.k_slots, slot_order=budget.slot_order),
        executor="serial",
        max_steps=budget.max_rollout_steps,
        seed=seed,
        tracking_uri=uri,
        warm_start=budget.warm_start,
    )
    dataset = {
        "path": str(built["path"]),
        "hash": built["hash"],
        "counts": built.get("counts"),
        "seconds": built["seconds"],
    }
    console.print(f"dataset {str(built['hash'])[:16]}: {built.get('counts')}")

    stages.begin("train", "Train BC and CQL (and MaskablePPO when budgeted)")
    models: dict[str, dict[str, Any]] = {}
    for algo, toml, steps in (
        ("bc", EXPERIMENTS / "demo_bc.toml", budget.bc_steps),
        ("cql", EXPERIMENTS / "demo_cql.toml", budget.cql_steps),
    ):
        cfg = train_config(toml, dataset["path"], n_steps=steps, per_epoch=budget.steps_per_epoch)
        cfg = replace(cfg, seed=seed)
        res = train(cfg, tracking_uri=uri, out_dir=out / "train")
        models[algo] = {
            "model_name": MODEL_NAME,
            "version": res.model_version,
            "run_id": res.run_id,
            "package_dir": res.package_dir,
            "steps": res.steps,
            "seconds": res.seconds,
            "heldout_action_match": res.metrics.get("heldout_action_match"),
            "heldout_chance": res.metrics.get("heldout_chance"),
        }
        console.print(
            f"{algo}: version {res.model_version}, {res.steps} steps in {res.seconds:.0f} s, "
            f"held-out action match {res.metrics.get('heldout_action_match', math.nan):.3f}"
        )
    if budget.ppo_steps > 0 and trace is not None:
        models["ppo"] = _train_ppo(
            trace, budget, topology_spec, (until - first) / 86400.0, seed, uri, out, console
        )
    holdout = float(train_config(EXPERIMENTS / "demo_cql.toml", dataset["path"], n_steps=1,
                                 per_epoch=1).dataset.holdout)  # fmt: skip

    stages.begin("evaluate", "Evaluate heuristics and the learned policies on held-out windows")
    specs = {f"model:models:/{m['model_name']}/{m['version']}": algo.upper() for algo, m in
             models.items()}  # fmt: skip
    eval_kw: dict[str, Any] = {
        "db": db,
        "slurm_cluster": slurm_cluster,
        "n_windows": budget.eval_windows,
        "seeds": tuple(eval_seeds) if eval_seeds is not None else budget.eval_seeds,
        "cluster": topology_spec,
        "window_s": budget.window_s,
        "block_s": budget.block_s,
        "min_jobs": budget.min_jobs,
        "baseline": "backfill",
        "executor": "serial",
        "tracking_uri": uri,
        "n_boot": budget.n_boot,
        "seed": seed,
        "warm_start": budget.warm_start,
        # the dataset itself, so held-out windows are chosen even when no model is evaluated
        "holdout_from": [str(built["path"]).removesuffix(".parquet") + ".json"],
    }
    report, eval_run = evaluate([*HEURISTICS, *specs], out_dir=out / "evaluation", **eval_kw)
    failed: dict[str, Any] = report.context.get("failed", {})
    for spec, info in failed.items():
        console.print(
            f"[red]{specs.get(spec, spec)} failed[/red] {info['cases']} evaluation cases "
            f"({info['first']}); left out of the comparison"
        )
    table = comparison_table(report, specs)
    evaluation: dict[str, Any] = {
        "out_dir": report.out_dir,
        "report": str(Path(report.out_dir) / "report.md"),
        "files": report.files,
        "run_id": eval_run,
        "windows": report.context.get("evaluation_windows"),
        "dataset_windows": report.context.get("dataset_windows"),
        "seeds": report.context.get("seeds"),
        "failed": {specs.get(x, x): info for x, info in failed.items()},
    }
    labels = {label: models[algo.lower()]["package_dir"] for label, algo in specs.items()}
    evaluation["guard"] = guard_overrides(
        {specs[x]: d for x, d in labels.items()},
        evaluation["windows"] or [],
        db,
        cluster=slurm_cluster,
        topology=topo,
        seed=seed,
    )
    console.print(f"work-conserving guard on the held-out windows: {evaluation['guard']}")

    stages.begin("gate", "Gate and promote the challenger (CQL)")
    ope, note = _ope(dataset["path"], labels, budget, holdout, seed)
    console.print(note)
    try:
        decision = promote_from_evaluation(
            report.out_dir, tracking_uri=uri, gates=load_gates(), ope=ope
        )
        gate = decision.to_json()
        console.print(decision.format())
    except ValueError as exc:  # the challenger failed its evaluation cases
        gate = {"action": "challenger->shadow", "passed": False, "reasons": [str(exc)]}
        console.print(f"challenger->shadow REFUSED: {exc}")

    stages.begin("shadow", "Shadow mode: the live loop against the simulator")
    aliases = current_aliases(uri)
    alias = "shadow" if "shadow" in aliases else "challenger"
    windows: list[dict[str, Any]] = evaluation["windows"] or []
    lo, hi = (
        (float(windows[0]["start"]), float(windows[0]["end"]))
        if windows
        else (until, until + budget.window_s)
    )
    with closing(open_store(db)) as con:
        frame = jobs_from_store(con, cluster=slurm_cluster, since=lo, until=hi)
    shadow_jobs = [
        Job(int(r["job_id"]), float(r["submit_time"]), int(r["num_gpus"]), float(r["duration"]))
        for r in frame.iter_rows(named=True)
        if int(r["num_gpus"]) <= topo.total_gpus
    ]
    shadow = run_shadow(
        db,
        shadow_jobs,
        topo,
        spec=f"model:{alias}",
        tracking_uri=uri,
        cluster=slurm_cluster,
        state_dir=out / "serve",
        max_cycles=budget.shadow_cycles,
        seed=seed,
    )
    console.print(
        f"shadow loop (@{alias}, version {shadow['model_version']}): {shadow['cycles']} cycles, "
        f"{shadow['decisions']} decision rows ({shadow['shadow_starts']} would-be starts), "
        f"backfill started {shadow['slurm_starts']} jobs"
    )
    shadow_gate: dict[str, Any] | None = None
    if alias == "shadow":
        d = promote_from_shadow(
            db, tracking_uri=uri, cluster=topology_spec, slurm_cluster=slurm_cluster, seed=seed
        )
        shadow_gate = d.to_json()
        console.print(d.format())
    else:
        console.print("no @shadow (the challenger did not pass): shadow -> champion not tried")

    stages.begin("table", "Comparison")
    _print_table(console, table, f"held-out windows, {topology_spec}, baseline backfill")
    seconds = stages.end()
    result = DemoResult(
        out_dir=str(out),
        db=str(db),
        tracking_uri=uri,
        budget=budget.name,
        workload=workload,
        cluster=topology_spec,
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
    )
    (out / "demo.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    console.print(
        f"\nreport:   {evaluation['report']}\n"
        f"store:    {db} (tables jobs, job_nodes, nodes, decisions)\n"
        f"summary:  {out / 'demo.json'}\n"
        f"MLflow:   mlflow ui --backend-store-uri {uri}\n"
        f"aliases:  {', '.join(f'@{a}={v}' for a, v in sorted(result.aliases.items()))}"
    )
    return result


def _setup(
    out_dir: str | Path, tracking_uri: str | None, progress: bool
) -> tuple[Path, Path, str, Any]:
    from rich.console import Console

    from linkwise.models.registry import mlflow_env

    mlflow_env()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    db = out / "linkwise.duckdb"
    uri = tracking_uri or f"sqlite:///{out / 'mlflow' / 'mlflow.db'}"
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True, quiet=not progress)
    return out, db, uri, console


def run_demo(
    out_dir: str | Path = "linkwise-out/demo",
    *,
    trace: str | Path | None = None,
    trace_format: str = "auto",
    jobs: int | None = None,
    cluster: str | None = None,
    budget: str | DemoBudget = "full",
    seed: int = 0,
    tracking_uri: str | None = None,
    eval_seeds: Sequence[int] | None = None,
    progress: bool = True,
) -> DemoResult:
    """The whole pipeline (module docstring) into ``out_dir``: the store
    (``linkwise.duckdb``), datasets, packages, the evaluation report, MLflow (a sqlite store
    in ``out_dir/mlflow`` unless ``tracking_uri``) and ``demo.json``."""
    from linkwise.cluster.topology import load_topology

    b = BUDGETS[budget] if isinstance(budget, str) else budget
    if jobs is not None:
        b = replace(b, jobs=jobs)
    if cluster is not None:
        b = replace(b, cluster=cluster)
    out, db, uri, console = _setup(out_dir, tracking_uri, progress)
    if db.exists():
        db.unlink()  # the history is replayed afresh: one demo, one cluster history
    topo = load_topology(b.cluster)
    name = "demo"
    stages = _Stages(console, 7)
    stages.begin("history", f"Replay the history under backfill on {b.cluster} -> DuckDB")
    history_jobs, workload = workload_jobs(
        trace, trace_format, jobs=b.jobs, load_scale=b.load_scale, max_gpus=topo.total_gpus,
        seed=seed,
    )  # fmt: skip
    console.print(workload)
    with _history_progress(console, progress) as bar:
        task = bar.add_task("replay (backfill)", total=len(history_jobs))
        history = replay_history(
            history_jobs,
            topo,
            db,
            cluster=name,
            seed=seed,
            on_progress=lambda done, _t: bar.update(task, completed=done),
        )
    console.print(
        f"{history.jobs} jobs stored as accounting of cluster {name!r}; queueing under backfill: "
        f"avg {history.avg_queue_s / 60:.1f} min, p99 {history.p99_queue_s / 3600:.2f} h, "
        f"{history.queued_share:.0%} waited > 1 min"
    )
    return _pipeline(
        out,
        db,
        topology_spec=b.cluster,
        slurm_cluster=name,
        history=history,
        workload=workload,
        budget=b,
        seed=seed,
        uri=uri,
        console=console,
        stages=stages,
        eval_seeds=eval_seeds,
        trace=_ppo_trace(trace, history_jobs, out) if b.ppo_steps > 0 else None,
    )


def _ppo_trace(trace: str | Path | None, jobs: Sequence[Job], out: Path) -> str:
    """The trace MaskablePPO's environment replays: the given file, else the synthetic
    workload written as a native trace into ``out``."""
    if trace is not None:
        return str(Path(trace).resolve())
    from linkwise.datasets.traces import write_native

    path = out / "workload.csv"
    write_native(jobs, path)
    return str(path)


# ------------------------------------------------------------------------ real Slurm


def _submit_burst(env_file: str, n: int, seed: int, max_s: float) -> list[int]:
    """Submit ``n`` GPU jobs (``sleep``) to the local Slurm; their ids."""
    from linkwise.cluster.slurm.client import SlurmClient

    client = SlurmClient.from_env_file(env_file)
    per_node = max(n.gpus_total for n in client.nodes())  # the cluster's node size
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for i in range(n):
        gpus = int(rng.choice([1, 1, 1, 2, 4, 8]))
        nodes = max(1, -(-gpus // per_node))  # larger jobs span nodes, like -N k
        secs = int(rng.integers(5, max(6, int(max_s))))
        ids.append(
            client.submit(
                f"sleep {secs}",
                name=f"demo-{i}",
                nodes=nodes,
                gpus_per_node=gpus // nodes,
                partition=PARTITION,
            )
        )
        time.sleep(float(rng.exponential(0.5)))
    return ids


def run_demo_slurm(
    out_dir: str | Path = "linkwise-out/demo-slurm",
    *,
    slurm_env: str = "/tmp/linkwise-slurm/env",
    jobs: int = 60,
    max_job_s: float = 40.0,
    budget: str | DemoBudget = "ci",
    seed: int = 0,
    tracking_uri: str | None = None,
    wait_s: float = 900.0,
    progress: bool = True,
) -> DemoResult:
    """The same pipeline with the history from the real local Slurm (``scripts/local-slurm
    start`` first; root only): submit a burst of ``jobs`` sleep jobs, wait for them, collect
    the accounting with ``pipelines.collect.collect_accounting``, then steps 2-7 on it (the
    cluster's topology from its slurm.conf)."""
    from linkwise.cluster.slurm.client import SlurmClient, read_env_file
    from linkwise.deployer.loop import slurm_topology
    from linkwise.pipelines.collect import collect_accounting

    b = BUDGETS[budget] if isinstance(budget, str) else budget
    out, db, uri, console = _setup(out_dir, tracking_uri, progress)
    env = read_env_file(slurm_env)
    conf = env.get("SLURM_CONF")
    if not conf:
        raise ValueError(f"{slurm_env}: no SLURM_CONF (run scripts/local-slurm start as root)")
    name = env.get("LINKWISE_SLURM_CLUSTER", "slurm")
    topo = slurm_topology(conf, name=name)
    spec_dir = str(Path(conf).parent)
    stages = _Stages(console, 7)
    stages.begin("history", f"Submit {jobs} jobs to the local Slurm and collect accounting")
    t0 = time.time() - 60
    ids = set(_submit_burst(slurm_env, jobs, seed, max_job_s))
    client = SlurmClient.from_env_file(slurm_env)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(q.job_id in ids for q in client.queue()):
        time.sleep(2.0)
    report = collect_accounting(client, db, cluster=name, since=t0)
    console.print(json.dumps(report.to_dict(), default=str)[:400])
    from linkwise.datasets.rollouts import jobs_from_store
    from linkwise.datasets.store import open_store

    with closing(open_store(db)) as con:
        frame = jobs_from_store(con, cluster=name, since=t0)
    span = frame["submit_time"]
    history = HistoryReport(
        cluster=name,
        topology=topo.name,
        scheduler="slurm",
        jobs=frame.height,
        first_submit=float(span.min()) if frame.height else math.nan,  # type: ignore[arg-type]
        last_end=time.time(),
        avg_queue_s=math.nan,
        p99_queue_s=math.nan,
        queued_share=math.nan,
        inserted=report.total("inserted"),
        rejected=report.total("rejected"),
        seconds=time.time() - t0,
    )
    # windows on the submit span of the burst (the grid the evaluation's split uses), so a
    # few of them stay held out whatever the jobs' run times
    submit_span = float(span.max() - span.min()) if frame.height else 0.0  # type: ignore[operator,arg-type]
    window = max(5.0, submit_span / (b.eval_windows + 3))
    # a burst of seconds is too short to bootstrap in blocks: replay its windows as they were
    b = replace(b, window_s=window, block_s=0.0, log_window_s=window, min_jobs=2)
    return _pipeline(
        out, db, topology_spec=spec_dir, slurm_cluster=name, history=history,
        workload=f"local Slurm {name}: {len(ids)} submitted", budget=b, seed=seed, uri=uri,
        console=console, stages=stages,
    )  # fmt: skip


# ------------------------------------------------------------------------ headline


def headline_budget(cluster: str = "104x8,leaf=8") -> DemoBudget:
    """The headline run's numbers (``benchmarks/headline.md``): daily windows, the last week
    held out, BC, CQL and MaskablePPO on the given cluster."""
    return replace(
        BUDGETS["full"],
        name="headline",
        cluster=cluster,
        window_s=86400.0,
        block_s=3600.0,
        eval_windows=7,
        min_jobs=20,
        log_window_s=86400.0,
        rollouts=3,
        rollout_seeds=(0,),
        rollout_policies=("backfill", "best_fit", "sjf_bco"),
        epsilons=(0.0, 0.1),
        max_rollout_steps=3000,
        bc_steps=3000,
        cql_steps=10_000,
        steps_per_epoch=1000,
        ope_steps=1000,
        ope_seeds=(0,),
        shadow_cycles=150,
        ppo_steps=102_400,
        slot_order="smallest",
    )


def run_headline(
    trace: str | Path,
    out_dir: str | Path = "linkwise-out/headline",
    *,
    cluster: str = "104x8,leaf=8",
    trace_format: str = "philly",
    budget: DemoBudget | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    seed: int = 0,
    tracking_uri: str | None = None,
    progress: bool = True,
) -> DemoResult:
    """The headline run (issue 6): the demo pipeline on a real trace, daily windows, the last
    week held out, the given cluster; ``benchmarks/headline.md`` is written from its result."""
    return run_demo(
        out_dir,
        trace=trace,
        trace_format=trace_format,
        cluster=cluster,
        budget=budget or headline_budget(cluster),
        seed=seed,
        tracking_uri=tracking_uri,
        eval_seeds=seeds,
        progress=progress,
    )


# ------------------------------------------------------------------------ CLI


def cmd_demo(args: argparse.Namespace) -> int:
    """``linkwise demo``: run the pipeline; print the summary (``--json``: JSON only)."""
    result = run_demo(
        args.out,
        trace=args.trace,
        trace_format=args.trace_format,
        jobs=args.jobs,
        cluster=args.cluster,
        budget=args.budget,
        seed=args.seed,
        tracking_uri=args.tracking_uri,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    else:
        print(table_markdown(result.table))
    return 0


def add_demo_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``linkwise demo`` to the CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="the whole pipeline end to end on the embedded default workload (or --trace)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--trace", type=Path, help="a real trace file (default: synthetic workload)")
    p.add_argument(
        "--trace-format",
        default="auto",
        choices=["auto", "native", "philly", "helios", "alibaba", "swf"],
    )
    p.add_argument("--jobs", type=int, help="synthetic jobs (default: the budget's)")
    p.add_argument("--cluster", help="NODESxGPUS[,leaf=..] (default: the budget's)")
    p.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    p.add_argument("--out", type=Path, default=Path("linkwise-out/demo"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracking-uri", help="MLflow (default: sqlite in OUT/mlflow)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    p.set_defaults(func=cmd_demo)
    return p
