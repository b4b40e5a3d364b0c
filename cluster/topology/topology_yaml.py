"""topology.yaml (topology.yaml(5), Slurm 25.05+): its cluster-default topology as the
units topology.conf would give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import yaml  # type: ignore[import-untyped]

from linkwise.cluster.hostlist import expand
from linkwise.cluster.topology.topology_conf import Switch, TopologyUnits, block_sizes

_YAML_KINDS = ("block", "flat", "ring", "torus3d", "tree")


def parse_topology_yaml(text: str, node_gpus: Mapping[str, int]) -> tuple[str, TopologyUnits]:
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
        return kind, TopologyUnits(_yaml_switches(body, what))
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
        sizes = () if raw is None else block_sizes(_yaml_list(raw, what), what)
        return kind, TopologyUnits({}, tuple(blocks.items()), sizes)
    return kind, TopologyUnits({})


def _yaml_switches(body: object, what: str) -> dict[str, Switch]:
    if not isinstance(body, dict) or not isinstance(body.get("switches"), list):
        raise ValueError(f"{what}: tree needs a list of switches")
    switches: dict[str, Switch] = {}
    for k, item in enumerate(body["switches"], start=1):
        switch, nodes = _yaml_item(item, "switch", what)
        children = str(item.get("children") or "")
        if switch in switches:
            raise ValueError(f"{what}: switch {switch!r} is defined twice")
        try:
            switches[switch] = Switch(switch, tuple(expand(nodes)), tuple(expand(children)), k)
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
