"""The live scheduling loop over a real Slurm: ``SlurmBackend`` (active), ``ShadowBackend``.

Both are ``Backend``s for ``linkwise.cluster.loop.drive``, composed of parts that each hold
one concern: the Slurm adapter here (``observe`` reads the queue and the nodes through
``SlurmClient``, retrying while Slurm does not answer, and builds the state with
``observation.build_observation``, every job annotated with the run-time predictor of the
package about to decide; ``apply`` acts in active mode only: it validates each
start against the free GPUs and the job's shape, audits the ``scontrol`` argument lists,
then sets ``ReqNodeList``/``NumNodes`` and releases the job), the decision log
(``decision_log.DecisionLog``: rows, joins with what Slurm did, metrics; it takes a clock),
the lease (``lease_keeper.LeaseKeeper``: locks, renewals, watchdog, hand-back) and the
policy (``policies``). ``ShadowBackend`` changes nothing in Slurm.

Active mode manages only jobs of the named partitions held for it (``holds.held_for_loop``:
held by the shipped ``job_submit.lua``, which tags them ``linkwise:held``); an
administrator's hold, a user's own hold and untagged jobs are left alone. Jobs without
GPUs, held requests that can never fit (reported) and jobs held longer than ``max_hold_s``
are released unchanged to Slurm. A tagged job found no longer held that the loop did not
release was bypassed (released by someone else): counted, logged and untagged.

A Slurm read that fails (``READ_FAULTS``: a ``SlurmError``, or a ``KeyError``/``TypeError``/
``ValueError`` out of parsing what Slurm printed) is counted by kind
(``linkwise_slurm_read_errors_total{kind}``, ``read_fault_kind``) and logged as one
``slurm_read_failed`` line; in active mode the jobs the last good read showed held for the
loop in its own partitions are handed back once (``handed_back{slurm_fault}``; not while
Slurm cannot be reached), the lease is not renewed until a read succeeds again, and the
read is retried after a backoff from ``min(1, interval)`` doubling up to ``backoff_max_s``;
a stop requested meanwhile ends it within 0.2 s (``LoopStopped``; ``serve`` then shuts
down as usual, handing back what it holds).

A cycle is logged (``cycle``) when it did or met something: a start applied or refused, a
move, a hand-back, a read fault before it, or a change in what it saw or decided (the policy,
the pending jobs, the decision: a shadow loop deciding the same starts again is not news,
where its records went); the first cycle always is. An idle cycle is silent, and an idle
loop says it is alive at most once a minute (``idle``, with the cycles since the last line;
``CycleLines``). What counts cycles is ``linkwise_serve_cycles_total`` on ``/metrics`` and
``serve_stop``'s ``cycles``, never the log lines.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Placement,
    Topology,
)
from linkwise.cluster.hostlist import compress, expand
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.cluster.slurm.request import widens
from linkwise.cluster.slurm.schema import SlurmSchemaError
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.decision_log import DecisionLog
from linkwise.deployer.events import log_event
from linkwise.deployer.holds import HOLD_TAG, held_for_loop
from linkwise.deployer.lease import lease_dir_for
from linkwise.deployer.lease_keeper import LeaseKeeper
from linkwise.deployer.locks import valid_name
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.migration import MigrationConfig, MigrationExecutor, moves_of
from linkwise.deployer.observation import (
    Observation,
    build_observation,
    check_flexible_start,
    check_start,
    job_request,
    place_flexible_within,
    place_within,
    read_link_load,
    slurm_topology,
    take_room,
)
from linkwise.deployer.policies import GuardedPolicy, LoadedPolicy, PolicyHolder
from linkwise.deployer.profiles import (
    ProfileHistory,
    default_profile,
    resolve_profiles,
    undeclared,
)
from linkwise.deployer.recorder import Recorder, RecordError, new_id
from linkwise.deployer.release import release_held
from linkwise.deployer.scontrol import clear_nodes_command, untag_command
from linkwise.deployer.systemd import SystemdNotify
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_LEASE_ROOT",
    "IDLE_LOG_S",
    "READ_FAULTS",
    "CycleLines",
    "LoopStopped",
    "ServeConfig",
    "ShadowBackend",
    "SlurmBackend",
    "fault_hand_back",
    "next_backoff",
    "read_fault_kind",
    "serve",
]

Mode = Literal["shadow", "active"]
LOG = logging.getLogger("linkwise.serve")
# what a failed Slurm read raises: the client's errors, and what parsing Slurm's output may
READ_FAULTS: tuple[type[Exception], ...] = (SlurmError, KeyError, TypeError, ValueError)
_UNREACHABLE = frozenset({"unavailable", "timeout"})  # no hand-back: it could not be done


class LoopStopped(RuntimeError):
    """A stop (SIGINT/SIGTERM) came while the loop waited to read Slurm again."""


def read_fault_kind(exc: BaseException) -> str:
    """The kind of a failed Slurm read: unavailable, timeout, schema (JSON this client does not
    read), command (any other Slurm error) or parse (a value parsing could not take)."""
    if isinstance(exc, SlurmUnavailable):
        return "unavailable"
    if isinstance(exc, SlurmTimeout):
        return "timeout"
    if isinstance(exc, SlurmSchemaError):
        return "schema"
    return "command" if isinstance(exc, SlurmError) else "parse"


def next_backoff(delay: float, max_s: float) -> float:
    """The wait after ``delay`` when the next read fails too: doubled, at most ``max_s``."""
    return min(delay * 2, max_s)


def fault_hand_back(
    queue: Sequence[QueuedJob], partitions: Sequence[str], released: Collection[int]
) -> list[QueuedJob]:
    """The jobs a Slurm read fault hands back: held for the loop in the last good read,
    every partition of theirs one of the loop's, and not released by the loop already."""
    mine = set(partitions)
    return [
        q
        for q in queue
        if held_for_loop(q) and set(q.partition.split(",")) <= mine and q.job_id not in released
    ]


