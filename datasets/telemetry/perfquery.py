"""``perfquery -x`` (and ``-E``) output as samples."""

from __future__ import annotations

import json
import re
import time

import polars as pl

from linkwise.datasets.telemetry.samples import samples_frame

_PQ_HEADER = re.compile(r"^#\s*(.*?counters):\s*Lid\s+(\d+)\s+port\s+(\d+)", re.IGNORECASE)
_PQ_FIELD = re.compile(r"^([A-Za-z0-9_]+):\.*\s*(\S+)\s*$")
_PQ_SKIP = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})


def parse_perfquery(text: str, *, host: str, ts: float | None = None) -> pl.DataFrame:
    """Parse ``perfquery -x`` (and ``-E``) output into samples named ``ib_perfquery_<Field>``
    with labels lid, port and block; values are the raw counters (data fields in 4-byte
    words)."""
    now = time.time() if ts is None else ts
    metrics: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    lbl: str | None = None
    for line in text.splitlines():
        header = _PQ_HEADER.match(line)
        if header:
            block = header.group(1).strip().lower().replace(" ", "_")
            lbl = json.dumps({"lid": header.group(2), "port": header.group(3), "block": block})
            continue
        field = _PQ_FIELD.match(line)
        if field is None or lbl is None or field.group(1) in _PQ_SKIP:
            continue
        try:
            value = float(int(field.group(2), 0))
        except ValueError:
            continue
        metrics.append(f"ib_perfquery_{field.group(1)}")
        labels.append(lbl)
        values.append(value)
    return samples_frame(now, host, metrics, labels, values)
