"""Typed records of what Slurm reports: job runs, nodes, partitions.

Both transports (command-line JSON and slurmrestd) produce exactly these values, so
everything downstream (ingest, the live loop) is transport-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.request import Request


@dataclass(frozen=True, slots=True)
class JobRun:
    """One accounting record of a job run (a requeued job has one per run).

    ``settled`` is False while Slurm 22.05 still shows a transient record (a multi-node
    job in its first/last seconds with ``allocation_nodes == 0``); ingest keeps the
    latest settled version. ``exit_code`` is derived from the state where the 22.05 JSON
    defect reports 0 for failures (or taken from ``sacct -P -o ExitCode``).
    """

    cluster: str
    job_id: int
    run_index: int  # 0 for the first run, 1.. for requeued runs (ordered by submit/start)
    name: str
    user: str
    account: str
    partition: str
    state: str  # e.g. COMPLETED, FAILED, CANCELLED, RUNNING, PENDING, REQUEUED, TIMEOUT
    exit_code: int | None
    signal: int | None
    submit_time: float  # epoch seconds
    start_time: float | None
    end_time: float | None
    time_limit_s: float | None
    nodes: tuple[str, ...]  # expanded host names, in Slurm's order
    gpus: int  # GPUs allocated in total (0 if none or not yet allocated)
    gpus_per_node: tuple[int, ...]  # aligned with ``nodes``; an even split if only a total is known
    allocation_nodes: int
    settled: bool
    array_job_id: int | None = None
    array_task_id: int | None = None
    comment: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as sinfo/scontrol/slurmrestd describe it."""

    name: str
    state: str  # e.g. IDLE, MIXED, ALLOCATED, DOWN, DRAIN
    partitions: tuple[str, ...]
    cpus: int
    gpus_total: int
    gpus_used: int
    cpus_alloc: int = 0
    memory_mb: int = 0  # RealMemory (0: unknown)
    memory_alloc_mb: int = 0
    features: tuple[str, ...] = ()  # active features (what ``--constraint`` matches)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    state: str


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """What a job asks of Slurm's topology plugin (``cluster.slurm.topology_rules``):
    ``--switches=N@T`` (``required_switches``, ``maximum_switch_wait_time``; None: the record
    does not say, as Slurm 22.05's JSON does not), ``--segment=S`` (``segment_size``, 24.05+),
    ``--exclusive=topo`` (``shared``/``exclusive`` holding "topo") and the segment flags
    ``--spread-segments``/``--consolidate-segments`` (job ``flags``)."""

    switches: int | None = 0  # at most this many leaf switches (0: no limit)
    switch_wait_s: float = 0.0  # how long Slurm waits for them before it gives up the limit
    segment: int = 0  # nodes per segment (0: none)
    exclusive_topo: bool = False
    spread_segments: bool = False
    consolidate_segments: bool = False


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job as squeue shows it now (pending or running)."""

    job_id: int
    name: str
    user: str
    partition: str
    state: str
    reason: str
    submit_time: float
    start_time: float | None
    time_limit_s: float | None
    num_nodes: int
    gpus: int
    nodes: tuple[str, ...]
    held: bool
    req_nodes: tuple[str, ...] = ()
    admin_comment: str = ""  # set by administrators (and job_submit plugins) only
    # what else Slurm holds of the request (squeue --json / slurmrestd v0.0.38 fields)
    excluded_nodes: tuple[str, ...] = ()  # --exclude
    features: str = ""  # --constraint, as written
    exclusive: bool = False  # --exclusive (shared "none", "user" or "mcs")
    contiguous: bool = False  # --contiguous
    cpus_per_node: int = 0  # the CPUs it needs on each node (0: not known)
    mem_per_node_mb: int = 0  # the memory it needs on each node (0: not asked)
    het_job_id: int = 0  # heterogeneous job (sbatch ... : ...): its leader's id
    het_job_offset: int = 0
    array_job_id: int = 0  # job array: the array's id
    array_task_id: int | None = None  # None with ``array_tasks``: tasks not yet split
    array_tasks: str = ""  # the pending tasks one record stands for (e.g. "0-9")
    unmodelled: tuple[str, ...] = ()  # requests the loop cannot judge (licenses, ...)
    comment: str = ""  # the user's --comment (opt-in and profile tags, deployer/)
    requeue: bool = False  # --requeue (Slurm's default with JobRequeue=1)
    topology: TopologyRequest = TopologyRequest()  # --switches, --segment, --exclusive=topo
    # what it asked, as Slurm holds it (``read_request``); None for a record built by hand
    request: Request | None = None


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    """An accounting record that could not become a ``JobRun``: its job id as written (None
    when unreadable), the field at fault, why, and the record as JSON text."""

    job_id: str | None
    field: str
    reason: str
    raw: str


@dataclass(frozen=True, slots=True)
class AccountingBatch:
    """The job runs read from Slurm's accounting and the records rejected beside them."""

    runs: tuple[JobRun, ...]
    rejected: tuple[RejectedRecord, ...] = ()

    def strict(self) -> list[JobRun]:
        """The runs, or ``SlurmError`` naming the first rejected record (for callers that
        cannot go on without every record)."""
        if self.rejected:
            bad = self.rejected[0]
            raise SlurmError(f"accounting record of job {bad.job_id}: {bad.reason}")
        return list(self.runs)
