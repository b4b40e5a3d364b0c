"""Applying the policy's starts in active mode: each checked, then audited, then run.

``plan_starts`` checks every start against the free GPUs, the job's shape (or a flexible
request's split) and the nodes it accepts: a start on nodes the job refuses, or in another
shape than it asked, is moved onto nodes that accept it (``start_checks.place_within``,
``place_flexible_within``) where there is room, else refused, and a job whose shape or split
the policy did not give is handed back; the last guard before ``NumNodes``/``ReqNodeList``
(``widens``) refuses a start that would change what the job asked. ``apply_starts`` writes
every ``scontrol`` argument list as a pending audit row (nothing is run when they cannot be
persisted), then runs them in order, a job's release only after its node list was set.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from linkwise.cluster.domain import Decision, Placement, Start, Topology
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.cluster.slurm.request import widens
from linkwise.deployer.events import log_event
from linkwise.deployer.job_requests import job_request
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.node_rooms import NodeRoom, take_room
from linkwise.deployer.observation import Observation
from linkwise.deployer.recorder import Recorder, RecordError, new_id
from linkwise.deployer.start_checks import (
    check_flexible_start,
    check_start,
    place_flexible_within,
    place_within,
)

__all__ = ["PlannedStart", "StartPlan", "apply_starts", "plan_starts", "start_commands"]


@dataclass(frozen=True)
class PlannedStart:
    """A start that passed every check: the job, its ``scontrol`` commands, its placement."""

    job_id: int
    commands: list[list[str]]
    placement: Placement


@dataclass
class StartPlan:
    """What the checks made of a decision's starts."""

    results: dict[int, str] = field(default_factory=dict)  # refused starts: why
    planned: list[PlannedStart] = field(default_factory=list)
    reshaped: list[tuple[QueuedJob, str]] = field(default_factory=list)  # shape or split
    widened: list[tuple[QueuedJob, str]] = field(default_factory=list)  # refused by ``widens``


def start_commands(job_id: int, names: Sequence[str]) -> list[list[str]]:
    """The ``scontrol`` argument lists that start a held job on the nodes ``names``."""
    return [
        [
            "scontrol",
            "update",
            f"JobId={job_id}",
            f"ReqNodeList={','.join(names)}",
            f"NumNodes={len(names)}",
        ],
        ["scontrol", "release", str(job_id)],
    ]


def _check(
    start: Start,
    job: QueuedJob | None,
    obs: Observation,
    topo: Topology,
    free: list[int],
    rooms: list[NodeRoom],
    refused: tuple[set[int], set[int], float],
) -> tuple[str, str, Placement]:
    """(why it is refused or "", why it was moved or "", the placement to apply) of a start;
    ``refused``: the jobs over max-hold, the jobs met already, and the max-hold."""
    over, seen, max_hold_s = refused
    placement = start.placement
    moved = ""
    if start.job_id in over:
        why = f"max_hold: held over {max_hold_s:g} s, handed back to Slurm"
    elif job is None or start.job_id in seen:
        why = "not a held job of the managed partitions"
    elif job.job_id not in obs.shapes:  # flexible: a GPU count in any split
        why = check_flexible_start(placement, job, free, topo, rooms) or ""
        if why.startswith("constraint"):  # Slurm's own choice on nodes it accepts
            other = place_flexible_within(job, free, topo, rooms)
            if other is not None:
                moved, placement, why = why, other, ""
    else:
        shape = obs.shapes[job.job_id]
        why = check_start(placement, shape, free, topo, job, rooms) or ""
        if why.startswith(("constraint", "shape")):
            # the requested shape on nodes the job accepts, the policy's first
            other = place_within(job, shape, free, topo, rooms, placement.nodes)
            if other is not None:
                moved, placement, why = why, other, ""
    return why, moved, placement


