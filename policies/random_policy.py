"""A seeded random scheduler: random jobs on random generator placements (a baseline and a
behaviour policy for offline data)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from linkwise.cluster.domain import ClusterState, Decision, Start, fixed_shape, within_request
from linkwise.cluster.placement.generators import apply_placement, distinct_placements
from linkwise.cluster.placement.slurm_select import slurm_select
from linkwise.policies.parts.placements import add_busy, can_ever_run

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RandomPolicy:
    """Start a random subset of the pending jobs that fit, each on a random candidate placement.

    Stateless and deterministic: the generator is seeded from ``(seed, state.time,
    len(state.pending))``, so the same state always gives the same decision. Pending
    jobs are visited in a random order; each one that fits is started with probability
    ``start_prob`` on one of the distinct placements the generators of
    ``linkwise.cluster.placement`` propose, drawn uniformly. So that a run cannot stall,
    when nothing is running and nothing was drawn, the first visited job that fits is
    started anyway.
    """

    name: str = "random"
    seed: int = 0
    start_prob: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_prob <= 1.0:
            raise ValueError(f"start_prob must be in [0, 1], got {self.start_prob}")

    def rng(self, state: ClusterState) -> random.Random:
        """The generator for this state (string seeds hash the same in every process)."""
        return random.Random(f"{self.seed}:{state.time!r}:{len(state.pending)}")

    def decide(self, state: ClusterState) -> Decision:
        """A random feasible set of starts."""
        free = list(state.free_gpus)
        total = sum(free)
        if total == 0 or not state.pending:
            return Decision()
        rng = self.rng(state)
        topo = state.topology
        busy = list(state.jobs_per_node)
        starts: list[Start] = []
        first_fitting: Start | None = None
        for p in _lazy_shuffle(state.pending, rng):
            if total == 0:
                break
            if not can_ever_run(state, p):
                continue
            gpus = p.job.num_gpus
            if gpus > total:
                continue
            draw = rng.random() < self.start_prob
            if not draw and (starts or first_fitting is not None):
                continue
            candidates = distinct_placements(topo, free, gpus, busy)
            shape = fixed_shape(p.job, topo.max_gpus_per_node)
            if shape is not None:  # a fixed request: only the candidates in its shape
                node_gpus = topo.max_gpus_per_node
                candidates = tuple(c for c in candidates if within_request(p.job, c, node_gpus))
                if not candidates:
                    found = slurm_select(topo, free, shape)
                    candidates = () if found is None else (found,)
            if not candidates:  # only a fixed request: first fit fails only on the total
                continue
            placement = rng.choice(candidates)
            if not draw:
                first_fitting = Start(p.job.job_id, placement)
                continue
            apply_placement(free, placement)
            add_busy(busy, placement)
            total -= gpus
            starts.append(Start(p.job.job_id, placement))
        if not starts and not state.running and first_fitting is not None:
            starts.append(first_fitting)
        return Decision(starts=tuple(starts))


def _lazy_shuffle(items: Sequence[T], rng: random.Random) -> Iterator[T]:
    """Yield ``items`` in a uniformly random order, paying only for the ones consumed."""
    pool = list(items)
    n = len(pool)
    for i in range(n):
        j = i + int(rng.random() * (n - i))
        pool[i], pool[j] = pool[j], pool[i]
        yield pool[i]
