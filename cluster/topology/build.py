"""Assembling a ``Topology`` from nodes and leaf switches (``build_topology``), with what
Slurm's topology plugin enforces (``TopologyRules``); shared by the Slurm and Lingjun
builders.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.domain import Block, Node, Topology
from linkwise.cluster.topology.spec import ecmp_planes

IntraKind = Literal["nvlink", "pcie"]
IMPLICIT_LEAF = "implicit-leaf"  # holds the nodes that no leaf switch lists
IMPLICIT_SPINE = "spine"  # above leaves that have no parent switch


@dataclass(frozen=True, slots=True)
class TopologyRules:
    """What ``build_topology`` adds to a Topology for Slurm's topology rules (names, not
    indices)."""

    plugin: str
    params: frozenset[str]
    blocks: tuple[tuple[str, tuple[str, ...]], ...]
    block_sizes: tuple[int, ...]
    leaf_root: Mapping[str, str | None]


def build_topology(
    *,
    name: str,
    node_gpus: Mapping[str, int],
    leaf_members: Mapping[str, Sequence[str]],
    leaf_parent: Mapping[str, str | None],
    nic_gbps: float,
    intra_gbps: float,
    intra_kind: IntraKind,
    oversub: float,
    agg_oversub: float,
    rules: TopologyRules | None = None,
) -> Topology:
    """Assemble a Topology: nodes in ``node_gpus`` order, leaves in ``leaf_members`` order
    (with ``rules``, what Slurm's topology plugin enforces: ``Topology.plugin`` ...)."""
    leaf_names = list(leaf_members)
    leaf_index = {host: i for i, leaf in enumerate(leaf_names) for host in leaf_members[leaf]}
    nodes = tuple(
        Node(
            name=host,
            gpus=gpus,
            leaf=leaf_index[host],
            intra_gbps=intra_gbps,
            nic_gbps=nic_gbps,
            intra_kind=intra_kind,
        )
        for host, gpus in node_gpus.items()
    )
    parents = [leaf_parent[leaf] for leaf in leaf_names]
    spine = fresh_name(IMPLICIT_SPINE, {p for p in parents if p is not None} | set(leaf_names))
    agg_names = list(dict.fromkeys(p if p is not None else spine for p in parents))
    agg_index = {a: i for i, a in enumerate(agg_names)}
    leaf_agg = tuple(agg_index[p if p is not None else spine] for p in parents)
    leaf_sizes = [len(leaf_members[leaf]) for leaf in leaf_names]
    if len(agg_names) == 1:
        agg_up: tuple[float, ...] = (math.inf,)
    else:
        agg_up = tuple(
            sum(size for size, a in zip(leaf_sizes, leaf_agg, strict=True) if a == i)
            * nic_gbps
            / agg_oversub
            for i in range(len(agg_names))
        )
    topo = Topology(
        name=name,
        nodes=nodes,
        leaf_names=tuple(leaf_names),
        leaf_agg=leaf_agg,
        leaf_uplink_gbps=tuple(size * nic_gbps / oversub for size in leaf_sizes),
        agg_names=tuple(agg_names),
        agg_uplink_gbps=agg_up,
    )
    if rules is None:
        return topo
    index = topo.node_index
    roots = {r: k for k, r in enumerate(dict.fromkeys(r for r in rules.leaf_root.values() if r))}
    fabric = tuple(
        -1 if rules.leaf_root.get(leaf) is None else roots.get(rules.leaf_root[leaf] or "", 0)
        for leaf in leaf_names
    )
    return dataclasses.replace(
        topo,
        plugin=rules.plugin,
        plugin_params=rules.params,
        blocks=tuple(Block(block, tuple(index[h] for h in hosts)) for block, hosts in rules.blocks),
        block_sizes=rules.block_sizes,
        leaf_fabric=fabric,
    )


def with_ecmp(
    topo: Topology, *, oversub: float, agg_oversub: float, spines: int = 0, cores: int = 0
) -> Topology:
    """``topo`` with ECMP on every tier (what ``ecmp=1`` does to a topology read from a
    file): each leaf's uplink split into ``spines`` parallel uplinks and, with several
    aggregation switches, each one's uplink into ``cores`` (0: ``spec.ecmp_planes`` of the
    nodes under the switch and its oversubscription, as ``spec.from_spec`` does)."""
    leaf_sizes = [len(m) for m in topo.leaf_nodes]
    several = len(topo.agg_names) > 1
    agg_sizes = [
        sum(size for size, a in zip(leaf_sizes, topo.leaf_agg, strict=True) if a == i)
        for i in range(len(topo.agg_names))
    ]
    return dataclasses.replace(
        topo,
        ecmp_spines=spines or ecmp_planes(max(leaf_sizes), oversub),
        ecmp_cores=(cores or ecmp_planes(max(agg_sizes), agg_oversub)) if several else 0,
    )


def check_rates(**rates: float) -> None:
    for key, value in rates.items():
        if not 0 < value < math.inf:
            raise ValueError(f"{key} must be positive and finite, got {value}")


def fresh_name(name: str, taken: Iterable[str]) -> str:
    """``name``, or ``name-2``, ``name-3``... if it is already taken."""
    used = set(taken)
    candidate, k = name, 1
    while candidate in used:
        k += 1
        candidate = f"{name}-{k}"
    return candidate
