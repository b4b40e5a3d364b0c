"""The scheduling domain: jobs, nodes, links, topology, placements, cluster state, decisions.

Everything here is a frozen, typed value. Nodes, leaf switches and aggregation
switches are referred to by their index in the ``Topology``; names are kept for
display and for talking to Slurm.

Units: times in seconds, bandwidths in GB/s (bytes, not bits), gradient sizes in GB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Protocol, runtime_checkable


class LinkKind(StrEnum):
    """The classes of links a ring all-reduce can cross."""

    NIC = "nic"  # a node's network interface (both directions)
    LEAF_UPLINK = "leaf_uplink"  # a leaf (ToR) switch to its aggregation/spine layer
    AGG_UPLINK = "agg_uplink"  # an aggregation switch to the core
    # one direction of one of a leaf's parallel uplinks (``Topology.ecmp_spines``): a flow
    # between leaves takes the one ECMP hashes it onto (``ecmp_plane``)
    LEAF_PORT = "leaf_port"
    # one direction of one of an aggregation switch's parallel uplinks to the core
    # (``Topology.ecmp_cores``), hashed per flow as the leaf ports are (``ecmp_plane``, tier 1)
    AGG_PORT = "agg_port"
    # a rail-optimised fabric (``Topology.rails``): one NIC of a node (its GPU rail r), one
    # rail switch's uplink (rail r of a leaf group), one aggregation switch's share for rail r
    RAIL_NIC = "rail_nic"
    RAIL_UPLINK = "rail_uplink"
    RAIL_AGG = "rail_agg"


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU server: its GPUs, the leaf switch it hangs off, and its two bandwidths."""

    name: str
    gpus: int
    leaf: int  # index into Topology.leaf_names
    intra_gbps: float = 150.0  # GPU-to-GPU inside the node (NVLink or PCIe), GB/s
    nic_gbps: float = 25.0  # the node's network interface, GB/s
    intra_kind: str = "nvlink"  # "nvlink" or "pcie"


@dataclass(frozen=True, slots=True)
class Block:
    """A base block of Slurm's ``topology/block``: its name and its nodes (indices into
    ``Topology.nodes``), in the order Slurm lists the blocks (which aggregated blocks follow)."""

    name: str
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Link:
    """A shared network link: a NIC, a leaf uplink or an aggregation uplink."""

    link_id: int
    kind: LinkKind
    name: str
    gbps: float


