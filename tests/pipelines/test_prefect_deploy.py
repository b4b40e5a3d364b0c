"""``prefect.yaml`` against a real Prefect server: deploy every deployment, run each one on a
process worker with test-sized parameters, and check that every run completes and did its
work (the local Slurm's nodes in the store, telemetry samples, a dataset, a registered
@challenger, an evaluation with a promotion decision).

Needs the local Slurm (``scripts/local-slurm start``, as ``make test`` does). The server,
the worker and the flow runs are hermetic: their own PREFECT_HOME, API URL and MLflow store
under the test's temporary folder; every process started here is stopped at the end.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
TELEMETRY = DATA / "telemetry"
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
PREFECT = str(Path(sys.executable).parent / "prefect")
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}

TRAIN_TOML = """\
name = "deploy-test"
algo = "cql"
seed = 0
device = "cpu"

[train]
n_steps = 40
n_steps_per_epoch = 40
batch_size = 32
learning_rate = 3e-4
hidden_units = [32]
target_update_interval = 20

[dataset]
trace = "{trace}"
topology = "8x8"
policies = ["best_fit"]
epsilons = [0.2]
seeds = [0]
rollouts = 1
window_s = 3600
block_s = 600
min_jobs = 20
holdout = 0.25

[dataset.mdp]
k_slots = 4

