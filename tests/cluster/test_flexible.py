"""Flexible and fixed requests (issue 33 item 1): ``Job.flexible``, the placements that keep
a fixed shape and spread a flexible one, Slurm's choice for a flexible request
(``slurm_select_flexible``), the simulator's check, the seeded ``--flexible`` rule and the
native trace's ``flexible`` column."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Shape,
    Start,
    within_request,
)
from linkwise.cluster.flexible import RULE, flexible_draw, with_flexible
from linkwise.cluster.placement.slurm_select import (
    fixed_first_fit,
    slurm_select_flexible,
    split_job_gpus,
)
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import InvalidDecision
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.rollouts import cut_windows, resample_window
from linkwise.datasets.traces import jobs_frame, load_trace, write_native
from linkwise.pipelines.evaluate import evaluate
from linkwise.policies.heuristics import make_policy, policy_names
from linkwise.policies.parts.placements import PLACEMENTS
from linkwise.policies.spec import PolicySpec

CAL = load_calibration(None)


def test_a_request_form_and_its_shape() -> None:
    with pytest.raises(ValueError, match="flexible"):
        Job(1, 0.0, 16, 10.0, flexible=True, nodes=2)
    fixed = Job(1, 0.0, 12, 10.0, flexible=False)  # 2 x 6 on 8-GPU nodes
    assert within_request(fixed, Placement(((0, 6), (1, 6))), 8)
    assert not within_request(fixed, Placement(((0, 8), (1, 4))), 8)
    flexible = replace(fixed, flexible=True)
    unknown = replace(fixed, flexible=None)
    for job in (flexible, unknown):
        assert within_request(job, Placement(((0, 8), (1, 4))), 8)
        assert within_request(job, Placement(((0, 4), (1, 4), (2, 4))), 8)
    assert not within_request(flexible, Placement(((0, 8),)), 8)


def test_slurm_select_flexible_on_one_leaf_packs_then_spreads() -> None:
    one_leaf = from_spec("4x8,leaf=4")
    assert slurm_select_flexible(one_leaf, [8, 5, 4, 8], 4) == Placement(((2, 4),))  # best fit
    assert slurm_select_flexible(one_leaf, [8, 0, 8, 8], 16) == Placement(((2, 8), (3, 8)))
    # no node holds 4: the run of consecutive nodes that holds them with the fewest free
    assert slurm_select_flexible(one_leaf, [2, 2, 0, 3], 4) == Placement(((0, 2), (1, 2)))
    assert slurm_select_flexible(one_leaf, [2, 1, 0, 3], 7) is None
    assert fixed_first_fit([4, 8, 2, 8], Shape(2, 6)) == Placement(((1, 6), (3, 6)))


# Slurm 24.11's (and 26.05's) own choices with topology/tree on 4 x 4 GPUs, leaves of two
# nodes (evaluation.slurm_flexible.HANDPICKED; benchmarks/backfill_vs_slurm.md): free GPUs,
# GPU count -> --gpus=N, then -n N --gpus-per-task=1
SLURM_TREE_CHOICES = [
    ([1, 3, 2, 4], 6, {1: 3, 3: 3}, {1: 2, 3: 4}),
    ([3, 3, 2, 3], 5, {0: 3, 3: 2}, {0: 2, 3: 3}),
    ([2, 1, 2, 2], 5, {0: 2, 2: 2, 3: 1}, {0: 1, 2: 2, 3: 2}),
    ([2, 1, 1, 2], 5, {0: 2, 1: 1, 3: 2}, {0: 2, 1: 1, 3: 2}),
    ([2, 3, 1, 1], 6, {0: 2, 1: 3, 2: 1}, {0: 2, 1: 3, 2: 1}),
    ([3, 4, 4, 1], 2, {2: 2}, {2: 2}),
    ([4, 0, 3, 3], 6, {0: 4, 2: 2}, {0: 4, 2: 2}),
]


@pytest.mark.parametrize(("free", "gpus", "job", "tasks"), SLURM_TREE_CHOICES)
def test_slurm_select_flexible_on_a_tree_is_slurms_choice(
    free: list[int], gpus: int, job: dict[int, int], tasks: dict[int, int]
) -> None:
    tree = from_spec("4x4,leaf=2")
    assert slurm_select_flexible(tree, free, gpus) == Placement.of(list(job.items()))
    got = slurm_select_flexible(tree, free, gpus, per_task=True)
    assert got == Placement.of(list(tasks.items()))


def test_slurm_select_flexible_on_a_larger_tree() -> None:
    tree = from_spec("8x8,leaf=4")
    free = [3, 3, 3, 3, 0, 4, 0, 2]
    # node 5 weighs least (4 usable GPUs) and is taken; its leaf offers no other node of the
    # groups taken, so the first node of leaf 1 gives the rest, and --gpus splits 3 + 3
    assert slurm_select_flexible(tree, free, 6) == Placement(((0, 3), (5, 3)))
    # 14: nodes 0-3 and 5 (weights 3 and 4); split in index order, node 5 takes the rest
    assert slurm_select_flexible(tree, free, 14) == Placement(
        ((0, 3), (1, 3), (2, 3), (3, 3), (5, 2))
    )
    assert slurm_select_flexible(tree, free, 19) is None


def test_split_job_gpus_keeps_one_gpu_for_each_later_node() -> None:
    assert split_job_gpus([0, 1], [4, 4], 5) == Placement(((0, 4), (1, 1)))
    assert split_job_gpus([1, 0], [2, 4], 5) == Placement(((0, 2), (1, 3)))
    assert split_job_gpus([0, 1, 2], [4, 4, 4], 3) == Placement(((0, 1), (1, 1), (2, 1)))
    # the first pass leaves some out (later nodes short): the nodes in order fill up
    assert split_job_gpus([0, 1, 2], [4, 1, 1], 6) == Placement(((0, 4), (1, 1), (2, 1)))
    assert split_job_gpus([0, 1], [1, 1], 3) is None


def _random_free(rnd: random.Random, n: int) -> list[int]:
    return [rnd.choice((0, 0, 1, 2, 3, 4, 6, 8)) for _ in range(n)]


@pytest.mark.parametrize("rule", sorted(PLACEMENTS))
def test_every_placement_keeps_a_fixed_shape(rule: str) -> None:
    topo = from_spec("16x8,leaf=4")
    place = PLACEMENTS[rule]()
    rnd = random.Random(rule)
    placed = 0
    for i in range(400):
        free = _random_free(rnd, len(topo.nodes))
        busy = [rnd.randint(0, 3) for _ in free]
        flows = [0] * len(topo.links)
        gpus = rnd.choice((2, 3, 4, 6, 8, 12, 16, 24))
        job = Job(i, 0.0, gpus, 10.0, next(iter(CAL.profiles)), flexible=False)
        p = place.place(topo, free, busy, flows, job)
        if p is not None:
            placed += 1
            assert within_request(job, p, 8), (rule, free, gpus, p)
            assert all(free[n] >= g for n, g in p.alloc)
        flex = place.place(topo, free, busy, flows, replace(job, flexible=True))
        if flex is not None:
            assert flex.num_gpus == gpus and all(free[n] >= g for n, g in flex.alloc)
    assert placed > 50


def test_select_spreads_a_flexible_request_where_the_fixed_one_waits() -> None:
    topo = from_spec("4x8,leaf=4")
    select = PLACEMENTS["select"]()
    job = Job(1, 0.0, 4, 10.0, flexible=False)
    free = [2, 2, 3, 0]
    assert select.place(topo, free, [], [], job) is None
    spread = select.place(topo, free, [], [], replace(job, flexible=True))
    assert spread is not None and spread.num_nodes == 2


def test_the_simulator_refuses_a_fixed_job_in_another_shape() -> None:
    topo = from_spec("4x8,leaf=4")
    job = Job(1, 0.0, 8, 100.0, next(iter(CAL.profiles)), flexible=False)
    sim = Simulator(topo, [job], AnalyticModel(CAL))
    sim.observe()
    with pytest.raises(InvalidDecision, match="fixed shape"):
        sim.apply(Decision((Start(1, Placement(((0, 4), (1, 4)))),)))
    flexible = Simulator(topo, [replace(job, flexible=True)], AnalyticModel(CAL))
    flexible.observe()
    flexible.apply(Decision((Start(1, Placement(((0, 4), (1, 4)))),)))  # any split


def test_the_seeded_rule() -> None:
    sizes = [1, 2, 4, 8, 16] * 200
    jobs = [Job(i, float(i), g, 10.0, nodes=2 if g == 16 else 0) for i, g in enumerate(sizes)]
    half = with_flexible(jobs, 0.5, seed=3)
    assert half == with_flexible(jobs, 0.5, seed=3)
    multi = [j for j in half if j.num_gpus > 1]
    share = sum(bool(j.flexible) for j in multi) / len(multi)
    assert 0.45 < share < 0.55
    assert all(j.flexible is False for j in half if j.num_gpus == 1)
    for j in multi:
        assert j.flexible == (flexible_draw(j.job_id, 3) < 0.5)
        assert not j.flexible or j.nodes == 0
    assert all(j.flexible is False for j in with_flexible(jobs, 0.0))
    assert all(bool(j.flexible) == (j.num_gpus > 1) for j in with_flexible(jobs, 1.0))
    kept = with_flexible([replace(jobs[1], flexible=False)], 1.0)  # a known form is kept
    assert kept[0].flexible is False
    with pytest.raises(ValueError):
        with_flexible(jobs, 1.5)


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_every_heuristic_places_within_the_requests(share: float) -> None:
    topo = from_spec("12x8,leaf=4,ecmp=1")
    jobs = synthetic.generate(90, seed=4, load_scale=3.0, max_gpus=topo.total_gpus)
    jobs = with_flexible(assign_profiles(jobs, CAL, seed=4), share, seed=4)
    jobs = tuple(replace(j, pred_s=j.duration, pred_hi_s=2 * j.duration) for j in jobs)
    for name in policy_names(predictions=True):
        result = simulate(topo, jobs, AnalyticModel(CAL), make_policy(name))
        assert len(result.records) == len(jobs), name


def test_native_trace_flexible_column(tmp_path: Path) -> None:
    jobs = [
        Job(1, 0.0, 8, 10.0, flexible=True),
        Job(2, 1.0, 16, 10.0, nodes=2, flexible=False),
        Job(3, 2.0, 4, 10.0),
    ]
    path = tmp_path / "t.csv"
    write_native(jobs, path)
    assert [j.flexible for j in load_trace(path, "native").jobs] == [True, False, None]
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,submit_time,num_gpus,duration,nodes,flexible\n"
        "1,0,8,10,0,2\n2,1,16,10,2,1\n3,2,4,10,0,x\n4,3,4,10,0,\n"
    )
    trace = load_trace(bad, "native")
    assert [j.job_id for j in trace.jobs] == [4] and trace.jobs[0].flexible is None
    assert [r.reason for r in trace.rejected] == [
        "flexible is not 0 or 1",
        "a flexible request with a node count",
        "flexible is not 0 or 1",
    ]


def test_simulate_takes_a_flexible_share() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "linkwise.cli", "simulate", "--policy", "backfill", "--jobs",
         "60", "--cluster", "8x8,leaf=4,ecmp=1", "--flexible", "0.5", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(out.stdout)
    assert 0 < row["flexible_jobs"] < 60


def test_backfill_starts_a_flexible_request_around_a_reservation() -> None:
    """The head (16 GPUs) reserves node 1 (free when its job ends) and node 4; a 4-GPU job
    of a long run fits now only on node 4, which the reservation holds: fixed, it waits;
    flexible, it starts now on the 2 + 2 GPUs nobody reserved."""
    topo = from_spec("4x8,leaf=4")
    prof = next(iter(CAL.profiles))

    def running(jid: int, node: int, gpus: int, limit: float) -> RunningJob:
        job = Job(jid, 0.0, gpus, limit, prof, time_limit=limit)
        return RunningJob(job, Placement(((node, gpus),)), 0.0, limit, 1.0)

    head = Job(10, 1.0, 16, 3000.0, prof, time_limit=5000.0)
    small = Job(11, 2.0, 4, 50000.0, prof, time_limit=100000.0, flexible=False)
    runs = (running(1, 0, 8, 1000.0), running(2, 1, 6, 1e5), running(3, 2, 6, 1e5))
    policy = make_policy("backfill")
    for job, started in ((small, None), (replace(small, flexible=True), ((1, 2), (2, 2)))):
        pending = (PendingJob(head, head.duration), PendingJob(job, job.duration))
        state = ClusterState(10.0, topo, (0, 2, 2, 8), runs, pending)
        starts = policy.decide(state).starts
        assert [s.placement.alloc for s in starts] == ([] if started is None else [started])


def test_forms_survive_windows_and_the_bootstrap() -> None:
    jobs = with_flexible(synthetic.generate(300, seed=0), 1.0, seed=0)
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, min_jobs=5)
    kept = [j for w in windows for j in w.jobs]
    assert {j.job_id: j.flexible for j in kept} == {j.job_id: j.flexible for j in jobs}
    resampled = [j for w in windows for j in resample_window(w, seed=1, block_s=1800.0)]
    assert any(j.flexible for j in resampled)
    assert all(j.flexible == (j.num_gpus > 1) for j in resampled)


def test_evaluate_takes_a_flexible_share(tmp_path: Path) -> None:
    """``evaluate --flexible``: the report and MLflow params state the share and the rule, and
    backfill spreads flexible requests (run-time inflation) where fixed shapes never do."""
    trace = tmp_path / "jobs.csv"
    write_native(synthetic.generate(400, seed=0, load_scale=0.5), trace)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def run(share: float, log: bool) -> tuple[Any, str | None]:
        return evaluate([PolicySpec.parse("backfill")], trace=trace, cluster="4x8,leaf=2",
                        n_windows=2, seeds=[0], window_s=12 * 3600.0, block_s=0.0, min_jobs=20,
                        out_dir=tmp_path / f"r{share}", tracking_uri=uri, log=log, n_boot=50,
                        flexible=share)  # fmt: skip

    spread, run_id = run(1.0, log=True)
    fixed, _ = run(0.0, log=False)
    forms = spread.context["flexible"]
    assert forms["share"] == 1.0 and forms["rule"] == RULE
    assert 0 < forms["flexible_jobs"] == forms["multi_gpu_jobs"]
    assert fixed.context["flexible"]["flexible_jobs"] == 0
    assert (
        "flexible requests**: share 1 of the multi-GPU jobs"
        in Path(spread.files["report"]).read_text()
    )
    inflation = {r.context["flexible"]["share"]: r.summary[0]["avg_runtime_inflation"]
                 for r in (spread, fixed)}  # fmt: skip
    assert inflation[0.0] == pytest.approx(0.0, abs=1e-9) and inflation[1.0] > 0.001
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=uri).get_run(str(run_id)).data.params
    assert json.loads(params["flexible"])["flexible_jobs"] == forms["flexible_jobs"]
