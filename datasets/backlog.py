"""The cluster as its history left it at an instant: what a warm-started evaluation starts from.

An evaluation window that starts from an empty cluster hides what a scheduler faces in
production: GPUs held by jobs started earlier and a queue of jobs submitted earlier. A
``Backlog`` is that state at a time ``t``, read from the accounting in the DuckDB store
(``jobs`` + ``job_nodes``, the same usable runs as the log builder,
``datasets.log_jobs.load_log_jobs``):

- **running**: runs started before ``t`` and ending after it, on their real placements, with
  the run time they had left (``end - t``) as their remaining work. Accounting has only the
  observed run time, so the remaining work is the observed remainder (contention included),
  the same proxy the log builder uses for a job's isolated run time.
- **pending**: runs submitted before ``t`` and started at or after it, with their observed run
  time (``end - start``) as their work.

With a run-time ``predictor`` (``datasets.predictor``), every job carries its predictions,
made from what Slurm knew of it (user, name, GPUs, its whole time limit); a running job's are
less the time it has run (``datasets.prediction.shift_running``), as the simulator restarts it
at ``t`` with no attained service. Without one, the jobs have no predictions and whoever
simulates them annotates them (less precisely: the name then holds the history id and the
time limit what is left of it).

``warm_jobs`` turns a backlog into simulator inputs on a window's clock (the window starts at
0): running jobs as ``(Job, Placement)`` pairs for ``Simulator(running=...)``, pending jobs as
arrivals at 0 (their wait before the window belongs to the history's scheduler, not to the
policy evaluated), ids after the window's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import polars as pl

from linkwise.cluster.domain import Job, Placement, Topology, requested_nodes
from linkwise.datasets.log_jobs import load_log_jobs, resolve_cluster
from linkwise.datasets.prediction import shift_running
from linkwise.datasets.predictor import RuntimePredictor

__all__ = ["Backlog", "backlog_from_store", "warm_jobs"]


@dataclass(frozen=True)
class Backlog:
    """The jobs in the system at ``time``: running ones with their placements, pending ones.

    Jobs carry their history ids (``name`` holds them as text) and ``duration`` = the work
    left; ``skipped`` counts runs in the system then that the topology cannot hold (unknown
    node, allocation that does not add up, GPUs already taken by another run), by reason."""

    time: float
    running: tuple[tuple[Job, Placement], ...] = ()
    pending: tuple[Job, ...] = ()
    skipped: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Counts for reports: running and pending jobs and the GPUs the running ones hold."""
        return {
            "time": self.time,
            "running": len(self.running),
            "running_gpus": sum(j.num_gpus for j, _ in self.running),
            "pending": len(self.pending),
            "pending_gpus": sum(j.num_gpus for j in self.pending),
            "skipped": dict(self.skipped),
        }


def backlog_from_store(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    cluster: str | None,
    t: float,
    predictor: RuntimePredictor | None = None,
) -> Backlog:
    """The store's cluster ``cluster`` (None: the only one it holds) at time ``t`` on
    ``topology``, its jobs annotated by ``predictor`` when given (module docstring)."""

    name = resolve_cluster(con, "jobs", cluster)
    runs, skipped = load_log_jobs(con, topology, name, since=t, until=t)
    return _backlog(runs, float(t), dict(skipped), topology, predictor)


def _predicted(job: Job, r: dict[str, Any], predictor: RuntimePredictor | None) -> Job:
    """``job`` with the predictions Slurm's view of the run gives (its name and whole limit)."""
    if predictor is None:
        return job
    seen = replace(job, name=str(r["name"]), time_limit=float(r["time_limit"]))
    qs = predictor.predict(seen)
    return replace(job, pred_s=qs[0], pred_hi_s=qs[-1])


def _backlog(
    runs: pl.DataFrame,
    t: float,
    skipped: dict[str, int],
    topology: Topology,
    predictor: RuntimePredictor | None = None,
) -> Backlog:
    running: list[tuple[Job, Placement]] = []
    pending: list[Job] = []
    free = [n.gpus for n in topology.nodes]
    for r in runs.iter_rows(named=True):
        start, end = float(r["start"]), float(r["end"])
        limit = float(r["time_limit"])
        job = Job(
            job_id=int(r["job_id"]),
            submit_time=float(r["submit"]),
            num_gpus=int(r["gpus"]),
            duration=(end - t) if start < t else (end - start),
            user=str(r["user_name"]),
            name=str(r["slurm_job_id"]),
            nodes=requested_nodes(int(r["gpus"]), len(r["alloc_idx"])),
            # a running job restarts at t in the simulator: what is left of its limit
            time_limit=max(1.0, limit - (t - start)) if limit > 0 and start < t else limit,
        )
        job = _predicted(job, r, predictor)
        if start >= t:
            pending.append(job)
            continue
        placement = Placement.of(list(zip(r["alloc_idx"], r["alloc_gpus"], strict=True)))
        if any(free[node] < gpus for node, gpus in placement.alloc):
            skipped["over-committed GPUs"] = skipped.get("over-committed GPUs", 0) + 1
            continue
        for node, gpus in placement.alloc:
            free[node] -= gpus
        running.append((shift_running(job, t - start), placement))
    return Backlog(time=t, running=tuple(running), pending=tuple(pending), skipped=skipped)


def warm_jobs(
    backlog: Backlog, first_id: int, start: float = 0.0
) -> tuple[tuple[tuple[Job, Placement], ...], tuple[Job, ...]]:
    """The backlog on a window's clock: ``(running, pending)`` with ids from ``first_id``
    (pending first, in submit order), every submit time at ``start``."""
    pending = sorted(backlog.pending, key=lambda j: (j.submit_time, j.job_id))
    out_pending = tuple(
        replace(j, job_id=first_id + i, submit_time=start) for i, j in enumerate(pending)
    )
    base = first_id + len(out_pending)
    out_running = tuple(
        (replace(j, job_id=base + i, submit_time=start), p)
        for i, (j, p) in enumerate(backlog.running)
    )
    return out_running, out_pending