[mlflow]
experiment = "linkwise-deploy-test"
model_name = "linkwise-policy"
register = true
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(base: str, method: str, path: str, body: Any = None, tries: int = 8) -> Any:
    """One REST call to the server; retried on 503 (a busy SQLite: Prefect's clients retry
    it too)."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(tries):
        req = urllib.request.Request(
            base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or attempt == tries - 1:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process started here (in its own session) and everything it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # children left in the group (uvicorn, runs)
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Stack:
    api: str
    env: dict[str, str]
    root: Path
    worker_log: Path
    deploy_out: str


@pytest.fixture(scope="module")
def telemetry_url() -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(TELEMETRY))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A real ``prefect server``, the pool and queues, ``deploy --all``, and a worker."""
    if not (SLURM_DIR / "env").exists():
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    root = tmp_path_factory.mktemp("prefect-deploy")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))} | {
        "PREFECT_HOME": str(root / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PREFECT_CLI_PROMPT": "false",
        "PREFECT_SERVER_DATABASE_TIMEOUT": "60",  # the CI machine's 2 cores are shared
        "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
        # the flow runs' MLflow store (as a real setup sets it); the runs pass it explicitly too
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "PYTHONUNBUFFERED": "1",
    }
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            p = subprocess.Popen(
                args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        procs.append(p)
        return p

    def cli(*args: str, timeout: float = 120) -> str:
        r = subprocess.run(
            [PREFECT, *args], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        assert r.returncode == 0, f"prefect {' '.join(args)}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        return r.stdout

    server_log = root / "server.log"
    try:
        server = start(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], server_log
        )
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"prefect server exited:\n{_tail(server_log)}"
            try:
                if _api(api, "GET", "/health") is True:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, f"server not healthy:\n{_tail(server_log)}"
            time.sleep(0.5)
        cli("work-pool", "create", "local", "--type", "process")
        cli("work-queue", "create", "store", "--pool", "local", "--limit", "1")
        deploy_out = cli("--no-prompt", "deploy", "--all", timeout=300)
        worker_log = root / "worker.log"
        start([PREFECT, "worker", "start", "--pool", "local", "--type", "process"], worker_log)
        yield Stack(api, env, root, worker_log, deploy_out)
    finally:
        for p in reversed(procs):
            _stop(p)


def _deployments(stack: Stack) -> dict[str, dict[str, Any]]:
    flows = {f["id"]: f["name"] for f in _api(stack.api, "POST", "/flows/filter", {})}
    found = _api(stack.api, "POST", "/deployments/filter", {})
    return {f"{flows[d['flow_id']]}/{d['name']}": d for d in found}


def _start(stack: Stack, deployment: dict[str, Any], params: dict[str, Any]) -> str:
    run = _api(
        stack.api,
        "POST",
        f"/deployments/{deployment['id']}/create_flow_run",
        {"parameters": params},
    )
    return str(run["id"])


def _wait(stack: Stack, run_ids: dict[str, str], timeout: float) -> dict[str, str]:
    """Each run's final state type (or the last seen when the timeout passed)."""
    states: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, rid in run_ids.items():
            states[name] = _api(stack.api, "GET", f"/flow_runs/{rid}")["state"]["type"]
        if all(s in TERMINAL for s in states.values()):
            break
        time.sleep(1)
    return states


def test_every_deployment_is_registered_with_its_schedule(stack: Stack) -> None:
    """The five deployments, on the process pool, their schedules, defaults and pull step."""
    deps = _deployments(stack)
    assert set(deps) == {
        "collect-accounting/every-5-minutes",
        "collect-telemetry/every-minute",
        "build-dataset/daily",
        "train/daily",
        "evaluate-and-promote/daily",
    }, stack.deploy_out
    sched = {
        name: [s["schedule"] for s in d["schedules"] if s["active"]] for name, d in deps.items()
    }
    assert [s.get("cron") for s in sched["collect-accounting/every-5-minutes"]] == ["*/5 * * * *"]
    assert [s.get("interval") for s in sched["collect-telemetry/every-minute"]] == [60.0]
    crons = {n: sched[n][0]["cron"] for n in ("build-dataset/daily", "train/daily")}
    evaluate_cron = sched["evaluate-and-promote/daily"][0]["cron"]
    hour = {n: int(c.split()[1]) for n, c in crons.items()}
    assert hour["build-dataset/daily"] < hour["train/daily"] < int(evaluate_cron.split()[1])
    for name, d in deps.items():
        assert d["work_pool_name"] == "local", name
        assert d["pull_steps"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ], name
        assert "{{" not in json.dumps(d["parameters"]), name
    writers = {n for n, d in deps.items() if d["work_queue_name"] == "store"}
    assert writers == set(deps) - {"train/daily"}
    assert deps["train/daily"]["parameters"]["config"] == "models/experiments/operator_cql.toml"
    assert (REPO / deps["train/daily"]["parameters"]["config"]).is_file()


# generous deadlines (they bound a run that never ends, not its speed): make test runs this
# beside another test on the other pytest-xdist worker, and the CI machine is loaded
@pytest.mark.timeout(1500)
def test_each_deployment_runs_to_completion_on_a_worker(stack: Stack, telemetry_url: str) -> None:
    """Trigger every deployment with test-sized parameters; each flow run completes and
    leaves its outputs where the parameters say."""
    deps = _deployments(stack)
    root = stack.root
    db = str(root / "store.duckdb")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    config = root / "train.toml"
    config.write_text(TRAIN_TOML.format(trace=PHILLY))
    first: dict[str, dict[str, Any]] = {
        "collect-accounting/every-5-minutes": {
            "db": db, "slurm_env": str(SLURM_DIR / "env"), "transport": "cli",
        },
        "collect-telemetry/every-minute": {
            "db": db,
            "endpoints": [
                f"{telemetry_url}/dcgm_exporter_metrics_a100_mig.prom",
                f"{telemetry_url}/node_exporter_infiniband_e2e.prom",
            ],
            "host": "node1",
        },
        "build-dataset/daily": {
            "db": None, "trace": str(PHILLY), "out_dir": str(root / "datasets"), "rollouts": 1,
            "policies": ["best_fit"], "epsilons": [0.0], "window_s": 3600.0, "block_s": 600.0,
            "min_jobs": 20, "topology": "4x8", "executor": "serial", "max_steps": 200,
            "tracking_uri": uri, "warm_start": False,  # a trace has no backlog
        },
        "train/daily": {
            "config": str(config), "tracking_uri": uri, "out_dir": str(root / "train"),
        },
    }  # fmt: skip
    # the registry does not exist yet: the flows create it together (models.registry's lock)
    runs = {name: _start(stack, deps[name], params) for name, params in first.items()}
    states = _wait(stack, runs, timeout=600)
    assert states == dict.fromkeys(runs, "COMPLETED"), _tail(stack.worker_log, 8000)

    evaluate = {
        "policies": ["backfill", "best_fit", "model:challenger"], "db": None,
        "trace": str(PHILLY), "n_windows": 1, "seeds": [0], "cluster": "4x8",
        "window_s": 3600.0, "block_s": 600.0, "min_jobs": 25, "n_boot": 200,
        "executor": "serial", "out_dir": str(root / "evaluation"), "tracking_uri": uri,
        "warm_start": False,  # a trace has no backlog
        "ope_steps": 50,  # the gate's FQE evidence, test-sized
    }  # fmt: skip
    run = {
        "evaluate-and-promote/daily": _start(stack, deps["evaluate-and-promote/daily"], evaluate)
    }
    states = _wait(stack, run, timeout=480)
    assert states == dict.fromkeys(run, "COMPLETED"), _tail(stack.worker_log, 8000)

    with duckdb.connect(db, read_only=True) as con:
        nodes = con.execute("SELECT count(*) FROM nodes").fetchone()
        samples = con.execute("SELECT count(*) FROM telemetry_samples").fetchone()
    assert nodes is not None and nodes[0] > 0
    assert samples is not None and samples[0] > 0
    assert list((root / "datasets").glob("transitions-*.parquet"))
    assert list((root / "train" / "packages").iterdir())
    assert (root / "evaluation" / "results.json").is_file()

    from linkwise.deployer.promote import current_aliases

    aliases = current_aliases(uri)
    assert "challenger" in aliases
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("linkwise-promotion")
    assert exp is not None
    (decision,) = client.search_runs([exp.experiment_id])
    assert decision.data.params["action"] == "challenger->shadow"
