"""Oracle ceilings: schedulers that read each job's true remaining run time.

No real scheduler knows it (Slurm knows time limits and history, ``datasets.predictor``), so
these are never baselines to beat and never a gate's reference: they show how far perfect
run-time knowledge would go on the same cluster. Every table marks them ``oracle``
(``cluster.heuristics.is_oracle``).

- ``sjf_bco_oracle``: SJF-BCO ordered by true GPU time (GPUs x remaining isolated run time)
  instead of GPU count; SJF-BCO's placement and node-span bound; no preemption
  (``order=true_gpu_time, placement=bounded``).
- ``srtf_oracle``: shortest remaining time first on the true remaining isolated run time,
  preemptive: at every decision point all jobs, running and pending, are ranked by remaining
  time and admitted greedily while the cluster's GPUs suffice; running jobs left out are
  preempted (``Decision.preempt``) and admitted pending jobs start with SJF-BCO's placement
  rule and span bound (``order=true_remaining, placement=bounded, preempt=priority``: a
  preempted job whose GPUs no new start took keeps running, and the GPUs still free go to
  the other pending jobs, in rank order; nothing starts: nothing changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from linkwise.cluster.compose import Composed, compose
from linkwise.cluster.compose.placements import check_bco_params
from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.heuristics.sjf_bco import bounded_part


@dataclass(frozen=True, slots=True)
class SjfBcoOracle:
    """SJF-BCO by true GPU time (``num_gpus x remaining_s``): an oracle ceiling."""

    name: str = "sjf_bco_oracle"
    kappa: int | None = None
    lam: float = 1.0
    oracle: ClassVar[bool] = True
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)
        object.__setattr__(self, "_policy", compose(self.composition, name=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return f"compose:order=true_gpu_time,{bounded_part(self.kappa, self.lam)}"

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest true GPU time first (SJF-BCO's placement)."""
        return self._policy.decide(state)


@dataclass(frozen=True, slots=True)
class SrtfOracle:
    """Preemptive shortest remaining (true, isolated) time first: an oracle ceiling.

    Every job, running or pending, is ranked by remaining time (ties: submit time, job id)
    and admitted in that order while the cluster's GPUs suffice; running jobs left out are
    preempted. The admitted pending jobs are then placed in rank order with SJF-BCO's
    placement rule and node-span bound (``kappa``, ``lam`` as in ``sjf_bco``), so the
    ceiling is not lost to spread-out rings (the module docstring has the rest).
    """

    name: str = "srtf_oracle"
    kappa: int | None = None
    lam: float = 1.0
    oracle: ClassVar[bool] = True
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)
        object.__setattr__(self, "_policy", compose(self.composition, name=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return f"compose:order=true_remaining,{bounded_part(self.kappa, self.lam)},preempt=priority"

    def decide(self, state: ClusterState) -> Decision:
        """Admit by remaining time; preempt the running jobs left out, start the admitted."""
        return self._policy.decide(state)
