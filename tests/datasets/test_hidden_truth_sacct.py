"""The hidden truth's sacct text (``datasets.hidden_truth.sacct``): the fields of Slurm's own
records, what the collector's parser makes of it, and the store filled through it. Against
the running Slurm: ``test_hidden_truth_slurm.py``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from linkwise.cluster.slurm.accounting import parse_sacct_output
from linkwise.datasets.hidden_truth.exposition import accounting
from linkwise.datasets.hidden_truth.sacct import SLURM_RELEASES, SacctJob, sacct_json, sacct_lines
from linkwise.datasets.hidden_truth.store import fill_truth_store
from linkwise.datasets.hidden_truth.truth import HiddenTruth, simulate_timeline, truth_workload
from linkwise.datasets.store import open_store
from tests._slurm import SHARED_SLURM_DATA
from tests.datasets.test_hidden_truth_slurm import batch_step, keys

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
UNEVEN = SacctJob(
    job_id=7,
    name="gpt-7b",
    user="u-gpt-7b",
    account="a",
    partition="gpu",
    cluster="truth",
    state="COMPLETED",
    exit_code=0,
    submit=1_700_000_000,
    start=1_700_000_010,
    end=1_700_000_600,
    nodes=("gpu1", "gpu2", "gpu3"),
    gpus_per_node=(2, 4, 2),
)
CAPTURES = {
    "22.05": FIXTURES / "sacct.json",
    "24.11": SHARED_SLURM_DATA / "24.11" / "final" / "sacct.json",
    "26.05": SHARED_SLURM_DATA / "26.05" / "final" / "sacct.json",
}


@pytest.mark.parametrize("slurm", sorted(SLURM_RELEASES))
def test_records_have_the_fields_slurm_prints(slurm: str) -> None:
    path = CAPTURES[slurm]
    if not path.exists():
        pytest.skip(f"no capture of Slurm {slurm} here ({path})")
    real = json.loads(path.read_text())
    mine = json.loads(sacct_json([UNEVEN], slurm))
    assert keys(mine["meta"]) == keys(real["meta"]) and set(mine) == set(real)
    batch_only = [r for r in real["jobs"] if r["name"] in ("one-gpu", "two-node", "lw-n2")]
    assert batch_only
    for rec in batch_only:
        assert keys(mine["jobs"][0]) == keys(rec), rec["name"]


@pytest.mark.parametrize("slurm", sorted(SLURM_RELEASES))
def test_parsed_as_sacct_keeps_it(slurm: str) -> None:
    """The collector's reading: the GPU total over the node list, split evenly (sacct keeps
    no count per node); the batch step alone holds its node's own count."""
    running = replace(UNEVEN, job_id=8, state="RUNNING", end=None)
    text = sacct_json([UNEVEN, running], slurm)
    done, still = parse_sacct_output(text, sacct_lines([UNEVEN, running])).strict()
    assert done.nodes == ("gpu1", "gpu2", "gpu3") and done.gpus == 8
    assert done.gpus_per_node == (3, 3, 2) and done.allocation_nodes == 3 and done.settled
    assert (done.state, done.exit_code, done.end_time) == ("COMPLETED", 0, 1_700_000_600.0)
    assert (done.name, done.user, done.account, done.cluster) == (
        "gpt-7b",
        "u-gpt-7b",
        "a",
        "truth",
    )
    assert (still.state, still.exit_code, still.end_time) == ("RUNNING", None, None)
    assert done.time_limit_s is None
    assert batch_step(json.loads(text)["jobs"][0]) == (("gpu1",), 2)


def test_jobs_need_slurm_order_and_a_known_release() -> None:
    with pytest.raises(ValueError, match="order"):
        replace(UNEVEN, nodes=("gpu2", "gpu1", "gpu3"))
    with pytest.raises(ValueError, match="schema"):
        sacct_json([UNEVEN], "23.02")


def test_accounting_lists_nodes_in_slurm_order() -> None:
    truth = HiddenTruth.default(topology_spec="10x8,leaf=5,nic=50,intra=450,oversub=2", hours=1)
    held = accounting(truth, simulate_timeline(truth, truth_workload(truth)))
    split = [j for j in held if len(j.nodes) > 1]
    assert split
    timeline = simulate_timeline(truth, truth_workload(truth))
    first = {p.job_id: p for _, _, ps in timeline.segments() for p in ps}
    names = [n.name for n in truth.topology().nodes]
    for j in held:
        alloc = {names[n]: g for n, g in first[j.job_id].placement.alloc}
        assert dict(zip(j.nodes, j.gpus_per_node, strict=True)) == alloc


def test_store_holds_what_the_parser_reads() -> None:
    truth = HiddenTruth.default(topology_spec="2x8,leaf=2,nic=50,intra=450,oversub=2", hours=0.5)
    stored = []
    for slurm in ("22.05", "26.05"):
        con = open_store(":memory:")
        report = fill_truth_store(con, replace(truth, slurm=slurm))
        rows = con.execute(
            "SELECT job_id, name, state, gpus, end_time IS NULL FROM jobs ORDER BY job_id"
        ).fetchall()
        assert len(rows) == report.runs and sum(r[4] for r in rows) == report.running_at_end
        stored.append(rows)
    assert stored[0] == stored[1] and stored[0]
