"""The decision problem: mask, decoding, encoding, spec versioning, rewards, adapters."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkwise.cluster import mdp
from linkwise.cluster.contention import AnalyticModel, EmpiricalModel, PairwiseTable
from linkwise.cluster.domain import ClusterState, Decision, Job, Node, Placement, Start, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.placement.generators import (
    best_fit,
    first_fit,
    fragment_first_fit,
    least_busy,
    same_leaf,
)
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.heuristics import make_policy

CAL = Calibration(
    profiles={
        "light": CommProfile("light", compute_s=0.3, grad_gb=0.01),
        "heavy": CommProfile("heavy", compute_s=0.1, grad_gb=1.0),
        "mid": CommProfile("mid", compute_s=0.2, grad_gb=0.3),
    },
    alpha=0.3,
    overhead_s=0.001,
    mix={"light": 1.0, "heavy": 1.0, "mid": 1.0},
)
MODEL = AnalyticModel(CAL)
FLOWS_MODEL = AnalyticModel(CAL, sharing="flows")
ALL_GENS = mdp.MdpConfig(generators=mdp.GENERATORS)


def _job(*args: Any, **kwargs: Any) -> Job:
    """A job with run-time predictions (what the encoder reads instead of its duration)."""
    kwargs.setdefault("pred_s", 900.0)
    kwargs.setdefault("pred_hi_s", 3 * kwargs["pred_s"])
    return Job(*args, **kwargs)


def _mixed_topology() -> Topology:
    """Nodes of 4 and 8 GPUs, one with PCIe, under three leaves with thin uplinks."""
    sizes = [8, 8, 4, 8, 4, 8, 8, 4]
    nodes = tuple(
        Node(
            f"n{i}",
            g,
            leaf=i // 3,
            intra_gbps=12.0 if i == 4 else 150.0,
            nic_gbps=12.5,
            intra_kind="pcie" if i == 4 else "nvlink",
        )
        for i, g in enumerate(sizes)
    )
    return Topology(
        name="mixed",
        nodes=nodes,
        leaf_names=("l0", "l1", "l2"),
        leaf_agg=(0, 0, 0),
        leaf_uplink_gbps=(20.0, 20.0, 15.0),
    )


TOPOLOGIES = {
    "4x8": from_spec("4x8,leaf=2"),
    "6x8": from_spec("6x8,leaf=2,oversub=2"),
    "mixed": _mixed_topology(),
}

jobs_strategy = st.lists(
    st.tuples(
        st.floats(0, 3000),
        st.sampled_from([1, 1, 2, 3, 4, 6, 8, 12, 16]),
        st.floats(10, 5000),
        st.sampled_from(["light", "heavy", "mid"]),
    ),
    min_size=1,
    max_size=30,
)


def _jobs(raw: list[tuple[float, int, float, str]]) -> list[Job]:
    return [_job(i, t, g, d, profile=p) for i, (t, g, d, p) in enumerate(raw)]


def _run_to(
    topo_name: str, raw: list[tuple[float, int, float, str]], policy: str, steps: int
) -> Simulator:
    """A simulator driven by a heuristic for ``steps`` decision points, then stopped."""
    sim = Simulator(TOPOLOGIES[topo_name], _jobs(raw), MODEL)
    params = {"seed": 7} if policy == "random" else {}
    if steps:
        drive(sim, make_policy(policy, **params), max_steps=steps)
    return sim


def _generator_placements(state: ClusterState, gpus: int) -> list[Placement]:
    topo, free, busy = state.topology, state.free_gpus, state.jobs_per_node
    out = [
        best_fit(topo, free, gpus),
        same_leaf(topo, free, gpus),
        least_busy(topo, free, gpus, busy),
        first_fit(topo, free, gpus),
        fragment_first_fit(topo, free, gpus, busy),
    ]
    return [p for p in out if p is not None]


def _full_prediction(
    state: ClusterState, job: Job, placement: Placement, model: AnalyticModel
) -> tuple[float, float]:
    """Job slowdown and added slowdown from the model's full rate computation."""
    placed = [(r.job, r.placement) for r in state.running]
    old = model.rates(state.topology, placed) if placed else []
    new = model.rates(state.topology, [*placed, (job, placement)])
    added = sum(1 / n - 1 / o for n, o in zip(new[:-1], old, strict=True))
    return 1 / new[-1] - 1, added


