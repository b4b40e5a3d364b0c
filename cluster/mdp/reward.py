"""The reward: minus the jobs in system over the time that passed, minus weighted contention."""

from __future__ import annotations

from linkwise.cluster.domain import ClusterState
from linkwise.cluster.mdp.config import MdpConfig


def jobs_in_system(state: ClusterState) -> int:
    """Pending plus running jobs."""
    return len(state.pending) + len(state.running)


def contention_term(state: ClusterState, dt: float, cfg: MdpConfig) -> float:
    """Progress lost to contention over ``dt``: sum over running jobs of (1 - rate) x dt,
    over the time scale (uses the running jobs' recorded rates)."""
    lost = sum(1.0 - min(1.0, r.rate) for r in state.running)
    return lost * dt / cfg.time_scale_s


def step_reward(
    prev_time: float, now: float, jobs: int, contention: float, cfg: MdpConfig
) -> float:
    """-(jobs in system x dt) / time_scale - contention_weight x contention (0 if no time passed
    and no contention)."""
    dt = max(0.0, now - prev_time)
    return -(jobs * dt) / cfg.time_scale_s - cfg.contention_weight * contention
