"""The mdp's contention tables remembered between decision points cannot go stale (issue 23
item 4).

``cluster.mdp.slowdown.contention_of`` hands out one ``Contention`` for every state with the
same topology and split running jobs (``split_key``), remembered by the ``AnalyticModel``,
with the predictions it made; a new set of split jobs borrows the last set's rings whose key
and link loads are unchanged, with the terms they remember. Whatever the states seen before
(jobs starting, finishing, being preempted or migrated between two decisions, single-node
jobs coming and going, a split ring moving, another topology, the same ids on other
placements), every table and every prediction must be bit-for-bit what a fresh
``Contention(state, model)`` computes by the model's rule as first written
(``_predict_reference``); and the encoder's running-job terms (inlined) must equal the
reference terms.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import replace

from linkwise.cluster.contention import SETS_KEPT, AnalyticModel
from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Topology,
)
from linkwise.cluster.mdp import MdpConfig, candidates
from linkwise.cluster.mdp.features import _running_features, _running_terms
from linkwise.cluster.mdp.slowdown import Contention, contention_of, split_key
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.policies.heuristics import make_policy
from linkwise.tests._states import decision_states

CFG = MdpConfig(
    k_slots=4,
    slot_order="mixed",
    running_slots=2,
    migrate=True,
    generators=("bounded", "least_contention", "best_fit"),
)


def _states(spec: str, base: str, seed: int) -> list[ClusterState]:
    """Every decision point's state of a busy simulation (a preemptive base: jobs are
    preempted and restarted between decisions)."""
    topo = from_spec(spec)
    jobs = synthetic.generate(150, seed=seed, max_gpus=topo.total_gpus // 2, load_scale=6.0)
    jobs = RuntimePredictor.fit(jobs).annotate(
        assign_profiles(jobs, load_calibration(None), seed=seed)
    )
    return decision_states(topo, jobs, AnalyticModel(load_calibration(None)), make_policy(base))


def _assert_same(got: Contention, fresh: Contention, state: ClusterState) -> int:
    """Tables, the running jobs' slowdowns and every candidate's prediction equal (floats
    compared exactly); returns the number of predictions compared."""
    assert got.load == fresh.load
    assert got.slowdown == fresh.slowdown
    assert fresh.slowdown == [  # the model's rule, ``_time`` with no new ring
        max(1.0, fresh._time(r.job, r.placement, fresh.links[i], fresh.weights[i], None, 0.0) / b)
        for i, (r, b) in enumerate(zip(fresh.split, fresh._best, strict=True))
    ]
    assert got.links == fresh.links and got.weights == fresh.weights
    assert got.users == fresh.users
    for r in state.running:
        assert got.running_slowdown(r) == fresh.running_slowdown(r)
    n = 0
    cands = candidates(state, CFG, fresh.model)
    rows = [*cands.placements, *(cands.running.placements if cands.running else ())]
    jobs = [pj.job for pj in cands.slots] + [r.job for r in state.running]
    for job in jobs:
        for p in {p for row in rows for p in row if p is not None}:
            if p.num_gpus != job.num_gpus:
                continue
            want = fresh._predict_reference(job, p)
            assert got.predict(job, p) == want, (state.time, job.job_id, p)
            assert fresh.predict(job, p) == want
            n += 1
    return n


def test_remembered_contention_equals_a_fresh_one_at_every_decision_point() -> None:
    model = AnalyticModel(load_calibration(None))
    compared = reused = changed = 0
    last: tuple[object, ...] | None = None
    for spec, base, seed in (
        ("8x4,leaf=2", "qssf_preemptive", 4),
        ("6x8,leaf=3", "tiresias_las", 5),  # preempts
        ("8x4,leaf=2", "deepshare", 4),  # migrates; the first shape again, after another
    ):
        for state in _states(spec, base, seed):
            # candidates() inside _assert_same asks for the running rows' bases too: the
            # remembered sets of several running sets interleave
            got = contention_of(state, model)
            key = split_key(state)
            reused += bool(key) and key == last
            changed += key != last
            last = key
            compared += _assert_same(got, Contention(state, model), state)
    assert compared > 2000, compared
    assert reused > 200 and changed > 20, (reused, changed)  # both paths really taken


def _ring(job_id: int, gpus: int, alloc: tuple[tuple[int, int], ...], t: float) -> RunningJob:
    job = Job(job_id, 0.0, gpus, 3600.0, profile="bert", pred_s=3000.0, pred_hi_s=6000.0)
    return RunningJob(job, Placement(alloc), t, 1000.0, 1.0, since=t)


TOPO = from_spec("8x8,leaf=2")


def _state_of(running: list[RunningJob], topo: Topology = TOPO, t: float = 100.0) -> ClusterState:
    free = [n.gpus for n in topo.nodes]
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    pending = tuple(
        PendingJob(_ring(100 + g, g, ((0, 1),), 0.0).job, 1000.0) for g in (2, 6, 12, 16)
    )
    return ClusterState(
        time=t, topology=topo, free_gpus=tuple(free), running=tuple(running), pending=pending
    )


def test_a_ring_that_ends_moves_or_changes_profile_between_two_decisions_is_seen() -> None:
    """Hand-made transitions: each must give the fresh tables, never the remembered ones of
    the state before (the key holds id, profile, GPUs and placement of each split job)."""
    model = AnalyticModel(load_calibration(None))
    a = _ring(1, 8, ((0, 4), (2, 4)), 0.0)
    b = _ring(2, 8, ((1, 4), (3, 4)), 0.0)
    c = _ring(3, 4, ((4, 4),), 0.0)  # single node: not part of the key
    moved = replace(b, placement=Placement(((0, 4), (3, 4))))
    other = replace(a, job=replace(a.job, profile="MoE"))
    same_id_elsewhere = replace(a, placement=Placement(((0, 2), (2, 2), (5, 4))))
    sequence = [
        [a, b, c],
        [a, b],  # a single-node job ended: the same tables, reused
        [a],  # a split job ended (finished or preempted)
        [a, b],
        [a, moved],  # migrated
        [other, b],  # another profile under the same id
        [same_id_elsewhere, b],
        [b, a],  # the same rings in another order (sums in another order)
        [a, b, c],
    ]
    for running in sequence:
        state = _state_of(running)
        got = contention_of(state, model)
        fresh = Contention(state, model)
        _assert_same(got, fresh, state)
    # a reused object is the same one, a changed set is not
    s1 = _state_of([a, b, c])
    s2 = _state_of([a, b])
    s3 = _state_of([a])
    assert contention_of(s1, model) is contention_of(s2, model)
    assert contention_of(s3, model) is not contention_of(s2, model)
    # the same shapes on another topology object are another entry
    s4 = _state_of([a, b], from_spec("8x8,leaf=2"))
    assert contention_of(s4, model) is not contention_of(s2, model)


def test_the_model_keeps_a_bounded_number_of_sets_and_drops_them_when_copied() -> None:
    model = AnalyticModel(load_calibration(None))
    for i in range(3 * SETS_KEPT):
        ring = _ring(i, 8, ((0, 4), (1 + i % 5, 4)), 0.0)
        contention_of(_state_of([ring]), model)
    assert len(model._sets) == SETS_KEPT
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other == model and other._sets == {}


def test_the_inlined_running_terms_equal_the_reference_terms() -> None:
    """``_running_features`` without a memo (inlined) against the memo path, which calls
    ``_running_terms``: equal floats at every decision point, overdue jobs included."""
    checked = overdue = 0
    for state in _states("6x8,leaf=3", "tiresias_las", 7):
        inline = _running_features(state, CFG)
        assert inline == _running_features(state, CFG, {})
        overdue += sum(_running_terms(r, state.time, CFG)[1] == 0.0 for r in state.running)
        checked += len(state.running)
    assert checked > 500 and overdue > 0, (checked, overdue)


def test_iteration_times_equal_the_rule_as_first_written_to_the_last_bit() -> None:
    """``AnalyticModel.iteration_times`` (a split ring's fixed parts remembered, the
    simulator's rates) against ``_iteration_times_reference``: random sets of split and
    single-node placements on two fabrics, both sharing modes, repeated sets included."""
    import random

    rng = random.Random(3)
    cal = load_calibration(None)
    profiles = sorted(cal.profiles)
    checked = 0
    for sharing in ("duty", "flows"):
        model = AnalyticModel(cal, sharing=sharing)
        for spec in ("8x8,leaf=2", "12x4,leaf=3"):
            topo = from_spec(spec)
            n, g = len(topo.nodes), topo.nodes[0].gpus
            for _ in range(150):
                placed = []
                for j in range(rng.randint(1, 12)):
                    nodes = sorted(rng.sample(range(n), rng.choice((1, 1, 2, 3, 4))))
                    alloc = tuple((node, rng.randint(1, g)) for node in nodes)
                    gpus = sum(c for _, c in alloc)
                    job = Job(j, 0.0, gpus, 100.0, profile=rng.choice(profiles))
                    placed.append((job, Placement(alloc)))
                got = model.iteration_times(topo, placed)
                assert got == model._iteration_times_reference(topo, placed)
                checked += len(placed)
    assert checked > 2000


def test_least_contention_chooses_as_the_rule_over_the_whole_pool() -> None:
    """``Builder.least_contention`` predicts in full only the placements whose lower bound
    (the job's own slowdown) could still beat the best so far: its choice must be the first
    of the whole pool with the least (job + added slowdown, nodes), every placement
    predicted by the rule as first written."""
    from linkwise.cluster.mdp.placements import _BASE_POOL, Builder, _leaf_best_fit

    model = AnalyticModel(load_calibration(None))
    checked = pruned = 0
    for spec, base, seed in (("8x4,leaf=2", "deepshare", 4), ("6x8,leaf=3", "tiresias_las", 5)):
        for state in _states(spec, base, seed):
            b = Builder(state, model)
            fresh = Contention(state, model)
            for pj in state.pending:
                job = pj.job
                if job.num_gpus > state.total_free_gpus:
                    continue
                pool: list[Placement] = []
                for gen in _BASE_POOL:
                    p = b.base(gen, job.num_gpus)
                    if p is not None and p not in pool:
                        pool.append(p)
                if pool and pool[0].num_nodes > 1:
                    for members in state.topology.leaf_nodes:
                        p = _leaf_best_fit(members, state.free_gpus, job.num_gpus)
                        if p is not None and p not in pool:
                            pool.append(p)
                want: Placement | None = None
                want_key = (0.0, 0)
                for p in pool:
                    pred = fresh._predict_reference(job, p)
                    k = (pred.job_slowdown + pred.added_slowdown, p.num_nodes)
                    if want is None or k < want_key:
                        want, want_key = p, k
                before = len(b._predictions)
                assert b.least_contention(job) == want
                pruned += len(pool) - (len(b._predictions) - before) > 0
                checked += 1
    assert checked > 300 and pruned > 0, (checked, pruned)


def test_least_of_a_pool_is_the_rule_where_the_lowest_bound_loses() -> None:
    """Random split rings and random pools of split placements (many where the placement
    with the least own slowdown adds the most to the others): ``Builder._least_of`` picks
    what the rule over the whole pool picks."""
    import random

    from linkwise.cluster.mdp.placements import Builder

    rng = random.Random(11)
    model = AnalyticModel(load_calibration(None))
    profiles = sorted(model.calibration.profiles)
    topo = from_spec("12x8,leaf=3")
    n = len(topo.nodes)
    lost = 0
    for trial in range(300):
        running = []
        for j in range(rng.randint(1, 10)):
            nodes = sorted(rng.sample(range(n), rng.choice((2, 2, 3))))
            alloc = tuple((node, 1) for node in nodes)
            job = Job(j, 0.0, len(alloc), 100.0, profile=rng.choice(profiles))
            running.append(RunningJob(job, Placement(alloc), 0.0, 100.0, 1.0))
        free = [8] * n
        for r in running:
            for node, g in r.placement.alloc:
                free[node] -= g
        state = ClusterState(100.0, topo, tuple(free), tuple(running), ())
        job = Job(999, 0.0, 4, 100.0, profile=rng.choice(profiles))
        pool = list(
            {
                Placement(tuple((node, 2) for node in sorted(rng.sample(range(n), 2))))
                for _ in range(6)
            }
        )
        fresh = Contention(state, model)
        keys = []
        for i, p in enumerate(pool):
            pred = fresh._predict_reference(job, p)
            keys.append((pred.job_slowdown + pred.added_slowdown, p.num_nodes, i))
        bounds = [(fresh.job_slowdown(job, p), p.num_nodes, i) for i, p in enumerate(pool)]
        lost += min(bounds)[2] != min(keys)[2]
        assert Builder(state, model)._least_of(job, pool) == pool[min(keys)[2]], trial
    assert lost > 5, lost


def test_builders_kept_between_states_place_and_predict_as_a_fresh_builder() -> None:
    """``placements.builder_of`` hands one ``Builder`` to every state with the same
    contention predictions, free GPUs and jobs per node: at every decision point of
    preempting and migrating simulations, in order (so that kept builders are reused), every
    generator's placement, ``least_contention``'s pool and choice, and every prediction and
    own slowdown must be what a fresh ``Builder`` over a fresh ``Contention`` gives; builders
    are reused, and never for a state with other free GPUs."""
    from linkwise.cluster.mdp.config import GENERATORS
    from linkwise.cluster.mdp.placements import Builder, builder_of

    checked = reused = 0
    for spec, base, seed in (
        ("8x4,leaf=2", "qssf_preemptive", 6),
        ("6x8,leaf=3", "tiresias_las", 7),
    ):
        model = AnalyticModel(load_calibration(None))
        given: dict[int, tuple[Builder, tuple[int, ...]]] = {}  # kept alive: ids stay unique
        for state in _states(spec, base, seed):
            b = builder_of(state, model, 0.5)
            if id(b) in given:
                reused += 1
                assert given[id(b)][1] == state.free_gpus
            given[id(b)] = (b, state.free_gpus)
            fresh = Builder(state, model, 0.5, Contention(state, model))
            jobs = [pj.job for pj in state.pending] + [r.job for r in state.running]
            for job in jobs:
                if job.num_gpus > state.total_free_gpus:
                    continue
                assert b.pool(job.num_gpus) == fresh.pool(job.num_gpus)
                for gen in GENERATORS:
                    p = b.placement(gen, job)
                    assert p == fresh.placement(gen, job), (gen, job)
                    if p is not None:
                        assert b.predict(job, p) == fresh.predict(job, p)
                        got = b.contention.job_slowdown(job, p)
                        assert got == fresh.contention.job_slowdown(job, p)
                        assert got == fresh.contention._predict_reference(job, p).job_slowdown
                        checked += 1
    assert checked > 2000 and reused > 50, (checked, reused)


def test_a_builder_is_never_shared_by_states_with_other_jobs_per_node() -> None:
    """The same free GPUs and no split jobs, but other jobs per node: SJF-BCO's fragment
    first fit puts a 4-GPU job on the busiest node, so the two states must get their own
    builders and placements."""
    from linkwise.cluster.mdp.placements import builder_of

    topo = from_spec("4x8")
    model = AnalyticModel(load_calibration(None))
    profile = sorted(model.calibration.profiles)[0]

    def run(i: int, node: int, gpus: int) -> RunningJob:
        job = Job(i, 0.0, gpus, 100.0, profile=profile)
        return RunningJob(job, Placement(((node, gpus),)), 0.0, 100.0, 1.0)

    free = (4, 4, 8, 8)
    a = ClusterState(10.0, topo, free, (run(1, 0, 2), run(2, 0, 2), run(3, 1, 4)), ())
    b = ClusterState(10.0, topo, free, (run(1, 0, 4), run(2, 1, 2), run(3, 1, 2)), ())
    job = Job(9, 0.0, 4, 100.0, profile=profile)
    ba, bb = builder_of(a, model), builder_of(b, model)
    assert ba is not bb
    assert ba.placement("fragment_first_fit", job) == Placement(((0, 4),))
    assert bb.placement("fragment_first_fit", job) == Placement(((1, 4),))
    assert builder_of(a, model) is ba  # kept
