"""Transitions of the decision problem rebuilt from real accounting logs.

``build_log_transitions`` reads settled, finished job runs and their per-node allocations
from the DuckDB store (``jobs`` + ``job_nodes``), turns them into ``Job`` values and replays
time over the cluster's ``Topology``:

- Events are submits, starts and ends (at one instant: ends, then submits, then starts,
  as the simulator orders them). At every event the ``ClusterState`` is rebuilt: pending =
  submitted and not started (canonical order), running = started and not ended, on their
  real placements (``job_nodes`` mapped to node indices), free GPUs = node GPUs minus those.
- A start time is a decision point: each start is one step, its action the
  ``match_start`` of the real placement (exact candidate, else the nearest by node overlap),
  several starts at one instant in canonical order; a "wait" step ends the decision point.
  A start no candidate expresses ("unslotted": its job is in none of the K slots) is no
  step: it is applied to the state and counted in the report, and recording it as "wait"
  would teach waiting where Slurm started a job. An instant whose starts are all unslotted
  then ends like an event without starts (below).
- An event without a start where some start was feasible (the mask allows one) is a "wait"
  transition: Slurm waited while a job could have started.
- Rewards: ``-(jobs in system x dt) / time_scale`` (minus the weighted contention term of
  ``MdpConfig``) between events, credited to the last step; an episode's return is minus the
  JCT integral over it, so with idle splits minus the episode's total JCT over the time scale.
- Episodes split at idle periods longer than ``episode_gap_s`` (terminal) and, with
  ``window_s``, at fixed window boundaries (timeout). The first step of an episode is emitted
  at its first event even when only wait is allowed, so every interval has a step to credit.

What the observation holds of a job is what Slurm knew (``docs/INFORMATION.md``): its run
time is read only through the predictions of a ``RuntimePredictor`` (``predictor``; by
default one fit on the store's accounting before ``until``, the span the transitions cover).

Accounting knows no model names: each job's communication profile is drawn with
``assign_profiles(seed)`` from the calibration's mix, and its duration is the observed run
time (``end - start``, the proxy for its isolated run time). Link load from telemetry is not
put in the observation (the ``ObsSpec`` features derive link load from placements; adding
measured load would be a new feature and a new spec version).
"""

from __future__ import annotations

import math
import time as wallclock
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import (
    ClusterState,
    Job,
    Node,
    PendingJob,
    Placement,
    RunningJob,
    Start,
    Topology,
    requested_nodes,
)
from linkwise.cluster.hostlist import natural_key
from linkwise.cluster.mdp import (
    Candidates,
    ObsSpec,
    StepMatch,
    apply_start,
    candidates,
    contention_term,
    encode,
    match_start,
    step_reward,
)
from linkwise.cluster.profiles import Calibration, assign_profiles, load_calibration
from linkwise.cluster.topology import DEFAULT_INTRA_GBPS, DEFAULT_NIC_GBPS
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.transitions import TransitionBuffer, empty_frame

__all__ = [
    "DEFAULT_EPISODE_GAP_S",
    "LogReport",
    "build_log_transitions",
    "load_log_jobs",
    "store_cluster",
    "store_predictor",
    "topology_from_store",
]

DEFAULT_EPISODE_GAP_S = 3600.0
_END, _SUBMIT, _START = 0, 1, 2  # event order at one instant


