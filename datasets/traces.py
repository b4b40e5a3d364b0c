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

Parsing is vectorised with polars: every check is an expression over the whole table.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import polars as pl

from linkwise.cluster.domain import MAX_JOB_GPUS, Job
from linkwise.datasets import llm_workload

__all__ = [
    "FORMATS",
    "JOB_COLUMNS",
    "MAX_LINE_BYTES",
    "RejectedRow",
    "Trace",
    "TraceFormatError",
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
_PARQUET_SUFFIXES = (".parquet", ".pq")
_CSV_SUFFIXES = (".csv", ".txt")
_SWF_FIELDS = 18
MAX_LINE_BYTES = 1 << 20
"""A trace line (the header too) longer than this is refused: real ones are < 1 KiB."""
_SCAN_CHUNK = 1 << 22
_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")


class TraceFormatError(ValueError):
    """The file is not a readable trace of the claimed format, or holds no valid job."""


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
    if not _is_parquet(path):
        _check_line_lengths(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    source = str(path)
    base: float | None = 0.0
    if fmt == "swf":
        if _is_parquet(path):
            raise TraceFormatError(f"{path}: SWF traces are text files, not Parquet")
        std, base = _swf(_read_lines(path), source)
    else:
        table = _read_parquet_table(path) if _is_parquet(path) else _read_csv_table(path)
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
    if _is_parquet(path):
        return _match_columns(list(pl.read_parquet_schema(path)), str(path))
    first = _first_line(path)
    if first is None:
        raise TraceFormatError(f"{path}: empty file, cannot detect its trace format")
    if first.lstrip().startswith(";"):
        return "swf"
    if "," in first:
        return _match_columns(_split_header(first), str(path))
    if len(first.split()) == _SWF_FIELDS:
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
    if _is_parquet(path):
        frame.write_parquet(path)
    elif path.suffix.lower() in _CSV_SUFFIXES:
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


# --------------------------------------------------------------------------- reading tables


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in _PARQUET_SUFFIXES


def _check_line_lengths(path: Path) -> None:
    """Refuse a file holding a line longer than ``MAX_LINE_BYTES``, reading it in chunks."""
    line, run = 1, 0  # the current line's number and its bytes so far
    with path.open("rb") as handle:
        while chunk := handle.read(_SCAN_CHUNK):
            parts = chunk.split(b"\n")
            lengths = [run + len(parts[0]), *map(len, parts[1:])]
            if max(lengths) > MAX_LINE_BYTES:
                at = next(i for i, n in enumerate(lengths) if n > MAX_LINE_BYTES)
                raise TraceFormatError(
                    f"{path}: line {line + at} is longer than {MAX_LINE_BYTES} bytes; "
                    "not a trace this loader reads"
                )
            line += len(parts) - 1
            run = lengths[-1]


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(
            f"{path}: not UTF-8 text ({exc.reason} at line {line}, byte {exc.start})"
        ) from exc


def _first_line(path: Path) -> str | None:
    """The first non-blank line of a text file (reading only the start of it)."""
    with path.open("rb") as handle:
        head = handle.read(1 << 16).decode("utf-8-sig", errors="replace")
    for line in head.split("\n"):
        if line.strip():
            return line.rstrip("\r")
    return None


def _split_header(line: str) -> list[str]:
    return [c.strip().strip('"').strip() for c in line.split(",")]


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


def _read_lines(path: Path) -> pl.DataFrame:
    """Every line of a text file with its 1-based number (``_line``) and text (``_raw``)."""
    text = _read_text(path)
    return (
        pl.DataFrame({"_raw": [text]})
        .select(pl.col("_raw").str.split("\n").explode())
        .with_row_index("_line", offset=1)
        .with_columns(pl.col("_line").cast(pl.Int64), pl.col("_raw").str.strip_chars_end("\r"))
    )


def _read_csv_table(path: Path) -> pl.DataFrame:
    """A CSV file as string columns, each row with its line number and raw text.

    Blank lines are skipped (they are not rows). Columns are the stripped header names; a
    ``_fields_ok`` column flags rows whose field count differs from the header's.
    """
    lines = _read_lines(path).filter(pl.col("_raw").str.strip_chars() != "")
    if lines.height == 0:
        raise TraceFormatError(f"{path}: empty file")
    header = str(lines.item(0, "_raw"))
    data = lines.slice(1)
    columns = _split_header(header)
    if len(set(columns)) != len(columns) or "" in columns:
        raise TraceFormatError(f"{path}: bad CSV header {header[:120]!r}")
    if data.height == 0:
        return _empty_table(columns)
    body = str(data.select(pl.col("_raw").str.join("\n")).item())
    try:
        table = pl.read_csv(
            (header + "\n" + body).encode(),
            has_header=True,
            new_columns=columns,
            infer_schema=False,
            truncate_ragged_lines=True,
            raise_if_empty=False,
        )
    except pl.exceptions.PolarsError as exc:
        raise TraceFormatError(f"{path}: unreadable CSV: {exc}") from exc
    if table.height != data.height:
        raise TraceFormatError(
            f"{path}: {data.height} data lines but {table.height} CSV rows "
            "(quoted fields spanning lines are not supported)"
        )
    # Field counts can be checked on the raw text only where no field is quoted.
    fields = pl.col("_raw").str.count_matches(",", literal=True) + 1
    quoted = pl.col("_raw").str.contains('"', literal=True)
    return pl.concat([data, table], how="horizontal").with_columns(
        _fields_ok=quoted | (fields == len(columns))
    )


def _empty_table(columns: list[str]) -> pl.DataFrame:
    schema: dict[str, pl.DataType] = {"_line": pl.Int64(), "_raw": pl.String()}
    schema.update({c: pl.String() for c in columns})
    schema["_fields_ok"] = pl.Boolean()
    return pl.DataFrame(schema=schema)


def _read_parquet_table(path: Path) -> pl.DataFrame:
    """A Parquet file as string columns; ``_line`` is the 1-based row number."""
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise TraceFormatError(f"{path}: unreadable Parquet file: {exc}") from exc
    as_text = frame.select(pl.all().cast(pl.String))
    raw = pl.concat_str([pl.col(c).fill_null("") for c in as_text.columns], separator=",")
    return as_text.with_row_index("_line", offset=1).with_columns(
        pl.col("_line").cast(pl.Int64), _raw=raw, _fields_ok=pl.lit(True)
    )


# --------------------------------------------------------------------------- expressions


def _text(col: str) -> pl.Expr:
    """The stripped text of a column, null when empty."""
    s = pl.col(col).str.strip_chars()
    return pl.when(s.str.len_chars() > 0).then(s)


def _num(col: str) -> pl.Expr:
    """A column as a finite float, null when missing or not a finite number."""
    f = _text(col).cast(pl.Float64, strict=False)
    return pl.when(f.is_finite()).then(f)


def _as_int(value: pl.Expr) -> pl.Expr:
    """A float expression as Int64 where it is integral, else null."""
    return pl.when(value == value.floor()).then(value).cast(pl.Int64, strict=False)


def _numeric_checks(*cols: str) -> list[tuple[pl.Expr, str]]:
    checks: list[tuple[pl.Expr, str]] = []
    for col in cols:
        checks.append((_text(col).is_null(), f"missing {col}"))
        checks.append((_num(col).is_null(), f"non-numeric {col}"))
    return checks


def _first_reason(checks: list[tuple[pl.Expr, str]]) -> pl.Expr:
    """The reason of the first check that holds (null when none does)."""
    if not checks:
        return pl.lit(None, dtype=pl.String)
    return pl.coalesce([pl.when(cond).then(pl.lit(reason)) for cond, reason in checks])


def _opt_text(table: pl.DataFrame, col: str, prefix: str = "") -> pl.Expr:
    if col not in table.columns:
        return pl.lit("")
    return (pl.lit(prefix) + _text(col)).fill_null("")


def _opt_num(table: pl.DataFrame, col: str) -> pl.Expr:
    """An optional numeric column (0 where absent or empty; null where not a number)."""
    if col not in table.columns:
        return pl.lit(0.0)
    return pl.when(_text(col).is_null()).then(pl.lit(0.0)).otherwise(_num(col))


def _row_order() -> pl.Expr:
    return pl.int_range(pl.len(), dtype=pl.Int64)


def _epoch_seconds(col: str) -> pl.Expr:
    """Epoch seconds of a column holding either numbers or ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    text = _text(col)
    dated = [
        text.str.to_datetime(f, strict=False, time_unit="us").dt.epoch("us").cast(pl.Float64) / 1e6
        for f in _DATETIME_FORMATS
    ]
    return pl.coalesce([_num(col), *dated])


def _std(
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
        _first_reason(field_check + checks).alias("_reason"),
        *[e.alias(k) for k, e in (extra or {}).items()],
    )


# --------------------------------------------------------------------------- formats


def _native(table: pl.DataFrame) -> pl.DataFrame:
    job_id = _as_int(_num("job_id"))
    checks = _numeric_checks("job_id", "submit_time", "num_gpus", "duration")
    checks.insert(2, (job_id.is_null(), "non-integer job_id"))
    return _std(
        table,
        checks,
        job_id=job_id,
        submit=_num("submit_time"),
        gpus=_num("num_gpus"),
        duration=_num("duration"),
        user=_opt_text(table, "user"),
        name=_opt_text(table, "name"),
        profile=_opt_text(table, "model"),
        nodes=_opt_num(table, "nodes"),
        time_limit=_opt_num(table, "time_limit"),
        extra={"_flexible": _optional_form(table)},
    )


def _optional_form(table: pl.DataFrame) -> pl.Expr:
    """The optional ``flexible`` column: null where absent or empty, else its number
    (checked to be 0 or 1 in ``_finish``; NaN where it is not a number)."""
    if "flexible" not in table.columns:
        return pl.lit(None, dtype=pl.Float64)
    return pl.when(_text("flexible").is_null()).then(None).otherwise(_num("flexible").fill_null(-1))


def _philly(table: pl.DataFrame) -> pl.DataFrame:
    stamp = (
        pl.coalesce(
            [
                _text("timestamp").str.to_datetime(f, strict=False, time_unit="us").dt.epoch("us")
                for f in _DATETIME_FORMATS
            ]
        ).cast(pl.Float64)
        / 1e6
    )
    checks = [
        (_text("timestamp").is_null(), "missing timestamp"),
        (stamp.is_null(), "bad timestamp"),
    ]
    checks += _numeric_checks("duration", "num_gpus")
    return _std(
        table,
        checks,
        job_id=_row_order(),
        submit=stamp,
        gpus=_num("num_gpus"),
        duration=_num("duration"),
        user=_opt_text(table, "cluster", "vc:"),
        name=pl.lit(""),
        profile=pl.lit(""),
    )


def _helios(table: pl.DataFrame) -> pl.DataFrame:
    ids = _as_int(_num("job_id"))
    numeric_ids = bool(table.select((ids.is_not_null() | _text("job_id").is_null()).all()).item())
    submit = _epoch_seconds("submit_time")
    checks = [
        (_text("job_id").is_null(), "missing job_id"),
        (_text("submit_time").is_null(), "missing submit_time"),
        (submit.is_null(), "bad submit_time"),
        *_numeric_checks("gpu_num", "duration"),
    ]
    return _std(
        table,
        checks,
        job_id=ids if numeric_ids else _row_order(),
        submit=submit,
        gpus=_num("gpu_num"),
        duration=_num("duration"),
        user=_opt_text(table, "user"),
        name=pl.lit("") if numeric_ids else _text("job_id").fill_null(""),
        profile=pl.lit(""),
        extra={"_id_text": _text("job_id")},
    )


def _alibaba(table: pl.DataFrame) -> pl.DataFrame:
    scheduled, deleted = _num("scheduled_time"), _num("deletion_time")
    checks = [
        (_text("name").is_null(), "missing name"),
        *_numeric_checks("num_gpu", "creation_time"),
        (_text("scheduled_time").is_null(), "never scheduled"),
        *_numeric_checks("scheduled_time", "deletion_time"),
        ((scheduled < 0) | (deleted < 0), "negative time"),
    ]
    milli = _num("gpu_milli") if "gpu_milli" in table.columns else pl.lit(None, pl.Float64)
    fractional = ((_num("num_gpu") == 1) & (milli > 0) & (milli < 1000)).fill_null(False)
    return _std(
        table,
        checks,
        job_id=_row_order(),
        submit=_num("creation_time"),
        gpus=_num("num_gpu"),
        duration=deleted - scheduled,
        user=pl.lit(""),
        name=_text("name").fill_null(""),
        profile=pl.lit(""),
        extra={"_fractional": fractional},
    )


_NORMALISERS = {"native": _native, "philly": _philly, "helios": _helios, "alibaba": _alibaba}

_UNIX_START = re.compile(r"UnixStartTime:\s*(-?\d+(?:\.\d+)?)")


def _swf(lines: pl.DataFrame, source: str) -> tuple[pl.DataFrame, float | None]:
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
        if len(first.split()) != _SWF_FIELDS:
            raise TraceFormatError(
                f"{source}: not an SWF trace: first line has {len(first.split())} fields, "
                f"SWF has {_SWF_FIELDS}"
            )
    parts = stripped.str.replace_all(r"\s+", " ").str.split(" ")
    table = data.with_columns(
        _fields_ok=parts.list.len() == _SWF_FIELDS,
        **{f"f{i}": parts.list.get(i - 1, null_on_oob=True) for i in range(1, _SWF_FIELDS + 1)},
    )
    alloc, req = _num("f5"), _num("f8")
    procs = pl.when(alloc != -1).then(alloc).otherwise(req)
    job_id = _as_int(_num("f1"))
    checks = [
        *_numeric_checks("f1", "f2", "f4", "f5", "f8"),
        (job_id.is_null(), "non-integer job number"),
        (_num("f2") == -1, "unknown submit time"),
        (_num("f4") == -1, "unknown run time"),
        (procs == -1, "unknown processor count"),
    ]
    renames = {"f1": "job number", "f2": "submit time", "f4": "run time"}
    renames |= {"f5": "allocated processors", "f8": "requested processors"}
    named = [(cond, _swf_reason(reason, renames)) for cond, reason in checks]
    user = pl.when(_text("f12") != "-1").then(pl.lit("u") + _text("f12")).otherwise(pl.lit(""))
    std = _std(
        table,
        named,
        job_id=job_id,
        submit=_num("f2"),
        gpus=procs,
        duration=_num("f4"),
        user=user.fill_null(""),
        name=pl.lit(""),
        profile=pl.lit(""),
    )
    return std, unix_start


def _swf_reason(reason: str, renames: Mapping[str, str]) -> str:
    head, _, col = reason.rpartition(" ")
    return f"{head} {renames[col]}" if col in renames else reason


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
        _reason=pl.coalesce(pl.col("_reason"), _first_reason(common)),
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
