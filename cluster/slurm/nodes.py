"""Per-node records (``scontrol --json show nodes``, 22.05's ``sinfo --json``,
``/slurm/VERSION/nodes``) -> ``NodeInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linkwise.cluster.slurm.document import (
    UNREADABLE,
    int_or_zero,
    raise_errors,
    record_list,
    unreadable_record,
)
from linkwise.cluster.slurm.gpu_counts import gres_gpus
from linkwise.cluster.slurm.records import NodeInfo
from linkwise.cluster.slurm.schema import SlurmSchemaError, generation, node_state_text


def parse_nodes(doc: Mapping[str, Any]) -> list[NodeInfo]:
    """Nodes of a document with per-node records: 22.05's ``sinfo --json``, ``scontrol
    --json show nodes`` (23.02+) or ``/slurm/VERSION/nodes``. (From 23.02 ``sinfo --json``
    groups nodes by partition and state under ``sinfo`` instead: refused, naming the
    command to use.)"""
    raise_errors(doc, "nodes")
    generation(doc, "nodes")
    if "nodes" not in doc and isinstance(doc.get("sinfo"), list):
        raise SlurmSchemaError(
            "nodes: this sinfo --json groups nodes by partition and state (Slurm 23.02+): "
            "read per-node records from `scontrol --json show nodes`"
        )
    out: list[NodeInfo] = []
    for node in record_list(doc, "nodes"):
        try:
            out.append(_node_info(node))
        except UNREADABLE as exc:
            raise unreadable_record("nodes: node", node, "name", exc) from exc
    return out


def _node_info(node: Mapping[str, Any]) -> NodeInfo:
    return NodeInfo(
        name=str(node["name"]),
        state=node_state_text(node.get("state"), node.get("state_flags")),
        partitions=tuple(str(p) for p in node.get("partitions") or []),
        cpus=int_or_zero(node.get("cpus")),
        gpus_total=gres_gpus(str(node.get("gres") or "")),
        gpus_used=gres_gpus(str(node.get("gres_used") or "")),
        cpus_alloc=int_or_zero(node.get("alloc_cpus")),
        memory_mb=int_or_zero(node.get("real_memory")),
        memory_alloc_mb=int_or_zero(node.get("alloc_memory")),
        features=_features(node.get("active_features") or node.get("features")),
    )


def _features(value: Any) -> tuple[str, ...]:
    """A node's features: a comma-separated string (22.05) or a list (later versions)."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return tuple(str(f).strip() for f in items if str(f).strip())
