"""Rows for running jobs in the decision problem: preempt and migrate moves, their mask
(preemptable jobs only, never within the minimum run time, never while draining), decoding,
the local stepping against the simulator's, log matching and a preemptive heuristic's
rollout."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from linkwise.cluster import mdp
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
    TransitJob,
)
from linkwise.cluster.env import ClusterEnv, Workload
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.rollouts import RolloutTask, Window, rollout
from linkwise.models.learned import LearnedPolicy
from linkwise.policies.spec import PolicySpec

MODEL = AnalyticModel(load_calibration(None))
TOPO = from_spec("4x8,leaf=2")
RUN = mdp.MdpConfig(k_slots=4, running_slots=3, min_run_s=600.0)


def _job(i: int, gpus: int, submit: float = 0.0, duration: float = 50_000.0) -> Job:
    return Job(i, submit, gpus, duration, profile="bert", pred_s=20_000.0, pred_hi_s=60_000.0)


def _run(job: Job, placement: Placement, start: float) -> RunningJob:
    return RunningJob(job, placement, start, job.duration, 1.0, 0.0, 0, start)


def _state(running: list[RunningJob], time: float = 10_000.0, **kw: object) -> ClusterState:
    free = [n.gpus for n in TOPO.nodes]
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    return ClusterState(time, TOPO, tuple(free), tuple(running), (), **kw)  # type: ignore[arg-type]


def _ids(share: float) -> tuple[int, int]:
    """A job id preemptable under ``share`` and one that is not (the hash decides)."""
    yes = next(i for i in range(1, 1000) if mdp.preemptable(i, share))
    no = next(i for i in range(1, 1000) if not mdp.preemptable(i, share))
    return yes, no


def test_running_rows_are_off_by_default_and_leave_the_spec_unchanged() -> None:
    base = mdp.make_spec()
    assert not set(mdp.config.RUNNING_FIELDS) & set(mdp.MdpConfig().to_json())
    inert = mdp.MdpConfig(preempt_share=0.5, min_run_s=5.0, migrate=False, restart_cost="0")
    assert mdp.make_spec(inert).version == base.version
    spec = mdp.make_spec(RUN)
    assert spec.version != base.version
    p = RUN.n_candidates
    assert RUN.n_actions == 4 * p + 3 * (1 + p) + 1 and RUN.wait_action == RUN.n_actions - 1
    assert mdp.make_spec(replace(RUN, migrate=False)).n_actions == 4 * p + 3 + 1
    assert "r2.slowdown" in spec.feature_names and f"r0.{RUN.generators[0]}.feasible" in (
        spec.feature_names
    )
    assert mdp.make_spec(replace(RUN, preempt_share=0.5)).version != spec.version
    assert mdp.ObsSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="row network"):
        mdp.obs_layout(spec)
    with pytest.raises(ValueError, match="min_run_s"):
        mdp.MdpConfig(running_slots=2, min_run_s=0.0)
    with pytest.raises(ValueError, match="preempt_share"):
        mdp.MdpConfig(running_slots=2, preempt_share=1.5)
    with pytest.raises(ValueError, match="restart cost"):
        mdp.MdpConfig(running_slots=2, restart_cost="soon")


def test_only_preemptable_jobs_past_their_minimum_run_time_get_rows() -> None:
    share = 0.5
    yes, no = _ids(share)
    recent = next(i for i in range(yes + 1, 2000) if mdp.preemptable(i, share) and i != no)
    draining = _job(999, 8)
    state = _state(
        [
            _run(_job(yes, 8), Placement.of([(0, 8)]), start=1000.0),
            _run(_job(no, 8), Placement.of([(1, 8)]), start=1000.0),  # not preemptable
            _run(_job(recent, 8), Placement.of([(2, 8)]), start=9_700.0),  # ran 300 s < 600 s
        ],
        transit=(TransitJob(draining, Placement.of([(3, 4)]), None, 10_030.0),),
    )
    cfg = replace(RUN, preempt_share=share)
    c = mdp.candidates(state, cfg, MODEL)
    assert c.running is not None and [r.job.job_id for r in c.running.slots] == [yes]
    pre = c.mask[cfg.preempt_offset : cfg.migrate_offset]
    assert pre.tolist() == [True, False, False]
    assert mdp.decode(c, cfg.preempt_offset) == Decision(preempt=(yes,))
    with pytest.raises(mdp.InvalidAction):
        mdp.decode(c, cfg.preempt_offset + 1)
    assert c.preempt_action(no) is None and c.preempt_action(recent) is None
    assert c.preempt_action(draining.job_id) is None  # draining: no longer running, no row
    # every job with share 1, none with share 0
    everyone = mdp.candidates(state, replace(cfg, preempt_share=1.0), MODEL)
    assert everyone.running is not None
    assert {r.job.job_id for r in everyone.running.slots} == {yes, no}
    nobody = mdp.candidates(state, replace(cfg, preempt_share=0.0), MODEL)
    assert not nobody.mask[cfg.n_start_actions : cfg.wait_action].any()
    # the same job a little later is past its minimum run time
    later = mdp.candidates(replace(state, time=10_400.0), cfg, MODEL)
    assert later.running is not None
    assert {r.job.job_id for r in later.running.slots} == {yes, recent}


def test_migrate_rows_decode_to_other_placements_on_free_or_own_gpus() -> None:
    split = _run(_job(1, 8), Placement.of([(0, 4), (2, 4)]), start=0.0)  # one node would do
    small = _run(_job(2, 4), Placement.of([(1, 4)]), start=0.0)
    state = _state([split, small])
    c = mdp.candidates(state, RUN, MODEL)
    assert c.running is not None
    runs = {r.job.job_id: r for r in c.running.slots}
    assert set(runs) == {1, 2}
    assert c.running.slowdown[[r.job.job_id for r in c.running.slots].index(1)] > 0
    moves = [
        mdp.decode(c, a).migrate[0]
        for a in np.flatnonzero(c.mask[RUN.migrate_offset : RUN.wait_action]) + RUN.migrate_offset
    ]
    assert moves
    for move in moves:
        run = runs[move.job_id]
        assert move.placement != run.placement and move.placement.num_gpus == run.job.num_gpus
        own = dict(run.placement.alloc)
        assert all(g <= state.free_gpus[n] + own.get(n, 0) for n, g in move.placement.alloc)
    # a consolidated target for the split job is offered (one node holds it)
    assert any(m.job_id == 1 and m.placement.num_nodes == 1 for m in moves)


@pytest.mark.parametrize("restart", ["sia", "0"])
def test_local_stepping_matches_the_simulator(restart: str) -> None:
    """After a preemption or a migration, the state the stepping loop builds is the state
    the simulator shows (free GPUs, running, draining and pending jobs)."""
    cfg = replace(RUN, restart_cost=restart)
    model = RestartModel.sia() if restart == "sia" else RestartModel.free()
    jobs = [_job(1, 16), _job(2, 4), _job(3, 8, submit=5_000.0, duration=100.0)]
    for pick in ("preempt", "migrate"):
        sim = Simulator(TOPO, jobs, MODEL, SimConfig(restart=model))
        sim.apply(
            Decision(
                starts=(Start(1, Placement.of([(0, 8), (2, 8)])), Start(2, Placement.of([(1, 4)])))
            )
        )
        while sim.time < 5_000.0:
            sim.advance()
        state = sim.observe()
        c = mdp.candidates(state, cfg, MODEL)
        lo, hi = (
            (cfg.preempt_offset, cfg.migrate_offset)
            if pick == "preempt"
            else (cfg.migrate_offset, cfg.wait_action)
        )
        a = lo + int(np.flatnonzero(c.mask[lo:hi])[0])
        decision = mdp.decode(c, a)
        local = mdp.apply_decision(state, decision, MODEL, model.grace_s)
        sim.apply(decision)
        real = sim.observe()
        assert local.free_gpus == real.free_gpus
        assert {r.job.job_id for r in local.running} == {r.job.job_id for r in real.running}
        assert {p.job.job_id for p in local.pending} == {p.job.job_id for p in real.pending}
        assert {t.job.job_id for t in local.transit} == {t.job.job_id for t in real.transit}
        assert {r.job.job_id: r.placement for r in local.running} == {
            r.job.job_id: r.placement for r in real.running
        }


def test_decide_by_steps_gathers_preemptions_the_simulator_applies() -> None:
    """A step policy that preempts what it may and then waits: one Decision with the
    preemptions; the simulator drains them and counts them."""
    cfg = RUN

    def act(obs: mdp.FloatArray, mask: mdp.BoolArray) -> int:
        rows = np.flatnonzero(mask[cfg.preempt_offset : cfg.migrate_offset])
        return cfg.preempt_offset + int(rows[0]) if len(rows) else cfg.wait_action

    jobs = [_job(1, 8), _job(2, 8), _job(3, 8, submit=5_000.0, duration=100.0)]
    sim = Simulator(TOPO, jobs, MODEL)
    sim.apply(Decision(starts=(Start(1, Placement.of([(0, 8)])), Start(2, Placement.of([(1, 8)])))))
    while sim.time < 5_000.0:
        sim.advance()
    policy = mdp.MdpPolicy(act, mdp.make_spec(cfg), MODEL)
    decision = policy.decide(sim.observe())
    assert sorted(decision.preempt) == [1, 2] and not decision.starts and not decision.migrate
    sim.apply(decision)
    assert {t.job.job_id for t in sim.observe().transit} == {1, 2}


def test_decision_steps_match_preemptions_migrations_and_starts() -> None:
    split = _run(_job(1, 16), Placement.of([(0, 8), (2, 8)]), start=0.0)
    other = _run(_job(2, 4), Placement.of([(1, 4)]), start=0.0)
    state = replace(_state([split, other]), pending=(PendingJob(_job(3, 4, 9_000.0), 50_000.0),))
    spec = mdp.make_spec(RUN)
    c = mdp.candidates(state, RUN, MODEL)
    target = mdp.decode(c, _first(c, RUN.migrate_offset, RUN.wait_action, job=1)).migrate[0]
    moved = mdp.apply_decision(state, Decision(preempt=(2,), migrate=(target,)), MODEL, 30.0)
    start = mdp.candidates(moved, RUN, MODEL).start_for(0)
    decision = Decision(starts=(start,), preempt=(2,), migrate=(target,))
    steps = mdp.decision_steps(state, decision, spec, MODEL)
    assert [m.kind for _, m in steps] == ["preempt", "migrate", "exact", "wait"]
    assert steps[2][1].job_id == 3
    assert steps[0][1].action == steps[0][0].preempt_action(2)
    for cands, m in steps:
        assert cands.mask[m.action]
    # without running rows, preemptions and migrations are left out, as before
    plain = mdp.decision_steps(state, decision, mdp.make_spec(mdp.MdpConfig(k_slots=4)), MODEL)
    assert [m.job_id for _, m in plain] == [3, None]


def _first(c: mdp.Candidates, lo: int, hi: int, job: int) -> int:
    assert c.running is not None
    for a in np.flatnonzero(c.mask[lo:hi]) + lo:
        if mdp.decode(c, int(a)).migrate[0].job_id == job:
            return int(a)
    raise AssertionError(f"no migrate row for job {job}")


def test_a_preemptive_heuristic_rollout_yields_matched_preemptions() -> None:
    """Tiresias-LAS demotes the two long jobs and preempts them for the newcomers: with
    running rows its preemptions are matched actions, without them they are not in the
    data (the adapter counts them as ignored)."""
    jobs = tuple(
        Job(i, 0.0 if i < 2 else 600.0 + 300 * i, 8, 20_000.0 if i < 2 else 3_000.0)
        for i in range(6)
    )
    window = Window(0, 0.0, 3600.0, jobs)
    topo = from_spec("2x8")

    def run(cfg: mdp.MdpConfig) -> Counter[str]:
        task = RolloutTask(
            PolicySpec.parse("tiresias_las"), 0.0, 0, window, topo, config=cfg, block_s=0.0
        )
        df = rollout(task)
        assert df["terminal"].to_list()[-1]
        masks = np.array(df["mask"].to_list(), dtype=bool)
        assert masks[np.arange(df.height), df["action"].to_numpy()].all()
        pre = df.filter(df["match"] == "preempt")["action"].to_numpy()
        assert ((pre >= cfg.preempt_offset) & (pre < cfg.migrate_offset)).all()
        return Counter(df["match"])

    assert run(mdp.MdpConfig(k_slots=4))["preempt"] == 0
    assert run(mdp.MdpConfig(k_slots=4, running_slots=2, min_run_s=60.0))["preempt"] > 0


@dataclass(frozen=True)
class _Preempts:
    """A policy that asks to preempt fixed jobs (a test double for the adapter's matching)."""

    jobs: tuple[int, ...]
    name: str = "preempts"

    def decide(self, state: ClusterState) -> Decision:
        return Decision(preempt=self.jobs)


def test_adapter_expresses_what_it_can_and_counts_the_rest() -> None:
    share = 0.5
    yes, no = _ids(share)
    state = _state(
        [
            _run(_job(yes, 8), Placement.of([(0, 8)]), start=1000.0),
            _run(_job(no, 8), Placement.of([(1, 8)]), start=1000.0),
        ]
    )
    cfg = replace(RUN, preempt_share=share)
    adapter = mdp.StepPolicyAdapter(_Preempts((no, yes)))
    c = mdp.candidates(state, cfg, MODEL)
    assert adapter.act(c) == c.preempt_action(yes)
    assert adapter.matches[-1].kind == "preempt" and adapter.ignored_preemptions == 1
    plain = mdp.StepPolicyAdapter(_Preempts((no, yes)))
    off = mdp.candidates(state, mdp.MdpConfig(k_slots=4), MODEL)
    assert plain.act(off) == off.config.wait_action and plain.ignored_preemptions == 2


def test_env_steps_through_preemptions_and_migrations() -> None:
    rng = np.random.default_rng(0)
    jobs = [
        Job(
            i,
            float(rng.uniform(0, 3000)),
            int(rng.choice([1, 2, 4, 8, 12])),
            float(rng.uniform(500, 4000)),
            profile="bert",
            pred_s=1500.0,
            pred_hi_s=4000.0,
        )
        for i in range(30)
    ]
    cfg = mdp.MdpConfig(k_slots=4, running_slots=3, min_run_s=120.0)
    env = ClusterEnv(lambda _s: Workload(TOPO, jobs, MODEL), mdp.make_spec(cfg))
    obs, info = env.reset(seed=0)
    moves = Counter[str]()
    done = False
    while not done:
        mask = info["action_mask"]
        allowed = np.flatnonzero(mask)
        if info["running"] == 0 and len(allowed) > 1:
            allowed = allowed[allowed != cfg.wait_action]
        a = int(rng.choice(allowed))
        d = mdp.decode(env.candidates, a)
        moves.update(["preempt"] * len(d.preempt) + ["migrate"] * len(d.migrate))
        obs, _, term, trunc, info = env.step(a)
        assert env.observation_space.contains(obs)
        done = term or trunc
    assert term and moves["preempt"] > 0 and moves["migrate"] > 0
    records = env.simulator.records
    assert sum(r.preemptions for r in records) == moves["preempt"]
    # (a job migrated, then preempted, comes back from the queue without its migration count)
    assert 0 < sum(r.migrations for r in records) <= moves["migrate"]


def _fixed(spec: mdp.ObsSpec, values: np.ndarray) -> LearnedPolicy:
    """A learned policy whose network scores every observation with ``values``."""
    import torch

    net = torch.nn.Linear(spec.dim, spec.n_actions)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.from_numpy(values.astype(np.float32)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
        traced: Any = torch.jit.trace(net.eval(), torch.zeros(1, spec.dim))  # type: ignore[no-untyped-call]
    return LearnedPolicy(network=traced, spec=spec, model=MODEL)


def test_learned_policy_decodes_running_rows_and_its_guard_only_starts() -> None:
    cfg = replace(RUN, k_slots=2)
    spec = mdp.make_spec(cfg)
    running = [
        _run(_job(1, 8), Placement.of([(0, 8)]), start=0.0),
        _run(_job(2, 4), Placement.of([(1, 4)]), start=0.0),
    ]
    state = replace(_state(running), pending=(PendingJob(_job(3, 4, 9_000.0), 50_000.0),))
    values = np.zeros(spec.n_actions)
    values[cfg.preempt_offset : cfg.migrate_offset] = 3.0  # preempt first
    values[cfg.wait_action] = 2.0
    policy = _fixed(spec, values)
    policy.guard = "off"
    decision = policy.decide(state)
    assert sorted(decision.preempt) == [1, 2] and not decision.starts and not decision.migrate
    assert policy.decide_explained(state)[0] == decision
    # a strict guard turns the model's wait into a start, never into a preemption
    values[cfg.preempt_offset : cfg.migrate_offset] = -1.0
    strict = _fixed(spec, values)
    strict.guard = "strict"
    guarded = strict.decide(state)
    assert [s.job_id for s in guarded.starts] == [3] and not guarded.preempt
    assert strict.decide_explained(state)[0] == guarded


def test_preemptable_share_is_deterministic_and_about_the_share() -> None:
    for share in (0.1, 0.5, 0.9):
        picked = [i for i in range(10_000) if mdp.preemptable(i, share)]
        assert abs(len(picked) / 10_000 - share) < 0.03
        assert picked == [i for i in range(10_000) if mdp.preemptable(i, share)]
    assert all(mdp.preemptable(i, 1.0) for i in range(100))
    assert not any(mdp.preemptable(i, 0.0) for i in range(100))


def test_preempt_rows_without_migrate_rows() -> None:
    cfg = replace(RUN, migrate=False)
    spec = mdp.make_spec(cfg)
    state = _state([_run(_job(1, 8), Placement.of([(0, 8)]), start=0.0)])
    c = mdp.candidates(state, cfg, MODEL)
    assert cfg.n_migrate == 0 and cfg.migrate_offset == cfg.wait_action
    assert c.mask[cfg.preempt_offset : cfg.wait_action].tolist() == [True, False, False]
    assert mdp.decode(c, cfg.preempt_offset) == Decision(preempt=(1,))
    assert mdp.encode(c, spec).shape == (spec.dim,)
    assert not any(".best_fit." in n for n in spec.feature_names if n.startswith("r"))
