"""Issue 32 item 8: build-dataset and evaluate start no temporary Prefect server where no
Prefect API is configured (7-18 s each), and a temporary server an explicit flow call starts
sends no analytics (from an offline host it logged ``ERROR ... Failed to send telemetry``
every run), unless the operator says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from prefect.settings import get_current_settings

from linkwise.cli import main
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.parallel import EPHEMERAL_STARTUP_S, patient_prefect_server
from linkwise.pipelines.history import replay_history
from linkwise.supervise import descendants


def test_the_temporary_server_is_started_without_analytics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    with patient_prefect_server():
        settings = get_current_settings()
        # what the server subprocess is started with (prefect.server.api.server)
        env = settings.to_environment_variables(exclude_unset=True)
        assert settings.server.analytics_enabled is False
        assert env["PREFECT_SERVER_ANALYTICS_ENABLED"].lower() == "false"
        assert settings.server.ephemeral.startup_timeout_seconds >= EPHEMERAL_STARTUP_S


PROBE = """
from prefect.settings import get_current_settings
from linkwise.parallel import patient_prefect_server
with patient_prefect_server():
    env = get_current_settings().to_environment_variables(exclude_unset=True)
    print(env.get("PREFECT_SERVER_ANALYTICS_ENABLED", "true").lower(),
          env.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"))
"""


def test_an_operators_own_setting_is_kept(tmp_path: Path) -> None:
    """With the operator's variables set, a fresh process (as the CLI runs) keeps both: the
    context changes neither (in a process of its own: the suite's Prefect harness holds
    settings of its own in this one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "7",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["true", "7"]


# ------------------------------------------------------------------------ no temporary server

LINKWISE = Path(sys.executable).parent / "linkwise"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About a day of a 3-node x 4-GPU cluster's accounting (as
    tests/pipelines/test_operator_path.py)."""
    db = tmp_path_factory.mktemp("store") / "store.duckdb"
    jobs = synthetic.generate(300, seed=0, max_gpus=12, load_scale=0.5)
    replay_history(jobs, from_spec("3x4"), db, cluster="op")
    return db


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _run_watched(argv: list[str], tmp_path: Path) -> tuple[str, str, set[str]]:
    """``linkwise ARGV`` run as a program with no Prefect or MLflow setting, as a new operator
    runs it: its output, and the command line of every process seen below it meanwhile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "true"}
    proc = subprocess.Popen(
        [str(LINKWISE), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    seen: set[str] = set()
    deadline = time.monotonic() + 300
    while True:
        try:
            out, err = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            seen |= {_cmdline(p) for p in descendants(proc.pid)}
            if time.monotonic() > deadline:
                proc.kill()
                raise
    assert proc.returncode == 0, err[-3000:]
    return out, err, seen


def _no_prefect_server(err: str, seen: set[str]) -> None:
    assert "temporary server" not in err.lower(), err[-3000:]
    assert not [c for c in seen if "uvicorn" in c], seen  # the server's process
    assert [c for c in seen if "multiprocessing.spawn" in c], seen  # a pool did the work


def test_build_dataset_on_a_pool_starts_no_prefect_server(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32 item 8: with no Prefect API, ``build-dataset --executor local:2`` started a
    temporary Prefect server (and one more in a pool worker), about 7-18 s each; now the pool
    is a plain one, and the dataset is the serial one, byte for byte."""
    argv = ["build-dataset", "--from-db", str(store), "--rollouts", "4", "--policies",
            "backfill", "--epsilons", "0", "--window", "3600", "--max-steps", "30",
            "--batch", "1", "--json"]  # fmt: skip
    out, err, seen = _run_watched([*argv, "--executor", "local:2", "--out", "pool"], tmp_path)
    _no_prefect_server(err, seen)
    pooled = json.loads(out.splitlines()[-1])
    assert pooled["rollout_report"]["episodes"] == 4
    assert main([*argv, "--executor", "serial", "--out", str(tmp_path / "serial")]) == 0
    serial = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert pooled["hash"] == serial["hash"]


def test_evaluate_on_a_pool_starts_no_prefect_server(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same for ``evaluate --executor local:2``: no temporary server, every job's
    result the serial run's."""
    argv = ["evaluate", "--db", str(store), "--policies", "backfill,fifo", "--seeds", "0,1",
            "--n-windows", "2", "--min-jobs", "5", "--n-boot", "50", "--no-log"]  # fmt: skip
    _, err, seen = _run_watched([*argv, "--executor", "local:2", "--out", "pool"], tmp_path)
    _no_prefect_server(err, seen)
    assert main([*argv, "--executor", "serial", "--out", str(tmp_path / "serial")]) == 0
    capsys.readouterr()
    pooled = pl.read_parquet(tmp_path / "pool" / "jobs.parquet")
    assert pooled.height > 0
    assert pooled.equals(pl.read_parquet(tmp_path / "serial" / "jobs.parquet"))
