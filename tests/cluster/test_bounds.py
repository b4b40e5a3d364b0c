"""Lower bounds of the total JCT: checked against brute force on tiny instances and against
every heuristic in the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from linkwise.cluster.bounds import isolated_total, pooled_srpt_total, queue_bound
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.heuristics import make_policy, policy_names


def _jobs(rows: list[tuple[float, int, float]]) -> list[Job]:
    return [Job(i, submit, gpus, dur) for i, (submit, gpus, dur) in enumerate(rows)]


def _best_nonpreemptive_total(jobs: list[Job], capacity: int, horizon: int) -> float:
    """The smallest total JCT over every schedule with integer start times (all start times
    up to ``horizon`` tried; GPUs pooled, no placement constraint: a relaxation of a real
    cluster, so a valid bound of it is a bound of this)."""
    best = float("inf")
    ranges = [range(int(j.submit_time), horizon + 1) for j in jobs]
    for starts in itertools.product(*ranges):
        end = max(s + int(j.duration) for s, j in zip(starts, jobs, strict=True))
        use = np.zeros(end + 1, dtype=int)
        for s, j in zip(starts, jobs, strict=True):
            use[s : s + int(j.duration)] += j.num_gpus
        if use.max() > capacity:
            continue
        total = sum(s + j.duration - j.submit_time for s, j in zip(starts, jobs, strict=True))
        best = min(best, total)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_bound_never_exceeds_the_best_schedule_found_by_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(2, 5))
    n = int(rng.integers(2, 5))
    rows = [
        (float(rng.integers(0, 4)), int(rng.integers(1, capacity + 1)), float(rng.integers(1, 4)))
        for _ in range(n)
    ]
    jobs = _jobs(rows)
    best = _best_nonpreemptive_total(jobs, capacity, horizon=14)
    assert queue_bound(jobs, capacity) <= best + 1e-9


def test_the_bound_is_tight_where_the_machine_is_the_cluster() -> None:
    # jobs that each need every GPU: the cluster is one machine, SRPT (shortest first) is optimal
    jobs = _jobs([(0.0, 4, 3.0), (0.0, 4, 1.0), (0.0, 4, 2.0)])
    best = _best_nonpreemptive_total(jobs, 4, horizon=8)
    assert pooled_srpt_total(jobs, 4) == pytest.approx(best) == pytest.approx(1 + 3 + 6)
    # one small job alone: only its run time counts
    alone = _jobs([(5.0, 1, 7.0)])
    assert queue_bound(alone, 8) == isolated_total(alone) == 7.0


def test_queueing_raises_the_bound_above_the_isolated_one() -> None:
    burst = _jobs([(0.0, 2, 10.0)] * 6)  # 120 GPU-seconds on 4 GPUs
    assert pooled_srpt_total(burst, 4) > isolated_total(burst)
    with pytest.raises(ValueError, match="more GPUs"):
        pooled_srpt_total(_jobs([(0.0, 9, 1.0)]), 8)


@pytest.mark.parametrize("policy", policy_names())
def test_no_heuristic_beats_the_bound_in_the_simulator(policy: str) -> None:
    topo = from_spec("2x4,leaf=2")
    rng = np.random.default_rng(7)
    jobs = [
        Job(
            i,
            float(rng.uniform(0, 3600)),
            int(rng.choice([1, 1, 2, 4, 8])),
            float(rng.uniform(60, 3600)),
        )
        for i in range(40)
    ]
    cal = load_calibration()
    jobs = list(assign_profiles(jobs, cal, seed=0))
    result = simulate(topo, jobs, AnalyticModel(cal), make_policy(policy))
    total = sum(r.jct for r in result.records)
    assert len(result.records) == len(jobs)
    assert total >= queue_bound(jobs, topo.total_gpus) - 1e-6
