"""Prometheus text exposition (DCGM exporter, node_exporter) into a sample frame, vectorised
with Polars; label sets parsed by the exposition format, DCGM blank values dropped and counted."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import polars as pl

from linkwise.datasets.telemetry.dcgm import DCGM_SENTINELS, INT64_BLANK_AS_FLOAT


@dataclass(frozen=True, slots=True)
class PromParse:
    """A parsed exposition: samples (``SAMPLE_SCHEMA``), ``# TYPE`` declarations, malformed
    lines (columns ``raw``, ``reason``) and the DCGM sentinels dropped, by kind."""

    samples: pl.DataFrame
    types: tuple[tuple[str, str], ...]
    malformed: pl.DataFrame
    sentinels: tuple[tuple[str, int], ...]
    lines: int

    @property
    def sentinel_count(self) -> int:
        """All DCGM blank values dropped."""
        return sum(n for _, n in self.sentinels)


_NAME_RE = r"^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)"
_FULL_NAME_RE = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
# a label set up to its closing brace, quoted values (with escapes) skipped whole
_LABEL_SET_RE = r'^(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})'
_TAIL_RE = r"^[ \t]+([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t]*$"
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_.\-]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|\Z)'
)
_ESCAPE = re.compile(r"\\(.)")
_SIMPLE_VALUE = r'="[^"\\=\x00-\x1f]*"'
_SIMPLE_PAIR = rf"[a-zA-Z_][a-zA-Z0-9_.\-]*{_SIMPLE_VALUE}"
_SIMPLE_SET_RE = rf"^\{{(?:{_SIMPLE_PAIR}(?:,{_SIMPLE_PAIR})*,?)?\}}$"
_HOST_LABELS = ("Hostname", "hostname")  # older and newer dcgm-exporter; the first one wins
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_SENTINEL_FLOATS = sorted({float(k) for k in DCGM_SENTINELS} | {INT64_BLANK_AS_FLOAT})
_PART_COLUMNS = ["_row", "raw", "metric", "lbl", "vtext", "tsms", "_tsi", "value", "_why"]


def _fast_parts(data: pl.DataFrame, *, ascii_text: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split data lines into the common shape, parsed with literal searches, and the rest.

    The common shape is ``name{labels} value``: a valid name at the start of an ASCII line,
    one '{' right after it, exactly one '}', one space and a number. Every such line parses
    the same under the general regexes (``_general_parts``), which handle all other lines.
    """
    r = pl.col("raw")
    brace = r.str.find("{", literal=True)
    close = r.str.find("}", literal=True)
    metric = r.str.slice(0, brace)
    vtext = r.str.slice(close + 2)
    value = vtext.str.strip_prefix("+").cast(pl.Float64(), strict=False)
    shape = brace.is_not_null() & (close > brace) & (r.str.slice(close + 1, 1) == " ")
    if not ascii_text:  # str.find gives byte offsets, str.slice takes characters
        shape = shape & (r.str.len_bytes() == r.str.len_chars())
    cols = (
        data.lazy()
        .with_columns(
            metric.alias("metric"),
            r.str.slice(brace, close - brace + 1).alias("lbl"),
            vtext.alias("vtext"),
            value.alias("value"),
            shape.fill_null(False).alias("_shape"),
        )
        .collect()
    )
    # names repeat: check each distinct one against the grammar once
    names = cols.select(pl.col("metric").unique()).filter(
        pl.col("metric").str.contains(_FULL_NAME_RE)
    )
    fast = (
        pl.col("_shape")
        & pl.col("value").is_not_null()  # a number: no '}' and no blank after the '}'
        & pl.col("metric").is_in(names.to_series().implode())
    )
    cols = cols.with_columns(fast.alias("_fast"))
    fast_rows = cols.filter(pl.col("_fast")).select(
        "_row",
        "raw",
        "metric",
        "lbl",
        "vtext",
        pl.lit(None, dtype=pl.String()).alias("tsms"),
        pl.lit(None, dtype=pl.Int64()).alias("_tsi"),
        "value",
        pl.lit(None, dtype=pl.String()).alias("_why"),
    )
    return fast_rows, cols.filter(~pl.col("_fast")).select("_row", "raw")


