"""Helios/Acme (SenseTime, Shanghai AI Lab) Slurm logs: ``job_id,user,vc,gpu_num,cpu_num,
node_num,state,submit_time,start_time,end_time,duration,queue``. ``submit_time`` is a
``YYYY-MM-DD HH:MM:SS`` wall time or epoch seconds. CPU jobs (``gpu_num`` 0) are rejected.
When some job id is not an integer, job ids become the data-row order and the original
id is kept in ``Job.name``."""

from __future__ import annotations

import polars as pl

from linkwise.datasets.trace_formats.columns import (
    as_int,
    epoch_seconds,
    number_of,
    numeric_checks,
    optional_text,
    row_order,
    standard_columns,
    text_of,
)

__all__ = ["helios_columns"]


def helios_columns(table: pl.DataFrame) -> pl.DataFrame:
    ids = as_int(number_of("job_id"))
    numeric_ids = bool(table.select((ids.is_not_null() | text_of("job_id").is_null()).all()).item())
    submit = epoch_seconds("submit_time")
    checks = [
        (text_of("job_id").is_null(), "missing job_id"),
        (text_of("submit_time").is_null(), "missing submit_time"),
        (submit.is_null(), "bad submit_time"),
        *numeric_checks("gpu_num", "duration"),
    ]
    return standard_columns(
        table,
        checks,
        job_id=ids if numeric_ids else row_order(),
        submit=submit,
        gpus=number_of("gpu_num"),
        duration=number_of("duration"),
        user=optional_text(table, "user"),
        name=pl.lit("") if numeric_ids else text_of("job_id").fill_null(""),
        profile=pl.lit(""),
        extra={"_id_text": text_of("job_id")},
    )
