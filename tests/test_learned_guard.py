"""The learned policy's work-conserving guard: a model that always prefers "wait" still
starts work on an idle cluster (counted as overrides), never emits a masked action and
finishes a whole simulation instead of stalling it; with the "idle" guard it waits while jobs
run, with the "strict" one (the default) it starts whatever fits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job
from linkwise.cluster.mdp import MdpConfig, MdpPolicy, action_mask, candidates, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator import SimulationStalled, Simulator, simulate
from linkwise.cluster.topology import from_spec
from linkwise.models.learned import LearnedPolicy

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


def test_idle_cluster_with_fitting_work_starts_the_best_allowed_start() -> None:
    p = SPEC.config.n_candidates
    # the second slot's first candidate scores best among the starts
    policy = _wait_lover({p: 5.0})
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


def test_a_waiting_model_finishes_a_simulation_only_with_the_guard() -> None:
    jobs = [_job(i, 60.0 * i, 1 + i % 4, 300.0 + 50 * i, profile="bert") for i in range(1, 13)]
    guarded = _wait_lover()
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
    assert LearnedPolicy.__dataclass_fields__["guard"].default == "strict"
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
