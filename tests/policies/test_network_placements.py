"""The network-aware placements (issue 33 item 4): ``least_loaded``, ``apart`` and
``wait_or_spread``, each on a small hand-built cluster where it differs from the placements
that were there before it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from linkwise.cluster.contention import NoContention
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Topology,
)
from linkwise.cluster.loop import drive
from linkwise.cluster.placement.generators import best_fit
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.compose import ComposeSpec
from linkwise.policies.heuristics import backfill_switches, make_policy
from linkwise.policies.parts.placements import (
    Apart,
    BestFit,
    Bounded,
    LeastContention,
    LeastLoaded,
    Select,
    WaitOrSpread,
)
from linkwise.policies.parts.traffic import leaves_of, profile_demands, traffic_of

NOW = 100_000.0


def _job(i: int, gpus: int, profile: str, *, submit: float = 0.0) -> Job:
    return Job(i, submit, gpus, 1e5, profile=profile, flexible=True, pred_s=1e4, pred_hi_s=2e4)


def _running(job: Job, alloc: Sequence[tuple[int, int]]) -> RunningJob:
    return RunningJob(job, Placement.of(list(alloc)), NOW - 1000.0, 5e4, 1.0, since=NOW)


def _state(topo: Topology, running: Sequence[RunningJob], pending: Sequence[Job]) -> ClusterState:
    free = [n.gpus for n in topo.nodes]
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    return ClusterState(
        NOW,
        topo,
        tuple(free),
        tuple(running),
        tuple(PendingJob(j, remaining_s=j.duration) for j in pending),
    )


def _place(rule: object, state: ClusterState, job: Job) -> Placement | None:
    bound = rule.at(state)  # type: ignore[attr-defined]
    busy, flows = list(state.jobs_per_node), [0] * len(state.topology.links)
    for r in state.running:
        if r.placement.num_nodes > 1:
            for link in state.topology.ring_links(r.placement.nodes, r.job.job_id):
                flows[link] += 1
    return bound.place(state.topology, list(state.free_gpus), busy, flows, job)  # type: ignore[no-any-return]


def _uplink_load(state: ClusterState, p: Placement, job: Job) -> float:
    load = traffic_of(state, profile_demands(load_calibration()))
    return load.score(p, job.job_id)[0]


@pytest.mark.parametrize("fabric", ["8x8,leaf=2", "8x8,leaf=2,ecmp=1"])
def test_least_loaded_keeps_a_spread_ring_off_loaded_uplinks(fabric: str) -> None:
    # an FSDP ring over leaves 0 and 1 loads their uplinks; 24 GPUs need 3 nodes over two
    # leaves: best fit takes nodes 1, 3, 4 (three leaves, two of them loaded), least_loaded
    # the two idle leaves
    topo = from_spec(fabric)
    state = _state(topo, [_running(_job(1, 16, "FSDP"), [(0, 8), (2, 8)])], [])
    job = _job(2, 24, "bert")
    ours = _place(LeastLoaded(), state, job)
    assert ours is not None and set(ours.nodes) <= {4, 5, 6, 7}
    assert ours.num_nodes == 3 and leaves_of(topo, ours) == 2
    assert _uplink_load(state, ours, job) == 0.0
    theirs = best_fit(topo, list(state.free_gpus), 24)
    assert theirs is not None and _uplink_load(state, theirs, job) > 0.0
    # SJF-BCO's ring count and the bounded rule do not find it either
    lc = _place(LeastContention(), state, job)
    assert lc is not None and set(lc.nodes) != set(ours.nodes)


def test_apart_keeps_heavy_rings_apart_where_least_loaded_does_not() -> None:
    # a MoE ring on nodes 0 and 2 (leaves 0 and 1), two FSDP rings on nodes 4 and 5 (leaf
    # 2); with heavy_gbps=20 only MoE (30.8 GB/s) is heavy, FSDP (19.6) is not. A second MoE
    # job of 12 GPUs fits on two nodes of any leaf: least_loaded takes the least load (leaf
    # 0, one MoE ring on node 0's NIC: 30.8 against 78 on leaf 2), apart the leaf with no
    # heavy ring (leaf 2)
    topo = from_spec("6x8,leaf=2")
    running = [
        _running(_job(1, 8, "MoE"), [(0, 4), (2, 4)]),
        _running(_job(2, 2, "FSDP"), [(4, 1), (5, 1)]),
        _running(_job(3, 2, "FSDP"), [(4, 1), (5, 1)]),
    ]
    state = _state(topo, running, [])
    heavy = _job(4, 12, "MoE")
    near = _place(LeastLoaded(heavy_gbps=20.0), state, heavy)
    apart = _place(Apart(heavy_gbps=20.0), state, heavy)
    assert near is not None and apart is not None
    assert near.num_nodes == apart.num_nodes == 2  # equally compact
    assert {topo.nodes[i].leaf for i in near.nodes} == {0}
    assert {topo.nodes[i].leaf for i in apart.nodes} == {2}
    assert best_fit(topo, list(state.free_gpus), 12) == near
    # a light job is placed by apart as least_loaded places it
    light = _job(5, 12, "bert")
    assert _place(Apart(heavy_gbps=20.0), state, light) == near


def test_the_decision_s_own_starts_count_as_traffic() -> None:
    # two heavy jobs in one decision: the second avoids the first one's leaf
    topo = from_spec("6x8,leaf=2")
    state = _state(
        topo,
        [_running(_job(1, 4, "bert"), [(0, 2), (1, 2)])],
        [_job(2, 12, "MoE", submit=1.0), _job(3, 12, "MoE", submit=2.0)],
    )
    policy = ComposeSpec.parse("compose:order=submit,placement=apart").build()
    starts = policy.decide(state).starts
    assert len(starts) == 2
    leaves = [{topo.nodes[i].leaf for i in s.placement.nodes} for s in starts]
    assert len(leaves[0]) == len(leaves[1]) == 1 and leaves[0] != leaves[1]


def test_wait_or_spread_waits_for_a_compact_set_then_spreads() -> None:
    # 4 nodes of 8 GPUs, each half busy: an 8-GPU flexible job has no free node. It waits
    # until 300 s after its submission (asking for a decision then), then spreads over two
    # nodes of one leaf; the bounded rule (lambda 1) never spreads it, best fit at once
    topo = from_spec("4x8,leaf=2")
    running = [_running(_job(i, 4, "bert"), [(i - 1, 4)]) for i in range(1, 5)]
    early = _job(9, 8, "FSDP", submit=NOW - 100.0)
    state = _state(topo, running, [early])
    policy = ComposeSpec.parse("compose:order=submit,placement=wait_or_spread").build()
    waiting = policy.decide(state)
    assert not waiting.starts and waiting.wake_at == NOW + 200.0
    assert _place(Bounded(), state, early) is None
    assert _place(BestFit(), state, early) is not None
    late = _job(9, 8, "FSDP", submit=NOW - 400.0)
    spread = policy.decide(_state(topo, running, [late]))
    assert len(spread.starts) == 1
    p = spread.starts[0].placement
    assert p.num_nodes == 2 and leaves_of(topo, p) == 1
    # a span bound of lambda 1 keeps it waiting; a free node is taken at once
    assert _place(WaitOrSpread(lam=1.0), _state(topo, running, [late]), late) is None
    idle = _state(topo, running[:3], [early])
    assert _place(WaitOrSpread(), idle, early) == Placement.of([(3, 8)])


def test_wait_or_spread_spreads_only_where_the_model_predicts_min_rate() -> None:
    # after the wait, min_rate keeps a communication-heavy job (MoE) from a spread the model
    # predicts slow, and lets a light one (imagenet) spread
    topo = from_spec("4x8,leaf=2")
    running = [_running(_job(i, 4, "bert"), [(i - 1, 4)]) for i in range(1, 5)]
    heavy = _job(9, 8, "MoE", submit=0.0)
    light = _job(10, 8, "imagenet", submit=0.0)
    rule = WaitOrSpread(wait_s=0.0, min_rate=0.9)
    assert _place(rule, _state(topo, running, [heavy]), heavy) is None
    assert _place(rule, _state(topo, running, [light]), light) is not None


def test_the_new_parts_refuse_bad_parameters_and_read_back() -> None:
    with pytest.raises(ValueError, match="lam"):
        WaitOrSpread(lam=0.5)
    with pytest.raises(ValueError, match="min_rate"):
        WaitOrSpread(min_rate=2.0)
    with pytest.raises(ValueError, match="wait_s"):
        ComposeSpec.parse("compose:order=submit,placement=wait_or_spread:wait_s=-1").build()
    text = "compose:order=submit,placement=wait_or_spread:wait_s=600.0,lam=2.0"
    spec = ComposeSpec.parse(text)
    assert ComposeSpec.of(spec.build()).describe() == spec.describe()


@pytest.mark.parametrize("flexible", [True, False])
def test_backfill_switches_waits_for_one_leaf_then_starts_anywhere(flexible: bool) -> None:
    # nodes 0 and 2 busy: 16 GPUs (two whole nodes) fit only over leaves 0 and 1. Slurm's
    # backfill starts it there at once; with --switches=1@300 it waits until 300 s after
    # its submission, and a job behind it that fits one leaf is not held
    topo = from_spec("4x8,leaf=2")
    running = [_running(_job(i, 8, "bert"), [(2 * i - 2, 8)]) for i in (1, 2)]

    def job(i: int, submit: float, gpus: int = 16) -> Job:
        nodes = 0 if flexible else max(1, gpus // 8)
        return Job(i, submit, gpus, 1e4, flexible=flexible, nodes=nodes, time_limit=2e4)

    plain = make_policy("backfill").decide(_state(topo, running, [job(9, NOW - 100.0)]))
    assert [s.job_id for s in plain.starts] == [9]
    switches = make_policy("backfill_switches")
    held = switches.decide(_state(topo, running, [job(9, NOW - 100.0), job(10, NOW - 50.0, 8)]))
    assert [s.job_id for s in held.starts] == [10]
    late = switches.decide(_state(topo, running, [job(9, NOW - 300.0)]))
    assert [s.job_id for s in late.starts] == [9]
    assert leaves_of(topo, late.starts[0].placement) == 2
    # the placement part alone, in a greedy scan
    rule = Select(switches=1).at(_state(topo, running, []))
    assert rule.place(topo, [0, 8, 0, 8], [], [], job(9, NOW - 100.0)) is None
    assert Select(switches=2).at(_state(topo, running, [])).place(
        topo, [0, 8, 0, 8], [], [], job(9, NOW - 100.0)
    ) == Placement.of([(1, 8), (3, 8)])


def test_backfill_switches_starts_a_held_job_when_its_wait_ends_without_another_event() -> None:
    # nodes 0 and 2 held for an hour: 2 x 4 GPUs fit only over both leaves. With
    # --switches=1@30 the job waits 30 s, then starts spread (Slurm's next pass after the wait,
    # checked live by evaluation.slurm_switches), not when a blocker ends an hour later
    topo = from_spec("4x4,leaf=2")
    blockers = [Job(i, 0.0, 3, 3600.0, nodes=1, time_limit=3600.0) for i in (1, 2)]
    running = [
        RunningJob(b, Placement.of([(node, 3)]), 0.0, 3600.0, 1.0, since=0.0)
        for b, node in zip(blockers, (0, 2), strict=True)
    ]
    job = Job(3, 0.0, 8, 600.0, nodes=2, time_limit=900.0)
    sim = Simulator.from_state(
        topo, NoContention(), time=0.0, free_gpus=(1, 4, 1, 4),
        pending=[PendingJob(job, 600.0)], running=running,
    )  # fmt: skip
    starts: dict[int, tuple[float, Placement]] = {}

    def record(state: ClusterState, decision: Decision) -> None:
        starts.update({s.job_id: (state.time, s.placement) for s in decision.starts})

    drive(sim, backfill_switches(1, 30.0), on_decision=record)
    assert starts[3] == (30.0, Placement.of([(1, 4), (3, 4)]))


def test_backfill_switches_reserves_a_waiting_jobs_nodes_within_its_switches() -> None:
    # free 1, 3, 1, 4: 2 x 2 GPUs fit now only over both leaves, within leaf 1 when node 2's
    # job ends (its limit: 60 s). Slurm's backfill plans the waiting job there and reserves
    # nodes 2 and 3, so a 4-GPU job behind it with a 300 s limit may not take node 3 now
    topo = from_spec("4x4,leaf=2")
    held = [(0, 3, 3600.0), (1, 1, 3600.0), (2, 3, 60.0)]
    running = [
        RunningJob(
            Job(i + 1, NOW - 5.0, g, limit, nodes=1, time_limit=limit),
            Placement.of([(node, g)]), NOW - 5.0, limit, 1.0, since=NOW,
        )
        for i, (node, g, limit) in enumerate(held)
    ]  # fmt: skip
    waiting = Job(9, NOW, 4, 600.0, nodes=2, time_limit=600.0)
    later = Job(10, NOW, 4, 600.0, nodes=1, time_limit=300.0)
    state = _state(topo, running, [waiting, later])
    assert state.free_gpus == (1, 3, 1, 4)
    assert [s.job_id for s in make_policy("backfill").decide(state).starts] == [9]
    assert backfill_switches(1, 30.0).decide(state).starts == ()
    # once its wait is over it starts over both leaves, and the later job behind it
    late = replace(state, time=NOW + 30.0)
    assert [s.job_id for s in backfill_switches(1, 30.0).decide(late).starts] == [9]
