"""InfiniBand counter widths on sysfs trees laid out like real mlx4, mlx5, hfi1 and mthca HCAs.

Since Linux 4.5, ``ports/N/counters/port_{xmit,rcv}_data`` hold the 64-bit PortCounters-
Extended values when the HCA supports them (mlx5, hfi1); before, mlx4 put the 64-bit ones
in ``counters_ext/*_64`` beside 32-bit ``counters/``; InfiniHost (mthca) has 32-bit only,
and 32-bit PMA counters stop at 2**32-1. Values are in 4-byte words; the figures below are
of the size real ports show (a real mlx5_0 read 2,880,761,508,848).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.counters import IB_COUNTERS, counter_rates
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_samples
from linkwise.datasets.telemetry.sysfs import read_sysfs

W32 = 2**32 - 1
GBPS_100 = "100 Gb/sec (4X EDR)"


def _port(root: Path, device: str, port: int, files: dict[str, int | str], rate: str) -> None:
    base = root / "class" / "infiniband" / device / "ports" / str(port)
    for rel, value in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    (base / "rate").write_text(f"{rate}\n")
    (base / "link_layer").write_text("InfiniBand\n")
    (base / "state").write_text("4: ACTIVE\n")


def _tree(root: Path, step: int) -> None:
    """Counters after ``step`` intervals of 10 s; each port moves 2.5e8 words (1 GB) a step."""
    d = 250_000_000 * step
    # mlx4 before Linux 4.5: 32-bit counters/ (saturated long ago), 64-bit counters_ext/
    _port(
        root,
        "mlx4_0",
        1,
        {
            "counters/port_xmit_data": W32,
            "counters/port_rcv_data": W32,
            "counters/port_xmit_wait": W32,
            "counters_ext/port_xmit_data_64": 91_448_313_922 + d,
            "counters_ext/port_rcv_data_64": 88_120_004_117 + d,
        },
        "56 Gb/sec (4X FDR)",
    )
    # mlx5 (ConnectX-6): 64-bit values in counters/
    _port(
        root,
        "mlx5_0",
        1,
        {
            "counters/port_xmit_data": 2_880_761_508_848 + d,
            "counters/port_rcv_data": 2_911_406_775_524 + d,
            "counters/port_xmit_wait": 1_204_117_690,
        },
        "200 Gb/sec (4X HDR)",
    )
    # hfi1 (Omni-Path): 64-bit values in counters/
    _port(
        root,
        "hfi1_0",
        1,
        {
            "counters/port_xmit_data": 17_179_869_184_000 + d,
            "counters/port_rcv_data": 16_990_422_007_296 + d,
        },
        GBPS_100,
    )
    # InfiniHost (mthca): 32-bit only, saturated
    _port(
        root,
        "mthca0",
        1,
        {"counters/port_xmit_data": W32, "counters/port_rcv_data": W32},
        "20 Gb/sec (4X DDR)",
    )


def test_64_bit_sysfs_counters_get_rates_and_saturated_32_bit_ones_are_explained(
    tmp_path: Path,
) -> None:
    con = open_store(tmp_path / "ib.duckdb")
    for step, ts in ((0, 1000.0), (1, 1010.0)):
        _tree(tmp_path / "sys", step)
        reading = read_sysfs(tmp_path / "sys", host="n1", ts=ts)
        ingest_samples(con, reading.samples, source="sysfs")
    added, rep = derive_ib_link_load(con, since=1000.0, until=1020.0, expected_interval_s=10.0)
    rows = con.execute(
        "SELECT device, direction, bytes_per_s FROM link_load ORDER BY device, direction"
    ).fetchall()
    # mlx4 from counters_ext, mlx5 and hfi1 from counters/: 6 of 8 port directions
    assert rows == [
        ("hfi1_0/1", "rx", 1e8),
        ("hfi1_0/1", "tx", 1e8),
        ("mlx4_0/1", "rx", 1e8),
        ("mlx4_0/1", "tx", 1e8),
        ("mlx5_0/1", "rx", 1e8),
        ("mlx5_0/1", "tx", 1e8),
    ]
    assert added == 6 and rep.saturated == 2
    assert rep.port_directions == 8
    assert dict(rep.without_rate) == {"saturated 32-bit counter": 2}


def test_a_single_scrape_says_why_no_port_has_a_rate_yet(tmp_path: Path) -> None:
    con = open_store(":memory:")
    _tree(tmp_path / "sys", 0)
    reading = read_sysfs(tmp_path / "sys", host="n1", ts=1000.0)
    ingest_samples(con, reading.samples, source="sysfs")
    added, rep = derive_ib_link_load(con, since=990.0, until=1020.0, expected_interval_s=10.0)
    assert added == 0 and rep.port_directions == 8
    assert dict(rep.without_rate) == {"first sample (needs a second scrape)": 8}


def _series(rows: list[tuple[float, float]], metric: str) -> pl.DataFrame:
    spec = IB_COUNTERS[metric]
    n = len(rows)
    return pl.DataFrame(
        {
            "node": ["n1"] * n,
            "device": ["mlx5_0/1"] * n,
            "link_class": ["ib"] * n,
            "direction": [spec.direction] * n,
            "ts": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "bytes_per_unit": [spec.bytes_per_unit] * n,
            "saturate_at": [spec.saturate_at] * n,
            "wrap_modulus": [spec.wrap_modulus] * n,
            "max_bytes_per_s": [None] * n,
        },
        schema_overrides={
            "saturate_at": pl.Float64,
            "wrap_modulus": pl.Float64,
            "max_bytes_per_s": pl.Float64,
        },
    )


@pytest.mark.parametrize(
    ("metric", "sat", "top"),
    [
        ("ib_sysfs_port_xmit_data", float(W32), float(2**64)),
        ("node_infiniband_port_data_transmitted_bytes_total", 4.0 * W32, float(2**64)),
    ],
)
def test_width_decides_saturation_and_wrap(metric: str, sat: float, top: float) -> None:
    """Above 2**32-1 a counter is 64-bit (a rate); exactly 2**32-1 is a saturated 32-bit one;
    a 64-bit counter wraps at its own width (node_exporter's bytes: 4 x words, mod 2**64)."""
    rows = [
        (0.0, sat - 1000.0),
        (10.0, sat + 9000.0),  # past 2**32-1: a 64-bit counter, 10000 units in 10 s
        (20.0, sat + 19000.0),
        (30.0, top - 4096.0),
        (40.0, 5904.0),  # wrap of a 64-bit counter: 10000 units
        (50.0, sat),  # exactly 2**32-1: saturated, not traffic
        (60.0, sat),
    ]
    rates, rep = counter_rates(_series(rows, metric), expected_interval_s=10.0)
    per_unit = IB_COUNTERS[metric].bytes_per_unit
    got = dict(zip(rates["ts"].to_list(), rates["bytes_per_s"].to_list(), strict=True))
    assert got[0.0] == got[10.0] == 1000.0 * per_unit
    assert got[30.0] == 1000.0 * per_unit and rep.wraps == 1
    assert rep.saturated == 2 and 40.0 not in got and 50.0 not in got


def test_collect_telemetry_says_how_many_ports_got_no_rate_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import time

    from linkwise.cli import main

    root = tmp_path / "sys"
    db = tmp_path / "t.duckdb"
    base = ["collect", "telemetry", "--db", str(db), "--sysfs", str(root), "--host", "n1"]
    base += ["--interval", "30"]  # the two readings are never a gap, however loaded
    _tree(root, 0)
    assert main(base) == 0
    text = capsys.readouterr().out
    assert "8 InfiniBand port directions, 8 without a rate" in text
    assert "first sample (needs a second scrape): 8" in text
    time.sleep(1.0)
    _tree(root, 1)
    assert main([*base, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rates"]["port_directions"] == 8
    assert out["rates"]["without_rate"] == {"saturated 32-bit counter": 2}
    assert out["ib_link_load_rows"] == 6
