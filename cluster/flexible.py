"""Replaying a trace's multi-GPU jobs with flexible requests (``--flexible SHARE``).

Traces without the form of each request (Philly, Helios, the synthetic workload) leave
``Job.flexible`` None. ``with_flexible(jobs, share, seed)`` gives every such job a form by
one stated, seeded rule: a multi-GPU job is flexible (``--gpus=N``, any split) when its draw
``flexible_draw(job_id, seed)`` is below ``share``, else fixed (``requested_shape``); a
one-GPU job is fixed (it has one split). Jobs whose trace gives the form keep it. A flexible
job asks no node count (``Job.nodes`` 0). ``draw_summary``/``summary_text``: what a run
states of the draw (report, MLflow params).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import replace

from linkwise.cluster.domain import Job

RULE = (
    "a multi-GPU job without a request form in the trace is flexible iff the first 8 bytes "
    "of BLAKE2b('flexible:<seed>:<job id>') as a little-endian integer / 2^64 < SHARE; "
    "every other such job is fixed"
)


def flexible_draw(job_id: int, seed: int) -> float:
    """The job's uniform draw in [0, 1): the first 8 bytes of BLAKE2b over
    ``flexible:<seed>:<job id>`` as a little-endian integer over 2^64."""
    digest = hashlib.blake2b(f"flexible:{seed}:{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def with_flexible(jobs: Iterable[Job], share: float, seed: int = 0) -> tuple[Job, ...]:
    """The jobs with a request form each (module docstring); ``share`` in [0, 1]."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the flexible share must be within [0, 1], got {share}")
    out: list[Job] = []
    for job in jobs:
        if job.flexible is not None:
            out.append(job)
        elif job.num_gpus > 1 and flexible_draw(job.job_id, seed) < share:
            out.append(replace(job, flexible=True, nodes=0))
        else:
            out.append(replace(job, flexible=False))
    return tuple(out)


def draw_summary(jobs: Iterable[Job], share: float, seed: int) -> dict[str, object]:
    """What a run states of a draw over ``jobs`` (``with_flexible``'s output): the share, the
    seed, how many jobs came out flexible of how many multi-GPU jobs, and the rule."""
    rows = list(jobs)
    return {
        "share": share,
        "seed": seed,
        "flexible_jobs": sum(bool(j.flexible) for j in rows),
        "multi_gpu_jobs": sum(j.num_gpus > 1 for j in rows),
        "rule": RULE,
    }


def summary_text(summary: Mapping[str, object]) -> str:
    """``draw_summary`` in one line."""
    return (
        f"share {summary['share']:g} of the multi-GPU jobs (seed {summary['seed']}): "
        f"{summary['flexible_jobs']} of {summary['multi_gpu_jobs']} flexible "
        "(cluster/flexible.py)"
    )
