"""``backfill`` against the real local Slurm (``scripts/local-slurm``): the same workload run
by Slurm and decided by the simulator's backfill, job by job.

24 jobs with shapes (nodes x GPUs per node), time limits of 1-3 minutes and sleeps of
3-25 s are submitted held (``--cpus-per-gpu=2``: CPUs in proportion to GPUs, which
``placement.slurm_select`` assumes) and released at once. Then:

- at (at least three quarters of) the instants Slurm started jobs, ``backfill`` given the
  cluster as Slurm had it (its running jobs on their nodes, its queue) starts the same jobs
  on the same nodes, or ones Slurm started on those nodes within its backfill interval;
- the whole workload replayed in the simulator (each job's work = its measured run time,
  the scheduler seeing only time limits) starts every job, and Slurm's first pass starts
  the same jobs on the same nodes; the whole replay's agreement depends on Slurm's
  scheduling latency, hence on the machine's load, and is a benchmark figure only
  (``benchmarks/backfill_vs_slurm.py``).

It waits for an idle cluster and cancels only its own jobs. About 70-90 s.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkwise.cluster.domain import Topology
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import JobRun
from linkwise.cluster.topology.load import load_topology
from linkwise.evaluation.slurm_replay import (
    check_instants,
    compare,
    replay,
    replay_jobs,
    run_on_slurm,
    workload,
)

pytestmark = pytest.mark.services

SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
BF_INTERVAL_S = 2.0  # scripts/local-slurm: SchedulerParameters=sched_interval=2,bf_interval=2
TAG = "lw-bfcmp"


@pytest.fixture(scope="module")
def cli() -> SlurmClient:
    env_file = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env_file.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return SlurmClient.from_env(read_env_file(env_file), "cli")


def _wait_idle(cli: SlurmClient, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while cli.queue():
        if time.time() > deadline:
            pytest.fail(f"the local Slurm did not become idle within {timeout_s:.0f} s")
        time.sleep(2)


@pytest.fixture(scope="module")
def slurm_run(cli: SlurmClient) -> Iterator[tuple[list[JobRun], float, Topology]]:
    topo = load_topology(str(SLURM_DIR / "etc"))
    for _ in range(2):  # once more if someone else's job shared the cluster
        _wait_idle(cli, 120)
        runs, released, foreign = run_on_slurm(cli, workload(24, seed=0), tag=TAG)
        if not foreign:
            break
    else:
        pytest.fail("other jobs ran on the local Slurm during both attempts")
    assert len(runs) == 24 and all(r.state == "COMPLETED" for r in runs), [
        (r.job_id, r.state) for r in runs
    ]
    yield runs, released, topo


def test_backfill_decides_as_slurm_at_every_instant(
    slurm_run: tuple[list[JobRun], float, Topology],
) -> None:
    runs, released, topo = slurm_run
    checks = check_instants(runs, topo, released, BF_INTERVAL_S)
    assert len(checks) >= 8  # the workload makes Slurm decide many times
    bad = [c for c in checks if not c.agrees]
    # Most instants agree exactly. The rest come from what the accounting cannot show: when
    # in its 2 s cycle Slurm's backfill pass ran (its reservations are rounded down to the
    # minute, so a pass on the other side of a minute boundary plans differently) and
    # sub-second order of job ends; benchmarks/backfill_vs_slurm.md lists them.
    assert len(bad) <= len(checks) // 4, "\n".join(
        f"t={c.time:.0f}s Slurm {c.slurm} backfill {c.decided}" for c in bad
    )


def test_the_replay_in_the_simulator_follows_slurm(
    slurm_run: tuple[list[JobRun], float, Topology],
) -> None:
    runs, released, topo = slurm_run
    sim = replay(topo, replay_jobs(runs, released))
    result = compare(runs, sim, topo, released)
    assert len(result.jobs) == len(runs)  # the replay starts every job
    assert all(j.sim_start >= 0.0 for j in result.jobs)
    # Slurm's first scheduling pass (whenever it ran: its latency grows with the machine's
    # load) sees the state the replay starts from: the same jobs start on the same nodes
    t_first = min(j.slurm_start for j in result.jobs)
    first = [j for j in result.jobs if j.slurm_start == t_first]
    assert first and all(j.sim_start == 0.0 and j.slurm_nodes == j.sim_nodes for j in first)
    # Later, Slurm's 0-2 s scheduling latency (more on a loaded machine) accumulates and
    # shifts later decisions, so how many jobs land on the same nodes over the whole replay
    # depends on the load: it is a figure of benchmarks/backfill_vs_slurm.py, not asserted
    # here (issue 21: 10 of 24 on a loaded CI machine). Each instant on Slurm's own state
    # is what test_backfill_decides_as_slurm_at_every_instant checks.