DEFAULT_DURATION_S = 3600.0
DEFAULT_LEASE_ROOT = "/var/lib/linkwise/leases"
IDLE_LOG_S = 60.0  # an idle loop logs that it is alive at most this often


@dataclass
class CycleLines:
    """Which cycles get a log line: every cycle that did something or saw a change (``busy``,
    or ``seen`` unlike the last cycle's), and for idle ones one ``idle`` line at most every
    ``every_s`` seconds since the last line (``now`` on a monotonic clock)."""

    every_s: float = IDLE_LOG_S
    last_seen: tuple[object, ...] | None = None
    last_line: float = 0.0  # when the last line was written
    quiet: int = 0  # idle cycles since then

    def note(self, seen: tuple[object, ...], busy: bool, now: float) -> tuple[str, int]:
        """(``"cycle"``, 0) to log this cycle, (``"idle"``, idle cycles since the last line)
        for a heartbeat, (``""``, idle cycles so far) to stay silent."""
        changed, self.last_seen = seen != self.last_seen, seen
        if busy or changed:
            self.last_line, self.quiet = now, 0
            return "cycle", 0
        self.quiet += 1
        if now - self.last_line < self.every_s:
            return "", self.quiet
        idle, self.last_line, self.quiet = self.quiet, now, 0
        return "idle", idle


# ------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``linkwise serve`` is told."""

    mode: Mode
    partitions: tuple[str, ...]
    policy: PolicySpec = field(default_factory=lambda: PolicySpec.parse("backfill"))
    fallback: PolicySpec = field(default_factory=lambda: PolicySpec.parse("backfill"))
    slurm_env: str = "/tmp/linkwise-slurm/env"
    transport: Literal["cli", "rest"] = "cli"
    db: str | None = "linkwise-out/linkwise.duckdb"
    state_dir: str = "linkwise-out/serve"
    interval_s: float = 2.0
    lease_s: float = 30.0
    max_hold_s: float = 900.0
    reload_s: float = 30.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"  # the address /metrics listens on
    max_cycles: int | None = None
    watchdog: bool = True
    load_window_s: float = 120.0
    lease_root: str = DEFAULT_LEASE_ROOT  # one per host: every loop and job_submit.lua share it
    migration: MigrationConfig = field(default_factory=MigrationConfig)  # opted-in jobs
    # the profile of a job that declares none and has no earlier run (deployer/profiles.py);
    # "": a draw from the calibration's mix by a hash of the job id
    default_profile: str = ""
    backoff_max_s: float = 60.0  # the longest wait between failed Slurm reads
    # the model registry (MLflow tracking URI), resolved where serve starts; "": the
    # environment's (``models.registry.default_tracking_uri``)
    tracking_uri: str = ""

    def __post_init__(self) -> None:
        if self.mode not in ("shadow", "active"):
            raise ValueError(f"mode must be shadow or active, got {self.mode!r}")
        if not self.partitions:
            raise ValueError("name at least one partition")
        bad = [p for p in self.partitions if not valid_name(p)]
        if bad:
            raise ValueError(f"invalid partition name(s): {', '.join(map(repr, bad))}")
        if self.interval_s <= 0 or self.lease_s <= 0 or self.backoff_max_s <= 0:
            raise ValueError("interval, lease and backoff_max_s must be positive")
        if self.mode == "active" and self.lease_s < 2 * self.interval_s:
            raise ValueError("the lease must last at least two cycles")
        if self.default_profile:
            default_profile(0, load_calibration(None), self.default_profile)  # a known one

    @property
    def partition_key(self) -> str:
        """The partition set, sorted: the same lease whatever order they were named in."""
        return "_".join(sorted(set(self.partitions)))

    @property
    def lease_name(self) -> str:
        """The lease file's name inside the cluster's lease directory."""
        return f"lease-{self.partition_key}.json"

    @property
    def spool_path(self) -> Path:
        """Where records wait while the store is unavailable."""
        return Path(self.state_dir) / f"{self.mode}-{self.partition_key}.spool.jsonl"


