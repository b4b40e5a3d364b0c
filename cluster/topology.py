"""Build a ``Topology``: from a compact spec, Slurm's slurm.conf/topology.conf, or Alibaba's CSV.

``load_topology`` picks the builder from one string (what the CLI takes): a spec
such as ``64x8,leaf=16,oversub=2``, a directory holding ``slurm.conf`` (and maybe
``topology.yaml`` or ``topology.conf``), a ``slurm.conf`` file, or a ``.csv`` file in the
Alibaba Lingjun ``ip,DSW,PSW,ASW`` format. A path may carry options: ``path,nic=25,oversub=2``.

From Slurm's configuration the topology also carries what Slurm's topology plugin enforces
(``Topology.plugin``, ``blocks``, ``block_sizes``, ``leaf_fabric``; the rules themselves are
``cluster.slurm.topology_rules``): the plugin from slurm.conf ``TopologyPlugin=`` (absent:
``flat``), read as Slurm reads it (topology.conf(5), topology.yaml(5), topology.html):
``topology.yaml`` first (25.05+; its cluster-default topology, the first with
``cluster_default: true``, else the first), else ``topology.conf`` (``SwitchName`` lines for
tree, ``BlockName``/``BlockSizes`` lines for block); ``scontrol show topology`` output is
read too (``parse_scontrol_topology``), as a source or a cross-check (``topology_differences``).

In every builder a leaf uplink carries ``nodes under the leaf * NIC / oversub`` and,
when there are several aggregation switches, an aggregation uplink carries
``nodes under it * NIC / agg_oversub``; with one aggregation switch its uplink is
infinite (no ring ever needs it).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml  # type: ignore[import-untyped]

from linkwise.cluster.domain import Block, Node, Topology
from linkwise.cluster.hostlist import compress, expand, natural_key

DEFAULT_NIC_GBPS = 12.5  # 100 Gb/s (EDR InfiniBand / 100GbE)
DEFAULT_INTRA_GBPS = 150.0  # NVLink (V100-class aggregate)
PCIE_GBPS = 12.0  # PCIe Gen3 x16, effective
DEFAULT_NODES_PER_LEAF = 16
# the one default cluster of every command, experiment and deployment that needs one
DEFAULT_TOPOLOGY = "16x8,leaf=4"

_SPEC_KEYS = {
    "leaf", "nic", "intra", "oversub", "pcie", "nvlink", "agg", "agg_oversub", "ecmp", "spines"
}  # fmt: skip


def _options(opts: Iterable[str], known: Collection[str], what: str) -> dict[str, str]:
    """``["nic=25", "pcie", ...]`` -> ``{"nic": "25", "pcie": ""}``; unknown keys are an error."""
    values: dict[str, str] = {}
    for opt in (o.strip() for o in opts):
        if not opt:
            continue
        key, _, value = opt.partition("=")
        key = key.strip().lower()
        if key not in known:
            raise ValueError(f"{what}: unknown option {key!r} (known: {sorted(known)})")
        values[key] = value.strip()
    return values


def from_spec(spec: str) -> Topology:
    """Parse ``NODESxGPUS[,key=value...]``.

    Keys: ``leaf`` nodes per leaf switch (default 16), ``nic`` NIC GB/s (12.5),
    ``intra`` intra-node GB/s (150; ``pcie`` sets 12 and PCIe), ``oversub`` leaf
    uplink oversubscription (1 = non-blocking), ``agg`` leaves per aggregation
    switch (default: all under one spine) and ``agg_oversub``. ``ecmp=1`` splits each
    leaf's uplinks into parallel uplinks with ECMP path choice per flow
    (``Topology.ecmp_spines``): ``spines`` of them (default: the pooled uplink over the NIC
    speed, rounded, at least 1, so each uplink carries one NIC's traffic), each
    ``pooled / spines``; ``ecmp=0`` (default) keeps one pooled uplink per leaf.
    """
    head, *opts = [p.strip() for p in spec.strip().split(",")]
    try:
        n_str, g_str = head.lower().split("x")
        n_nodes, gpus = int(n_str), int(g_str)
    except ValueError:
        raise ValueError(f"bad cluster spec {spec!r}: expected NODESxGPUS, e.g. 64x8") from None
    if n_nodes <= 0 or gpus <= 0:
        raise ValueError(f"bad cluster spec {spec!r}: node and GPU counts must be positive")
    kv = _options(opts, _SPEC_KEYS, f"bad cluster spec {spec!r}")
    try:
        per_leaf = int(kv.get("leaf", DEFAULT_NODES_PER_LEAF))
        nic = float(kv.get("nic", DEFAULT_NIC_GBPS))
        pcie = "pcie" in kv
        intra = float(kv.get("intra", PCIE_GBPS if pcie else DEFAULT_INTRA_GBPS))
        oversub = float(kv.get("oversub", 1.0))
        leaves_per_agg = int(kv["agg"]) if "agg" in kv else 0
        agg_oversub = float(kv.get("agg_oversub", 1.0))
        ecmp = int(kv.get("ecmp", 0))
        spines = int(kv["spines"]) if "spines" in kv else 0
    except ValueError as exc:
        raise ValueError(f"bad cluster spec {spec!r}: {exc}") from None
    rates = (nic, intra, oversub, agg_oversub)
    if per_leaf <= 0 or leaves_per_agg < 0 or not all(0 < r < math.inf for r in rates):
        raise ValueError(f"bad cluster spec {spec!r}: values must be positive and finite")
    if ecmp not in (0, 1) or spines < 0 or (spines and not ecmp):
        raise ValueError(f"bad cluster spec {spec!r}: ecmp is 0 or 1; spines >= 1 needs ecmp=1")
    n_leaves = math.ceil(n_nodes / per_leaf)
    width = len(str(n_nodes))
    nodes = tuple(
        Node(
            name=f"gpu{i + 1:0{width}d}",
            gpus=gpus,
            leaf=i // per_leaf,
            intra_gbps=intra,
            nic_gbps=nic,
            intra_kind="pcie" if pcie else "nvlink",
        )
        for i in range(n_nodes)
    )
    leaf_sizes = [min(per_leaf, n_nodes - leaf * per_leaf) for leaf in range(n_leaves)]
    if leaves_per_agg:
        n_aggs = math.ceil(n_leaves / leaves_per_agg)
        leaf_agg = tuple(leaf // leaves_per_agg for leaf in range(n_leaves))
        agg_up = tuple(
            sum(leaf_sizes[leaf] for leaf in range(n_leaves) if leaf_agg[leaf] == a)
            * nic
            / agg_oversub
            for a in range(n_aggs)
        )
        agg_names = tuple(f"agg{a + 1}" for a in range(n_aggs))
    else:
        leaf_agg = (0,) * n_leaves
        agg_up = (math.inf,)
        agg_names = ("spine",)
    return Topology(
        name=spec.strip(),
        nodes=nodes,
        leaf_names=tuple(f"leaf{leaf + 1}" for leaf in range(n_leaves)),
        leaf_agg=leaf_agg,
        leaf_uplink_gbps=tuple(size * nic / oversub for size in leaf_sizes),
        agg_names=agg_names,
        agg_uplink_gbps=agg_up,
        ecmp_spines=(spines or max(1, round(max(leaf_sizes) / oversub))) if ecmp else 0,
    )


IntraKind = Literal["nvlink", "pcie"]
IMPLICIT_LEAF = "implicit-leaf"  # holds the nodes that no leaf switch lists
IMPLICIT_SPINE = "spine"  # above leaves that have no parent switch


# ---------------------------------------------------------------- Slurm configuration


def from_slurm_conf(
    slurm_conf: str,
    topology_conf: str | None = None,
    *,
    topology_yaml: str | None = None,
    nic_gbps: float = DEFAULT_NIC_GBPS,
    intra_gbps: float = DEFAULT_INTRA_GBPS,
    intra_kind: IntraKind = "nvlink",
    oversub: float = 1.0,
    agg_oversub: float = 1.0,
    name: str = "slurm",
) -> Topology:
    """Build a topology from the TEXTS of slurm.conf and (optionally) a tree topology.conf.

    Nodes come from the ``NodeName`` lines, in slurm.conf order (``NodeName=DEFAULT``
    lines set defaults for later lines); GPUs from ``Gres=gpu[:type]:N`` (nodes without
    GPUs are kept, with 0). Leaves are the switches with ``Nodes=``, aggregation
    switches their parents; switches above those are folded into one core. Nodes that
    no switch lists go to an implicit leaf; without topology.conf all nodes share one
    leaf. ``LinkSpeed`` is read and ignored (Slurm gives it no unit).

    The plugin is slurm.conf's ``TopologyPlugin=`` (``flat`` without one). With
    ``topology_yaml`` (its TEXT; Slurm ignores topology.conf when topology.yaml exists) the
    plugin, switches and blocks are its cluster-default topology's. With ``topology/block``,
    topology.conf's ``BlockName``/``BlockSizes`` lines give the blocks (and, without
    ``SwitchName`` lines, the leaves: one per base block). A ``BlockName`` line under any
    other plugin is an error, as before.
    """
    _check_rates(nic_gbps=nic_gbps, intra_gbps=intra_gbps, oversub=oversub, agg_oversub=agg_oversub)
    node_gpus = parse_slurm_nodes(slurm_conf)
    plugin, params = slurm_topology_plugin(slurm_conf)
    if topology_yaml is not None:
        plugin, units = _parse_topology_yaml(topology_yaml, node_gpus)
    else:
        units = _parse_topology_units(topology_conf or "", blocks=plugin == "block")
    leaf_members, leaf_parent, leaf_root = _tree(units, node_gpus)
    return _build(
        name=name,
        node_gpus=node_gpus,
        leaf_members=leaf_members,
        leaf_parent=leaf_parent,
        nic_gbps=nic_gbps,
        intra_gbps=intra_gbps,
        intra_kind=intra_kind,
        oversub=oversub,
        agg_oversub=agg_oversub,
        rules=_rules(plugin, params, units, leaf_root, node_gpus),
    )


def slurm_topology_plugin(slurm_conf: str) -> tuple[str, frozenset[str]]:
    """The topology plugin of a slurm.conf text (``TopologyPlugin=topology/tree`` -> "tree";
    absent, ``none`` or ``default``: "flat", as Slurm's read_config does) and its
    ``TopologyParam=`` values (lower case)."""
    plugin, params = "", ""
    for _lineno, pairs in _conf_lines(
        slurm_conf, "slurm.conf", frozenset({"topologyplugin", "topologyparam"})
    ):
        for key, value in pairs:
            if key == "topologyplugin":
                plugin = value.strip().lower()
            elif key == "topologyparam":
                params = value
    kind = plugin.removeprefix("topology/")
    if kind in ("", "none", "default"):
        kind = "flat"
    return kind, frozenset(p.strip().lower() for p in params.split(",") if p.strip())


def parse_slurm_nodes(slurm_conf: str) -> dict[str, int]:
    """Node name -> GPU count from the ``NodeName`` lines of a slurm.conf text, in order."""
    defaults: dict[str, str] = {}
    nodes: dict[str, int] = {}
    for lineno, pairs in _conf_lines(slurm_conf, "slurm.conf", frozenset({"nodename"})):
        if pairs[0][0] != "nodename":
            continue
        own = dict(pairs[1:])
        names = pairs[0][1]
        if names.lower() == "default":
            defaults.update(own)
            continue
        fields = {**defaults, **own}
        try:
            gpus = gpus_from_gres(fields.get("gres", ""))
            hosts = expand(names)
        except ValueError as exc:
            raise ValueError(f"slurm.conf line {lineno}: {exc}") from None
        for host in hosts:
            if host in nodes:
                raise ValueError(f"slurm.conf line {lineno}: node {host!r} is defined twice")
            nodes[host] = gpus
    if not nodes:
        raise ValueError("slurm.conf defines no nodes (no NodeName lines)")
    return nodes


def gpus_from_gres(gres: str) -> int:
    """GPUs in a Slurm ``Gres=`` value: ``gpu:8``, ``gpu:a100:8``, ``gpu:a100:4,gpu:v100:4``.

    A bare ``gpu`` (or ``gpu:type``) counts 1; other GRES (``mps:100``) count 0;
    socket bindings such as ``gpu:8(S:0-1)`` are ignored.
    """
    total = 0
    for item in _split_outside_parens(gres.strip().strip('"')):
        fields = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if fields[0].strip().lower() != "gpu":
            continue
        total += _gres_count(fields[-1]) if len(fields) > 1 else 1
    return total


@dataclass(frozen=True, slots=True)
class _Switch:
    name: str
    nodes: tuple[str, ...]
    children: tuple[str, ...]
    lineno: int


@dataclass(frozen=True, slots=True)
class _Units:
    """What a topology file defines: switches (tree), base blocks and BlockSizes (block)."""

    switches: Mapping[str, _Switch]
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    block_sizes: tuple[int, ...] = ()


def _parse_topology_units(text: str, *, blocks: bool = False) -> _Units:
    """The switches of a topology.conf text and, with ``blocks`` (topology/block), its
    ``BlockName=NAME Nodes=...`` and ``BlockSizes=N,...`` lines (topology.conf(5))."""
    switches: dict[str, _Switch] = {}
    found: dict[str, tuple[str, ...]] = {}
    sizes: tuple[int, ...] = ()
    for lineno, pairs in _conf_lines(text, "topology.conf"):
        key, value = pairs[0]
        fields = dict(pairs[1:])
        if blocks and key == "blocksizes":
            sizes = _block_sizes(value.split(","), f"topology.conf line {lineno}")
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
            sw = _Switch(
                value,
                tuple(expand(fields.get("nodes", ""))),
                tuple(expand(fields.get("switches", ""))),
                lineno,
            )
        except ValueError as exc:
            raise ValueError(f"topology.conf line {lineno}: {exc}") from None
        switches[value] = sw
    return _Units(switches, tuple(found.items()), sizes)


def _block_sizes(values: Iterable[object], what: str) -> tuple[int, ...]:
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


def _tree(
    units: _Units, node_gpus: Mapping[str, int]
) -> tuple[dict[str, list[str]], dict[str, str | None], dict[str, str | None]]:
    """Leaf switch -> its nodes (definition order, implicit leaf last), leaf -> parent and
    leaf -> the root switch of its tree (None for the implicit leaf: in no switch). Without
    switches but with blocks, each base block is a leaf (one tree for all)."""
    switches = units.switches
    if not switches and units.blocks:
        switches = {name: _Switch(name, hosts, (), 0) for name, hosts in units.blocks if hosts}
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
        implicit = _fresh(IMPLICIT_LEAF, switches)
        members[implicit] = orphans
        leaf_parent[implicit] = None
        leaf_root[implicit] = "" if one_tree else None
    return members, leaf_parent, leaf_root


def _parse_topology_conf(
    text: str, node_gpus: Mapping[str, int]
) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    """Leaf switch -> its nodes (definition order, implicit leaf last) and leaf -> parent."""
    members, leaf_parent, _ = _tree(_parse_topology_units(text), node_gpus)
    return members, leaf_parent


def _root(switch: str, parent: Mapping[str, str]) -> str:
    while switch in parent:
        switch = parent[switch]
    return switch


@dataclass(frozen=True, slots=True)
class _Rules:
    """What ``_build`` adds to a Topology for Slurm's topology rules (names, not indices)."""

    plugin: str
    params: frozenset[str]
    blocks: tuple[tuple[str, tuple[str, ...]], ...]
    block_sizes: tuple[int, ...]
    leaf_root: Mapping[str, str | None]


def _rules(
    plugin: str,
    params: frozenset[str],
    units: _Units,
    leaf_root: Mapping[str, str | None],
    node_gpus: Mapping[str, int],
) -> _Rules:
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
    return _Rules(plugin, params, blocks, units.block_sizes, leaf_root)


# ---------------------------------------------------------------- topology.yaml and scontrol

_YAML_KINDS = ("block", "flat", "ring", "torus3d", "tree")


def _parse_topology_yaml(text: str, node_gpus: Mapping[str, int]) -> tuple[str, _Units]:
    """The plugin kind and units of a topology.yaml text's cluster-default topology
    (topology.yaml(5): a list of topologies, each ``topology: NAME``, ``cluster_default``
    and exactly one of ``block`` (``block_sizes``, ``blocks: [{block, nodes}]``), ``flat``,
    ``ring``, ``torus3d``, ``tree`` (``switches: [{switch, children, nodes}]``); Slurm uses
    the first with ``cluster_default: true`` for partitions that name none, else the first).
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"topology.yaml: not YAML: {exc}") from None
    if not isinstance(doc, list) or not doc or not all(isinstance(t, dict) for t in doc):
        raise ValueError("topology.yaml: expected a list of topologies (- topology: NAME ...)")
    chosen = next((t for t in doc if t.get("cluster_default") is True), doc[0])
    name = chosen.get("topology")
    kinds = [k for k in _YAML_KINDS if k in chosen]
    if not isinstance(name, str) or len(kinds) != 1:
        raise ValueError(
            f"topology.yaml: topology {name!r} needs a name and exactly one of {_YAML_KINDS}"
        )
    kind, body = kinds[0], chosen[kinds[0]]
    what = f"topology.yaml: topology {name!r}"
    if kind == "tree":
        return kind, _Units(_yaml_switches(body, what))
    if kind == "block":
        if not isinstance(body, dict) or not isinstance(body.get("blocks"), list):
            raise ValueError(f"{what}: block needs a list of blocks")
        blocks: dict[str, tuple[str, ...]] = {}
        for item in body["blocks"]:
            block, nodes = _yaml_item(item, "block", what)
            if block in blocks:
                raise ValueError(f"{what}: block {block!r} is defined twice")
            blocks[block] = tuple(expand(nodes))
        raw = body.get("block_sizes")
        sizes = () if raw is None else _block_sizes(_yaml_list(raw, what), what)
        return kind, _Units({}, tuple(blocks.items()), sizes)
    return kind, _Units({})


def _yaml_switches(body: object, what: str) -> dict[str, _Switch]:
    if not isinstance(body, dict) or not isinstance(body.get("switches"), list):
        raise ValueError(f"{what}: tree needs a list of switches")
    switches: dict[str, _Switch] = {}
    for k, item in enumerate(body["switches"], start=1):
        switch, nodes = _yaml_item(item, "switch", what)
        children = str(item.get("children") or "")
        if switch in switches:
            raise ValueError(f"{what}: switch {switch!r} is defined twice")
        try:
            switches[switch] = _Switch(switch, tuple(expand(nodes)), tuple(expand(children)), k)
        except ValueError as exc:
            raise ValueError(f"{what}: switch {switch!r}: {exc}") from None
    return switches


def _yaml_item(item: object, key: str, what: str) -> tuple[str, str]:
    """``{KEY: NAME, nodes: HOSTLIST}`` -> (NAME, HOSTLIST); a list of nodes is joined."""
    if not isinstance(item, dict) or not isinstance(item.get(key), str):
        raise ValueError(f"{what}: each entry needs {key}: NAME, got {item!r}")
    nodes = item.get("nodes") or ""
    if isinstance(nodes, list):
        nodes = ",".join(str(n) for n in nodes)
    return item[key], str(nodes)


def _yaml_list(raw: object, what: str) -> Sequence[object]:
    if isinstance(raw, list):
        return raw
    if isinstance(raw, (int, str)):
        return str(raw).split(",")
    raise ValueError(f"{what}: block_sizes must be a list of node counts")


def parse_scontrol_topology(text: str) -> tuple[str, str]:
    """``scontrol show topology`` output -> (plugin kind, the topology.conf text it stands
    for): tree lines ``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=... Switches=...``, block lines
    ``BlockName=b1 BlockIndex=0 Nodes=... BlockSize=2`` and ``AggregatedBlock=b1,b2
    BlockIndex=2 Nodes=... BlockSize=4`` (Slurm's topology_tree.c/topology_block.c
    ``_print_topo_record``); the BlockSizes are the base block's size and the aggregated
    ones' (levels beyond the cluster are not printed, and change nothing: a request that
    large spans the whole topology either way)."""
    kind = ""
    lines: list[str] = []
    sizes: list[int] = []
    for lineno, pairs in _conf_lines(text, "scontrol show topology"):
        key, value = pairs[0]
        fields = dict(pairs[1:])
        nodes = fields.get("nodes", "")
        if key == "switchname":
            kind = kind or "tree"
            line = f"SwitchName={value}"
            line += f" Nodes={nodes}" if nodes else ""
            line += f" Switches={fields['switches']}" if fields.get("switches") else ""
            lines.append(line)
        elif key in ("blockname", "aggregatedblock"):
            kind = kind or "block"
            size = fields.get("blocksize", "")
            if not size.isdigit():
                raise ValueError(f"scontrol show topology line {lineno}: no BlockSize")
            sizes.append(int(size))
            if key == "blockname":
                lines.append(f"BlockName={value} Nodes={nodes}" if nodes else f"BlockName={value}")
        else:
            raise ValueError(f"scontrol show topology line {lineno}: unknown record {key}=")
    if kind != ("block" if sizes else kind):
        raise ValueError("scontrol show topology: both switches and blocks")
    if sizes:
        lines.append("BlockSizes=" + ",".join(str(s) for s in sorted(set(sizes))))
    return kind or "flat", "\n".join(lines) + ("\n" if lines else "")


def topology_differences(topo: Topology, scontrol_text: str) -> list[str]:
    """How ``topo`` (from the configuration files) differs from what ``scontrol show
    topology`` says Slurm uses: plugin kind, leaf switches' nodes, base blocks' nodes,
    BlockSizes; [] when they agree."""
    kind, conf = parse_scontrol_topology(scontrol_text)
    diffs: list[str] = []
    if topo.plugin not in (kind, ""):
        diffs.append(f"plugin: configured {topo.plugin!r}, scontrol shows {kind!r}")
        return diffs
    units = _parse_topology_units(conf, blocks=kind == "block")
    names = [n.name for n in topo.nodes]
    if kind == "tree":
        ours = {
            leaf: compress([names[i] for i in members])
            for leaf, members in zip(topo.leaf_names, topo.leaf_nodes, strict=True)
            if leaf != IMPLICIT_LEAF
        }
        theirs = {sw.name: compress(list(sw.nodes)) for sw in units.switches.values() if sw.nodes}
        if ours != theirs:
            diffs.append(f"leaf switches: configured {ours}, scontrol shows {theirs}")
    if kind == "block":
        ours_b = [(b.name, compress([names[i] for i in b.nodes])) for b in topo.blocks]
        theirs_b = [(name, compress(list(hosts))) for name, hosts in units.blocks]
        if ours_b != theirs_b:
            diffs.append(f"blocks: configured {ours_b}, scontrol shows {theirs_b}")
        mine = _effective_sizes(topo.block_sizes, topo.blocks, len(topo.blocks))
        shown = _effective_sizes(units.block_sizes, topo.blocks, len(topo.blocks))
        if mine != shown:
            diffs.append(f"block sizes: configured {mine}, scontrol shows {shown}")
    return diffs


def _effective_sizes(sizes: Sequence[int], blocks: Sequence[Block], n_blocks: int) -> list[int]:
    """The block sizes that matter on ``n_blocks`` base blocks (up to the first that holds
    them all), with Slurm's default (base block, 2, 4, 8 base blocks) when none are given."""
    base = sizes[0] if sizes else (len(blocks[0].nodes) if blocks else 1)
    all_sizes = list(sizes) or [base * (1 << k) for k in range(4)]
    out: list[int] = []
    for size in all_sizes:
        out.append(size)
        if size // base >= n_blocks:
            break
    return out


