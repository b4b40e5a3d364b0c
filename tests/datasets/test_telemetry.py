"""Telemetry: real fixture formats, HTTP/sysfs scrapes, counter->rate cases, link_load."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from linkwise.datasets.store import open_store, scalar
from linkwise.datasets.telemetry.counters import counter_rates
from linkwise.datasets.telemetry.perfquery import parse_perfquery
from linkwise.datasets.telemetry.prometheus import parse_prometheus
from linkwise.datasets.telemetry.scrape import ScrapeError, scrape_http
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus, ingest_samples
from linkwise.datasets.telemetry.sysfs import read_sysfs

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "telemetry"
A100 = DATA / "dcgm_exporter_metrics_a100_mig.prom"
RENDER = DATA / "dcgm_exporter_render_format_test.txt"
NODE_IB = DATA / "node_exporter_infiniband_e2e.prom"
TTAR = DATA / "node_exporter_sysfs_infiniband.ttar"
PERFQUERY = DATA / "perfquery_extended_switch.txt"


def extract_ttar(archive: Path, dest: Path) -> None:
    """Materialise a ttar archive (Directory:/Path:/Lines:/Mode: records) under dest."""
    lines = archive.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Directory: "):
            (dest / line.removeprefix("Directory: ")).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = dest / line.removeprefix("Path: ")
            n = int(lines[i + 1].removeprefix("Lines: "))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{c}\n" for c in lines[i + 2 : i + 2 + n]))
            i += 1 + n
        i += 1


@pytest.fixture()
def sysfs(tmp_path: Path) -> Path:
    extract_ttar(TTAR, tmp_path)
    return tmp_path / "sys"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(DATA))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _labels(df: pl.DataFrame) -> list[dict[str, str]]:
    return [json.loads(s) for s in df["labels"].to_list()]


def test_dcgm_a100_fixture_parses_completely() -> None:
    p = parse_prometheus(A100.read_text(), ts=100.0)
    assert p.samples.height == 21 and p.malformed.height == 0 and p.sentinel_count == 0
    assert set(p.samples["host"]) == {"ub20-a100-k8s"}
    labels = _labels(p.samples)
    assert all(lb["UUID"] == "GPU-34319582-d595-d1c7-d1d2-179bcfa61660" for lb in labels)
    assert sum(1 for lb in labels if lb.get("GPU_I_PROFILE") == "1g.5gb") == 4
    tx = p.samples.filter(pl.col("metric") == "DCGM_FI_PROF_PCIE_TX_BYTES")["value"]
    assert tx.to_list() == [33011804.0]
    assert (p.samples["ts"] == 100.0).all()


def test_both_host_label_spellings_and_types() -> None:
    p = parse_prometheus(RENDER.read_text(), ts=1.0)
    assert p.samples.height == 6
    assert set(p.samples["host"]) == {"testhost"}
    assert ("TEST_METRIC", "gauge") in p.types
    first = _labels(p.samples)[0]
    assert first["test-uuid"].startswith("GPU-test-uuid") and first["modelName"] == "Test GPU Model"


def test_sentinel_job_label_timestamp_and_malformed_lines() -> None:
    line = A100.read_text().splitlines()[1]  # DCGM_FI_DEV_SM_CLOCK{...} 1215
    head = line.rsplit(" ", 1)[0]
    text = "\n".join(
        [
            head + " 9223372036854775794",  # not supported
            head + " 140737488355330",  # fp64 not supported
            head.replace("}", ',hpc_job="4242"}') + " 1215 1700000000000",
            "garbage line without value",
            'node_x{a="1"} not_a_number',
            "node_up 1",
            "",
        ]
    )
    p = parse_prometheus(text, ts=5.0, host="fallback")
    assert dict(p.sentinels) == {"not_supported": 2}
    assert p.samples.height == 2
    job_row = p.samples.filter(pl.col("job") == "4242")
    assert job_row["ts"].to_list() == [1_700_000_000.0] and job_row["value"].to_list() == [1215.0]
    assert p.samples.filter(pl.col("metric") == "node_up")["host"].to_list() == ["fallback"]
    assert sorted(p.malformed["reason"].to_list()) == ["not a sample line", "value is not a number"]


def test_node_exporter_ib_matches_the_sysfs_tree(sysfs: Path) -> None:
    """node_exporter's bytes are 4 x the sysfs word counters (same upstream fixture)."""
    prom = parse_prometheus(NODE_IB.read_text(), ts=0.0).samples
    rx = prom.filter(
        (pl.col("metric") == "node_infiniband_port_data_received_bytes_total")
        & pl.col("labels").str.contains('"port":"1"')
    )["value"].to_list()
    reading = read_sysfs(sysfs, host="h1", ts=0.0)
    s = reading.samples
    words = s.filter(
        (pl.col("metric") == "ib_sysfs_port_rcv_data")
        & pl.col("labels").str.contains('"mlx4_0"')
        & pl.col("labels").str.contains('"port": "1"')
    )["value"].to_list()
    assert rx == [4 * words[0]] == [18527668.0]
    assert reading.ports == 3 and reading.unsupported == 17  # i40iw0 has no PMA
    rates = s.filter(pl.col("metric") == "ib_sysfs_rate_bytes_per_second")["value"].to_list()
    assert sorted(rates) == [1.25e9, 5e9, 5e9]
    assert (
        4294967295.0 in s.filter(pl.col("metric") == "ib_sysfs_port_xmit_wait")["value"].to_list()
    )
    with pytest.raises(ScrapeError):
        read_sysfs(sysfs / "nope", host="h1")


