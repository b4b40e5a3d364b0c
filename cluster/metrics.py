"""Metrics of a simulated (or replayed) run, from its per-job records, and ``duration_text``,
how every text report prints a duration (JCTs, waits, spans; JSON keeps seconds)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from linkwise.cluster.simulator.records import JobRecord

BOUNDED_SLOWDOWN_FLOOR_S = 10.0  # the usual bound (Feitelson): short jobs count as 10 s

# (below this many seconds, the unit and its seconds); days beyond the last
_UNITS = ((120.0, "s", 1.0), (3600.0, "min", 60.0), (86400.0, "h", 3600.0))


def duration_text(seconds: float) -> str:
    """A duration a person reads, in the largest unit that keeps it readable and three
    significant digits: ``72 s``, ``14.3 min``, ``2.41 h``, ``3.2 d`` (``10 min``, ``1 h``:
    no trailing zeros); negative ones signed, ``-`` for a missing (non-finite) one."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 0:
        return "-" + duration_text(-seconds)
    _, unit, scale = next((u for u in _UNITS if seconds < u[0]), (math.inf, "d", 86400.0))
    value = seconds / scale
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Summary of one run. Times in seconds; ``gpu_utilization`` in [0, 1].

    ``preemptions`` and ``migrations`` in all; ``preemptions_per_job`` their mean per job;
    ``restart_s_per_job``: the mean seconds a job lost to restarts (grace held while
    checkpointing, restore, work redone; ``cluster/restart.py``).
    """

    policy: str
    jobs: int
    avg_jct_s: float
    p50_jct_s: float
    p95_jct_s: float
    p99_jct_s: float
    makespan_s: float
    avg_queue_s: float
    avg_contention_slowdown: float
    avg_bounded_slowdown: float
    gpu_utilization: float
    preemptions: int
    events: int
    wall_s: float
    migrations: int = 0
    preemptions_per_job: float = 0.0
    restart_s_per_job: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    records: Sequence[JobRecord], *, total_gpus: int, events: int, wall_s: float, policy: str = ""
) -> RunMetrics:
    """Aggregate per-job records into run metrics."""
    if not records:
        raise ValueError("no finished jobs to summarise")
    submit = np.fromiter((r.job.submit_time for r in records), float, len(records))
    end = np.fromiter((r.end for r in records), float, len(records))
    run = np.fromiter((r.run_s for r in records), float, len(records))
    iso = np.fromiter((r.job.duration for r in records), float, len(records))
    gpu_s = float(sum(r.gpu_s for r in records))
    jct = end - submit
    makespan = float(end.max() - submit.min())
    p50, p95, p99 = np.percentile(jct, [50, 95, 99])
    bounded = np.maximum(1.0, jct / np.maximum(iso, BOUNDED_SLOWDOWN_FLOOR_S))
    preemptions = sum(r.preemptions for r in records)
    return RunMetrics(
        policy=policy,
        jobs=len(records),
        avg_jct_s=float(jct.mean()),
        p50_jct_s=float(p50),
        p95_jct_s=float(p95),
        p99_jct_s=float(p99),
        makespan_s=makespan,
        avg_queue_s=float((jct - run).mean()),
        avg_contention_slowdown=float((run / iso).mean()),
        avg_bounded_slowdown=float(bounded.mean()),
        gpu_utilization=gpu_s / (total_gpus * makespan) if makespan > 0 else 0.0,
        preemptions=preemptions,
        events=events,
        wall_s=wall_s,
        migrations=sum(r.migrations for r in records),
        preemptions_per_job=preemptions / len(records),
        restart_s_per_job=float(sum(r.restart_s for r in records)) / len(records),
    )