# ---------------------------------------------------------------- Alibaba Lingjun CSV


@dataclass(frozen=True, slots=True)
class AlibabaHost:
    """One host of the Alibaba Lingjun topology file: our short name and its place in the tree."""

    name: str  # h001.., numbered in topology order
    host_id: str  # the anonymised id in the file (column ``ip``)
    core: str  # DSW
    agg: str  # PSW
    tor: str  # ASW; ToR names are local to their PSW (``S1`` exists under each PSW)


def read_alibaba_hosts(path: str | Path) -> tuple[AlibabaHost, ...]:
    """Hosts of an ``ip,DSW,PSW,ASW`` file, in topology order (core, agg, ToR, file order).

    Names ``h001``.. follow that order, so one ToR's hosts have consecutive names and
    compress to one hostlist range.
    """
    rows: list[tuple[str, str, str, str]] = []
    with Path(path).open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"ip", "DSW", "PSW", "ASW"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)} (need ip,DSW,PSW,ASW)")
        for lineno, row in enumerate(reader, start=2):
            values = tuple((row[k] or "").strip() for k in ("ip", "DSW", "PSW", "ASW"))
            if not all(values):
                raise ValueError(f"{path} line {lineno}: empty field in {values}")
            rows.append((values[0], values[1], values[2], values[3]))
    if not rows:
        raise ValueError(f"{path}: no hosts")
    dupes = [ip for ip, n in Counter(r[0] for r in rows).items() if n > 1]
    if dupes:
        raise ValueError(f"{path}: host ids listed twice: {dupes[:5]}")
    order = sorted(
        range(len(rows)),
        key=lambda i: (
            natural_key(rows[i][1]),
            natural_key(rows[i][2]),
            natural_key(rows[i][3]),
            i,
        ),
    )
    width = len(str(len(rows)))
    return tuple(AlibabaHost(f"h{k + 1:0{width}d}", *rows[i]) for k, i in enumerate(order))


