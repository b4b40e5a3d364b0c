"""Parallel layouts (``cluster.layout``): stages in Megatron's rank order, their DP rings and
pipeline transfers on the links they cross, the rates of jobs without layouts unchanged bit for
bit, and ``SplitRates`` and the simulator's incremental path exact with layout jobs."""

from __future__ import annotations

import random

import pytest

from linkwise.cluster.contention import AnalyticModel, SplitRates
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.layout import peer_pairs, stage_leaves, stages
from linkwise.cluster.profiles import Calibration, CommProfile, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.heuristics import make_policy

CAL = Calibration(
    profiles={"llm": CommProfile("llm", compute_s=0.1, grad_gb=1.0, act_gb=0.01)},
    alpha=0.4,
    overhead_s=0.0,
    mix={"llm": 1.0},
)
TOPO = from_spec("8x8,leaf=4,oversub=4")  # leaves {0..3} and {4..7}, uplinks of one NIC


def _whole(*nodes: int) -> Placement:
    return Placement.of([(n, 8) for n in nodes])


def _uplinks(topo: Topology, links: tuple[int, ...]) -> set[int]:
    return {link for link in links if link >= len(topo.nodes)}


def test_stages_follow_megatron_rank_order() -> None:
    p = Placement.of([(0, 8), (1, 8), (4, 8), (5, 8)])
    assert stages(p, 2) == (((0, 8), (1, 8)), ((4, 8), (5, 8)))
    assert stages(Placement.of([(0, 6), (1, 6)]), 3) == (((0, 4),), ((0, 2), (1, 2)), ((1, 4),))
    # rank j of a stage talks to rank j of the next
    assert peer_pairs(((0, 8), (1, 8)), ((4, 8), (5, 8))) == ((0, 4, 8), (1, 5, 8))
    assert peer_pairs(((0, 2), (1, 2)), ((1, 4),)) == ((0, 1, 2), (1, 1, 2))
    assert stage_leaves(TOPO, _whole(1, 2, 3, 4), 2) == (1, 2)


def test_a_dp_group_inside_one_leaf_uses_no_uplink_split_over_two_it_does() -> None:
    model = AnalyticModel(CAL)
    job = Job(1, 0.0, 32, 100.0, profile="llm", pp=2)
    aligned = model._layout(TOPO, job, _whole(2, 3, 4, 5))  # stages {2,3} and {4,5}
    assert all(not _uplinks(TOPO, t.links) for t in aligned.dp)
    assert all(_uplinks(TOPO, t.links) for t in aligned.p2p)  # the pipeline crosses
    split = model._layout(TOPO, job, _whole(1, 2, 3, 4))  # stage {3,4} over two leaves
    assert not _uplinks(TOPO, split.dp[0].links) and _uplinks(TOPO, split.dp[1].links)
    # beside a ring over both leaves' uplinks, only the split DP group is slowed
    other = (Job(2, 0.0, 16, 100.0, profile="llm"), _whole(0, 7))
    fast, _ = model.rates(TOPO, [(job, _whole(2, 3, 4, 5)), other])
    slow, _ = model.rates(TOPO, [(job, _whole(1, 2, 3, 4)), other])
    assert slow < 0.9 < 0.95 < fast  # its pipeline hop alone crosses the uplinks
    # without a layout the same job is one ring over both leaves either way
    flat = Job(1, 0.0, 32, 100.0, profile="llm")
    assert model.rates(TOPO, [(flat, _whole(2, 3, 4, 5)), other])[0] < 0.9


def test_pipeline_traffic_is_the_profiles_activation_volume() -> None:
    job = Job(1, 0.0, 32, 100.0, profile="llm", pp=2)
    quiet = Calibration({"llm": CommProfile("llm", 0.1, 1.0)}, 0.4, 0.0, {"llm": 1.0})
    with_act = AnalyticModel(CAL).iteration_times(TOPO, [(job, _whole(2, 3, 4, 5))])[0]
    without = AnalyticModel(quiet).iteration_times(TOPO, [(job, _whole(2, 3, 4, 5))])[0]
    assert with_act == pytest.approx(without + 0.01 * 8 / 12.5)  # 8 GPU pairs over a NIC


