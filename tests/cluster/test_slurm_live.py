"""The Slurm client against the real local cluster of ``scripts/local-slurm start``."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.cli_transport import CliTransport, CommandRunner
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.records import JobRun

pytestmark = pytest.mark.services

SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
WEIRD = "x;$(rm -rf /) ü 名前"


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    env_file = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env_file.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return read_env_file(env_file)


@pytest.fixture(scope="module")
def cli(env: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(env, "cli")


@pytest.fixture(scope="module")
def rest(env: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(env, "rest")


@pytest.fixture(scope="module")
def mix(cli: SlurmClient) -> Iterator[tuple[float, dict[str, int]]]:
    t0 = time.time() - 2
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
    while not all(
        q.state == "RUNNING" for q in cli.queue() if q.job_id in (ids["cancel"], ids["requeue"])
    ):
        assert time.time() < deadline, "the jobs to cancel and requeue did not start in 120 s"
        time.sleep(0.3)
    cli.cancel(ids["cancel"])
    cli.requeue(ids["requeue"])
    deadline = time.time() + 180
    while any(q.job_id in ids.values() for q in cli.queue()):
        assert time.time() < deadline, "jobs did not finish within 180 s"
        time.sleep(1)
    # wait until every record has settled (the 22.05 transient multi-node record)
    while not all(r.settled for r in cli.jobs(t0)) and time.time() < deadline:
        time.sleep(1)
    yield t0, ids


def by_run(runs: list[JobRun], ids: dict[str, int]) -> dict[tuple[int, int], JobRun]:
    wanted = set(ids.values())
    return {(r.job_id, r.run_index): r for r in runs if r.job_id in wanted}


def test_mix_accounting_values(cli: SlurmClient, mix: tuple[float, dict[str, int]]) -> None:
    t0, ids = mix
    runs = by_run(cli.jobs(t0), ids)
    assert runs[(ids["exit3"], 0)].state == "FAILED" and runs[(ids["exit3"], 0)].exit_code == 3
    two = runs[(ids["two_node"], 0)]
    assert len(two.nodes) == 2 and two.gpus == 4 and two.gpus_per_node == (2, 2) and two.settled
    assert runs[(ids["one_a"], 0)].gpus == 1 and runs[(ids["one_a"], 0)].time_limit_s == 300.0
    assert runs[(ids["cancel"], 0)].state == "CANCELLED"
    assert runs[(ids["requeue"], 0)].state == "REQUEUED"
    assert runs[(ids["requeue"], 1)].state == "COMPLETED"
    weird = runs[(ids["weird"], 0)]
    assert weird.name == WEIRD and weird.comment == WEIRD
    assert all(r.settled and r.cluster == "linkwise" for r in runs.values())
    assert len(runs) == len(ids) + 1


def test_rest_and_cli_give_equal_records(
    cli: SlurmClient, rest: SlurmClient, mix: tuple[float, dict[str, int]]
) -> None:
    t0, ids = mix
    assert by_run(cli.jobs(t0), ids) == by_run(rest.jobs(t0), ids)
    assert cli.nodes() == rest.nodes()
    assert cli.partitions() == rest.partitions()
    assert cli.queue() == rest.queue()


def test_hold_place_release(cli: SlurmClient) -> None:
    job = cli.submit("sleep 1", name="placed", nodes=2, gpus_per_node=1, hold=True)
    try:
        (queued,) = [q for q in cli.queue() if q.job_id == job]
        assert queued.held
        cli.set_nodes(job, ["gpu03", "gpu04"])
        (queued,) = [q for q in cli.queue() if q.job_id == job]
        assert queued.req_nodes == ("gpu03", "gpu04") and queued.num_nodes == 2
        cli.release(job)
        deadline = time.time() + 120
        placed: tuple[str, ...] = ()
        while not placed:
            assert time.time() < deadline, "released job did not start within 120 s"
            placed = next((q.nodes for q in cli.queue() if q.job_id == job and q.nodes), ())
            time.sleep(0.2)
        assert placed == ("gpu03", "gpu04")
    finally:
        cli.cancel(job)


@pytest.mark.parametrize(
    "expr", ["gpu[01-04]", "gpu[01-03,07],cpu1", "r[1-2]n[1-2]", "a[08-10]", "x1,x2,x1"]
)
def test_hostlist_expand_matches_scontrol(cli: SlurmClient, expr: str) -> None:
    assert expand(expr) == cli.hostnames(expr)


def test_timeout_raises_slurm_timeout(env: dict[str, str]) -> None:
    runner = CommandRunner(env["SLURM_CONF"], timeout=0.001, bin_dir=env.get("LINKWISE_SLURM_BIN"))
    with pytest.raises(SlurmTimeout, match="squeue"):
        CliTransport(runner).queue()


def test_unreachable_controller_is_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    # a copy of the config pointing at a port where no slurmctld listens
    conf = Path(env["SLURM_CONF"]).read_text()
    lines = [ln for ln in conf.splitlines() if not ln.startswith("SlurmctldPort=")]
    (tmp_path / "slurm.conf").write_text("\n".join([*lines, "SlurmctldPort=1"]) + "\n")
    (tmp_path / "gres.conf").write_text((Path(env["SLURM_CONF"]).parent / "gres.conf").read_text())
    runner = CommandRunner(str(tmp_path / "slurm.conf"), 20, env.get("LINKWISE_SLURM_BIN"))
    client = SlurmClient(CliTransport(runner), runner)
    with pytest.raises(SlurmError) as err:
        client.queue()
    assert isinstance(err.value, SlurmUnavailable | SlurmTimeout)
    assert "squeue" in str(err.value)
    rest_down = SlurmClient.from_env(
        {**env, "LINKWISE_SLURM_REST_URL": "http://127.0.0.1:1"}, "rest"
    )
    with pytest.raises(SlurmUnavailable, match=r"127\.0\.0\.1:1"):
        rest_down.nodes()
