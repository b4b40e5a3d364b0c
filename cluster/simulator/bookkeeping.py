"""The simulator's mutable bookkeeping of a running job (``Run``), of one in transit
(``Transit``) and of a job's totals (``Accrued``); and ``ResumedTransit``, a job in
transit as ``Simulator.from_state`` takes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linkwise.cluster.domain import Job, Placement, RunningJob, TransitJob
from linkwise.cluster.simulator.records import JobRecord


@dataclass(slots=True)
class Run:
    """Mutable bookkeeping of a running job (internal to the simulator)."""

    job: Job
    placement: Placement
    start: float
    since: float
    remaining: float
    rate: float
    attained: float
    preemptions: int
    version: int = 0
    split: bool = False
    view: RunningJob | None = None
    base: float = 0.0  # isolated work left at start, without the restore charge
    restore: float = 0.0  # restore seconds charged at this start
    migrations: int = 0
    member: int = -1  # its id in the simulator's ``SplitRates`` (-1: none)

    def real_remaining(self) -> float:
        """Work left at ``since`` without what is left of the restore charge."""
        return min(self.remaining, self.base)

    def restore_done(self) -> float:
        """Seconds of the restore charge worked off by ``since``."""
        return min(self.restore, self.base + self.restore - self.remaining)

    def snapshot(self) -> RunningJob:
        if self.view is None:
            self.view = RunningJob(
                job=self.job,
                placement=self.placement,
                start_time=self.start,
                remaining_s=self.remaining,
                rate=self.rate,
                attained_gpu_s=self.attained,
                preemptions=self.preemptions,
                since=self.since,
            )
        return self.view

    def rebase(self, t: float) -> None:
        """Bring remaining work and attained service up to time ``t``."""
        dt = t - self.since
        if dt > 0:
            self.remaining = max(0.0, self.remaining - self.rate * dt)
            self.attained += self.job.num_gpus * dt
            self.since = t
            self.view = None


@dataclass(slots=True)
class Transit:
    """A job draining its old GPUs and/or waiting for reserved ones (internal)."""

    job: Job
    remaining: float  # isolated work left (lost work included, restore not)
    attained: float
    preemptions: int
    migrations: int
    held: Placement | None  # GPUs still held while it checkpoints
    unclaimed: dict[int, int]  # of ``held``: GPUs per node not reserved by another start
    drain_end: float
    target: Placement | None = None  # reserved GPUs it starts on
    start_at: float = math.inf
    view: TransitJob | None = None

    def snapshot(self) -> TransitJob:
        if self.view is None:
            self.view = TransitJob(
                job=self.job,
                held=self.held,
                target=self.target,
                until=self.start_at if self.target is not None else self.drain_end,
                attained_gpu_s=self.attained,
                preemptions=self.preemptions,
            )
        return self.view


@dataclass(slots=True)
class Accrued:
    """A job's totals over its runs so far (its ``JobRecord`` when it ends)."""

    first_start: float = math.nan
    run_s: float = 0.0
    gpu_s: float = 0.0
    restart_s: float = 0.0

    def record(self, run: Run, end: float) -> JobRecord:
        """The record of the job whose last run, ``run``, ended at ``end``."""
        return JobRecord(
            job=run.job,
            first_start=self.first_start,
            end=end,
            run_s=self.run_s,
            gpu_s=self.gpu_s,
            preemptions=run.preemptions,
            nodes=run.placement.num_nodes,
            migrations=run.migrations,
            restart_s=self.restart_s,
        )


@dataclass(frozen=True, slots=True)
class ResumedTransit:
    """A job in transit as ``Simulator.from_state`` resumes it: draining ``held`` until
    ``until`` (then back to the queue, unless it has a ``target``), or waiting for its
    reserved ``target`` GPUs until ``until`` (then running there). ``remaining_s``: its
    isolated work left; ``unclaimed``: of the ``held`` GPUs, per node, those no other
    start has reserved (they become free when it has drained)."""

    job: Job
    remaining_s: float
    held: Placement | None
    target: Placement | None
    until: float
    attained_gpu_s: float = 0.0
    preemptions: int = 0
    migrations: int = 0
    unclaimed: tuple[tuple[int, int], ...] = ()