def _general_parts(data: pl.DataFrame) -> pl.DataFrame:
    """Parse any data lines with the general regexes (name, the label set with its quoted
    values, value, optional timestamp); ``_why`` says why a line is not a sample line."""
    metric = pl.col("raw").str.extract(_NAME_RE, 1)
    parts = data.with_columns(metric.alias("metric")).with_columns(
        # where the name ends, blanks before it included
        pl.col("raw")
        .str.extract(r"^([ \t]*[a-zA-Z_:][a-zA-Z0-9_:]*)", 1)
        .str.len_chars()
        .fill_null(0)
        .alias("_mlen")
    )
    has_lbl = pl.col("raw").str.slice(pl.col("_mlen"), 1) == "{"
    lbl = pl.col("raw").str.slice(pl.col("_mlen")).str.extract(_LABEL_SET_RE, 1)
    parts = parts.with_columns(pl.when(has_lbl).then(lbl).alias("lbl")).with_columns(
        pl.col("raw")
        .str.slice(pl.col("_mlen") + pl.col("lbl").str.len_chars().fill_null(0))
        .str.extract_groups(_TAIL_RE)
        .alias("_f")
    )
    parts = parts.unnest("_f").rename({"1": "vtext", "2": "tsms"})
    parts = parts.with_columns(
        pl.col("vtext").str.strip_prefix("+").cast(pl.Float64(), strict=False).alias("value"),
        pl.col("tsms").cast(pl.Int64(), strict=False).alias("_tsi"),
    )
    bad_line = (
        pl.col("metric").is_null()
        | pl.col("vtext").is_null()
        | (pl.col("tsms").is_not_null() & pl.col("_tsi").is_null())
    ).fill_null(True)
    why = (
        pl.when(has_lbl.fill_null(False) & pl.col("lbl").is_null())
        .then(pl.lit("malformed labels"))
        .when(bad_line)
        .then(pl.lit("not a sample line"))
    )
    return parts.with_columns(why.alias("_why")).select(_PART_COLUMNS)