@settings(max_examples=100, deadline=None)
@given(
    topo_name=st.sampled_from(sorted(TOPOLOGIES)),
    raw=jobs_strategy,
    policy=st.sampled_from(["fifo", "best_fit", "random", "sjf_bco"]),
    steps=st.integers(0, 25),
    slot_order=st.sampled_from(mdp.SLOT_ORDERS),
    mask_duplicates=st.booleans(),
)
def test_mask_is_exactly_the_feasible_candidates(
    topo_name: str,
    raw: list[tuple[float, int, float, str]],
    policy: str,
    steps: int,
    slot_order: str,
    mask_duplicates: bool,
) -> None:
    sim = _run_to(topo_name, raw, policy, steps)
    state = sim.observe()
    cfg = replace(ALL_GENS, k_slots=4, slot_order=slot_order, mask_duplicates=mask_duplicates)
    cands = mdp.candidates(state, cfg, MODEL)
    mask = mdp.action_mask(cands)
    n_c = cfg.n_candidates
    assert mask.shape == (cfg.n_actions,) and mask.dtype == np.bool_ and mask[-1]
    # every unmasked start is accepted by the simulator, exactly as decoded
    for a in np.flatnonzero(mask[:-1]):
        decision = mdp.decode(cands, int(a))
        (start,) = decision.starts
        assert start.job_id == cands.slots[a // n_c].job.job_id
        twin = copy.deepcopy(sim)
        twin.apply(decision)  # raises InvalidDecision if infeasible
        assert start.job_id in {r.job.job_id for r in twin.observe().running}
    # masked starts refuse to decode
    for a in np.flatnonzero(~mask):
        with pytest.raises(mdp.InvalidAction):
            mdp.decode(cands, int(a))
    # every generator's feasible placement is reachable by an unmasked action of its slot
    for k, pj in enumerate(cands.slots):
        reachable = {cands.placements[k][c] for c in range(n_c) if mask[k * n_c + c]}
        expected = set(_generator_placements(state, pj.job.num_gpus))
        lc = cands.placements[k][cfg.generators.index("least_contention")]
        assert expected | ({lc} if lc is not None else set()) == reachable
        assert (lc is None) == (not expected)
    # slots follow the configured order
    fit = [p for p in state.pending if p.job.num_gpus <= state.total_free_gpus]
    if slot_order == "head":
        assert cands.slots == state.pending[: cfg.k_slots]
    elif slot_order == "fitting":
        assert cands.slots == tuple(fit[: cfg.k_slots])
    elif slot_order == "smallest":  # the smallest fitting jobs, submit order among equal sizes
        assert cands.slots == tuple(sorted(fit, key=lambda p: p.job.num_gpus)[: cfg.k_slots])
    else:  # the heads of the four orders, round-robin, each its next job not yet taken
        assert cands.slots == _mixed_reference(fit, cfg.k_slots)


def _mixed_reference(fit: list[Any], k: int) -> tuple[Any, ...]:
    """``slot_order="mixed"`` written plainly: full sorts of the fitting jobs, one pointer each."""
    keys = (
        lambda p: 0,
        lambda p: p.job.num_gpus,
        lambda p: p.job.pred_s * p.job.num_gpus,
        lambda p: p.attained_gpu_s,
    )
    orders = [sorted(fit, key=key) for key in keys]  # stable: submit order among equals
    out: list[Any] = []
    while len(out) < min(k, len(fit)):
        for order in orders:
            nxt = next((p for p in order if p not in out), None)
            if nxt is not None and len(out) < k:
                out.append(nxt)
    return tuple(out)


@settings(max_examples=60, deadline=None)
@given(
    topo_name=st.sampled_from(sorted(TOPOLOGIES)),
    raw=jobs_strategy,
    steps=st.integers(0, 25),
    flows=st.booleans(),
)
def test_predictions_match_the_model_and_least_contention_is_least(
    topo_name: str, raw: list[tuple[float, int, float, str]], steps: int, flows: bool
) -> None:
    sim = _run_to(topo_name, raw, "random", steps)
    state = sim.observe()
    model = FLOWS_MODEL if flows else MODEL
    cands = mdp.candidates(state, ALL_GENS, model)
    lc_index = ALL_GENS.generators.index("least_contention")
    for k, pj in enumerate(cands.slots):
        for c, placement in enumerate(cands.placements[k]):
            pred = cands.predictions[k][c]
            if placement is None:
                assert pred is None
                continue
            assert pred is not None
            js, added = _full_prediction(state, pj.job, placement, model)
            assert pred.job_slowdown == pytest.approx(js, abs=1e-9)
            assert pred.added_slowdown == pytest.approx(max(0.0, added), abs=1e-9)
        lc = cands.predictions[k][lc_index]
        if lc is not None:
            score = lc.job_slowdown + lc.added_slowdown
            for other in cands.predictions[k]:
                if other is None:  # that generator has no placement (e.g. no single leaf fits)
                    continue
                assert score <= other.job_slowdown + other.added_slowdown + 1e-12


@settings(max_examples=25, deadline=None)
@given(
    topo_name=st.sampled_from(sorted(TOPOLOGIES)),
    raw=jobs_strategy,
    steps=st.integers(0, 25),
    time_of_day=st.booleans(),
)
def test_encode_is_deterministic_finite_and_sized(
    topo_name: str, raw: list[tuple[float, int, float, str]], steps: int, time_of_day: bool
) -> None:
    sim = _run_to(topo_name, raw, "best_fit", steps)
    state = sim.observe()
    spec = mdp.make_spec(mdp.MdpConfig(time_of_day=time_of_day))
    a = mdp.encode(mdp.candidates(state, spec.config, MODEL), spec)
    b = mdp.encode_state(state, spec, AnalyticModel(CAL))  # fresh memo tables
    assert a.dtype == np.float32 and a.shape == (spec.dim,)
    assert np.all(np.isfinite(a)) and a.min() >= -1.0
    assert a.tobytes() == b.tobytes()


def test_observation_has_the_size_of_the_spec_whatever_the_cluster() -> None:
    spec = mdp.make_spec()
    dims = set()
    for spec_str in ("2x4", "16x8,leaf=4", "40x8,leaf=8"):
        topo = from_spec(spec_str)
        jobs = [_job(i, 0.0, 1 + i % 4, 100.0, profile="heavy") for i in range(12)]
        sim = Simulator(topo, jobs, MODEL)
        dims.add(mdp.encode_state(sim.observe(), spec, MODEL).shape)
    assert dims == {(spec.dim,)}


def test_features_say_what_they_mean() -> None:
    topo = from_spec("4x8,leaf=2,oversub=2")  # thin leaf uplinks
    jobs = [
        _job(0, 0.0, 16, 1000.0, profile="heavy"),  # spans two nodes
        _job(1, 0.0, 12, 1000.0, profile="heavy"),
        _job(2, 0.0, 4, 500.0, profile="light"),
    ]
    sim = Simulator(topo, jobs, MODEL)
    sim.apply(Decision((Start(0, Placement.of([(0, 8), (2, 8)])),)))  # across both leaves
    state = sim.observe()
    spec = mdp.make_spec()
    cands = mdp.candidates(state, spec.config, MODEL)
    obs = dict(zip(spec.feature_names, mdp.encode(cands, spec).tolist(), strict=True))
    assert obs["g.utilisation"] == pytest.approx(0.5)
    assert obs["g.free_nodes_none"] == pytest.approx(0.5)
    assert obs["g.free_nodes_idle"] == pytest.approx(0.5)
    assert obs["s0.present"] == 1.0 and obs["s0.gpus"] == pytest.approx(12 / 8)
    assert obs["s2.present"] == 0.0
    assert obs["s1.gpus"] == pytest.approx(4 / 8)
    assert obs["s0.comm_intensity"] > obs["s1.comm_intensity"]  # heavy vs light
    # job 1 (12 GPUs) must span the two free nodes, one per leaf: it crosses the running ring's
    # leaf uplinks and slows it down; a 4-GPU job on one node never does
    assert obs["s0.best_fit.feasible"] == 1.0
    assert obs["s0.best_fit.nodes"] == pytest.approx(2 / 8)
    assert obs["s0.best_fit.leaves"] == pytest.approx(2 / 4)
    assert obs["s0.best_fit.added_slowdown"] > 0.0
    assert obs["s1.best_fit.added_slowdown"] == 0.0
    assert obs["s1.best_fit.job_slowdown"] == 0.0
    assert obs["s1.best_fit.partial_nodes_after"] == pytest.approx(1 / 4)
    assert obs["s1.best_fit.fragmented_free_after"] == pytest.approx(4 / 12)
    # duplicates are flagged and masked: for a single-node job most generators agree
    assert obs["s1.same_leaf.redundant"] == 1.0
    assert not cands.mask[1 * spec.config.n_candidates + 2]
    # run times only as predicted, log-scaled: 900 s median, 2700 s upper, no time limit
    unit, cap = spec.config.time_scale_s, spec.config.max_time_s
    scaled = math.log1p(900.0 / unit) / math.log1p(cap / unit)
    assert obs["s0.pred_remaining"] == pytest.approx(scaled)
    assert obs["s0.pred_remaining_hi"] > obs["s0.pred_remaining"]
    assert obs["s0.time_limit"] == 0.0 and obs["s0.has_time_limit"] == 0.0
    assert 0.0 < obs["s0.pred_gpu_time"] < 1.0
    # the running 16-GPU job is predicted to end within the hour: half the GPUs free soon
    assert obs["g.gpus_free_soon"] == pytest.approx(0.5)
    assert obs["g.running_pred_remaining"] == pytest.approx(scaled)


def test_encoder_refuses_jobs_without_predictions() -> None:
    topo = from_spec("2x8")
    sim = Simulator(topo, [Job(0, 0.0, 4, 100.0, profile="heavy")], MODEL)
    spec = mdp.make_spec()
    cands = mdp.candidates(sim.observe(), spec.config, MODEL)
    assert cands.mask[0]  # the mask needs no prediction
    with pytest.raises(ValueError, match="run-time predictor"):
        mdp.encode(cands, spec)


def test_time_features_are_log_scaled_and_clipped() -> None:
    topo = from_spec("2x8")
    spec = mdp.make_spec()
    huge = _job(0, 0.0, 16, 1e9, profile="heavy", pred_s=1e9, pred_hi_s=1e9, time_limit=1e9)
    sim = Simulator(topo, [huge], MODEL)
    obs = dict(zip(spec.feature_names, mdp.encode_state(sim.observe(), spec, MODEL), strict=True))
    for name in ("pred_remaining", "pred_remaining_hi", "pred_gpu_time", "time_limit"):
        assert obs[f"s0.{name}"] == pytest.approx(1.0)


def test_spec_version_tracks_features_config_and_revision() -> None:
    base = mdp.make_spec()
    assert base == mdp.make_spec(mdp.MdpConfig())
    versions = {
        base.version,
        mdp.make_spec(mdp.MdpConfig(k_slots=4)).version,
        mdp.make_spec(mdp.MdpConfig(generators=("best_fit", "first_fit"))).version,
        mdp.make_spec(mdp.MdpConfig(time_of_day=True)).version,
        mdp.make_spec(mdp.MdpConfig(time_scale_s=60.0)).version,
        mdp.make_spec(mdp.MdpConfig(mask_duplicates=False)).version,
        replace(base, feature_names=(*base.feature_names[:-1], "s7.x.renamed")).version,
        replace(base, revision=base.revision + 1).version,
    }
    assert len(versions) == 8
    # round trip, and a spec from another encoder is refused
    data = base.to_json()
    assert mdp.ObsSpec.from_json(data) == base
    assert data["dim"] == base.dim and data["n_actions"] == 8 * 5 + 1
    stale = dict(data, feature_names=[*data["feature_names"][:-1], "other"])
    with pytest.raises(ValueError, match="does not match"):
        mdp.ObsSpec.from_json(stale)
    with pytest.raises(ValueError, match="does not match"):
        mdp.ObsSpec.from_json(dict(data, version="obs-0000"))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="unknown generators"):
        mdp.MdpConfig(generators=("best_fit", "nope"))
    with pytest.raises(ValueError, match="slot_order"):
        mdp.MdpConfig(slot_order="random")
    with pytest.raises(ValueError, match="positive"):
        mdp.MdpConfig(time_scale_s=0.0)
    with pytest.raises(ValueError, match="k_slots"):
        mdp.MdpConfig(k_slots=0)
    cfg = mdp.MdpConfig(k_slots=3, generators=("first_fit",))
    assert (cfg.n_actions, cfg.wait_action) == (4, 3)
    assert mdp.MdpConfig.from_json(cfg.to_json()) == cfg


