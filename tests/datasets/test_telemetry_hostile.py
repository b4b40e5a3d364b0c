"""Hostile exporters (issue 21, items 7 and 8): non-finite values between finite scrapes,
and an exporter that trickles its body, each against a real local HTTP server."""

from __future__ import annotations

import http.server
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest

from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.prometheus import NON_FINITE_REASON
from linkwise.datasets.telemetry.scrape import ScrapeError, scrape_http
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus
from linkwise.pipelines.collect_telemetry import collect_telemetry

IB = "node_infiniband_legacy_data_transmitted_bytes_total"
IB_PORT = "node_infiniband_port_data_received_bytes_total"
DCGM = "DCGM_FI_PROF_PCIE_TX_BYTES"


def _exposition(ib: str, port: str, dcgm: str) -> str:
    return (
        f"# TYPE {IB} counter\n"
        f'{IB}{{device="mlx5_0",port="1"}} {ib}\n'
        f'{IB_PORT}{{device="mlx5_0",port="1"}} {port}\n'
        f'{DCGM}{{gpu="0",Hostname="n1"}} {dcgm}\n'
    )


# finite, then each non-finite spelling the text format allows, then finite again
SCRAPES = [
    _exposition("1000", "4000", "10"),
    _exposition("+Inf", "NaN", "+Inf"),
    _exposition("NaN", "-Inf", "NaN"),
    _exposition("-Inf", "+Inf", "-Inf"),
    _exposition("61000", "64000", "20"),
    _exposition("121000", "124000", "30"),
]


def _finite_store(con: duckdb.DuckDBPyConnection) -> None:
    """Nothing non-finite or negative is stored: samples, rates, intervals."""
    assert con.execute(
        "SELECT count(*) FROM telemetry_samples WHERE NOT isfinite(value)"
    ).fetchall() == [(0,)]
    _finite_rates(con)


def _finite_rates(con: duckdb.DuckDBPyConnection) -> None:
    """No link_load rate or interval is non-finite or negative."""
    assert con.execute(
        "SELECT count(*) FROM link_load WHERE NOT isfinite(bytes_per_s) OR bytes_per_s < 0 "
        "OR NOT isfinite(interval_s)"
    ).fetchall() == [(0,)]


def test_non_finite_samples_are_counted_rejections_and_no_rate_is_non_finite() -> None:
    con = open_store(":memory:")
    rejected = 0
    for i, text in enumerate(SCRAPES):
        rep = ingest_prometheus(con, text, source="ne", ts=30.0 * i, host="n1", interval_s=30.0)
        rejected += rep.malformed
        derive_ib_link_load(
            con, since=0.0, until=30.0 * i + 1, expected_interval_s=30.0
        )  # collection after every scrape keeps working
        _finite_store(con)
    assert rejected == 9
    reasons = con.execute("SELECT reason, count(*) FROM rejected_rows GROUP BY ALL").fetchall()
    assert reasons == [(NON_FINITE_REASON, 9)]
    # the good intervals still give rates: 60 000 bytes over 30 s after the bad scrapes
    got = con.execute(
        "SELECT device, direction, ts, bytes_per_s FROM link_load WHERE link_class = 'ib' "
        "ORDER BY ALL"
    ).fetchall()
    assert ("mlx5_0/1", "tx", 120.0, 2000.0) in got and ("mlx5_0/1", "rx", 120.0, 2000.0) in got
    assert con.execute("SELECT count(*) FROM link_load WHERE link_class = 'pcie'").fetchall() == [
        (3,)
    ]


def test_non_finite_samples_already_stored_yield_no_rate() -> None:
    """A store written before the fix may hold +Inf/NaN counters: rates skip them (counted)."""
    con = open_store(":memory:")
    rows = [(0.0, 1000.0), (30.0, math.inf), (60.0, math.nan), (90.0, -math.inf), (120.0, 7000.0)]
    for ts, value in rows:
        con.execute(
            "INSERT INTO telemetry_samples VALUES (?, 'n1', 'old', ?, ?, ?, NULL)",
            [ts, IB, '{"device":"mlx5_0","port":"1"}', value],
        )
    added, rep = derive_ib_link_load(con, since=0.0, until=200.0, expected_interval_s=30.0)
    assert rep.non_finite == 3
    _finite_rates(con)
    # the finite samples around the bad ones are 120 s apart: a gap, no rate, no crash
    assert added == 0 and rep.gaps == 1


@dataclass
class Served:
    """What the test server sends: a body per request, optionally trickled byte by byte."""

    bodies: list[str]
    trickle_s: float = 0.0
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    requests: int = 0


