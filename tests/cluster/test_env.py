"""The Gymnasium environment over the simulator."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from linkwise.cluster import mdp
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job
from linkwise.cluster.env import ClusterEnv, Workload
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.heuristics import make_policy

CAL = Calibration(
    profiles={
        "light": CommProfile("light", compute_s=0.3, grad_gb=0.01),
        "heavy": CommProfile("heavy", compute_s=0.1, grad_gb=1.0),
    },
    alpha=0.3,
    overhead_s=0.001,
    mix={"light": 1.0, "heavy": 1.0},
)
MODEL = AnalyticModel(CAL)
TOPO = from_spec("4x8,leaf=2,oversub=2")


def factory(seed: int, n: int = 25, tick_s: float | None = None) -> Workload:
    rng = np.random.default_rng(seed)
    jobs = [
        Job(
            i,
            float(rng.uniform(0, 3000)),
            int(rng.choice([1, 2, 4, 8, 12, 16])),
            float(rng.uniform(100, 2000)),
            profile=str(rng.choice(["light", "heavy"])),
            pred_s=600.0,  # what the observation reads (never the duration)
            pred_hi_s=1800.0,
        )
        for i in range(n)
    ]
    return Workload(TOPO, jobs, MODEL, SimConfig(tick_s=tick_s))


def _episode(env: ClusterEnv, seed: int, rng: np.random.Generator) -> tuple[float, list[float]]:
    """Random allowed actions to the end (wait with probability 1/2, never on an idle cluster,
    which could wait forever); (return, rewards)."""
    obs, info = env.reset(seed=seed)
    rewards: list[float] = []
    done = False
    while not done:
        mask = info["action_mask"]
        assert np.array_equal(mask, env.action_masks())
        assert obs.shape == env.observation_space.shape
        starts = np.flatnonzero(mask[:-1])
        idle = info["running"] == 0
        start = len(starts) > 0 and (idle or rng.random() < 0.5)
        a = int(rng.choice(starts)) if start else len(mask) - 1
        obs, reward, terminated, truncated, info = env.step(a)
        if a != len(mask) - 1:
            assert reward == 0.0  # starts inside a decision point are free
        rewards.append(reward)
        assert not truncated
        done = terminated
    return sum(rewards), rewards


def test_env_passes_gymnasium_checker() -> None:
    env = ClusterEnv(factory, invalid_action="wait")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anything else the checker says fails the test
        warnings.filterwarnings("ignore", message=".*infinity.*")  # unbounded features
        warnings.filterwarnings("ignore", message=".*spec.*")  # not registered with gym.make
        check_env(env)


@pytest.mark.parametrize(("skip_trivial", "tick_s"), [(True, None), (False, None), (True, 300.0)])
def test_return_is_minus_total_jct(skip_trivial: bool, tick_s: float | None) -> None:
    spec = mdp.make_spec(mdp.MdpConfig(time_scale_s=1000.0))
    env = ClusterEnv(lambda s: factory(s, tick_s=tick_s), spec, skip_trivial=skip_trivial)
    for seed in range(3):
        ret, _ = _episode(env, seed, np.random.default_rng(seed))
        records = env.simulator.records
        assert len(records) == 25
        total_jct = sum(r.jct for r in records)
        assert ret == pytest.approx(-total_jct / 1000.0, rel=1e-9)


def test_skipping_trivial_points_shortens_episodes_not_returns() -> None:
    lengths = {}
    for skip in (True, False):
        env = ClusterEnv(factory, skip_trivial=skip)
        _, rewards = _episode(env, 5, np.random.default_rng(1))
        lengths[skip] = len(rewards)
    assert lengths[True] < lengths[False]


def test_contention_weight_lowers_rewards() -> None:
    plain = ClusterEnv(factory, mdp.make_spec())
    weighted = ClusterEnv(factory, mdp.make_spec(mdp.MdpConfig(contention_weight=5.0)))
    r0, _ = _episode(plain, 2, np.random.default_rng(4))
    r1, _ = _episode(weighted, 2, np.random.default_rng(4))
    assert r1 < r0


def test_masked_action_raises_or_waits() -> None:
    env = ClusterEnv(factory)
    _, info = env.reset(seed=0)
    masked = int(np.flatnonzero(~info["action_mask"])[0])
    with pytest.raises(mdp.InvalidAction, match="masked"):
        env.step(masked)
    with pytest.raises(mdp.InvalidAction):
        env.step(env.action_space.n)
    lenient = ClusterEnv(factory, invalid_action="wait")
    lenient.reset(seed=0)
    t0 = lenient.state.time
    _, _, _, _, info = lenient.step(masked)
    assert info["invalid_action"] is True and lenient.state.time > t0
    with pytest.raises(RuntimeError, match="reset"):
        ClusterEnv(factory).step(0)


def test_reset_is_seeded_and_episodes_reproduce() -> None:
    env = ClusterEnv(factory)
    a, ra = _episode(env, 11, np.random.default_rng(0))
    b, rb = _episode(env, 11, np.random.default_rng(0))
    assert a == b and ra == rb
    o1, _ = env.reset(seed=1)
    o2, _ = env.reset(seed=2)
    assert o1.tobytes() != o2.tobytes()


def test_heuristic_through_the_env_matches_its_simulation() -> None:
    env = ClusterEnv(factory, mdp.make_spec(mdp.MdpConfig(slot_order="fitting")))
    adapter = mdp.StepPolicyAdapter(make_policy("best_fit"))
    env.reset(seed=3)
    ret, done = 0.0, False
    while not done:
        _, reward, done, _, _ = env.step(adapter.act(env.candidates))
        ret += reward
    assert adapter.match_rate == 1.0
    assert ret == pytest.approx(-sum(r.jct for r in env.simulator.records) / 3600.0)


def test_max_steps_truncates() -> None:
    env = ClusterEnv(factory, max_steps=3)
    env.reset(seed=0)
    flags = [env.step(env.config.wait_action)[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_waiting_forever_truncates() -> None:
    env = ClusterEnv(
        lambda s: Workload(
            TOPO, [Job(0, 0.0, 4, 100.0, profile="light", pred_s=60.0, pred_hi_s=60.0)], MODEL
        )
    )
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(env.config.wait_action)
    assert (reward, terminated, truncated, info["stalled"]) == (0.0, False, True, True)


def test_jobs_without_predictions_are_refused() -> None:
    """The observation needs run-time predictions, never the true run time."""
    env = ClusterEnv(lambda s: Workload(TOPO, [Job(0, 0.0, 4, 100.0, profile="light")], MODEL))
    with pytest.raises(ValueError, match="run-time predictor"):
        env.reset(seed=0)
