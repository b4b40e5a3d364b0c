"""The "mixed" slot order (heads of the oldest, fewest-GPU, smallest-predicted-GPU-time and
least-attained orders, round-robin), its per-slot rank features, the span-limited "bounded"
candidate generator (SJF-BCO's placement) and the inverse of the time scaling."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from linkwise.cluster import mdp
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.mdp.features import log_time
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies import heuristics as heur

MODEL = AnalyticModel(load_calibration(None))
TOPO = from_spec("4x8,leaf=2")


def _job(i: int, submit: float, gpus: int, pred_s: float, **kw: Any) -> Job:
    return Job(i, submit, gpus, 1.0, profile="bert", pred_s=pred_s, pred_hi_s=2 * pred_s, **kw)


def _pending(job: Job, attained: float = 0.0) -> PendingJob:
    return PendingJob(job, remaining_s=job.duration, attained_gpu_s=attained)


def _queue_state() -> ClusterState:
    """An idle 4x8 cluster (32 GPUs) whose queue has a different head in every order:
    job 1 the oldest, job 2 the fewest GPUs, job 3 the smallest predicted GPU time, job 4
    the least attained service; job 5 never fits; jobs 6, 7 are fillers."""
    queue = [
        _pending(_job(1, 0.0, 8, 10_000.0), attained=5e4),
        _pending(_job(2, 10.0, 1, 100_000.0), attained=1e5),
        _pending(_job(3, 20.0, 4, 60.0), attained=1e4),
        _pending(_job(4, 30.0, 2, 50_000.0)),
        _pending(_job(5, 35.0, 40, 10.0)),  # larger than the cluster: never a slot
        _pending(_job(6, 40.0, 4, 20_000.0), attained=2e4),
        _pending(_job(7, 50.0, 2, 40_000.0), attained=3e4),
    ]
    return ClusterState(
        time=1000.0,
        topology=TOPO,
        free_gpus=(8, 8, 8, 8),
        running=(),
        pending=tuple(queue),
    )


def _ids(cands: mdp.Candidates) -> list[int]:
    return [p.job.job_id for p in cands.slots]


def test_mixed_slots_take_the_head_of_every_order_round_robin() -> None:
    state = _queue_state()
    four = mdp.candidates(state, mdp.MdpConfig(k_slots=4, slot_order="mixed"), MODEL)
    assert _ids(four) == [1, 2, 3, 4]  # oldest, fewest GPUs, smallest GPU time, least attained
    # the second round: each order's next job not yet taken (oldest: 6; fewest GPUs: 7)
    six = mdp.candidates(state, mdp.MdpConfig(k_slots=6, slot_order="mixed"), MODEL)
    assert _ids(six) == [1, 2, 3, 4, 6, 7]
    # never more than K, only fitting jobs, deterministic
    many = mdp.MdpConfig(k_slots=16, slot_order="mixed")
    assert sorted(_ids(mdp.candidates(state, many, MODEL))) == [1, 2, 3, 4, 6, 7]
    assert _ids(mdp.candidates(state, many, MODEL)) == _ids(mdp.candidates(state, many, MODEL))
    # the other orders see one head each
    for order, head in (("fitting", 1), ("smallest", 2)):
        assert (
            _ids(mdp.candidates(state, mdp.MdpConfig(k_slots=4, slot_order=order), MODEL))[0]
            == head
        )


def test_mixed_slots_use_predictions_only_and_only_what_fits_now() -> None:
    state = _queue_state()
    cfg = mdp.MdpConfig(k_slots=4, slot_order="mixed")
    # true durations do not matter: job 7 gets the smallest true run time, nothing changes
    twin = replace(
        state,
        pending=tuple(
            replace(p, job=replace(p.job, duration=1e6 if p.job.job_id != 7 else 1.0))
            for p in state.pending
        ),
    )
    assert _ids(mdp.candidates(twin, cfg, MODEL)) == [1, 2, 3, 4]
    # 4 GPUs free: the 8-GPU oldest job does not fit, the next oldest fitting job leads
    busy = RunningJob(
        job=_job(99, 0.0, 28, 1e5),
        placement=Placement.of([(0, 8), (1, 8), (2, 8), (3, 4)]),
        start_time=0.0,
        remaining_s=1e5,
        rate=1.0,
    )
    small = replace(state, free_gpus=(0, 0, 0, 4), running=(busy,))
    cands = mdp.candidates(small, cfg, MODEL)
    assert all(p.job.num_gpus <= 4 for p in cands.slots)
    # oldest fitting: 2; fewest GPUs: 2 taken, 4; smallest GPU time: 3; least attained: 4, 3
    # taken, 6
    assert _ids(cands) == [2, 4, 3, 6]


def test_slots_carry_their_rank_in_every_order() -> None:
    state = _queue_state()
    spec = mdp.make_spec(mdp.MdpConfig(k_slots=4, slot_order="mixed"))
    obs = dict(zip(spec.feature_names, mdp.encode_state(state, spec, MODEL), strict=True))
    for k, order in enumerate(mdp.ORDERS):  # slot k is order k's head
        assert obs[f"s{k}.rank_{order}"] == 0.0
    # job 1 (slot 0) is fifth by attained service (after jobs 4, 3, 6, 7): beyond the first K
    assert obs["s0.rank_attained"] == 1.0
    assert obs["s1.rank_submit"] == pytest.approx(1 / 4)  # job 2 is the second oldest
    assert obs["s3.rank_gpus"] == pytest.approx(1 / 4)  # job 4 (2 GPUs) after job 2 (1 GPU)
    # upper-quantile predicted GPU time, log-scaled like the median one
    cfg = spec.config
    unit, cap = cfg.size_scale_gpu_s, cfg.max_size_gpu_s
    assert obs["s0.pred_gpu_time_hi"] == pytest.approx(
        math.log1p(2 * 10_000.0 * 8 / unit) / math.log1p(cap / unit), rel=1e-6
    )
    assert obs["s0.pred_gpu_time_hi"] > obs["s0.pred_gpu_time"]
    layout = mdp.obs_layout(spec)  # the slot block ends with the ranks
    assert spec.feature_names[layout.slot_offset + layout.n_slot - 1] == "s0.rank_attained"


def _fragmented(free: tuple[int, ...]) -> ClusterState:
    """A 4x8 cluster with ``free`` GPUs per node (the rest held by one job per node) and one
    8-GPU job queued."""
    running = tuple(
        RunningJob(
            job=_job(100 + n, 0.0, 8 - f, 1e5),
            placement=Placement.of([(n, 8 - f)]),
            start_time=0.0,
            remaining_s=1e5,
            rate=1.0,
        )
        for n, f in enumerate(free)
        if f < 8
    )
    return ClusterState(
        time=100.0,
        topology=TOPO,
        free_gpus=free,
        running=running,
        pending=(_pending(_job(1, 0.0, 8, 600.0)),),
    )


def test_bounded_generator_waits_for_consolidation() -> None:
    gens = ("bounded", "best_fit", "fragment_first_fit")
    cfg = mdp.MdpConfig(k_slots=2, generators=gens, mask_duplicates=False)
    # no node has 8 free GPUs: within ceil(1 x 1) = 1 server the 8-GPU job cannot start
    spread = _fragmented((4, 4, 4, 4))
    cands = mdp.candidates(spread, cfg, MODEL)
    assert cands.placements[0][0] is None and not cands.mask[0]
    assert cands.placements[0][1] is not None and cands.mask[1]  # best fit would split it
    assert heur.sjf_bco().decide(spread).starts == ()  # SJF-BCO waits too
    # a looser bound (2 servers) allows SJF-BCO's own placement
    loose = mdp.candidates(spread, replace(cfg, span_lambda=2.0), MODEL)
    placed = loose.placements[0][0]
    assert placed is not None and placed.num_nodes == 2 and loose.mask[0]
    assert heur.sjf_bco(lam=2.0).decide(spread).starts[0].placement == placed
    # one node is free: the consolidated placement, where SJF-BCO starts it
    one_free = _fragmented((4, 8, 2, 4))
    cands = mdp.candidates(one_free, cfg, MODEL)
    assert cands.placements[0][0] == Placement.of([(1, 8)])
    assert heur.sjf_bco().decide(one_free).starts[0].placement == cands.placements[0][0]


def test_bounded_generator_is_masked_for_a_policy_offered_only_it() -> None:
    cfg = mdp.MdpConfig(k_slots=1, generators=("bounded",))
    cands = mdp.candidates(_fragmented((4, 4, 4, 4)), cfg, MODEL)
    assert cands.mask.tolist() == [False, True]  # only wait: the job waits for consolidation


def test_time_from_log_inverts_the_time_scaling() -> None:
    cfg = mdp.MdpConfig()
    for t in (0.0, 1.0, 59.0, 3600.0, 6 * 3600.0, 86_400.0 * 7):
        assert mdp.time_from_log(log_time(t, cfg), cfg) == pytest.approx(t, rel=1e-9)
    assert mdp.time_from_log(1.0, cfg) == pytest.approx(cfg.max_time_s)
    assert mdp.time_from_log(log_time(1e12, cfg), cfg) == pytest.approx(cfg.max_time_s)


def test_new_config_fields_are_validated_and_versioned() -> None:
    with pytest.raises(ValueError, match="span_lambda"):
        mdp.MdpConfig(span_lambda=0.5)
    cfg = mdp.MdpConfig(slot_order="mixed", generators=("bounded", "best_fit"), span_lambda=2.0)
    assert mdp.MdpConfig.from_json(cfg.to_json()) == cfg
    assert mdp.make_spec(cfg).version != mdp.make_spec(replace(cfg, span_lambda=1.0)).version
