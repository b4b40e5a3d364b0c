"""Handing held jobs back to Slurm, each command audited first.

Clean shutdown, or the watchdog once the owner is gone (``hand_back``): mark the lease
``releasing`` first (the plugin holds nothing new), release every job held for the loop,
wait, release again (a submission that read the lease just before), mark it ``released``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.deployer.events import log_event
from linkwise.deployer.holds import bypassed, held_for_loop, in_partitions, stranded
from linkwise.deployer.lease import Lease, write_lease
from linkwise.deployer.recorder import Recorder, RecordError, new_id
from linkwise.deployer.scontrol import clear_nodes_command, release_command, untag_command


def release_held(
    client: SlurmClient,
    jobs: Iterable[QueuedJob],
    *,
    recorder: Recorder,
    run_id: str,
    cycle_id: int,
    actor: str,
    model_version: str,
    logger: logging.Logger,
    command: Callable[[int], list[str]] = release_command,
) -> list[int]:
    """Run ``command`` (by default: release unchanged) on ``jobs``, each audited first;
    returns the ids it succeeded on. Releasing skips jobs no longer held."""
    targets = [j for j in jobs if j.held or command is not release_command]
    targets = list({j.job_id: j for j in targets}.values())
    if not targets:
        return []
    now = time.time()
    audits = [
        {
            "audit_id": new_id(),
            "ts": now,
            "run_id": run_id,
            "cycle_id": cycle_id,
            "actor": actor,
            "job_id": j.job_id,
            "command": json.dumps(command(j.job_id)),
            "model_version": model_version,
            "outcome": "pending",
        }
        for j in targets
    ]
    try:
        recorder.write(audits=audits, must_persist=True)
    except RecordError as exc:
        # releasing hands jobs back to Slurm: safer to do it unaudited than to strand them
        log_event(logger, "audit_unavailable_acting_anyway", logging.ERROR, error=str(exc))
    done: list[int] = []
    outcomes: list[tuple[str, str, float]] = []
    for job, row in zip(targets, audits, strict=True):
        cmd = command(job.job_id)
        try:
            client.runner.run(cmd)
            outcome = "ok"
            done.append(job.job_id)
        except SlurmError as exc:
            outcome = f"error: {str(exc)[:200]}"
        outcomes.append((str(row["audit_id"]), outcome, time.time()))
        log_event(logger, cmd[1] + "d", job_id=job.job_id, actor=actor, outcome=outcome)
    recorder.write(outcomes=outcomes)
    return done


def sweep(
    client: SlurmClient,
    lease: Lease,
    recorder: Recorder,
    *,
    actor: str,
    logger: logging.Logger,
    cycle_id: int = -1,
    untag: Iterable[int] = (),
) -> list[int]:
    """Release (unchanged) every job of the lease's partitions held for the loop; end the
    tag of the ``untag`` jobs found released but still tagged (no job_submit.lua ended it);
    clear the node list of released jobs Slurm cannot run there (``stranded``)."""
    managed = set(lease.partitions)
    queue = [q for q in client.queue() if in_partitions(q, managed)]
    done = set(untag)
    stale = [q for q in queue if bypassed(q) and q.job_id in done]
    common: dict[str, Any] = dict(
        recorder=recorder, run_id=lease.run_id, cycle_id=cycle_id, model_version="", logger=logger
    )
    if stale:
        release_held(client, stale, actor=actor + ":untag", command=untag_command, **common)
    lost = [q for q in queue if stranded(q)]
    if lost:  # released where Slurm cannot run them: Slurm places them itself
        release_held(client, lost, actor=actor + ":unstrand", command=clear_nodes_command, **common)
    return release_held(client, [q for q in queue if held_for_loop(q)], actor=actor, **common)


def hand_back(
    client: SlurmClient,
    lease_path: str | os.PathLike[str],
    lease: Lease,
    recorder: Recorder,
    *,
    actor: str,
    logger: logging.Logger,
    grace_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Give the partitions back to Slurm: mark the lease releasing (job_submit.lua holds
    nothing new), sweep, wait ``grace_s`` for a submission that read the lease before, sweep
    again, mark it released. Raises ``SlurmError`` with the lease left ``releasing``."""
    write_lease(lease_path, replace(lease, state="releasing", held=()))
    released = sweep(client, lease, recorder, actor=actor, logger=logger)
    sleep(grace_s)
    released += sweep(client, lease, recorder, actor=actor, logger=logger, untag=released)
    write_lease(lease_path, replace(lease, state="released", held=()))
    log_event(logger, "lease_released", actor=actor, released=released)
    return released
