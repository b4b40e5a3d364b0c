"""topology.conf (topology.conf(5)): tree switches (``SwitchName``), base blocks
(``BlockName``) and ``BlockSizes``; the leaf switches and trees they make, and the
plugin's rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from linkwise.cluster.hostlist import expand
from linkwise.cluster.topology.build import IMPLICIT_LEAF, TopologyRules, fresh_name
from linkwise.cluster.topology.conf_lines import conf_lines


@dataclass(frozen=True, slots=True)
class Switch:
    """A switch of a topology file: the nodes and the switches under it, and its line."""

    name: str
    nodes: tuple[str, ...]
    children: tuple[str, ...]
    lineno: int


@dataclass(frozen=True, slots=True)
class TopologyUnits:
    """What a topology file defines: switches (tree), base blocks and BlockSizes (block)."""

    switches: Mapping[str, Switch]
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    block_sizes: tuple[int, ...] = ()


def parse_topology_units(text: str, *, blocks: bool = False) -> TopologyUnits:
    """The switches of a topology.conf text and, with ``blocks`` (topology/block), its
    ``BlockName=NAME Nodes=...`` and ``BlockSizes=N,...`` lines (topology.conf(5))."""
    switches: dict[str, Switch] = {}
    found: dict[str, tuple[str, ...]] = {}
    sizes: tuple[int, ...] = ()
    for lineno, pairs in conf_lines(text, "topology.conf"):
        key, value = pairs[0]
        fields = dict(pairs[1:])
        if blocks and key == "blocksizes":
            sizes = block_sizes(value.split(","), f"topology.conf line {lineno}")
            continue
        if blocks and key == "blockname":
            if set(fields) - {"nodes"}:
                raise ValueError(
                    f"topology.conf line {lineno}: unknown keys {sorted(set(fields) - {'nodes'})}"
                )
            if value in found:
                raise ValueError(f"topology.conf line {lineno}: block {value!r} is defined twice")
            try:
                found[value] = tuple(expand(fields.get("nodes", "")))
            except ValueError as exc:
                raise ValueError(f"topology.conf line {lineno}: {exc}") from None
            continue
        if key != "switchname":
            raise ValueError(
                f"topology.conf line {lineno}: expected SwitchName=..., got {key}= "
                "(only the tree topology is supported; BlockName lines need "
                "TopologyPlugin=topology/block)"
            )
        unknown = set(fields) - {"nodes", "switches", "linkspeed"}
        if unknown:
            raise ValueError(f"topology.conf line {lineno}: unknown keys {sorted(unknown)}")
        if value in switches:
            raise ValueError(f"topology.conf line {lineno}: switch {value!r} is defined twice")
        try:
            sw = Switch(
                value,
                tuple(expand(fields.get("nodes", ""))),
                tuple(expand(fields.get("switches", ""))),
                lineno,
            )
        except ValueError as exc:
            raise ValueError(f"topology.conf line {lineno}: {exc}") from None
        switches[value] = sw
    return TopologyUnits(switches, tuple(found.items()), sizes)


def block_sizes(values: Iterable[object], what: str) -> tuple[int, ...]:
    """BlockSizes: positive node counts, each a power-of-two multiple of the first
    (topology.conf(5): "Successive BlockSizes must be a power of two larger than the prior
    values")."""
    try:
        sizes = tuple(int(str(v).strip()) for v in values)
    except ValueError:
        raise ValueError(f"{what}: BlockSizes must be whole numbers") from None
    if not sizes or sizes[0] <= 0:
        raise ValueError(f"{what}: BlockSizes must be positive")
    for size in sizes:
        ratio = size // sizes[0]
        if size % sizes[0] or ratio & (ratio - 1) or ratio <= 0:
            raise ValueError(f"{what}: BlockSize {size} is not {sizes[0]} times a power of two")
    return sizes


def leaf_tree(
    units: TopologyUnits, node_gpus: Mapping[str, int]
) -> tuple[dict[str, list[str]], dict[str, str | None], dict[str, str | None]]:
    """Leaf switch -> its nodes (definition order, implicit leaf last), leaf -> parent and
    leaf -> the root switch of its tree (None for the implicit leaf: in no switch). Without
    switches but with blocks, each base block is a leaf (one tree for all)."""
    switches = units.switches
    if not switches and units.blocks:
        switches = {name: Switch(name, hosts, (), 0) for name, hosts in units.blocks if hosts}
    for sw in switches.values():
        if sw.nodes and sw.children:
            raise ValueError(
                f"topology.conf line {sw.lineno}: switch {sw.name!r} has both Nodes and "
                "Switches; nodes must hang off leaf switches"
            )
    parent: dict[str, str] = {}
    for sw in switches.values():
        for child in sw.children:
            if child not in switches:
                raise ValueError(
                    f"topology.conf line {sw.lineno}: switch {sw.name!r} lists unknown switch "
                    f"{child!r}"
                )
            if child in parent:
                raise ValueError(
                    f"topology.conf: switch {child!r} has two parents, "
                    f"{parent[child]!r} and {sw.name!r}"
                )
            parent[child] = sw.name
    for start in switches:
        seen = [start]
        current = start
        while current in parent:
            current = parent[current]
            if current in seen:
                cycle = " -> ".join([*seen[seen.index(current) :], current])
                raise ValueError(f"topology.conf: switches form a cycle: {cycle}")
            seen.append(current)

    members: dict[str, list[str]] = {}
    leaf_of: dict[str, str] = {}
    for sw in switches.values():
        if not sw.nodes:
            continue
        for host in sw.nodes:
            if host not in node_gpus:
                raise ValueError(
                    f"topology.conf line {sw.lineno}: switch {sw.name!r} lists node {host!r}, "
                    "which slurm.conf does not define"
                )
            if host in leaf_of and leaf_of[host] != sw.name:
                raise ValueError(
                    f"topology.conf: node {host!r} is under two leaf switches, "
                    f"{leaf_of[host]!r} and {sw.name!r}"
                )
            leaf_of[host] = sw.name
        members[sw.name] = list(dict.fromkeys(sw.nodes))
    leaf_parent: dict[str, str | None] = {leaf: parent.get(leaf) for leaf in members}
    one_tree = not units.switches
    leaf_root: dict[str, str | None] = {
        leaf: "" if one_tree else _root(leaf, parent) for leaf in members
    }
    orphans = [host for host in node_gpus if host not in leaf_of]
    if orphans:
        implicit = fresh_name(IMPLICIT_LEAF, switches)
        members[implicit] = orphans
        leaf_parent[implicit] = None
        leaf_root[implicit] = "" if one_tree else None
    return members, leaf_parent, leaf_root


def _root(switch: str, parent: Mapping[str, str]) -> str:
    while switch in parent:
        switch = parent[switch]
    return switch


def plugin_rules(
    plugin: str,
    params: frozenset[str],
    units: TopologyUnits,
    leaf_root: Mapping[str, str | None],
    node_gpus: Mapping[str, int],
) -> TopologyRules:
    """The plugin's rules; blocks only for topology/block, whose nodes slurm.conf defines."""
    blocks = units.blocks if plugin == "block" else ()
    for name, hosts in blocks:
        unknown = [h for h in hosts if h not in node_gpus]
        if unknown:
            raise ValueError(
                f"topology: block {name!r} lists node {unknown[0]!r}, which slurm.conf does "
                "not define"
            )
    if plugin == "block" and not any(hosts for _, hosts in blocks):
        raise ValueError("topology/block: no blocks with nodes (BlockName=... Nodes=...)")
    return TopologyRules(plugin, params, blocks, units.block_sizes, leaf_root)