def test_perfquery_extended_counters() -> None:
    s = parse_perfquery(PERFQUERY.read_text(), host="sw", ts=0.0)
    xmit = s.filter(pl.col("metric") == "ib_perfquery_PortXmitData")
    assert xmit["value"].to_list() == [36298026860928.0, 26006570014026.0]
    assert [lb["port"] for lb in _labels(xmit)] == ["1", "2"]
    assert s.filter(pl.col("metric") == "ib_perfquery_PortSelect").height == 0
    assert s.filter(pl.col("metric") == "ib_perfquery_PortLoopingErrors").height == 1


def _counters(rows: list[tuple[float, float]], **spec: float | None) -> pl.DataFrame:
    n = len(rows)
    return pl.DataFrame(
        {
            "node": ["n1"] * n,
            "device": ["mlx5_0/1"] * n,
            "link_class": ["ib"] * n,
            "direction": ["tx"] * n,
            "ts": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "bytes_per_unit": [spec.get("bytes_per_unit", 4.0)] * n,
            "saturate_at": [spec.get("saturate_at")] * n,
            "wrap_modulus": [spec.get("wrap_modulus")] * n,
            "max_bytes_per_s": [spec.get("max_bytes_per_s")] * n,
        },
        schema_overrides={
            "saturate_at": pl.Float64,
            "wrap_modulus": pl.Float64,
            "max_bytes_per_s": pl.Float64,
        },
    )


def test_counter_rates_handle_every_case() -> None:
    m64 = float(2**64)
    rows = [
        (0.0, 1000.0),
        (10.0, 3500.0),  # ok: 2500 words * 4 / 10 s = 1000 B/s
        (20.0, 100.0),  # reset (drop from a low value)
        (30.0, 600.0),  # ok
        (30.0, 700.0),  # same timestamp: non-increasing time
        (200.0, 900.0),  # gap (170 s > 3 x 10 s)
        (210.0, m64 - 1_024_000.0),  # ok but absurd: capped at the line rate
        (220.0, 1500.0),  # wrap: 1_025_500 words
    ]
    rates, rep = counter_rates(
        _counters(rows, wrap_modulus=m64, max_bytes_per_s=1e9), expected_interval_s=10.0
    )
    assert (rep.first_samples, rep.resets, rep.non_increasing_time, rep.gaps) == (1, 1, 1, 1)
    assert (rep.wraps, rep.capped, rep.rates) == (1, 1, 4)
    got = dict(zip(rates["ts"].to_list(), rates["bytes_per_s"].to_list(), strict=True))
    assert got[0.0] == 1000.0 and got[20.0] == 200.0 and got[210.0] == 410_200.0
    assert got[200.0] == 1e9
    assert (rates["bytes_per_s"] >= 0).all() and (rates["bytes_per_s"] <= 1e9).all()


