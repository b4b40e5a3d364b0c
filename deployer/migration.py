"""Preempting and migrating running jobs that opted in, on a real Slurm: pure planning and a
small executor over the one ``SlurmClient``.

Opt-in (the user's choice, read from Slurm right before acting, ``scontrol -o show job``):
the job was submitted with ``--requeue`` and its comment carries the tag
``linkwise:migratable`` (``linkwise:migratable@GRACE``: the seconds it needs to checkpoint
after SIGUSR1, the ``GRACE`` of its ``--signal=B:USR1@GRACE``; without it the operator's
default). Every other job is never signalled, requeued or moved.

Rules (``MigrationConfig``): a per-job preemption budget (Slurm's own restart count, so it
survives restarts of the loop), a minimum run time since the job's last (re)start, a migration
target with the job's node count and room for its GPUs, one move at a time per job.

A move takes two steps, each command audited (DuckDB ``audit``, ``must_persist``) before it
runs and its outcome recorded after:

1. ``scancel --batch --signal=USR1 JOB``: the job checkpoints; it keeps its GPUs meanwhile;
2. once its grace is over (a later cycle: the loop keeps renewing its lease meanwhile):
   ``AdminComment=linkwise:held`` (from here on the job is the loop's: the watchdog and the
   hand-back release it, ``holds.held_for_loop``, even after ``kill -9`` of the loop), then
   ``scontrol requeuehold JOB`` (Slurm shows it held, ``JobHeldUser``). A preempted job stays
   so: a held job of the loop, placed again by the policy (or handed to Slurm after
   ``max_hold_s``). A migrated one gets ``ReqNodeList``/``NumNodes`` of its target, is released
   and untagged (``linkwise:released``): it restarts there with the same job id
   (``SLURM_RESTART_COUNT`` + 1) once Slurm's credential expiry allows.

Shadow mode records the would-be commands as audit rows with the outcome ``shadow`` and runs
nothing. Counters: ``linkwise_serve_preemptions_total``, ``linkwise_serve_migrations_total``
(by mode), ``linkwise_serve_migration_failures_total`` (by stage),
``linkwise_serve_moves_refused_total`` (by reason).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter

from linkwise.cluster.domain import Decision, Topology
from linkwise.cluster.slurm.client import (
    SlurmClient,
    admin_comment_args,
    requeue_args,
    set_nodes_args,
    signal_args,
)
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.deployer.events import log_event
from linkwise.deployer.holds import HOLD_TAG, RELEASED_TAG, in_partitions
from linkwise.deployer.recorder import Recorder, RecordError, new_id
from linkwise.deployer.scontrol import release_command

__all__ = [
    "MIGRATABLE_TAG",
    "InTransit",
    "MigrationConfig",
    "MigrationExecutor",
    "Move",
    "Planned",
    "Refused",
    "check_move",
    "moves_of",
    "opt_in_grace",
    "opted_in",
    "plan",
]

MIGRATABLE_TAG = "linkwise:migratable"
_TAG = re.compile(r"(?:^|[\s,;])linkwise:migratable(?:@(\d+(?:\.\d+)?))?(?=$|[\s,;])")
Kind = Literal["preempt", "migrate"]


@dataclass(frozen=True)
class MigrationConfig:
    """The operator's rules for preempting and migrating opted-in jobs."""

    grace_s: float = 30.0  # checkpoint time when the tag names none
    max_grace_s: float = 600.0  # a longer grace in a tag is cut to this
    budget: int = 3  # moves per job over its life (Slurm's restart count)
    min_run_s: float = 600.0  # run time since its last (re)start before a job may be moved
    settle_s: float = 10.0  # how long a requeued job may take to show PENDING
    signal: str = "USR1"

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.max_grace_s < 0 or self.min_run_s < 0 or self.settle_s < 0:
            raise ValueError("migration times must be non-negative")
        if self.budget < 0:
            raise ValueError("the preemption budget must be non-negative")
        signal_args(0, self.signal)  # validates the name


@dataclass(frozen=True)
class Move:
    """What a policy asks for one running job: preempt it, or migrate it to ``nodes``."""

    job_id: int
    kind: Kind
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """An allowed move and the grace its job gets to checkpoint."""

    move: Move
    grace_s: float


@dataclass(frozen=True)
class Refused:
    """A move that is not taken, and why."""

    move: Move
    reason: str


