"""Read real GPU job traces into :class:`~linkwise.cluster.domain.Job` values.

Formats (the names of the ``--trace-format`` option):

``native``
    CSV or Parquet with ``job_id, submit_time, num_gpus, duration`` (seconds) and optional
    ``model`` (becomes ``Job.profile``), ``user``, ``name``, ``nodes`` (the node count asked,
    ``-N``; 0 or absent: derived, ``domain.requested_shape``), ``time_limit`` (seconds; 0
    or absent: none) and ``flexible`` (the request's form, ``Job.flexible``: 1 any split,
    ``--gpus=N``, with no ``nodes``; 0 fixed; empty or absent: not known).
    :func:`write_native` writes it (``flexible`` only where some job has a form).
``philly``
    The Microsoft Philly trace as shipped by petuum/adaptdl:
    ``timestamp,duration,num_gpus,gpu_time,cluster``. Job ids are the data-row order (0-based);
    the virtual cluster becomes ``Job.user`` as ``"vc:<id>"``.
``helios``
    Helios/Acme (SenseTime, Shanghai AI Lab) Slurm logs: ``job_id,user,vc,gpu_num,cpu_num,
    node_num,state,submit_time,start_time,end_time,duration,queue``. ``submit_time`` is a
    ``YYYY-MM-DD HH:MM:SS`` wall time or epoch seconds. CPU jobs (``gpu_num`` 0) are rejected.
    When some job id is not an integer, job ids become the data-row order and the original
    id is kept in ``Job.name``.
``alibaba``
    Alibaba cluster-trace-gpu-v2023 pod lists: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,
    gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``. The run time is
    ``deletion_time - scheduled_time``; pods never scheduled and CPU pods are rejected; pods
    sharing one GPU (``gpu_milli < 1000``) are kept as one GPU and counted in the notes.
``swf``
    The Standard Workload Format (``;`` header comments, 18 numeric fields a line). Fields 1
    (job number), 2 (submit), 4 (run time) and 5 (allocated processors, or 8, requested, when
    5 is -1) are used; processors are read as GPUs. ``-1`` (unknown) rejects the row.

Every row that cannot become a job is kept as a :class:`RejectedRow` (file, 1-based line,
reason, raw text); nothing is dropped silently. A text file with a line longer than
:data:`MAX_LINE_BYTES` (header included) or bytes that are not UTF-8 is refused whole, with
the line, before it is read into memory. Jobs come sorted by ``(submit_time, job_id)``
and shifted so the first one submits at 0; :attr:`Trace.origin_epoch` keeps the time that
became 0 (Unix seconds for dated formats, wall times read as UTC).

Parsing is vectorised with polars: every check is an expression over the whole table. Each
format's reader is a module of ``datasets.trace_formats``; the checks common to every format,
duplicate ids, the order and the time shift are here (``_finish``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import polars as pl

from linkwise.cluster.domain import MAX_JOB_GPUS, Job
from linkwise.datasets import llm_workload
from linkwise.datasets.trace_formats.alibaba import alibaba_columns
from linkwise.datasets.trace_formats.columns import first_reason
from linkwise.datasets.trace_formats.helios import helios_columns
from linkwise.datasets.trace_formats.native import native_columns
from linkwise.datasets.trace_formats.philly import philly_columns
from linkwise.datasets.trace_formats.swf import SWF_FIELDS, swf_columns
from linkwise.datasets.trace_formats.tables import (
    CSV_SUFFIXES,
    TraceFormatError,
    check_line_lengths,
    first_line,
    is_parquet,
    read_csv_table,
    read_lines,
    read_parquet_table,
    split_header,
)

__all__ = [
    "FORMATS",
    "JOB_COLUMNS",
    "RejectedRow",
    "Trace",
    "TraceSummary",
    "detect_format",
    "frame_jobs",
    "jobs_frame",
    "load_trace",
    "write_native",
    "write_rejected",
]

FORMATS: tuple[str, ...] = ("native", "philly", "helios", "alibaba", "swf")

# Columns a table must have to be read as each CSV-like format (also used for detection).
_REQUIRED: Mapping[str, tuple[str, ...]] = {
    "native": ("job_id", "submit_time", "num_gpus", "duration"),
    "philly": ("timestamp", "duration", "num_gpus"),
    "helios": ("job_id", "gpu_num", "submit_time", "duration"),
    "alibaba": ("name", "num_gpu", "creation_time", "deletion_time", "scheduled_time"),
}
_NORMALISERS = {
    "native": native_columns,
    "philly": philly_columns,
    "helios": helios_columns,
    "alibaba": alibaba_columns,
}


@dataclass(frozen=True, slots=True)
class RejectedRow:
    """A row that did not become a job: where it is, why, and its text.

    ``line`` is the 1-based line in a text file, or the 1-based row number in a Parquet file.
    """

    source: str
    line: int
    reason: str
    raw: str


class TraceSummary(TypedDict):
    """What :meth:`Trace.summary` reports."""

    source: str
    format: str
    jobs: int
    multi_gpu_jobs: int
    rejected: int
    rejected_by_reason: dict[str, int]
    notes: dict[str, int]


@dataclass(frozen=True)
class Trace:
    """Jobs read from one trace file, the rows rejected, and where the clock started.

    ``notes`` counts things kept but worth knowing (e.g. ``fractional_gpu`` pods read as one
    GPU, ``beyond_max_jobs`` valid jobs cut by ``max_jobs``).
    """

    jobs: tuple[Job, ...]
    rejected: tuple[RejectedRow, ...]
    source: str
    format: str
    origin_epoch: float | None
    notes: tuple[tuple[str, int], ...] = ()

    def summary(self) -> TraceSummary:
        """Counts of jobs, multi-GPU jobs and rejected rows (per reason), plus the notes."""
        reasons = Counter(r.reason for r in self.rejected)
        return {
            "source": self.source,
            "format": self.format,
            "jobs": len(self.jobs),
            "multi_gpu_jobs": sum(1 for j in self.jobs if j.num_gpus > 1),
            "rejected": len(self.rejected),
            "rejected_by_reason": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "notes": dict(self.notes),
        }


# --------------------------------------------------------------------------- public API


def load_trace(path: str | Path, fmt: str = "auto", *, max_jobs: int | None = None) -> Trace:
    """Read a trace file as jobs, rejecting (and recording) every row that is not a valid job.

    ``fmt`` is one of :data:`FORMATS` or ``"auto"`` (see :func:`detect_format`).
    ``max_jobs`` keeps the first jobs by submit time. Raises :class:`TraceFormatError` when
    the file is not of the format (missing columns, unreadable) or holds no valid job.
    ``synthetic:llm,...`` is no file: the generated LLM-era workload (``llm_workload``).
    """
    if llm_workload.is_generated(path):
        spec = llm_workload.parse_spec(path)
        jobs = llm_workload.generate(spec)[:max_jobs]
        return Trace(jobs, (), f"{spec.text()} (synthetic)", llm_workload.PREFIX, None)
    path = Path(path)
    if max_jobs is not None and max_jobs <= 0:
        raise ValueError(f"max_jobs must be positive, got {max_jobs}")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory, not a trace file")
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    if not is_parquet(path):
        check_line_lengths(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    source = str(path)
    base: float | None = 0.0
    if fmt == "swf":
        if is_parquet(path):
            raise TraceFormatError(f"{path}: SWF traces are text files, not Parquet")
        std, base = swf_columns(read_lines(path), source)
    else:
        table = read_parquet_table(path) if is_parquet(path) else read_csv_table(path)
        _require(table, fmt, source)
        std = _NORMALISERS[fmt](table)
        if fmt == "alibaba":
            base = None  # seconds since the trace's own start, not Unix time
    return _finish(std, source, fmt, base, max_jobs)


def detect_format(path: str | Path) -> str:
    """The format of a trace file from its extension and header; raises when unsure."""
    path = Path(path)
    if path.suffix.lower() == ".swf":
        return "swf"
    if is_parquet(path):
        return _match_columns(list(pl.read_parquet_schema(path)), str(path))
    first = first_line(path)
    if first is None:
        raise TraceFormatError(f"{path}: empty file, cannot detect its trace format")
    if first.lstrip().startswith(";"):
        return "swf"
    if "," in first:
        return _match_columns(split_header(first), str(path))
    if len(first.split()) == SWF_FIELDS:
        return "swf"
    raise TraceFormatError(
        f"{path}: cannot detect the trace format from its first line {first[:80]!r}; "
        f"pass one of {', '.join(FORMATS)}"
    )


JOB_COLUMNS: dict[str, Any] = {
    "job_id": pl.Int64,
    "submit_time": pl.Float64,
    "num_gpus": pl.Int64,
    "duration": pl.Float64,
    "profile": pl.String,
    "user": pl.String,
    "name": pl.String,
    "nodes": pl.Int64,
    "time_limit": pl.Float64,
    "flexible": pl.Boolean,  # the request's form (Job.flexible): null where a source has none
}


def jobs_frame(jobs: Iterable[Job]) -> pl.DataFrame:
    """Jobs as a frame with ``JOB_COLUMNS``: the one conversion of jobs to a table (native
    traces, rollout and evaluation windows)."""
    rows = list(jobs)
    return pl.DataFrame(
        {name: [getattr(j, name) for j in rows] for name in JOB_COLUMNS}, schema=JOB_COLUMNS
    )


def frame_jobs(df: pl.DataFrame) -> tuple[Job, ...]:
    """The ``Job``s of a frame with ``JOB_COLUMNS``."""
    return tuple(Job(**row) for row in df.select(list(JOB_COLUMNS)).iter_rows(named=True))


def write_native(jobs: Iterable[Job], path: str | Path) -> None:
    """Write jobs as a native trace: CSV (``.csv``) or Parquet (``.parquet``/``.pq``)."""
    path = Path(path)
    rows = list(jobs)
    frame = jobs_frame(rows).rename({"profile": "model"})
    if any(j.flexible is not None for j in rows):
        forms = [None if j.flexible is None else int(j.flexible) for j in rows]
        frame = frame.with_columns(pl.Series("flexible", forms, dtype=pl.Int8))
    if is_parquet(path):
        frame.write_parquet(path)
    elif path.suffix.lower() in CSV_SUFFIXES:
        frame.write_csv(path)
    else:
        raise ValueError(f"{path}: write_native writes .csv, .parquet or .pq files")


def write_rejected(rows: Iterable[RejectedRow], path: str | Path) -> int:
    """Write rejected rows as CSV (``file,line,reason,raw``); returns how many."""
    frame = pl.DataFrame(
        [(r.source, r.line, r.reason, r.raw) for r in rows],
        schema={"file": pl.String, "line": pl.Int64, "reason": pl.String, "raw": pl.String},
        orient="row",
    )
    frame.write_csv(path)
    return frame.height


def _match_columns(columns: Iterable[str], source: str) -> str:
    have = set(columns)
    matches = [f for f, need in _REQUIRED.items() if have.issuperset(need)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise TraceFormatError(f"{source}: columns fit several trace formats ({matches}); pass one")
    needs = "; ".join(f"{f}: {', '.join(need)}" for f, need in _REQUIRED.items())
    raise TraceFormatError(
        f"{source}: cannot detect the trace format; columns {sorted(have)} match none of ({needs})"
    )


def _require(table: pl.DataFrame, fmt: str, source: str) -> None:
    missing = [c for c in _REQUIRED[fmt] if c not in table.columns]
    if missing:
        raise TraceFormatError(
            f"{source}: not a {fmt} trace: missing columns {missing} "
            f"(has {[c for c in table.columns if not c.startswith('_')]})"
        )


# --------------------------------------------------------------------------- common checks


def _finish(
    std: pl.DataFrame, source: str, fmt: str, base: float | None, max_jobs: int | None
) -> Trace:
    """Common checks, duplicate ids, sorting, ``max_jobs``, the time shift, and the Trace."""
    gpus, duration, submit = pl.col("gpus"), pl.col("duration"), pl.col("submit")
    common = [
        (gpus != gpus.floor(), "non-integer GPU count"),
        (gpus == 0, "no GPUs"),
        (gpus < 0, "negative GPU count"),
        (gpus > MAX_JOB_GPUS, "absurd GPU count"),
        (duration.is_null(), "missing duration"),
        (duration <= 0, "duration <= 0"),
        (submit < 0, "negative time"),
        (pl.col("nodes").is_null(), "non-numeric nodes"),
        (pl.col("nodes") != pl.col("nodes").floor(), "non-integer nodes"),
        (pl.col("nodes") < 0, "negative nodes"),
        (
            (pl.col("nodes") > 0) & ((gpus % pl.col("nodes").clip(lower_bound=1)) != 0),
            "GPUs do not split evenly over nodes",
        ),
        (pl.col("time_limit").is_null(), "non-numeric time_limit"),
        (pl.col("time_limit") < 0, "negative time_limit"),
    ]
    if "_flexible" in std.columns:
        form = pl.col("_flexible")
        common += [
            (form.is_not_null() & ~form.is_in([0.0, 1.0]), "flexible is not 0 or 1"),
            ((form == 1.0) & (pl.col("nodes") > 0), "a flexible request with a node count"),
        ]
    checked = std.with_columns(
        _reason=pl.coalesce(pl.col("_reason"), first_reason(common)),
    )
    # ids as written where a format keeps them (Helios ids that are not all integers)
    id_key = pl.col("_id_text") if "_id_text" in checked.columns else pl.col("job_id")
    valid_id = pl.when(pl.col("_reason").is_null()).then(id_key)
    checked = checked.with_columns(
        _reason=pl.when(pl.col("_reason").is_null() & ~valid_id.is_first_distinct())
        .then(pl.lit("duplicate job_id"))
        .otherwise(pl.col("_reason"))
    )
    rejected = tuple(
        RejectedRow(source, int(line), str(reason), str(raw))
        for line, reason, raw in checked.filter(pl.col("_reason").is_not_null())
        .sort("_line")
        .select("_line", "_reason", "_raw")
        .iter_rows()
    )
    good = checked.filter(pl.col("_reason").is_null()).sort(["submit", "job_id"])
    if good.height == 0:
        reasons = Counter(r.reason for r in rejected).most_common(5)
        raise TraceFormatError(
            f"{source}: no valid jobs as a {fmt} trace ({len(rejected)} rows rejected; "
            f"most common reasons: {reasons})"
        )
    notes: dict[str, int] = {}
    if max_jobs is not None and good.height > max_jobs:
        notes["beyond_max_jobs"] = good.height - max_jobs
        good = good.head(max_jobs)
    if "_fractional" in good.columns:
        notes["fractional_gpu"] = int(good["_fractional"].sum())
    first = float(good.item(0, "submit"))
    forms = (
        [None if f is None else f == 1.0 for f in good["_flexible"].to_list()]
        if "_flexible" in good.columns
        else [None] * good.height
    )
    jobs = tuple(
        Job(
            job_id=int(job_id),
            submit_time=float(t) - first,
            num_gpus=int(g),
            duration=float(d),
            profile=str(profile),
            user=str(user),
            name=str(name),
            nodes=int(nodes),
            time_limit=float(limit),
            flexible=form,
        )
        for (job_id, t, g, d, profile, user, name, nodes, limit), form in zip(
            good.select(
                "job_id", "submit", "gpus", "duration", "profile", "user", "name", "nodes",
                "time_limit",
            ).iter_rows(),
            forms,
            strict=True,
        )
    )  # fmt: skip
    origin = None if base is None else base + first
    return Trace(jobs, rejected, source, fmt, origin, tuple(sorted(notes.items())))
