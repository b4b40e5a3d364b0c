"""Credit over hours: time-aware discounting, n-step returns and a baselined reward.

The reward (``cluster.mdp.step_reward``) is minus the jobs-in-system integral between
decision points, mostly jobs no action can change, while a placement's cost shows over the
job's whole run. Three changes to what a Q-learner's targets see, each off by default
(``Credit()`` is d3rlpy's one-step target with ``gamma`` per step):

- ``discount = "time"``: a transition's discount is ``gamma ** (dt / horizon_s)``, ``dt`` the
  simulated time from this step's decision point to the next one (0 between the steps of
  one decision point), so ``gamma`` is the discount per ``horizon_s`` of simulated time,
  not per step. ``"step"`` is ``gamma`` per step.
- ``n_step``: the target bootstraps ``n_step`` steps ahead; the rewards in between are
  discounted by the same (time-aware or per-step) factor; the episode's end cuts the window
  (a terminal: no bootstrap; a cut episode: bootstrap from its last step).
- ``baseline = "episode_mean"``: each step's reward less ``rate x dt``, ``rate`` the episode's
  mean reward per second over the steps whose ``dt`` is known (all but the last), so those
  baselined rewards sum to zero over the episode: the level set by the jobs already in the
  system, which differs between episodes and no action changes, is removed. The last step's
  ``dt`` (until the episode's end) is not in the data; its reward is left as it is.

This module is the arithmetic (numpy only); ``datasets.credit_buffer`` applies it to d3rlpy
datasets. Evaluation of a learned policy stays on the true JCT in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "BASELINES",
    "DISCOUNTS",
    "Credit",
    "CreditTarget",
    "credit_target",
    "episode_rate",
    "step_dts",
]

DISCOUNTS = ("step", "time")
BASELINES = ("none", "episode_mean")


@dataclass(frozen=True)
class Credit:
    """How rewards are credited: ``discount`` ("step" | "time"), ``gamma`` (per step, or per
    ``horizon_s`` seconds with "time"), ``n_step`` and ``baseline`` ("none" |
    "episode_mean")."""

    gamma: float = 0.99
    discount: str = "step"
    horizon_s: float = 3600.0
    n_step: int = 1
    baseline: str = "none"

    def __post_init__(self) -> None:
        if self.discount not in DISCOUNTS:
            raise ValueError(f"discount must be one of {DISCOUNTS}, got {self.discount!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"reward_baseline must be one of {BASELINES}, got {self.baseline!r}")
        if not self.horizon_s > 0 or not 0 <= self.gamma <= 1:
            raise ValueError("horizon_s must be positive and gamma in [0, 1]")
        if isinstance(self.n_step, bool) or not isinstance(self.n_step, int) or self.n_step < 1:
            raise ValueError(f"n_step must be a positive integer, got {self.n_step!r}")

    @property
    def is_default(self) -> bool:
        """Whether the targets are d3rlpy's own (one step, ``gamma`` per step, raw rewards)."""
        return self.discount == "step" and self.n_step == 1 and self.baseline == "none"


@dataclass(frozen=True)
class CreditTarget:
    """One transition's target parts: the (discounted, baselined) ``reward`` summed over
    steps ``index .. end - 1``; bootstrap from step ``end`` with ``gamma ** interval``
    unless ``terminal``."""

    reward: float
    end: int
    interval: float
    terminal: bool


def step_dts(times: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Seconds from each step's decision point to the next step's, one episode's ``time``
    column in step order; 0 for the last step (its end is not recorded) and never negative."""
    t = np.asarray(times, dtype=np.float64)
    return np.append(np.maximum(np.diff(t), 0.0), 0.0) if t.size else t.copy()


def episode_rate(rewards: npt.NDArray[Any], dts: npt.NDArray[np.float64]) -> float:
    """The mean reward per second over the steps before the last (whose ``dt`` is known);
    0 when no time passes there."""
    span = float(np.sum(dts[:-1]))
    if span <= 0:
        return 0.0
    return float(np.sum(np.asarray(rewards, dtype=np.float64).reshape(-1)[:-1])) / span


def credit_target(
    rewards: npt.NDArray[Any],
    dts: npt.NDArray[np.float64],
    rate: float,
    terminated: bool,
    index: int,
    credit: Credit,
) -> CreditTarget:
    """The target parts of step ``index`` of one episode (``rewards`` and ``dts`` per step,
    ``rate`` its ``episode_rate``, ``terminated`` whether it really ended)."""
    size = len(dts)
    if terminated:
        end = min(index + credit.n_step, size)
        terminal = end == size
    else:
        end = min(index + credit.n_step, size - 1)
        terminal = False
    if not 0 <= index < end:
        raise IndexError(f"step {index} has no transition in an episode of {size} steps")
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)[index:end]
    dt = dts[index:end]
    if credit.baseline == "episode_mean":
        r = r - rate * dt
    if credit.discount == "time":
        elapsed = np.concatenate(([0.0], np.cumsum(dt))) / credit.horizon_s
        exponents, interval = elapsed[:-1], float(elapsed[-1])
    else:
        exponents, interval = np.arange(end - index, dtype=np.float64), float(end - index)
    reward = float(np.sum(r * credit.gamma**exponents))
    return CreditTarget(reward=reward, end=end, interval=interval, terminal=terminal)
