"""A ``Topology`` from the Alibaba Lingjun ``ip,DSW,PSW,ASW`` CSV."""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from linkwise.cluster.domain import Topology
from linkwise.cluster.hostlist import natural_key
from linkwise.cluster.topology.build import IntraKind, build_topology, check_rates
from linkwise.cluster.topology.spec import DEFAULT_INTRA_GBPS, DEFAULT_NIC_GBPS


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
    check_rates(nic_gbps=nic_gbps, intra_gbps=intra_gbps, oversub=oversub, agg_oversub=agg_oversub)
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
    return build_topology(
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
