"""Interconnect telemetry: parsers, scrapers, counter->rate, and ingest into DuckDB.

Formats (real fixtures in ../shared/data/telemetry/):

- Prometheus text exposition: DCGM exporter (``Hostname`` or ``hostname`` label, ``hpc_job``
  maps a GPU to a Slurm job, DCGM's blank values such as 9223372036854775794 = "not
  supported" are dropped and counted) and node_exporter's InfiniBand metrics.
  ``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` are rates in B/s and
  ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is a rate in MB/s despite its counter declaration,
  so they become ``link_load`` rows directly (``DCGM_FIELDS``: each field's unit and why).
- ``/sys/class/infiniband`` (``read_sysfs``) and ``perfquery -x`` (``parse_perfquery``):
  ``port_{xmit,rcv}_data`` / ``Port{Xmit,Rcv}Data`` count 4-byte words; legacy 32-bit
  counters saturate at 2**32-1.

All three InfiniBand sources land in ``telemetry_samples`` as raw counters; rates come from
``derive_ib_link_load`` (``counter_rates``: wrap, reset, saturation and gap detection, each
counted, no negative rate, capped at the link's line rate when known).
Parsing is vectorised with Polars; storing is DuckDB SQL over the frames.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from linkwise.datasets.store import run_sql, scalar

SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64(),
    "host": pl.String(),
    "metric": pl.String(),
    "labels": pl.String(),
    "value": pl.Float64(),
    "job": pl.String(),
}
"""Columns of a parsed sample frame (``source`` is added when stored)."""

# DCGM's blank values (dcgm_structs.h): int64, int32 and fp64 families; +2 = not supported.
_DCGM_SENTINELS: dict[str, str] = {
    "9223372036854775792": "blank",
    "9223372036854775793": "not_found",
    "9223372036854775794": "not_supported",
    "9223372036854775795": "not_permissioned",
    "2147483632": "blank",
    "2147483633": "not_found",
    "2147483634": "not_supported",
    "2147483635": "not_permissioned",
    "140737488355328": "blank",
    "140737488355329": "not_found",
    "140737488355330": "not_supported",
    "140737488355331": "not_permissioned",
}
_INT64_BLANK_AS_FLOAT = float(9223372036854775794)  # the whole int64 family rounds to 2**63

UNIT_BYTES_PER_S: dict[str, float] = {"B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6}
"""Bytes per second in one unit of each rate unit a DCGM field is read in."""


@dataclass(frozen=True, slots=True)
class DcgmField:
    """A DCGM field read as a link rate: its link class and direction, its unit, bytes per
    second per unit (``UNIT_BYTES_PER_S[unit]``), and where the unit comes from."""

    link_class: str
    direction: str
    unit: str
    bytes_per_s: float
    evidence: str


def _dcgm(link_class: str, direction: str, unit: str, evidence: str) -> DcgmField:
    return DcgmField(link_class, direction, unit, UNIT_BYTES_PER_S[unit], evidence)


_PROF = "DCGM profiling field: a rate in B/s (dcgm-exporter's field list: 'in bytes per second')"
DCGM_FIELDS: dict[str, DcgmField] = {
    "DCGM_FI_PROF_PCIE_TX_BYTES": _dcgm("pcie", "tx", "B/s", _PROF),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _dcgm("pcie", "rx", "B/s", _PROF),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": _dcgm("nvlink", "tx", "B/s", _PROF),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": _dcgm("nvlink", "rx", "B/s", _PROF),
    # dcgm_fields.h (field 449) names no unit and dcgm-exporter declares it a counter; a
    # dcgm-exporter maintainer wrote "as far as I can tell the units are KB/s"
    # (NVIDIA/dcgm-exporter#472, 2025), but on 4 x H200 under FSDP it reads ~200,000 per GPU
    # while nvidia-smi's NVLink counters give ~202 GB/s (KempnerInstitute/kempnerpulse#11,
    # 2026): MB/s, and KB/s would be 200 MB/s. Whether MB means 10^6 or 2^20 is not said.
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _dcgm(
        "nvlink",
        "total",
        "MB/s",
        "a rate despite its counter declaration; MB/s as measured against nvidia-smi",
    ),
}
"""Every DCGM field that becomes ``link_load``, with its unit (one table: change it here)."""

_W32 = float(2**32 - 1)
_M64 = float(2**64)


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """How a raw byte counter becomes a rate: direction, bytes per unit, the exact value of a
    saturated 32-bit counter (None for fields that are always 64-bit), the wrap point of the
    64-bit counter, and a priority (lower wins when two sources describe the same port).

    A field that may be either width (sysfs ``counters/``: 32-bit before Linux 4.5 or on HCAs
    without extended counters, 64-bit on mlx5 or hfi1) is read as 64-bit unless it holds
    exactly the saturation value: a 32-bit PMA counter stops there and never wraps, so below
    it both widths give the same rates and above it the counter is 64-bit.
    """

    direction: str
    bytes_per_unit: float
    saturate_at: float | None
    wrap_modulus: float | None
    priority: int


IB_COUNTERS: dict[str, CounterSpec] = {
    "ib_sysfs_port_xmit_data_64": CounterSpec("tx", 4.0, None, _M64, 0),
    "ib_sysfs_port_rcv_data_64": CounterSpec("rx", 4.0, None, _M64, 0),
    "ib_perfquery_PortXmitData": CounterSpec("tx", 4.0, None, _M64, 0),
    "ib_perfquery_PortRcvData": CounterSpec("rx", 4.0, None, _M64, 0),
    # node_exporter: counters_ext (64-bit) as "legacy", counters/ as "port"; words x 4 in a
    # uint64, so its bytes wrap at 2**64
    "node_infiniband_legacy_data_transmitted_bytes_total": CounterSpec("tx", 1.0, None, _M64, 0),
    "node_infiniband_legacy_data_received_bytes_total": CounterSpec("rx", 1.0, None, _M64, 0),
    "ib_sysfs_port_xmit_data": CounterSpec("tx", 4.0, _W32, _M64, 1),
    "ib_sysfs_port_rcv_data": CounterSpec("rx", 4.0, _W32, _M64, 1),
    "node_infiniband_port_data_transmitted_bytes_total": CounterSpec("tx", 1.0, 4 * _W32, _M64, 1),
    "node_infiniband_port_data_received_bytes_total": CounterSpec("rx", 1.0, 4 * _W32, _M64, 1),
}
_IB_RATE_METRICS = ("node_infiniband_rate_bytes_per_second", "ib_sysfs_rate_bytes_per_second")


class ScrapeError(RuntimeError):
    """A scrape failed (unreachable endpoint, timeout, HTTP error, unreadable file)."""


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


@dataclass(frozen=True, slots=True)
class RateReport:
    """What ``counter_rates`` saw: intervals examined and how each case was handled."""

    intervals: int
    rates: int
    first_samples: int
    gaps: int
    resets: int
    wraps: int
    saturated: int
    non_increasing_time: int
    capped: int
    port_directions: int = 0
    without_rate: tuple[tuple[str, int], ...] = ()
    non_finite: int = 0  # counter samples (or line rates) that were NaN or infinite, skipped
    invalid_rates: int = 0  # derived rates that were negative or not finite, dropped

    @property
    def ports_without_rate(self) -> int:
        """Port directions (node, device, direction) that got no rate at all."""
        return sum(n for _, n in self.without_rate)


NO_RATE_REASONS: dict[str, str] = {
    "first": "first sample (needs a second scrape)",
    "saturated": "saturated 32-bit counter",
    "reset": "counter reset",
    "gap": "gap between samples",
    "non_increasing_time": "timestamps not increasing",
}
"""Why a port direction got no rate: its last interval's case, in words."""


