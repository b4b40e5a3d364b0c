"""Whose holds are whose: which queued jobs the loop may touch.

The loop manages only jobs held for it, recognisable in Slurm itself: held (priority 0,
reason ``JobHeldUser``) with the administrator comment ``linkwise:held``, which the shipped
``job_submit.lua`` sets when it holds a job (users cannot set or change an admin comment). A
job held by an administrator (``JobHeldAdmin``), a user's own hold and every untagged job
are left alone by the loop, its clean shutdown and the watchdog.
"""

from __future__ import annotations

from collections.abc import Iterable

from linkwise.cluster.slurm.records import QueuedJob

HOLD_TAG = "linkwise:held"  # AdminComment of a job held for the loop (job_submit.lua)
RELEASED_TAG = "linkwise:released"  # ... once released (job_submit.lua, with the release)


def held_for_loop(job: QueuedJob) -> bool:
    """Held for the loop: held as job_submit.lua holds (``JobHeldUser``) and tagged so. An
    administrator's hold on top (``JobHeldAdmin``) or an untagged hold is not the loop's."""
    return job.held and job.reason == "JobHeldUser" and job.admin_comment == HOLD_TAG


def in_partitions(job: QueuedJob, partitions: Iterable[str]) -> bool:
    """Whether any of the job's partitions (``gpu`` or a submitted list ``gpu,cpu``) is one
    of ``partitions``."""
    return not set(job.partition.split(",")).isdisjoint(partitions)


def bypassed(job: QueuedJob) -> bool:
    """Tagged as held for the loop but no longer held: released by someone else (or by a
    release that did not go through job_submit.lua, which ends the tag with it)."""
    return not job.held and job.admin_comment == HOLD_TAG and job.state in ("PENDING", "RUNNING")


# pending reasons of a released job that cannot run on the node list the loop gave it
STRANDED_REASONS = ("BadConstraints", "ReqNodeNotAvail", "PartitionNodeLimit", "NodeDown")


def stranded(job: QueuedJob) -> bool:
    """Released by the loop with a node list Slurm reports it cannot run on (22.05 also
    gives such a job priority 0, so it may look held): its node list must be cleared."""
    return (
        job.state == "PENDING"
        and job.admin_comment == RELEASED_TAG
        and bool(job.req_nodes)
        and job.reason.startswith(STRANDED_REASONS)
    )
