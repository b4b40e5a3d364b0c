"""Collection against the real local Slurm (``scripts/local-slurm start``) and a real HTTP
server serving the real telemetry fixtures; through the plain functions and the CLI."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from linkwise.cli import main
from linkwise.cluster.slurm.cli_transport import CliTransport, CommandRunner
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import AccountingBatch, NodeInfo
from linkwise.pipelines.collect_accounting import collect_accounting
from linkwise.pipelines.collect_common import CollectError

pytestmark = pytest.mark.services

SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
TELEMETRY = Path(__file__).resolve().parents[3] / "shared" / "data" / "telemetry"
WEIRD = ";$(rm -rf /) ü 名前"
JOB_COLS = (
    "cluster, job_id, run_index, name, user_name, account, partition_name, state, exit_code, "
    "signal, submit_time, start_time, end_time, time_limit_s, nodes, gpus, gpus_per_node, "
    "allocation_nodes, settled, array_job_id, array_task_id, comment, source"
)


@pytest.fixture(scope="module")
def env_file() -> Path:
    path = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not path.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return path


@pytest.fixture(scope="module")
def env(env_file: Path) -> dict[str, str]:
    return read_env_file(env_file)


@pytest.fixture(scope="module")
def cli(env: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(env, "cli")


@pytest.fixture(scope="module")
def mix(cli: SlurmClient) -> tuple[float, float, dict[str, int]]:
    """Submit a realistic mix, wait until it has finished and every record has settled."""
    t0 = float(int(time.time()) - 1)
    ids = {
        "one_a": cli.submit("sleep 1", name="one-a", gpus_per_node=1, time_limit_min=5),
        "one_b": cli.submit("sleep 1", name="one-b", gpus_per_node=1),
        "two_node": cli.submit("sleep 2", name="two-node", nodes=2, gpus_per_node=2),
        "exit3": cli.submit("exit 3", name="exit3", gpus_per_node=1),
        "cancel": cli.submit("sleep 60", name="cancel-me", gpus_per_node=1),
        "requeue": cli.submit("sleep 3", name="requeue-me", gpus_per_node=1),
        "weird": cli.submit("sleep 1", name=WEIRD, comment=WEIRD, gpus_per_node=1),
    }
    deadline = time.time() + 120  # generous: Slurm starts jobs later on a loaded machine
    watched = (ids["cancel"], ids["requeue"])
    while not all(q.state == "RUNNING" for q in cli.queue() if q.job_id in watched):
        assert time.time() < deadline, "the jobs to cancel and requeue did not start in 120 s"
        time.sleep(0.3)
    cli.cancel(ids["cancel"])
    cli.requeue(ids["requeue"])
    deadline = time.time() + 180
    while any(q.job_id in ids.values() for q in cli.queue()):
        assert time.time() < deadline, "the jobs did not finish within 180 s"
        time.sleep(0.5)
    while True:
        ours = [r for r in cli.jobs(t0) if r.job_id in ids.values()]
        if len(ours) == len(ids) + 1 and all(r.settled for r in ours):
            break
        assert time.time() < deadline, f"records did not settle: {ours}"
        time.sleep(0.5)
    return t0, time.time() + 1, ids


def rows(db: Path, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params).fetchall()


def counts(db: Path) -> tuple[int, ...]:
    tables = ("jobs", "job_nodes", "nodes", "rejected_rows")
    return tuple(rows(db, f"SELECT count(*) FROM {t}")[0][0] for t in tables)


@pytest.fixture(scope="module")
def collected(
    env_file: Path,
    mix: tuple[float, float, dict[str, int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, Any]]:
    """The mix collected through the CLI (command-line transport) into a fresh store."""
    t0, t1, _ = mix
    db = tmp_path_factory.mktemp("cli") / "store.duckdb"
    argv = ["collect", "accounting", "--db", str(db), "--slurm-env", str(env_file)]
    argv += ["--since", str(t0), "--until", str(t1), "--json"]
    out = _run_cli(argv)
    return db, out


def _run_cli(argv: list[str]) -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    assert code == 0, buf.getvalue()
    parsed: dict[str, Any] = json.loads(buf.getvalue())
    return parsed


def test_collected_rows_match_what_ran(
    collected: tuple[Path, dict[str, Any]], mix: tuple[float, float, dict[str, int]]
) -> None:
    db, out = collected
    _, _, ids = mix
    assert out["nodes"] == 4 and out["rejected"] == 0 and out["unsettled"] == 0
    assert out["inserted"] >= len(ids) + 1
    got = {
        (j, i): (name, state, code, gpus, comment)
        for j, i, name, state, code, gpus, comment in rows(
            db,
            "SELECT job_id, run_index, name, state, exit_code, gpus, comment FROM jobs "
            "WHERE job_id IN (SELECT unnest(?))",
            [list(ids.values())],
        )
    }
    assert got[(ids["exit3"], 0)][1:3] == ("FAILED", 3)  # despite the JSON's exit code 0
    assert got[(ids["cancel"], 0)][1] == "CANCELLED"
    assert got[(ids["requeue"], 0)][1] == "REQUEUED"  # one row per run of the requeued job
    assert got[(ids["requeue"], 1)][1:3] == ("COMPLETED", 0)
    assert len(got) == len(ids) + 1
    assert got[(ids["weird"], 0)][0] == WEIRD and got[(ids["weird"], 0)][4] == WEIRD
    assert got[(ids["one_a"], 0)][1:4] == ("COMPLETED", 0, 1)
    per_node = rows(
        db,
        "SELECT node, gpus FROM job_nodes WHERE job_id = ? ORDER BY node",
        [ids["two_node"]],
    )
    assert len(per_node) == 2 and all(g == 2 for _, g in per_node)
    assert {n for n, _ in per_node} <= {"gpu01", "gpu02", "gpu03", "gpu04"}
    nodes = rows(db, "SELECT node, gpus_total FROM nodes ORDER BY node")
    assert nodes == [("gpu01", 4), ("gpu02", 4), ("gpu03", 4), ("gpu04", 4)]
    (wm,) = rows(
        db, "SELECT watermark FROM ingest_state WHERE source = 'slurm-accounting:linkwise'"
    )
    assert wm[0] == pytest.approx(out["until"])


def test_collecting_again_adds_nothing(
    collected: tuple[Path, dict[str, Any]],
    cli: SlurmClient,
    mix: tuple[float, float, dict[str, int]],
) -> None:
    db, _ = collected
    t0, t1, _ = mix
    before = counts(db)
    again = collect_accounting(cli, db, cluster="linkwise", since=t0, until=t1)
    assert again.total("inserted") == 0 and again.total("received") > 0
    # many small overlapping windows: every record read several times, still no new row
    overlapping = collect_accounting(
        cli, db, cluster="linkwise", since=t0, until=t1, window_s=4.0, overlap_s=2.0
    )
    assert len(overlapping.windows) >= 3
    assert overlapping.total("inserted") == 0
    assert overlapping.total("received") > again.total("received")  # overlap re-reads
    assert counts(db) == before


def test_rest_transport_gives_the_same_rows(
    collected: tuple[Path, dict[str, Any]],
    env: dict[str, str],
    mix: tuple[float, float, dict[str, int]],
    tmp_path: Path,
) -> None:
    db, _ = collected
    t0, t1, ids = mix
    rest_db = tmp_path / "rest.duckdb"
    rest = SlurmClient.from_env(env, "rest")
    report = collect_accounting(rest, rest_db, cluster="linkwise", since=t0, until=t1)
    assert report.total("rejected") == 0
    keys = [list(ids.values())]
    q_jobs = f"SELECT {JOB_COLS} FROM jobs WHERE job_id IN (SELECT unnest(?)) ORDER BY 2, 3"
    q_nodes = "SELECT * FROM job_nodes WHERE job_id IN (SELECT unnest(?)) ORDER BY ALL"
    assert rows(rest_db, q_jobs, keys) == rows(db, q_jobs, keys)
    assert rows(rest_db, q_nodes, keys) == rows(db, q_nodes, keys)
    q_cluster = "SELECT cluster, node, partitions, cpus, gpus_total FROM nodes ORDER BY node"
    assert rows(rest_db, q_cluster) == rows(db, q_cluster)


class _DiesAfterFirstWindow:
    """The real cluster for the first jobs() call, then a controller config whose
    slurmdbd port is dead (Slurm going away mid-collection)."""

    def __init__(self, live: SlurmClient, dead: CliTransport) -> None:
        self.live, self.dead, self.calls = live, dead, 0

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        self.calls += 1
        source = self.live if self.calls == 1 else self.dead
        return source.accounting(since, until)

    def nodes(self) -> list[NodeInfo]:
        return self.live.nodes()


def test_slurm_gone_mid_collection_leaves_the_failed_window_unwritten(
    env: dict[str, str], cli: SlurmClient, mix: tuple[float, float, dict[str, int]], tmp_path: Path
) -> None:
    t0, t1, _ = mix
    conf = Path(env["SLURM_CONF"])
    lines = [
        ln for ln in conf.read_text().splitlines() if not ln.startswith("AccountingStoragePort=")
    ]
    dead_dir = tmp_path / "dead"
    dead_dir.mkdir()
    (dead_dir / "slurm.conf").write_text("\n".join([*lines, "AccountingStoragePort=1"]) + "\n")
    (dead_dir / "gres.conf").write_text((conf.parent / "gres.conf").read_text())
    bin_dir = env.get("LINKWISE_SLURM_BIN")  # the instance's own commands (a chroot's Slurm)
    dead = CliTransport(CommandRunner(str(dead_dir / "slurm.conf"), timeout=20, bin_dir=bin_dir))
    mid = t0 + 4.0
    window_s, overlap_s = mid - t0, 1.0
    db = tmp_path / "failed.duckdb"
    with pytest.raises(CollectError) as err:
        collect_accounting(
            _DiesAfterFirstWindow(cli, dead),
            db,
            cluster="linkwise",
            since=t0,
            until=t1,
            window_s=window_s,
            overlap_s=overlap_s,
        )
    message = str(err.value)
    assert "window 2/" in message and "localhost:1" in message and "left unchanged" in message
    assert len(err.value.report.windows) == 1
    # the store holds exactly the first window, as a collection of that window alone gives
    only_first = tmp_path / "first.duckdb"
    collect_accounting(cli, only_first, cluster="linkwise", since=t0, until=mid)
    q = f"SELECT {JOB_COLS} FROM jobs ORDER BY job_id, run_index"
    assert rows(db, q) == rows(only_first, q)
    assert rows(db, "SELECT * FROM job_nodes ORDER BY ALL") == rows(
        only_first, "SELECT * FROM job_nodes ORDER BY ALL"
    )
    (wm,) = rows(db, "SELECT watermark FROM ingest_state")
    assert wm[0] == pytest.approx(mid)
    # the CLI: exit status 1, the reason on stderr, nodes stored but no job and no watermark
    dead_env = tmp_path / "dead.env"
    dead_env.write_text(
        f"SLURM_CONF={dead_dir / 'slurm.conf'}\nLINKWISE_SLURM_CLUSTER=linkwise\n"
        + (f"LINKWISE_SLURM_BIN={bin_dir}\n" if bin_dir else "")
    )
    cli_db = tmp_path / "cli_failed.duckdb"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "linkwise"), "collect", "accounting", "--db",
         str(cli_db), "--slurm-env", str(dead_env), "--since", str(t0), "--until", str(t1)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "window 1/1" in proc.stderr and "Connection refused" in proc.stderr
    assert counts(cli_db)[:3] == (0, 0, 4)
    assert rows(cli_db, "SELECT count(*) FROM ingest_state")[0][0] == 0


# ---------------------------------------------------------------- telemetry via the CLI


def _extract_ttar(archive: Path, dest: Path) -> None:
    """Materialise a ttar archive (Path:/Lines:/Directory: records) under dest."""
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


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(TELEMETRY))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_telemetry_through_the_cli(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _extract_ttar(TELEMETRY / "node_exporter_sysfs_infiniband.ttar", tmp_path)
    sysfs = tmp_path / "sys"
    db = tmp_path / "telemetry.duckdb"
    # --interval 30: the readings below are seconds apart, never a gap (3 intervals) even on
    # a loaded machine (with --interval 1 a 3 s pause between them lost every rate)
    base = ["collect", "telemetry", "--db", str(db), "--host", "node1", "--interval", "30"]
    a100 = f"{server}/dcgm_exporter_metrics_a100_mig.prom"
    node_ib = f"{server}/node_exporter_infiniband_e2e.prom"
    render = f"{server}/dcgm_exporter_render_format_test.txt"
    out = _run_cli([*base, "--endpoint", a100, "--endpoint", node_ib, "--endpoint", render,
                    "--sysfs", str(sysfs), "--json"])  # fmt: skip
    by_source = {s["source"]: s for s in out["sources"]}
    assert by_source[f"prometheus:{a100}"]["samples"] == 21
    assert by_source[f"prometheus:{a100}"]["link_load_rows"] == 3
    assert by_source[f"prometheus:{node_ib}"]["samples"] == 51
    sysfs_rep = by_source[f"sysfs:{sysfs}"]
    assert sysfs_rep["samples"] > 0 and sysfs_rep["unsupported"] > 0  # i40iw0: N/A (no PMA)
    assert out["errors"] == {}
    stored = rows(db, "SELECT source, count(*) FROM telemetry_samples GROUP BY 1 ORDER BY 1")
    assert dict(stored) == {s["source"]: s["samples"] for s in out["sources"]}
    rejected = dict(rows(db, "SELECT reason, count(*) FROM rejected_rows GROUP BY 1"))
    reported: dict[str, int] = {}
    for s in out["sources"]:
        for reason, n in s["rejected_reasons"].items():
            reported[reason] = reported.get(reason, 0) + n
    assert rejected == reported
    assert sum(reported.values()) == sum(s["malformed"] for s in out["sources"])
    # a second sysfs reading 1 s later, with traffic: InfiniBand rates are derived
    ext = sysfs / "class" / "infiniband" / "mlx4_0" / "ports" / "1" / "counters_ext"
    words = int((ext / "port_xmit_data_64").read_text()) + 250_000
    time.sleep(1.0)
    (ext / "port_xmit_data_64").write_text(f"{words}\n")
    out2 = _run_cli([*base, "--sysfs", str(sysfs), "--json"])
    assert out2["ib_link_load_rows"] >= 3 and out2["rates"]["rates"] >= 3
    (rate,) = rows(
        db,
        "SELECT bytes_per_s * interval_s FROM link_load "
        "WHERE device = 'mlx4_0/1' AND direction = 'tx' AND link_class = 'ib'",
    )
    assert rate[0] == pytest.approx(1_000_000.0)  # 250,000 words of 4 bytes
    assert rows(db, "SELECT count(*) FROM link_load WHERE bytes_per_s < 0")[0][0] == 0
    # an endpoint that is not there: reported, exit status 1, the others still stored
    capsys.readouterr()
    code = main([*base, "--endpoint", f"{server}/missing.prom", "--endpoint", a100])
    captured = capsys.readouterr()
    assert code == 1 and "HTTP 404" in captured.err and "21 samples" in captured.out
    assert main([*base]) == 2  # no source at all
