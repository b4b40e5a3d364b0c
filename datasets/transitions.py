"""The one transition table: (observation, action, reward) steps of the decision problem.

Both the log builder (``datasets/decisions.py``) and simulator rollouts
(``datasets/rollouts.py``) produce frames with exactly ``TRANSITION_SCHEMA``; the
exporter reads only this. A row is one step: the observation before the action, the
action taken (an index of ``cluster.mdp``'s action space), the mask of allowed actions,
and the reward received after it (zero for a start inside a decision point; minus the
jobs-in-system integral until the next decision point for "wait"). ``terminal`` marks
the true end of an episode (nothing left to schedule), ``timeout`` a cut (window end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

TRANSITION_SCHEMA: dict[str, Any] = {
    "episode": pl.String,  # e.g. "rollout/backfill/w3/s0" or "log/linkwise/1700000000"
    "step": pl.Int64,  # index inside the episode
    "time": pl.Float64,  # simulated or wall-clock time of the decision point (s)
    "obs": pl.List(pl.Float32),
    "action": pl.Int64,
    "reward": pl.Float64,
    "mask": pl.List(pl.Boolean),
    "terminal": pl.Boolean,
    "timeout": pl.Boolean,
    "source": pl.String,  # "log" or "rollout"
    "behaviour": pl.String,  # the policy that acted ("slurm" for real logs)
    # how the action was recovered: exact, nearest, unslotted, wait, policy; with running rows
    # also preempt, migrate, migrate_nearest (``cluster.mdp.matching``)
    "match": pl.String,
}


@dataclass
class TransitionBuffer:
    """Accumulates steps in columns and turns them into one frame with the schema."""

    obs_spec_version: str
    _cols: dict[str, list[Any]] = field(
        default_factory=lambda: {name: [] for name in TRANSITION_SCHEMA}
    )

    def __len__(self) -> int:
        return len(self._cols["step"])

    def add(
        self,
        *,
        episode: str,
        step: int,
        time: float,
        obs: np.ndarray,
        action: int,
        reward: float,
        mask: np.ndarray,
        source: str,
        behaviour: str,
        match: str,
        terminal: bool = False,
        timeout: bool = False,
    ) -> None:
        """Append one step."""
        c = self._cols
        c["episode"].append(episode)
        c["step"].append(step)
        c["time"].append(time)
        c["obs"].append(obs.astype(np.float32, copy=False).tolist())
        c["action"].append(int(action))
        c["reward"].append(float(reward))
        c["mask"].append(mask.astype(bool, copy=False).tolist())
        c["terminal"].append(terminal)
        c["timeout"].append(timeout)
        c["source"].append(source)
        c["behaviour"].append(behaviour)
        c["match"].append(match)

    def add_reward(self, reward: float) -> None:
        """Add to the reward of the last step (time passing after it)."""
        if not self:
            raise ValueError("no step to credit the reward to")
        self._cols["reward"][-1] += float(reward)

    def end_episode(self, *, terminal: bool) -> None:
        """Mark the last step as the episode's end: terminal, or a timeout (cut)."""
        if not self:
            return
        self._cols["terminal"][-1] = terminal
        self._cols["timeout"][-1] = not terminal

    def to_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self._cols, schema=TRANSITION_SCHEMA)


def empty_frame() -> pl.DataFrame:
    """A transition frame with no rows."""
    return pl.DataFrame(schema=TRANSITION_SCHEMA)


def check_frame(df: pl.DataFrame) -> None:
    """Raise ValueError unless ``df`` has the transition schema and consistent episodes."""
    if dict(df.schema) != TRANSITION_SCHEMA:
        raise ValueError(f"not a transition frame: schema {dict(df.schema)}")
    if df.is_empty():
        return
    ends = df.group_by("episode").agg(
        (pl.col("terminal") | pl.col("timeout")).sum().alias("ends"),
        pl.col("step").n_unique().alias("steps"),
        pl.len().alias("rows"),
    )
    bad = ends.filter((pl.col("ends") != 1) | (pl.col("steps") != pl.col("rows")))
    if not bad.is_empty():
        raise ValueError(
            f"{bad.height} episodes without exactly one end or with repeated steps, "
            f"e.g. {bad['episode'][0]!r}"
        )


def list_column_array(df: pl.DataFrame, column: str, width: int, dtype: Any) -> np.ndarray:
    """A list column of fixed ``width`` (``obs``, ``mask``, ``next_mask``) as an ``(N, width)``
    array of ``dtype``: the one conversion of stored observations and masks to arrays."""
    if df.is_empty():
        return np.zeros((0, width), dtype=dtype)
    flat = np.array(df[column].explode().to_numpy(), dtype=dtype)  # a copy: writable (torch)
    if flat.size != df.height * width:
        raise ValueError(f"{column}: {flat.size} values for {df.height} rows of width {width}")
    return flat.reshape(df.height, width)
