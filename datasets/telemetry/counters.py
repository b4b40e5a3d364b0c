"""InfiniBand byte counters to rates: which counters (``IB_COUNTERS``) and ``counter_rates``
(wrap, reset, saturation and gap detection, each counted)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

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
IB_RATE_METRICS = ("node_infiniband_rate_bytes_per_second", "ib_sysfs_rate_bytes_per_second")


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


def counter_spec_frame() -> pl.DataFrame:
    """``IB_COUNTERS`` as a frame keyed by metric, to join raw counter samples with."""
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