@pytest.fixture()
def exporter() -> Iterator[tuple[str, Served]]:
    served = Served(bodies=[])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.bodies[min(served.requests, len(served.bodies) - 1)].encode()
            served.requests += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            served.started.set()
            try:
                if served.trickle_s <= 0:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):
                    if served.release.is_set():
                        self.wfile.write(body[i:])
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    served.release.wait(served.trickle_s)
            except OSError:
                return  # the client gave up

        def log_message(self, *args: object) -> None:
            return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics", served
    served.release.set()
    httpd.shutdown()
    httpd.server_close()


def test_collection_of_an_exporter_serving_non_finite_values(
    exporter: tuple[str, Served], tmp_path: Path
) -> None:
    url, served = exporter
    served.bodies = SCRAPES
    db = tmp_path / "t.duckdb"
    reports = [collect_telemetry(db, endpoints=[url], host="n1", interval_s=60.0) for _ in SCRAPES]
    assert all(not r.errors for r in reports)  # every collection after a bad scrape works
    bad = [dict(r.sources[0].rejected_reasons).get(NON_FINITE_REASON, 0) for r in reports]
    assert bad == [0, 3, 3, 3, 0, 0]
    assert [r.sources[0].samples for r in reports] == [3, 0, 0, 0, 3, 3]
    with duckdb.connect(str(db), read_only=True) as con:
        _finite_store(con)
        assert (
            con.execute("SELECT count(*) FROM link_load WHERE link_class = 'ib'").fetchall()[0][0]
            > 0
        )


def test_the_timeout_bounds_the_whole_scrape_of_a_trickling_exporter(
    exporter: tuple[str, Served],
) -> None:
    """One byte every 0.5 s of a 200-byte body takes 100 s; a 2 s timeout ends it at 2 s
    (the bound asserted is loose: what matters is that it does not follow the trickle)."""
    url, served = exporter
    served.bodies = ["# " + "x" * 197 + "\n"]
    served.trickle_s = 0.5
    t0 = time.monotonic()
    with pytest.raises(ScrapeError, match=r"within 2\.0 s"):
        scrape_http(url, timeout=2.0)
    assert time.monotonic() - t0 < 30.0
    assert served.started.is_set()


def test_the_store_is_not_held_while_an_exporter_is_scraped(
    exporter: tuple[str, Served], tmp_path: Path
) -> None:
    """Scrape first, then open the store: while the exporter trickles, another process can
    open the store (as a concurrent ``collect accounting`` does); the samples are stored."""
    url, served = exporter
    served.bodies = [SCRAPES[0]]
    served.trickle_s = 0.2
    db = tmp_path / "t.duckdb"
    open_store(db).close()
    result: dict[str, object] = {}

    def collect() -> None:
        result["report"] = collect_telemetry(
            db, endpoints=[url], host="n1", timeout=300.0, lock_wait_s=60.0
        )

    worker = threading.Thread(target=collect)
    worker.start()
    try:
        assert served.started.wait(120.0), "the exporter was never scraped"
        other = subprocess.run(
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(db)!r}).close()"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert other.returncode == 0, other.stderr
    finally:
        served.release.set()
        worker.join(300.0)
    report = result["report"]
    assert not report.errors and report.samples == 3  # type: ignore[attr-defined]


def test_samples_of_a_host_that_is_no_cluster_node_are_counted_and_warned(
    exporter: tuple[str, Served], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32 item 8: DCGM rows were stored under a host name that is no cluster node with no
    warning (they then match no job). Against the store's nodes table: counted and warned;
    with no nodes yet, nothing to check."""
    url, served = exporter
    served.bodies = [SCRAPES[0]]
    db = tmp_path / "t.duckdb"
    first = collect_telemetry(db, endpoints=[url], host="n1", cluster="c", interval_s=60.0)
    assert first.sources[0].unknown_hosts == ()  # the store knows no node yet
    with closing(open_store(db)) as con:
        con.execute(
            "INSERT INTO nodes VALUES ('c', 'gpu01', 'IDLE', ['gpu'], 8, 4, 0, 0.0), "
            "('c', 'n1', 'IDLE', ['gpu'], 8, 4, 0, 0.0)"
        )
    known = collect_telemetry(db, endpoints=[url], host="n1", cluster="c", interval_s=60.0)
    assert known.sources[0].unknown_hosts == ()
    with caplog.at_level(logging.WARNING):
        other = collect_telemetry(db, endpoints=[url], host="elsewhere", cluster="c")
    # the DCGM line names its own Hostname (n1); the IB lines take the collector's host
    assert other.sources[0].unknown_hosts == (("elsewhere", 2),)
    assert other.to_dict()["sources"][0]["unknown_hosts"] == {"elsewhere": 2}
    assert "'elsewhere', which is no node of cluster 'c'" in caplog.text
