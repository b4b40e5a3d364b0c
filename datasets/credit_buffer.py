"""``datasets.credit`` on d3rlpy datasets: episodes that carry their times, and the transition
picker that gives d3rlpy's Q-learners the credited targets.

``to_mdp_dataset`` returns its episodes as ``TimedEpisode`` (``timed_dataset``);
``with_credit`` gives them as ``CreditedEpisode`` (every transition's target computed once)
with a ``CreditPicker``, which returns the n-step, baselined reward and, as the transition's
``interval``, the exponent of ``gamma`` for the bootstrap (d3rlpy's DQN/CQL targets use
``gamma ** batch.intervals``; a float here).
Imports d3rlpy (torch) at its top: the modules that use it import it inside the function that
needs it, with the reason (``tests/project/test_layering.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from d3rlpy.dataset import (  # type: ignore[import-untyped]
    Episode,
    InfiniteBuffer,
    ReplayBuffer,
    Transition,
)
from d3rlpy.dataset.utils import (  # type: ignore[import-untyped]
    create_zero_observation,
    retrieve_observation,
)

from linkwise.datasets.credit import Credit, CreditTarget, credit_target, episode_rate, step_dts

__all__ = ["CreditPicker", "CreditedEpisode", "TimedEpisode", "timed_dataset", "with_credit"]


@dataclasses.dataclass(frozen=True)
class TimedEpisode(Episode):  # type: ignore[misc]
    """d3rlpy's ``Episode`` with ``dts`` (``(T,)``: seconds from each step's decision point to
    the next step's, ``credit.step_dts``) and ``rate`` (``credit.episode_rate``)."""

    dts: npt.NDArray[np.float64]
    rate: float


@dataclasses.dataclass(frozen=True)
class CreditedEpisode(TimedEpisode):
    """A ``TimedEpisode`` with every transition's ``CreditTarget`` under ``credit``
    (``with_credit``), so that sampling looks them up."""

    credit: Credit
    targets: tuple[CreditTarget, ...]


def _credited(ep: TimedEpisode, credit: Credit) -> CreditedEpisode:
    targets = tuple(
        credit_target(ep.rewards, ep.dts, ep.rate, ep.terminated, i, credit)
        for i in range(ep.transition_count)
    )
    return CreditedEpisode(
        observations=ep.observations,
        actions=ep.actions,
        rewards=ep.rewards,
        terminated=ep.terminated,
        dts=ep.dts,
        rate=ep.rate,
        credit=credit,
        targets=targets,
    )


def _buffer(episodes: list[Any], like: Any, picker: Any) -> Any:
    info = like.dataset_info
    return ReplayBuffer(
        InfiniteBuffer(),
        episodes=episodes,
        transition_picker=picker,
        action_space=info.action_space,
        action_size=info.action_size,
    )


def timed_dataset(dataset: Any, canon: pl.DataFrame) -> Any:
    """A d3rlpy ``ReplayBuffer`` of ``dataset``'s episodes as ``TimedEpisode``, their times
    from ``canon`` (the frame ``dataset`` was built from, in canonical order: episodes
    contiguous, steps in order); ValueError when the episodes do not line up."""
    groups = canon.group_by("episode", maintain_order=True).agg(pl.col("time"))
    episodes = list(dataset.episodes)
    if len(episodes) != groups.height:
        raise ValueError(f"{len(episodes)} d3rlpy episodes for {groups.height} in the frame")
    timed = []
    for ep, times in zip(episodes, groups["time"].to_list(), strict=True):
        if ep.size() != len(times):
            raise ValueError(f"an episode of {ep.size()} steps has {len(times)} times")
        dts = step_dts(np.asarray(times, dtype=np.float64))
        timed.append(
            TimedEpisode(
                observations=ep.observations,
                actions=ep.actions,
                rewards=ep.rewards,
                terminated=ep.terminated,
                dts=dts,
                rate=episode_rate(ep.rewards, dts),
            )
        )
    return _buffer(timed, dataset, None)


class CreditPicker:
    """d3rlpy transition picker for a ``Credit``: reward, next observation (a zero one after
    a terminal), terminal flag and ``interval`` from ``credit.credit_target``. Handles tuple
    (masked) observations as d3rlpy's own pickers do. A ``CreditedEpisode`` under the same
    ``Credit`` gives its precomputed targets; any other ``TimedEpisode`` (held-out episodes in
    d3rlpy's evaluators) is computed on the fly."""

    def __init__(self, credit: Credit) -> None:
        self.credit = credit

    def __call__(self, episode: Any, index: int) -> Any:
        if not isinstance(episode, TimedEpisode):
            raise TypeError("CreditPicker needs TimedEpisode episodes (to_mdp_dataset gives them)")
        if isinstance(episode, CreditedEpisode) and episode.credit == self.credit:
            t = episode.targets[index]
        else:
            t = credit_target(
                episode.rewards, episode.dts, episode.rate, episode.terminated, index, self.credit
            )
        observation = retrieve_observation(episode.observations, index)
        if t.terminal:
            next_observation = create_zero_observation(observation)
            next_action = np.zeros_like(episode.actions[index])
        else:
            next_observation = retrieve_observation(episode.observations, t.end)
            next_action = episode.actions[t.end]
        return Transition(
            observation=observation,
            action=episode.actions[index],
            reward=np.array([t.reward], dtype=np.float32),
            next_observation=next_observation,
            next_action=next_action,
            terminal=float(t.terminal),
            interval=t.interval,
            rewards_to_go=episode.rewards[index:],
        )


def with_credit(dataset: Any, credit: Credit) -> Any:
    """``dataset`` (from ``to_mdp_dataset``) itself for the default ``Credit``, else its
    episodes as ``CreditedEpisode`` with a ``CreditPicker``; TypeError when its episodes carry
    no times."""
    if credit.is_default:
        return dataset
    episodes = list(dataset.episodes)
    if not all(isinstance(ep, TimedEpisode) for ep in episodes):
        raise TypeError(
            "credit settings need a dataset whose episodes carry times: "
            "build it with datasets.export.to_mdp_dataset"
        )
    return _buffer([_credited(ep, credit) for ep in episodes], dataset, CreditPicker(credit))
