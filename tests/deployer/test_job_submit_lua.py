"""``deployer/job_submit.lua`` inside a real slurmctld (JobSubmitPlugins=lua, a separate local
cluster): while a live loop's lease is fresh and its owner runs, new jobs of a managed
partition arrive held and tagged (AdminComment ``linkwise:held``); jobs with an explicit node
list, a user's own ``--hold`` and jobs submitted without a live lease are not; a user cannot
release a job held for the loop while the loop lives; and a burst of submissions across a
``kill -9`` of the loop leaves no job held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.lease import lease_dir_for, pid_start_time
from linkwise.tests._slurm import slurm_argv

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
LUA_CLUSTER = Path("/tmp/lw-slurm-lua")
PORT_BASE = 19800
LEASE_ROOT = Path("/tmp/lw-slurm-lua-leases")  # what the loop is given (ServeConfig.lease_root)
MARKER = 'local LEASE_DIR = "/var/lib/linkwise/leases/CLUSTER-HOST-PORT"'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = {
        **os.environ,
        "LINKWISE_SLURM_DIR": str(LUA_CLUSTER),
        "LINKWISE_SLURM_PORT_BASE": str(PORT_BASE),
    }
    # the plugin is installed pointing at this cluster's lease directory (what an
    # administrator does once; the loop logs the directory it derives from slurm.conf)
    ctld = f"SlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={PORT_BASE + 17}\n"
    lease_dir = lease_dir_for(LEASE_ROOT, f"ClusterName=linkwise\n{ctld}")
    source = (ROOT / "deployer" / "job_submit.lua").read_text()
    assert MARKER in source  # the installed default, replaced by this cluster's directory
    lua = tmp_path_factory.mktemp("lua") / "job_submit.lua"
    # the fallback renamed: jobs without --partition must be found in slurm.conf's default
    source = source.replace('local DEFAULT_PARTITION = "gpu"', 'local DEFAULT_PARTITION = "none"')
    lua.write_text(source.replace(MARKER, f'local LEASE_DIR = "{lease_dir}"'))
    env["LINKWISE_SLURM_JOB_SUBMIT_LUA"] = str(lua)
    subprocess.run([str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=120)
    try:
        conf = read_env_file(LUA_CLUSTER / "env")
        slurm_conf = Path(conf["SLURM_CONF"]).read_text()
        assert "JobSubmitPlugins=lua" in slurm_conf
        assert lease_dir_for(LEASE_ROOT, slurm_conf) == lease_dir
        conf["LEASE_DIR"] = str(lease_dir)
        yield conf
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


@pytest.fixture(scope="module")
def client(cluster: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(cluster, "cli")


def write_lease(cluster: dict[str, str], expiry: float, pid: int | None = None) -> None:
    """The per-partition file the plugin reads: expiry, owner pid, its start time, host."""
    pid = os.getpid() if pid is None else pid
    start = pid_start_time(pid) or 0
    path = Path(cluster["LEASE_DIR"]) / "gpu.expires"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{int(expiry)} {pid} {start} {os.uname().nodename}\n")


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


def _admin_comment(client: SlurmClient, job_id: int) -> str:
    out = client.runner.run(["scontrol", "-o", "show", "job", str(job_id)])
    for field in out.split():
        if field.startswith("AdminComment="):
            return field.removeprefix("AdminComment=")
    return ""


def _as_user(cluster: dict[str, str], user: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = slurm_argv(cluster, *args, user=user)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd="/tmp")


def _submit_as(cluster: dict[str, str], user: str, *args: str) -> int:
    out = _as_user(cluster, user, "sbatch", "--parsable", "-o", "/dev/null", *args)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def test_jobs_are_held_only_while_the_lease_is_fresh(
    cluster: dict[str, str], client: SlurmClient
) -> None:
    write_lease(cluster, time.time() + 600)
    held = client.submit("sleep 1", name="lua-held", gpus_per_node=1, partition="gpu")
    pinned = client.submit(
        "sleep 1", name="lua-pinned", gpus_per_node=1, partition="gpu",
        extra_args=["--nodelist=gpu02"],
    )  # fmt: skip
    _wait(lambda: _state(client, pinned)[0] == "COMPLETED", 60, "the pinned job to run")
    state, reason = _state(client, held)
    # priority 0 from job_submit: Slurm 22.05 reports it as JobHeldUser; the tag says whose
    assert (state, reason) == ("PENDING", "JobHeldUser")
    assert _admin_comment(client, held) == HOLD_TAG
    assert next(q for q in client.queue() if q.job_id == held).held

    write_lease(cluster, 0)  # the loop released its lease: Slurm schedules as usual
    free = client.submit("sleep 1", name="lua-free", gpus_per_node=1, partition="gpu")
    _wait(lambda: _state(client, free)[0] == "COMPLETED", 60, "the job after the lease")
    assert _state(client, held) == (state, reason)  # still held until released

    client.runner.run(["scontrol", "release", str(held)])
    _wait(lambda: _state(client, held)[0] == "COMPLETED", 60, "the released job to run")
    assert _admin_comment(client, held) == "linkwise:released"  # the claim ended with it


def test_a_fresh_lease_of_a_dead_owner_holds_nothing(
    cluster: dict[str, str], client: SlurmClient
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_lease(cluster, time.time() + 600, pid=dead.pid)  # kill -9: never renewed again
    job = client.submit("sleep 1", name="lua-dead-owner", gpus_per_node=1, partition="gpu")
    _wait(lambda: _state(client, job)[0] == "COMPLETED", 60, "the job to run unheld")
    assert _admin_comment(client, job) in ("", "(null)")
    write_lease(cluster, 0)


def test_a_user_cannot_release_a_job_held_for_the_loop(
    cluster: dict[str, str], client: SlurmClient
) -> None:
    write_lease(cluster, time.time() + 600)
    job = _submit_as(cluster, "slurm", "-J", "lua-user", "--gres=gpu:1", "--wrap=sleep 1")
    own = _submit_as(cluster, "slurm", "--hold", "-J", "lua-own", "--gres=gpu:1", "--wrap=sleep 1")
    try:
        assert _state(client, job) == ("PENDING", "JobHeldUser")
        assert _admin_comment(client, job) == HOLD_TAG
        assert _admin_comment(client, own) in ("", "(null)")  # the user's own hold: not ours
        out = _as_user(cluster, "slurm", "scontrol", "release", str(job))
        assert out.returncode != 0, "the user released a job held for the live loop"
        # a user's own hold on top would keep the tag: refused rather than overridden later
        assert _as_user(cluster, "slurm", "scontrol", "hold", str(job)).returncode != 0
        assert _state(client, job) == ("PENDING", "JobHeldUser")
        assert _as_user(cluster, "slurm", "scontrol", "release", str(own)).returncode == 0
        # with no live loop, the user may release it (fail-open)
        write_lease(cluster, 0)
        assert _as_user(cluster, "slurm", "scontrol", "release", str(job)).returncode == 0
        _wait(lambda: _state(client, job)[0] == "COMPLETED", 60, "the released job to run")
    finally:
        write_lease(cluster, 0)
        for j in (job, own):
            client.cancel(j)


def test_a_burst_across_kill9_of_the_loop_leaves_no_job_held(
    cluster: dict[str, str], client: SlurmClient, tmp_path: Path
) -> None:
    cmd = [
        sys.executable, "-m", "linkwise.cli", "serve", "--mode", "active", "--partition",
        "gpu", "--slurm-env", str(LUA_CLUSTER / "env"), "--db", str(tmp_path / "store.duckdb"),
        "--state-dir", str(tmp_path / "state"), "--lease-root", str(LEASE_ROOT),
        "--policy", "fifo", "--interval", "1", "--lease", "4",
    ]  # fmt: skip
    errf = tmp_path / "serve.log"
    with open(errf, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
    ids: list[int] = []
    try:
        _wait(lambda: b'"event": "cycle"' in errf.read_bytes(), 60, "the loop's first cycle")
        for i in range(25):
            t0 = time.monotonic()
            if i == 8:
                proc.send_signal(signal.SIGKILL)
            ids.append(client.submit("sleep 1", name=f"lua-burst{i}", gpus_per_node=1))
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
        proc.wait(5)
        wlog = tmp_path / "state" / "watchdog.log"
        _wait(lambda: b"watchdog_exit" in wlog.read_bytes(), 30, "the watchdog to finish")
        time.sleep(5)  # past the old lease's expiry: nothing is left to release anything
        out = client.runner.run(["squeue", "-h", "-t", "PD", "-o", "%i|%r"])
        held = [ln for ln in out.splitlines() if ln.split("|")[0] in {str(j) for j in ids}]
        assert not [ln for ln in held if "JobHeld" in ln], (held, wlog.read_text()[-3000:])
        # not vacuous: the plugin held jobs for the loop before the kill, the loop or the
        # watchdog released them (the tag ended with the release), none after the kill
        tags = [_admin_comment(client, j) for j in ids]
        assert tags[:8].count("linkwise:released") >= 4, tags
        assert HOLD_TAG not in tags, tags
    finally:
        if proc.poll() is None:
            proc.kill()
        for j in ids:
            client.cancel(j)