# ------------------------------------------------------------------------ backends


class SlurmBackend:
    """The live loop's Backend over a real Slurm (active mode: it acts; see the module)."""

    mode: Mode = "active"

    def __init__(
        self,
        client: SlurmClient,
        topology: Topology,
        config: ServeConfig,
        policy: GuardedPolicy,
        recorder: Recorder,
        metrics: ServeMetrics,
        *,
        cluster: str = "",
        logger: logging.Logger = LOG,
        stop: threading.Event | None = None,
        sleep: Callable[[float], None] = time.sleep,
        lease_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.client = client
        self.topo = topology
        self.cfg = config
        self.policy = policy
        self.recorder = recorder
        self.metrics = metrics
        self.cluster = cluster or topology.name
        self.log = logger
        self.stop = stop or threading.Event()
        self.sleep = sleep
        self.run_id = new_id()
        self.cycle_id = 0
        self.cycle_started = 0.0
        self.obs: Observation | None = None
        self.decisions = DecisionLog(
            recorder,
            metrics,
            self.run_id,
            self.mode,
            self.cluster,
            config.partitions,
            logger,
            finished=self._sacct_joins,
        )
        folder = Path(lease_dir) if lease_dir is not None else Path(config.lease_root) / "_"
        self.keeper = LeaseKeeper(
            folder / config.lease_name,
            config.partitions,
            config.lease_s,
            self.run_id,
            metrics,
            logger,
            Path(config.state_dir),
            watchdog=config.watchdog,
            sleep=sleep,
        )
        self.released_ids: set[int] = set()  # released by this loop (not bypasses)
        self.first_seen: dict[int, float] = {}
        self.inflight: dict[int, tuple[Placement, float]] = {}  # released, not started
        self.cycles_ok = 0
        self.cycles_failed = 0
        self.heartbeat: Callable[[], object] | None = None  # systemd's watchdog (serve)
        self.queue: list[QueuedJob] = []  # the last queue read (for moves of running jobs)
        self.migration = MigrationExecutor(
            client, recorder, metrics.registry, config.migration, run_id=self.run_id, logger=logger
        )
        self.partition_of: dict[int, str] = {}  # held for the loop -> its partition when seen
        self.moved: list[QueuedJob] = []  # tagged held jobs whose partition changed (a cycle)
        self.moved_ids: set[int] = set()  # counted already
        self.calibration = load_calibration(None)  # profiles for a policy without its own
        self.profile_history = ProfileHistory(recorder)
        self.read_failing = False  # the last Slurm read failed: the lease is not renewed
        self.lines = CycleLines()  # which cycles are logged
        self.acted = 0  # hand-backs, untags, bypasses, read faults, moves met by this cycle

    # -- the Backend protocol

    def observe(self) -> ClusterState:
        """Read Slurm and build the state; a failed read is handled (see the module) and
        retried after a backoff; ``LoopStopped`` when a stop comes meanwhile."""
        delay = min(1.0, self.cfg.interval_s)
        self.acted = 0
        while True:
            self.cycle_id += 1
            self.cycle_started = time.perf_counter()
            self._renew()
            try:
                queue = self.client.queue()
                nodes = self.client.nodes()
            except READ_FAULTS as exc:
                self._read_failed(exc, delay)
                if not self.stop.is_set():
                    self._sleep(delay)
                if self.stop.is_set():
                    raise LoopStopped(f"stopped while Slurm reads failed: {exc}") from None
                delay = next_backoff(delay, self.cfg.backoff_max_s)
                continue
            break
        self.read_failing = False  # the renewal below is the first since the reads failed
        now = time.time()
        load = (
            read_link_load(
                self.recorder,
                self.cluster,
                now - self.cfg.load_window_s,
                on_bad=lambda n: self.metrics.bad_rows.labels("link_load").inc(n),
            )
            if self.recorder.db
            else {}
        )
        inflight = {j: placed for j, (placed, _) in self.inflight.items()}
        predictor = self._predictor(now)
        profiles = resolve_profiles(
            queue,
            self._calibration(),
            self.profile_history.get(undeclared(queue), now),
            self.cfg.default_profile,
        )
        self.obs = build_observation(
            queue,
            nodes,
            self.topo,
            self.cfg.partitions,
            now,
            mode=self.mode,
            link_load=load,
            inflight=inflight,
            predictor=predictor,
            profiles={j: p.profile for j, p in profiles.items()},
            transit=self.migration.in_transit(),
        )
        self._forget_inflight(queue, now)
        self.queue = list(queue)
        self.moved = self._partition_changes(queue, self.obs)
        self._renew()
        self.metrics.pending_jobs.set(len(self.obs.state.pending))
        self.metrics.held_jobs.set(self.obs.held_total)
        self.metrics.foreign_held_jobs.set(self.obs.foreign_held)
        self.metrics.infeasible_jobs.set(len(self.obs.refused))
        self.metrics.observe_holds((q.submit_time for q in queue if held_for_loop(q)), now)
        return self.obs.state

    def _predictor(self, now: float) -> RuntimePredictor | None:
        """The run-time predictor of the policy about to decide (the serving package's, which
        it was trained with; None for a heuristic): the holder is refreshed first, so a model
        that moved is seen with its own predictor."""
        self.policy.holder.refresh(now=now)
        found = getattr(self.policy.holder.active.policy, "predictor", None)
        return found if isinstance(found, RuntimePredictor) else None

    def _calibration(self) -> Calibration:
        """The calibration whose profiles the policy's contention model knows (its own, else
        the shipped one): every live job's profile is one of them (``deployer.profiles``)."""
        model = getattr(self.policy.holder.active.policy, "model", None)
        found = getattr(model, "calibration", None)
        return found if isinstance(found, Calibration) else self.calibration

    def apply(self, decision: Decision) -> None:
        """Record the decision; in active mode validate, audit and apply each start."""
        obs = self.obs
        if obs is None:
            raise RuntimeError("apply before observe")
        info = self.policy.last
        results = self._act(decision, obs, info) if self.mode == "active" else {}
        moved = self._moves(decision, obs, str(info.get("model_version", "")))
        where = self.decisions.record(self.cycle_id, obs, decision, info, self.topo, results)
        elapsed = time.perf_counter() - self.cycle_started
        self.metrics.cycle_seconds.observe(elapsed)
        self.metrics.cycles.labels("ok").inc()
        self.cycles_ok += 1
        pending = tuple(p.job.job_id for p in obs.state.pending)
        decided = (
            tuple((s.job_id, s.placement.nodes) for s in decision.starts),
            tuple(decision.preempt),
            tuple((s.job_id, s.placement.nodes) for s in decision.migrate),
        )
        seen = (info.get("policy"), info.get("model_version"), pending, decided, where)
        busy = bool(results or moved or self.acted)  # active mode: every start has a result
        line, idle = self.lines.note(seen, busy, time.monotonic())
        if line == "idle":
            log_event(
                self.log, "idle", cycles=idle, cycle=self.cycle_id, mode=self.mode,
                policy=info.get("policy"), pending=len(pending), records=where,
            )  # fmt: skip
        elif line == "cycle":
            log_event(
                self.log,
                "cycle",
                cycle=self.cycle_id,
                mode=self.mode,
                policy=info.get("policy"),
                pending=len(pending),
                starts=len(decision.starts),
                latency_ms=round(float(info.get("latency_ms", 0.0)), 3),
                explain_ms=round(float(info.get("explain_ms", 0.0)), 3),
                cycle_ms=round(elapsed * 1e3, 3),
                records=where,
            )

    def advance(self) -> bool:
        """Wait for the next cycle; False once stopped or out of cycles."""
        if self.cfg.max_cycles is not None and self.cycles_ok >= self.cfg.max_cycles:
            return False
        elapsed = time.perf_counter() - self.cycle_started
        self._sleep(max(0.0, self.cfg.interval_s - elapsed))
        return not self.stop.is_set()

    def _moves(self, decision: Decision, obs: Observation, version: str) -> dict[int, str]:
        """The policy's preempt and migrate moves (``deployer.migration``): jobs that opted
        in only; recorded, not taken, in shadow mode; none while the lease is not ours."""
        free = {n.name: f for n, f in zip(self.topo.nodes, obs.state.free_gpus, strict=True)}
        own = (
            {n.name: f for n, f in zip(self.topo.nodes, obs.slurm_free, strict=True)}
            if obs.slurm_free
            else {}
        )
        paused = self.mode == "active" and not self.keeper.ok()
        return self.migration.cycle(
            moves_of(decision, self.topo),
            self.queue,
            free,
            partitions=self.cfg.partitions,
            mode="paused" if paused else self.mode,
            cycle_id=self.cycle_id,
            model_version=version,
            finish_free=own or None,
        )

    # -- lifecycle

    def start(self) -> None:
        """Pick up earlier runs' unjoined decisions; in active mode lock the partitions, take
        the lease and start the watchdog (``LeaseTaken`` when another loop manages any of
        the partitions)."""
        self.decisions.load_awaiting()
        if self.mode == "active":
            runner = self.client.runner
            self.keeper.take(
                runner.slurm_conf, self.recorder.db, str(self.recorder.spool), runner.bin_dir
            )

    def shutdown(self) -> list[int]:
        """Hand the partitions back (active mode); the released job ids."""
        if self.mode != "active":
            return []
        return self.keeper.hand_back(self.client, self.recorder)

    # -- internals

    def _read_failed(self, exc: BaseException, delay: float) -> None:
        """Count and log a failed Slurm read; stop renewing the lease; in active mode hand
        back the jobs the last good read showed held for the loop (Slurm reachable)."""
        kind = read_fault_kind(exc)
        self.read_failing = True
        self.acted += 1
        self.cycles_failed += 1
        self.metrics.cycles.labels("slurm_error").inc()
        self.metrics.slurm_read_errors.labels(kind).inc()
        released: list[int] = []
        if self.mode == "active" and kind not in _UNREACHABLE:
            jobs = fault_hand_back(self.queue, self.cfg.partitions, self.released_ids)
            released = self._release_on_fault(jobs, kind) if jobs else []
        log_event(
            self.log,
            "slurm_read_failed",
            logging.WARNING,
            cycle=self.cycle_id,
            kind=kind,
            error_type=type(exc).__name__,
            error=str(exc)[:300],
            released=released,
            retry_in_s=delay,
        )

    def _release_on_fault(self, jobs: Sequence[QueuedJob], kind: str) -> list[int]:
        """Release ``jobs`` unchanged; each one released is counted once."""
        for q in jobs:
            log_event(
                self.log, "handing_to_slurm", job_id=q.job_id, reason=f"slurm {kind} fault",
                kind="slurm_fault",
            )  # fmt: skip
        released = release_held(
            self.client,
            jobs,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=self.cycle_id,
            actor="loop:slurm_fault",
            model_version="",
            logger=self.log,
        )
        self.metrics.handed_back.labels("slurm_fault").inc(len(released))
        self.released_ids.update(released)
        return released

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(left, 0.2))
            if self.mode == "active" and self.keeper.due():
                self._renew()

    def _renew(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat()
        if self.read_failing:  # the lease lapses while Slurm cannot be read
            return
        obs = self.obs
        try:
            self.keeper.renew(tuple(sorted(obs.managed)) if obs else None)
        except OSError as exc:  # e.g. a full disk: the loop goes on; ``ok()`` stops acting
            log_event(self.log, "lease_renew_failed", logging.ERROR, error=_os_error(exc))

    def _partition_changes(self, queue: Sequence[QueuedJob], obs: Observation) -> list[QueuedJob]:
        """Jobs held for the loop whose partition someone changed since the loop saw them
        (a way out of the loop's hold that job_submit.lua refuses while a loop is live):
        counted as bypasses once, then handed back (still held) or untagged."""
        found = {q.job_id: q for q in obs.partition_moved}
        for q in queue:
            was = self.partition_of.get(q.job_id)
            if was is not None and q.partition != was and q.admin_comment == HOLD_TAG:
                found.setdefault(q.job_id, q)
        self.acted += len(found)
        for q in found.values():
            self.partition_of.pop(q.job_id, None)
            if q.job_id in self.moved_ids:
                continue
            self.moved_ids.add(q.job_id)
            self.metrics.hold_bypasses.inc()
            self.metrics.partition_changes.inc()
            log_event(
                self.log,
                "hold_bypassed",
                logging.WARNING,
                job_id=q.job_id,
                user=q.user,
                how="partition changed",
                partition=q.partition,
            )
        for j, q in obs.managed.items():
            self.partition_of[j] = q.partition
        in_queue = {q.job_id for q in queue}
        for j in [j for j in self.partition_of if j not in in_queue]:
            del self.partition_of[j]
        self.moved_ids &= in_queue
        return [q for q in found.values() if q.state in ("PENDING", "RUNNING")]

    def _act(self, decision: Decision, obs: Observation, info: Mapping[str, Any]) -> dict[int, str]:
        """Validate each start (moved onto nodes Slurm accepts for the job, in the shape it
        asked, when the policy's break its constraints or give another shape), hand back what
        the loop will not place (no GPUs, never fits, not modelled, a shape the policy did not
        give and no room for the asked one now, held over ``max_hold_s``),
        clear the node list of released jobs Slurm cannot run there, then audit and apply
        the starts. Hand-backs come first and happen on every path (a lapsed lease, an
        unwritable store): releasing unchanged is the safe direction."""
        now = time.time()
        for j in obs.managed:
            self.first_seen.setdefault(j, now)
        version = str(info.get("model_version", ""))
        results: dict[int, str] = {}
        free = list(obs.state.free_gpus)
        rooms = list(obs.rooms)
        plan: list[tuple[int, list[list[str]], Placement]] = []
        seen: set[int] = set()
        reshaped: list[tuple[QueuedJob, str]] = []
        widened: list[tuple[QueuedJob, str]] = []  # refused by the last guard (``widens``)
        # over max-hold: handed back whatever the policy says now (a start that is never
        # applied, e.g. for want of an audit, must not keep a job held)
        over = {j for j in obs.managed if now - self.first_seen[j] > self.cfg.max_hold_s}
        for start in decision.starts:
            job = obs.managed.get(start.job_id)
            placement = start.placement
            moved = ""
            if start.job_id in over:
                why = f"max_hold: held over {self.cfg.max_hold_s:g} s, handed back to Slurm"
            elif job is None or start.job_id in seen:
                why = "not a held job of the managed partitions"
            elif job.job_id not in obs.shapes:  # flexible: a GPU count in any split
                why = check_flexible_start(placement, job, free, self.topo, rooms) or ""
                if why.startswith("constraint"):  # Slurm's own choice on nodes it accepts
                    other = place_flexible_within(job, free, self.topo, rooms)
                    if other is not None:
                        moved, placement, why = why, other, ""
            else:
                shape = obs.shapes[job.job_id]
                why = check_start(placement, shape, free, self.topo, job, rooms) or ""
                if why.startswith(("constraint", "shape")):
                    # the requested shape on nodes the job accepts, the policy's first
                    other = place_within(job, shape, free, self.topo, rooms, placement.nodes)
                    if other is not None:
                        moved, placement, why = why, other, ""
            if why:
                results[start.job_id] = f"rejected: {why}"
                self.metrics.rejected.labels(why.split(":")[0]).inc()
                log_event(self.log, "start_rejected", job_id=start.job_id, reason=why)
                if (
                    job is not None
                    and why.startswith(("shape", "split"))
                    and start.job_id not in seen
                ):
                    seen.add(start.job_id)
                    reshaped.append((job, why))
                    results[start.job_id] += "; handed back to Slurm"
                continue
            assert job is not None
            seen.add(start.job_id)
            fixed = obs.shapes.get(start.job_id)
            if fixed is not None:  # Slurm gives each node the shape's GPUs
                placement = Placement.of([(n, fixed.gpus_per_node) for n in placement.nodes])
            # the last guard before NumNodes/ReqNodeList: exactly what the job asked, no more
            widen = widens(job_request(job), [g for _, g in placement.alloc])
            if widen is not None:
                results[start.job_id] = f"rejected: widen: {widen}; handed back to Slurm"
                self.metrics.rejected.labels("widen").inc()
                log_event(self.log, "start_widens", logging.ERROR, job_id=job.job_id, reason=widen)
                widened.append((job, widen))
                continue
            for n, g in placement.alloc:
                free[n] = 0 if job.exclusive else free[n] - g
                rooms[n] = take_room(rooms[n], job)
            names = [self.topo.nodes[n].name for n in placement.nodes]
            if moved:
                self.metrics.moved_starts.inc()
                log_event(self.log, "start_moved", job_id=job.job_id, reason=moved, nodes=names)
            cmds = [
                [
                    "scontrol",
                    "update",
                    f"JobId={start.job_id}",
                    f"ReqNodeList={','.join(names)}",
                    f"NumNodes={len(names)}",
                ],
                ["scontrol", "release", str(start.job_id)],
            ]
            plan.append((start.job_id, cmds, placement))
        self._hand_back(obs, over, reshaped, version, widened)
        self._unstrand(obs, version)
        self._untag(obs, version)
        if not self.keeper.ok():
            log_event(self.log, "lease_lapsed_not_acting", logging.ERROR, cycle=self.cycle_id)
            return results | {job_id: "skipped: lease lapsed" for job_id, _, _ in plan}
        if not plan:
            return results
        audits = [
            {
                "audit_id": new_id(),
                "ts": now,
                "run_id": self.run_id,
                "cycle_id": self.cycle_id,
                "actor": "loop",
                "job_id": job_id,
                "command": json.dumps(cmd),
                "model_version": version,
                "outcome": "pending",
            }
            for job_id, cmds, _ in plan
            for cmd in cmds
        ]
        try:
            self.recorder.write(audits=audits, must_persist=True)
        except RecordError as exc:
            log_event(self.log, "audit_failed_not_acting", logging.ERROR, error=str(exc)[:300])
            return results | {job_id: "skipped: audit not persisted" for job_id, *_ in plan}
        outcomes: list[tuple[str, str, float]] = []
        rows = iter(audits)
        for job_id, cmds, placed in plan:
            result = "applied"
            for cmd in cmds:
                row = next(rows)
                if result != "applied":
                    outcomes.append((str(row["audit_id"]), "skipped", time.time()))
                    continue
                try:
                    self.client.runner.run(cmd)
                    outcome = "ok"
                except SlurmError as exc:
                    outcome = f"error: {str(exc)[:200]}"
                    result = f"failed: {cmd[1]}: {str(exc)[:150]}"
                self.metrics.actions.labels(cmd[1], "ok" if outcome == "ok" else "error").inc()
                outcomes.append((str(row["audit_id"]), outcome, time.time()))
            results[job_id] = result
            if result == "applied":
                self.inflight[job_id] = (placed, time.time())
                self.released_ids.add(job_id)
            log_event(self.log, "start", job_id=job_id, command=cmds[0], outcome=result)
        self.recorder.write(outcomes=outcomes)
        return results

    def _hand_back(
        self,
        obs: Observation,
        over: set[int],
        reshaped: Sequence[tuple[QueuedJob, str]],
        version: str,
        widened: Sequence[tuple[QueuedJob, str]] = (),
    ) -> None:
        """Release unchanged (no node list) the held jobs the loop will not place, each with
        its reason logged and counted (``linkwise_serve_handed_back{reason}``)."""
        out: dict[int, tuple[QueuedJob, str, str]] = {}
        for q in obs.no_gpu:
            if q.job_id in obs.refused:
                kind = obs.kinds.get(q.job_id, "never_fits")
                label = "can never fit" if kind == "never_fits" else "left to Slurm"
                out[q.job_id] = (q, kind, f"{label}: {obs.refused[q.job_id]}")
            else:
                out[q.job_id] = (q, "no_gpu", "no GPUs requested")
        for q, why in reshaped:
            if why.startswith("split"):  # Slurm would split its GPUs otherwise on those nodes
                out[q.job_id] = (q, "split", f"Slurm would not give the policy's split ({why})")
            else:
                out[q.job_id] = (q, "shape", f"the policy did not give its shape ({why})")
        for q, why in widened:
            out[q.job_id] = (q, "widen", f"the start would change its request ({why})")
        for j in sorted(over):
            out.setdefault(j, (obs.managed[j], "max_hold", f"held over {self.cfg.max_hold_s:g} s"))
        for q in self.moved:
            if q.held and q.job_id not in out:
                out[q.job_id] = (q, "partition_changed", f"partition changed to {q.partition}")
        if not out:
            return
        self.acted += len(out)
        for q, kind, reason in out.values():
            self.metrics.handed_back.labels(kind).inc()
            log_event(self.log, "handing_to_slurm", job_id=q.job_id, reason=reason, kind=kind)
        self.released_ids.update(out)
        release_held(
            self.client,
            [q for q, _, _ in out.values()],
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=self.cycle_id,
            actor="loop:unmanaged",
            model_version=version,
            logger=self.log,
        )

    def _unstrand(self, obs: Observation, version: str) -> None:
        """Clear the node list of jobs the loop released that Slurm reports it cannot run
        there (BadConstraints, ReqNodeNotAvail, ...): Slurm then places them itself."""
        if not obs.stranded:
            return
        self.acted += len(obs.stranded)
        for q in obs.stranded:
            self.metrics.unstranded.inc()
            log_event(
                self.log,
                "unstranding",
                logging.WARNING,
                job_id=q.job_id,
                reason=q.reason,
                nodes=compress(q.req_nodes),
            )
        release_held(
            self.client,
            obs.stranded,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=self.cycle_id,
            actor="loop:unstrand",
            model_version=version,
            logger=self.log,
            command=clear_nodes_command,
        )

    def _untag(self, obs: Observation, model_version: str) -> None:
        """End the claim on tagged jobs no longer held; count those the loop did not release
        (bypasses: released by someone else, e.g. by their user while no live loop held)."""
        known = {q.job_id for q in obs.bypassed}
        # moved out of the managed partitions and released there: counted when seen moved
        gone = [*obs.bypassed, *(q for q in self.moved if not q.held and q.job_id not in known)]
        if not gone:
            return
        self.acted += len(gone)
        others = [
            q
            for q in obs.bypassed
            if q.job_id not in self.released_ids and q.job_id not in self.moved_ids
        ]
        for q in others:
            self.metrics.hold_bypasses.inc()
            log_event(self.log, "hold_bypassed", logging.WARNING, job_id=q.job_id, user=q.user)
        release_held(
            self.client,
            gone,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=self.cycle_id,
            actor="loop:untag",
            model_version=model_version,
            logger=self.log,
            command=untag_command,
        )

    def _forget_inflight(self, queue: Sequence[QueuedJob], now: float) -> None:
        in_queue = {q.job_id for q in queue}
        self.released_ids &= in_queue
        pending = {q.job_id for q in queue if q.state == "PENDING"}
        for j in list(self.inflight):
            if j not in pending or now - self.inflight[j][1] > 60:
                del self.inflight[j]
        for j in list(self.first_seen):
            if j not in pending:
                del self.first_seen[j]

    def _sacct_joins(self, ids: Sequence[int]) -> list[tuple[int, float, str]]:
        """(job, start, nodes) from ``sacct`` for jobs that left the queue unseen."""
        args = ["sacct", "-a", "-X", "-P", "-n", "-o", "JobIDRaw,Start,End,NNodes,NodeList"]
        args += ["-j", ",".join(str(i) for i in ids)]
        try:
            text = self.client.runner.run(args, extra_env={"SLURM_TIME_FORMAT": "%s"})
        except SlurmError as exc:
            log_event(self.log, "join_failed", logging.WARNING, error=str(exc)[:200])
            return []
        out: list[tuple[int, float, str]] = []
        now = time.time()
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) != 5 or not parts[0].isdigit():
                continue
            job, start, end, nnodes, nodelist = parts
            if not start.isdigit() or nodelist in ("", "None assigned"):
                continue
            try:
                hosts = expand(nodelist)
            except ValueError:
                continue
            settled = end.isdigit() and now - int(end) > 5 and str(len(hosts)) == nnodes
            if settled:
                out.append((int(job), float(start), compress(hosts)))
        return out


