"""The pending slots: which ``K`` pending jobs get rows (``MdpConfig.slot_order``), and each
slot's rank in each of ``ORDERS``."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from linkwise.cluster.domain import ClusterState, PendingJob
from linkwise.cluster.mdp.config import MdpConfig

T = TypeVar("T")


def _job_id(item: Any) -> int:
    return int(item.job.job_id)


def _by_gpus(p: PendingJob) -> int:
    return p.job.num_gpus


def _by_gpu_time(p: PendingJob) -> float:
    return p.job.pred_s * p.job.num_gpus  # a prediction, never the true run time


def _by_attained(p: PendingJob) -> float:
    return p.attained_gpu_s


def order_heads(state: ClusterState, k: int) -> tuple[list[PendingJob], ...]:
    """The first ``k`` jobs fitting the free GPUs now in each of ``ORDERS`` (stable: submit
    order among equals, ``state.pending`` being in submit order)."""
    free = state.total_free_gpus
    fit = [p for p in state.pending if p.job.num_gpus <= free]
    return (
        fit[:k],
        heapq.nsmallest(k, fit, key=_by_gpus),
        heapq.nsmallest(k, fit, key=_by_gpu_time),
        heapq.nsmallest(k, fit, key=_by_attained),
    )


def round_robin(
    heads: Sequence[Sequence[T]], k: int, key: Callable[[T], int] = _job_id
) -> tuple[T, ...]:
    """Up to ``k`` items taken from ``heads`` in turn, each its next item not yet taken
    (items are the same when ``key``, the job id, is)."""
    out: list[T] = []
    taken: set[int] = set()
    pos = [0] * len(heads)
    progressed = True
    while progressed and len(out) < k:
        progressed = False
        for i, head in enumerate(heads):
            while pos[i] < len(head) and key(head[pos[i]]) in taken:
                pos[i] += 1
            if pos[i] < len(head) and len(out) < k:
                p = head[pos[i]]
                out.append(p)
                taken.add(key(p))
                pos[i] += 1
                progressed = True
    return tuple(out)


def pending_slots(
    state: ClusterState, cfg: MdpConfig, heads: Sequence[Sequence[PendingJob]]
) -> tuple[PendingJob, ...]:
    if cfg.slot_order == "head":
        return state.pending[: cfg.k_slots]
    if cfg.slot_order == "fitting":
        return tuple(heads[0])
    if cfg.slot_order == "smallest":
        return tuple(heads[1])
    return round_robin(heads, cfg.k_slots)


def slot_ranks(
    slots: Sequence[PendingJob], heads: Sequence[Sequence[PendingJob]], k: int
) -> tuple[tuple[float, ...], ...]:
    """Each slot's rank in each order over the fitting jobs, over ``k``; 1 beyond the head."""
    where = [{p.job.job_id: i / k for i, p in enumerate(head)} for head in heads]
    return tuple(tuple(w.get(p.job.job_id, 1.0) for w in where) for p in slots)
