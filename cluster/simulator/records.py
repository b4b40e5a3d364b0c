"""What a simulated run produces: a record per job (``JobRecord``) and the run's result
(``SimResult``).
"""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.domain import Job, Topology


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job."""

    job: Job
    first_start: float
    end: float
    run_s: float  # wall seconds spent holding GPUs (all runs)
    gpu_s: float  # GPU-seconds held
    preemptions: int
    nodes: int  # nodes spanned by its last placement
    migrations: int = 0
    restart_s: float = 0.0  # seconds lost to restarts: grace held, restore, work redone

    @property
    def jct(self) -> float:
        return self.end - self.job.submit_time

    @property
    def queue_s(self) -> float:
        return self.jct - self.run_s

    @property
    def contention_slowdown(self) -> float:
        """Actual run time over isolated run time at the best placement (>= 1)."""
        return self.run_s / self.job.duration


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulated run."""

    records: tuple[JobRecord, ...]
    topology: Topology
    events: int
    wall_s: float
    policy: str = ""