@dataclass(frozen=True)
class LogReport:
    """What one build from logs produced.

    ``waits``: wait transitions where some start was feasible (Slurm waited while GPUs were
    free enough); ``skipped``: jobs left out, by reason; ``actions``: action -> count;
    ``start_matches``: per start, (job id in the replay, match kind, node overlap), where the
    id is Slurm's for a first run and ``-(job_id * 1000 + run_index)`` for a requeued run.
    """

    cluster: str
    transitions: int
    episodes: int
    jobs: int
    starts: int
    exact: int
    nearest: int
    unslotted: int
    waits: int
    decision_points: int
    mean_nearest_overlap: float
    actions: dict[int, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    start_matches: tuple[tuple[int, str, float], ...] = ()
    seconds: float = 0.0

    @property
    def exact_match_share(self) -> float:
        """Share of real starts whose placement is exactly one of the candidates (1.0 if none)."""
        return self.exact / self.starts if self.starts else 1.0

    @property
    def transitions_per_s(self) -> float:
        return self.transitions / self.seconds if self.seconds > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "transitions": self.transitions,
            "episodes": self.episodes,
            "jobs": self.jobs,
            "starts": self.starts,
            "exact": self.exact,
            "exact_match_share": self.exact_match_share,
            "nearest": self.nearest,
            "unslotted": self.unslotted,
            "waits": self.waits,
            "decision_points": self.decision_points,
            "mean_nearest_overlap": self.mean_nearest_overlap,
            "actions": {str(k): v for k, v in sorted(self.actions.items())},
            "skipped": dict(sorted(self.skipped.items())),
            "seconds": self.seconds,
        }


# ------------------------------------------------------------------------ topology


def _resolve_cluster(con: duckdb.DuckDBPyConnection, table: str, cluster: str | None) -> str:
    if cluster is not None:
        return cluster
    names = [str(r[0]) for r in con.execute(f"SELECT DISTINCT cluster FROM {table}").fetchall()]
    if not names:
        raise ValueError(f"the store's {table} table is empty: no cluster in it")
    if len(names) != 1:
        raise ValueError(
            f"the store's {table} table holds {len(names)} clusters ({', '.join(sorted(names))}): "
            "name one"
        )
    return names[0]


def store_cluster(con: duckdb.DuckDBPyConnection, cluster: str | None = None) -> str:
    """The Slurm cluster a store's accounting is of: ``cluster`` when given, else the only one
    in its ``jobs`` table (ValueError when it holds none or several). Datasets and evaluations
    name their spans by it, so that a held-out window and a training span of one store compare
    whether or not ``--slurm-cluster`` was given."""
    return _resolve_cluster(con, "jobs", cluster)


def topology_from_store(
    con: duckdb.DuckDBPyConnection,
    cluster: str | None = None,
    *,
    nic_gbps: float = DEFAULT_NIC_GBPS,
    intra_gbps: float = DEFAULT_INTRA_GBPS,
) -> Topology:
    """A flat topology (all nodes under one leaf switch) from the store's ``nodes`` table.

    For when no slurm.conf/topology.conf is at hand; nodes in natural name order with their
    ``gpus_total``. ValueError if the cluster has no nodes (or ``cluster`` is None and the
    table holds several clusters).
    """
    name = _resolve_cluster(con, "nodes", cluster)
    rows = con.execute("SELECT node, gpus_total FROM nodes WHERE cluster = ?", [name]).fetchall()
    if not rows:
        raise ValueError(f"no nodes of cluster {name!r} in the store (ingest them first)")
    rows.sort(key=lambda r: natural_key(str(r[0])))
    nodes = tuple(
        Node(name=str(n), gpus=max(0, int(g)), leaf=0, intra_gbps=intra_gbps, nic_gbps=nic_gbps)
        for n, g in rows
    )
    return Topology(
        name=name,
        nodes=nodes,
        leaf_names=("leaf1",),
        leaf_agg=(0,),
        leaf_uplink_gbps=(len(nodes) * nic_gbps,),
    )


# ------------------------------------------------------------------------ loading

_LOAD_SQL = """
SELECT j.job_id, j.run_index, j.state, j.settled, j.submit_time, j.start_time, j.end_time,
       j.gpus, j.name, j.user_name, j.time_limit_s,
       list(n.node ORDER BY n.node) FILTER (WHERE n.node IS NOT NULL) AS alloc_nodes,
       list(n.gpus ORDER BY n.node) FILTER (WHERE n.node IS NOT NULL) AS alloc_gpus
FROM jobs AS j
LEFT JOIN job_nodes AS n
  ON n.cluster = j.cluster AND n.job_id = j.job_id AND n.submit_time = j.submit_time
 AND n.run_index = j.run_index
WHERE j.cluster = ? AND coalesce(j.end_time, 'infinity'::DOUBLE) > ? AND j.submit_time < ?
GROUP BY ALL
ORDER BY j.submit_time, j.job_id, j.run_index
"""


