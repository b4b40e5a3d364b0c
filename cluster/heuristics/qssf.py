"""QSSF: Quasi-Shortest-Service-First (Hu et al., "Characterization and Prediction of Deep
Learning Workloads in Large-Scale GPU Datacenters", SC'21, the Helios scheduler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from linkwise.cluster.compose import Composed, ComposeSpec
from linkwise.cluster.compose.placements import check_bco_params
from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.heuristics.sjf_bco import bounded_part


@dataclass(frozen=True, slots=True)
class Qssf:
    """Smallest *predicted* GPU time first, with SJF-BCO's placement rule and node-span bound.

    Helios orders pending jobs by their expected service, GPUs x predicted run time, the
    prediction coming from the history of similar jobs. Here the prediction is the run-time
    predictor's median (``Job.pred_s``, set by ``datasets.predictor.RuntimePredictor``,
    fit only on jobs submitted before the evaluated ones): what a real scheduler can know,
    never the true run time. Ties: submit time, job id. Placement is SJF-BCO's
    (``kappa``, ``lam`` as in ``sjf_bco``); no preemption: the composition
    ``order=pred_gpu_time, placement=bounded``.

    A pending job without a prediction is an error (``MissingPredictions``): QSSF is the
    best same-information heuristic only when it is given the same history a learned policy
    gets (``--history`` on the command line).
    """

    name: str = "qssf"
    kappa: int | None = None
    lam: float = 1.0
    needs_predictions: ClassVar[bool] = True
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)
        spec = ComposeSpec.parse(self.composition)
        object.__setattr__(self, "_policy", spec.build(name=self.name, who="qssf"))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return f"compose:order=pred_gpu_time,{bounded_part(self.kappa, self.lam)}"

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest predicted GPU time first."""
        return self._policy.decide(state)