def test_counter_rates_saturation_of_legacy_counters() -> None:
    sat = float(2**32 - 1)
    rows = [(0.0, sat - 100.0), (10.0, sat), (20.0, sat), (30.0, 5.0), (40.0, 15.0)]
    rates, rep = counter_rates(_counters(rows, saturate_at=sat), expected_interval_s=10.0)
    # every interval touching the saturated value is dropped, including the clear after it
    assert rep.saturated == 3 and rep.resets == 0
    assert rates["ts"].to_list() == [30.0] and rates["bytes_per_s"].to_list() == [4.0]


def test_http_scrape_of_real_fixtures_into_the_store(server: str) -> None:
    con = open_store(":memory:")
    scrape = scrape_http(f"{server}/{A100.name}", timeout=5.0)
    assert scrape.text == A100.read_text()
    rep = ingest_prometheus(con, scrape.text, source="dcgm", ts=100.0, interval_s=30.0)
    assert rep.samples == 21 and rep.link_load_rows == 3
    load = con.execute(
        "SELECT node, device, link_class, direction, bytes_per_s FROM link_load ORDER BY 3, 4"
    ).fetchall()
    assert load == [
        ("ub20-a100-k8s", "gpu0", "nvlink", "total", 0.0),
        ("ub20-a100-k8s", "gpu0", "pcie", "rx", 97863601.0),
        ("ub20-a100-k8s", "gpu0", "pcie", "tx", 33011804.0),
    ]
    uuid = scalar(con, "SELECT DISTINCT labels->>'UUID' FROM telemetry_samples")
    assert uuid == "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    rep2 = ingest_prometheus(
        con, scrape_http(f"{server}/{NODE_IB.name}").text, source="ne", ts=1.0, host="h1"
    )
    assert rep2.samples == 51
    with pytest.raises(ScrapeError, match="HTTP 404"):
        scrape_http(f"{server}/missing.prom")
    with pytest.raises(ScrapeError, match="only http"):
        scrape_http(f"file://{A100}")


def test_unreachable_endpoint_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ScrapeError, match="cannot scrape"):
        scrape_http(f"http://127.0.0.1:{port}/metrics", timeout=1.0)


def test_sysfs_counters_become_link_load(sysfs: Path) -> None:
    con = open_store(":memory:")
    first = read_sysfs(sysfs, host="node1", ts=1000.0)
    ingest_samples(con, first.samples, source="sysfs", unsupported=first.unsupported)
    ext = sysfs / "class" / "infiniband" / "mlx4_0" / "ports" / "1" / "counters_ext"
    (ext / "port_xmit_data_64").write_text(f"{3733440 + 2_500_000}\n")  # +10 MB in 10 s
    (ext / "port_rcv_data_64").write_text("12\n")  # a reset (HCA restarted)
    second = read_sysfs(sysfs, host="node1", ts=1010.0)
    ingest_samples(con, second.samples, source="sysfs")
    added, rep = derive_ib_link_load(con, since=1000.0, until=1020.0, expected_interval_s=10.0)
    assert rep.resets == 1
    rows = con.execute(
        "SELECT device, direction, ts, interval_s, bytes_per_s FROM link_load "
        "WHERE device = 'mlx4_0/1' ORDER BY direction"
    ).fetchall()
    assert rows == [("mlx4_0/1", "tx", 1000.0, 10.0, 1_000_000.0)]
    assert added == 3  # mlx4_0/1 tx, mlx4_0/2 rx and tx (no traffic); i40iw0 has no PMA
    again, _ = derive_ib_link_load(con, since=1000.0, until=1020.0, expected_interval_s=10.0)
    assert again == 0  # idempotent
    assert scalar(con, "SELECT count(*) FROM link_load WHERE bytes_per_s < 0") == 0


