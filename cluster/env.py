"""A Gymnasium environment over the simulator: the decision problem of ``cluster/mdp/``.

One step either starts one pending job on one candidate placement, or (with running rows,
``MdpConfig.running_slots``) preempts or migrates one running job (the simulator stays at
the same decision point, reward 0; a preempted or migrated job drains for the restart
model's grace, its GPUs held), or waits (the simulator advances to its next event,
reward ``-(jobs in system x dt) / time_scale``, minus the weighted contention term). The
mask of allowed actions is ``info["action_mask"]``. An episode ends (``terminated``) when
every job has finished, so the undiscounted return is minus the total JCT over the time
scale. Waiting on an idle cluster with nothing left to arrive (and no ticks) would wait
forever: the episode is truncated with ``info["stalled"] = True``.

The observation reads jobs' run-time predictions (``Job.pred_s``, ``pred_hi_s``), never their
true durations (``cluster/mdp/``, ``docs/INFORMATION.md``): a workload's jobs must carry
them (``datasets.predictor.RuntimePredictor.annotate``), else ``reset`` raises ValueError.

With ``skip_trivial`` (default) decision points where only "wait" is allowed are passed
through inside one wait step (their rewards summed), so every observation the agent sees
has a real choice, except possibly the first and the last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Job, Placement, Topology
from linkwise.cluster.mdp import (
    BoolArray,
    Candidates,
    FloatArray,
    InvalidAction,
    MdpConfig,
    ObsSpec,
    candidates,
    contention_term,
    decode,
    encode,
    jobs_in_system,
    make_spec,
    step_reward,
)
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import SimulationStalled

__all__ = ["ClusterEnv", "Workload", "WorkloadFactory"]

INVALID_ACTIONS = ("raise", "wait")


@dataclass(frozen=True)
class Workload:
    """What one episode simulates."""

    topology: Topology
    jobs: Sequence[Job]
    model: ContentionModel
    sim_config: SimConfig | None = None
    running: Sequence[tuple[Job, Placement]] = ()  # a warm start (``Simulator(running=)``)


WorkloadFactory = Callable[[int], Workload]  # episode seed -> workload


class ClusterEnv(gym.Env[FloatArray, np.int64]):
    """Discrete-action scheduling over the simulator (``MdpConfig.n_actions``: ``K * P`` starts,
    the running rows if any, and wait; mask in info).

    ``factory(seed)`` builds each episode's workload; the seed is drawn from the env's
    ``np_random``, so ``reset(seed=s)`` is reproducible. ``invalid_action="raise"`` (default)
    raises ``InvalidAction`` on a masked action; ``"wait"`` treats it as wait and sets
    ``info["invalid_action"]`` (for generic tooling that samples actions blindly, such as
    gymnasium's env checker). ``max_steps`` truncates an episode.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        factory: WorkloadFactory,
        spec: ObsSpec | None = None,
        *,
        invalid_action: str = "raise",
        skip_trivial: bool = True,
        max_steps: int | None = None,
    ) -> None:
        if invalid_action not in INVALID_ACTIONS:
            raise ValueError(f"invalid_action must be one of {INVALID_ACTIONS}")
        self.factory = factory
        self.spec_obs = spec or make_spec()
        self.config: MdpConfig = self.spec_obs.config
        self.invalid_action = invalid_action
        self.skip_trivial = skip_trivial
        self.max_steps = max_steps
        self.action_space = gym.spaces.Discrete(self.config.n_actions)
        self.observation_space = gym.spaces.Box(
            low=-1.0, high=np.inf, shape=(self.spec_obs.dim,), dtype=np.float32
        )
        self._sim: Simulator | None = None
        self._model: ContentionModel | None = None
        self._cands: Candidates | None = None
        self._steps = 0

    # -- gymnasium API -----------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[FloatArray, dict[str, Any]]:
        """Start an episode on a fresh workload; the observation is the first decision point."""
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        w = self.factory(episode_seed)
        self._sim = Simulator(w.topology, w.jobs, w.model, w.sim_config, running=w.running)
        self._model = w.model
        self._steps = 0
        self._refresh()
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[FloatArray, float, bool, bool, dict[str, Any]]:
        """Start, preempt or migrate one job (reward 0) or wait (advance; reward from the time
        that passed)."""
        sim, cands = self._require()
        a = int(action)
        wait = self.config.wait_action
        invalid = not 0 <= a < self.config.n_actions or not cands.mask[a]
        if invalid:
            if self.invalid_action == "raise":
                raise InvalidAction(
                    f"action {a} is masked at t={cands.state.time:.1f} "
                    f"(allowed: {np.flatnonzero(cands.mask).tolist()})"
                )
            a = wait
        self._steps += 1
        reward = 0.0
        truncated = stalled = False
        if a == wait:
            reward, stalled = self._advance()
            truncated = stalled
        else:
            sim.apply(decode(cands, a))
            self._refresh()
        terminated = sim.done
        if self.max_steps is not None and self._steps >= self.max_steps and not terminated:
            truncated = True
        info = self._info()
        if stalled:
            info["stalled"] = True
        if invalid:
            info["invalid_action"] = True
        return self._obs(), reward, terminated, truncated, info

    # -- helpers -----------------------------------------------------------------------

    @property
    def state(self) -> ClusterState:
        """The simulator's current state (after the last step)."""
        return self._require()[1].state

    @property
    def candidates(self) -> Candidates:
        """The current candidates (for adapters that act on states, e.g. heuristics)."""
        return self._require()[1]

    @property
    def simulator(self) -> Simulator:
        return self._require()[0]

    def action_masks(self) -> BoolArray:
        """The current mask (the name sb3-contrib's MaskablePPO looks for)."""
        return self._require()[1].mask.copy()

    def _require(self) -> tuple[Simulator, Candidates]:
        if self._sim is None or self._cands is None:
            raise RuntimeError("call reset() before step()")
        return self._sim, self._cands

    def _refresh(self) -> None:
        assert self._sim is not None and self._model is not None
        self._cands = candidates(self._sim.observe(), self.config, self._model)

    def _advance(self) -> tuple[float, bool]:
        """Advance past this decision point (and trivial ones); (summed reward, stalled)."""
        sim, _ = self._require()
        reward = 0.0
        while True:
            prev = sim.observe()
            try:
                more = sim.advance()
            except SimulationStalled:
                return reward, True
            now = sim.observe()
            dt = now.time - prev.time
            reward += step_reward(
                prev.time,
                now.time,
                jobs_in_system(prev),
                contention_term(prev, dt, self.config),
                self.config,
            )
            self._refresh()
            assert self._cands is not None
            only_wait = not self._cands.mask[: self.config.wait_action].any()
            if not more or sim.done or not (self.skip_trivial and only_wait):
                return reward, False

    def _obs(self) -> FloatArray:
        return encode(self._require()[1], self.spec_obs)

    def _info(self) -> dict[str, Any]:
        sim, cands = self._require()
        return {
            "action_mask": cands.mask.copy(),
            "time": float(sim.time),
            "pending": len(cands.state.pending),
            "running": len(cands.state.running),
        }
