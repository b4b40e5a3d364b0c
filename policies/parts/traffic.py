"""What a placement may know of the fabric's traffic at a decision, and the node sets it
weighs (the placements ``least_loaded``, ``apart`` and ``wait_or_spread``).

A running ring's *demand* is its profile's gradient volume per second of compute (GB/s:
the calibration's ``grad_gb / compute_s``; a job whose profile the calibration does not
know gets the mix's weighted mean): what is known of a job before it runs, never its
measured rate nor its true run time (``docs/INFORMATION.md``). A profile whose demand is at
least a threshold is *communication-heavy*. A ring loads the links ``Topology.ring_links``
gives for its nodes and its job's id: its NICs, and its leaf uplinks, under ECMP the
parallel uplinks its hops hash onto (``ecmp_plane``, deterministic, so a policy can know
them as Crux's path selection does). ``LinkLoad`` is kept per decision: built from the
running multi-node jobs, then each start of the decision is added to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Placement, Shape, Topology
from linkwise.cluster.placement.generators import best_fit
from linkwise.cluster.placement.slurm_select import slurm_select
from linkwise.cluster.profiles import Calibration

HEAVY_GBPS = 5.0  # GB of gradients per second of compute: FSDP, MoE, Transformer-XL shipped


def profile_demands(cal: Calibration) -> dict[str, float]:
    """Each profile's demand (GB/s, module docstring); ``""`` the mix's weighted mean."""
    out = {name: p.grad_gb / p.compute_s for name, p in cal.profiles.items() if p.compute_s > 0}
    weights = {n: w for n, w in cal.mix.items() if w > 0 and n in out}
    total = sum(weights.values())
    if total > 0:
        out[""] = sum(out[n] * w for n, w in weights.items()) / total
    else:
        out[""] = sum(out.values()) / len(out) if out else 0.0
    return out


def demand_of(demands: Mapping[str, float], profile: str) -> float:
    """A profile's demand; an unknown one gets the mix's mean."""
    return demands.get(profile, demands.get("", 0.0))


@dataclass(slots=True)
class LinkLoad:
    """Per link: the summed demand of the rings crossing it and how many of them are heavy."""

    topo: Topology
    load: list[float]
    heavy: list[int]

    def add(self, placement: Placement, job_id: int, demand: float, heavy: bool) -> None:
        """Count one more ring (a one-node job crosses no link)."""
        if placement.num_nodes <= 1:
            return
        for link in self.topo.ring_links(placement.nodes, job_id):
            self.load[link] += demand
            if heavy:
                self.heavy[link] += 1

    def score(self, placement: Placement, job_id: int) -> tuple[float, float, int]:
        """What its ring would meet: the most loaded uplink it crosses (NICs excluded), the
        load summed over every link it crosses, the heavy rings on them (one per link
        shared)."""
        links = self.topo.ring_links(placement.nodes, job_id)
        nics = len(self.topo.nodes)
        up = max((self.load[link] for link in links if link >= nics), default=0.0)
        return up, sum(self.load[link] for link in links), sum(self.heavy[link] for link in links)


def traffic_of(
    state: ClusterState, demands: Mapping[str, float], heavy_gbps: float = HEAVY_GBPS
) -> LinkLoad:
    """The running multi-node jobs' rings on the state's fabric."""
    topo = state.topology
    n = len(topo.links)
    out = LinkLoad(topo, [0.0] * n, [0] * n)
    for r in state.running:
        if r.placement.num_nodes > 1:
            d = demand_of(demands, r.job.profile)
            out.add(r.placement, r.job.job_id, d, d >= heavy_gbps)
    return out


def leaves_of(topo: Topology, placement: Placement) -> int:
    """How many leaf switches a placement spans."""
    return len({topo.nodes[i].leaf for i in placement.nodes})


def _within(free: Sequence[int], members: Sequence[int]) -> list[int]:
    """``free`` with every node outside ``members`` at zero."""
    out = [0] * len(free)
    for i in members:
        out[i] = free[i]
    return out


def _add(out: list[Placement], seen: set[tuple[tuple[int, int], ...]], p: Placement | None) -> None:
    if p is not None and p.alloc not in seen:
        seen.add(p.alloc)
        out.append(p)


def flexible_candidates(
    topo: Topology, free: Sequence[int], gpus: int, load: LinkLoad
) -> list[Placement]:
    """The node sets weighed for a job of ``gpus`` in any split: best fit over the cluster
    (first, so it wins every tie), best fit inside each leaf, and best fit over the fewest
    leaves taken least loaded first (their uplinks' summed load, then most free GPUs).
    Best fit alone where it finds one node (the tightest that holds the job)."""
    out: list[Placement] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    _add(out, seen, best_fit(topo, free, gpus))
    if not out or out[0].num_nodes == 1:
        return out  # one node crosses no link: nothing to weigh against best fit's
    leaf_free = [sum(free[i] for i in members) for members in topo.leaf_nodes]
    for leaf, members in enumerate(topo.leaf_nodes):
        if leaf_free[leaf] >= gpus:
            _add(out, seen, best_fit(topo, _within(free, members), gpus))
    if all(f < gpus for f in leaf_free):
        _add(out, seen, _over_leaves(topo, free, gpus, load, leaf_free))
    return out


def _over_leaves(
    topo: Topology, free: Sequence[int], gpus: int, load: LinkLoad, leaf_free: Sequence[int]
) -> Placement | None:
    """Best fit over leaves taken in order of their uplinks' load, then most free GPUs."""
    nics, leaves = len(topo.nodes), len(topo.leaf_names)
    ports = len(topo.links) - nics - leaves - len(topo.agg_names)
    per = ports // leaves if leaves else 0  # ECMP: each leaf's up and down ports

    def uplink_load(leaf: int) -> float:
        if per:
            base = len(topo.links) - ports + leaf * per
            return sum(load.load[base : base + per])
        return load.load[nics + leaf]

    order = sorted(range(leaves), key=lambda leaf: (uplink_load(leaf), -leaf_free[leaf], leaf))
    members: list[int] = []
    have = 0
    for leaf in order:
        if not leaf_free[leaf]:
            continue
        members.extend(topo.leaf_nodes[leaf])
        have += leaf_free[leaf]
        if have >= gpus:
            return best_fit(topo, _within(free, members), gpus)
    return None


def fixed_candidates(topo: Topology, free: Sequence[int], shape: Shape) -> list[Placement]:
    """The node sets weighed for a fixed shape: Slurm's select over the cluster (first),
    and inside each leaf that holds it."""
    out: list[Placement] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    _add(out, seen, slurm_select(topo, free, shape))
    if out and shape.nodes > 1:
        for members in topo.leaf_nodes:
            if sum(free[i] >= shape.gpus_per_node for i in members) >= shape.nodes:
                _add(out, seen, slurm_select(topo, _within(free, members), shape))
    return out


def fewest_leaves(topo: Topology, gpus: int) -> int:
    """The fewest leaf switches whose nodes could hold ``gpus`` on an empty cluster."""
    sizes = sorted((sum(topo.nodes[i].gpus for i in m) for m in topo.leaf_nodes), reverse=True)
    have, k = 0, 0
    for size in sizes:
        if have >= gpus:
            break
        have += size
        k += 1
    return max(k, 1) if have >= gpus else len(sizes)


def span_bound(n_min: int, lam: float) -> float:
    """At most ``ceil(lam * n_min)`` nodes (no bound for an infinite ``lam``)."""
    return math.inf if math.isinf(lam) else math.ceil(lam * n_min)
