"""The controller's queue (``squeue --json`` / ``/slurm/VERSION/jobs``) -> ``QueuedJob``
records, with what each job's request holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.document import (
    UNREADABLE,
    epoch_or_none,
    int_or_zero,
    limit_seconds,
    raise_errors,
    record_list,
    unreadable_record,
)
from linkwise.cluster.slurm.gpu_counts import tres_str_gpus
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.cluster.slurm.request import read_request
from linkwise.cluster.slurm.schema import count, generation, job_state_text, number, text_list
from linkwise.cluster.slurm.topology_rules import topology_request

# queue states of jobs that are no longer pending or running
FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def parse_queue(doc: Mapping[str, Any]) -> list[QueuedJob]:
    """Pending and running jobs of a ``squeue --json`` / ``/slurm/VERSION/jobs`` document of
    any supported generation. A job record that cannot be read raises ``SlurmSchemaError``
    naming the job and the fault (the live loop treats it as a Slurm-side fault)."""
    raise_errors(doc, "queue")
    generation(doc, "queue")
    out: list[QueuedJob] = []
    for job in record_list(doc, "jobs"):
        try:
            queued = _queued_job(job)
        except UNREADABLE as exc:
            raise unreadable_record("queue: job", job, "job_id", exc) from exc
        if queued is not None:
            out.append(queued)
    return out


def _queued_job(job: Mapping[str, Any]) -> QueuedJob | None:
    """One queue record as a ``QueuedJob`` (``None`` for a job that has finished)."""
    state = job_state_text(job.get("job_state"))
    if state in FINISHED_STATES:
        return None
    reason = str(job.get("state_reason") or "")
    alloc = str(job.get("tres_alloc_str") or "")
    node_expr = str(job.get("nodes") or "")
    req = str(job.get("required_nodes") or "")
    held = job.get("hold") is True or number(job.get("priority")) == 0
    return QueuedJob(
        job_id=count(job["job_id"]),
        name=str(job.get("name") or ""),
        user=str(job.get("user_name") or ""),
        partition=str(job.get("partition") or ""),
        state=state,
        reason=reason,
        submit_time=float(int_or_zero(job.get("submit_time"))),
        start_time=epoch_or_none(job.get("start_time")),
        time_limit_s=limit_seconds(job.get("time_limit")),
        num_nodes=int_or_zero(job.get("node_count")),
        gpus=tres_str_gpus(alloc or str(job.get("tres_req_str") or "")),
        nodes=tuple(expand(node_expr)) if node_expr else (),
        held=state == "PENDING" and (held or reason.startswith("JobHeld")),
        req_nodes=tuple(expand(req)) if req else (),
        admin_comment=str(job.get("admin_comment") or ""),
        comment=str(job.get("comment") or ""),
        requeue=bool(job.get("requeue")),
        **_request_fields(job),
    )


# job fields whose requests the live loop does not model: a job with any of them set is
# left to Slurm (``QueuedJob.unmodelled``)
_UNMODELLED_FIELDS = (
    "licenses",
    "resv_name",
    "dependency",
    "tres_per_socket",
    "cpus_per_tres",
    "memory_per_tres",
    "cluster_features",
    "batch_features",
)


def _request_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """What else a queue record holds of the job's request (``QueuedJob``'s constraint
    fields): excluded nodes, features, exclusive, contiguous, CPUs and memory per node,
    heterogeneous and array membership, and the requests the loop cannot judge."""
    request = read_request(job)
    nodes = request.nodes or request.min_nodes
    cpus_total = int_or_zero(job.get("cpus"))
    cpus = max(int_or_zero(job.get("minimum_cpus_per_node")), -(-cpus_total // nodes))
    mem = int_or_zero(job.get("memory_per_node"))
    if not mem and int_or_zero(job.get("memory_per_cpu")):
        mem = int_or_zero(job.get("memory_per_cpu")) * max(1, cpus)
    excluded = str(job.get("excluded_nodes") or "")
    unmodelled = [f"{key}={str(job.get(key))[:60]}" for key in _UNMODELLED_FIELDS if job.get(key)]
    # TRES per node, job and task other than GPUs and a task's CPUs (24.11+ write ``-c 4``
    # as ``tres_per_task: cpu=4``): not modelled
    for key in ("tres_per_node", "tres_per_job", "tres_per_task"):
        text = str(job.get(key) or "")
        if any(not _modelled_tres(t) for t in text.split(",") if t):
            unmodelled.append(f"{key}={text[:60]}")
    if int_or_zero(job.get("minimum_tmp_disk_per_node")):
        unmodelled.append("tmp disk")
    task = number(job.get("array_task_id"))
    shared = text_list(job.get("shared")).lower()
    return dict(
        excluded_nodes=tuple(expand(excluded)) if excluded else (),
        features=str(job.get("features") or ""),
        exclusive=_exclusive(shared, job.get("exclusive")),
        contiguous=bool(job.get("contiguous")),
        cpus_per_node=cpus,
        mem_per_node_mb=mem,
        het_job_id=int_or_zero(job.get("het_job_id")),
        het_job_offset=int_or_zero(job.get("het_job_offset")),
        array_job_id=int_or_zero(job.get("array_job_id")),
        array_task_id=None if task is None else int(task),
        array_tasks=str(job.get("array_task_string") or ""),
        unmodelled=tuple(unmodelled),
        topology=topology_request(job),
        request=request,
    )


def _exclusive(shared: str, exclusive: Any) -> bool:
    """``--exclusive`` (whole nodes): ``shared`` is ``none``/``user``/``mcs`` (22.05 text,
    later a list), or a later ``exclusive`` list names ``true``/``user``/``mcs`` or is
    ``true``; ``exclusive: ["topo"]`` (``--exclusive=topo``) is a topology request, not this."""
    words = set(shared.split(","))
    if isinstance(exclusive, bool):
        return exclusive or bool(words & {"none", "user", "mcs"})
    words |= set(text_list(exclusive).lower().split(","))
    return bool(words & {"none", "user", "mcs", "true"})


def _modelled_tres(item: str) -> bool:
    """A TRES request item the loop models: GPUs (22.05 ``gres:gpu:2``, later
    ``gres/gpu:2``, typed or not) or CPUs (``cpu=4`` / ``cpu:4``)."""
    return item.startswith(("gres:gpu", "gres/gpu", "cpu=", "cpu:"))