def test_step_reward_and_contention_term() -> None:
    cfg = mdp.MdpConfig(time_scale_s=100.0, contention_weight=2.0)
    assert mdp.step_reward(10.0, 10.0, 5, 0.0, cfg) == 0.0
    assert mdp.step_reward(10.0, 30.0, 5, 0.0, cfg) == pytest.approx(-1.0)
    assert mdp.step_reward(10.0, 30.0, 5, 0.25, cfg) == pytest.approx(-1.5)
    topo = from_spec("2x8")
    sim = Simulator(topo, [_job(0, 0.0, 8, 100.0, profile="heavy")], MODEL)
    assert mdp.jobs_in_system(sim.observe()) == 1
    sim.apply(Decision((Start(0, Placement.of([(0, 4), (1, 4)])),)))
    state = sim.observe()
    rate = state.running[0].rate
    assert rate < 1.0
    assert mdp.contention_term(state, 50.0, cfg) == pytest.approx((1 - rate) * 50.0 / 100.0)


def test_apply_start_matches_the_simulator() -> None:
    topo = from_spec("4x8,leaf=2")
    jobs = [_job(i, 0.0, g, 500.0, profile="heavy") for i, g in enumerate([12, 4, 8])]
    sim = Simulator(topo, jobs, MODEL)
    state = sim.observe()
    start = Start(0, Placement.of([(1, 8), (2, 4)]))
    mine = mdp.apply_start(state, start, MODEL)
    sim.apply(Decision((start,)))
    theirs = sim.observe()
    assert mine.free_gpus == theirs.free_gpus
    assert mine.pending == theirs.pending
    assert mine.link_flows == theirs.link_flows
    assert [r.placement for r in mine.running] == [r.placement for r in theirs.running]
    spec = mdp.make_spec()
    assert mdp.encode_state(mine, spec, MODEL).tobytes() == (
        mdp.encode_state(theirs, spec, MODEL).tobytes()
    )
    with pytest.raises(ValueError, match="not free"):
        mdp.apply_start(mine, Start(1, Placement.of([(1, 4)])), MODEL)


