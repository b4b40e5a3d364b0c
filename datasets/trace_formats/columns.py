"""Column expressions the trace formats share (polars, over the whole table): text and
numbers read leniently (null where missing or not a number), the checks that name a row's
first fault, and ``standard_columns``, the one frame every format normalises into."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

__all__ = [
    "DATETIME_FORMATS",
    "as_int",
    "epoch_seconds",
    "first_reason",
    "number_of",
    "numeric_checks",
    "optional_number",
    "optional_text",
    "row_order",
    "standard_columns",
    "text_of",
]

DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")


def text_of(col: str) -> pl.Expr:
    """The stripped text of a column, null when empty."""
    s = pl.col(col).str.strip_chars()
    return pl.when(s.str.len_chars() > 0).then(s)


def number_of(col: str) -> pl.Expr:
    """A column as a finite float, null when missing or not a finite number."""
    f = text_of(col).cast(pl.Float64, strict=False)
    return pl.when(f.is_finite()).then(f)


def as_int(value: pl.Expr) -> pl.Expr:
    """A float expression as Int64 where it is integral, else null."""
    return pl.when(value == value.floor()).then(value).cast(pl.Int64, strict=False)


def numeric_checks(*cols: str) -> list[tuple[pl.Expr, str]]:
    """For each column: missing, then not a number."""
    checks: list[tuple[pl.Expr, str]] = []
    for col in cols:
        checks.append((text_of(col).is_null(), f"missing {col}"))
        checks.append((number_of(col).is_null(), f"non-numeric {col}"))
    return checks


def first_reason(checks: list[tuple[pl.Expr, str]]) -> pl.Expr:
    """The reason of the first check that holds (null when none does)."""
    if not checks:
        return pl.lit(None, dtype=pl.String)
    return pl.coalesce([pl.when(cond).then(pl.lit(reason)) for cond, reason in checks])


def optional_text(table: pl.DataFrame, col: str, prefix: str = "") -> pl.Expr:
    """An optional text column with ``prefix`` ("" where absent or empty)."""
    if col not in table.columns:
        return pl.lit("")
    return (pl.lit(prefix) + text_of(col)).fill_null("")


def optional_number(table: pl.DataFrame, col: str) -> pl.Expr:
    """An optional numeric column (0 where absent or empty; null where not a number)."""
    if col not in table.columns:
        return pl.lit(0.0)
    return pl.when(text_of(col).is_null()).then(pl.lit(0.0)).otherwise(number_of(col))


def row_order() -> pl.Expr:
    """The data-row order (0-based): job ids for formats without their own."""
    return pl.int_range(pl.len(), dtype=pl.Int64)


def epoch_seconds(col: str) -> pl.Expr:
    """Epoch seconds of a column holding either numbers or ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    text = text_of(col)
    dated = [
        text.str.to_datetime(f, strict=False, time_unit="us").dt.epoch("us").cast(pl.Float64) / 1e6
        for f in DATETIME_FORMATS
    ]
    return pl.coalesce([number_of(col), *dated])


def standard_columns(
    table: pl.DataFrame,
    checks: list[tuple[pl.Expr, str]],
    *,
    job_id: pl.Expr,
    submit: pl.Expr,
    gpus: pl.Expr,
    duration: pl.Expr,
    user: pl.Expr,
    name: pl.Expr,
    profile: pl.Expr,
    nodes: pl.Expr | None = None,
    time_limit: pl.Expr | None = None,
    extra: Mapping[str, pl.Expr] | None = None,
) -> pl.DataFrame:
    """The standard columns of a format's table (``_line``, ``_raw``, job id, submit, GPUs,
    duration, user, name, profile, nodes, time limit, ``extra``) and ``_reason``, the first
    fault of the row (its field count first, then ``checks``; null: none)."""
    field_check = [(~pl.col("_fields_ok"), "wrong number of fields")]
    return table.select(
        "_line",
        "_raw",
        job_id.cast(pl.Int64).alias("job_id"),
        submit.cast(pl.Float64).alias("submit"),
        gpus.cast(pl.Float64).alias("gpus"),
        duration.cast(pl.Float64).alias("duration"),
        user.cast(pl.String).alias("user"),
        name.cast(pl.String).alias("name"),
        profile.cast(pl.String).alias("profile"),
        (pl.lit(0.0) if nodes is None else nodes).cast(pl.Float64).alias("nodes"),
        (pl.lit(0.0) if time_limit is None else time_limit).cast(pl.Float64).alias("time_limit"),
        first_reason(field_check + checks).alias("_reason"),
        *[e.alias(k) for k, e in (extra or {}).items()],
    )