@dataclass(frozen=True)
class InTransit:
    """A move under way, as the live observation shows it (``ClusterState.transit``):
    ``draining`` (signalled, it holds its GPUs until ``until``) or, for a migration already
    requeued onto its target, waiting for Slurm to restart it there. ``target``: the
    migration's nodes (empty for a preemption, which goes back to the queue)."""

    job_id: int
    target: tuple[str, ...]
    until: float
    draining: bool


# ------------------------------------------------------------------------ pure planning


def opted_in(comment: str, requeue: bool) -> bool:
    """Whether a job opted in to preemption and migration: requeue-able, and its comment
    carries ``linkwise:migratable`` (the one place the marker is read)."""
    return requeue and _TAG.search(comment) is not None


def opt_in_grace(fields: Mapping[str, str], cfg: MigrationConfig) -> float | None:
    """The grace (s) of a job that opted in, from its ``scontrol show job`` fields; None if it
    did not (no ``linkwise:migratable`` in its comment, or not requeue-able)."""
    comment = fields.get("Comment", "")
    if not opted_in(comment, fields.get("Requeue") == "1"):
        return None
    m = _TAG.search(comment)
    assert m is not None
    return min(float(m.group(1)) if m.group(1) else cfg.grace_s, cfg.max_grace_s)


def moves_of(decision: Decision, topology: Topology) -> list[Move]:
    """A policy's ``preempt`` and ``migrate`` as moves with node names."""
    moves = [Move(j, "preempt") for j in decision.preempt]
    for start in decision.migrate:
        names = tuple(topology.nodes[n].name for n in start.placement.nodes)
        moves.append(Move(start.job_id, "migrate", names))
    return moves


def check_move(
    move: Move,
    job: QueuedJob | None,
    fields: Mapping[str, str],
    now: float,
    cfg: MigrationConfig,
    partitions: Iterable[str],
    free: Mapping[str, int],
) -> str:
    """Why ``move`` may not be taken ("" if it may). ``job``: the job in the queue; ``fields``:
    its ``scontrol show job`` record; ``free``: free GPUs per node name."""
    if job is None or job.state != "RUNNING":
        return "not running"
    if not in_partitions(job, partitions):
        return "not managed: not in the managed partitions"
    if opt_in_grace(fields, cfg) is None:
        return "not opted in"
    if job.admin_comment not in ("", HOLD_TAG, RELEASED_TAG):
        return "not managed: it carries an administrator's comment"
    restarts = int(fields.get("Restarts", "0") or 0)
    if restarts >= cfg.budget:
        return f"budget spent: restarted {restarts} time(s), budget {cfg.budget}"
    ran = now - (job.start_time or now)
    if ran < cfg.min_run_s:
        return f"min run time: ran {ran:.0f} s of {cfg.min_run_s:g} s"
    if move.kind == "migrate":
        return _target_problem(move.nodes, job, free)
    return ""


def _target_problem(nodes: Sequence[str], job: QueuedJob, free: Mapping[str, int]) -> str:
    if len(nodes) != max(1, job.num_nodes) or len(set(nodes)) != len(nodes):
        return f"bad target: {len(set(nodes))} distinct node(s), the job has {job.num_nodes}"
    if tuple(sorted(nodes)) == tuple(sorted(job.nodes)):
        return "bad target: where it runs now"
    per = job.gpus // max(1, job.num_nodes)
    for n in nodes:
        if n not in free:
            return f"bad target: unknown or unusable node {n}"
        room = free[n] + (per if n in job.nodes else 0)
        if room < per:
            return f"no room: {n} has {room} free GPU(s), the job needs {per}"
    return ""


def plan(
    moves: Sequence[Move],
    queue: Sequence[QueuedJob],
    details: Callable[[int], Mapping[str, str]],
    now: float,
    cfg: MigrationConfig,
    partitions: Iterable[str],
    free: Mapping[str, int],
    busy: Iterable[int] = (),
) -> tuple[list[Planned], list[Refused]]:
    """Split ``moves`` into those allowed and those refused (``busy``: jobs already moving).
    ``details(job_id)`` is read only for jobs that pass the queue's checks."""
    by_id = {q.job_id: q for q in queue}
    left = dict(free)
    taken = set(busy)
    parts = tuple(partitions)
    ok: list[Planned] = []
    refused: list[Refused] = []
    for move in moves:
        job = by_id.get(move.job_id)
        if move.job_id in taken:
            refused.append(Refused(move, "busy: already moving, or asked twice"))
            continue
        fields: Mapping[str, str] = {}
        if job is not None and job.state == "RUNNING" and in_partitions(job, parts):
            fields = details(move.job_id)
        why = check_move(move, job, fields, now, cfg, parts, left)
        if why:
            refused.append(Refused(move, why))
            continue
        assert job is not None
        taken.add(move.job_id)
        per = job.gpus // max(1, job.num_nodes)
        for n in move.nodes:
            left[n] = left[n] + (per if n in job.nodes else 0) - per
        ok.append(Planned(move, opt_in_grace(fields, cfg) or 0.0))
    return ok, refused