def from_alibaba_csv(
    path: str | Path,
    *,
    gpus_per_node: int = 8,
    nic_gbps: float = DEFAULT_NIC_GBPS,
    intra_gbps: float = DEFAULT_INTRA_GBPS,
    intra_kind: IntraKind = "nvlink",
    oversub: float = 1.0,
    agg_oversub: float = 1.0,
    name: str | None = None,
) -> Topology:
    """Build a topology from the Alibaba Lingjun ``ip,DSW,PSW,ASW`` file.

    Leaf = ToR (ASW) identified by (DSW, PSW, ASW), since ToR names repeat across
    PSWs; aggregation = PSW; the DSW is the core. Leaf names are ``PSW/ASW`` (with
    ``DSW/`` in front when the file has several cores).
    """
    if gpus_per_node < 0:
        raise ValueError(f"gpus_per_node must be >= 0, got {gpus_per_node}")
    _check_rates(nic_gbps=nic_gbps, intra_gbps=intra_gbps, oversub=oversub, agg_oversub=agg_oversub)
    hosts = read_alibaba_hosts(path)
    several_cores = len({h.core for h in hosts}) > 1

    def agg_name(h: AlibabaHost) -> str:
        return f"{h.core}/{h.agg}" if several_cores else h.agg

    members: dict[str, list[str]] = {}
    leaf_parent: dict[str, str | None] = {}
    for h in hosts:
        leaf = f"{agg_name(h)}/{h.tor}"
        members.setdefault(leaf, []).append(h.name)
        leaf_parent[leaf] = agg_name(h)
    return _build(
        name=name if name is not None else str(path),
        node_gpus={h.name: gpus_per_node for h in hosts},
        leaf_members=members,
        leaf_parent=leaf_parent,
        nic_gbps=nic_gbps,
        intra_gbps=intra_gbps,
        intra_kind=intra_kind,
        oversub=oversub,
        agg_oversub=agg_oversub,
    )


