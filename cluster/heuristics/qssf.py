"""QSSF: Quasi-Shortest-Service-First (Hu et al., "Characterization and Prediction of Deep
Learning Workloads in Large-Scale GPU Datacenters", SC'21, the Helios scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.heuristics._common import (
    MissingPredictions,
    can_ever_run,
    check_bco_params,
    start_bounded,
)


@dataclass(frozen=True, slots=True)
class Qssf:
    """Smallest *predicted* GPU time first, with SJF-BCO's placement rule and node-span bound.

    Helios orders pending jobs by their expected service, GPUs x predicted run time, the
    prediction coming from the history of similar jobs. Here the prediction is the run-time
    predictor's median (``Job.pred_s``, set by ``datasets.predictor.RuntimePredictor``,
    fit only on jobs submitted before the evaluated ones): what a real scheduler can know,
    never the true run time. Ties: submit time, job id. Placement is SJF-BCO's
    (``_common.start_bounded``: ``kappa``, ``lam`` as in ``sjf_bco``); no preemption.

    A pending job without a prediction is an error (``MissingPredictions``): QSSF is the
    best same-information heuristic only when it is given the same history a learned policy
    gets (``--history`` on the command line).
    """

    name: str = "qssf"
    kappa: int | None = None
    lam: float = 1.0
    needs_predictions: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest predicted GPU time first."""
        for p in state.pending:
            if not p.job.predicted:
                raise MissingPredictions(
                    f"qssf orders jobs by predicted GPU time, but job {p.job.job_id} has no "
                    "run-time prediction: pass --history PATH (a trace or store of jobs "
                    "submitted before these) to fit the predictor"
                )
        order = sorted(
            (p for p in state.pending if can_ever_run(state, p)),
            key=lambda p: (p.job.num_gpus * p.job.pred_s, p.job.submit_time, p.job.job_id),
        )
        return start_bounded(state, order, self.kappa, self.lam)
