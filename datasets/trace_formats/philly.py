"""The Microsoft Philly trace as shipped by petuum/adaptdl:
``timestamp,duration,num_gpus,gpu_time,cluster``. Job ids are the data-row order (0-based);
the virtual cluster becomes ``Job.user`` as ``"vc:<id>"``."""

from __future__ import annotations

import polars as pl

from linkwise.datasets.trace_formats.columns import (
    DATETIME_FORMATS,
    number_of,
    numeric_checks,
    optional_text,
    row_order,
    standard_columns,
    text_of,
)

__all__ = ["philly_columns"]


def philly_columns(table: pl.DataFrame) -> pl.DataFrame:
    stamp = (
        pl.coalesce(
            [
                text_of("timestamp").str.to_datetime(f, strict=False, time_unit="us").dt.epoch("us")
                for f in DATETIME_FORMATS
            ]
        ).cast(pl.Float64)
        / 1e6
    )
    checks = [
        (text_of("timestamp").is_null(), "missing timestamp"),
        (stamp.is_null(), "bad timestamp"),
    ]
    checks += numeric_checks("duration", "num_gpus")
    return standard_columns(
        table,
        checks,
        job_id=row_order(),
        submit=stamp,
        gpus=number_of("num_gpus"),
        duration=number_of("duration"),
        user=optional_text(table, "cluster", "vc:"),
        name=pl.lit(""),
        profile=pl.lit(""),
    )
