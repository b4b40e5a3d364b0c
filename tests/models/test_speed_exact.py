"""The residual's scoring path made cheaper without changing a decision (issue 23 item 4).

Each shortcut is checked against the rule it replaces, on every decision point of seeded
simulations, and each check is shown to catch a deliberately broken variant:

- ``mdp.encode_partial`` (the features known without the candidates: the global ones but
  the contention tables', every slot's) equals ``encode`` bit for bit wherever it is not NaN;
- the simulator hands a state the ``jobs_per_node`` of the last one with the same running
  tuple (the rule's value, also in forks); the residual skips ``annotate_state``'s look at
  tuples it found all annotated (the same result);
- the range deferral decided on those features first (``ResidualPolicy._range_first``, no
  candidates for a point that defers anyway) decides and counts as ``decide_plain``, with
  points deferred before the candidates, points deferred only by candidate features and
  points scored all present.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.fork import fork
from linkwise.cluster.mdp import MdpConfig, candidates, encode, encode_partial, make_spec
from linkwise.cluster.mdp.spec import SLOT_FEATURES
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.prediction import annotate_state
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models.residual import Deferral, ResidualPolicy, topology_signature
from linkwise.policies.heuristics import make_policy
from linkwise.tests._states import Both, decision_states

TOPO = from_spec("4x8,leaf=2")
MODEL = AnalyticModel(load_calibration(None))
PREDICTOR = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=32))
CFG = MdpConfig(
    k_slots=4, slot_order="mixed", generators=("bounded", "least_contention", "best_fit")
)
CONFIGS = {
    "mixed": CFG,
    "running-migrate": replace(CFG, running_slots=2, migrate=True),
    "head": replace(CFG, slot_order="head"),
    "fitting-tod": replace(CFG, slot_order="fitting", time_of_day=True),
}
# the global features that need the contention model's tables
CONTENTION_GLOBALS = ("g.nic_load_max", "g.split_running_share", "g.running_slowdown_mean",
                      "g.running_slowdown_max")  # fmt: skip


def _jobs(n: int = 120, seed: int = 5, load: float = 6.0) -> tuple[Any, ...]:
    drawn = synthetic.generate(n, seed=seed, max_gpus=32, load_scale=load)
    return PREDICTOR.annotate(assign_profiles(drawn, load_calibration(None), seed=seed))


def _states(base: str = "qssf_preemptive", seed: int = 5, load: float = 6.0) -> list[Any]:
    """Every decision point's state of a busy simulation."""
    return decision_states(TOPO, _jobs(seed=seed, load=load), MODEL, make_policy(base))


def _bits(x: Any) -> Any:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_partial_encoding_is_the_encoding_where_known(config: str) -> None:
    cfg = CONFIGS[config]
    spec = make_spec(cfg)
    names = spec.feature_names
    n_global = sum(1 for n in names if n.startswith("g."))
    expected_known = n_global - len(CONTENTION_GLOBALS) + cfg.k_slots * len(SLOT_FEATURES)
    checked = 0
    for state in _states(base="tiresias_las" if config == "head" else "qssf_preemptive"):
        full = encode(candidates(state, cfg, MODEL), spec)
        part = encode_partial(state, spec, MODEL)
        assert part.shape == full.shape and part.dtype == full.dtype
        assert not np.isnan(full).any()
        known = ~np.isnan(part)
        assert int(known.sum()) == expected_known
        assert not any(known[names.index(n)] for n in CONTENTION_GLOBALS)
        assert np.array_equal(_bits(part[known]), _bits(full[known]))
        glob = encode_partial(state, spec, MODEL, slots=False)  # the global ones alone
        known_g = ~np.isnan(glob)
        assert int(known_g.sum()) == n_global - len(CONTENTION_GLOBALS) - 1
        assert not (known_g & ~known).any() and not known_g[names.index("g.beyond_slots_share")]
        assert np.array_equal(_bits(glob[known_g]), _bits(full[known_g]))
        checked += 1
    assert checked > 100


def _broken_range_first(deferral: Deferral, spec: Any, state: ClusterState) -> bool:
    """A wrong shortcut: defers when ``max_out`` known features lie outside the range (one
    too few: the whole observation may have no more)."""
    x = np.asarray(encode_partial(state, spec, MODEL), dtype=np.float64)
    lo = np.asarray(deferral.feature_lo) - deferral.tolerance
    hi = np.asarray(deferral.feature_hi) + deferral.tolerance
    out = int(np.count_nonzero((x < lo) | (x > hi)))
    return out > 0 and out >= deferral.max_out


