"""``--switches=1@T`` on a real Slurm of its own with ``topology/tree`` (issue 33 item 4;
``scripts/local-slurm`` with ``LINKWISE_SLURM_TOPOLOGY=tree``: leaf switches s1 = gpu[01-02],
s2 = gpu[03-04]; the version of ``LINKWISE_SLURM_VERSION``, 24.11 by default; no
``max_switch_wait`` set, so Slurm's 300 s cap leaves the cases' T as asked).

The cases of ``evaluation.slurm_switches`` (a) one leaf holds the job: it starts there at
once; (b) a leaf will when a blocker ends before T: it waits for that, then starts there;
(c) none will before T: it starts over both leaves T after its submission; (d) as (b), and a
job behind it that fits now only on a node the waiting job will need does not start (Slurm's
backfill reserves the node). Each as Slurm did it, and as ``backfill_switches`` does on the
same state (the same nodes, starts within ``TOLERANCE_S``).

About 90 s besides the cluster's start."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.topology.load import load_topology
from linkwise.evaluation.slurm_switches import CASES, TOLERANCE_S, run_cases

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
FOLDER = Path("/tmp/lw-slurm-i33-switches")
PORT_BASE = 24200
# pending reasons Slurm may show a job its --switches hold, or one behind it
WAITING_REASONS = {"None", "Resources", "Priority"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmClient]:
    env = {
        **os.environ,
        "LINKWISE_SLURM_DIR": str(FOLDER),
        "LINKWISE_SLURM_PORT_BASE": str(PORT_BASE),
        "LINKWISE_SLURM_VERSION": os.environ.get("LINKWISE_SLURM_VERSION", "24.11"),
        "LINKWISE_SLURM_TOPOLOGY": "tree",
    }
    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=180)
    out = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, timeout=900)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    try:
        client = SlurmClient.from_env(read_env_file(FOLDER / "env"), "cli")
        for q in client.queue():  # this cluster is this module's alone
            client.cancel(q.job_id)
        yield client
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


def test_switches_wait_for_one_leaf_then_spread_as_backfill_switches_does(
    cluster: SlurmClient,
) -> None:
    topo = load_topology(str(FOLDER / "etc"))
    assert topo.plugin == "tree" and len(topo.leaf_names) == 2
    config = cluster.runner.run(["scontrol", "show", "config"])
    assert "max_switch_wait" not in config  # Slurm's default cap, 300 s, above every T
    results = {r.case.name: r for r in run_cases(cluster, topo, CASES, tag="i33-switch")}
    assert list(results) == [c.name for c in CASES]
    leaf = {n.name: topo.leaf_names[n.leaf] for n in topo.nodes}

    def leaves(nodes: tuple[str, ...]) -> set[str]:
        return {leaf[n] for n in nodes}

    fits, waits, spreads, reserves = (results[c.name] for c in CASES)
    (a,) = fits.slurm
    assert a.start_s is not None and a.start_s <= TOLERANCE_S and leaves(a.nodes) == {"s2"}
    (b,) = waits.slurm  # gpu03's blocker ends 10 s in: s2 then holds it, before T = 40 s
    assert b.start_s is not None and 8 <= b.start_s < waits.case.wait_s, b
    assert leaves(b.nodes) == {"s2"}
    (c,) = spreads.slurm
    assert c.start_s is not None and c.start_s >= spreads.case.wait_s, c
    assert leaves(c.nodes) == {"s1", "s2"}
    d, later = reserves.slurm
    assert d.start_s is not None and d.start_s < reserves.case.wait_s and leaves(d.nodes) == {"s2"}
    assert later.start_s is None, later  # gpu04 was reserved for the waiting job
    for r in results.values():
        for o in r.slurm:
            assert set(o.reasons) <= WAITING_REASONS, (r.case.name, o.reasons)
    assert "Resources" in c.reasons  # what squeue says while --switches hold it
    wrong = {name: (r.slurm, r.model) for name, r in results.items() if not r.agrees}
    assert not wrong, wrong
