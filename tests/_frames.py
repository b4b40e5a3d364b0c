"""A small random transition frame for the tests that fit d3rlpy learners on one (the masked
learners, the row network, the numpy forward)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from linkwise.cluster.mdp import ObsSpec
from linkwise.datasets.transitions import TransitionBuffer


def random_frame(
    spec: ObsSpec,
    *,
    episodes: int,
    steps: int,
    seed: int = 0,
    allowed: float = 0.4,
    never: Sequence[int] = (),
) -> pl.DataFrame:
    """Random observations; each step allows "wait" and a random share ``allowed`` of the
    other actions, never those in ``never``; the logged action is one of the allowed;
    rewards in (-1, 0]. Even episodes end in a terminal, odd ones are cut (timeout)."""
    rng = np.random.default_rng(seed)
    wait = spec.config.wait_action
    buf = TransitionBuffer(spec.version)
    for e in range(episodes):
        for t in range(steps):
            mask = rng.random(spec.n_actions) < allowed
            mask[wait] = True
            mask[list(never)] = False
            buf.add(
                episode=f"rollout/tiny/w{e}",
                step=t,
                time=float(t),
                obs=rng.random(spec.dim).astype(np.float32),
                action=int(rng.choice(np.flatnonzero(mask))),
                reward=-float(rng.random()),
                mask=mask,
                source="rollout",
                behaviour="tiny",
                match="policy",
            )
        buf.end_episode(terminal=e % 2 == 0)
    return buf.to_frame()
