"""Partitions (``/slurm/VERSION/partitions`` JSON, ``scontrol -o show partition`` text)
-> ``PartitionInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.document import UNREADABLE, raise_errors, record_list, unreadable_record
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import PartitionInfo
from linkwise.cluster.slurm.schema import generation


def parse_partitions(doc: Mapping[str, Any]) -> list[PartitionInfo]:
    """Partitions of a ``/slurm/VERSION/partitions`` document: v0.0.38 writes ``nodes`` and
    ``state`` as text; v0.0.40+ ``nodes: {configured, ...}`` and ``partition: {state: [..]}``.
    """
    raise_errors(doc, "partitions")
    generation(doc, "partitions")
    out: list[PartitionInfo] = []
    for p in record_list(doc, "partitions"):
        try:
            out.append(_partition_info(p))
        except UNREADABLE as exc:
            raise unreadable_record("partitions: partition", p, "name", exc) from exc
    return out


def _partition_info(p: Mapping[str, Any]) -> PartitionInfo:
    nodes = p.get("nodes")
    if isinstance(nodes, Mapping):
        nodes = nodes.get("configured")
    if nodes is not None and not isinstance(nodes, str):
        raise TypeError("nodes is neither text nor {configured: text}")
    state = p.get("state")
    inner = p.get("partition")
    if state is None and isinstance(inner, Mapping):
        state = inner.get("state")
    words = state if isinstance(state, list) else [state or "UNKNOWN"]
    return PartitionInfo(
        name=str(p["name"]),
        nodes=tuple(expand(nodes)) if nodes else (),
        state="+".join(str(w).upper() for w in words) or "UNKNOWN",
    )


def parse_scontrol_partitions(text: str) -> list[PartitionInfo]:
    """Partitions of ``scontrol -o show partition`` (one ``Key=Value ...`` record a line)."""
    out: list[PartitionInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" not in fields:
            raise SlurmError(f"scontrol show partition: unexpected line {line[:80]!r}")
        nodes = fields.get("Nodes", "")
        out.append(
            PartitionInfo(
                name=fields["PartitionName"],
                nodes=tuple(expand(nodes)) if nodes and nodes != "(null)" else (),
                state=fields.get("State", "UNKNOWN").upper(),
            )
        )
    return out
