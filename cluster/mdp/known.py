"""What a policy may know of a job beyond its request: run-time predictions (never the true
run time), whether it may be preempted, and what a restart costs it (the restart model)."""

from __future__ import annotations

import zlib

from linkwise.cluster.domain import Job
from linkwise.cluster.restart import RestartModel


def _require_prediction(job: Job) -> None:
    if not job.predicted:
        raise ValueError(
            f"job {job.job_id} has no run-time prediction (pred_s): the observation never "
            "reads the true run time, so a run-time predictor fit on history is needed "
            "(datasets.predictor.RuntimePredictor.annotate; --history on the command line)"
        )


def predicted_remaining(job: Job, attained_gpu_s: float, *, upper: bool = False) -> float:
    """Seconds a job is predicted to still need: its predicted run time (``pred_s``, or
    ``pred_hi_s`` with ``upper``) less the service it had, at least 0. ValueError for a job
    without predictions."""
    _require_prediction(job)
    pred = job.pred_hi_s if upper else job.pred_s
    return max(0.0, pred - attained_gpu_s / job.num_gpus)


def preemptable(job_id: int, share: float) -> bool:
    """Whether a job may be preempted or migrated in the simulator: a deterministic share
    ``share`` of the jobs, chosen by a hash of the job id (all with 1, none with 0)."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    return zlib.crc32(str(job_id).encode()) / 2**32 < share


def may_preempt(job: Job, share: float) -> bool:
    """Whether a job may be preempted or migrated: its own ``Job.preemptible`` when known (live:
    True only for jobs that opted in), else the simulator's deterministic share
    (``preemptable``)."""
    return job.preemptible if job.preemptible is not None else preemptable(job.job_id, share)


def restart_seconds(job: Job, restart: RestartModel) -> float:
    """Seconds a preemption or migration costs the job by the restart model: the signal's
    grace (GPUs held, no progress) plus its profile's restore cost (checkpointing on the
    signal; the lost work of a job that does not is the simulator's to charge)."""
    return restart.grace_s + restart.restore_s(job.profile)
