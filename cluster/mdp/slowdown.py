"""What the contention model predicts for one more job next to the running ones (the
candidates' ``job_slowdown`` and ``added_slowdown``), and link flows of a state."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

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


def split_key(state: ClusterState) -> tuple[tuple[int, str, int, Placement], ...]:
    """What an ``AnalyticModel``'s ``Contention`` of the state depends on besides the
    topology: each split running job's id, profile, GPUs and placement, in running order."""
    return tuple(
        (r.job.job_id, r.job.profile, r.job.num_gpus, r.placement)
        for r in state.running
        if len(r.placement.alloc) > 1
    )


def contention_of(state: ClusterState, model: ContentionModel) -> Contention:
    """``Contention(state, model)``; for an ``AnalyticModel`` the same object for every
    state with the same topology and split running jobs (``split_key``: the contention
    tables and every prediction are a function of them alone), remembered by the model
    (``AnalyticModel.remembered``), so that a decision point where only single-node jobs
    started or ended since the last one reuses the tables and predictions; a new set of
    split jobs keeps the last set's rings whose links carry the same loads."""
    if not isinstance(model, AnalyticModel):
        return Contention(state, model)

    def build(last: Contention | None) -> Contention:
        return Contention(state, model, last)

    return model.remembered(state.topology, "mdp.contention", split_key(state), build)


class _Static:
    """What a split ring's key alone fixes: its links, weight, ``t_best``, intra-node bound,
    and ``ring_iteration_time``'s terms (``compute_s + comm / bw + overhead``, the same
    operations in the same order)."""

    __slots__ = ("best", "comm", "compute", "intra", "links", "overhead", "weight")

    def __init__(
        self, topo: Topology, model: AnalyticModel, job: Job, placement: Placement
    ) -> None:
        prof = model.profile(job)
        gpus, nodes = job.num_gpus, len(placement.alloc)
        assert gpus > 1 and nodes > 1  # a split ring
        self.links = topo.ring_links(placement.nodes)
        self.weight = 1.0 if model.sharing == "flows" else model.duty_cycle(topo, job, placement)
        self.best = model.best_time(topo, job)
        self.intra = min(topo.nodes[n].intra_gbps for n in placement.nodes)
        self.compute = prof.compute_s
        self.comm = (prof.grad_gb / gpus) * 2.0 * (gpus - 1)  # ring_comm_time's numerator
        # on a rail fabric the mdp's rings (job 0, GPUs unknown) run over every rail, as
        # parallel rings each carrying a share (``AnalyticModel`` picks a job's own rails)
        lanes = len(topo.job_rails(0, 0))
        if lanes > 1:
            self.comm, self.intra = self.comm / lanes, self.intra / lanes
        self.overhead = model.calibration.overhead_s * nodes

    def time(self, bw: float) -> float:
        """``ring_iteration_time`` at bottleneck ``bw``."""
        return self.compute + self.comm / bw + self.overhead


class _Ring:
    """A split running job's ring under the loads on its links: its links' bandwidth shares
    without a new ring, its slowdown, and the slowdown terms new rings gave it (by the links
    they share with it and their weight): all a function of its key and ``loads``."""

    __slots__ = ("floor", "index", "loads", "shares", "slowdown", "static", "terms")

    def __init__(
        self,
        static: _Static,
        loads: tuple[float, ...],
        shares: tuple[float, ...],
        slowdown: float,
    ) -> None:
        self.static = static
        self.loads = loads
        self.shares = shares  # per link of ``static.links``
        self.slowdown = slowdown
        self.terms: dict[tuple[tuple[int, ...], float], float] = {}
        # set by the first ``Contention._term``: each link's position in ``static.links``,
        # the bottleneck without a new ring and the link holding it (-1: the intra-node bound)
        self.index: dict[int, int] | None = None
        self.floor = (0.0, -1)