def _range_deferral(cfg: MdpConfig) -> Deferral:
    """A training range like a package's: the encoded states of a lighter workload on the same
    cluster (so busier states lie outside it, some by slot or global features, some only by
    candidate features), with the topology's signature."""
    spec = make_spec(cfg)
    obs = np.stack([encode(candidates(s, cfg, MODEL), spec) for s in _states(seed=11, load=2.0)])
    return Deferral(
        topologies=(topology_signature(TOPO),),
        feature_lo=tuple(float(x) for x in obs.min(axis=0)),
        feature_hi=tuple(float(x) for x in obs.max(axis=0)),
        max_out=1,
    )


def _values(n_actions: int) -> Callable[[Any], Any]:
    def values(obs: Any) -> Any:
        x = float(np.asarray(obs).sum())
        return np.sin(np.arange(n_actions, dtype=np.float32) * (1.0 + x))[None, :]

    return values


def _pair(cfg: MdpConfig, deferral: Deferral) -> tuple[ResidualPolicy, ResidualPolicy]:
    spec = make_spec(cfg)
    made = [
        ResidualPolicy(
            base=make_policy("qssf_preemptive"),
            values=_values(spec.n_actions),
            obs_spec=spec,
            belief=MODEL,
            margin=0.3,
            deferral=deferral,
            base_spec="qssf_preemptive",
            predictor=PREDICTOR,
        )
        for _ in range(2)
    ]
    return made[0], made[1]


def _simulate_both(cfg: MdpConfig, broken: bool = False) -> tuple[Both, int, int]:
    deferral = _range_deferral(cfg)
    fast, plain = _pair(cfg, deferral)
    early = [0, 0]  # deferred before the candidates, of which by the global features alone
    spec = fast.obs_spec
    inner = fast._range_first

    def counted(state: ClusterState) -> bool:
        hit = _broken_range_first(deferral, spec, state) if broken else inner(state)
        early[0] += hit
        by_globals = deferral.obs_reason(encode_partial(state, spec, MODEL, slots=False))
        early[1] += bool(by_globals)
        return hit

    fast._range_first = counted  # type: ignore[method-assign]
    both = Both(fast, plain)
    simulate(TOPO, _jobs(seed=5, load=6.0), MODEL, both, SimConfig())
    return both, early[0], early[1]


@pytest.mark.parametrize("config", ["mixed", "running-migrate"])
def test_range_deferral_before_the_candidates_decides_as_the_plain_path(config: str) -> None:
    cfg = CONFIGS[config]
    both, early, by_globals = _simulate_both(cfg)
    fast, plain = both.fast, both.plain
    mismatched = [i for i, (a, b) in enumerate(both.pairs) if a != b]
    assert not mismatched, f"{len(mismatched)} decision points differ, first {mismatched[0]}"
    assert fast.stats() == plain.stats()
    assert fast.advantages == plain.advantages
    late = fast.deferrals["range"] - early
    scored = len(fast.advantages)
    # every branch taken: deferred by the global features, by the slots', only after the
    # candidates, and scored
    assert 0 < by_globals < early and late > 0 and scored > 20, (by_globals, early, late, scored)


def test_a_broken_shortcut_is_caught() -> None:
    """The comparison above fails for a shortcut one feature short of the rule."""
    both, early, _ = _simulate_both(CONFIGS["mixed"], broken=True)
    differs = any(a != b for a, b in both.pairs) or both.fast.stats() != both.plain.stats()
    assert differs and early > 0