# ---------------------------------------------------------------- dispatch and summary

_FILE_KEYS = {"nic", "intra", "pcie", "nvlink", "oversub", "agg_oversub", "gpus"}
_FORMS = (
    "accepted forms: a spec NODESxGPUS[,key=value...] (e.g. 64x8,leaf=16,oversub=2); "
    "a directory holding slurm.conf (and optionally topology.conf); a slurm.conf file; "
    "an Alibaba ip,DSW,PSW,ASW .csv file; a path may be followed by "
    ",nic=GBPS,intra=GBPS,pcie,oversub=X,agg_oversub=X (and gpus=N for a .csv)"
)


def load_topology(arg: str) -> Topology:
    """A topology from a spec, a Slurm config directory or file, or an Alibaba CSV.

    See the module docstring for the forms; raises ``ValueError`` listing them when
    ``arg`` matches none.
    """
    text = arg.strip()
    path, opts = Path(text), ""
    if not path.exists() and "," in text:
        head, _, opts = text.partition(",")
        path = Path(head.strip())
    if not path.exists():
        if re.fullmatch(r"\s*\d+\s*[xX]\s*\d+\s*", text.partition(",")[0]):
            return from_spec(text)
        raise ValueError(f"cluster {arg!r}: not a spec and no such file or directory; {_FORMS}")
    opt = _file_options(opts, arg)
    if path.is_dir():
        conf = path / "slurm.conf"
        if not conf.is_file():
            raise ValueError(f"cluster {arg!r}: directory has no slurm.conf; {_FORMS}")
    elif path.suffix.lower() == ".csv":
        return from_alibaba_csv(
            path,
            gpus_per_node=8 if opt.gpus_per_node is None else opt.gpus_per_node,
            nic_gbps=opt.nic_gbps,
            intra_gbps=opt.intra,
            intra_kind=opt.intra_kind,
            oversub=opt.oversub,
            agg_oversub=opt.agg_oversub,
            name=str(path),
        )
    elif path.name == "topology.conf":
        raise ValueError(f"cluster {arg!r}: give slurm.conf or its directory; {_FORMS}")
    else:
        conf = path
    if opt.gpus_per_node is not None:
        raise ValueError(f"cluster {arg!r}: gpus= only applies to a .csv (slurm.conf has Gres)")
    topo_file = conf.parent / "topology.conf"
    yaml_file = conf.parent / "topology.yaml"
    return from_slurm_conf(
        conf.read_text(),
        topo_file.read_text() if topo_file.is_file() else None,
        topology_yaml=yaml_file.read_text() if yaml_file.is_file() else None,
        nic_gbps=opt.nic_gbps,
        intra_gbps=opt.intra,
        intra_kind=opt.intra_kind,
        oversub=opt.oversub,
        agg_oversub=opt.agg_oversub,
        name=str(path),
    )