def second_step(move: Move) -> list[list[str]]:
    """The commands after the grace: claim, requeue held, and for a migration place, release
    and end the claim."""
    j = move.job_id
    cmds = [admin_comment_args(j, HOLD_TAG), requeue_args(j, hold=True)]
    if move.kind == "migrate":
        cmds += [set_nodes_args(j, move.nodes), release_command(j)]
        cmds.append(admin_comment_args(j, RELEASED_TAG))
    return cmds


# ------------------------------------------------------------------------ the executor


class MigrationMetrics:
    """The executor's counters, in the loop's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.preemptions = Counter(
            "linkwise_serve_preemptions",
            "Opted-in jobs requeue-held by the loop (or would be, in shadow mode)",
            ["mode"],
            registry=registry,
        )
        self.migrations = Counter(
            "linkwise_serve_migrations",
            "Opted-in jobs requeued onto new nodes (or would be, in shadow mode)",
            ["mode"],
            registry=registry,
        )
        self.failures = Counter(
            "linkwise_serve_migration_failures",
            "Preemption or migration steps that failed",
            ["stage"],
            registry=registry,
        )
        self.refused = Counter(
            "linkwise_serve_moves_refused",
            "Preempt or migrate requests refused",
            ["reason"],
            registry=registry,
        )
        for mode in ("shadow", "active"):  # their series exist from the start (dashboards)
            self.preemptions.labels(mode)
            self.migrations.labels(mode)
        for stage in ("signal", "requeue", "target", "place", "release"):
            self.failures.labels(stage)


@dataclass(frozen=True)
class _Draining:
    move: Move
    due: float  # when the grace is over


class MigrationExecutor:
    """Carries out planned moves over cycles: ``cycle`` signals new moves and finishes those
    whose grace is over; ``run_now`` does one batch of moves from start to end (waiting out
    the grace), for an operator's one-shot and the tests."""

    def __init__(
        self,
        client: SlurmClient,
        recorder: Recorder,
        registry: CollectorRegistry,
        cfg: MigrationConfig | None = None,
        *,
        run_id: str,
        logger: logging.Logger,
        actor: str = "loop:migrate",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.metrics = MigrationMetrics(registry)
        self.cfg = cfg or MigrationConfig()
        self.run_id = run_id
        self.log = logger
        self.actor = actor
        self.clock = clock
        self.sleep = sleep
        self.draining: dict[int, _Draining] = {}
        self.restarting: dict[int, _Draining] = {}  # migrated, waiting to start on target

    def in_transit(self) -> tuple[InTransit, ...]:
        """The moves under way, for the live observation (``observation.build_observation``):
        jobs signalled and within their grace, and migrated jobs not yet restarted."""
        return tuple(
            InTransit(j, d.move.nodes, d.due, True) for j, d in self.draining.items()
        ) + tuple(InTransit(j, d.move.nodes, d.due, False) for j, d in self.restarting.items())

    # -- the loop's entry point

    def cycle(
        self,
        moves: Sequence[Move],
        queue: Sequence[QueuedJob],
        free: Mapping[str, int],
        *,
        partitions: Iterable[str],
        mode: Literal["active", "shadow", "paused"],
        cycle_id: int,
        model_version: str = "",
        finish_free: Mapping[str, int] | None = None,
    ) -> dict[int, str]:
        """Finish the moves whose grace is over, then plan and start ``moves``; what became
        of each job asked about. ``mode``: active acts; shadow records would-be moves;
        paused (the lease is not the loop's now) does nothing, moves under way wait.
        ``finish_free``: the free GPUs a finishing move's target is checked against
        (default ``free``; the live loop's ``free`` has the targets of moves under way
        reserved, so it passes the count without them)."""
        now = self.clock()
        if mode == "paused":
            return {m.job_id: "skipped: lease lapsed" for m in moves}
        results = self.finish_due(
            queue,
            free if finish_free is None else finish_free,
            active=mode == "active",
            cycle_id=cycle_id,
            model_version=model_version,
        )
        if not moves:
            return results
        ok, refused = plan(
            moves,
            queue,
            self._details,
            now,
            self.cfg,
            partitions,
            free,
            busy=self.draining,
        )
        for r in refused:
            self.metrics.refused.labels(r.reason.split(":")[0]).inc()
            log_event(
                self.log, "move_refused", job_id=r.move.job_id, kind=r.move.kind, reason=r.reason
            )
            results[r.move.job_id] = f"refused: {r.reason}"
        for p in ok:
            results[p.move.job_id] = self._begin(p, now, mode == "active", cycle_id, model_version)
        return results

    def finish_due(
        self,
        queue: Sequence[QueuedJob],
        free: Mapping[str, int],
        *,
        active: bool,
        cycle_id: int,
        model_version: str = "",
    ) -> dict[int, str]:
        """The second step of every move whose grace is over (only while ``active``)."""
        results: dict[int, str] = {}
        if not active:
            return results
        now = self.clock()
        by_id = {q.job_id: q for q in queue}
        for job_id in list(self.restarting):  # restarted (or gone, or no longer placed)
            q = by_id.get(job_id)
            if (
                q is None
                or q.state != "PENDING"
                or set(q.req_nodes) != set(self.restarting[job_id].move.nodes)
            ):
                del self.restarting[job_id]
        for job_id, d in list(self.draining.items()):
            if d.due > now:
                continue
            del self.draining[job_id]
            job = by_id.get(job_id)
            if job is None or job.state != "RUNNING":
                results[job_id] = "dropped: ended during its grace"
                log_event(self.log, "move_dropped", job_id=job_id, reason="ended during grace")
                continue
            if d.move.kind == "migrate":
                why = _target_problem(d.move.nodes, job, free)
                if why:  # the target filled up meanwhile: the job keeps running where it is
                    self.metrics.failures.labels("target").inc()
                    log_event(
                        self.log, "move_abandoned", logging.WARNING, job_id=job_id, reason=why
                    )
                    results[job_id] = f"abandoned: {why}"
                    continue
            results[job_id] = self._finish(d.move, cycle_id, model_version)
        return results

    # -- a one-shot

    def run_now(
        self,
        moves: Sequence[Move],
        *,
        partitions: Iterable[str],
        model_version: str = "",
        timeout_s: float | None = None,
    ) -> dict[int, str]:
        """Plan ``moves`` against Slurm now, signal them, wait out their grace and finish
        them (active); what became of each."""
        parts = tuple(partitions)
        queue, free = self._read()
        results = self.cycle(
            moves,
            queue,
            free,
            partitions=parts,
            mode="active",
            cycle_id=-1,
            model_version=model_version,
        )
        limit = self.clock() + (timeout_s if timeout_s is not None else self.cfg.max_grace_s + 60)
        while self.draining and self.clock() < limit:
            wait = min(d.due for d in self.draining.values()) - self.clock()
            if wait > 0:
                self.sleep(wait)
            queue, free = self._read()
            results |= self.finish_due(
                queue, free, active=True, cycle_id=-1, model_version=model_version
            )
        return results

    # -- internals

    def _read(self) -> tuple[list[QueuedJob], dict[str, int]]:
        queue = self.client.queue()
        free = {n.name: max(0, n.gpus_total - n.gpus_used) for n in self.client.nodes()}
        return queue, free

    def _details(self, job_id: int) -> Mapping[str, str]:
        try:
            return self.client.show_job(job_id)
        except SlurmError as exc:
            log_event(
                self.log, "show_job_failed", logging.WARNING, job_id=job_id, error=str(exc)[:200]
            )
            return {}

    def _audit(
        self,
        job_id: int,
        cmds: Sequence[Sequence[str]],
        cycle_id: int,
        model_version: str,
        outcome: str = "pending",
        actor: str | None = None,
    ) -> list[str]:
        """Persist one audit row per command (``RecordError`` if it cannot be); their ids."""
        now = self.clock()
        rows = [
            {
                "audit_id": new_id(),
                "ts": now,
                "run_id": self.run_id,
                "cycle_id": cycle_id,
                "actor": actor or self.actor,
                "job_id": job_id,
                "command": json.dumps(list(cmd)),
                "model_version": model_version,
                "outcome": outcome,
            }
            for cmd in cmds
        ]
        self.recorder.write(audits=rows, must_persist=True)
        return [str(r["audit_id"]) for r in rows]

    def _begin(
        self, p: Planned, now: float, active: bool, cycle_id: int, model_version: str
    ) -> str:
        """Shadow: record the whole would-be sequence. Active: audit and send the signal."""
        move = p.move
        sig = signal_args(move.job_id, self.cfg.signal)
        if not active:
            try:
                self._audit(
                    move.job_id,
                    [sig, *second_step(move)],
                    cycle_id,
                    model_version,
                    outcome="shadow",
                    actor=f"shadow:{move.kind}",
                )
            except RecordError as exc:
                log_event(self.log, "shadow_record_lost", logging.ERROR, error=str(exc)[:200])
            counter = (
                self.metrics.migrations if move.kind == "migrate" else self.metrics.preemptions
            )
            counter.labels("shadow").inc()
            log_event(
                self.log,
                "would_move",
                job_id=move.job_id,
                kind=move.kind,
                nodes=list(move.nodes),
                grace_s=p.grace_s,
            )
            return "shadow"
        outcome = self._run(move.job_id, [sig], cycle_id, model_version)
        if outcome:
            self.metrics.failures.labels("signal").inc()
            return f"failed: signal: {outcome}"
        self.draining[move.job_id] = _Draining(move, now + p.grace_s)
        log_event(
            self.log,
            "move_signalled",
            job_id=move.job_id,
            kind=move.kind,
            nodes=list(move.nodes),
            grace_s=p.grace_s,
        )
        return "signalled"

    def _run(
        self,
        job_id: int,
        cmds: Sequence[Sequence[str]],
        cycle_id: int,
        version: str,
        *,
        retries: int = 0,
        must_audit: bool = True,
    ) -> str:
        """Audit ``cmds``, then run them in order until one fails: "" or the first error.
        ``must_audit`` False: run even when the audit cannot be persisted (releasing a job
        is safer unaudited than stranded held)."""
        try:
            ids = self._audit(job_id, cmds, cycle_id, version)
        except RecordError as exc:
            log_event(
                self.log,
                "audit_failed",
                logging.ERROR,
                job_id=job_id,
                error=str(exc)[:200],
                acting=not must_audit,
            )
            if must_audit:
                return f"audit not persisted: {exc}"
            ids = [""] * len(cmds)
        outcomes: list[tuple[str, str, float]] = []
        error = ""
        for audit_id, cmd in zip(ids, cmds, strict=True):
            if error:
                outcomes.append((audit_id, "skipped", self.clock()))
                continue
            for attempt in range(retries + 1):
                try:
                    self.client.runner.run(cmd)
                    error = ""
                    break
                except SlurmError as exc:
                    error = str(exc)[:200]
                    if attempt < retries:
                        self.sleep(min(1.0, self.cfg.settle_s / max(1, retries)))
            outcomes.append((audit_id, f"error: {error}" if error else "ok", self.clock()))
        self.recorder.write(outcomes=[o for o in outcomes if o[0]])
        return error

    def _finish(self, move: Move, cycle_id: int, version: str) -> str:
        """Claim, requeue held, then (a migration) place, release, untag; what happened."""
        j = move.job_id
        claim, requeue = second_step(move)[:2]
        error = self._run(j, [claim, requeue], cycle_id, version)
        if error:
            self.metrics.failures.labels("requeue").inc()
            log_event(self.log, "requeue_failed", logging.ERROR, job_id=j, error=error)
            # a failed claim or requeue leaves the job running; end a claim that was set
            self._run(j, [admin_comment_args(j, RELEASED_TAG)], cycle_id, version, must_audit=False)
            return f"failed: requeue: {error}"
        if move.kind == "preempt":
            self.metrics.preemptions.labels("active").inc()
            log_event(self.log, "preempted", job_id=j, state="held for the loop")
            return "preempted: held for the loop"
        retries = max(1, int(self.cfg.settle_s))
        placed = self._run(j, [set_nodes_args(j, move.nodes)], cycle_id, version, retries=retries)
        if placed:
            self.metrics.failures.labels("place").inc()
        # the job must run: released even when it could not be placed (Slurm places it then)
        released = self._run(
            j, [release_command(j)], cycle_id, version, retries=3, must_audit=False
        )
        if released:  # still held for the loop: the loop's max-hold, hand-back or watchdog
            self.metrics.failures.labels("release").inc()
            log_event(self.log, "release_failed", logging.ERROR, job_id=j, error=released)
            return f"failed: release: {released}"
        self._run(j, [admin_comment_args(j, RELEASED_TAG)], cycle_id, version, must_audit=False)
        if placed:
            log_event(self.log, "migration_unplaced", logging.WARNING, job_id=j, error=placed)
            return f"requeued unplaced: {placed}"
        self.metrics.migrations.labels("active").inc()
        self.restarting[j] = _Draining(move, self.clock())
        log_event(self.log, "migrated", job_id=j, nodes=list(move.nodes))
        return "migrated"
