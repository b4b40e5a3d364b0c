"""Credit over hours (datasets/credit.py, datasets/credit_buffer.py): on a hand-made episode
the picker's discounts are gamma ** (dt / horizon) (1 between the steps of one decision
point), n-step rewards and next observations (both parts of a masked observation) are right,
the episode's end is a terminal (no bootstrap) or a cut (bootstrap from its last step), the
episode-mean baseline makes the rewards sum to zero, the step discount reproduces d3rlpy's
own pickers, and a masked DiscreteCQL trains with the new settings, which are logged."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest

from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.datasets.credit import Credit, credit_target, episode_rate, step_dts
from linkwise.datasets.credit_buffer import (
    CreditedEpisode,
    CreditPicker,
    TimedEpisode,
    with_credit,
)
from linkwise.datasets.export import to_mdp_dataset
from linkwise.datasets.transitions import TransitionBuffer
from linkwise.models.training import AlgoConfig, TrainConfig, build_algo, fit, flatten_params

SPEC = make_spec(MdpConfig(k_slots=2))
A = SPEC.n_actions
WAIT = SPEC.config.wait_action
# one episode: a start and a wait at t=0 (until 600), a start and a wait at 600 (until 2400),
# a wait until 3000, a last wait; a wait's reward is minus the jobs-in-system integral
TIMES = [0.0, 0.0, 600.0, 600.0, 2400.0, 3000.0]
REWARDS = [0.0, -2.0, 0.0, -6.0, -1.0, -0.5]
ACTIONS = [0, WAIT, 1, WAIT, WAIT, WAIT]


def frame(terminal: bool, episodes: int = 1, seed: int = 0) -> pl.DataFrame:
    """``episodes`` copies of the hand-made episode; observation i is all ``i`` (+ episode)."""
    rng = np.random.default_rng(seed)
    buf = TransitionBuffer(SPEC.version)
    for e in range(episodes):
        for i, (t, r, a) in enumerate(zip(TIMES, REWARDS, ACTIONS, strict=True)):
            mask = rng.random(A) < 0.5
            mask[[a, WAIT]] = True
            buf.add(episode=f"rollout/hand/w{e}", step=i, time=t,
                    obs=np.full(SPEC.dim, i + 10 * e, np.float32), action=a, reward=r,
                    mask=mask, source="rollout", behaviour="hand", match="policy")  # fmt: skip
        buf.end_episode(terminal=terminal)
    return buf.to_frame()


def episode(terminal: bool) -> Any:
    (ep,) = to_mdp_dataset(frame(terminal), SPEC, masks=True).episodes
    return ep


def test_episodes_carry_their_times_and_rate() -> None:
    ep = episode(True)
    assert isinstance(ep, TimedEpisode)
    np.testing.assert_allclose(ep.dts, [0, 600, 0, 1800, 600, 0])
    assert ep.rate == pytest.approx(-9.0 / 3000.0)  # the last step's dt is unknown
    np.testing.assert_allclose(step_dts(np.array([5.0, 3.0, 7.0])), [0.0, 4.0, 0.0])


def test_time_discount_is_gamma_per_horizon() -> None:
    picker = CreditPicker(Credit(gamma=0.5, discount="time", horizon_s=600.0))
    ep = episode(False)
    got = [picker(ep, i) for i in range(ep.transition_count)]
    assert [t.interval for t in got] == pytest.approx([0.0, 1.0, 0.0, 3.0, 1.0])
    assert [float(t.reward[0]) for t in got] == REWARDS[:5]  # one step: no discount inside
    gammas = [0.5**t.interval for t in got]
    assert gammas == pytest.approx([1.0, 0.5, 1.0, 0.125, 0.5])


def test_n_step_rewards_next_observations_and_the_end() -> None:
    credit = Credit(gamma=0.5, discount="time", horizon_s=600.0, n_step=3)
    ends = episode(True)
    t1 = CreditPicker(credit)(ends, 1)  # steps 1, 2, 3: dt 600, 0, 1800
    assert float(t1.reward[0]) == pytest.approx(-2.0 + 0.5 * 0.0 + 0.5 * -6.0)
    assert t1.interval == pytest.approx(2400 / 600)
    assert t1.terminal == 0.0
    assert t1.next_observation[0][0] == 4  # features and the mask of step 4
    np.testing.assert_array_equal(t1.next_observation[1], ends.observations[1][4])
    t4 = CreditPicker(credit)(ends, 4)  # steps 4, 5, then the episode ended
    assert t4.terminal == 1.0
    assert float(t4.reward[0]) == pytest.approx(-1.0 + 0.5 * -0.5)
    assert not any(part.any() for part in t4.next_observation)
    cut = episode(False)  # a cut episode bootstraps from its last step, never past it
    assert cut.transition_count == 5
    t3 = CreditPicker(credit)(cut, 3)
    assert t3.terminal == 0.0 and t3.next_observation[0][0] == 5
    assert float(t3.reward[0]) == pytest.approx(-6.0 + 0.125 * -1.0)
    assert t3.interval == pytest.approx(2400 / 600)


def test_step_discount_reproduces_d3rlpys_pickers() -> None:
    from d3rlpy.dataset import BasicTransitionPicker, MultiStepTransitionPicker

    for terminal in (True, False):
        ep = episode(terminal)
        for n, theirs in ((1, BasicTransitionPicker()), (3, MultiStepTransitionPicker(3, 0.9))):
            mine = CreditPicker(Credit(gamma=0.9, n_step=n))
            for i in range(ep.transition_count):
                a, b = mine(ep, i), theirs(ep, i)
                assert float(a.reward[0]) == pytest.approx(float(b.reward[0]))
                assert (a.interval, a.terminal) == (b.interval, b.terminal)
                for x, y in zip(a.next_observation, b.next_observation, strict=True):
                    np.testing.assert_array_equal(x, y)


def test_the_episode_mean_baseline_sums_to_zero() -> None:
    ep = episode(True)
    one = Credit(gamma=1.0, baseline="episode_mean")
    got = [credit_target(ep.rewards, ep.dts, ep.rate, True, i, one) for i in range(6)]
    assert sum(t.reward for t in got[:-1]) == pytest.approx(0.0, abs=1e-9)
    assert got[-1].reward == pytest.approx(-0.5)  # the last dt is unknown: left as it is
    assert got[0].reward == 0.0 and got[2].reward == 0.0  # no time, no baseline
    assert got[1].reward == pytest.approx(-2.0 + 600 * 9 / 3000)
    assert episode_rate(np.zeros(3), np.zeros(3)) == 0.0


def test_precomputed_targets_equal_the_picker_on_the_fly() -> None:
    credit = Credit(gamma=0.8, discount="time", horizon_s=900.0, n_step=2, baseline="episode_mean")
    picker = CreditPicker(credit)
    for terminal in (True, False):
        ds = to_mdp_dataset(frame(terminal), SPEC, masks=True)
        (timed,) = ds.episodes
        (credited,) = with_credit(ds, credit).episodes
        assert isinstance(credited, CreditedEpisode) and credited.credit == credit
        for i in range(timed.transition_count):
            a, b = picker(timed, i), picker(credited, i)
            assert (float(a.reward[0]), a.interval, a.terminal) == (
                float(b.reward[0]), b.interval, b.terminal)  # fmt: skip


def test_default_credit_leaves_the_dataset_and_bad_settings_are_refused() -> None:
    ds = to_mdp_dataset(frame(True), SPEC, masks=True)
    assert with_credit(ds, AlgoConfig().credit()) is ds
    assert AlgoConfig().credit() == Credit(gamma=0.99)
    for bad in ({"discount": "hours"}, {"n_step": 0}, {"reward_baseline": "mean"},
                {"horizon_s": 0.0}):  # fmt: skip
        with pytest.raises(ValueError):
            AlgoConfig(**bad)
    with pytest.raises(TypeError, match="carry times"):
        from d3rlpy.dataset import MDPDataset

        plain = MDPDataset(np.zeros((4, 2), np.float32), np.zeros(4, np.int64),
                           np.zeros(4, np.float32), np.array([0, 0, 0, 1], np.float32))  # fmt: skip
        with_credit(plain, Credit(n_step=2))


def test_cql_trains_with_time_discount_and_n_step_and_logs_them() -> None:
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory

    cfg = TrainConfig.from_mapping(
        {
            "algo": "cql",
            "train": {"n_steps": 10, "n_steps_per_epoch": 5, "batch_size": 16,
                      "hidden_units": [16], "target_update_interval": 5, "discount": "time",
                      "horizon_s": 1200, "n_step": 3, "reward_baseline": "episode_mean"},
            "dataset": {"path": "unused.parquet"},
        }
    )  # fmt: skip
    params = flatten_params(cfg.to_json())
    assert params["params.discount"] == "time" and params["params.n_step"] == "3"
    assert params["params.reward_baseline"] == "episode_mean"
    ds = to_mdp_dataset(frame(True, episodes=4), SPEC, masks=True)
    credited = with_credit(ds, cfg.params.credit())
    batch = credited.sample_transition_batch(64)
    assert set(np.round(batch.intervals.ravel(), 6)) <= {0.0, 0.5, 2.0}
    assert batch.intervals.dtype == np.float32 and (batch.intervals % 1 != 0).any()
    d3rlpy.seed(0)
    algo = build_algo("cql", cfg.params, "cpu:0")
    import torch

    seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = fit(algo, ds, cfg.params, evaluators={}, adapter=NoopAdapterFactory(),
                  callback=lambda *_: seen.append(torch.get_num_threads()))  # fmt: skip
        assert torch.get_num_threads() == 2  # the caller's threads restored
    finally:
        torch.set_num_threads(before)
    assert len(out) == 2 and np.isfinite(out[-1][1]["loss"])
    assert seen and set(seen) == {1}  # trained on one thread