def describe(topo: Topology) -> dict[str, object]:
    """Counts for display: nodes, GPUs, leaves, aggregation switches, bandwidth ranges."""
    leaf_sizes = [len(m) for m in topo.leaf_nodes]
    finite_agg = [g for g in topo.agg_uplink_gbps if math.isfinite(g)]
    return {
        "name": topo.name,
        "nodes": len(topo.nodes),
        "gpus": topo.total_gpus,
        "leaves": len(topo.leaf_names),
        "aggs": len(topo.agg_names),
        "gpus_per_node": dict(sorted(Counter(n.gpus for n in topo.nodes).items())),
        "nodes_per_leaf_min": min(leaf_sizes),
        "nodes_per_leaf_max": max(leaf_sizes),
        "nic_gbps_min": min(n.nic_gbps for n in topo.nodes),
        "nic_gbps_max": max(n.nic_gbps for n in topo.nodes),
        "leaf_uplink_gbps_min": min(topo.leaf_uplink_gbps),
        "leaf_uplink_gbps_max": max(topo.leaf_uplink_gbps),
        "agg_uplink_gbps_min": min(finite_agg) if finite_agg else None,
        "agg_uplink_gbps_max": max(finite_agg) if finite_agg else None,
    }


# ---------------------------------------------------------------- helpers


