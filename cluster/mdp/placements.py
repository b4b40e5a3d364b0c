"""Candidate placements of one state: the generators (``MdpConfig.generators``) with
per-state memo tables shared by all slots, and the contention model's predictions."""

from __future__ import annotations

from collections.abc import Sequence

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Job, Placement
from linkwise.cluster.mdp.slowdown import Contention, Prediction, contention_of
from linkwise.cluster.placement.generators import (
    best_fit,
    bounded_placement,
    first_fit,
    fragment_first_fit,
    least_busy,
    same_leaf,
)

# the generators least_contention chooses among (with a best fit inside each leaf)
_BASE_POOL = ("best_fit", "same_leaf", "least_busy", "first_fit", "fragment_first_fit")
# the Builders one Contention keeps (``builder_of``), the newest last
BUILDERS_KEPT = 32


def builder_of(state: ClusterState, model: ContentionModel, span_lambda: float = 1.0) -> Builder:
    """``Builder(state, model, span_lambda)``, the same object for every state with the same
    contention predictions (``contention_of``: for an ``AnalyticModel`` one object per
    topology and split running jobs), free GPUs and jobs per node (what a Builder reads):
    kept by that ``Contention`` (the newest ``BUILDERS_KEPT``), so that a decision point
    after an arrival, or after a wait, reuses the placements and predictions of the last one
    with the same free GPUs."""
    contention = contention_of(state, model)
    key = (state.free_gpus, state.jobs_per_node, span_lambda)
    kept = contention.builders
    b: Builder | None = kept.pop(key, None)
    if b is None:
        b = Builder(state, model, span_lambda, contention)
        if len(kept) >= BUILDERS_KEPT:
            del kept[next(iter(kept))]
    kept[key] = b  # the newest last
    return b


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


class Builder:
    """Per-state memo tables shared by all slots (placements by GPU count, predictions by
    job shape and placement): a function of the topology, the free GPUs, the jobs per node,
    ``span_lambda`` and the contention predictions (``contention``, by default
    ``contention_of(state, model)``) alone."""

    def __init__(
        self,
        state: ClusterState,
        model: ContentionModel,
        span_lambda: float = 1.0,
        contention: Contention | None = None,
    ) -> None:
        self.span_lambda = span_lambda
        self.topo = state.topology
        self.free = state.free_gpus
        self.busy = state.jobs_per_node
        self.contention = contention if contention is not None else contention_of(state, model)
        self._placements: dict[tuple[str, int], Placement | None] = {}
        self._predictions: dict[tuple[str, int, Placement], Prediction] = {}
        self._least: dict[tuple[str, int], Placement | None] = {}
        self._pools: dict[int, tuple[Placement, ...]] = {}
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
        best = self._least_of(job, self.pool(job.num_gpus))
        self._least[key] = best
        return best

    def pool(self, gpus: int) -> tuple[Placement, ...]:
        """The placements ``least_contention`` chooses among for a job of ``gpus`` GPUs (the
        same for every profile, kept): the base pool's, then where no single node holds it
        the best fit inside every leaf, each once, in that order."""
        hit = self._pools.get(gpus)
        if hit is not None:
            return hit
        pool: list[Placement] = []
        seen: set[Placement] = set()
        for gen in _BASE_POOL:
            p = self.base(gen, gpus)
            if p is not None and p not in seen:
                pool.append(p)
                seen.add(p)
        if pool and pool[0].num_nodes > 1:  # no single node holds it: try every leaf too
            for members in self.topo.leaf_nodes:
                p = _leaf_best_fit(members, self.free, gpus)
                if p is not None and p not in seen:
                    pool.append(p)
                    seen.add(p)
        hit = self._pools[gpus] = tuple(pool)
        return hit

    def _least_of(self, job: Job, pool: Sequence[Placement]) -> Placement | None:
        """The first placement of ``pool`` with the least (job slowdown + added slowdown,
        nodes). With an ``AnalyticModel`` the placements are tried by a lower bound of that
        key (the job's own slowdown: the added one is at least 0) and a placement whose bound
        is no better than the best key so far is never predicted in full: the same choice."""
        c = self.contention
        if c.analytic is None:
            best: Placement | None = None
            best_key = (0.0, 0)
            for p in pool:
                pred = self.predict(job, p)
                k = (pred.job_slowdown + pred.added_slowdown, p.num_nodes)
                if best is None or k < best_key:
                    best, best_key = p, k
            return best
        bounds = sorted((c.job_slowdown(job, p), p.num_nodes, i) for i, p in enumerate(pool))
        chosen: tuple[float, int, int] | None = None
        for bound in bounds:
            if chosen is not None and bound >= chosen:
                break  # every later bound is no better either: none of them can be chosen
            q = pool[bound[2]]
            got = self.predict(job, q)
            full = (got.job_slowdown + got.added_slowdown, q.num_nodes, bound[2])
            if chosen is None or full < chosen:
                chosen = full
        return None if chosen is None else pool[chosen[2]]

    def placement(self, gen: str, job: Job) -> Placement | None:
        if gen == "least_contention":
            return self.least_contention(job)
        return self.base(gen, job.num_gpus)
