"""The compact cluster spec (``64x8,leaf=16,oversub=2``) and the defaults every builder
shares.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from linkwise.cluster.domain import Node, Topology

DEFAULT_NIC_GBPS = 12.5  # 100 Gb/s (EDR InfiniBand / 100GbE)
DEFAULT_INTRA_GBPS = 150.0  # NVLink (V100-class aggregate)
PCIE_GBPS = 12.0  # PCIe Gen3 x16, effective
DEFAULT_NODES_PER_LEAF = 16
# the one default cluster of every command, experiment and deployment that needs one
DEFAULT_TOPOLOGY = "16x8,leaf=4"

_SPEC_KEYS = {
    "leaf", "nic", "intra", "oversub", "pcie", "nvlink", "agg", "agg_oversub", "ecmp", "spines",
    "cores", "rails",
}  # fmt: skip


def ecmp_planes(nodes_under: int, oversub: float) -> int:
    """The default number of parallel uplinks of a switch under ECMP: its pooled uplink over
    the NIC speed (``nodes_under / oversub``), rounded, at least 1, so each carries one NIC's
    traffic. Every builder's default for ``spines`` (leaf tier) and ``cores`` (aggregation)."""
    return max(1, round(nodes_under / oversub))


def check_ecmp(ecmp: int, spines: int, cores: int, what: str) -> None:
    """``ecmp`` is 0 or 1; ``spines`` and ``cores`` are counts that need ``ecmp=1``."""
    if ecmp not in (0, 1) or spines < 0 or cores < 0 or ((spines or cores) and not ecmp):
        raise ValueError(f"{what}: ecmp is 0 or 1; spines, cores >= 1 need ecmp=1")


def parse_options(opts: Iterable[str], known: Collection[str], what: str) -> dict[str, str]:
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
    ``pooled / spines``; with several aggregation switches (``agg``) each one's uplink to the
    core is split the same way into ``cores`` parallel uplinks (``Topology.ecmp_cores``;
    default by the same rule), hashed per flow independently of the leaf tier; ``ecmp=0``
    (default) keeps one pooled uplink per switch.

    ``rails=R`` (R >= 2, at most the GPUs per node) builds a rail-optimised fabric
    (``Topology.rails``): each node has R NICs of ``nic`` GB/s, one per GPU rail; ``leaf``
    nodes form a rail group, in which NIC r of every node hangs off the group's rail switch r;
    the rail switches' uplinks (``leaf * nic / oversub`` each) go to the spine (or to the
    group's aggregation switch, ``agg``), so a ring hop between GPUs of local rank r on two
    nodes crosses only rail r's switch within a group, and rail r's uplinks between groups.
    ``rails=1`` (or 0) is the single-NIC fabric. Not combined with ``ecmp=1``.
    """
    head, *opts = [p.strip() for p in spec.strip().split(",")]
    try:
        n_str, g_str = head.lower().split("x")
        n_nodes, gpus = int(n_str), int(g_str)
    except ValueError:
        raise ValueError(f"bad cluster spec {spec!r}: expected NODESxGPUS, e.g. 64x8") from None
    if n_nodes <= 0 or gpus <= 0:
        raise ValueError(f"bad cluster spec {spec!r}: node and GPU counts must be positive")
    kv = parse_options(opts, _SPEC_KEYS, f"bad cluster spec {spec!r}")
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
        cores = int(kv["cores"]) if "cores" in kv else 0
        rails = int(kv.get("rails", 0))
    except ValueError as exc:
        raise ValueError(f"bad cluster spec {spec!r}: {exc}") from None
    rates = (nic, intra, oversub, agg_oversub)
    if per_leaf <= 0 or leaves_per_agg < 0 or not all(0 < r < math.inf for r in rates):
        raise ValueError(f"bad cluster spec {spec!r}: values must be positive and finite")
    check_ecmp(ecmp, spines, cores, f"bad cluster spec {spec!r}")
    if not 0 <= rails <= gpus or (rails > 1 and ecmp):
        raise ValueError(
            f"bad cluster spec {spec!r}: rails is 0..GPUs per node, and not with ecmp=1"
        )
    rails = rails if rails > 1 else 0
    lanes = max(rails, 1)  # NICs per node
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
            * lanes
            / agg_oversub
            for a in range(n_aggs)
        )
        agg_names = tuple(f"agg{a + 1}" for a in range(n_aggs))
        max_agg_nodes = max(
            sum(leaf_sizes[leaf] for leaf in range(n_leaves) if leaf_agg[leaf] == a)
            for a in range(n_aggs)
        )
        several = n_aggs > 1
    else:
        max_agg_nodes, several = 0, False
        leaf_agg = (0,) * n_leaves
        agg_up = (math.inf,)
        agg_names = ("spine",)
    return Topology(
        name=spec.strip(),
        nodes=nodes,
        leaf_names=tuple(f"leaf{leaf + 1}" for leaf in range(n_leaves)),
        leaf_agg=leaf_agg,
        leaf_uplink_gbps=tuple(size * nic * lanes / oversub for size in leaf_sizes),
        agg_names=agg_names,
        agg_uplink_gbps=agg_up,
        ecmp_spines=(spines or ecmp_planes(max(leaf_sizes), oversub)) if ecmp else 0,
        ecmp_cores=(cores or ecmp_planes(max_agg_nodes, agg_oversub)) if ecmp and several else 0,
        rails=rails,
    )
