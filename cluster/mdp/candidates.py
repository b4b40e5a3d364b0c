"""Slots and candidate placements of one state, the action mask, and decoding an action into
a ``Decision``."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import WAIT, ClusterState, Decision, Job, PendingJob, Placement, Start
from linkwise.cluster.heuristics._common import bounded_placement
from linkwise.cluster.mdp.config import BoolArray, InvalidAction, MdpConfig
from linkwise.cluster.mdp.slowdown import Contention, Prediction, comm_intensity
from linkwise.cluster.placement import (
    best_fit,
    first_fit,
    fragment_first_fit,
    least_busy,
    same_leaf,
)

# the generators least_contention chooses among (with a best fit inside each leaf)
_BASE_POOL = ("best_fit", "same_leaf", "least_busy", "first_fit", "fragment_first_fit")


def _leaf_best_fit(members: Sequence[int], free: Sequence[int], gpus: int) -> Placement | None:
    """Best fit inside one leaf: the tightest node that holds the job, else the fewest nodes
    (most free first, the tail on the tightest node that holds it)."""
    if sum(free[i] for i in members) < gpus:
        return None
    best, best_free = -1, 0
    for i in members:
        f = free[i]
        if f >= gpus and (best < 0 or f < best_free):
            best, best_free = i, f
    if best >= 0:
        return Placement(((best, gpus),))
    order = sorted((i for i in members if free[i] > 0), key=lambda i: (-free[i], i))
    need = gpus
    pairs: list[tuple[int, int]] = []
    for pos, node in enumerate(order):
        if free[node] < need:
            pairs.append((node, free[node]))
            need -= free[node]
            continue
        tail = node
        for other in order[pos + 1 :]:
            if free[other] < need:
                break
            tail = other
        pairs.append((tail, need))
        break
    return Placement(tuple(sorted(pairs)))


class _Builder:
    """Per-state memo tables shared by all slots (placements by GPU count, predictions by
    job shape and placement)."""

    def __init__(
        self, state: ClusterState, model: ContentionModel, span_lambda: float = 1.0
    ) -> None:
        self.state = state
        self.span_lambda = span_lambda
        self.topo = state.topology
        self.free = state.free_gpus
        self.busy = state.jobs_per_node
        self.contention = Contention(state, model)
        self._placements: dict[tuple[str, int], Placement | None] = {}
        self._predictions: dict[tuple[str, int, Placement], Prediction] = {}
        self._least: dict[tuple[str, int], Placement | None] = {}
        self._capacities: list[int] | None = None

    def base(self, gen: str, gpus: int) -> Placement | None:
        key = (gen, gpus)
        if key in self._placements:
            return self._placements[key]
        topo, free, busy = self.topo, self.free, self.busy
        p: Placement | None
        if gen == "best_fit":
            p = best_fit(topo, free, gpus)
        elif gen == "same_leaf":
            p = same_leaf(topo, free, gpus)
        elif gen == "least_busy":
            p = least_busy(topo, free, gpus, busy)
        elif gen == "first_fit":
            p = first_fit(topo, free, gpus)
        elif gen == "fragment_first_fit":
            p = fragment_first_fit(topo, free, gpus, busy)
        elif gen == "bounded":
            if self._capacities is None:
                self._capacities = sorted((n.gpus for n in topo.nodes), reverse=True)
            lam = self.span_lambda
            p = bounded_placement(topo, free, busy, gpus, None, lam, self._capacities)
        else:  # pragma: no cover - guarded by MdpConfig
            raise ValueError(f"unknown generator {gen!r}")
        self._placements[key] = p
        return p

    def predict(self, job: Job, placement: Placement) -> Prediction:
        key = (job.profile, job.num_gpus, placement)
        hit = self._predictions.get(key)
        if hit is None:
            hit = self._predictions[key] = self.contention.predict(job, placement)
        return hit

    def least_contention(self, job: Job) -> Placement | None:
        key = (job.profile, job.num_gpus)
        if key in self._least:
            return self._least[key]
        gpus = job.num_gpus
        pool: list[Placement] = []
        for gen in _BASE_POOL:
            p = self.base(gen, gpus)
            if p is not None and p not in pool:
                pool.append(p)
        if pool and pool[0].num_nodes > 1:  # no single node holds it: try every leaf too
            for members in self.topo.leaf_nodes:
                p = _leaf_best_fit(members, self.free, gpus)
                if p is not None and p not in pool:
                    pool.append(p)
        best: Placement | None = None
        best_key = (0.0, 0)
        for p in pool:
            pred = self.predict(job, p)
            k = (pred.job_slowdown + pred.added_slowdown, p.num_nodes)
            if best is None or k < best_key:
                best, best_key = p, k
        self._least[key] = best
        return best

    def placement(self, gen: str, job: Job) -> Placement | None:
        if gen == "least_contention":
            return self.least_contention(job)
        return self.base(gen, job.num_gpus)


@dataclass(frozen=True, eq=False)
class Candidates:
    """Everything one state's mask, observation and decoding need, computed once."""

    state: ClusterState
    config: MdpConfig
    slots: tuple[PendingJob, ...]
    placements: tuple[tuple[Placement | None, ...], ...]  # one row per slot (<= K)
    redundant: tuple[tuple[bool, ...], ...]  # equal to an earlier candidate of the same slot
    predictions: tuple[tuple[Prediction | None, ...], ...]
    mask: BoolArray
    contention: Contention = field(repr=False)
    intensity: tuple[float, ...] = ()
    ranks: tuple[tuple[float, ...], ...] = ()  # per slot, its scaled rank in each of ORDERS

    def start_for(self, action: int) -> Start:
        """The start an unmasked non-wait action stands for."""
        p = self.config.n_candidates
        placement = self.placements[action // p][action % p]
        assert placement is not None
        return Start(self.slots[action // p].job.job_id, placement)


def _by_gpus(p: PendingJob) -> int:
    return p.job.num_gpus


def _by_gpu_time(p: PendingJob) -> float:
    return p.job.pred_s * p.job.num_gpus  # a prediction, never the true run time


def _by_attained(p: PendingJob) -> float:
    return p.attained_gpu_s


def _order_heads(state: ClusterState, k: int) -> tuple[list[PendingJob], ...]:
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


def _round_robin(heads: Sequence[Sequence[PendingJob]], k: int) -> tuple[PendingJob, ...]:
    """Up to ``k`` jobs taken from ``heads`` in turn, each its next job not yet taken."""
    out: list[PendingJob] = []
    taken: set[int] = set()
    pos = [0] * len(heads)
    progressed = True
    while progressed and len(out) < k:
        progressed = False
        for i, head in enumerate(heads):
            while pos[i] < len(head) and head[pos[i]].job.job_id in taken:
                pos[i] += 1
            if pos[i] < len(head) and len(out) < k:
                p = head[pos[i]]
                out.append(p)
                taken.add(p.job.job_id)
                pos[i] += 1
                progressed = True
    return tuple(out)


def _slots(
    state: ClusterState, cfg: MdpConfig, heads: Sequence[Sequence[PendingJob]]
) -> tuple[PendingJob, ...]:
    if cfg.slot_order == "head":
        return state.pending[: cfg.k_slots]
    if cfg.slot_order == "fitting":
        return tuple(heads[0])
    if cfg.slot_order == "smallest":
        return tuple(heads[1])
    return _round_robin(heads, cfg.k_slots)


def _ranks(
    slots: Sequence[PendingJob], heads: Sequence[Sequence[PendingJob]], k: int
) -> tuple[tuple[float, ...], ...]:
    """Each slot's rank in each order over the fitting jobs, over ``k``; 1 beyond the head."""
    where = [{p.job.job_id: i / k for i, p in enumerate(head)} for head in heads]
    return tuple(tuple(w.get(p.job.job_id, 1.0) for w in where) for p in slots)


def candidates(state: ClusterState, config: MdpConfig, model: ContentionModel) -> Candidates:
    """Slots, candidate placements, contention predictions and the mask of one state."""
    b = _Builder(state, model, config.span_lambda)
    heads = _order_heads(state, config.k_slots)
    slots = _slots(state, config, heads)
    n_c = config.n_candidates
    mask = np.zeros(config.n_actions, dtype=np.bool_)
    mask[-1] = True
    total_free = state.total_free_gpus
    rows: list[tuple[Placement | None, ...]] = []
    reds: list[tuple[bool, ...]] = []
    preds: list[tuple[Prediction | None, ...]] = []
    for k, pj in enumerate(slots):
        job = pj.job
        if job.num_gpus > total_free:
            rows.append((None,) * n_c)
            reds.append((False,) * n_c)
            preds.append((None,) * n_c)
            continue
        row = tuple(b.placement(g, job) for g in config.generators)
        red = tuple(p is not None and p in row[:c] for c, p in enumerate(row))
        rows.append(row)
        reds.append(red)
        preds.append(tuple(None if p is None else b.predict(job, p) for p in row))
        for c, p in enumerate(row):
            if p is not None and not (config.mask_duplicates and red[c]):
                mask[k * n_c + c] = True
    intensity = tuple(comm_intensity(model, state.topology, pj.job) for pj in slots)
    return Candidates(
        state=state,
        config=config,
        slots=slots,
        placements=tuple(rows),
        redundant=tuple(reds),
        predictions=tuple(preds),
        mask=mask,
        contention=b.contention,
        intensity=intensity,
        ranks=_ranks(slots, heads, config.k_slots),
    )


def action_mask(cands: Candidates) -> BoolArray:
    """Which actions are allowed (a copy): True for feasible starts and for wait."""
    return cands.mask.copy()


def decode(cands: Candidates, action: int) -> Decision:
    """The Decision an action stands for (one Start, or WAIT); InvalidAction if masked."""
    a = int(action)
    if not 0 <= a < cands.config.n_actions:
        raise InvalidAction(f"action {a} out of range 0..{cands.config.n_actions - 1}")
    if not cands.mask[a]:
        raise InvalidAction(f"action {a} is masked at t={cands.state.time:.1f}")
    if a == cands.config.wait_action:
        return WAIT
    return Decision(starts=(cands.start_for(a),))
