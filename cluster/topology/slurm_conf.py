"""A ``Topology`` from Slurm's configuration: slurm.conf's nodes, GPUs and topology plugin,
with topology.yaml or topology.conf (``from_slurm_conf``).
"""

from __future__ import annotations

import re

from linkwise.cluster.domain import Topology
from linkwise.cluster.hostlist import expand
from linkwise.cluster.topology.build import IntraKind, build_topology, check_rates
from linkwise.cluster.topology.conf_lines import conf_lines
from linkwise.cluster.topology.spec import DEFAULT_INTRA_GBPS, DEFAULT_NIC_GBPS
from linkwise.cluster.topology.topology_conf import leaf_tree, parse_topology_units, plugin_rules
from linkwise.cluster.topology.topology_yaml import parse_topology_yaml


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
    check_rates(nic_gbps=nic_gbps, intra_gbps=intra_gbps, oversub=oversub, agg_oversub=agg_oversub)
    node_gpus = parse_slurm_nodes(slurm_conf)
    plugin, params = slurm_topology_plugin(slurm_conf)
    if topology_yaml is not None:
        plugin, units = parse_topology_yaml(topology_yaml, node_gpus)
    else:
        units = parse_topology_units(topology_conf or "", blocks=plugin == "block")
    leaf_members, leaf_parent, leaf_root = leaf_tree(units, node_gpus)
    return build_topology(
        name=name,
        node_gpus=node_gpus,
        leaf_members=leaf_members,
        leaf_parent=leaf_parent,
        nic_gbps=nic_gbps,
        intra_gbps=intra_gbps,
        intra_kind=intra_kind,
        oversub=oversub,
        agg_oversub=agg_oversub,
        rules=plugin_rules(plugin, params, units, leaf_root, node_gpus),
    )


def slurm_topology_plugin(slurm_conf: str) -> tuple[str, frozenset[str]]:
    """The topology plugin of a slurm.conf text (``TopologyPlugin=topology/tree`` -> "tree";
    absent, ``none`` or ``default``: "flat", as Slurm's read_config does) and its
    ``TopologyParam=`` values (lower case)."""
    plugin, params = "", ""
    for _lineno, pairs in conf_lines(
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
    for lineno, pairs in conf_lines(slurm_conf, "slurm.conf", frozenset({"nodename"})):
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