def parse_label_set(text: str) -> dict[str, str] | None:
    """A ``{name="value",...}`` label set by the exposition format: values unescaped (``\\\\``,
    ``\\"``, ``\\n``; other escapes kept as written, as Prometheus does), raw TABs kept, an
    optional trailing comma; None when it is malformed or names a label twice."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    body, pos, out = text[1:-1], 0, {}
    while body[pos:].strip(" \t"):
        m = _LABEL_PAIR.match(body, pos)
        if m is None or m.group(1) in out:
            return None
        out[m.group(1)] = _ESCAPE.sub(lambda e: _UNESCAPED.get(e.group(1), e.group(0)), m.group(2))
        pos = m.end()
    return out


def _label_table(sets: pl.DataFrame, host: str | None) -> pl.DataFrame:
    """Add labels (a JSON object string; null when the set is malformed), host and job to a
    frame of distinct label sets (``lbl``).

    Sets as exporters write them (no blank between tokens, no escape, '=' or control
    character in a value, no repeated name) are converted with vectorised rewrites, which
    give exactly what ``parse_label_set`` and ``json.dumps`` would; every other set goes
    through ``parse_label_set``.
    """
    lbl = pl.col("lbl")
    # the names of a simple set, values removed: few distinct ones, checked once each
    shape = pl.when(lbl.str.contains(_SIMPLE_SET_RE)).then(lbl.str.replace_all(r'="[^"]*"', ""))
    sets = sets.with_columns(shape.alias("_shape"))
    shapes = sets.select(pl.col("_shape").unique().drop_nulls())["_shape"].to_list()
    unique_names = [sh for sh in shapes if _names_unique(sh)]
    sets = sets.with_columns(
        pl.col("_shape")
        .is_in(pl.Series(unique_names, dtype=pl.String()).implode())
        .fill_null(False)
        .alias("_simple")
    ).drop("_shape")
    easy = sets.filter(pl.col("_simple")).with_columns(
        lbl.str.replace_all(r'([{,])([a-zA-Z_][a-zA-Z0-9_.\-]*)="', r'${1}"${2}":"')
        .str.replace(r",\}$", "}")
        .alias("labels"),
        lbl.str.extract(r'[{,](?:Hostname|hostname)="([^"]*)"', 1)
        .fill_null(pl.lit(host, dtype=pl.String()))
        .alias("host"),
        lbl.str.extract(r'[{,]hpc_job="([^"]*)"', 1).alias("job"),
    )
    hard = _parsed_label_table(sets.filter(~pl.col("_simple")), host)
    return pl.concat([easy, hard]).drop("_simple")


def _names_unique(shape: str) -> bool:
    """Whether ``{a,b,...}`` (a simple label set without its values) names no label twice."""
    names = shape[1:-1].rstrip(",").split(",")
    return len(names) == len(set(names))


def _parsed_label_table(sets: pl.DataFrame, host: str | None) -> pl.DataFrame:
    """``_label_table`` set by set with ``parse_label_set``."""
    rows: list[tuple[str | None, str | None, str | None]] = []
    for text in sets["lbl"].to_list():
        parsed = parse_label_set(text)
        if parsed is None:
            rows.append((None, None, None))
            continue
        as_json = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
        name = next((v for k, v in parsed.items() if k in _HOST_LABELS), host)
        rows.append((as_json, name, parsed.get("hpc_job")))
    schema = {"labels": pl.String(), "host": pl.String(), "job": pl.String()}
    return pl.concat([sets, pl.DataFrame(rows, schema=schema, orient="row")], how="horizontal")


def _label_columns(
    good: pl.DataFrame, host: str | None, *, key: pl.Expr | None = None
) -> pl.DataFrame:
    """labels, host and job per sample, converting each distinct label set once (sets
    repeat: one per GPU, many metrics each). Sets are matched by ``key`` (default: a 64-bit
    hash of the set), checked against the text; on a collision, by their text."""
    keyed = good.with_columns((pl.col("lbl").hash() if key is None else key).alias("_key"))
    sets = _label_table(keyed.select("_key", "lbl").unique(subset="_key", keep="any"), host)
    joined = keyed.join(sets.rename({"lbl": "_klbl"}), on="_key", how="left", maintain_order="left")
    if bool(joined.select((pl.col("_klbl") == pl.col("lbl")).all()).item()):
        return joined.drop("_key", "_klbl")
    sets = _label_table(good.select("lbl").unique(), host)
    return good.join(sets, on="lbl", how="left", maintain_order="left")


NON_FINITE_REASON = "non-finite value (NaN, +Inf or -Inf)"
"""The ``rejected_rows`` reason of a sample whose value is not a finite number."""


def parse_prometheus(text: str, *, ts: float | None = None, host: str | None = None) -> PromParse:
    """Parse Prometheus text exposition into a sample frame (vectorised with Polars).

    ``ts`` is used for samples without their own timestamp (default: now); ``host`` for
    samples without a ``Hostname``/``hostname`` label. Labels become a JSON object string.
    """
    now = time.time() if ts is None else ts
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    ascii_text = text.isascii()
    frame = pl.DataFrame({"raw": pl.Series("raw", text.split("\n"), dtype=pl.String())})
    # sample lines of the common shape are never comments or blank: only the rest are checked
    parts, rest = _fast_parts(frame.with_row_index("_row"), ascii_text=ascii_text)
    stripped = pl.col("raw").str.strip_chars_start()
    types = (
        rest.filter(stripped.str.starts_with("# TYPE "))
        .select(pl.col("raw").str.extract_groups(r"^\s*# TYPE\s+(\S+)\s+(\S+)").alias("g"))
        .unnest("g")
        .rows()
    )
    data = rest.filter(~stripped.str.starts_with("#") & (stripped.str.len_bytes() > 0))
    if not data.is_empty():
        slow = _general_parts(data)
        parts = pl.concat([parts, slow]).sort("_row") if not parts.is_empty() else slow
    # NaN, +Inf and -Inf are valid exposition values, but no sample or rate can use them:
    # they are rejected (counted, kept in rejected_rows) like any unusable line
    non_finite = pl.col("value").is_not_null() & ~pl.col("value").is_finite()
    bad = pl.col("_why").is_not_null() | pl.col("value").is_null() | non_finite
    reason = (
        pl.when(pl.col("_why").is_not_null())
        .then(pl.col("_why"))
        .when(non_finite)
        .then(pl.lit(NON_FINITE_REASON))
        .otherwise(pl.lit("value is not a number"))
    )
    malformed = parts.filter(bad).select("_row", "raw", reason.alias("reason"))
    good = parts.filter(~bad).drop("raw")
    # DCGM blanks: only rows whose value is one of the sentinels' floats can be one
    maybe = good.filter(
        pl.col("metric").str.starts_with("DCGM_") & pl.col("value").is_in(_SENTINEL_FLOATS)
    )
    kind = pl.col("vtext").replace_strict(DCGM_SENTINELS, default=None, return_dtype=pl.String())
    blanks = maybe.select(
        "_row",
        pl.when(kind.is_null() & (pl.col("value") == INT64_BLANK_AS_FLOAT))
        .then(pl.lit("blank"))
        .otherwise(kind)
        .alias("_sentinel"),
    ).filter(pl.col("_sentinel").is_not_null())
    sentinels = blanks.group_by("_sentinel").len().sort("_sentinel")
    if not blanks.is_empty():
        good = good.join(blanks, on="_row", how="anti", maintain_order="left")
    good = _label_columns(good.with_columns(pl.col("lbl").fill_null("{}")), host)
    bad_labels = (
        good.filter(pl.col("labels").is_null())
        .select("_row")
        .join(parts.select("_row", "raw"), on="_row")
        .with_columns(pl.lit("malformed labels").alias("reason"))
    )
    if not bad_labels.is_empty():
        malformed = pl.concat([malformed, bad_labels]).sort("_row")
        good = good.filter(pl.col("labels").is_not_null())
    samples = good.select(
        (pl.col("_tsi").cast(pl.Float64()) / 1000.0).fill_null(now).alias("ts"),
        "host",
        "metric",
        "labels",
        "value",
        "job",
    )
    return PromParse(
        samples=samples,
        types=tuple((str(n), str(t)) for n, t in types),
        malformed=malformed.drop("_row"),
        sentinels=tuple((str(k), int(n)) for k, n in sentinels.rows()),
        lines=frame.height,
    )