@dataclass(frozen=True, slots=True)
class TelemetryReport:
    """What one telemetry ingest stored and dropped."""

    source: str
    samples: int
    malformed: int
    sentinels: tuple[tuple[str, int], ...]
    unsupported: int
    link_load_rows: int
    negative_rates_dropped: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        """Samples stored per second of wall time."""
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


# ---------------------------------------------------------------- Prometheus text


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
_SENTINEL_FLOATS = sorted({float(k) for k in _DCGM_SENTINELS} | {_INT64_BLANK_AS_FLOAT})
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
    kind = pl.col("vtext").replace_strict(_DCGM_SENTINELS, default=None, return_dtype=pl.String())
    blanks = maybe.select(
        "_row",
        pl.when(kind.is_null() & (pl.col("value") == _INT64_BLANK_AS_FLOAT))
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


# ---------------------------------------------------------------- scrapers


@dataclass(frozen=True, slots=True)
class Scrape:
    """One HTTP scrape: the body, when it was fetched, and from where."""

    url: str
    text: str
    fetched_at: float


def scrape_http(url: str, timeout: float = 5.0, *, max_bytes: int = 256 * 2**20) -> Scrape:
    """GET an exporter endpoint (http/https only); raise ScrapeError clearly.

    ``timeout`` bounds the whole scrape (connect, headers and body), not each read: at the
    deadline a timer shuts the socket down, so an exporter that trickles bytes cannot hold
    the caller longer than ``timeout`` (and a little)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ScrapeError(f"{url}: only http and https endpoints can be scraped")
    if not timeout > 0:
        raise ScrapeError(f"{url}: the timeout must be positive, not {timeout}")
    conn: http.client.HTTPConnection
    try:
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    except (http.client.InvalidURL, ValueError) as exc:
        raise ScrapeError(f"{url}: {exc}") from exc
    expired = threading.Event()

    def abort() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, abort)
    timer.daemon = True
    timer.start()
    chunks: list[bytes] = []
    try:
        conn.request("GET", path, headers={"Accept": "text/plain", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status >= 400:
            raise ScrapeError(f"{url}: HTTP {resp.status} {resp.reason}")
        size = 0
        while size <= max_bytes and not expired.is_set():
            chunk = resp.read1(min(2**16, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                expired.set()
        charset = resp.headers.get_content_charset() or "utf-8"
    except ScrapeError:
        raise
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if expired.is_set():
            raise ScrapeError(f"{url}: cannot scrape within {timeout} s: deadline passed") from exc
        raise ScrapeError(f"{url}: cannot scrape within {timeout} s: {exc}") from exc
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise ScrapeError(f"{url}: cannot scrape within {timeout} s: deadline passed")
    body = b"".join(chunks)
    if len(body) > max_bytes:
        raise ScrapeError(f"{url}: response larger than {max_bytes} bytes")
    try:
        text = body.decode(charset, errors="replace")
    except LookupError:
        text = body.decode("utf-8", errors="replace")
    return Scrape(url=url, text=text, fetched_at=time.time())


@dataclass(frozen=True, slots=True)
class SysfsReading:
    """Counters read from /sys/class/infiniband as samples, plus the unsupported ones."""

    samples: pl.DataFrame
    unsupported: int
    ports: int


_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def read_sysfs(root: str | Path, *, host: str, ts: float | None = None) -> SysfsReading:
    """Read every HCA port's counters under ``root`` (a sysfs mount such as ``/sys``, or the
    ``class/infiniband`` folder itself). "N/A (no PMA)" values are counted, not stored."""
    base = Path(root)
    if (base / "class" / "infiniband").is_dir():
        base = base / "class" / "infiniband"
    if not base.is_dir():
        raise ScrapeError(f"{root}: no InfiniBand sysfs tree")
    now = time.time() if ts is None else ts
    metrics: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    unsupported = 0
    ports = 0
    for port_dir in sorted(base.glob("*/ports/*")):
        if not port_dir.is_dir():
            continue
        ports += 1
        device, port = port_dir.parent.parent.name, port_dir.name
        link_layer = _read_text(port_dir / "link_layer") or "InfiniBand"
        lbl = json.dumps({"device": device, "port": port, "link_layer": link_layer})
        rate = _RATE_RE.match(_read_text(port_dir / "rate") or "")
        if rate:
            metrics.append("ib_sysfs_rate_bytes_per_second")
            labels.append(lbl)
            values.append(float(rate.group(1)) * 1e9 / 8)
        for group in ("counters", "counters_ext"):
            for f in sorted((port_dir / group).glob("*")):
                raw = _read_text(f)
                try:
                    value = float(int(raw or ""))
                except ValueError:
                    unsupported += 1
                    continue
                metrics.append(f"ib_sysfs_{f.name}")
                labels.append(lbl)
                values.append(value)
    samples = samples_frame(now, host, metrics, labels, values)
    return SysfsReading(samples=samples, unsupported=unsupported, ports=ports)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError as exc:
        raise ScrapeError(f"{path}: {exc}") from exc


_PQ_HEADER = re.compile(r"^#\s*(.*?counters):\s*Lid\s+(\d+)\s+port\s+(\d+)", re.IGNORECASE)
_PQ_FIELD = re.compile(r"^([A-Za-z0-9_]+):\.*\s*(\S+)\s*$")
_PQ_SKIP = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})


def parse_perfquery(text: str, *, host: str, ts: float | None = None) -> pl.DataFrame:
    """Parse ``perfquery -x`` (and ``-E``) output into samples named ``ib_perfquery_<Field>``
    with labels lid, port and block; values are the raw counters (data fields in 4-byte
    words)."""
    now = time.time() if ts is None else ts
    metrics: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    lbl: str | None = None
    for line in text.splitlines():
        header = _PQ_HEADER.match(line)
        if header:
            block = header.group(1).strip().lower().replace(" ", "_")
            lbl = json.dumps({"lid": header.group(2), "port": header.group(3), "block": block})
            continue
        field = _PQ_FIELD.match(line)
        if field is None or lbl is None or field.group(1) in _PQ_SKIP:
            continue
        try:
            value = float(int(field.group(2), 0))
        except ValueError:
            continue
        metrics.append(f"ib_perfquery_{field.group(1)}")
        labels.append(lbl)
        values.append(value)
    return samples_frame(now, host, metrics, labels, values)


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


# ---------------------------------------------------------------- counters -> rates


_RATE_KEYS = ["node", "device", "link_class", "direction"]


def counter_rates(
    counters: pl.DataFrame, *, expected_interval_s: float, gap_factor: float = 3.0
) -> tuple[pl.DataFrame, RateReport]:
    """Turn cumulative counters into per-interval rates (bytes/s), vectorised.

    Input columns: node, device, link_class, direction, ts, value (raw units),
    bytes_per_unit, saturate_at, wrap_modulus, max_bytes_per_s (the last three nullable).
    Per consecutive pair of one series: a time step <= 0 or > ``gap_factor`` x the expected
    interval is dropped (non_increasing_time / gaps); an interval touching exactly the
    saturation value of a 32-bit counter is dropped (saturated); a drop is a wrap when the
    previous value was in the top half of the modulus and the wrapped rate is plausible, else
    a reset (dropped); a rate above the line rate is capped. Output: node, device,
    link_class, direction, ts (interval start), interval_s, bytes_per_s; the report also
    says, per port direction without any rate, why (``NO_RATE_REASONS``).
    """
    finite = pl.col("value").is_finite() & pl.col("ts").is_finite()
    non_finite = counters.filter(~finite.fill_null(False)).height
    line_rate = pl.col("max_bytes_per_s")
    counters = counters.filter(finite.fill_null(False)).with_columns(
        pl.when(line_rate.is_finite() & (line_rate > 0)).then(line_rate).alias("max_bytes_per_s")
    )
    df = counters.sort([*_RATE_KEYS, "ts"]).with_columns(
        pl.col("value").shift(1).over(_RATE_KEYS).alias("_pv"),
        pl.col("ts").shift(1).over(_RATE_KEYS).alias("_pt"),
    )
    dt = pl.col("ts") - pl.col("_pt")
    delta = pl.col("value") - pl.col("_pv")
    mod = pl.col("wrap_modulus")
    wrapped_units = (mod - pl.col("_pv")) + pl.col("value")  # this order keeps precision
    wrapped_rate = wrapped_units * pl.col("bytes_per_unit") / dt
    wrap_ok = (
        (delta < 0)
        & mod.is_not_null()
        & (pl.col("_pv") >= mod / 2)
        & (pl.col("value") < mod / 2)
        & (pl.col("max_bytes_per_s").is_null() | (wrapped_rate <= pl.col("max_bytes_per_s")))
    ).fill_null(False)
    sat = pl.col("saturate_at")
    saturated = (sat.is_not_null() & ((pl.col("value") == sat) | (pl.col("_pv") == sat))).fill_null(
        False
    )
    case = (
        pl.when(pl.col("_pt").is_null())
        .then(pl.lit("first"))
        .when(dt <= 0)
        .then(pl.lit("non_increasing_time"))
        .when(dt > gap_factor * expected_interval_s)
        .then(pl.lit("gap"))
        .when(saturated)
        .then(pl.lit("saturated"))
        .when(wrap_ok)
        .then(pl.lit("wrap"))
        .when(delta < 0)
        .then(pl.lit("reset"))
        .otherwise(pl.lit("ok"))
    )
    df = df.with_columns(case.alias("_case"))
    units = pl.when(pl.col("_case") == "wrap").then(wrapped_units).otherwise(delta)
    out = df.filter(pl.col("_case").is_in(["ok", "wrap"])).with_columns(
        (units * pl.col("bytes_per_unit") / dt).alias("_raw_rate"), dt.alias("interval_s")
    )
    over = (pl.col("max_bytes_per_s").is_not_null()) & (
        pl.col("_raw_rate") > pl.col("max_bytes_per_s")
    )
    out = out.with_columns(
        over.fill_null(False).alias("_capped"),
        pl.when(over)
        .then(pl.col("max_bytes_per_s"))
        .otherwise(pl.col("_raw_rate"))
        .alias("bytes_per_s"),
    )
    valid = pl.col("bytes_per_s").is_finite() & (pl.col("bytes_per_s") >= 0)
    invalid = out.filter(~valid.fill_null(False)).height
    out = out.filter(valid.fill_null(False))
    counts = dict(df.group_by("_case").len().rows())
    series = df.group_by(_RATE_KEYS).agg(
        pl.col("_case").is_in(["ok", "wrap"]).any().alias("_rated"),
        pl.col("_case").filter(pl.col("_case") != "first").last().fill_null("first").alias("_why"),
    )
    why = series.filter(~pl.col("_rated")).group_by("_why").len().sort("_why").rows()
    report = RateReport(
        intervals=df.height - int(counts.get("first", 0)),
        rates=out.height,
        first_samples=int(counts.get("first", 0)),
        gaps=int(counts.get("gap", 0)),
        resets=int(counts.get("reset", 0)),
        wraps=int(counts.get("wrap", 0)),
        saturated=int(counts.get("saturated", 0)),
        non_increasing_time=int(counts.get("non_increasing_time", 0)),
        capped=int(out["_capped"].sum()),
        port_directions=series.height,
        without_rate=tuple((NO_RATE_REASONS.get(str(k), str(k)), int(n)) for k, n in why),
        non_finite=non_finite,
        invalid_rates=invalid,
    )
    rates = out.select(
        "node",
        "device",
        "link_class",
        "direction",
        pl.col("_pt").alias("ts"),
        "interval_s",
        "bytes_per_s",
    )
    return rates, report


# ---------------------------------------------------------------- storing


def store_samples(con: duckdb.DuckDBPyConnection, samples: pl.DataFrame, *, source: str) -> int:
    """Append a sample frame (``SAMPLE_SCHEMA``) to ``telemetry_samples``; return the rows."""
    con.register("sample_batch", samples)
    try:
        run_sql(
            con,
            "INSERT INTO telemetry_samples (ts, host, source, metric, labels, value, job) "
            "SELECT ts, host, ?, metric, labels, value, job FROM sample_batch",
            [source],
        )
    finally:
        con.unregister("sample_batch")
    return samples.height


def _store_link_load(
    con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, *, cluster: str, source: str
) -> int:
    """Insert link_load rows, keeping existing ones for the same key (idempotent). The last
    guard: a rate or interval that is not a finite non-negative number is never stored."""
    valid = (
        pl.col("bytes_per_s").is_finite()
        & (pl.col("bytes_per_s") >= 0)
        & pl.col("interval_s").is_finite()
        & pl.col("ts").is_finite()
    )
    rows = rows.filter(valid.fill_null(False))
    if rows.is_empty():
        return 0
    before = _count(con, "link_load")
    lo, hi = rows.select(pl.col("ts").min().alias("lo"), pl.col("ts").max().alias("hi")).row(0)
    con.register("load_batch", rows)
    try:
        run_sql(
            con,
            # the anti-join drops the rows already stored (their ts range only) cheaply;
            # ON CONFLICT still guards the key against duplicates within the batch
            "INSERT INTO link_load (ts, interval_s, cluster, node, device, link_class, "
            "direction, bytes_per_s, source) SELECT b.ts, b.interval_s, ?, b.node, "
            "b.device, b.link_class, b.direction, b.bytes_per_s, ? FROM load_batch b "
            "ANTI JOIN (SELECT node, device, link_class, direction, ts FROM link_load "
            "WHERE cluster = ? AND ts BETWEEN ? AND ?) l "
            "USING (node, device, link_class, direction, ts) ON CONFLICT DO NOTHING",
            [cluster, source, cluster, lo, hi],
        )
    finally:
        con.unregister("load_batch")
    return _count(con, "link_load") - before


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    return int(str(scalar(con, f"SELECT count(*) FROM {table}")))


def dcgm_link_load(samples: pl.DataFrame, *, interval_s: float) -> tuple[pl.DataFrame, int]:
    """link_load rows from DCGM's rate gauges (one per GPU, link class, direction and ts);
    also the number of negative or NaN rates dropped."""
    spec = pl.DataFrame(
        {
            "metric": list(DCGM_FIELDS),
            "link_class": [f.link_class for f in DCGM_FIELDS.values()],
            "direction": [f.direction for f in DCGM_FIELDS.values()],
            "factor": [f.bytes_per_s for f in DCGM_FIELDS.values()],
        }
    )
    lbl = pl.col("labels")  # compact JSON written by _label_table: a key follows '{' or ','
    gpu = lbl.str.extract(r'[{,]"gpu":"((?:[^"\\]|\\.)*)"', 1)
    mig = lbl.str.extract(r'[{,]"GPU_I_ID":"((?:[^"\\]|\\.)*)"', 1)
    link = lbl.str.extract(r'[{,]"nvlink":"((?:[^"\\]|\\.)*)"', 1)
    device = pl.concat_str(
        pl.lit("gpu"),
        gpu.fill_null("?"),
        pl.when(mig.is_not_null()).then(pl.lit(":mig") + mig).otherwise(pl.lit("")),
        pl.when(link.is_not_null()).then(pl.lit(":link") + link).otherwise(pl.lit("")),
    )
    rows = samples.join(spec, on="metric", how="inner").with_columns(
        (pl.col("value") * pl.col("factor")).alias("bytes_per_s"),
        device.alias("device"),
        pl.col("host").fill_null("").alias("node"),
        pl.lit(interval_s).alias("interval_s"),
    )
    valid = pl.col("bytes_per_s").is_finite() & (pl.col("bytes_per_s") >= 0)
    dropped = rows.filter(~valid).height
    out = rows.filter(valid).select(
        "ts", "interval_s", "node", "device", "link_class", "direction", "bytes_per_s"
    )
    return out.unique(subset=["node", "device", "link_class", "direction", "ts"]), dropped


def ingest_prometheus(
    con: duckdb.DuckDBPyConnection,
    text: str,
    *,
    source: str,
    ts: float | None = None,
    host: str | None = None,
    cluster: str = "",
    interval_s: float = 30.0,
) -> TelemetryReport:
    """Parse an exposition and store it in one transaction: samples, malformed lines (to
    ``rejected_rows``) and the DCGM rate gauges as ``link_load``."""
    t0 = time.perf_counter()
    parsed = parse_prometheus(text, ts=ts, host=host)
    load, negative = dcgm_link_load(parsed.samples, interval_s=interval_s)
    con.begin()
    try:
        stored = store_samples(con, parsed.samples, source=source)
        load_rows = _store_link_load(con, load, cluster=cluster, source=source)
        _store_malformed(con, parsed.malformed, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return TelemetryReport(
        source=source,
        samples=stored,
        malformed=parsed.malformed.height,
        sentinels=parsed.sentinels,
        unsupported=0,
        link_load_rows=load_rows,
        negative_rates_dropped=negative,
        seconds=time.perf_counter() - t0,
    )


def ingest_samples(
    con: duckdb.DuckDBPyConnection, samples: pl.DataFrame, *, source: str, unsupported: int = 0
) -> TelemetryReport:
    """Store samples read by ``read_sysfs``/``parse_perfquery`` (one transaction)."""
    t0 = time.perf_counter()
    con.begin()
    try:
        stored = store_samples(con, samples, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return TelemetryReport(
        source=source,
        samples=stored,
        malformed=0,
        sentinels=(),
        unsupported=unsupported,
        link_load_rows=0,
        negative_rates_dropped=0,
        seconds=time.perf_counter() - t0,
    )


def _store_malformed(
    con: duckdb.DuckDBPyConnection, malformed: pl.DataFrame, *, source: str
) -> None:
    if malformed.is_empty():
        return
    con.register("bad_lines", malformed)
    try:
        run_sql(
            con,
            "INSERT INTO rejected_rows (source, raw, reason, rejected_at) "
            "SELECT ?, raw, reason, ? FROM bad_lines",
            [source, time.time()],
        )
    finally:
        con.unregister("bad_lines")


def _counter_spec_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "metric": list(IB_COUNTERS),
            "direction": [s.direction for s in IB_COUNTERS.values()],
            "bytes_per_unit": [s.bytes_per_unit for s in IB_COUNTERS.values()],
            "saturate_at": [s.saturate_at for s in IB_COUNTERS.values()],
            "wrap_modulus": [s.wrap_modulus for s in IB_COUNTERS.values()],
            "priority": [s.priority for s in IB_COUNTERS.values()],
        },
        schema={
            "metric": pl.String(),
            "direction": pl.String(),
            "bytes_per_unit": pl.Float64(),
            "saturate_at": pl.Float64(),
            "wrap_modulus": pl.Float64(),
            "priority": pl.Int32(),
        },
    )


def derive_ib_link_load(
    con: duckdb.DuckDBPyConnection,
    *,
    since: float,
    until: float,
    expected_interval_s: float,
    gap_factor: float = 3.0,
    cluster: str = "",
    source: str = "derived:ib",
) -> tuple[int, RateReport]:
    """Derive InfiniBand ``link_load`` rows for intervals starting in [since, until) from the
    raw counters in ``telemetry_samples`` (any of the three sources; one per port, the
    preferred counter wins). Returns the rows added and the counter report."""
    lookback = since - gap_factor * expected_interval_s
    raw = con.sql(
        """
        SELECT ts, coalesce(host, '') AS node, metric, value,
               coalesce(labels->>'device', 'lid' || (labels->>'lid')) AS dev,
               labels->>'port' AS port,
               CASE WHEN labels->>'link_layer' = 'Ethernet' THEN 'eth' ELSE 'ib' END AS link_class
        FROM telemetry_samples
        WHERE ts >= $lookback AND ts < $until AND (metric IN $counters OR metric IN $rates)
          AND json_valid(labels)
        """,
        params={
            "lookback": lookback,
            "until": until,
            "counters": list(IB_COUNTERS),
            "rates": list(_IB_RATE_METRICS),
        },
    ).pl()
    raw = raw.with_columns(
        pl.concat_str(pl.col("dev"), pl.lit("/"), pl.col("port").fill_null("?")).alias("device")
    )
    line = (
        raw.filter(pl.col("metric").is_in(list(_IB_RATE_METRICS)))
        .group_by("node", "device")
        .agg(pl.col("value").sort_by("ts").last().alias("max_bytes_per_s"))
    )
    counters = raw.join(_counter_spec_frame(), on="metric", how="inner")
    best = counters.group_by("node", "device", "direction").agg(
        pl.col("priority").min().alias("best")
    )
    counters = (
        counters.join(best, on=["node", "device", "direction"])
        .filter(pl.col("priority") == pl.col("best"))
        .join(line, on=["node", "device"], how="left")
        .unique(subset=["node", "device", "direction", "ts"], keep="first")
    )
    rates, report = counter_rates(
        counters, expected_interval_s=expected_interval_s, gap_factor=gap_factor
    )
    rates = rates.filter((pl.col("ts") >= since) & (pl.col("ts") < until))
    con.begin()
    try:
        added = _store_link_load(con, rates, cluster=cluster, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return added, report