def test_partial_encoding_never_reads_the_contention_model() -> None:
    """``encode_partial`` builds no contention tables: a model whose tables raise is fine
    (its comm shares, the slots' only model input, come from ``best_time`` and profiles)."""

    class NoTables(AnalyticModel):
        def remembered(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("contention tables built")

    model = NoTables(load_calibration(None))
    spec = make_spec(CFG)
    states = _states()
    for state in states[::7]:
        part = encode_partial(state, spec, model)
        assert np.array_equal(_bits(part), _bits(encode_partial(state, spec, MODEL)))
    assert math.isnan(float(encode_partial(states[0], spec, model)[-1]))


# ----------------------------------------------------------------- ClusterState.jobs_per_node


def _jobs_per_node_rule(state: ClusterState) -> tuple[int, ...]:
    """``ClusterState.jobs_per_node`` as the property computes it."""
    return ClusterState.__dict__["jobs_per_node"].func(state)  # type: ignore[no-any-return]


def _check_jobs_per_node(sim: Simulator, policy: Any) -> tuple[int, int]:
    """Drive ``sim`` by ``policy``; at every decision point the state's ``jobs_per_node``
    (shared from an earlier state where the simulator could) must be the rule's. Returns
    (states whose value was shared, states that differ)."""
    shared = differ = 0
    while True:
        state = sim.observe()
        shared += "jobs_per_node" in state.__dict__
        differ += state.jobs_per_node != _jobs_per_node_rule(state)
        sim.apply(policy.decide(state))
        if not sim.advance():
            return shared, differ


class _StaleSimulator(Simulator):
    """A wrong shortcut: the last state's counts handed on whatever ran since."""

    def observe(self) -> ClusterState:
        fresh = self._state is None
        state = super().observe()
        last = getattr(self, "_last", None)
        if fresh and last is not None and "jobs_per_node" in last.__dict__:
            object.__setattr__(state, "jobs_per_node", last.__dict__["jobs_per_node"])
        self._last = state
        return state


@pytest.mark.parametrize("base", ["qssf_preemptive", "deepshare", "tiresias_las"])
def test_jobs_per_node_shared_between_states_is_the_rule(base: str) -> None:
    sim = Simulator(TOPO, _jobs(), MODEL, SimConfig())
    shared, differ = _check_jobs_per_node(sim, make_policy(base))
    assert differ == 0 and shared > 50, (shared, differ)
    # forks (cluster.fork fills a simulator's internals directly) too
    states = _states(base)
    for i in range(0, len(states), max(1, len(states) // 8)):
        forked = fork(states[i], MODEL, SimConfig(), seed=1, horizon_s=4 * 3600.0)
        _, differ = _check_jobs_per_node(forked, make_policy(base))
        assert differ == 0


def test_a_stale_jobs_per_node_is_caught() -> None:
    sim = _StaleSimulator(TOPO, _jobs(), MODEL, SimConfig())
    _, differ = _check_jobs_per_node(sim, make_policy("qssf_preemptive"))
    assert differ > 0


# ----------------------------------------------------------------- the residual's annotation


def test_annotation_remembered_is_annotate_state() -> None:
    """``ResidualPolicy._annotate`` returns what ``annotate_state`` returns (the same object
    where that is the state itself), on states of a simulation where a third of the jobs
    come without predictions, and on hand-made transitions: the same pending tuple with a
    new running one holding a job without predictions, and the reverse."""
    drawn = assign_profiles(
        synthetic.generate(120, seed=3, max_gpus=32, load_scale=6.0), load_calibration(None)
    )
    annotated = PREDICTOR.annotate(drawn)
    jobs = [r if r.job_id % 3 == 0 else a for r, a in zip(drawn, annotated, strict=True)]
    fast, _ = _pair(CFG, Deferral())
    checked = same = 0
    states: list[ClusterState] = []

    @dataclass
    class Record:
        name: str = "record"

        def decide(self, state: ClusterState) -> Decision:
            states.append(state)
            got, want = fast._annotate(state), annotate_state(state, PREDICTOR)
            nonlocal checked, same
            assert got == want and ((got is state) == (want is state))
            checked += 1
            same += want is state
            return make_policy("qssf_preemptive").decide(want)

    simulate(TOPO, jobs, MODEL, Record(), SimConfig())
    assert checked > 100 and 0 < same < checked
    full = [s for s in states if s.running and s.pending and annotate_state(s, PREDICTOR) is s]
    raw_running = next(s for s in states if any(not r.job.predicted for r in s.running))
    raw_pending = next(s for s in states if any(not p.job.predicted for p in s.pending))
    for transition in (
        replace(full[0], running=raw_running.running),
        replace(full[0], pending=raw_pending.pending),
    ):
        fast._annotate(full[0])  # remembered all annotated
        assert fast._annotate(transition) == annotate_state(transition, PREDICTOR)
        assert fast._annotate(transition) is not transition


# ----------------------------------------------------------------- the simulator's rates


def _evolving_sets(seed: int, topo: Any, steps: int = 300) -> list[list[Any]]:
    """Sets of placed jobs as a simulation meets them: each the last with one job added or
    removed (most rings keep the loads on their links), now and then a fresh set."""
    import random

    from linkwise.cluster.domain import Job, Placement

    rng = random.Random(seed)
    profiles = sorted(load_calibration(None).profiles)
    n, g = len(topo.nodes), topo.nodes[0].gpus
    placed: list[Any] = []
    out = []
    for step in range(steps):
        if step % 60 == 0:
            placed = []
        if placed and rng.random() < 0.4:
            placed.pop(rng.randrange(len(placed)))
        else:
            nodes = sorted(rng.sample(range(n), rng.choice((1, 2, 2, 3))))
            alloc = tuple((node, rng.randint(1, g)) for node in nodes)
            job = Job(step, 0.0, sum(c for _, c in alloc), 100.0, profile=rng.choice(profiles))
            placed.append((job, Placement(alloc)))
        out.append(list(placed))
    return out


def _ring(model: AnalyticModel, job: Any, placement: Any, topo: Any) -> Any:
    """The model's remembered split ring of a job on a placement (None: not yet met)."""
    hit = model._rings.get((job.profile, job.num_gpus, placement, id(topo), -1))
    return None if hit is None else hit[1]


@pytest.mark.parametrize("sharing", ["duty", "flows"])
def test_ring_times_remembered_by_their_loads_are_the_rule(sharing: str) -> None:
    """``AnalyticModel.iteration_times`` reuses a split ring's time where the loads on its
    links are the ones it was last timed at: bit-equal to ``_iteration_times_reference`` on
    evolving sets (where it reuses most) on two fabrics."""
    model = AnalyticModel(load_calibration(None), sharing=sharing)
    reused = checked = 0
    for spec in ("8x8,leaf=2", "12x4,leaf=3,oversub=2"):
        topo = from_spec(spec)
        for placed in _evolving_sets(7, topo):
            rings = [_ring(model, j, p, topo) for j, p in placed]
            before = [None if r is None else r.last[0] for r in rings]
            got = model.iteration_times(topo, placed)
            assert got == model._iteration_times_reference(topo, placed)
            reused += sum(
                1
                for r, b in zip(rings, before, strict=True)
                if r is not None and b is not None and r.last[0] == b
            )
            checked += len(placed)
    assert checked > 1000 and reused > 200, (checked, reused)


def test_ring_times_remembered_by_the_wrong_loads_are_caught() -> None:
    """The check above fails for a memo that records the loads but not the time."""
    model = AnalyticModel(load_calibration(None))
    topo = from_spec("8x8,leaf=2")
    wrong = 0
    for placed in _evolving_sets(7, topo):
        want = model._iteration_times_reference(topo, placed)
        for j, p in placed:  # a wrong memo: every known ring "timed" at its current loads
            ring = _ring(model, j, p, topo)
            if ring is not None:
                load = [0.0] * len(topo.links)
                for jj, pp in placed:
                    rr = _ring(model, jj, pp, topo)
                    if rr is not None:
                        for link in rr.links:
                            load[link] += rr.weight
                ring.last[0] = tuple(load[link] for link in ring.links)
        wrong += model.iteration_times(topo, placed) != want
    assert wrong > 0


# ----------------------------------------------------------------- the encoder's running terms


def _edge_states() -> list[ClusterState]:
    """States of a busy simulation whose running jobs are given attained service that puts
    their predicted remaining time at the edges (up to rounding): 0, below 0, ``max_time_s``,
    beyond it, just above 0, ``time_scale_s``."""
    cfg = CFG
    out = []
    for state in _states()[::5]:
        if not state.running:
            continue
        runs = []
        for i, r in enumerate(state.running):
            g, t, pred = r.job.num_gpus, state.time, r.job.pred_s
            job = replace(r.job, pred_s=cfg.max_time_s * 2, pred_hi_s=cfg.max_time_s * 3)
            rem = (0.0, -50.0, cfg.max_time_s, cfg.max_time_s * 1.5, 1e-9, cfg.time_scale_s)[i % 6]
            base = job.pred_s if i % 6 >= 2 else pred
            job = job if i % 6 >= 2 else r.job
            attained = (base - rem) * g - g * (t - r.since)
            runs.append(replace(r, job=job, attained_gpu_s=attained))
        out.append(replace(state, running=tuple(runs)))
    return out


def _running_features_uncapped(state: ClusterState, cfg: MdpConfig) -> list[float]:
    """A wrong shortcut: the inlined loop without the cap at ``max_time_s``."""
    unit, cap = cfg.time_scale_s, cfg.max_time_s
    scale = math.log1p(cap / unit)
    gpus = soon = 0
    weighted = 0.0
    for r in state.running:
        g = r.job.num_gpus
        rem = r.job.pred_s - (r.attained_gpu_s + g * (state.time - r.since)) / g
        gpus += g
        if rem > 0.0:
            weighted += g * (math.log1p(rem / unit) / scale)
        else:
            rem = 0.0
        if rem <= unit:
            soon += g
    total = state.topology.total_gpus
    return [weighted / gpus if gpus else 0.0, soon / total if total else 0.0]


def test_inlined_running_features_equal_the_reference_terms_at_the_edges() -> None:
    """The encoder's running-job loop (``max``/``min`` as conditionals) against the terms
    computed by ``predicted_remaining`` and ``log_time`` (the memo path), on remaining times
    at exactly 0, below, at and beyond the cap; an uncapped loop is caught."""
    from linkwise.cluster.mdp.features import _running_features

    states = _edge_states()
    assert len(states) > 20
    for state in states:
        assert _running_features(state, CFG) == _running_features(state, CFG, {})
    assert any(_running_features_uncapped(s, CFG) != _running_features(s, CFG, {}) for s in states)
