"""``load_topology``: a topology from one string (what the CLI takes), and ``describe``."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from linkwise.cluster.domain import Topology
from linkwise.cluster.topology.build import IntraKind, with_ecmp
from linkwise.cluster.topology.lingjun import from_alibaba_csv
from linkwise.cluster.topology.slurm_conf import from_slurm_conf
from linkwise.cluster.topology.spec import (
    DEFAULT_INTRA_GBPS,
    DEFAULT_NIC_GBPS,
    PCIE_GBPS,
    check_ecmp,
    from_spec,
    parse_options,
)

_FILE_KEYS = {
    "nic", "intra", "pcie", "nvlink", "oversub", "agg_oversub", "gpus", "ecmp", "spines", "cores"
}  # fmt: skip
_FORMS = (
    "accepted forms: a spec NODESxGPUS[,key=value...] (e.g. 64x8,leaf=16,oversub=2); "
    "a directory holding slurm.conf (and optionally topology.conf); a slurm.conf file; "
    "an Alibaba ip,DSW,PSW,ASW .csv file; a path may be followed by "
    ",nic=GBPS,intra=GBPS,pcie,oversub=X,agg_oversub=X,ecmp=1,spines=N,cores=N "
    "(and gpus=N for a .csv)"
)


def load_topology(arg: str) -> Topology:
    """A topology from a spec, a Slurm config directory or file, or an Alibaba CSV.

    See the package docstring for the forms; raises ``ValueError`` listing them when
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
    topo = _from_file(path, opt, arg)
    if not opt.ecmp:
        return topo
    return with_ecmp(
        topo,
        oversub=opt.oversub,
        agg_oversub=opt.agg_oversub,
        spines=opt.spines,
        cores=opt.cores,
    )


def _from_file(path: Path, opt: _FileOptions, arg: str) -> Topology:
    """The pooled topology of a Slurm configuration or an Alibaba CSV (``load_topology``)."""
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
    """Counts for display: nodes, GPUs, leaves, aggregation switches, bandwidth ranges (and,
    where the fabric has them, its ECMP planes per tier and its rails)."""
    leaf_sizes = [len(m) for m in topo.leaf_nodes]
    finite_agg = [g for g in topo.agg_uplink_gbps if math.isfinite(g)]
    fabric = {
        key: value
        for key, value in (
            ("ecmp_spines", topo.ecmp_spines),
            ("ecmp_cores", topo.ecmp_cores),
            ("rails", topo.rails),
        )
        if value
    }
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
        **fabric,
    }


@dataclass(frozen=True, slots=True)
class _FileOptions:
    nic_gbps: float = DEFAULT_NIC_GBPS
    intra_gbps: float | None = None
    intra_kind: IntraKind = "nvlink"
    oversub: float = 1.0
    agg_oversub: float = 1.0
    gpus_per_node: int | None = None
    ecmp: bool = False
    spines: int = 0
    cores: int = 0

    @property
    def intra(self) -> float:
        if self.intra_gbps is not None:
            return self.intra_gbps
        return PCIE_GBPS if self.intra_kind == "pcie" else DEFAULT_INTRA_GBPS


def _file_options(opts: str, arg: str) -> _FileOptions:
    """Builder options from ``nic=25,oversub=2,pcie,...``."""
    values = parse_options(opts.split(","), _FILE_KEYS, f"cluster {arg!r}")
    try:
        ecmp = int(values.get("ecmp", 0))
        spines = int(values.get("spines", 0))
        cores = int(values.get("cores", 0))
    except ValueError as exc:
        raise ValueError(f"cluster {arg!r}: bad option value: {exc}") from None
    check_ecmp(ecmp, spines, cores, f"cluster {arg!r}")
    try:
        return _FileOptions(
            nic_gbps=float(values.get("nic", DEFAULT_NIC_GBPS)),
            intra_gbps=float(values["intra"]) if "intra" in values else None,
            intra_kind="pcie" if "pcie" in values else "nvlink",
            oversub=float(values.get("oversub", 1.0)),
            agg_oversub=float(values.get("agg_oversub", 1.0)),
            gpus_per_node=int(values["gpus"]) if "gpus" in values else None,
            ecmp=bool(ecmp),
            spines=spines,
            cores=cores,
        )
    except ValueError as exc:
        raise ValueError(f"cluster {arg!r}: bad option value: {exc}") from None
