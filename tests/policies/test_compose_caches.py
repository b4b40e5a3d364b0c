"""The composed policies' speed structures cannot go stale (issue 23 item 4).

- ``Bounded`` remembers its placements by (free GPUs, busy-ness, GPUs): every answer must be
  what ``bounded_placement`` says for exactly those, whatever it answered before, and on
  another topology;
- Tiresias' queues (``orders.Las``): a round starts from the queues the last one left
  without copying them, so a second decision at the same instant must still start from the
  queues before the first; ``settle`` reuses the maps of the state it ranked only for that
  state; a running job whose attained service has since crossed its queue's threshold is
  demoted and preempted.
"""

from __future__ import annotations

import random

from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies import heuristics as heur
from linkwise.policies.parts.orders import Las
from linkwise.policies.parts.placements import MEMO_SIZE, Bounded, bounded_placement


def test_bounded_memo_answers_as_the_rule_for_the_very_free_and_busy_vectors() -> None:
    rng = random.Random(7)
    rule = Bounded()
    for spec in ("4x8", "6x8,leaf=2", "4x8"):  # the topology changes, then comes back
        topo = from_spec(spec)
        caps = sorted((n.gpus for n in topo.nodes), reverse=True)
        n = len(topo.nodes)
        free = [rng.randint(0, 8) for _ in range(n)]
        busy = [rng.randint(0, 3) for _ in range(n)]
        for _ in range(400):
            # small moves: most vectors repeat one seen before, some differ in one entry
            node = rng.randrange(n)
            if rng.random() < 0.5:
                free[node] = rng.randint(0, 8)
            else:
                busy[node] = rng.randint(0, 3)
            gpus = rng.choice((1, 2, 4, 8, 12, 16))
            got = rule.place(topo, free, busy, [], Job(1, 0.0, gpus, 1.0))
            assert got == bounded_placement(topo, free, busy, gpus, None, 1.0, caps)
    assert 0 < len(rule._memo) <= MEMO_SIZE


def test_bounded_memo_tells_apart_states_that_differ_only_in_busy_ness() -> None:
    topo = from_spec("3x8")
    rule = Bounded()
    free = [4, 4, 4]
    job = Job(1, 0.0, 2, 1.0)
    # FA-FFP: the busiest node that holds the job whole
    assert rule.place(topo, free, [0, 2, 1], [], job) == Placement(((1, 2),))
    assert rule.place(topo, free, [3, 2, 1], [], job) == Placement(((0, 2),))
    assert rule.place(topo, free, [0, 2, 1], [], job) == Placement(((1, 2),))


NOW = 10_000.0


def _running(job: Job, node: int, *, attained: float, start: float = 0.0) -> RunningJob:
    return RunningJob(
        job=job,
        placement=Placement(((node, job.num_gpus),)),
        start_time=start,
        remaining_s=1e6,
        rate=1.0,
        attained_gpu_s=attained,
        since=NOW,
    )


def _state(t: float, running: list[RunningJob], pending: list[Job], nodes: int = 1) -> ClusterState:
    topo = from_spec(f"{nodes}x8")
    free = [8] * nodes
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    return ClusterState(
        time=t,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(PendingJob(j, remaining_s=j.duration) for j in pending),
    )


def test_a_job_whose_service_crossed_the_threshold_is_demoted_and_preempted() -> None:
    a, b = Job(1, 0.0, 8, 1e6), Job(2, 10.0, 8, 1e6)
    policy = heur.tiresias_las()
    # a entered queue 0 first: it keeps the node, b waits behind it
    early = policy.decide(_state(NOW, [_running(a, 0, attained=8 * 100.0)], [b]))
    assert early.is_wait
    assert early.wake_at == NOW + (3250.0 - 800.0) / 8  # when a crosses 3,250 GPU-s
    # later, a's attained service is past the threshold: it goes to queue 1, b comes first
    later = policy.decide(_state(NOW + 400.0, [_running(a, 0, attained=3300.0)], [b]))
    assert later.preempt == (1,) and [s.job_id for s in later.starts] == [2]


def test_a_second_decision_at_the_same_instant_starts_from_the_queues_before() -> None:
    jobs = [Job(i, float(i), 4, 1e6) for i in range(1, 6)]
    first = _state(NOW, [_running(jobs[0], 0, attained=100.0)], jobs[1:3], nodes=2)
    at_t = _state(
        NOW + 50.0,
        [_running(jobs[0], 0, attained=4000.0), _running(jobs[1], 1, attained=10.0)],
        [jobs[2], jobs[3], jobs[4]],
        nodes=2,
    )
    again = _state(
        NOW + 50.0,
        [_running(jobs[0], 0, attained=4000.0)],
        [jobs[1], jobs[2], jobs[3], jobs[4]],
        nodes=2,
    )
    twice = heur.tiresias_consolidated(min_run_s=0.0)
    twice.decide(first)
    twice.decide(at_t)  # a round at NOW + 50 ...
    redo = twice.decide(again)  # ... decided again at the same instant on another state
    once = heur.tiresias_consolidated(min_run_s=0.0)
    once.decide(first)
    assert redo == once.decide(again)
    assert twice.decide(again) == redo  # and a third time, the same


def test_settle_reads_the_state_it_is_given_not_the_one_ranked() -> None:
    order = Las()
    a = Job(1, 0.0, 8, 1e6)
    ranked = _state(NOW, [_running(a, 0, attained=100.0)], [])
    moved = _state(NOW, [_running(a, 0, attained=2000.0)], [])
    order.rank(ranked, ranked.running, ranked.pending, 1.0)
    assert order.settle(moved, {1}) == NOW + (3250.0 - 2000.0) / 8
    order.rank(ranked, ranked.running, ranked.pending, 1.0)
    assert order.settle(ranked, {1}) == NOW + (3250.0 - 100.0) / 8