def test_non_ascii_labels_and_unusual_lines_parse_like_the_general_grammar() -> None:
    text = "\n".join(
        [
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="Tésla ü",Hostname="nœud1",hpc_job="7"} 61',
            'node_x{path="/a}b",host="ü"} 2',  # '}' inside a value: the general path
            'DCGM_FI_DEV_GPU_TEMP{gpu="1",hostname="h2"} 62 1700000000000',  # with a timestamp
            'DCGM_FI_DEV_GPU_TEMP{gpu="2",hostname="h2"} 2147483634',  # int32 not supported
            "node_up 1",
            'bad{x="é"} NaNx',
        ]
    )
    p = parse_prometheus(text, ts=3.0, host="fb")
    rows = p.samples.rows(named=True)
    assert [r["host"] for r in rows] == ["nœud1", "fb", "h2", "fb"]
    assert _labels(p.samples)[0] == {
        "gpu": "0",
        "modelName": "Tésla ü",
        "Hostname": "nœud1",
        "hpc_job": "7",
    }
    assert rows[0]["job"] == "7" and rows[0]["value"] == 61.0
    assert _labels(p.samples)[1] == {"path": "/a}b", "host": "ü"}
    assert rows[2]["ts"] == 1_700_000_000.0 and rows[3]["metric"] == "node_up"
    assert dict(p.sentinels) == {"not_supported": 1}
    assert p.malformed.rows() == [('bad{x="é"} NaNx', "value is not a number")]
    con = open_store(":memory:")
    rep = ingest_prometheus(con, text, source="u", ts=3.0)
    assert rep.samples == 4
    assert scalar(con, "SELECT labels->>'modelName' FROM telemetry_samples WHERE job = '7'") == (
        "Tésla ü"
    )


def test_label_sets_sharing_a_key_are_matched_by_their_text() -> None:
    from linkwise.datasets.telemetry.prometheus import _label_columns

    good = pl.DataFrame({"lbl": ['{a="1",hostname="x"}', '{a="2"}', '{a="1",hostname="x"}']})
    forced = _label_columns(good, "fb", key=pl.lit(0, dtype=pl.UInt64()))  # all collide
    normal = _label_columns(good, "fb")
    assert forced.equals(normal)
    one = '{"a":"1","hostname":"x"}'
    assert forced["labels"].to_list() == [one, '{"a":"2"}', one]
    assert forced["host"].to_list() == ["x", "fb", "x"]


def test_link_load_reingest_adds_nothing_and_v1_stores_migrate(tmp_path: Path) -> None:
    import duckdb

    from linkwise.datasets.store import MIGRATIONS, apply_migrations

    con = open_store(tmp_path / "s.duckdb")
    text = A100.read_text()
    assert ingest_prometheus(con, text, source="a", ts=100.0).link_load_rows == 3
    assert ingest_prometheus(con, text, source="a", ts=100.0).link_load_rows == 0
    assert ingest_prometheus(con, text, source="a", ts=130.0).link_load_rows == 3
    assert ingest_prometheus(con, text, source="a", ts=100.0, cluster="c2").link_load_rows == 3
    assert scalar(con, "SELECT count(*) FROM link_load") == 9
    v1 = tmp_path / "v1.duckdb"
    raw = duckdb.connect(str(v1))
    apply_migrations(raw, MIGRATIONS[:1])
    raw.execute(
        "INSERT INTO telemetry_samples VALUES (1, 'h', 's', 'm', ?, 2, NULL)",
        ['{"device":"mlx5_0"}'],
    ).fetchall()
    raw.close()
    con2 = open_store(v1)
    assert scalar(con2, "SELECT labels->>'device' FROM telemetry_samples") == "mlx5_0"
    assert scalar(con2, "SELECT typeof(labels) FROM telemetry_samples") == "VARCHAR"
