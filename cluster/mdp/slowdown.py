"""What the contention model predicts for one more job next to the running ones (the
candidates' ``job_slowdown`` and ``added_slowdown``), and link flows of a state."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from linkwise.cluster.contention import (
    AnalyticModel,
    ContentionModel,
    ring_iteration_time,
    sharing_penalty,
)
from linkwise.cluster.domain import ClusterState, Job, Placement, RunningJob, Topology


@dataclass(frozen=True, slots=True)
class Prediction:
    job_slowdown: float  # t / t_best - 1 for the job at this placement, next to the running
    added_slowdown: float  # sum over running jobs of the increase of their t / t_best


class Contention:
    """What the contention model predicts for one more job next to the running ones.

    For an ``AnalyticModel`` the prediction is incremental (only the rings sharing a link
    with the new one are recomputed, with the model's own formulas); other models are
    asked for all rates at once.
    """

    def __init__(self, state: ClusterState, model: ContentionModel) -> None:
        topo = state.topology
        self.topo = topo
        self.model = model
        self.analytic = model if isinstance(model, AnalyticModel) else None
        self.split = [r for r in state.running if r.placement.num_nodes > 1]
        self.load = [0.0] * len(topo.links)
        self.users: dict[int, list[int]] = {}
        self.links: list[tuple[int, ...]] = []
        self.weights: list[float] = []
        self.slowdown: list[float] = []  # t / t_best per split running job (>= 1)
        self._best: list[float] = []
        # per split running job (when first asked), what ``_time`` needs that a new ring
        # cannot change: its intra-node bound and each link's bandwidth share without it
        self._shares: dict[int, tuple[float, tuple[tuple[int, float], ...]]] = {}
        if self.analytic is not None:
            a = self.analytic
            for i, r in enumerate(self.split):
                links = topo.ring_links(r.placement.nodes)
                w = self._weight(r.job, r.placement)
                self.links.append(links)
                self.weights.append(w)
                for link in links:
                    self.load[link] += w
                    self.users.setdefault(link, []).append(i)
            for i, r in enumerate(self.split):
                best = a.best_time(topo, r.job)
                self._best.append(best)
                t = self._time(r.job, r.placement, self.links[i], self.weights[i], None, 0.0)
                self.slowdown.append(max(1.0, t / best))
        else:
            self._running = state.running
            self._all = [(r.job, r.placement) for r in state.running]
            base = model.rates(topo, self._all) if self._all else []
            self._base_inv = [1.0 / max(r, 1e-9) for r in base]
            self.slowdown = [
                inv
                for r, inv in zip(state.running, self._base_inv, strict=True)
                if r.placement.num_nodes > 1
            ]
            self.load = [float(f) for f in link_flows(state)]

    def _weight(self, job: Job, placement: Placement) -> float:
        assert self.analytic is not None
        if self.analytic.sharing == "flows":
            return 1.0
        return self.analytic.duty_cycle(self.topo, job, placement)

    def _time(
        self,
        job: Job,
        placement: Placement,
        links: tuple[int, ...],
        own: float,
        extra_links: frozenset[int] | None,
        extra: float,
    ) -> float:
        """Iteration time with ``extra`` load added on ``extra_links`` (AnalyticModel's rule)."""
        assert self.analytic is not None
        a = self.analytic
        topo = self.topo
        nodes = placement.nodes
        bw = min(topo.nodes[n].intra_gbps for n in nodes)
        if len(nodes) > 1:
            gbps = topo.link_gbps
            alpha = a.calibration.alpha
            load = self.load
            for link in links:
                lv = load[link] + (extra if extra_links is not None and link in extra_links else 0)
                k = 1.0 + max(0.0, lv - own)
                bw = min(bw, gbps[link] / sharing_penalty(k, alpha))
        return ring_iteration_time(
            a.profile(job), job.num_gpus, len(nodes), bw, a.calibration.overhead_s
        )

    def predict(self, job: Job, placement: Placement) -> Prediction:
        if self.analytic is None:
            return self._predict_generic(job, placement)
        best = self.analytic.best_time(self.topo, job)
        if placement.num_nodes <= 1:
            t = self._time(job, placement, (), 0.0, None, 0.0)
            return Prediction(max(0.0, t / best - 1.0), 0.0)
        links = self.topo.ring_links(placement.nodes)
        w = self._weight(job, placement)
        t = self._time(job, placement, links, 0.0, None, 0.0)
        linkset = frozenset(links)
        affected: set[int] = set()
        for link in links:
            affected.update(self.users.get(link, ()))
        added = 0.0
        for i in sorted(affected):
            t_new = self._time_with(i, linkset, w)
            added += max(1.0, t_new / self._best[i]) - self.slowdown[i]
        return Prediction(max(0.0, t / best - 1.0), max(0.0, added))

    def _time_with(self, i: int, extra_links: frozenset[int], extra: float) -> float:
        """``_time`` of split running job ``i`` with ``extra`` load on ``extra_links``, the
        same operations on the same values (its links' shares without the new ring kept
        between calls; ``min`` is exact in any order)."""
        assert self.analytic is not None
        a = self.analytic
        r = self.split[i]
        own = self.weights[i]
        gbps = self.topo.link_gbps
        alpha = a.calibration.alpha
        load = self.load
        kept = self._shares.get(i)
        if kept is None:
            intra = min(self.topo.nodes[n].intra_gbps for n in r.placement.nodes)
            shares = tuple(
                (link, gbps[link] / sharing_penalty(1.0 + max(0.0, load[link] - own), alpha))
                for link in self.links[i]
            )
            kept = self._shares[i] = (intra, shares)
        bw, shares = kept
        for link, share in shares:
            if link in extra_links:
                k = 1.0 + max(0.0, load[link] + extra - own)
                share = gbps[link] / sharing_penalty(k, alpha)
            bw = min(bw, share)
        return ring_iteration_time(
            a.profile(r.job), r.job.num_gpus, r.placement.num_nodes, bw, a.calibration.overhead_s
        )

    def running_slowdown(self, run: RunningJob) -> float:
        """The model's predicted slowdown of a running job where it runs, next to the other
        running jobs (``t / t_best - 1``, at least 0): computed from the contention model,
        never the simulator's rate."""
        job_id = run.job.job_id
        if self.analytic is None:
            return max(0.0, self._generic_slowdown.get(job_id, 1.0) - 1.0)
        if run.placement.num_nodes > 1:
            i = self._split_index.get(job_id)
            if i is not None:
                return max(0.0, self.slowdown[i] - 1.0)
        best = self.analytic.best_time(self.topo, run.job)
        t = self._time(run.job, run.placement, (), 0.0, None, 0.0)
        return max(0.0, t / best - 1.0)

    @cached_property
    def _split_index(self) -> dict[int, int]:
        return {r.job.job_id: i for i, r in enumerate(self.split)}

    @cached_property
    def _generic_slowdown(self) -> dict[int, float]:
        return {r.job.job_id: inv for r, inv in zip(self._running, self._base_inv, strict=True)}

    def _predict_generic(self, job: Job, placement: Placement) -> Prediction:
        rates = self.model.rates(self.topo, [*self._all, (job, placement)])
        inv = [1.0 / max(r, 1e-9) for r in rates]
        added = sum(n - o for n, o in zip(inv[:-1], self._base_inv, strict=True))
        return Prediction(inv[-1] - 1.0, max(0.0, added))


def link_flows(state: ClusterState) -> tuple[int, ...]:
    topo = state.topology
    if len(state.link_flows) == len(topo.links):
        return state.link_flows
    flows = [0] * len(topo.links)
    for r in state.running:
        if r.placement.num_nodes > 1:
            for link in topo.ring_links(r.placement.nodes):
                flows[link] += 1
    return tuple(flows)


def comm_intensity(model: ContentionModel, topo: Topology, job: Job) -> float:
    """Share of the job's isolated best iteration spent communicating (0 if the model has no
    profiles)."""
    if not isinstance(model, AnalyticModel):
        return 0.0
    best = model.best_time(topo, job)
    return max(0.0, 1.0 - model.profile(job).compute_s / best) if best > 0 else 0.0