def _small_workload(n: int = 40, seed: int = 0) -> list[Job]:
    rng = np.random.default_rng(seed)
    return [
        _job(
            i,
            float(rng.uniform(0, 4000)),
            int(rng.choice([1, 2, 4, 8, 12, 16])),
            float(rng.uniform(100, 3000)),
            profile=str(rng.choice(["light", "heavy", "mid"])),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("heuristic", "slot_order", "k_slots"),
    [("best_fit", "fitting", 8), ("best_fit", "head", 64), ("fifo", "head", 8)],
)
def test_step_adapter_reproduces_a_heuristic_exactly(
    heuristic: str, slot_order: str, k_slots: int
) -> None:
    topo = from_spec("6x8,leaf=3")
    jobs = _small_workload()
    reference = simulate(topo, jobs, MODEL, make_policy(heuristic))
    spec = mdp.make_spec(mdp.MdpConfig(k_slots=k_slots, slot_order=slot_order))
    adapter = mdp.StepPolicyAdapter(make_policy(heuristic))
    sim = Simulator(topo, jobs, MODEL)
    while not sim.done:
        cands = mdp.candidates(sim.observe(), spec.config, MODEL)
        decision = mdp.decode(cands, adapter.act(cands))
        if decision.is_wait:
            sim.advance()
        else:
            sim.apply(decision)
    assert adapter.match_rate == 1.0
    assert sum(m.kind == "exact" for m in adapter.matches) == len(jobs)
    ref = {r.job.job_id: (r.first_start, r.end) for r in reference.records}
    got = {r.job.job_id: (r.first_start, r.end) for r in sim.records}
    assert got == ref


def test_mdp_policy_runs_a_function_as_a_policy() -> None:
    topo = from_spec("4x8,leaf=2")
    jobs = _small_workload(30, seed=3)
    spec = mdp.make_spec()
    seen: list[tuple[int, int]] = []

    def first_allowed_start(obs: mdp.FloatArray, mask: mdp.BoolArray) -> int:
        seen.append((obs.shape[0], mask.shape[0]))
        return int(np.flatnonzero(mask)[0])  # a start if any is allowed, else wait

    policy = mdp.MdpPolicy(first_allowed_start, spec, MODEL)
    result = simulate(topo, jobs, MODEL, policy)
    assert len(result.records) == len(jobs)
    assert set(seen) == {(spec.dim, spec.n_actions)}

    def masked(obs: mdp.FloatArray, mask: mdp.BoolArray) -> int:
        return int(np.flatnonzero(~mask)[0])

    sim = Simulator(topo, jobs, MODEL)
    with pytest.raises(mdp.InvalidAction):
        mdp.MdpPolicy(masked, spec, MODEL).decide(sim.observe())


def test_decision_steps_follow_a_real_decision() -> None:
    topo = from_spec("4x8,leaf=2")
    jobs = [_job(i, 0.0, g, 500.0, profile="mid") for i, g in enumerate([8, 4, 4, 2])]
    state = Simulator(topo, jobs, MODEL).observe()
    spec = mdp.make_spec()
    odd = Start(2, Placement.of([(3, 2), (1, 2)]))  # no generator splits a 4-GPU job
    decision = Decision((Start(0, Placement.of([(0, 8)])), odd))
    steps = mdp.decision_steps(state, decision, spec, MODEL)
    assert [m.kind for _, m in steps] == ["exact", "nearest", "wait"]
    assert steps[1][1].overlap == pytest.approx(0.5)
    assert steps[0][1].action == 0  # slot 0, best fit
    assert steps[-1][1].action == spec.config.wait_action
    final = steps[-1][0].state
    assert final.free_gpus == (0, 6, 8, 6)
    assert math.isclose(sum(final.free_gpus), 20)


def test_other_contention_models_are_asked_for_all_rates() -> None:
    types = [(m, g, n) for m in ("light", "heavy") for g, n in ((4, 1), (8, 1), (16, 2))]
    iso = {t: (2.0 if t[0] == "light" else 1.0) / (1 + 0.2 * (t[2] - 1)) for t in types}
    table = PairwiseTable(
        isolated=iso,
        ratio={(a, b): 0.9 if "light" in (a[0], b[0]) else 0.6 for a in types for b in types},
    )
    model = EmpiricalModel(table)
    topo = from_spec("4x8,leaf=2")
    jobs = [
        _job(i, 0.0, g, 500.0, profile=p)
        for i, (g, p) in enumerate([(16, "heavy"), (4, "light"), (12, "heavy"), (8, "light")])
    ]
    sim = Simulator(topo, jobs, model)
    sim.apply(Decision((Start(0, Placement.of([(0, 4), (1, 4), (2, 8)])),)))
    state = sim.observe()
    spec = mdp.make_spec()
    cands = mdp.candidates(state, spec.config, model)
    for k, pj in enumerate(cands.slots):
        for placement, pred in zip(cands.placements[k], cands.predictions[k], strict=True):
            if placement is None:
                continue
            assert pred is not None
            placed = [(r.job, r.placement) for r in state.running]
            old = model.rates(topo, placed)
            new = model.rates(topo, [*placed, (pj.job, placement)])
            assert pred.job_slowdown == pytest.approx(1 / new[-1] - 1)
            added = sum(1 / n - 1 / o for n, o in zip(new[:-1], old, strict=True))
            assert pred.added_slowdown == pytest.approx(max(0.0, added))
    obs = mdp.encode(cands, spec)
    assert np.all(np.isfinite(obs))
    named = dict(zip(spec.feature_names, obs.tolist(), strict=True))
    assert named["s0.comm_intensity"] == 0.0  # no profiles in an empirical model
