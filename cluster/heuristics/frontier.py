"""The frontier heuristics (issue 22): hybrids of today's parts, each a named composition.

- ``qssf_preemptive``: preemptive QSSF with SJF-BCO's consolidated placement: every running
  and pending job ranked by GPUs x predicted remaining run time (the predictor's median,
  then its p90, then as long again as the job has run), admitted greedily, the rest
  preempted; a running job keeps its GPUs unless a pending one beats it by ``margin``, and
  is never preempted within ``min_run_s`` of its last start.
- ``tiresias_consolidated``: Tiresias-LAS's queues (the reference ``dlas-gpu`` order) with
  SJF-BCO's consolidated placement instead of best fit, the same minimum run time, and
  the refill rule (a preemption that frees nothing used is undone).
- ``deepshare``: DeepShare's rule (first come first served, least added contention, and a
  split job whose predicted shared/isolated throughput ratio is at most ``ratio`` migrated
  to a consolidated placement when one is free; ``mode=preempt`` preempts it instead).

The margin and minimum run time keep them from thrashing under honest restart costs
(``cluster/restart.py``): a preempted job pays its checkpoint, grace and restore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from linkwise.cluster.compose import Composed, ComposeSpec
from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.heuristics.sjf_bco import bounded_part

DEFAULT_MARGIN = 1.5
DEFAULT_MIN_RUN_S = 600.0


@dataclass(frozen=True, slots=True)
class QssfPreemptive:
    """Preemptive QSSF: GPUs x predicted remaining time, a margin and a minimum run time.

    Started on SJF-BCO's consolidated placement (the module docstring has the rest)."""

    name: str = "qssf_preemptive"
    margin: float = DEFAULT_MARGIN
    min_run_s: float = DEFAULT_MIN_RUN_S
    kappa: int | None = None
    lam: float = 1.0
    needs_predictions: ClassVar[bool] = True
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        spec = ComposeSpec.parse(self.composition)
        object.__setattr__(self, "_policy", spec.build(name=self.name, who=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return (
            f"compose:order=pred_remaining,{bounded_part(self.kappa, self.lam)},"
            f"preempt=priority:margin={self.margin!r},min_run_s={self.min_run_s!r}"
        )

    def decide(self, state: ClusterState) -> Decision:
        """Admit by predicted remaining GPU time; preempt the rest (beyond the margin)."""
        return self._policy.decide(state)


@dataclass(frozen=True, slots=True)
class TiresiasConsolidated:
    """Tiresias-LAS's queues with SJF-BCO's consolidated placement instead of best fit.

    A minimum run time and the refill rule (the module docstring has the rest)."""

    name: str = "tiresias_consolidated"
    min_run_s: float = DEFAULT_MIN_RUN_S
    kappa: int | None = None
    lam: float = 1.0
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_policy", ComposeSpec.parse(self.composition).build(name=self.name)
        )

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return (
            f"compose:order=las,{bounded_part(self.kappa, self.lam)},"
            f"preempt=priority:min_run_s={self.min_run_s!r}"
        )

    def decide(self, state: ClusterState) -> Decision:
        """Tiresias' round on the consolidated placement."""
        return self._policy.decide(state)


@dataclass(frozen=True, slots=True)
class DeepShare:
    """DeepShare: a split job whose predicted throughput ratio is low moves to a consolidated one.

    ``model``: the contention model that predicts the throughput ratio (the shipped
    calibration's when None); the module docstring has the rest."""

    name: str = "deepshare"
    ratio: float = 0.6
    min_run_s: float = DEFAULT_MIN_RUN_S
    mode: str = "migrate"
    model: ContentionModel | None = field(default=None, compare=False, repr=False)
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        policy = ComposeSpec.parse(self.composition).build(self.model, name=self.name)
        object.__setattr__(self, "_policy", policy)

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return (
            "compose:order=submit,placement=least_contention,"
            f"preempt=migrate:ratio={self.ratio!r},min_run_s={self.min_run_s!r},mode={self.mode}"
        )

    def decide(self, state: ClusterState) -> Decision:
        """Move (or preempt) the split jobs the rule names, then start in submit order."""
        return self._policy.decide(state)