@dataclass(frozen=True)
class Topology:
    """Nodes under a tree of switches: node -> leaf (ToR) -> aggregation -> core.

    Link ids are dense: ``0..N-1`` the node NICs, then one uplink per leaf, then
    one uplink per aggregation switch. A two-layer (leaf/spine) fabric has a single
    aggregation switch, whose uplink no ring ever needs. After them, only where the fabric
    has them: the leaves' ECMP ports (``ecmp_spines``), the aggregation switches' ECMP ports
    (``ecmp_cores``), and a rail fabric's per-rail links (``rails``; its rings cross those
    alone, not the single-NIC links before them).
    """

    name: str
    nodes: tuple[Node, ...]
    leaf_names: tuple[str, ...]
    leaf_agg: tuple[int, ...]  # aggregation index of each leaf
    leaf_uplink_gbps: tuple[float, ...]
    agg_names: tuple[str, ...] = ("spine",)
    agg_uplink_gbps: tuple[float, ...] = (float("inf"),)
    # what Slurm's topology plugin enforces (``cluster.slurm.topology_rules``): "" when the
    # topology is not read from a Slurm configuration; else "flat" (no plugin), "tree",
    # "block", or the name of a plugin the rules do not model (e.g. "ring")
    plugin: str = ""
    plugin_params: frozenset[str] = frozenset()  # TopologyParam= values, lower case
    blocks: tuple[Block, ...] = ()  # topology/block base blocks, in Slurm's order
    block_sizes: tuple[int, ...] = ()  # BlockSizes= in nodes; () is Slurm's default
    # per leaf: the switch tree it belongs to (leaves of different trees share no switch,
    # so Slurm never spans them; -1: nodes no switch lists); () is one tree for all
    leaf_fabric: tuple[int, ...] = ()
    # parallel leaf uplinks with ECMP path choice per flow: 0 (default) pools each leaf's
    # uplinks into one link of ``leaf_uplink_gbps``; S > 0 gives every leaf S uplinks (one per
    # spine plane) of ``max(leaf_uplink_gbps) / S`` each way (every leaf the same switch),
    # and each ring hop between leaves takes one plane by a hash (``ecmp_plane``), so rings
    # can collide on one uplink
    ecmp_spines: int = 0
    # parallel aggregation->core uplinks with ECMP (needs ``ecmp_spines``): 0 pools each
    # aggregation switch's uplink into one link of ``agg_uplink_gbps``; C > 0 gives each C
    # uplinks of ``max(agg_uplink_gbps) / C`` each way, and each ring hop between aggregation
    # switches takes one by a second hash (``ecmp_plane`` tier 1)
    ecmp_cores: int = 0
    # a rail-optimised fabric: 0 (default) gives each node one NIC on its leaf; R >= 2 gives
    # each node R NICs of ``Node.nic_gbps`` (one per GPU rail), NIC r on rail switch r of the
    # node's leaf group (``Node.leaf`` is the group; ``leaf_uplink_gbps`` the group's R rail
    # switches together, ``agg_uplink_gbps`` the aggregation switch's R rails together). A
    # ring hop between GPUs of local rank r on two nodes crosses both nodes' NIC r, and rail
    # r's uplinks only between groups (``job_rails`` says which rails a job uses)
    rails: int = 0

    def __post_init__(self) -> None:
        n_leaves = len(self.leaf_names)
        if not self.nodes:
            raise ValueError("a topology needs at least one node")
        if len(self.leaf_agg) != n_leaves or len(self.leaf_uplink_gbps) != n_leaves:
            raise ValueError("leaf_agg and leaf_uplink_gbps need one entry per leaf")
        if len(self.agg_uplink_gbps) != len(self.agg_names):
            raise ValueError("agg_uplink_gbps needs one entry per aggregation switch")
        for node in self.nodes:
            if not 0 <= node.leaf < n_leaves:
                raise ValueError(f"node {node.name} refers to unknown leaf {node.leaf}")
            if node.gpus < 0:
                raise ValueError(f"node {node.name} has a negative GPU count")
        if any(not 0 <= a < len(self.agg_names) for a in self.leaf_agg):
            raise ValueError("a leaf refers to an unknown aggregation switch")
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError("node names must be unique")
        if self.leaf_fabric and len(self.leaf_fabric) != n_leaves:
            raise ValueError("leaf_fabric needs one entry per leaf")
        in_blocks = [i for b in self.blocks for i in b.nodes]
        if any(not 0 <= i < len(self.nodes) for i in in_blocks):
            raise ValueError("a block refers to an unknown node")
        if len(set(in_blocks)) != len(in_blocks):
            raise ValueError("a node is in two blocks")
        if any(s <= 0 for s in self.block_sizes):
            raise ValueError("block sizes must be positive")
        if self.ecmp_spines < 0:
            raise ValueError("ecmp_spines must be 0 (pooled uplinks) or positive")
        if self.ecmp_cores < 0 or (self.ecmp_cores and not self.ecmp_spines):
            raise ValueError("ecmp_cores must be 0, or positive with ecmp_spines")
        if self.rails < 0 or self.rails == 1:
            raise ValueError("rails must be 0 (one NIC per node) or at least 2")
        if self.rails and self.ecmp_spines:
            raise ValueError("a rail-optimised fabric with ECMP uplinks is not modelled")

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def max_gpus_per_node(self) -> int:
        return max(n.gpus for n in self.nodes)

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def node_agg(self) -> tuple[int, ...]:
        return tuple(self.leaf_agg[n.leaf] for n in self.nodes)

    @cached_property
    def leaf_nodes(self) -> tuple[tuple[int, ...], ...]:
        """Node indices under each leaf."""
        members: list[list[int]] = [[] for _ in self.leaf_names]
        for i, n in enumerate(self.nodes):
            members[n.leaf].append(i)
        return tuple(tuple(m) for m in members)

    @cached_property
    def links(self) -> tuple[Link, ...]:
        n, n_leaves = len(self.nodes), len(self.leaf_names)
        nic = [
            Link(i, LinkKind.NIC, f"{node.name}:nic", node.nic_gbps)
            for i, node in enumerate(self.nodes)
        ]
        leaf = [
            Link(n + i, LinkKind.LEAF_UPLINK, f"{name}:up", self.leaf_uplink_gbps[i])
            for i, name in enumerate(self.leaf_names)
        ]
        agg = [
            Link(n + n_leaves + i, LinkKind.AGG_UPLINK, f"{name}:up", self.agg_uplink_gbps[i])
            for i, name in enumerate(self.agg_names)
        ]
        spines, base = self.ecmp_spines, n + n_leaves + len(self.agg_names)
        # every parallel uplink of a tier is as fast (its switches are one model): the widest
        # switch's pooled uplink over the planes, so a leaf or aggregation switch with fewer
        # nodes under it has fewer nodes per port, not slower ports
        leaf_port = max(self.leaf_uplink_gbps) / spines if spines else 0.0
        ports = [
            Link(
                base + (i * spines + s) * 2 + d,
                LinkKind.LEAF_PORT,
                f"{name}:{'down' if d else 'up'}{s + 1}",
                leaf_port,
            )
            for i, name in enumerate(self.leaf_names)
            for s in range(spines)
            for d in (0, 1)
        ]
        cores, base = self.ecmp_cores, base + len(ports)
        agg_port = max(self.agg_uplink_gbps) / cores if cores else 0.0
        agg_ports = [
            Link(
                base + (i * cores + c) * 2 + d,
                LinkKind.AGG_PORT,
                f"{name}:{'down' if d else 'up'}{c + 1}",
                agg_port,
            )
            for i, name in enumerate(self.agg_names)
            for c in range(cores)
            for d in (0, 1)
        ]
        return tuple(nic + leaf + agg + ports + agg_ports + self._rail_links(base + len(agg_ports)))

    def _rail_links(self, base: int) -> list[Link]:
        """A rail fabric's links, from id ``base``: each node's R NICs, then each leaf group's R
        rail uplinks, then each aggregation switch's R rail shares."""
        r = self.rails
        if not r:
            return []
        nics = [
            Link(base + i * r + k, LinkKind.RAIL_NIC, f"{node.name}:nic{k}", node.nic_gbps)
            for i, node in enumerate(self.nodes)
            for k in range(r)
        ]
        base += len(nics)
        ups = [
            Link(
                base + i * r + k,
                LinkKind.RAIL_UPLINK,
                f"{name}/rail{k}:up",
                self.leaf_uplink_gbps[i] / r,
            )
            for i, name in enumerate(self.leaf_names)
            for k in range(r)
        ]
        base += len(ups)
        aggs = [
            Link(base + i * r + k, LinkKind.RAIL_AGG, f"{name}/rail{k}:up", gbps / r)
            for i, (name, gbps) in enumerate(zip(self.agg_names, self.agg_uplink_gbps, strict=True))
            for k in range(r)
        ]
        return nics + ups + aggs

    @cached_property
    def _rail_base(self) -> int:
        """The id of the first rail link (after the NICs, pooled uplinks and ECMP ports)."""
        n, n_leaves, n_aggs = len(self.nodes), len(self.leaf_names), len(self.agg_names)
        return n + n_leaves + n_aggs + 2 * (n_leaves * self.ecmp_spines + n_aggs * self.ecmp_cores)

    def job_rails(self, job: int, gpus: int) -> tuple[int, ...]:
        """The rails a ring uses on a rail fabric (``()`` on a single-NIC one): ``gpus`` is the
        fewest GPUs the job has on one of its nodes (0: not known, every rail). Its GPUs of
        local rank ``k`` talk over rail ``k``, so it uses ``min(R, gpus)`` rails; a placement
        counts GPUs per node, not which ones, so with fewer than ``R`` the first is taken as
        ``job * gpus mod R`` and the rest follow it (jobs sharing a node then mostly take
        disjoint rails, as Slurm's lowest-free-GPU rule gives them disjoint GPUs)."""
        r = self.rails
        if not r:
            return ()
        if gpus <= 0 or gpus >= r:
            return tuple(range(r))
        first = (job * gpus) % r
        return tuple(sorted((first + k) % r for k in range(gpus)))

    @cached_property
    def link_gbps(self) -> tuple[float, ...]:
        return tuple(link.gbps for link in self.links)

    @cached_property
    def _ring_memo(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        return {}

    @cached_property
    def _ecmp_memo(self) -> dict[tuple[int, tuple[int, ...]], tuple[int, ...]]:
        return {}

    def ring_links(self, nodes: Sequence[int], job: int = 0, gpus: int = 0) -> tuple[int, ...]:
        """Ids of the network links a ring over these nodes crosses (none for one node).

        ``job`` (its id) matters only with ECMP (``ecmp_spines``): it is part of the hash
        that puts each of the ring's hops between leaves on one parallel uplink; on a rail
        fabric (``rails``) ``job`` and ``gpus`` (the fewest GPUs it has on one of its nodes)
        pick its rails (``job_rails``)."""
        if len(nodes) <= 1:
            return ()
        key = tuple(nodes)
        if self.rails:  # never with ECMP: its memo, keyed by (job, (gpus, *nodes))
            rmemo = self._ecmp_memo
            rkey = (job, (gpus, *key))
            hit = rmemo.get(rkey)
            if hit is None:
                hit = rmemo[rkey] = self._compute_rail_links(key, self.job_rails(job, gpus))
            return hit
        if self.ecmp_spines:
            memo = self._ecmp_memo
            hit = memo.get((job, key))
            if hit is None:
                hit = memo[(job, key)] = self._compute_ecmp_links(key, job)
            return hit
        hit = self._ring_memo.get(key)
        if hit is None:
            hit = self._ring_memo[key] = self._compute_ring_links(key)
        return hit

    def ring_hops(self, nodes: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The (src, dst) node pairs of a ring over these nodes: the nodes ordered by leaf,
        then index (so the ring leaves and enters each leaf once), each sending to the next."""
        order = sorted(nodes, key=lambda i: (self.nodes[i].leaf, i))
        m = len(order)
        return tuple((order[i], order[(i + 1) % m]) for i in range(m)) if m > 1 else ()

    def _compute_ecmp_links(self, nodes: tuple[int, ...], job: int) -> tuple[int, ...]:
        """NICs, then the parallel uplink each hop between leaves is hashed onto (its source
        leaf's up port and its destination leaf's down port of that plane), then between
        aggregation switches the parallel core uplink each such hop is hashed onto
        (``ecmp_cores``; tier 1 of ``ecmp_plane``) or, with none, the pooled aggregation
        uplinks as in the pooled fabric."""
        n, n_leaves, spines = len(self.nodes), len(self.leaf_names), self.ecmp_spines
        n_aggs, cores = len(self.agg_names), self.ecmp_cores
        base = n + n_leaves + n_aggs
        core_base = base + 2 * n_leaves * spines
        ports: set[int] = set()
        core_ports: set[int] = set()
        for flow, (src, dst) in enumerate(self.ring_hops(nodes)):
            a, b = self.nodes[src].leaf, self.nodes[dst].leaf
            if a != b:
                s = ecmp_plane(job, flow, src, dst, spines)
                ports.add(base + (a * spines + s) * 2)
                ports.add(base + (b * spines + s) * 2 + 1)
                x, y = self.leaf_agg[a], self.leaf_agg[b]
                if cores and x != y:
                    c = ecmp_plane(job, flow, src, dst, cores, tier=1)
                    core_ports.add(core_base + (x * cores + c) * 2)
                    core_ports.add(core_base + (y * cores + c) * 2 + 1)
        out = list(nodes) + sorted(ports)
        if cores:
            out.extend(sorted(core_ports))
            return tuple(out)
        aggs = sorted({self.leaf_agg[self.nodes[i].leaf] for i in nodes})
        if len(aggs) > 1:
            out.extend(n + n_leaves + a for a in aggs)
        return tuple(out)

    def _compute_rail_links(
        self, nodes: tuple[int, ...], rails: tuple[int, ...]
    ) -> tuple[int, ...]:
        """On a rail fabric, for each of the ring's rails: its NIC on every node; between leaf
        groups, that rail's uplink of each group; between aggregation switches, that rail's
        share of each one's uplink (the pooled fabric's rule, per rail)."""
        r, base = self.rails, self._rail_base
        n, n_leaves = len(self.nodes), len(self.leaf_names)
        leaves = sorted({self.nodes[i].leaf for i in nodes})
        aggs = sorted({self.leaf_agg[leaf] for leaf in leaves}) if len(leaves) > 1 else []
        out = [base + i * r + k for i in nodes for k in rails]
        if len(leaves) > 1:
            up = base + n * r
            out.extend(up + leaf * r + k for leaf in leaves for k in rails)
        if len(aggs) > 1:
            agg = base + n * r + n_leaves * r
            out.extend(agg + a * r + k for a in aggs for k in rails)
        return tuple(out)

    def _compute_ring_links(self, nodes: tuple[int, ...]) -> tuple[int, ...]:
        n, n_leaves = len(self.nodes), len(self.leaf_names)
        leaves = sorted({self.nodes[i].leaf for i in nodes})
        out = list(nodes)
        if len(leaves) > 1:
            out.extend(n + leaf for leaf in leaves)
            aggs = sorted({self.leaf_agg[leaf] for leaf in leaves})
            if len(aggs) > 1:
                out.extend(n + n_leaves + a for a in aggs)
        return tuple(out)


def ecmp_plane(job: int, flow: int, src: int, dst: int, planes: int, tier: int = 0) -> int:
    """The parallel uplink (spine plane) ECMP puts a flow on: the first 8 bytes of BLAKE2b
    over (job id, flow index in its ring, source node index, destination node index), each a
    signed little-endian 64-bit integer, as an unsigned integer modulo ``planes``; for a
    higher tier (1: aggregation -> core) the tier follows as a fifth such integer, so each
    tier's switches hash independently (as switches with their own seeds do).
    Deterministic (no process seed), the same for the same integers everywhere."""
    values = (job, flow, src, dst, tier) if tier else (job, flow, src, dst)
    data = b"".join(x.to_bytes(8, "little", signed=True) for x in values)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % planes


MAX_JOB_GPUS = 1 << 20
"""More GPUs than this for one job is absurd wherever it is read (the largest machines have
about 10^5): traces and accounting reject it."""


@dataclass(frozen=True, slots=True)
class Job:
    """A training job as submitted. ``duration`` is its isolated run time at its best placement."""

    job_id: int
    submit_time: float
    num_gpus: int
    duration: float
    profile: str = ""  # communication profile name (see cluster/profiles); "" means the default mix
    user: str = ""
    name: str = ""
    nodes: int = 0  # requested node count (Slurm -N); 0: not given, see ``requested_shape``
    time_limit: float = 0.0  # requested wall-clock limit, seconds (Slurm --time); 0: none given
    # run-time predictions from history (datasets/predictor.py), seconds; 0: none made.
    # ``duration`` is the simulator's alone: a policy reads these instead.
    pred_s: float = 0.0  # the predictor's median
    pred_hi_s: float = 0.0  # its upper quantile (p90 by default)
    # whether it may be preempted or migrated: None unknown (the simulator's share decides,
    # ``mdp.known.may_preempt``); live, True only for jobs that opted in (deployer/migration)
    preemptible: bool | None = None
    # the form of its request: True flexible (``--gpus=N``: any split over any nodes), False
    # fixed (``-N k`` with GPUs per node: ``requested_shape``, which every placement keeps),
    # None not known (a trace without it): ``backfill`` keeps ``requested_shape``, the
    # other placements split it as they see fit (the behaviour before requests had a form)
    flexible: bool | None = None
    # its parallel layout (``cluster.layout``): pipeline stages, TP inside a node and DP over
    # each stage's nodes; 0 or 1: none, one ring over all its nodes (the model before layouts)
    pp: int = 0

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise ValueError(f"job {self.job_id}: num_gpus must be positive, got {self.num_gpus}")
        if not self.duration > 0:
            raise ValueError(f"job {self.job_id}: duration must be positive, got {self.duration}")
        if self.nodes < 0 or (self.nodes and self.num_gpus % self.nodes):
            raise ValueError(
                f"job {self.job_id}: {self.num_gpus} GPUs do not split evenly over "
                f"{self.nodes} nodes"
            )
        if self.time_limit < 0:
            raise ValueError(f"job {self.job_id}: time_limit must be non-negative")
        if self.pred_s < 0 or self.pred_hi_s < self.pred_s:
            raise ValueError(f"job {self.job_id}: need 0 <= pred_s <= pred_hi_s")
        if self.flexible and self.nodes:
            raise ValueError(f"job {self.job_id}: a flexible request has no fixed node count")
        if self.pp < 0 or (self.pp > 1 and self.num_gpus % self.pp):
            raise ValueError(
                f"job {self.job_id}: {self.num_gpus} GPUs do not split in {self.pp} stages"
            )

    @property
    def predicted(self) -> bool:
        """Whether a run-time predictor has annotated this job."""
        return self.pred_s > 0


@dataclass(frozen=True, slots=True)
class Shape:
    """What a Slurm user asks for: ``nodes`` nodes with ``gpus_per_node`` GPUs on each."""

    nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def requested_nodes(gpus: int, alloc_nodes: int) -> int:
    """The node count a job asked Slurm for, as its allocation shows it (``-N``); 0 (derive
    it, ``domain.requested_shape``) where its GPUs do not split evenly over those nodes."""
    return alloc_nodes if alloc_nodes > 0 and gpus % alloc_nodes == 0 else 0


def requested_shape(job: Job, node_gpus: int) -> Shape:
    """The job's requested shape: its own (``Job.nodes``, from Slurm accounting) if it has one.

    Otherwise derived the way Slurm users ask: one node up to a node's GPUs (``-N1
    --gres=gpu:g``); beyond, whole nodes (``-N g/G --gres=gpu:G`` for ``G`` GPUs per node),
    or, when ``g`` is not a multiple of ``G``, the fewest nodes (at least ``ceil(g/G)``)
    over which ``g`` splits evenly (12 on 8-GPU nodes: 2 x 6).
    """
    g = job.num_gpus
    if job.nodes:
        return Shape(job.nodes, g // job.nodes)
    if g <= node_gpus:
        return Shape(1, g)
    n = -(-g // max(1, node_gpus))
    while g % n:
        n += 1
    return Shape(n, g // n)


def fixed_shape(job: Job, node_gpus: int) -> Shape | None:
    """The shape every placement must give the job: ``requested_shape`` for a fixed request
    (``Job.flexible`` False), None for a flexible or unknown one."""
    return requested_shape(job, node_gpus) if job.flexible is False else None


def within_request(job: Job, placement: Placement, node_gpus: int) -> bool:
    """Whether a placement gives the job what it asked: its GPUs, and for a fixed request
    exactly its shape's nodes with its GPUs per node on each."""
    if placement.num_gpus != job.num_gpus:
        return False
    shape = fixed_shape(job, node_gpus)
    return shape is None or (
        placement.num_nodes == shape.nodes
        and all(g == shape.gpus_per_node for _, g in placement.alloc)
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs taken on each node: sorted ``(node_index, gpus)`` pairs, gpus > 0."""

    alloc: tuple[tuple[int, int], ...]

    @staticmethod
    def of(pairs: Sequence[tuple[int, int]]) -> Placement:
        """Normalise (merge, drop zeros, sort) a list of (node, gpus) pairs."""
        merged: dict[int, int] = {}
        for node, gpus in pairs:
            if gpus < 0:
                raise ValueError(f"negative GPU count {gpus} on node {node}")
            if gpus:
                merged[node] = merged.get(node, 0) + gpus
        return Placement(tuple(sorted(merged.items())))

    @property
    def num_gpus(self) -> int:
        return sum(g for _, g in self.alloc)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple([n for n, _ in self.alloc])

    @property
    def num_nodes(self) -> int:
        return len(self.alloc)


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job in the queue; a preempted job comes back with its attained service and work left,
    and the restore its restart will pay (``remaining_s + restore_s`` is what it has left to
    run once started, as a ``RunningJob.remaining_s`` counts it)."""

    job: Job
    remaining_s: float  # isolated seconds of work left
    attained_gpu_s: float = 0.0  # GPU-seconds of service received so far (Tiresias' LAS)
    preemptions: int = 0
    restore_s: float = 0.0  # isolated seconds its restart costs first (cluster/restart.py)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs: where it runs, how fast it progresses, how much it has had.

    Progress is stored as of ``since`` (the last time its rate changed), so a running
    job's record stays valid while time passes; use ``remaining_at``/``attained_at`` for
    the values at another time, and ``expected_end`` for when it finishes at this rate.
    """

    job: Job
    placement: Placement
    start_time: float  # start of the current run (after a preemption, the restart)
    remaining_s: float  # isolated seconds of work left at ``since``
    rate: float  # progress per second (1.0 = isolated at the best placement)
    attained_gpu_s: float = 0.0  # GPU-seconds of service at ``since``
    preemptions: int = 0
    since: float = 0.0

    def remaining_at(self, t: float) -> float:
        return max(0.0, self.remaining_s - self.rate * (t - self.since))

    def attained_at(self, t: float) -> float:
        return self.attained_gpu_s + self.job.num_gpus * (t - self.since)

    @property
    def expected_end(self) -> float:
        return self.since + self.remaining_s / self.rate if self.rate > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class TransitJob:
    """A job between placements: neither pending nor running, and not to be touched.

    ``held``: the GPUs it still holds while it writes its checkpoint (a preempted or
    migrated job during the signal's grace; None once it has let them go). ``target``: the
    GPUs reserved for its (re)start (a migration, or a start that waits for GPUs being
    drained; None for a preempted job, which goes back to the queue). ``until``: when it
    leaves this state (back to the queue, or running on ``target``). Neither ``held`` nor
    ``target`` GPUs are in ``ClusterState.free_gpus``.
    """

    job: Job
    held: Placement | None
    target: Placement | None
    until: float
    attained_gpu_s: float = 0.0
    preemptions: int = 0

    @property
    def draining(self) -> bool:
        """Whether it still holds GPUs while it checkpoints."""
        return self.held is not None


@dataclass(frozen=True)
class ClusterState:
    """What a policy sees at a decision point.

    ``pending`` is in canonical order (submit time, then job id). ``link_flows`` counts
    the rings crossing each link of ``topology.links``. ``running`` are the jobs that hold
    GPUs and make progress (a policy may preempt or migrate them); ``transit`` the jobs that
    are draining (checkpointing after a preemption or a migration, GPUs still held) or
    waiting for reserved GPUs to start on: they may be neither started, preempted nor
    migrated. ``free_gpus`` excludes GPUs held or reserved by ``transit`` jobs, so a policy
    that ignores ``transit`` stays correct.
    """

    time: float
    topology: Topology
    free_gpus: tuple[int, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    link_flows: tuple[int, ...] = ()
    transit: tuple[TransitJob, ...] = ()

    @property
    def total_free_gpus(self) -> int:
        return sum(self.free_gpus)

    @cached_property
    def jobs_per_node(self) -> tuple[int, ...]:
        """Number of running jobs on each node (SJF-BCO's busy-ness)."""
        counts = [0] * len(self.topology.nodes)
        for r in self.running:
            for node, _ in r.placement.alloc:
                counts[node] += 1
        return tuple(counts)


@dataclass(frozen=True, slots=True)
class Start:
    """Start one pending job on a placement (in ``Decision.migrate``: move a running one)."""

    job_id: int
    placement: Placement


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy does at a decision point: preempt, migrate, then start.

    ``preempt``: running jobs to signal; each drains (holds its GPUs for the restart model's
    grace while it checkpoints), then goes back to the queue. ``migrate``: running jobs to
    move to a new placement: each drains likewise, its target GPUs are reserved at once (they
    may include GPUs it holds itself, or GPUs of jobs draining), and it restarts there when
    the grace is over. ``starts``: pending jobs to start; a start on GPUs still held by jobs
    draining (e.g. preempted in this decision) waits, reserved, until they are let go. Every
    restart pays the restore cost (``cluster/restart.py``).

    ``wake_at``: when the policy wants its next decision point even if nothing arrives or
    ends (e.g. a job crossing a Tiresias threshold); a backend that decides periodically
    anyway may ignore it.
    """

    starts: tuple[Start, ...] = ()
    preempt: tuple[int, ...] = field(default=())
    wake_at: float = float("inf")
    migrate: tuple[Start, ...] = ()

    @property
    def is_wait(self) -> bool:
        return not self.starts and not self.preempt and not self.migrate


WAIT = Decision()


@runtime_checkable
class Policy(Protocol):
    """A scheduler: given the cluster state, which pending jobs start where."""

    @property
    def name(self) -> str: ...

    def decide(self, state: ClusterState) -> Decision: ...


@runtime_checkable
class Backend(Protocol):
    """Something a policy can drive: the simulator, a real Slurm, or a shadow of it."""

    def observe(self) -> ClusterState: ...

    def apply(self, decision: Decision) -> None: ...

    def advance(self) -> bool: ...
