"""The collection flows under Prefect's test harness, and the plain collector's watermark
and exit-code rules on real Slurm records (the captured fixtures)."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from linkwise.cluster.slurm.accounting import parse_accounting, parse_acct_lines, run_indexes
from linkwise.cluster.slurm.records import AccountingBatch, JobRun, NodeInfo

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "data" / "telemetry"
FIX = REPO / "tests" / "fixtures" / "slurm"
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(TELEMETRY))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_telemetry_flow_stores_the_served_fixtures(
    prefect_harness: None, server: str, tmp_path: Path
) -> None:
    from linkwise.pipelines.collect import collect_telemetry_flow
    from linkwise.pipelines.collect_common import CollectError

    db = tmp_path / "t.duckdb"
    a100 = f"{server}/dcgm_exporter_metrics_a100_mig.prom"
    node_ib = f"{server}/node_exporter_infiniband_e2e.prom"
    out = collect_telemetry_flow(str(db), endpoints=[a100, node_ib], host="node1")
    assert out["samples"] == 21 + 51 and out["errors"] == {}
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM telemetry_samples").fetchall()[0][0]
        load = con.execute("SELECT count(*) FROM link_load").fetchall()[0][0]
    assert stored == 72 and load == 3
    # a missing endpoint: its scrape task is retried, then the flow fails naming it,
    # after storing the good one
    t0 = time.monotonic()
    with pytest.raises(CollectError, match=r"missing\.prom.*HTTP 404"):
        collect_telemetry_flow(str(db), endpoints=[f"{server}/missing.prom", a100])
    assert time.monotonic() - t0 >= 2.0  # two retries, one second apart
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM telemetry_samples").fetchall()[0][0] == 72 + 21


@pytest.mark.services
def test_accounting_flow_against_the_local_cluster(prefect_harness: None, tmp_path: Path) -> None:
    from linkwise.cluster.slurm.client import SlurmClient
    from linkwise.pipelines.collect import collect_accounting_flow

    env_file = SLURM_DIR / "env"
    script = REPO / "scripts" / "local-slurm"
    up = subprocess.run([str(script), "status"], capture_output=True, check=False)
    if not env_file.exists() or up.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    client = SlurmClient.from_env_file(env_file, "cli")
    t0 = float(int(time.time()) - 1)
    job = client.submit("exit 3", name="flow-exit3", gpus_per_node=1)
    deadline = time.time() + 120  # generous: Slurm is slower on a loaded machine
    while not [r for r in client.jobs(t0) if r.job_id == job and r.state == "FAILED"]:
        assert time.time() < deadline, "the job did not finish within 120 s"
        time.sleep(0.5)
    db = tmp_path / "a.duckdb"
    out = collect_accounting_flow(str(db), str(env_file), transport="cli", since=t0)
    assert out["nodes"] == 4 and out["inserted"] >= 1 and out["rejected"] == 0
    again = collect_accounting_flow(str(db), str(env_file), transport="rest", since=t0)
    assert again["inserted"] == 0
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute(
            "SELECT name, state, exit_code, gpus FROM jobs WHERE job_id = ?", [job]
        ).fetchall()
        nodes = con.execute("SELECT count(*) FROM nodes").fetchall()[0][0]
    assert row == [("flow-exit3", "FAILED", 3, 1)] and nodes == 4


# ---------------------------------------------------------------- the plain collector's rules


def _fixture_runs() -> list[JobRun]:
    """The real records captured from the local cluster (tests/fixtures/slurm)."""
    doc = json.loads((FIX / "sacct.json").read_text())
    lines = parse_acct_lines((FIX / "sacct_lines.txt").read_text())
    codes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    idx = run_indexes((x.job_id, x.submit_time, x.state) for x in lines)
    return parse_accounting(doc, codes, idx)


@dataclasses.dataclass
class Recorded:
    """An accounting source replaying fixed records by time window (for the rules below)."""

    runs: list[JobRun]
    calls: list[tuple[float, float | None]] = dataclasses.field(default_factory=list)

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        self.calls.append((since, until))
        end = float("inf") if until is None else until
        runs = [r for r in self.runs if r.submit_time < end and (r.end_time or end) >= since]
        return AccountingBatch(tuple(runs))

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(f"gpu0{i}", "IDLE", ("gpu",), 8, 4, 0) for i in range(1, 5)]


def test_known_exit_code_is_not_forgotten_and_unsettled_holds_the_watermark(
    tmp_path: Path,
) -> None:
    from linkwise.pipelines.collect_accounting import collect_accounting

    runs = _fixture_runs()
    failed = next(r for r in runs if r.state == "FAILED" and r.exit_code == 3)
    since = min(r.submit_time for r in runs) - 1
    until = max(r.end_time or r.submit_time for r in runs) + 1
    db = tmp_path / "s.duckdb"
    first = collect_accounting(Recorded(runs), db, cluster="linkwise", since=since, until=until)
    assert first.total("inserted") == len(runs) and first.watermark == until
    # slurmrestd after MinJobAge: the FAILED run's exit code is unknown (None)
    later = [dataclasses.replace(r, exit_code=None) if r == failed else r for r in runs]
    second = collect_accounting(Recorded(later), db, cluster="linkwise", since=since, until=until)
    assert second.total("updated") == 0 and second.total("unchanged") == len(runs)
    with duckdb.connect(str(db), read_only=True) as con:
        code = con.execute(
            "SELECT exit_code FROM jobs WHERE job_id = ? AND run_index = ?",
            [failed.job_id, failed.run_index],
        ).fetchall()
    assert code == [(3,)]
    # an unsettled record keeps a fresh store's watermark behind it, so it is read again
    two = next(r for r in runs if len(r.nodes) > 1)
    transient = dataclasses.replace(two, settled=False, allocation_nodes=0)
    fresh = tmp_path / "u.duckdb"
    source = Recorded([transient])
    rep = collect_accounting(source, fresh, cluster="linkwise", since=since, until=until)
    assert rep.watermark == transient.end_time and rep.total("unsettled") == 1
    settled = collect_accounting(
        Recorded([two]), fresh, cluster="linkwise", overlap_s=60.0, window_s=3600.0
    )
    assert settled.since == pytest.approx(rep.watermark - 60.0)  # restarts from the watermark
    assert settled.total("updated") == 1  # the settled record replaced the transient one


def test_bad_arguments_are_value_errors(tmp_path: Path) -> None:
    from linkwise.pipelines.collect_accounting import collect_accounting
    from linkwise.pipelines.collect_telemetry import collect_telemetry

    with pytest.raises(ValueError, match="not before"):
        collect_accounting(Recorded([]), tmp_path / "x.duckdb", cluster="c", since=10, until=5)
    with pytest.raises(ValueError, match="no telemetry source"):
        collect_telemetry(tmp_path / "y.duckdb")