class Contention:
    """What the contention model predicts for one more job next to the running ones.

    For an ``AnalyticModel`` the prediction is incremental (only the rings sharing a link
    with the new one are recomputed, with the model's own formulas: the same operations on
    the same values as ``_predict_reference``) and remembered per (profile, GPUs,
    placement), each running ring's term per (links shared, weight); other models are asked
    for all rates at once. With an ``AnalyticModel`` nothing here reads the state beyond
    ``split_key`` (``contention_of`` shares one object between states); ``last``, another
    set's ``Contention`` on the same topology and model, lends the rings whose key and loads
    are unchanged.
    """

    def __init__(
        self, state: ClusterState, model: ContentionModel, last: Contention | None = None
    ) -> None:
        topo = state.topology
        self.topo = topo
        self.model = model
        self.analytic = model if isinstance(model, AnalyticModel) else None
        self.split = [r for r in state.running if len(r.placement.alloc) > 1]
        self.load = [0.0] * len(topo.links)
        self.users: dict[int, list[int]] = {}
        self.links: list[tuple[int, ...]] = []
        self.weights: list[float] = []
        self.slowdown: list[float] = []  # t / t_best per split running job (>= 1)
        self._best: list[float] = []
        # per split running job (when first asked), what ``_time`` needs that a new ring
        # cannot change: its intra-node bound and each link's bandwidth share without it
        self._shares: dict[int, tuple[float, tuple[tuple[int, float], ...]]] = {}
        self._predictions: dict[tuple[str, int, Placement], Prediction] = {}
        self._rings: list[_Ring] = []
        self._by_key: dict[tuple[int, str, int, Placement], _Ring] = {}
        # ``job_slowdown`` of a split placement, and of one node by its intra-node bandwidth
        self._bounds: dict[tuple[str, int, Placement], float] = {}
        self._alone: dict[tuple[str, int, float], float] = {}
        # the placement tables of the states over these predictions (``placements.builder_of``)
        self.builders: dict[Any, Any] = {}
        if self.analytic is not None:
            self._build(last)
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

    def _build(self, last: Contention | None) -> None:
        """The analytic tables: link loads summed in running order, each ring's shares and
        slowdown (``_time`` with no new ring: the same values folded by ``min`` in the same
        order); a ring of ``last`` with the same key is kept where its links' loads are
        equal, its shares recomputed only on the links whose load changed."""
        a = self.analytic
        assert a is not None
        topo = self.topo
        same = last is not None and last.topo is topo and last.analytic is a
        self._static: dict[tuple[str, int, Placement], _Static] = (
            last._static if last is not None and same else {}
        )
        kept = last._by_key if last is not None and same else {}
        static = self._static
        load = self.load
        users = self.users
        statics: list[_Static] = []
        keys: list[tuple[int, str, int, Placement]] = []
        for i, r in enumerate(self.split):
            job, placement = r.job, r.placement
            skey = (job.profile, job.num_gpus, placement)
            st = static.get(skey)
            if st is None:
                st = static[skey] = _Static(topo, a, job, placement)
            statics.append(st)
            keys.append((job.job_id, *skey))
            w = st.weight
            self.links.append(st.links)
            self.weights.append(w)
            self._best.append(st.best)
            for link in st.links:
                load[link] += w
                users.setdefault(link, []).append(i)
        gbps = topo.link_gbps
        alpha = a.calibration.alpha
        for key, st in zip(keys, statics, strict=True):
            loads = tuple([load[link] for link in st.links])
            ring = kept.get(key)
            if ring is None or ring.loads != loads:
                own = st.weight
                old = ring.loads if ring is not None else ()
                shares: list[float] = []
                for c, (link, lv) in enumerate(zip(st.links, loads, strict=True)):
                    if ring is not None and old[c] == lv:
                        shares.append(ring.shares[c])
                    else:
                        k = 1.0 + max(0.0, lv - own)
                        shares.append(gbps[link] / (k + alpha * (k - 1) if k > 1 else 1.0))
                bw = st.intra
                for share in shares:
                    bw = min(bw, share)
                ring = _Ring(st, loads, tuple(shares), max(1.0, st.time(bw) / st.best))
            self._rings.append(ring)
            self._by_key[key] = ring
            self.slowdown.append(ring.slowdown)

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
        """The job's predicted slowdown at ``placement`` and what it adds to the running."""
        if self.analytic is None:
            return self._predict_generic(job, placement)
        key = (job.profile, job.num_gpus, placement)
        hit = self._predictions.get(key)
        if hit is None:
            hit = self._predictions[key] = self._predict_analytic(job, placement)
        return hit

    def job_slowdown(self, job: Job, placement: Placement) -> float:
        """``predict(job, placement).job_slowdown`` without the running rings' terms (an
        ``AnalyticModel`` only): the same value."""
        assert self.analytic is not None
        key = (job.profile, job.num_gpus, placement)
        hit = self._predictions.get(key)
        if hit is not None:
            return hit.job_slowdown
        if len(placement.alloc) <= 1:  # a function of the node's intra-node bandwidth alone
            alone = (job.profile, job.num_gpus, self.topo.nodes[placement.alloc[0][0]].intra_gbps)
            bound = self._alone.get(alone)
            if bound is None:
                t = self._time(job, placement, (), 0.0, None, 0.0)
                bound = self._alone[alone] = max(
                    0.0, t / self.analytic.best_time(self.topo, job) - 1.0
                )
            return bound
        bound = self._bounds.get(key)
        if bound is None:
            links = self.topo.ring_links(placement.nodes)
            t = self._time(job, placement, links, 0.0, None, 0.0)
            bound = self._bounds[key] = max(0.0, t / self.analytic.best_time(self.topo, job) - 1.0)
        return bound

    def _predict_analytic(self, job: Job, placement: Placement) -> Prediction:
        """``_predict_reference``'s values: the rings sharing a link with the new one found
        from the links' users, each ring's term remembered by the links it shares."""
        assert self.analytic is not None
        best = self.analytic.best_time(self.topo, job)
        if len(placement.alloc) <= 1:
            t = self._time(job, placement, (), 0.0, None, 0.0)
            return Prediction(max(0.0, t / best - 1.0), 0.0)
        links = self.topo.ring_links(placement.nodes)
        w = self._weight(job, placement)
        t = self._time(job, placement, links, 0.0, None, 0.0)
        shared: dict[int, list[int]] = {}
        users = self.users
        for link in links:
            for i in users.get(link, ()):
                on = shared.get(i)
                if on is None:
                    shared[i] = [link]
                else:
                    on.append(link)
        added = 0.0
        rings = self._rings
        for i in sorted(shared):
            ring = rings[i]
            key = (tuple(shared[i]), w)
            term = ring.terms.get(key)
            if term is None:
                term = ring.terms[key] = self._term(ring, key[0], w)
            added += term
        return Prediction(max(0.0, t / best - 1.0), max(0.0, added))

    def _term(self, ring: _Ring, on: tuple[int, ...], extra: float) -> float:
        """What a new ring of weight ``extra`` on links ``on`` adds to a split running job's
        ``t / t_best``: ``_time_with``'s operations on the same values."""
        assert self.analytic is not None
        alpha = self.analytic.calibration.alpha
        st = ring.static
        own = st.weight
        gbps = self.topo.link_gbps
        index = ring.index
        if index is None:
            index = ring.index = {link: c for c, link in enumerate(st.links)}
            bw, at = st.intra, -1
            for link, share in zip(st.links, ring.shares, strict=True):
                if share < bw:
                    bw, at = share, link
            ring.floor = (bw, at)
        bw, at = ring.floor
        if at in on:  # the bottleneck link is shared: the least of the others (min is exact)
            bw = st.intra
            for link, share in zip(st.links, ring.shares, strict=True):
                if share < bw and link not in on:
                    bw = share
        loads = ring.loads
        for link in on:
            k = 1.0 + max(0.0, loads[index[link]] + extra - own)
            bw = min(bw, gbps[link] / (k + alpha * (k - 1) if k > 1 else 1.0))
        return max(1.0, st.time(bw) / st.best) - ring.slowdown

    def _predict_reference(self, job: Job, placement: Placement) -> Prediction:
        """The model's rule as first written (every affected ring's time by ``_time``): the
        reference the remembered path is tested against."""
        assert self.analytic is not None
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
            r = self.split[i]
            t_new = self._time(r.job, r.placement, self.links[i], self.weights[i], linkset, w)
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
