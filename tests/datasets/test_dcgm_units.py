"""The unit of every DCGM field read as a link rate is explicit, checked against what the
exporter itself says, and applied when link_load rows are derived."""

from __future__ import annotations

import csv
from pathlib import Path

from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.dcgm import DCGM_FIELDS, UNIT_BYTES_PER_S
from linkwise.datasets.telemetry.store import ingest_prometheus

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "telemetry"


def test_each_field_states_its_unit_and_the_factor_follows_from_it() -> None:
    assert set(DCGM_FIELDS) == {
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    }
    for field in DCGM_FIELDS.values():
        assert field.bytes_per_s == UNIT_BYTES_PER_S[field.unit]
        assert field.evidence
    assert DCGM_FIELDS["DCGM_FI_PROF_PCIE_TX_BYTES"].unit == "B/s"
    assert DCGM_FIELDS["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].unit == "MB/s"


def test_the_exporter_field_list_agrees_on_the_profiling_fields() -> None:
    """dcgm-exporter's own field list (real file) describes the PCIe fields as bytes/s."""
    rows = {}
    with (DATA / "dcgm_exporter_default_counters.csv").open() as handle:
        for row in csv.reader(handle):
            if row and not row[0].lstrip().startswith("#") and len(row) >= 3:
                rows[row[0].strip()] = (row[1].strip(), row[2].strip())
    for name in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        kind, text = rows[name]
        assert kind == "gauge" and "bytes per second" in text
        assert DCGM_FIELDS[name].unit == "B/s"
    # declared a counter, read as a rate (a gauge): its help names no unit
    kind, text = rows["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]
    assert kind == "counter" and "/s" not in text


def test_link_load_applies_each_unit() -> None:
    con = open_store(":memory:")
    text = "\n".join(
        [
            'DCGM_FI_PROF_PCIE_TX_BYTES{gpu="0",Hostname="h"} 33011804',
            'DCGM_FI_PROF_NVLINK_RX_BYTES{gpu="0",Hostname="h"} 5e10',
            # an H200 under FSDP reads ~200,000 here: 200 GB/s, as nvidia-smi measures
            'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{gpu="0",Hostname="h"} 200000',
        ]
    )
    assert ingest_prometheus(con, text, source="d", ts=1.0).link_load_rows == 3
    got = dict(
        ((c, d), v)
        for c, d, v in con.execute(
            "SELECT link_class, direction, bytes_per_s FROM link_load"
        ).fetchall()
    )
    assert got == {
        ("pcie", "tx"): 33011804.0,
        ("nvlink", "rx"): 5e10,
        ("nvlink", "total"): 2e11,
    }
