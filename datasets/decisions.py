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

The runs are read by ``datasets.log_jobs``; the replay itself is ``datasets.log_replay``.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import Job, Placement, Start, Topology, requested_nodes
from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.profiles import Calibration, assign_profiles, load_calibration
from linkwise.datasets.log_jobs import load_log_jobs, resolve_cluster
from linkwise.datasets.log_replay import END, SUBMIT, LogReplay, log_events, window_cuts
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import jobs_from_store
from linkwise.datasets.traces import frame_jobs
from linkwise.datasets.transitions import empty_frame

__all__ = [
    "DEFAULT_EPISODE_GAP_S",
    "LogReport",
    "build_log_transitions",
    "store_predictor",
]

DEFAULT_EPISODE_GAP_S = 3600.0


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
    name = resolve_cluster(con, "jobs", cluster)
    jobs_df, skipped = load_log_jobs(con, topology, name, since=since, until=until)
    replay = LogReplay(topology, spec, model, name, episode_gap_s)
    if jobs_df.is_empty():
        return empty_frame(), _report(replay, name, 0, skipped, t0)
    calib = calibration
    if calib is None:
        calib = model.calibration if isinstance(model, AnalyticModel) else load_calibration()
    if predictor is None:
        predictor = store_predictor(con, name, until)
    jobs = predictor.annotate(assign_profiles(_log_jobs(jobs_df), calib, seed=seed))
    placements = [
        Placement.of(list(zip(nodes, gs, strict=True)))
        for nodes, gs in zip(
            jobs_df["alloc_idx"].to_list(), jobs_df["alloc_gpus"].to_list(), strict=True
        )
    ]
    lo = float(since) if since is not None else float(min(jobs_df["submit"].to_list()))
    hi = float(until) if until is not None else math.inf
    end = hi if math.isfinite(hi) else float(max(jobs_df["end"].to_list()))
    cuts = window_cuts(lo, end, window_s)
    _replay_events(replay, jobs_df, jobs, placements, (lo, hi), cuts)
    return replay.buf.to_frame(), _report(replay, name, len(jobs), skipped, t0)


def _log_jobs(jobs_df: pl.DataFrame) -> list[Job]:
    """The runs as ``Job``s (their observed run time as duration; no profile or prediction
    yet)."""
    return [
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
            jobs_df["job_id"].to_list(),
            jobs_df["submit"].to_list(),
            jobs_df["start"].to_list(),
            jobs_df["end"].to_list(),
            jobs_df["gpus"].to_list(),
            jobs_df["name"].to_list(),
            jobs_df["user_name"].to_list(),
            jobs_df["alloc_idx"].to_list(),
            jobs_df["time_limit"].to_list(),
            strict=True,
        )
    ]


def _replay_events(
    replay: LogReplay,
    jobs_df: pl.DataFrame,
    jobs: Sequence[Job],
    placements: Sequence[Placement],
    span: tuple[float, float],
    cuts: Sequence[float],
) -> None:
    """Drive ``replay`` through the log's events, instant by instant: before ``span`` only
    the state, inside it steps, rewards and episodes (cut at ``cuts``)."""
    lo, hi = span
    ids = jobs_df["job_id"].to_list()
    ev = log_events(jobs_df)
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
            if kind == END:
                replay.end(ids[i])
            elif kind == SUBMIT:
                if in_window and replay.idle_for(t) > replay.gap:
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


def store_predictor(
    con: duckdb.DuckDBPyConnection, cluster: str | None, until: float | None
) -> RuntimePredictor:
    """A run-time predictor fit on the store's finished jobs of ``cluster`` submitted before
    ``until`` (all when None)."""
    name = resolve_cluster(con, "jobs", cluster)
    jobs = frame_jobs(jobs_from_store(con, cluster=name, until=until))
    return RuntimePredictor.fit(jobs, until=until)


def _report(
    replay: LogReplay, cluster: str, n_jobs: int, skipped: dict[str, int], t0: float
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
