"""DCGM fields read as link rates (``DCGM_FIELDS``, the one unit table) and DCGM's blank
values; ``dcgm_link_load`` turns the rate gauges of a sample frame into ``link_load`` rows."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# DCGM's blank values (dcgm_structs.h): int64, int32 and fp64 families; +2 = not supported.
DCGM_SENTINELS: dict[str, str] = {
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
INT64_BLANK_AS_FLOAT = float(9223372036854775794)  # the whole int64 family rounds to 2**63

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
    lbl = pl.col(
        "labels"
    )  # compact JSON written by prometheus._label_table: a key follows '{' or ','
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
