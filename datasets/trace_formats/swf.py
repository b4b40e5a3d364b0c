"""The Standard Workload Format (``;`` header comments, 18 numeric fields a line). Fields 1
(job number), 2 (submit), 4 (run time) and 5 (allocated processors, or 8, requested, when
5 is -1) are used; processors are read as GPUs. ``-1`` (unknown) rejects the row."""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

from linkwise.datasets.trace_formats.columns import (
    as_int,
    number_of,
    numeric_checks,
    standard_columns,
    text_of,
)
from linkwise.datasets.trace_formats.tables import TraceFormatError

__all__ = ["SWF_FIELDS", "swf_columns"]

SWF_FIELDS = 18
_UNIX_START = re.compile(r"UnixStartTime:\s*(-?\d+(?:\.\d+)?)")


def swf_columns(lines: pl.DataFrame, source: str) -> tuple[pl.DataFrame, float | None]:
    """SWF lines as standard columns, and the Unix time of the trace's zero if the header says."""
    stripped = pl.col("_raw").str.strip_chars()
    comments = lines.filter(stripped.str.starts_with(";"))
    data = lines.filter((stripped != "") & ~stripped.str.starts_with(";"))
    unix_start: float | None = None
    for text in comments["_raw"].to_list():
        found = _UNIX_START.search(text)
        if found:
            unix_start = float(found.group(1))
    if data.height and comments.height == 0:
        first = str(data.item(0, "_raw"))
        if len(first.split()) != SWF_FIELDS:
            raise TraceFormatError(
                f"{source}: not an SWF trace: first line has {len(first.split())} fields, "
                f"SWF has {SWF_FIELDS}"
            )
    parts = stripped.str.replace_all(r"\s+", " ").str.split(" ")
    table = data.with_columns(
        _fields_ok=parts.list.len() == SWF_FIELDS,
        **{f"f{i}": parts.list.get(i - 1, null_on_oob=True) for i in range(1, SWF_FIELDS + 1)},
    )
    alloc, req = number_of("f5"), number_of("f8")
    procs = pl.when(alloc != -1).then(alloc).otherwise(req)
    job_id = as_int(number_of("f1"))
    checks = [
        *numeric_checks("f1", "f2", "f4", "f5", "f8"),
        (job_id.is_null(), "non-integer job number"),
        (number_of("f2") == -1, "unknown submit time"),
        (number_of("f4") == -1, "unknown run time"),
        (procs == -1, "unknown processor count"),
    ]
    renames = {"f1": "job number", "f2": "submit time", "f4": "run time"}
    renames |= {"f5": "allocated processors", "f8": "requested processors"}
    named = [(cond, _swf_reason(reason, renames)) for cond, reason in checks]
    user = pl.when(text_of("f12") != "-1").then(pl.lit("u") + text_of("f12")).otherwise(pl.lit(""))
    std = standard_columns(
        table,
        named,
        job_id=job_id,
        submit=number_of("f2"),
        gpus=procs,
        duration=number_of("f4"),
        user=user.fill_null(""),
        name=pl.lit(""),
        profile=pl.lit(""),
    )
    return std, unix_start


def _swf_reason(reason: str, renames: Mapping[str, str]) -> str:
    head, _, col = reason.rpartition(" ")
    return f"{head} {renames[col]}" if col in renames else reason
