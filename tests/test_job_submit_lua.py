"""``deployer/job_submit.lua`` inside a real slurmctld (JobSubmitPlugins=lua, a separate local
cluster): while the live loop's lease is fresh, new jobs of a managed partition arrive held;
jobs with an explicit node list and jobs submitted after the lease expired are not held; a
held job runs once released (what the loop or its watchdog does)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from linkwise.cluster.slurm.client import SlurmClient, read_env_file

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-slurm"
LUA_DIR = Path("/tmp/lw-slurm-lua")
LEASE = LUA_DIR / "lease-gpu.json.expires"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmClient]:
    source = (ROOT / "deployer" / "job_submit.lua").read_text()
    marker = 'local LEASE_EXPIRES = "/var/lib/linkwise/serve/lease-gpu.json.expires"'
    assert marker in source  # the installed default, replaced by this test's lease file
    lua = tmp_path_factory.mktemp("lua") / "job_submit.lua"
    lua.write_text(source.replace(marker, f'local LEASE_EXPIRES = "{LEASE}"'))
    LUA_DIR.mkdir(parents=True, exist_ok=True)
    LEASE.write_text("0\ngpu\n")
    env = {
        **os.environ,
        "LINKWISE_SLURM_DIR": str(LUA_DIR),
        "LINKWISE_SLURM_PORT_BASE": "19800",
        "LINKWISE_SLURM_JOB_SUBMIT_LUA": str(lua),
    }
    subprocess.run([str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=120)
    try:
        conf = read_env_file(LUA_DIR / "env")
        assert "JobSubmitPlugins=lua" in Path(conf["SLURM_CONF"]).read_text()
        yield SlurmClient.from_env(conf, "cli")
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.3)


def _state(client: SlurmClient, job_id: int) -> tuple[str, str]:
    """(state, reason) from squeue, or sacct's state once the job left the queue."""
    out = client.runner.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"]).strip()
    if out:
        state, reason = out.split("|", 1)
        return state, reason
    acct = client.runner.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", str(job_id)])
    return (acct.strip().splitlines() or ["UNKNOWN"])[0], ""


def test_jobs_are_held_only_while_the_lease_is_fresh(client: SlurmClient) -> None:
    LEASE.write_text(f"{int(time.time()) + 600}\ngpu\n")
    held = client.submit("sleep 1", name="lua-held", gpus_per_node=1, partition="gpu")
    pinned = client.submit(
        "sleep 1", name="lua-pinned", gpus_per_node=1, partition="gpu",
        extra_args=["--nodelist=gpu02"],
    )  # fmt: skip
    _wait(lambda: _state(client, pinned)[0] == "COMPLETED", 60, "the pinned job to run")
    state, reason = _state(client, held)
    # priority 0 from job_submit: Slurm 22.05 reports a hold (JobHeldUser for root's jobs)
    assert state == "PENDING" and reason in ("JobHeldUser", "JobHeldAdmin")
    assert next(q for q in client.queue() if q.job_id == held).held

    LEASE.write_text("0\ngpu\n")  # the loop released its lease: Slurm schedules as usual
    free = client.submit("sleep 1", name="lua-free", gpus_per_node=1, partition="gpu")
    _wait(lambda: _state(client, free)[0] == "COMPLETED", 60, "the job after the lease")
    assert _state(client, held) == (state, reason)  # still held until released

    client.runner.run(["scontrol", "release", str(held)])
    _wait(lambda: _state(client, held)[0] == "COMPLETED", 60, "the released job to run")