# rates of jobs without layouts on main before layouts existed (repr of each float)
SHIPPED_RATES = {
    ("8x8,leaf=4,oversub=2", "duty"):
        [0.8427971890543121, 0.8751091819056667, 0.8427971890543121, 1.0],
    ("8x8,leaf=4,oversub=2", "flows"):
        [0.4636018132682255, 0.5984443933170288, 0.8159129382277686, 1.0],
    ("8x8,leaf=4,oversub=2,ecmp=1", "duty"):
        [0.5367490562956598, 0.5367490562956597, 0.8427971890543121, 1.0],
    ("8x8,leaf=4,oversub=2,ecmp=1", "flows"):
        [0.4636018132682255, 0.48924441923243095, 0.8159129382277686, 1.0],
}  # fmt: skip


@pytest.mark.parametrize(("spec", "mode"), sorted(SHIPPED_RATES))
@pytest.mark.parametrize("pp", [0, 1])
def test_jobs_without_layouts_keep_their_rates_bit_for_bit(spec: str, mode: str, pp: int) -> None:
    placed = [
        (Job(0, 0.0, 32, 100.0, "MoE", pp=pp), _whole(1, 2, 3, 4)),
        (Job(1, 0.0, 16, 100.0, "FSDP"), Placement.of([(3, 0), (5, 8), (0, 8)])),
        (Job(2, 0.0, 12, 100.0, "bert"), Placement.of([(6, 4), (7, 4), (2, 4)])),
        (Job(3, 0.0, 4, 100.0, "cifar10"), Placement.of([(6, 4)])),
    ]
    model = AnalyticModel(load_calibration(), sharing=mode)
    assert model.rates(from_spec(spec), placed) == SHIPPED_RATES[(spec, mode)]


def _random_member(rnd: random.Random, topo: Topology) -> tuple[Job, Placement]:
    gpus = rnd.choice((2, 4, 8, 16, 32))
    nodes = sorted(rnd.sample(range(len(topo.nodes)), rnd.choice((2, 3, 4))))
    alloc = [[n, 0] for n in nodes]
    for i in range(gpus):
        alloc[i % len(alloc)][1] += 1
    pp = rnd.choice([p for p in (0, 2, 4) if p == 0 or gpus % p == 0])
    return Job(rnd.randrange(10**6), 0.0, gpus, 100.0, "llm", pp=pp), Placement.of(
        [(n, g) for n, g in alloc]
    )


@pytest.mark.parametrize("mode", ["duty", "flows"])
@pytest.mark.parametrize("spec", ["8x8,leaf=4,oversub=2", "8x8,leaf=2,oversub=2,ecmp=1"])
def test_split_rates_with_layouts_equal_the_models(mode: str, spec: str) -> None:
    topo, model = from_spec(spec), AnalyticModel(CAL, sharing=mode)
    rnd = random.Random(5)
    rates: SplitRates[int] = SplitRates(model, topo)
    members: dict[int, tuple[int, Job, Placement]] = {}
    known: dict[int, float] = {}
    for serial in range(200):
        if members and rnd.random() < 0.4:
            payload = rnd.choice(list(members))
            rates.remove(members.pop(payload)[0])
            known.pop(payload)
        else:
            job, placement = _random_member(rnd, topo)
            mid = rates.add(serial, job, placement)
            assert mid is not None
            members[serial] = (mid, job, placement)
        known.update(rates.changed())
        placed = [(job, placement) for _, job, placement in members.values()]
        assert [known[p] for p in members] == model.rates(topo, placed)
        assert model._iteration_times_reference(topo, placed) == model.iteration_times(topo, placed)


def _run(sim: Simulator, name: str) -> Simulator:
    policy = make_policy(name)
    while True:
        sim.apply(policy.decide(sim.observe()))
        if not sim.advance():
            return sim


def test_simulations_with_layouts_equal_the_full_path() -> None:
    topo = from_spec("16x8,leaf=4,oversub=2,ecmp=1")
    rnd = random.Random(3)
    jobs = []
    for i in range(60):
        g, d = rnd.choice((1, 8, 16, 32, 64)), rnd.uniform(500.0, 5000.0)
        pp = 4 if g >= 32 else 0
        jobs.append(Job(i, i * 200.0, g, d, "llm", pred_s=d, pred_hi_s=2 * d, pp=pp))
    model = AnalyticModel(CAL)
    for name in ("sjf_bco", "qssf_group_aware"):
        fast = _run(Simulator(topo, jobs, model, SimConfig()), name)
        full = _run(Simulator(topo, jobs, model, SimConfig(), incremental=False), name)
        assert fast._split_rates is not None and fast.records == full.records
        assert any(r.job.pp > 1 and r.nodes > 1 for r in fast.records)
