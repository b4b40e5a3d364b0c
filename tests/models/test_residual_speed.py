"""The residual's fast decision path (issue 23 item 4) decides and counts exactly as the
plain one: on a seeded, queueing workload every decision point is decided by two residuals
of the same base, values and deferral, one through ``ResidualPolicy.decide`` (no candidates
where nothing fits, no encoding where it defers or nothing is eligible, the base copied only
when deviating) and one through ``decide_plain`` (candidates, encoding and the topology's
signature everywhere), fed the same states; their decisions, counters and advantages must be
equal. Not a timed test (timings: ``benchmarks/learned_speed.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Decision
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models.learned import masked_argmax
from linkwise.models.residual import Deferral, ResidualPolicy, topology_signature
from linkwise.policies.heuristics import make_policy
from linkwise.tests._states import Both, decision_states

TOPO = from_spec("4x8,leaf=2")
MODEL = AnalyticModel(load_calibration(None))
PREDICTOR = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=32))


def _jobs(n: int = 120, seed: int = 5) -> tuple[Any, ...]:
    drawn = synthetic.generate(n, seed=seed, max_gpus=32, load_scale=6.0)
    return PREDICTOR.annotate(assign_profiles(drawn, load_calibration(None), seed=seed))


def _varied(n_actions: int) -> Any:
    """Values that depend on the state: a different preference at every decision point."""

    def values(obs: Any) -> Any:
        x = float(np.asarray(obs).sum())
        return np.sin(np.arange(n_actions, dtype=np.float32) * (1.0 + x))[None, :]

    return values


def _pair(base: str, cfg: MdpConfig, margin: float, deferral: Deferral) -> list[ResidualPolicy]:
    spec = make_spec(cfg)
    return [
        ResidualPolicy(
            base=make_policy(base),
            values=_varied(spec.n_actions),
            obs_spec=spec,
            belief=MODEL,
            margin=margin,
            deferral=deferral,
            base_spec=base,
            predictor=PREDICTOR,
        )
        for _ in range(2)
    ]


def _run(both: Both) -> None:
    simulate(TOPO, _jobs(), MODEL, both, SimConfig())
    mismatched = [i for i, (a, b) in enumerate(both.pairs) if a != b]
    assert not mismatched, f"{len(mismatched)} decision points differ, first {mismatched[0]}"
    assert both.fast.stats() == both.plain.stats()
    assert both.fast.advantages == both.plain.advantages


CFG = MdpConfig(
    k_slots=4, slot_order="mixed", generators=("bounded", "least_contention", "best_fit")
)


@pytest.mark.parametrize("base", ["qssf_preemptive", "tiresias_las", "sjf_bco"])
@pytest.mark.parametrize("running_slots", [0, 2])
def test_fast_decisions_equal_the_plain_path_when_scoring(base: str, running_slots: int) -> None:
    cfg = replace(CFG, running_slots=running_slots)
    fast, plain = _pair(base, cfg, 0.3, Deferral(topologies=(topology_signature(TOPO),)))
    both = Both(fast, plain)
    _run(both)
    assert len(both.pairs) > 100
    assert fast.deviations > 10  # the model really deviates (the base finishes on a copy)
    assert fast.decisions > fast.deviations
    if not running_slots:
        assert both.skipped > 0  # the shortcut (nothing fits: no candidates) was taken


@pytest.mark.parametrize("reason", ["topology", "range", "support"])
def test_fast_decisions_and_deferrals_equal_the_plain_path_when_deferring(reason: str) -> None:
    spec = make_spec(CFG)
    n = spec.n_actions
    deferral = {
        "topology": Deferral(topologies=("0000000000000000",)),
        # a narrow range: some states inside it (scored), others outside (deferred)
        "range": Deferral(feature_lo=(0.0,) * spec.dim, feature_hi=(0.6,) * spec.dim),
        # the first slot's rows and wait unsupported: fewer alternatives, some points none
        "support": Deferral(support=(0,) * 3 + (5,) * (n - 4) + (0,), min_support=1),
    }[reason]
    fast, plain = _pair("sjf_bco", CFG, 0.3, deferral)
    _run(Both(fast, plain))
    assert fast.deferrals[reason] > 0
    if reason == "topology":
        assert fast.deviations == 0 and fast.deferrals["topology"] == fast.decisions


CONFIGS = {
    "mixed": CFG,
    "running": replace(CFG, running_slots=2),
    "head": replace(CFG, slot_order="head"),
    "no-total-generator": replace(CFG, generators=("bounded", "same_leaf")),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("margin", [0.3, float("inf")])
def test_the_base_standing_counts_as_the_plain_path_without_candidates(
    config: str, margin: float
) -> None:
    """Deferring by topology, or margin inf: the counters come from ``more_than_wait``
    (exact for every config with a total generator, candidates otherwise)."""
    cfg = CONFIGS[config]
    foreign = Deferral(topologies=("0000000000000000",))
    fast, plain = _pair("tiresias_las", cfg, margin, foreign)
    _run(Both(fast, plain))
    assert fast.decisions > 0


def test_margin_infinity_counts_as_the_plain_path_without_scoring() -> None:
    fast, plain = _pair("qssf_preemptive", CFG, float("inf"), Deferral())
    calls = [0]
    inner = fast.values

    def counted(obs: Any) -> Any:
        calls[0] += 1
        return inner(obs)

    fast.values = counted
    _run(Both(fast, plain))
    assert fast.decisions > 0 and calls[0] == 0


def test_masked_argmax_of_one_row_equals_the_batched_rule() -> None:
    rng = np.random.default_rng(0)
    specials = np.array([0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 0.5])
    for t in range(3000):
        n = int(rng.integers(1, 30))
        values = rng.choice(specials, size=n) if t % 2 else rng.normal(size=n).astype(np.float32)
        mask = rng.random(n) < rng.random()
        one = masked_argmax(values, mask)
        batched = masked_argmax(values[None, :], mask[None, :])[0]
        assert one.dtype == np.int64 and one.shape == ()
        assert int(one) == int(batched)


def test_a_start_the_base_then_preempts_or_migrates_is_merged_into_one_valid_decision() -> None:
    from linkwise.cluster.domain import Placement, Start
    from linkwise.models.residual import merge_moves

    p, q, r = Placement(((0, 2),)), Placement(((1, 2),)), Placement(((2, 4),))
    move = Decision(starts=(Start(7, p),))
    # found by the tiresias_las case above: the base preempted the job the model had started
    undone = merge_moves(move, Decision(preempt=(7, 3), starts=(Start(9, r),)), 50.0)
    assert undone == Decision(starts=(Start(9, r),), preempt=(3,), wake_at=50.0)
    moved = merge_moves(move, Decision(migrate=(Start(7, q),)))
    assert moved == Decision(starts=(Start(7, q),))
    assert merge_moves(move, Decision(starts=(Start(9, r),))).starts == (Start(7, p), Start(9, r))


def test_contention_added_slowdown_is_the_model_rule_exactly() -> None:
    """``Contention._time_with`` (a split running job's time with a new ring, its other
    links' shares kept) equals ``_time`` on every split job and candidate placement of the
    states of a busy simulation, to the last bit."""
    from linkwise.cluster.mdp import candidates
    from linkwise.cluster.mdp.slowdown import Contention

    topo = from_spec("8x4,leaf=2")
    jobs = PREDICTOR.annotate(
        assign_profiles(
            synthetic.generate(150, seed=4, max_gpus=16, load_scale=6.0),
            load_calibration(None),
            seed=4,
        )
    )
    states = decision_states(topo, jobs, MODEL, make_policy("tiresias_las"))
    checked = 0
    for state in states:
        c = Contention(state, MODEL)
        rings = {p for row in candidates(state, CFG, MODEL).placements for p in row if p}
        rings |= {r.placement for r in c.split}  # a new ring on a running ring's links
        for p in rings:
            if p.num_nodes <= 1:
                continue
            linkset = frozenset(topo.ring_links(p.nodes))
            for w in (0.37, 1.0):
                for i, r in enumerate(c.split):
                    if not linkset & set(c.links[i]):
                        continue
                    plain = c._time(r.job, r.placement, c.links[i], c.weights[i], linkset, w)
                    assert c._time_with(i, linkset, w) == plain
                    checked += 1
    assert checked > 200, checked


def test_a_forked_base_shares_bounded_placement_memo() -> None:
    """A fork of the base (the residual's deviation, ``cluster.fork.fresh``) shares
    ``Bounded``'s pure caches instead of copying 4,096 placements at every deviation."""
    import copy

    from linkwise.cluster.fork import fresh
    from linkwise.policies.parts.placements import Bounded

    b = Bounded(kappa=None, lam=1.0)
    b._memo[((1,), (0,), 1)] = None
    c = copy.deepcopy(b)
    assert c == b and c._memo is b._memo and c._caps is b._caps
    base = make_policy("qssf_preemptive")
    assert fresh(base, MODEL) is not base
