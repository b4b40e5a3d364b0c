"""The learned policy's guard: a model that always prefers "wait" still starts work on an
idle cluster (counted as overrides), never emits a masked action and finishes a whole
simulation instead of stalling it; with the "idle" guard it waits while jobs run, with the
"strict" one it starts whatever fits, with "aging" (the default) it waits while the queued
jobs are young and starts a starving one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.mdp import MdpConfig, MdpPolicy, action_mask, candidates, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import SimulationStalled
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.models.learned import GUARDS, STARVE_S, LearnedPolicy

SPEC = make_spec(MdpConfig(k_slots=4))
MODEL = AnalyticModel(load_calibration(None))
TOPO = from_spec("2x8,leaf=2")


def _job(*args: Any, **kwargs: Any) -> Job:
    """A job with run-time predictions (what the encoder reads instead of its duration)."""
    kwargs.setdefault("pred_s", 600.0)
    kwargs.setdefault("pred_hi_s", 1800.0)
    return Job(*args, **kwargs)


def _wait_lover(
    start_bias: dict[int, float] | None = None, *, guard: str = "idle"
) -> LearnedPolicy:
    """A linear network whose argmax is always "wait" (bias 10), other actions ``start_bias``
    (default -1); weights zero, so the values do not depend on the observation."""
    import torch

    bias = np.full(SPEC.n_actions, -1.0, dtype=np.float32)
    for a, v in (start_bias or {}).items():
        bias[a] = v
    bias[SPEC.config.wait_action] = 10.0
    lin = torch.nn.Linear(SPEC.dim, SPEC.n_actions)
    torch.nn.init.zeros_(lin.weight)
    with torch.no_grad():
        lin.bias.copy_(torch.as_tensor(bias))
    net = torch.jit.trace(lin, torch.zeros(1, SPEC.dim))  # type: ignore[no-untyped-call]
    return LearnedPolicy(net, SPEC, MODEL, "logits", "wait-lover", guard=guard)


@pytest.mark.parametrize("guard", ["idle", "aging"])
def test_idle_cluster_with_fitting_work_starts_the_best_allowed_start(guard: str) -> None:
    p = SPEC.config.n_candidates
    # the second slot's first candidate scores best among the starts
    policy = _wait_lover({p: 5.0}, guard=guard)
    state = Simulator(
        TOPO,
        [_job(1, 0.0, 4, 600.0, profile="bert"), _job(2, 0.0, 2, 600.0, profile="bert")],
        MODEL,
    ).observe()
    assert not state.running
    mask = action_mask(candidates(state, SPEC.config, MODEL))
    assert mask[p] and mask[0]
    decision = policy.decide(state)
    assert [s.job_id for s in decision.starts] == [2]  # one override, then jobs run: wait
    assert policy.wait_overrides == 1


def test_guard_waits_when_a_job_runs() -> None:
    policy = _wait_lover()
    sim = Simulator(
        TOPO,
        [_job(1, 0.0, 8, 600.0, profile="bert"), _job(2, 1.0, 2, 600.0, profile="bert")],
        MODEL,
    )
    first = policy.decide(sim.observe())
    assert [s.job_id for s in first.starts] == [1]
    sim.apply(first)
    assert sim.advance()
    state = sim.observe()
    assert state.running and [pj.job.job_id for pj in state.pending] == [2]
    assert policy.decide(state).starts == ()  # the model waits; something runs: respected
    assert policy.wait_overrides == 1


def test_guard_never_emits_a_masked_action() -> None:
    # huge scores on every action of the empty slots 1..3 (masked): the guard must skip them
    p = SPEC.config.n_candidates
    policy = _wait_lover({a: 9.0 for a in range(p, SPEC.config.wait_action)})
    state = Simulator(TOPO, [_job(1, 0.0, 4, 600.0, profile="bert")], MODEL).observe()
    mask = action_mask(candidates(state, SPEC.config, MODEL))
    assert not mask[p : SPEC.config.wait_action].any()
    decision = policy.decide(state)
    assert [s.job_id for s in decision.starts] == [1]


@pytest.mark.parametrize("guard", ["idle", "aging"])
def test_a_waiting_model_finishes_a_simulation_only_with_the_guard(guard: str) -> None:
    jobs = [_job(i, 60.0 * i, 1 + i % 4, 300.0 + 50 * i, profile="bert") for i in range(1, 13)]
    guarded = _wait_lover(guard=guard)
    result = simulate(TOPO, jobs, MODEL, guarded)
    assert len(result.records) == len(jobs)
    assert guarded.wait_overrides >= 1
    with pytest.raises(SimulationStalled):
        simulate(TOPO, jobs, MODEL, _wait_lover(guard="off"))


def test_guard_holds_where_only_act_is_called() -> None:
    # the benchmark wraps ``act`` in its own MdpPolicy (to count masked actions): still no stall
    jobs = [_job(i, 60.0 * i, 1 + i % 4, 300.0 + 50 * i, profile="bert") for i in range(1, 13)]
    policy = _wait_lover()
    result = simulate(TOPO, jobs, MODEL, MdpPolicy(policy.act, SPEC, MODEL, "probe"))
    assert len(result.records) == len(jobs)
    assert policy.wait_overrides >= 1


def test_strict_guard_starts_whatever_fits_while_jobs_run() -> None:
    jobs = [_job(1, 0.0, 8, 600.0, profile="bert"), _job(2, 1.0, 2, 600.0, profile="bert")]
    sim = Simulator(TOPO, jobs, MODEL)
    strict = _wait_lover(guard="strict")
    sim.apply(strict.decide(sim.observe()))
    assert sim.advance()
    state = sim.observe()
    assert state.running and [pj.job.job_id for pj in state.pending] == [2]
    assert [s.job_id for s in strict.decide(state).starts] == [2]  # no idle GPUs left waiting
    assert strict.wait_overrides == 2
    with pytest.raises(ValueError, match="guard"):
        _wait_lover(guard="sometimes")


def test_strict_guard_never_leaves_a_fitting_job_waiting() -> None:
    jobs = [_job(i, 60.0 * i, 1 + i % 4, 300.0 + 50 * i, profile="bert") for i in range(1, 13)]
    idle_only, strict = _wait_lover(guard="idle"), _wait_lover(guard="strict")
    waits = {}
    for name, policy in (("idle", idle_only), ("strict", strict)):
        recs = simulate(TOPO, jobs, MODEL, policy).records
        waits[name] = sum(r.queue_s for r in recs)
    assert waits["strict"] < waits["idle"]


def _busy_queue(now: float) -> ClusterState:
    """16 GPUs, 8 held by a long job; queued: job 2 (16 GPUs, submitted at 0: never fits
    now), job 3 (2 GPUs, submitted at 0) and job 4 (2 GPUs, submitted an hour before ``now``);
    head slots 0, 1, 2 in that order."""
    running = RunningJob(
        job=_job(1, 0.0, 8, 1e6, profile="bert"),
        placement=Placement.of([(0, 8)]),
        start_time=0.0,
        remaining_s=1e6,
        rate=1.0,
    )
    queued = [
        _job(i, t, g, 600.0, profile="bert")
        for i, t, g in ((2, 0.0, 16), (3, 0.0, 2), (4, now - 3600.0, 2))
    ]
    return ClusterState(
        time=now,
        topology=TOPO,
        free_gpus=(0, 8),
        running=(running,),
        pending=tuple(PendingJob(j, remaining_s=j.duration) for j in queued),
    )


def test_aging_is_the_default_guard() -> None:
    assert GUARDS[0] == "aging" and set(GUARDS) == {"aging", "strict", "idle", "off"}
    assert LearnedPolicy.__dataclass_fields__["guard"].default == "aging"
    assert LearnedPolicy.__dataclass_fields__["starve_s"].default == STARVE_S == 6 * 3600.0
    with pytest.raises(ValueError, match="starve_s"):
        replace(_wait_lover(guard="aging"), starve_s=-1.0)


def test_aging_guard_waits_while_jobs_are_young_and_starts_the_starving_one() -> None:
    p = SPEC.config.n_candidates
    # the young job 4 (slot 2) scores best among the starts; job 2 (slot 0) never fits now
    policy = _wait_lover({2 * p: 5.0}, guard="aging")
    young = _busy_queue(now=STARVE_S - 60.0)
    assert policy.decide(young).starts == ()  # busy cluster, nobody starving: the model waits
    assert policy.wait_overrides == 0
    # job 3 has waited past starve_s: started, although job 4 scores higher and fits too
    old = _busy_queue(now=STARVE_S + 60.0)
    mask = action_mask(candidates(old, SPEC.config, MODEL))
    assert not mask[:p].any() and mask[p] and mask[2 * p]
    assert [s.job_id for s in policy.decide(old).starts] == [3]
    assert policy.wait_overrides == 1
    # strict would have started the best-scoring job instead (both fit)
    strict = _wait_lover({2 * p: 5.0}, guard="strict")
    assert strict.decide(old).starts[0].job_id == 4
    # a longer starve_s: job 3 is not starving yet
    patient = replace(_wait_lover({2 * p: 5.0}, guard="aging"), starve_s=2 * STARVE_S)
    assert patient.decide(old).starts == ()


def test_aging_override_never_picks_a_masked_action() -> None:
    p = SPEC.config.n_candidates
    # huge scores on every action but job 3's first candidate: slot 0 (job 2, starving but
    # too large: all masked), job 3's duplicate candidates (masked), the young job 4's row
    bias = {a: 9.0 for a in range(SPEC.config.wait_action)}
    bias[p] = -1.0
    policy = _wait_lover(bias, guard="aging")
    obs_state = _busy_queue(now=STARVE_S + 60.0)
    cands = candidates(obs_state, SPEC.config, MODEL)
    mask = action_mask(cands)
    from linkwise.cluster.mdp import encode

    obs = encode(cands, SPEC)
    # the model itself prefers wait (10); the override must land on an allowed start of job 3
    a = policy.act(obs, mask)
    assert mask[a] and a != SPEC.config.wait_action and cands.slots[a // p].job.job_id == 3
    # nothing starving has an allowed start: wait is kept
    only_big = replace(obs_state, pending=obs_state.pending[:1])
    assert policy.decide(only_big).starts == ()
