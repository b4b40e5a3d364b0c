"""The sample frame every telemetry reader produces (``SAMPLE_SCHEMA``)."""

from __future__ import annotations

import polars as pl

SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64(),
    "host": pl.String(),
    "metric": pl.String(),
    "labels": pl.String(),
    "value": pl.Float64(),
    "job": pl.String(),
}
"""Columns of a parsed sample frame (``source`` is added when stored)."""


def samples_frame(
    ts: float, host: str, metrics: list[str], labels: list[str], values: list[float]
) -> pl.DataFrame:
    """Samples of one host read at ``ts`` (``SAMPLE_SCHEMA``; ``labels`` as JSON text): the
    one builder for readers that collect them row by row (sysfs, perfquery)."""
    n = len(values)
    return pl.DataFrame(
        {
            "ts": [ts] * n,
            "host": [host] * n,
            "metric": metrics,
            "labels": labels,
            "value": values,
            "job": [None] * n,
        },
        schema=SAMPLE_SCHEMA,
    )
