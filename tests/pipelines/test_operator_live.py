"""The operator's path (docs/OPERATIONS.md, section 1) end to end on a real local Slurm
(issue 32): a burst of jobs on a Slurm instance of this module's own (dir and ports of its
own, stopped whatever the outcome), then only the documented commands, run as an operator
runs them: subprocesses in one working folder, so the operator's defaults
(``linkwise-out/linkwise.duckdb``, ``linkwise-out/mlflow/mlflow.db``) apply.

collect accounting -> build-dataset --until (the first batch) -> train (operator_bc.toml on
that dataset, a few steps) -> evaluate on the store's cluster (the second batch's window) ->
ope -> promote --stage shadow (a few-step model is refused: exit 3) -> serve in shadow mode
a pinned registry version, the registry named by --tracking-uri -> collect -> shadow-report.
Windows are 10 s here (a real cluster keeps the defaults: 6 h windows of 10 jobs).
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkwise.cluster.slurm.client import read_env_file
from linkwise.tests._serve import cycles_run, free_port
from linkwise.tests._slurm import slurm_argv
from linkwise.tests._store import read_store

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
LIVE_DIR = "/tmp/lw-slurm-operator"
LIVE_ENV = {"LINKWISE_SLURM_DIR": LIVE_DIR, "LINKWISE_SLURM_PORT_BASE": "19400"}
WINDOW_S = 10  # evaluation/rollout windows of this test's tiny history


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """This module's own Slurm (the version from $LINKWISE_SLURM_VERSION, default 24.11)."""
    env = {**os.environ, **LIVE_ENV}
    # a fresh accounting: an earlier run's jobs would be in this one's history (clean refuses
    # a state dir with mounts under it)
    subprocess.run([str(SCRIPT), "clean"], env=env, check=True, capture_output=True, timeout=300)
    subprocess.run([str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield read_env_file(Path(LIVE_DIR) / "env")
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


def linkwise_argv() -> list[str]:
    exe = Path(sys.executable).parent / "linkwise"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "linkwise.cli"]


def operator_env(work: Path) -> dict[str, str]:
    """The environment of an operator's shell: no registry or Prefect API set (the defaults
    under the working folder apply), Prefect kept in the folder and quiet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_"))}
    env.update(
        PREFECT_HOME=str(work / ".prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
    )
    return env


def lw(work: Path, *args: str, rc: int = 0, timeout: float = 240) -> str:
    """Run ``linkwise ARGS`` in ``work``; assert its exit status; stdout and stderr."""
    p = subprocess.run(
        [*linkwise_argv(), *args],
        cwd=work,
        env=operator_env(work),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = p.stdout + p.stderr
    assert p.returncode == rc, f"linkwise {' '.join(args)}: exit {p.returncode}\n{out[-4000:]}"
    return out


def sbatch(env: dict[str, str], name: str, nodes: int, gpus_per_node: int, sleep: int) -> int:
    argv = slurm_argv(
        env, "sbatch", "--parsable", f"--job-name={name}", f"--nodes={nodes}",
        f"--gres=gpu:{gpus_per_node}", "--time=5", "--output=/dev/null", "--chdir=/tmp",
        f"--wrap=sleep {sleep}",
    )  # fmt: skip
    out = subprocess.run(
        argv,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    return int(out.split(";")[0])


def burst(env: dict[str, str], rng: random.Random, tag: str, n: int) -> list[int]:
    """``n`` short jobs: 1, 2 or 4 GPUs on one node, every sixth 2 nodes x 2 GPUs."""
    return [
        sbatch(env, f"{tag}-{i}", 2, 2, rng.randint(2, 8))
        if i % 6 == 5
        else sbatch(env, f"{tag}-{i}", 1, rng.choice([1, 2, 4]), rng.randint(2, 8))
        for i in range(n)
    ]


def wait_done(env: dict[str, str], ids: list[int], timeout: float) -> None:
    """Until sacct reports every job in ``ids`` finished (COMPLETED)."""
    deadline = time.time() + timeout
    argv = slurm_argv(env, "sacct", "-a", "-X", "-P", "-n", "-o", "JobIDRaw,State", "-j")
    while True:
        out = subprocess.run(
            [*argv, ",".join(map(str, ids))], capture_output=True, text=True, timeout=60
        ).stdout
        states = dict(line.split("|")[:2] for line in out.splitlines() if "|" in line)
        if len(states) == len(ids) and all(s == "COMPLETED" for s in states.values()):
            return
        assert time.time() < deadline, f"jobs not finished after {timeout} s: {states}"
        time.sleep(1.0)


def test_operator_path(cluster: dict[str, str], tmp_path: Path) -> None:
    t_start = time.monotonic()
    env_file = str(Path(LIVE_DIR) / "env")
    work = tmp_path / "opt-linkwise"  # the operator's working folder
    work.mkdir()
    rng = random.Random(32)

    # history over a span: a first batch (the training span), a second one more than a window
    # later (held out for the evaluation)
    first = burst(cluster, rng, "a", 18)
    until = math.ceil(time.time()) + 1  # every job of the first batch was submitted before
    time.sleep(max(0.0, until + WINDOW_S + 2 - time.time()))
    second = burst(cluster, rng, "b", 18)
    wait_done(cluster, first + second, 180)

    # 1. collect
    out = lw(work, "collect", "accounting", "--db", "linkwise-out/linkwise.duckdb",
             "--slurm-env", env_file)  # fmt: skip
    assert "36 new" in out and "4 nodes" in out, out
    con = read_store(work / "linkwise-out" / "linkwise.duckdb")
    try:
        stored = {r[0] for r in con.execute("SELECT job_id FROM jobs").fetchall()}
        nodes = con.execute("SELECT count(*) FROM nodes").fetchone()
    finally:
        con.close()
    assert set(first + second) <= stored and nodes == (4,)

    # 3. the dataset: the first batch's decisions and rollouts on its window
    out = lw(work, "build-dataset", "--until", str(until), "--window", str(WINDOW_S),
             "--min-jobs", "2", "--rollouts", "all", "--warm-start",
             "--executor", "serial")  # fmt: skip
    datasets = sorted((work / "linkwise-out" / "datasets").glob("transitions-*.parquet"))
    assert len(datasets) == 1, out
    dataset = str(datasets[0].relative_to(work))
    assert "rollout:" in out and "log:" in out, out

    # 4. train: the shipped operator configuration, on that dataset, a tiny budget
    out = lw(work, "train", "--config", str(ROOT / "models/experiments/operator_bc.toml"),
             "--dataset", dataset, "--steps", "20")  # fmt: skip
    assert "registered linkwise-policy version 1 @challenger" in out, out
    assert "linkwise-out/mlflow/mlflow.db" in out, out

    # 5. evaluate on the store's cluster (4 nodes x 4 GPUs), the second batch's window
    out = lw(work, "evaluate", "--policies", "backfill,sjf_bco,model:challenger",
             "--history", "linkwise-out/linkwise.duckdb", "--warm-start",
             "--window", str(WINDOW_S), "--min-jobs", "2", "--n-windows", "1", "--seeds", "0",
             "--executor", "serial")  # fmt: skip
    assert "on linkwise (4x4, 16 GPUs)" in out, out
    assert "topology: the store's nodes table" in out, out
    assert (work / "linkwise-out" / "evaluation" / "report.md").is_file()

    # 6. FQE on the dataset, then the gate: a 20-step model does not beat the best
    # heuristic, so promotion is refused (exit 3) with the gate's reasons
    lw(work, "ope", "--dataset", dataset, "--policies", "model:challenger", "--seeds", "0",
       "--out", "linkwise-out/ope.json")  # fmt: skip
    out = lw(work, "promote", "--stage", "shadow", "--evaluation", "linkwise-out/evaluation",
             "--ope", "linkwise-out/ope.json", rc=3)  # fmt: skip
    assert "REFUSED" in out and "better_than_best_heuristic" in out, out
    assert "no FQE estimate" not in out, out  # the FQE evidence was read
    assert "aliases now: @challenger=1\n" in out, out  # no @shadow

    # 7. serve in shadow mode the registry version itself (nothing holds @shadow), the
    # registry named by --tracking-uri; jobs arrive while it runs
    port = free_port()
    serve = subprocess.Popen(
        [*linkwise_argv(), "serve", "--mode", "shadow", "--partition", "gpu",
         "--policy", "model:models:/linkwise-policy/1",
         "--tracking-uri", "linkwise-out/mlflow/mlflow.db", "--slurm-env", env_file,
         "--lease-root", str(tmp_path / "leases"), "--interval", "1", "--max-cycles", "25",
         "--metrics-port", str(port)],
        cwd=work, env=operator_env(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    third: list[int] = []
    try:
        deadline = time.time() + 180
        while serve.poll() is None and time.time() < deadline:
            # jobs arrive once the loop cycles: on a loaded machine its start-up can outlast
            # every burst, and jobs submitted before its first cycle are outside its span
            if len(third) < 16 and cycles_run(port) >= 1:
                third += burst(cluster, rng, "c", 2)
            time.sleep(2.0)
        s_out, s_err = serve.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert serve.returncode == 0, s_out + s_err[-4000:]
    assert '"cycles": 25' in s_out and '"failed_cycles": 0' in s_out, s_out
    assert not (work / "mlflow.db").exists()
    wait_done(cluster, third, 120)

    # 8. collect the jobs the loop saw, then the evidence
    lw(work, "collect", "accounting", "--db", "linkwise-out/linkwise.duckdb",
       "--slurm-env", env_file)  # fmt: skip
    out = lw(work, "shadow-report")
    assert "shadow report (model:models:/linkwise-policy/1," in out, out
    assert "decision rows of model:models:/linkwise-policy/1 (version 1)" in out, out
    assert (work / "linkwise-out" / "shadow-report").is_dir()
    assert time.monotonic() - t_start < 600
