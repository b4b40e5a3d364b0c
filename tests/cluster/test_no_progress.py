"""Issue 32 item 3: a simulation that makes no progress is stopped and named, never run on.

The SRTF ceiling scored a preempted job in the queue without the restore its restart costs,
while a running job's remaining time counts it: a job just restarted lost to the job it had
displaced, which lost to it again once back in the queue, each half-turn a 30 s grace and
no work done (``evaluate --policies backfill,srtf_oracle --warm-start`` ran millions of
steps). The simulator's step budget (``SimConfig.quiet_events``) turns any such livelock into
``NoProgress``, which the benchmark records as the policy's failure on that case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Start
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import NoProgress
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.rollouts import Window
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec

ONE_GPU = from_spec("1x1")
MODEL = AnalyticModel(load_calibration(None))
# bert restores in 120 s (Sia): job 1 is preempted by job 2 with 100 s of work left; when it
# restarts (220 s to run) job 3 (150 s) waits, and job 4's arrival is a decision point
PING_PONG = (
    Job(1, 0.0, 1, 200.0, profile="bert"),
    Job(2, 100.0, 1, 50.0, profile="bert"),
    Job(3, 140.0, 1, 150.0, profile="bert"),
    Job(4, 200.0, 1, 1000.0, profile="bert"),
)


def test_srtf_oracle_finishes_where_restarts_made_it_preempt_back_and_forth() -> None:
    sim = Simulator(ONE_GPU, PING_PONG, MODEL)
    steps = drive(sim, make_policy("srtf_oracle"), max_steps=500)
    assert sim.done, f"still running after {steps} steps at t={sim.time}"
    ends = {r.job.job_id: r.end for r in sim.records}
    assert ends == {2: 180.0, 3: 330.0, 1: 550.0, 4: 1550.0}


def test_a_preempted_job_waits_with_the_restore_its_restart_costs() -> None:
    sim = Simulator(ONE_GPU, PING_PONG[:2], MODEL)
    drive(sim, make_policy("srtf_oracle"), max_steps=3)  # job 2 preempts job 1 at t=100
    state = sim.observe()
    (back,) = [p for p in state.pending if p.job.job_id == 1]
    assert back.preemptions == 1
    assert back.remaining_s == pytest.approx(100.0)
    assert back.restore_s == 120.0


@dataclass(frozen=True)
class _Flapper:
    """Starts the one job, asks to decide again a second later, and preempts it then."""

    name: str = "flapper"

    def decide(self, state: ClusterState) -> Decision:
        if state.running:
            return Decision(preempt=tuple(r.job.job_id for r in state.running))
        starts = tuple(Start(p.job.job_id, Placement.of([(0, 1)])) for p in state.pending)
        return Decision(starts=starts, wake_at=state.time + 1.0)


def test_a_livelock_raises_no_progress_within_the_step_budget() -> None:
    jobs = (Job(1, 0.0, 1, 600.0, profile="bert"),)
    with pytest.raises(NoProgress, match=r"no job arrived or finished in 51 events"):
        simulate(ONE_GPU, jobs, MODEL, _Flapper(), SimConfig(quiet_events=50))


def test_ticks_are_not_counted_against_the_budget() -> None:
    # a long job holds the only GPU; the queued one waits through 10,000 ticks
    jobs = (Job(1, 0.0, 1, 10_000.0, profile="bert"), Job(2, 1.0, 1, 10.0, profile="bert"))
    result = simulate(
        ONE_GPU, jobs, MODEL, make_policy("fifo"), SimConfig(tick_s=1.0, quiet_events=5)
    )
    assert len(result.records) == 2
    assert result.events > 9_000


def test_the_benchmark_names_the_policy_and_case_that_made_no_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import linkwise.evaluation.benchmark as bm

    real = bm.make_bench_policy

    def make(scenario: object, spec: PolicySpec, tracking_uri: str | None = None) -> object:
        return _Flapper() if spec.heuristic == "flapper" else real(scenario, spec, tracking_uri)

    monkeypatch.setattr(bm, "make_bench_policy", make)
    window = Window(3, 0.0, 600.0, (Job(1, 60.0, 1, 100.0),))
    cases = bm.make_cases([window], [1], ONE_GPU, block_s=0.0)
    bench = bm.run_benchmark([PolicySpec.parse("fifo"), PolicySpec(heuristic="flapper")], cases)
    assert bench.policies == ("fifo",)
    (failure,) = bench.failures
    assert (failure.policy, failure.case_id) == ("flapper", "w3/s1")
    assert failure.error.startswith("NoProgress: no job arrived or finished")
    assert math.isfinite(bench.summary()[0]["avg_jct_s"])