class ShadowBackend(SlurmBackend):
    """Records what the policy would do and what Slurm did; changes nothing in Slurm."""

    mode: Mode = "shadow"


def _os_error(exc: OSError) -> str:
    """An OS error's message, naming ENOSPC (a full disk) where it is one."""
    text = str(exc)[:300]
    return f"ENOSPC: {text}" if exc.errno == errno.ENOSPC and "ENOSPC" not in text else text


# ------------------------------------------------------------------------ the serve loop


def serve(
    config: ServeConfig,
    *,
    client: SlurmClient | None = None,
    policy: LoadedPolicy | None = None,
    stop: threading.Event | None = None,
    logger: logging.Logger = LOG,
    install_signals: bool = False,
) -> dict[str, Any]:
    """Run the loop until stopped (or ``max_cycles``); a summary. Active mode releases what it
    holds on the way out (also on an exception); ``kill -9`` is the watchdog's job."""
    env = read_env_file(config.slurm_env)
    if client is None:
        client = SlurmClient.from_env(env, config.transport)
    slurm_conf = env.get("SLURM_CONF") or client.runner.slurm_conf
    if not slurm_conf:
        raise ValueError(f"{config.slurm_env}: no SLURM_CONF")
    cluster = env.get("LINKWISE_SLURM_CLUSTER", "slurm")
    topo = slurm_topology(slurm_conf, name=cluster)
    lease_dir = lease_dir_for(config.lease_root, Path(slurm_conf).read_text(encoding="utf-8"))
    metrics = ServeMetrics()
    metrics.max_hold.set(config.max_hold_s)
    if config.metrics_port is not None:
        metrics.serve_http(config.metrics_port, config.metrics_addr)
    stop = stop or threading.Event()
    if install_signals:

        def _stop(signum: int, frame: FrameType | None) -> None:
            log_event(logger, "stop_requested", signal=signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    holder = PolicyHolder(
        config.policy,
        config.fallback,
        metrics=metrics,
        logger=logger,
        reload_s=config.reload_s,
        loader=(lambda _spec: policy) if policy is not None else None,
        probe=(lambda _spec: "fixed") if policy is not None else None,
        tracking_uri=config.tracking_uri or None,
    )
    guarded = GuardedPolicy(holder, metrics, logger)
    recorder = Recorder(
        config.db,
        config.spool_path,
        logger=logger,
        on_lost=lambda n: metrics.lost_records.inc(n),
        on_spooled=lambda n: metrics.spooled_records.set(n),
        on_audit_lost=lambda n: metrics.audit_unwritten.inc(n),
    )
    cls = SlurmBackend if config.mode == "active" else ShadowBackend
    backend = cls(
        client,
        topo,
        config,
        guarded,
        recorder,
        metrics,
        cluster=cluster,
        logger=logger,
        stop=stop,
        lease_dir=lease_dir,
    )
    log_event(
        logger,
        "serve_start",
        mode=config.mode,
        partitions=list(config.partitions),
        policy=holder.active.name,
        model_version=holder.active.model_version,
        run_id=backend.run_id,
        nodes=len(topo.nodes),
    )
    backend.start()
    notify = SystemdNotify.from_env()  # a no-op outside systemd
    backend.heartbeat = notify.alive
    notify.ready(f"{config.mode} on {','.join(config.partitions)}, run {backend.run_id}")
    released: list[int] = []
    try:
        drive(backend, guarded)
    except LoopStopped as exc:
        log_event(logger, "stopped_during_backoff", reason=str(exc)[:300])
    finally:
        notify.stopping()
        released = backend.shutdown()
        if recorder.db and recorder.spooled():
            recorder.write()  # a last try to move the spool into the store
        log_event(
            logger,
            "serve_stop",
            cycles=backend.cycles_ok,
            failed_cycles=backend.cycles_failed,
            released=released,
            spooled=recorder.spooled(),
        )
    return {
        "run_id": backend.run_id,
        "cycles": backend.cycles_ok,
        "failed_cycles": backend.cycles_failed,
        "released": released,
        "spooled": recorder.spooled(),
        "metrics": metrics.text(),
    }
