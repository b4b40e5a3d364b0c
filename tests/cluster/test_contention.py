"""Invariants of the contention models, on the shipped (fitted) calibration and a toy one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from linkwise.cluster.calibration.measurements import load_deepshare, table_types
from linkwise.cluster.contention import (
    AnalyticModel,
    EmpiricalModel,
    min_nodes,
    ring_iteration_time,
    sharing_penalty,
)
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile, load_calibration
from linkwise.cluster.topology.spec import from_spec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
SHIPPED = load_calibration()
TOY = Calibration(
    profiles={
        "light": CommProfile("light", compute_s=0.3, grad_gb=0.01),
        "heavy": CommProfile("heavy", compute_s=0.1, grad_gb=1.0),
        "silent": CommProfile("silent", compute_s=0.2, grad_gb=0.0),
    },
    alpha=0.5,
    overhead_s=0.002,
    mix={"light": 1.0, "heavy": 1.0},
)
MODELS = [
    AnalyticModel(SHIPPED),
    AnalyticModel(replace(SHIPPED, alpha=float(SHIPPED.fit["alpha_flows"])), sharing="flows"),
    AnalyticModel(TOY),
    AnalyticModel(TOY, sharing="flows"),
]
MODEL_IDS = ["shipped-duty", "shipped-flows", "toy-duty", "toy-flows"]
TOPOLOGIES = [
    from_spec("6x4,leaf=3,oversub=2"),  # two leaves, oversubscribed uplinks
    from_spec("4x8,pcie,nic=5,leaf=4"),  # DeepShare's testbed
    from_spec("4x8,pcie,nic=25"),  # a NIC faster than PCIe
]


def _job(i: int, profile: str, gpus: int) -> Job:
    return Job(job_id=i, submit_time=0.0, num_gpus=gpus, duration=100.0, profile=profile)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[AnalyticModel, Topology, list[tuple[Job, Placement]]]:
    """A model, a topology and jobs placed on it within its GPU capacity."""
    k = draw(st.integers(0, len(MODELS) - 1))
    model = MODELS[k]
    topo = draw(st.sampled_from(TOPOLOGIES))
    free = [n.gpus for n in topo.nodes]
    names = sorted(model.calibration.profiles)
    placed: list[tuple[Job, Placement]] = []
    for i in range(draw(st.integers(1, 5))):
        nodes = draw(st.lists(st.integers(0, len(free) - 1), min_size=1, max_size=4, unique=True))
        alloc = [(n, draw(st.integers(1, 3))) for n in nodes]
        if any(g > free[n] for n, g in alloc):
            continue
        for n, g in alloc:
            free[n] -= g
        p = Placement.of(alloc)
        placed.append((_job(i, draw(st.sampled_from(names)), p.num_gpus), p))
    if not placed:
        placed.append((_job(99, names[0], 1), Placement.of([(0, 1)])))
    return model, topo, placed


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_rates_are_in_zero_one(
    scenario: tuple[AnalyticModel, Topology, list[tuple[Job, Placement]]],
) -> None:
    model, topo, placed = scenario
    for rate in model.rates(topo, placed):
        assert 0.0 < rate <= 1.0


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.data())
def test_adding_a_split_neighbour_never_increases_a_rate(
    scenario: tuple[AnalyticModel, Topology, list[tuple[Job, Placement]]], data: st.DataObject
) -> None:
    model, topo, placed = scenario
    before = model.rates(topo, placed)
    # the newcomer shares at least one node (hence that node's NIC) with the first job
    first = placed[0][1].nodes[0]
    other = data.draw(st.integers(0, len(topo.nodes) - 1).filter(lambda n: n != first))
    newcomer = (
        _job(100, data.draw(st.sampled_from(sorted(model.calibration.profiles))), 2),
        Placement.of([(first, 1), (other, 1)]),
    )
    after = model.rates(topo, [*placed, newcomer])[:-1]
    for b, a in zip(before, after, strict=True):
        assert a <= b + 1e-12


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_single_node_jobs_are_unaffected_by_others(
    scenario: tuple[AnalyticModel, Topology, list[tuple[Job, Placement]]],
) -> None:
    model, topo, placed = scenario
    # a case is only a check with a single-node job beside a split one
    assume(any(p.num_nodes == 1 for _, p in placed) and any(p.num_nodes > 1 for _, p in placed))
    together = model.rates(topo, placed)
    for (job, p), rate in zip(placed, together, strict=True):
        if p.num_nodes == 1:
            assert rate == pytest.approx(model.rates(topo, [(job, p)])[0], rel=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("topo", TOPOLOGIES, ids=["2leaf", "deepshare", "fastnic"])
def test_a_job_alone_on_its_best_placement_runs_at_rate_one(
    model: AnalyticModel, topo: Topology
) -> None:
    per_node = topo.max_gpus_per_node
    for profile in model.calibration.profiles:
        for gpus in (1, 2, per_node, 2 * per_node):
            n = min_nodes(topo, gpus)
            p = Placement.of([(i, min(per_node, gpus - i * per_node)) for i in range(n)])
            assert model.rates(topo, [(_job(0, profile, gpus), p)])[0] == pytest.approx(1.0)


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("topo", TOPOLOGIES, ids=["2leaf", "deepshare", "fastnic"])
def test_spreading_a_job_over_more_nodes_never_helps(model: AnalyticModel, topo: Topology) -> None:
    for profile in model.calibration.profiles:
        for gpus in (2, 4):
            times, rates = [], []
            for n in (1, 2, 4):  # same GPUs, over more and more nodes (a leaf apart on "2leaf")
                if gpus % n or n > len(topo.nodes):
                    continue
                step = 1 if n < 4 else len(topo.nodes) // 4
                placed = [
                    (
                        _job(0, profile, gpus),
                        Placement.of([(i * step, gpus // n) for i in range(n)]),
                    )
                ]
                times.append(model.iteration_times(topo, placed)[0])
                rates.append(model.rates(topo, placed)[0])
            assert times == sorted(times), (profile, gpus, times)
            assert rates == sorted(rates, reverse=True), (profile, gpus, rates)


def test_sharing_penalty_is_sjf_bco_f() -> None:
    assert sharing_penalty(1, 0.3) == 1.0
    assert sharing_penalty(0.5, 0.3) == 1.0
    assert sharing_penalty(2, 0.3) == pytest.approx(2.3)
    assert sharing_penalty(3, 0.3) == pytest.approx(3.6)
    assert sharing_penalty(1.5, 0.3) == pytest.approx(1.65)


def test_flow_count_follows_sjf_bco_arithmetic() -> None:
    topo = from_spec("4x8,nic=10")
    model = AnalyticModel(TOY, sharing="flows")
    p = Placement.of([(0, 4), (1, 4)])
    a, b = _job(0, "heavy", 8), _job(1, "light", 8)
    t = model.iteration_times(topo, [(a, p), (b, p)])[0]
    comm = (1.0 / 8) * 2 * 7 / (10 / 2.5)  # k = 2 rings: f = 2 + 0.5
    assert t == pytest.approx(0.1 + comm + 0.002 * 2)


def test_duty_sharing_weights_a_neighbour_by_its_duty_cycle() -> None:
    topo = from_spec("4x8,nic=10")
    model = AnalyticModel(TOY)
    p = Placement.of([(0, 4), (1, 4)])
    heavy, silent = _job(0, "heavy", 8), _job(1, "silent", 8)
    alone = model.iteration_times(topo, [(heavy, p)])[0]
    # a neighbour that never communicates costs nothing, whatever flow-counting says
    assert model.iteration_times(topo, [(heavy, p), (silent, p)])[0] == pytest.approx(alone)
    other = _job(1, "heavy", 8)
    u = model.duty_cycle(topo, other, p)
    comm = (1.0 / 8) * 2 * 7 / 10
    assert u == pytest.approx(comm / ring_iteration_time(TOY.profiles["heavy"], 8, 2, 10, 0.002))
    shared = model.iteration_times(topo, [(heavy, p), (other, p)])[0]
    assert shared == pytest.approx(alone + comm * (1 + 1.5 * u - 1))


def test_unknown_sharing_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown sharing"):
        AnalyticModel(TOY, sharing="max-min")


def test_empirical_model_reproduces_measured_pair_ratios_exactly() -> None:
    table = load_deepshare(DATA)
    model = EmpiricalModel(table)
    topo = from_spec("4x8,pcie,nic=5,leaf=4")
    types = [t for t in table_types(table) if t[2] <= 4]
    for i, a in enumerate(types):
        for b in types[i % 5 :: 5]:  # a fifth of the pairs, both orders over the loop
            pa = Placement.of([(n, a[1] // a[2]) for n in range(a[2])])
            pb = Placement.of([(n, b[1] // b[2]) for n in range(b[2])])
            ja, jb = _job(0, a[0], a[1]), _job(1, b[0], b[1])
            shared = model.rates(topo, [(ja, pa), (jb, pb)])[0]
            alone = model.rates(topo, [(ja, pa)])[0]
            assert shared / alone == pytest.approx(table.ratio[(a, b)], rel=1e-12)
