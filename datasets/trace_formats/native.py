"""The native trace format: CSV or Parquet with ``job_id, submit_time, num_gpus, duration``
(seconds) and optional ``model`` (becomes ``Job.profile``), ``user``, ``name``, ``nodes``
(the node count asked, ``-N``; 0 or absent: derived, ``domain.requested_shape``),
``time_limit`` (seconds; 0 or absent: none) and ``flexible`` (the request's form,
``Job.flexible``: 1 any split, ``--gpus=N``, with no ``nodes``; 0 fixed; empty or absent:
not known). ``datasets.traces.write_native`` writes it."""

from __future__ import annotations

import polars as pl

from linkwise.datasets.trace_formats.columns import (
    as_int,
    number_of,
    numeric_checks,
    optional_number,
    optional_text,
    standard_columns,
    text_of,
)

__all__ = ["native_columns"]


def native_columns(table: pl.DataFrame) -> pl.DataFrame:
    job_id = as_int(number_of("job_id"))
    checks = numeric_checks("job_id", "submit_time", "num_gpus", "duration")
    checks.insert(2, (job_id.is_null(), "non-integer job_id"))
    return standard_columns(
        table,
        checks,
        job_id=job_id,
        submit=number_of("submit_time"),
        gpus=number_of("num_gpus"),
        duration=number_of("duration"),
        user=optional_text(table, "user"),
        name=optional_text(table, "name"),
        profile=optional_text(table, "model"),
        nodes=optional_number(table, "nodes"),
        time_limit=optional_number(table, "time_limit"),
        extra={"_flexible": _optional_form(table)},
    )


def _optional_form(table: pl.DataFrame) -> pl.Expr:
    """The optional ``flexible`` column: null where absent or empty, else its number
    (checked to be 0 or 1 in ``_finish``; NaN where it is not a number)."""
    if "flexible" not in table.columns:
        return pl.lit(None, dtype=pl.Float64)
    return (
        pl.when(text_of("flexible").is_null())
        .then(None)
        .otherwise(number_of("flexible").fill_null(-1))
    )
