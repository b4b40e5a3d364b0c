"""Trace files as tables of strings, every row with its 1-based line (``_line``) and text
(``_raw``): text lines, CSV (field counts checked where nothing is quoted) and Parquet; a
line over ``MAX_LINE_BYTES`` or text that is not UTF-8 refused naming the line, before the
file is read into memory (``TraceFormatError``)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

__all__ = [
    "CSV_SUFFIXES",
    "MAX_LINE_BYTES",
    "TraceFormatError",
    "check_line_lengths",
    "first_line",
    "is_parquet",
    "read_csv_table",
    "read_lines",
    "read_parquet_table",
    "read_text",
    "split_header",
]

_PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".txt")
MAX_LINE_BYTES = 1 << 20
"""A trace line (the header too) longer than this is refused: real ones are < 1 KiB."""
_SCAN_CHUNK = 1 << 22


class TraceFormatError(ValueError):
    """The file is not a readable trace of the claimed format, or holds no valid job."""


def is_parquet(path: Path) -> bool:
    """Whether the file is Parquet (by its suffix)."""
    return path.suffix.lower() in _PARQUET_SUFFIXES


def check_line_lengths(path: Path) -> None:
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


def read_text(path: Path) -> str:
    """The file's text; ``TraceFormatError`` naming the line where it is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(
            f"{path}: not UTF-8 text ({exc.reason} at line {line}, byte {exc.start})"
        ) from exc


def first_line(path: Path) -> str | None:
    """The first non-blank line of a text file (reading only the start of it)."""
    with path.open("rb") as handle:
        head = handle.read(1 << 16).decode("utf-8-sig", errors="replace")
    for line in head.split("\n"):
        if line.strip():
            return line.rstrip("\r")
    return None


def split_header(line: str) -> list[str]:
    """A CSV header's column names, stripped of spaces and quotes."""
    return [c.strip().strip('"').strip() for c in line.split(",")]


def read_lines(path: Path) -> pl.DataFrame:
    """Every line of a text file with its 1-based number (``_line``) and text (``_raw``)."""
    text = read_text(path)
    return (
        pl.DataFrame({"_raw": [text]})
        .select(pl.col("_raw").str.split("\n").explode())
        .with_row_index("_line", offset=1)
        .with_columns(pl.col("_line").cast(pl.Int64), pl.col("_raw").str.strip_chars_end("\r"))
    )


def read_csv_table(path: Path) -> pl.DataFrame:
    """A CSV file as string columns, each row with its line number and raw text.

    Blank lines are skipped (they are not rows). Columns are the stripped header names; a
    ``_fields_ok`` column flags rows whose field count differs from the header's.
    """
    lines = read_lines(path).filter(pl.col("_raw").str.strip_chars() != "")
    if lines.height == 0:
        raise TraceFormatError(f"{path}: empty file")
    header = str(lines.item(0, "_raw"))
    data = lines.slice(1)
    columns = split_header(header)
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


def read_parquet_table(path: Path) -> pl.DataFrame:
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