def load_log_jobs(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    cluster: str,
    *,
    since: float | None = None,
    until: float | None = None,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The usable job runs overlapping ``[since, until)`` and the count of the others by reason.

    Columns: ``job_id`` (the run's id in the replay: Slurm's id for a first run, a negative
    id for a requeued run or a later job under an id Slurm reused), ``slurm_job_id``,
    ``run_index``, ``submit``, ``start``, ``end``, ``gpus``, ``alloc_idx`` / ``alloc_gpus``
    (node indices into ``topology`` and GPUs), ``time_limit`` (seconds, 0 where Slurm had none).
    """
    lo = -math.inf if since is None else float(since)
    hi = math.inf if until is None else float(until)
    rel = con.sql(_LOAD_SQL, params=[cluster, lo, hi])
    assert rel is not None
    raw: pl.DataFrame = rel.pl()
    node_frame = pl.DataFrame(
        {
            "node": [n.name for n in topology.nodes],
            "node_idx": list(range(len(topology.nodes))),
            "node_cap": [n.gpus for n in topology.nodes],
        },
        schema={"node": pl.String, "node_idx": pl.Int64, "node_cap": pl.Int64},
    )
    per_node = (
        raw.select("job_id", "submit_time", "run_index", "alloc_nodes", "alloc_gpus")
        .explode(["alloc_nodes", "alloc_gpus"])
        .drop_nulls("alloc_nodes")
        .rename({"alloc_nodes": "node"})
        .join(node_frame, on="node", how="left")
        .group_by("job_id", "submit_time", "run_index")
        .agg(
            pl.col("node_idx").is_null().any().alias("unknown_node"),
            (pl.col("alloc_gpus") > pl.col("node_cap")).fill_null(False).any().alias("over_cap"),
            pl.col("alloc_gpus").sum().alias("alloc_total"),
            pl.col("node_idx"),
            pl.col("alloc_gpus"),
        )
    )
    df = raw.drop("alloc_gpus").join(
        per_node, on=["job_id", "submit_time", "run_index"], how="left"
    )
    # a job id Slurm reused (its state cleared): each later job with that id is generation
    # 1, 2, ... (a new job starts at run 0), and its runs get ids of their own
    df = df.with_columns(
        ((pl.col("run_index") == 0).cum_sum().over("job_id", order_by="submit_time") - 1)
        .clip(lower_bound=0)
        .alias("_generation")
    )
    reason = (
        pl.when(~pl.col("settled"))
        .then(pl.lit("unsettled"))
        .when(pl.col("start_time").is_null())
        .then(pl.lit("never started"))
        .when(pl.col("end_time").is_null())
        .then(pl.lit("not finished"))
        .when(pl.col("gpus") <= 0)
        .then(pl.lit("no GPUs"))
        .when(pl.col("end_time") <= pl.col("start_time"))
        .then(pl.lit("zero duration"))
        .when(pl.col("gpus") > topology.total_gpus)
        .then(pl.lit("more GPUs than the cluster"))
        .when(pl.col("alloc_total").is_null())
        .then(pl.lit("no node allocation"))
        .when(pl.col("unknown_node"))
        .then(pl.lit("node not in the topology"))
        .when(pl.col("over_cap"))
        .then(pl.lit("more GPUs than the node has"))
        .when(pl.col("alloc_total") != pl.col("gpus"))
        .then(pl.lit("allocation does not add up"))
        .otherwise(pl.lit(None, dtype=pl.String))
        .alias("reason")
    )
    df = df.with_columns(reason)
    skipped = {
        str(r): int(n)
        for r, n in df.filter(pl.col("reason").is_not_null()).group_by("reason").len().rows()
    }
    good = (
        df.filter(pl.col("reason").is_null())
        .with_columns(
            pl.when((pl.col("run_index") == 0) & (pl.col("_generation") == 0))
            .then(pl.col("job_id"))
            .otherwise(
                -(pl.col("job_id") * 1000 + pl.col("_generation") * 100 + pl.col("run_index"))
            )
            .alias("rid"),
            pl.min_horizontal("submit_time", "start_time").alias("submit"),
        )
        .select(
            pl.col("rid").alias("job_id"),
            pl.col("job_id").alias("slurm_job_id"),
            "run_index",
            "submit",
            pl.col("start_time").alias("start"),
            pl.col("end_time").alias("end"),
            pl.col("gpus").cast(pl.Int64),
            pl.col("name").fill_null(""),
            pl.col("user_name").fill_null(""),
            pl.col("node_idx").alias("alloc_idx"),
            "alloc_gpus",
            pl.col("time_limit_s").fill_null(0.0).alias("time_limit"),
        )
        .sort("submit", "job_id")
    )
    return good, skipped


def _events(jobs: pl.DataFrame) -> pl.DataFrame:
    """(t, kind, i) rows in replay order: time, then end < submit < start, then canonical."""
    idx = pl.int_range(pl.len(), dtype=pl.Int64).alias("i")
    base = jobs.select(idx, "submit", "job_id", "start", "end")
    parts = [
        base.select(
            pl.col(col).alias("t"),
            pl.lit(kind, dtype=pl.Int8).alias("kind"),
            "i",
            "submit",
            "job_id",
        )
        for col, kind in (("end", _END), ("submit", _SUBMIT), ("start", _START))
    ]
    return pl.concat(parts).sort("t", "kind", "submit", "job_id").select("t", "kind", "i")


# ------------------------------------------------------------------------ replay


@dataclass
class _Counts:
    starts: int = 0
    exact: int = 0
    nearest: int = 0
    unslotted: int = 0
    waits: int = 0
    decision_points: int = 0
    overlap: float = 0.0
    dropped: int = 0
    matches: list[tuple[int, str, float]] = field(default_factory=list)
    actions: Counter[int] = field(default_factory=Counter)


class _Replay:
    """The mutable replay of one cluster's log (internal): state, episodes and the buffer."""

    def __init__(
        self,
        topology: Topology,
        spec: ObsSpec,
        model: ContentionModel,
        cluster: str,
        episode_gap_s: float,
    ) -> None:
        self.topo = topology
        self.spec = spec
        self.cfg = spec.config
        self.model = model
        self.cluster = cluster
        self.gap = episode_gap_s
        self.buf = TransitionBuffer(obs_spec_version=spec.version)
        self.free = [n.gpus for n in topology.nodes]
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.now = -math.inf
        self.idle_since = -math.inf
        self.episode = ""
        self.episode_steps = 0
        self.episodes = 0
        self.names: Counter[str] = Counter()
        self.counts = _Counts()

    # -- state

    @property
    def in_system(self) -> int:
        return len(self.pending) + len(self.running)

    def state(self, t: float) -> ClusterState:
        return ClusterState(
            time=t,
            topology=self.topo,
            free_gpus=tuple(self.free),
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
        )

    def end(self, job_id: int) -> None:
        run = self.running.pop(job_id, None)
        if run is None:  # dropped as overcommitted
            return
        for node, g in run.placement.alloc:
            self.free[node] += g
        if not self.in_system:
            self.idle_since = self.now

    def submit(self, job: Job) -> None:
        self.pending[job.job_id] = PendingJob(job=job, remaining_s=job.duration)

    def feasible(self, placement: Placement) -> bool:
        return all(self.free[n] >= g for n, g in placement.alloc)

    def occupy(self, run: RunningJob) -> None:
        del self.pending[run.job.job_id]
        for node, g in run.placement.alloc:
            self.free[node] -= g
        self.running[run.job.job_id] = run

    def drop(self, job_id: int) -> None:
        """A start the state cannot hold (GPUs over-committed): the job leaves the replay."""
        del self.pending[job_id]
        self.counts.dropped += 1
        if not self.in_system:
            self.idle_since = self.now

    def silent_start(self, start: Start) -> None:
        """A start before the window: no step, same bookkeeping as ``apply_start``."""
        if not self.feasible(start.placement):
            self.drop(start.job_id)
            return
        pj = self.pending[start.job_id]
        rate = self.model.rates(self.topo, [(pj.job, start.placement)])[0]
        self.occupy(
            RunningJob(
                job=pj.job,
                placement=start.placement,
                start_time=self.now,
                remaining_s=pj.remaining_s,
                rate=rate,
                attained_gpu_s=pj.attained_gpu_s,
                since=self.now,
            )
        )

    # -- time, rewards and episodes

    def advance(self, t: float) -> None:
        """Let time pass to ``t``, crediting the jobs-in-system integral to the last step."""
        if t <= self.now:
            return
        n = self.in_system
        if n and self.episode_steps:
            contention = 0.0
            if self.cfg.contention_weight > 0:
                contention = contention_term(self.state(self.now), t - self.now, self.cfg)
            self.buf.add_reward(step_reward(self.now, t, n, contention, self.cfg))
        self.now = t

    def close(self) -> None:
        """End the current episode: terminal if nothing is left in the system, else a cut."""
        if self.episode_steps:
            self.buf.end_episode(terminal=self.in_system == 0)
        self.episode_steps = 0
        self.episode = ""

    def cut(self, t: float, *, observe: bool) -> None:
        """A window boundary: credit time up to ``t``, end the episode (timeout if jobs are
        in the system), and observe the state at ``t`` to open the next one."""
        self.advance(t)
        self.close()
        if observe:
            self.observe_wait()

    def idle_for(self, t: float) -> float:
        """How long the system has been empty at ``t`` (-inf when jobs are in it or no episode
        is open)."""
        if self.in_system or not self.episode_steps:
            return -math.inf
        return t - self.idle_since

    def _episode_name(self, t: float) -> str:
        base = f"log/{self.cluster}/{math.floor(t)}"
        self.names[base] += 1
        k = self.names[base]
        return base if k == 1 else f"{base}.{k - 1}"

    def add_step(self, cands: Candidates, m: StepMatch) -> None:
        if not self.episode_steps:
            self.episode = self._episode_name(self.now)
            self.episodes += 1
        self.buf.add(
            episode=self.episode,
            step=self.episode_steps,
            time=self.now,
            obs=encode(cands, self.spec),
            action=m.action,
            reward=0.0,
            mask=cands.mask,
            source="log",
            behaviour="slurm",
            match=m.kind,
        )
        self.episode_steps += 1
        self.counts.actions[m.action] += 1

    def _wait_match(self, cands: Candidates) -> StepMatch:
        if cands.mask[: self.cfg.wait_action].any():
            self.counts.waits += 1
        return StepMatch(self.cfg.wait_action, None, "wait", 1.0)

    def decide(self, starts: list[Start]) -> None:
        """One decision point: the starts at this instant as steps, then wait. Unslotted
        starts are applied and counted without a step; if no start made a step, the instant
        ends like an event without starts (``observe_wait``)."""
        c = self.counts
        state = self.state(self.now)
        stepped = False
        for start in starts:
            if not self.feasible(start.placement):
                self.drop(start.job_id)
                state = self.state(self.now)
                continue
            cands = candidates(state, self.cfg, self.model)
            m = match_start(cands, start)
            c.starts += 1
            if m is None:
                c.unslotted += 1
                c.matches.append((start.job_id, "unslotted", 0.0))
            else:
                c.matches.append((start.job_id, m.kind, m.overlap))
                if m.kind == "exact":
                    c.exact += 1
                else:
                    c.nearest += 1
                    c.overlap += m.overlap
                self.add_step(cands, m)
                stepped = True
            state = apply_start(state, start, self.model)
            self.occupy(state.running[-1])
        if stepped:
            c.decision_points += 1
            cands = candidates(state, self.cfg, self.model)
            self.add_step(cands, self._wait_match(cands))
        else:
            self.observe_wait()

    def observe_wait(self) -> None:
        """An event without starts: a wait step if a start was feasible (or the episode needs a
        first observation)."""
        if not self.in_system:
            return
        must = self.episode_steps == 0
        total_free = sum(self.free)
        slots = list(self.pending.values())[: self.cfg.k_slots]
        if self.cfg.slot_order != "head":
            slots = list(self.pending.values())
        if not must and not any(p.job.num_gpus <= total_free for p in slots):
            return
        cands = candidates(self.state(self.now), self.cfg, self.model)
        if must or cands.mask[: self.cfg.wait_action].any():
            self.add_step(cands, self._wait_match(cands))


def _window_cuts(lo: float, hi: float, window_s: float | None) -> list[float]:
    if window_s is None or not math.isfinite(lo) or not math.isfinite(hi):
        return []
    n = math.ceil((hi - lo) / window_s)
    return [lo + k * window_s for k in range(1, n) if lo + k * window_s < hi]


def build_log_transitions(
    con: duckdb.DuckDBPyConnection,
    *,
    topology: Topology,
    spec: ObsSpec,
    model: ContentionModel,
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
    episode_gap_s: float = DEFAULT_EPISODE_GAP_S,
    window_s: float | None = None,
    seed: int = 0,
    calibration: Calibration | None = None,
    predictor: RuntimePredictor | None = None,
) -> tuple[pl.DataFrame, LogReport]:
    """The transition frame (``TRANSITION_SCHEMA``) of the store's accounting, and its report.

    Replays ``[since, until)`` (default: the whole log); jobs running or pending at ``since``
    form the initial state. ``episode_gap_s``: an idle period (no job in the system) longer
    than this ends an episode (terminal). ``window_s``: also cut episodes every so many
    seconds from the window start (timeout). ``seed`` draws the jobs' profiles from the
    calibration's mix (``calibration``, else the model's, else the shipped one).
    ``predictor`` annotates every job with run-time predictions (None: ``store_predictor``,
    fit on the store's accounting before ``until``).
    """
    if not episode_gap_s >= 0:
        raise ValueError("episode_gap_s must be non-negative")
    if window_s is not None and not window_s > 0:
        raise ValueError("window_s must be positive")
    t0 = wallclock.perf_counter()
    name = _resolve_cluster(con, "jobs", cluster)
    jobs_df, skipped = load_log_jobs(con, topology, name, since=since, until=until)
    replay = _Replay(topology, spec, model, name, episode_gap_s)
    if jobs_df.is_empty():
        return empty_frame(), _report(replay, name, 0, skipped, t0)
    calib = calibration
    if calib is None:
        calib = model.calibration if isinstance(model, AnalyticModel) else load_calibration()
    ids = jobs_df["job_id"].to_list()
    submits = jobs_df["submit"].to_list()
    starts = jobs_df["start"].to_list()
    ends = jobs_df["end"].to_list()
    gpus = jobs_df["gpus"].to_list()
    raw_jobs = [
        Job(
            job_id=i,
            submit_time=s,
            num_gpus=g,
            duration=e - b,
            name=nm,
            user=u,
            nodes=requested_nodes(g, len(idx)),
            time_limit=lim,
        )
        for i, s, b, e, g, nm, u, idx, lim in zip(
            ids,
            submits,
            starts,
            ends,
            gpus,
            jobs_df["name"].to_list(),
            jobs_df["user_name"].to_list(),
            jobs_df["alloc_idx"].to_list(),
            jobs_df["time_limit"].to_list(),
            strict=True,
        )
    ]
    if predictor is None:
        predictor = store_predictor(con, name, until)
    jobs = predictor.annotate(assign_profiles(raw_jobs, calib, seed=seed))
    placements = [
        Placement.of(list(zip(nodes, gs, strict=True)))
        for nodes, gs in zip(
            jobs_df["alloc_idx"].to_list(), jobs_df["alloc_gpus"].to_list(), strict=True
        )
    ]
    lo = float(since) if since is not None else float(min(submits))
    hi = float(until) if until is not None else math.inf
    cuts = _window_cuts(lo, hi if math.isfinite(hi) else float(max(ends)), window_s)
    ev = _events(jobs_df)
    ts = ev["t"].to_numpy()
    kinds = ev["kind"].to_numpy()
    idxs = ev["i"].to_numpy()
    # group boundaries of equal times
    bounds = np.flatnonzero(np.diff(ts)) + 1
    groups = np.split(np.arange(len(ts)), bounds)
    cut_i = 0
    entered = False
    for g in groups:
        t = float(ts[g[0]])
        if t >= hi:
            break
        in_window = t >= lo
        if in_window:
            if not entered:  # the state at the window start, if jobs are already in it
                entered = True
                replay.now = lo
                if t > lo:
                    replay.observe_wait()
            while cut_i < len(cuts) and cuts[cut_i] <= t:
                replay.cut(cuts[cut_i], observe=cuts[cut_i] < t)
                cut_i += 1
            replay.advance(t)
        else:
            replay.now = t
        starts_here: list[Start] = []
        for k in g:
            kind, i = int(kinds[k]), int(idxs[k])
            if kind == _END:
                replay.end(ids[i])
            elif kind == _SUBMIT:
                if in_window and replay.idle_for(t) > episode_gap_s:
                    replay.close()
                replay.submit(jobs[i])
            elif ids[i] in replay.pending:
                starts_here.append(Start(ids[i], placements[i]))
        if not in_window:
            for s in starts_here:
                replay.silent_start(s)
        elif starts_here:
            replay.decide(starts_here)
        else:
            replay.observe_wait()
    if not entered:
        replay.now = lo
        replay.observe_wait()
    for c in cuts[cut_i:]:
        replay.cut(c, observe=True)
    if math.isfinite(hi):
        replay.advance(hi)
    replay.close()
    return replay.buf.to_frame(), _report(replay, name, len(jobs), skipped, t0)


def store_predictor(
    con: duckdb.DuckDBPyConnection, cluster: str | None, until: float | None
) -> RuntimePredictor:
    """A run-time predictor fit on the store's finished jobs of ``cluster`` submitted before
    ``until`` (all when None)."""
    from linkwise.datasets.rollouts import jobs_from_store
    from linkwise.datasets.traces import frame_jobs

    name = _resolve_cluster(con, "jobs", cluster)
    jobs = frame_jobs(jobs_from_store(con, cluster=name, until=until))
    return RuntimePredictor.fit(jobs, until=until)


def _report(
    replay: _Replay, cluster: str, n_jobs: int, skipped: dict[str, int], t0: float
) -> LogReport:
    c = replay.counts
    skip = dict(skipped)
    if c.dropped:
        skip["overcommitted"] = skip.get("overcommitted", 0) + c.dropped
    return LogReport(
        cluster=cluster,
        transitions=len(replay.buf),
        episodes=replay.episodes,
        jobs=n_jobs,
        starts=c.starts,
        exact=c.exact,
        nearest=c.nearest,
        unslotted=c.unslotted,
        waits=c.waits,
        decision_points=c.decision_points,
        mean_nearest_overlap=c.overlap / c.nearest if c.nearest else 1.0,
        actions=dict(sorted(c.actions.items())),
        skipped=skip,
        start_matches=tuple(c.matches),
        seconds=wallclock.perf_counter() - t0,
    )