def _build(
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
    rules: _Rules | None = None,
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
    spine = _fresh(IMPLICIT_SPINE, {p for p in parents if p is not None} | set(leaf_names))
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


_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)')


def _conf_lines(
    text: str, what: str, strict: frozenset[str] | None = None
) -> Iterable[tuple[int, list[tuple[str, str]]]]:
    """Slurm-style config lines as ``(line number, [(lower-case key, value), ...])``.

    Comments (``#``) and blank lines are skipped, ``\\`` at the end of a line joins the
    next one, ``Include`` lines are skipped (the caller passes texts, not paths). A line
    that does not parse raises, unless ``strict`` is given and its key is not in it.
    """
    pending = ""
    start = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line or line.lower().startswith("include "):
            continue
        pairs: list[tuple[str, str]] = []
        pos = 0
        for match in _PAIR.finditer(line):
            if line[pos : match.start()].strip():
                break
            pairs.append((match.group(1).lower(), match.group(2).strip('"')))
            pos = match.end()
        if not pairs or line[pos:].strip():
            first = line.split("=", 1)[0].strip().lower()
            if strict is not None and first not in strict:
                continue
            raise ValueError(f"{what} line {start}: cannot parse {line!r} (expected Key=Value ...)")
        yield start, pairs


def _split_outside_parens(text: str) -> list[str]:
    """Split at commas that are not inside parentheses; drop empty items."""
    out: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
    out.append("".join(current))
    return [item for item in out if item.strip()]


