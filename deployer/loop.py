"""The live scheduling loop over a real Slurm: ``SlurmBackend`` (active), ``ShadowBackend``.

Both are ``Backend``s for ``linkwise.cluster.loop.drive``, composed of parts that each hold
one concern: reading Slurm here (``observe`` reads the queue and the nodes through
``SlurmClient``, retrying while Slurm does not answer (``slurm_reads``), and builds the state
with ``observation.build_observation``, every job annotated with the run-time predictor of
the package about to decide); the starts (``starts``: ``apply`` acts in active mode only: it
validates each start against the free GPUs and the job's shape, audits the ``scontrol``
argument lists, then sets ``ReqNodeList``/``NumNodes`` and releases the job); the hand-backs
(``hand_backs.HandBacks``); the moves of running jobs (``migration``); the decision log
(``decision_log.DecisionLog``: rows, joins with what Slurm did, metrics; it takes a clock);
the lease (``lease_keeper.LeaseKeeper``: locks, renewals, watchdog, hand-back); the policy
(``policies``); which cycles are logged (``cycle_lines``). ``ShadowBackend`` changes nothing
in Slurm.

Active mode manages only jobs of the named partitions held for it (``holds.held_for_loop``:
held by the shipped ``job_submit.lua``, which tags them ``linkwise:held``); an
administrator's hold, a user's own hold and untagged jobs are left alone. Jobs without
GPUs, held requests that can never fit (reported) and jobs held longer than ``max_hold_s``
are released unchanged to Slurm. A tagged job found no longer held that the loop did not
release was bypassed (released by someone else): counted, logged and untagged.

A Slurm read that fails is counted by kind (``linkwise_slurm_read_errors_total{kind}``,
``slurm_reads.read_fault_kind``) and logged as one ``slurm_read_failed`` line; in active mode
the jobs the last good read showed held for the loop in its own partitions are handed back
once (``handed_back{slurm_fault}``; not while Slurm cannot be reached), the lease is not
renewed until a read succeeds again, and the read is retried after a backoff from
``min(1, interval)`` doubling up to ``backoff_max_s``; a stop requested meanwhile ends it
within 0.2 s (``LoopStopped``; ``serve`` then shuts down as usual, handing back what it
holds).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from linkwise.cluster.domain import ClusterState, Decision, Placement, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.calibration import CalibrationResolver
from linkwise.deployer.cycle_lines import CycleLines, log_cycle
from linkwise.deployer.decision_log import DecisionLog
from linkwise.deployer.drift import DriftMonitor, LiveRun
from linkwise.deployer.events import log_event
from linkwise.deployer.hand_backs import HandBacks, fault_hand_back
from linkwise.deployer.holds import held_for_loop
from linkwise.deployer.lease import lease_dir_for
from linkwise.deployer.lease_keeper import LeaseKeeper
from linkwise.deployer.link_load import read_link_load
from linkwise.deployer.locks import valid_name
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.migration import MigrationConfig, MigrationExecutor, moves_of
from linkwise.deployer.observation import Observation, build_observation, slurm_topology
from linkwise.deployer.policies import GuardedPolicy, LoadedPolicy, PolicyHolder
from linkwise.deployer.profiles import (
    LearnedBook,
    ProfileHistory,
    default_profile,
    resolve_profiles,
    source_counts,
    undeclared,
)
from linkwise.deployer.recorder import Recorder, new_id
from linkwise.deployer.slurm_reads import (
    READ_FAULTS,
    UNREACHABLE,
    LoopStopped,
    next_backoff,
    read_fault_kind,
    sacct_joins,
)
from linkwise.deployer.starts import apply_starts, plan_starts
from linkwise.deployer.systemd import SystemdNotify
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_LEASE_ROOT",
    "ServeConfig",
    "ShadowBackend",
    "SlurmBackend",
    "serve",
]

Mode = Literal["shadow", "active"]
LOG = logging.getLogger("linkwise.serve")
DEFAULT_LEASE_ROOT = "/var/lib/linkwise/leases"


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
    # the calibration file to use (--calibration); None: the rule of deployer/calibration.py
    # (the package's own, else the cluster's newest fit in the tracking store, else shipped)
    calibration: str | None = None
    calibration_timeout_s: float = 10.0  # a tracking store slower than this: shipped

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
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise ValueError(f"calibration: no such file {self.calibration!r}")
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
            finished=lambda ids: sacct_joins(client, ids, logger),
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
        self.hand_backs = HandBacks(
            client, recorder, metrics, logger, self.run_id, config.max_hold_s
        )
        self.first_seen: dict[int, float] = {}
        self.inflight: dict[int, tuple[Placement, float]] = {}  # released, not started
        self.cycles_ok = 0
        self.cycles_failed = 0
        self.heartbeat: Callable[[], object] | None = None  # systemd's watchdog (serve)
        self.queue: list[QueuedJob] = []  # the last queue read (for moves of running jobs)
        self.migration = MigrationExecutor(
            client, recorder, metrics.registry, config.migration, run_id=self.run_id, logger=logger
        )
        self.drift = DriftMonitor(  # the cluster's calibration against what its jobs do
            topology, self.cluster, self._drift_calibration, logger=logger
        )
        self.profile_history = ProfileHistory(recorder)
        self.learned_book = LearnedBook(recorder, self.cluster)  # profiles from telemetry
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
        calibration = self._calibration()
        profiles = resolve_profiles(
            queue,
            calibration,
            self.profile_history.get(undeclared(queue), now),
            self.cfg.default_profile,
            self.learned_book.get(now, calibration),
        )
        self.metrics.observe_profiles(source_counts(profiles))
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
        self.acted += self.hand_backs.partition_changes(queue, self.obs)
        self._renew()
        self.metrics.pending_jobs.set(len(self.obs.state.pending))
        self.metrics.held_jobs.set(self.obs.held_total)
        self.metrics.foreign_held_jobs.set(self.obs.foreign_held)
        self.metrics.infeasible_jobs.set(len(self.obs.refused))
        self.metrics.observe_holds((q.submit_time for q in queue if held_for_loop(q)), now)
        if self.drift.due(now):
            self._observe_drift(now)
        return self.obs.state

    def _observe_drift(self, now: float) -> None:
        """The running jobs' observed against predicted slowdown on ``/metrics``
        (``deployer.drift``); a failure is logged, never the loop's end."""
        assert self.obs is not None
        live = [
            LiveRun(r.job.job_id, r.job.name, r.placement, r.job.user)
            for r in self.obs.state.running
        ]
        try:
            report = self.drift.update(
                live, self.recorder.read, now, lambda cal: self.learned_book.get(now, cal)
            )
        except Exception as exc:
            log_event(self.log, "drift_failed", logging.WARNING, error=str(exc)[:300])
            return
        self.metrics.observe_drift(report)

    def _predictor(self, now: float) -> RuntimePredictor | None:
        """The run-time predictor of the policy about to decide (the serving package's, which
        it was trained with; None for a heuristic): the holder is refreshed first, so a model
        that moved is seen with its own predictor."""
        self.policy.holder.refresh(now=now)
        found = getattr(self.policy.holder.active.policy, "predictor", None)
        return found if isinstance(found, RuntimePredictor) else None

    @property
    def calibration(self) -> Calibration:
        """The calibration in use (``deployer.calibration``: the holder resolves it)."""
        held = self.policy.holder.calibration
        return held.calibration if held is not None else load_calibration(None)

    def _calibration(self) -> Calibration:
        """The calibration whose profiles the policy's contention model knows (its own, else
        the one in use): every live job's profile is one of them (``deployer.profiles``)."""
        model = getattr(self.policy.holder.active.policy, "model", None)
        found = getattr(model, "calibration", None)
        return found if isinstance(found, Calibration) else self.calibration

    def _drift_calibration(self) -> Calibration | None:
        """The drift monitor's calibration: the one in use, unless it is the shipped one
        (it describes other testbeds: its drift says nothing of this cluster)."""
        held = self.policy.holder.calibration
        return None if held is None or held.source == "shipped" else held.calibration

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
        busy = bool(results or moved or self.acted)  # active mode: every start has a result
        log_cycle(
            self.log,
            self.lines,
            cycle_id=self.cycle_id,
            mode=self.mode,
            state=obs.state,
            decision=decision,
            info=info,
            where=where,
            busy=busy,
            elapsed=elapsed,
            now=time.monotonic(),
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
        if self.mode == "active" and kind not in UNREACHABLE:
            jobs = fault_hand_back(self.queue, self.cfg.partitions, self.hand_backs.released_ids)
            released = self.hand_backs.on_fault(jobs, kind, self.cycle_id) if jobs else []
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
        # over max-hold: handed back whatever the policy says now (a start that is never
        # applied, e.g. for want of an audit, must not keep a job held)
        over = {j for j in obs.managed if now - self.first_seen[j] > self.cfg.max_hold_s}
        plan = plan_starts(
            decision, obs, self.topo, over, self.cfg.max_hold_s, self.metrics, self.log
        )
        results = plan.results
        self.acted += self.hand_backs.unplaced(
            obs, over, plan.reshaped, version, self.cycle_id, plan.widened
        )
        self.acted += self.hand_backs.unstrand(obs, version, self.cycle_id)
        self.acted += self.hand_backs.untag(obs, version, self.cycle_id)
        if not self.keeper.ok():
            log_event(self.log, "lease_lapsed_not_acting", logging.ERROR, cycle=self.cycle_id)
            return results | {p.job_id: "skipped: lease lapsed" for p in plan.planned}
        if not plan.planned:
            return results
        done, applied = apply_starts(
            plan.planned,
            client=self.client,
            recorder=self.recorder,
            metrics=self.metrics,
            log=self.log,
            ids=(self.run_id, self.cycle_id),
            version=version,
            now=now,
        )
        for p in applied:
            self.inflight[p.job_id] = (p.placement, time.time())
            self.hand_backs.released_ids.add(p.job_id)
        return results | done

    def _forget_inflight(self, queue: Sequence[QueuedJob], now: float) -> None:
        in_queue = {q.job_id for q in queue}
        self.hand_backs.released_ids &= in_queue
        pending = {q.job_id for q in queue if q.state == "PENDING"}
        for j in list(self.inflight):
            if j not in pending or now - self.inflight[j][1] > 60:
                del self.inflight[j]
        for j in list(self.first_seen):
            if j not in pending:
                del self.first_seen[j]


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
        calibrate=CalibrationResolver(
            config.calibration,
            cluster,
            config.tracking_uri or None,
            timeout_s=config.calibration_timeout_s,
        ),
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
        calibration=holder.calibration.source if holder.calibration else None,
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