def plan_starts(
    decision: Decision,
    obs: Observation,
    topo: Topology,
    over: set[int],
    max_hold_s: float,
    metrics: ServeMetrics,
    log: logging.Logger,
) -> StartPlan:
    """Check each start in order, each on the GPUs and rooms the earlier ones left; refusals
    and moves counted and logged (see the module)."""
    out = StartPlan()
    free = list(obs.state.free_gpus)
    rooms = list(obs.rooms)
    seen: set[int] = set()
    for start in decision.starts:
        job = obs.managed.get(start.job_id)
        why, moved, placement = _check(start, job, obs, topo, free, rooms, (over, seen, max_hold_s))
        if why:
            out.results[start.job_id] = f"rejected: {why}"
            metrics.rejected.labels(why.split(":")[0]).inc()
            log_event(log, "start_rejected", job_id=start.job_id, reason=why)
            if job is not None and why.startswith(("shape", "split")) and start.job_id not in seen:
                seen.add(start.job_id)
                out.reshaped.append((job, why))
                out.results[start.job_id] += "; handed back to Slurm"
            continue
        assert job is not None
        seen.add(start.job_id)
        fixed = obs.shapes.get(start.job_id)
        if fixed is not None:  # Slurm gives each node the shape's GPUs
            placement = Placement.of([(n, fixed.gpus_per_node) for n in placement.nodes])
        # the last guard before NumNodes/ReqNodeList: exactly what the job asked, no more
        widen = widens(job_request(job), [g for _, g in placement.alloc])
        if widen is not None:
            out.results[start.job_id] = f"rejected: widen: {widen}; handed back to Slurm"
            metrics.rejected.labels("widen").inc()
            log_event(log, "start_widens", logging.ERROR, job_id=job.job_id, reason=widen)
            out.widened.append((job, widen))
            continue
        for n, g in placement.alloc:
            free[n] = 0 if job.exclusive else free[n] - g
            rooms[n] = take_room(rooms[n], job)
        names = [topo.nodes[n].name for n in placement.nodes]
        if moved:
            metrics.moved_starts.inc()
            log_event(log, "start_moved", job_id=job.job_id, reason=moved, nodes=names)
        commands = start_commands(start.job_id, names)
        out.planned.append(PlannedStart(start.job_id, commands, placement))
    return out


def apply_starts(
    planned: Sequence[PlannedStart],
    *,
    client: SlurmClient,
    recorder: Recorder,
    metrics: ServeMetrics,
    log: logging.Logger,
    ids: tuple[str, int],
    version: str,
    now: float,
) -> tuple[dict[int, str], list[PlannedStart]]:
    """Audit, then run, the planned starts (``ids``: the run and cycle ids of the audit
    rows); what became of each, and those applied. Nothing is run when the audit rows
    cannot be persisted."""
    run_id, cycle_id = ids
    audits = [
        {
            "audit_id": new_id(),
            "ts": now,
            "run_id": run_id,
            "cycle_id": cycle_id,
            "actor": "loop",
            "job_id": p.job_id,
            "command": json.dumps(cmd),
            "model_version": version,
            "outcome": "pending",
        }
        for p in planned
        for cmd in p.commands
    ]
    try:
        recorder.write(audits=audits, must_persist=True)
    except RecordError as exc:
        log_event(log, "audit_failed_not_acting", logging.ERROR, error=str(exc)[:300])
        return {p.job_id: "skipped: audit not persisted" for p in planned}, []
    results: dict[int, str] = {}
    applied: list[PlannedStart] = []
    outcomes: list[tuple[str, str, float]] = []
    rows = iter(audits)
    for p in planned:
        result = "applied"
        for cmd in p.commands:
            row = next(rows)
            if result != "applied":
                outcomes.append((str(row["audit_id"]), "skipped", time.time()))
                continue
            try:
                client.runner.run(cmd)
                outcome = "ok"
            except SlurmError as exc:
                outcome = f"error: {str(exc)[:200]}"
                result = f"failed: {cmd[1]}: {str(exc)[:150]}"
            metrics.actions.labels(cmd[1], "ok" if outcome == "ok" else "error").inc()
            outcomes.append((str(row["audit_id"]), outcome, time.time()))
        results[p.job_id] = result
        if result == "applied":
            applied.append(p)
        log_event(log, "start", job_id=p.job_id, command=p.commands[0], outcome=result)
    recorder.write(outcomes=outcomes)
    return results, applied