_GRES_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _gres_count(field: str) -> int:
    """The count field of a GRES item (``8``, ``2k``); a non-numeric field (a type) means 1."""
    match = re.fullmatch(r"(\d+)([kKmMgGtT]?)", field.strip())
    if match is None:
        return 1
    return int(match.group(1)) * _GRES_SUFFIX[match.group(2).lower()]


def _check_rates(**rates: float) -> None:
    for key, value in rates.items():
        if not 0 < value < math.inf:
            raise ValueError(f"{key} must be positive and finite, got {value}")


def _fresh(name: str, taken: Iterable[str]) -> str:
    """``name``, or ``name-2``, ``name-3``... if it is already taken."""
    used = set(taken)
    candidate, k = name, 1
    while candidate in used:
        k += 1
        candidate = f"{name}-{k}"
    return candidate


@dataclass(frozen=True, slots=True)
class _FileOptions:
    nic_gbps: float = DEFAULT_NIC_GBPS
    intra_gbps: float | None = None
    intra_kind: IntraKind = "nvlink"
    oversub: float = 1.0
    agg_oversub: float = 1.0
    gpus_per_node: int | None = None

    @property
    def intra(self) -> float:
        if self.intra_gbps is not None:
            return self.intra_gbps
        return PCIE_GBPS if self.intra_kind == "pcie" else DEFAULT_INTRA_GBPS


def _file_options(opts: str, arg: str) -> _FileOptions:
    """Builder options from ``nic=25,oversub=2,pcie,...``."""
    values = _options(opts.split(","), _FILE_KEYS, f"cluster {arg!r}")
    try:
        return _FileOptions(
            nic_gbps=float(values.get("nic", DEFAULT_NIC_GBPS)),
            intra_gbps=float(values["intra"]) if "intra" in values else None,
            intra_kind="pcie" if "pcie" in values else "nvlink",
            oversub=float(values.get("oversub", 1.0)),
            agg_oversub=float(values.get("agg_oversub", 1.0)),
            gpus_per_node=int(values["gpus"]) if "gpus" in values else None,
        )
    except ValueError as exc:
        raise ValueError(f"cluster {arg!r}: bad option value: {exc}") from None
