"""The live scheduling loop over a real Slurm: ``SlurmBackend`` (active), ``ShadowBackend``.

Both are ``Backend``s for ``linkwise.cluster.loop.drive``: ``observe`` reads the queue and
the nodes through ``SlurmClient`` (retrying, with the lease renewed, while Slurm does not
answer), adds the latest link load from DuckDB, and builds a ``ClusterState``; ``apply``
records the decision (one ``decisions`` row per start, or one ``wait`` row) and, in active
mode only, validates each start against the free GPUs and the job's shape, audits the
``scontrol`` argument lists, then sets ``ReqNodeList``/``NumNodes`` and releases the job;
``advance`` waits for the next cycle. ``ShadowBackend`` changes nothing in Slurm.

Active mode manages only jobs of the named partitions held for it (``safety.held_for_loop``:
held by the shipped ``job_submit.lua``, which tags them ``linkwise:held``); an
administrator's hold, a user's own hold and untagged jobs are left alone. Jobs without
GPUs, held requests that can never fit (reported) and jobs held longer than ``max_hold_s``
are released unchanged to Slurm. A tagged job found no longer held that the loop did not
release was bypassed (released by someone else): counted, logged and untagged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from linkwise.cluster.contention import link_flows
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    Policy,
    RunningJob,
    Topology,
)
from linkwise.cluster.hostlist import compress, expand
from linkwise.cluster.loop import drive
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.topology import load_topology
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.safety import (
    WATCHDOG_HOLDER,
    Lease,
    LeaseTaken,
    PartitionLocks,
    Recorder,
    RecordError,
    bypassed,
    hand_back,
    held_for_loop,
    in_partitions,
    lease_dir_for,
    lock_partitions,
    log_event,
    new_id,
    pid_start_time,
    read_lease,
    release_held,
    renewed,
    untag_command,
    valid_name,
    write_lease,
)
from linkwise.models.policy_spec import PolicySpec

__all__ = [
    "GuardedPolicy",
    "Observation",
    "PolicyHolder",
    "ServeConfig",
    "ShadowBackend",
    "SlurmBackend",
    "build_observation",
    "check_start",
    "serve",
    "slurm_topology",
]

Mode = Literal["shadow", "active"]
LOG = logging.getLogger("linkwise.serve")
DEFAULT_DURATION_S = 3600.0
DEFAULT_LEASE_ROOT = "/var/lib/linkwise/leases"
_UNUSABLE_FLAGS = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "MAINTENANCE", "FAIL", "POWERED_DOWN"}
)
_USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})


# ------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``linkwise serve`` is told."""

    mode: Mode
    partitions: tuple[str, ...]
    policy: str = "backfill"
    fallback: str = "backfill"
    slurm_env: str = "/tmp/linkwise-slurm/env"
    transport: Literal["cli", "rest"] = "cli"
    db: str | None = "linkwise-out/linkwise.duckdb"
    state_dir: str = "linkwise-out/serve"
    interval_s: float = 2.0
    lease_s: float = 30.0
    max_hold_s: float = 900.0
    reload_s: float = 30.0
    metrics_port: int | None = None
    max_cycles: int | None = None
    watchdog: bool = True
    load_window_s: float = 120.0
    lease_root: str = DEFAULT_LEASE_ROOT  # one per host: every loop and job_submit.lua share it

    def __post_init__(self) -> None:
        if self.mode not in ("shadow", "active"):
            raise ValueError(f"mode must be shadow or active, got {self.mode!r}")
        if not self.partitions:
            raise ValueError("name at least one partition")
        bad = [p for p in self.partitions if not valid_name(p)]
        if bad:
            raise ValueError(f"invalid partition name(s): {', '.join(map(repr, bad))}")
        if self.interval_s <= 0 or self.lease_s <= 0:
            raise ValueError("interval and lease must be positive")
        if self.mode == "active" and self.lease_s < 2 * self.interval_s:
            raise ValueError("the lease must last at least two cycles")

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


# ------------------------------------------------------------------------ observation


@dataclass(frozen=True)
class Shape:
    """A Slurm job's shape: nodes and GPUs per node (``-N n --gres=gpu:g``)."""

    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Observation:
    """A ClusterState and what the loop needs beside it to act on Slurm."""

    state: ClusterState
    managed: Mapping[int, QueuedJob]  # jobs the policy may start (active: held for the loop)
    shapes: Mapping[int, Shape]
    no_gpu: tuple[QueuedJob, ...]  # held for the loop, no GPUs or never fits: handed back
    refused: Mapping[int, str]  # held for the loop, can never fit -> why (released unchanged)
    running_ids: frozenset[int]
    started: Mapping[int, tuple[float, str]]  # running job -> (start time, nodes)
    held_total: int  # held for the loop
    bypassed: tuple[QueuedJob, ...] = ()  # tagged as held for the loop, no longer held
    foreign_held: int = 0  # held, but not for the loop (an admin's, a user's own): left alone


def slurm_topology(slurm_conf: str | os.PathLike[str], name: str = "slurm") -> Topology:
    """The topology of a slurm.conf (and a topology.conf beside it, if any), named ``name``
    (``cluster.topology.load_topology``)."""
    return dataclasses.replace(load_topology(os.fspath(slurm_conf)), name=name)


def node_usable(info: NodeInfo) -> bool:
    """Whether a node can take new jobs (up, not draining, not failing)."""
    base, *flags = info.state.split("+")
    return base in _USABLE_STATES and not (_UNUSABLE_FLAGS & set(flags))


def job_shape(job: QueuedJob) -> Shape:
    """Nodes and GPUs per node of a job (GPUs split evenly, as ``--gres=gpu:g`` asks)."""
    n = max(1, job.num_nodes)
    return Shape(n, -(-job.gpus // n) if job.gpus else 0)


def _job(q: QueuedJob) -> Job:
    limit = q.time_limit_s if q.time_limit_s and q.time_limit_s > 0 else DEFAULT_DURATION_S
    return Job(q.job_id, q.submit_time, q.gpus, limit, user=q.user, name=q.name)


def never_fits(shape: Shape, topo: Topology, partition_nodes: Iterable[int]) -> str | None:
    """Why a request can never fit the partition's nodes (None when it can)."""
    big = [i for i in partition_nodes if topo.nodes[i].gpus >= shape.gpus_per_node]
    if len(big) < shape.nodes:
        return (
            f"needs {shape.nodes} node(s) x {shape.gpus_per_node} GPU(s); the partition has "
            f"{len(big)} node(s) with that many GPUs"
        )
    return None


def build_observation(
    queue: Sequence[QueuedJob],
    nodes: Sequence[NodeInfo],
    topo: Topology,
    partitions: Sequence[str],
    now: float,
    *,
    mode: Mode,
    link_load: Mapping[str, float] | None = None,
    inflight: Mapping[int, tuple[tuple[int, ...], int]] | None = None,
) -> Observation:
    """Build the policy's view from Slurm's queue and nodes.

    ``link_load``: measured bytes/s on each node's NIC; a NIC loaded to utilisation ``u``
    counts as ``round(u)`` flows when that is more than the rings linkwise sees.
    ``inflight``: jobs released by the loop that Slurm has not started yet (node indices,
    GPUs per node): their GPUs are taken out of the free count.
    """
    managed_parts = set(partitions)
    index = topo.node_index
    info = {n.name: n for n in nodes}
    part_nodes = sorted(
        index[n.name] for n in nodes if n.name in index and managed_parts & set(n.partitions)
    )
    free = [0] * len(topo.nodes)
    for i in part_nodes:
        ni = info[topo.nodes[i].name]
        if node_usable(ni):
            free[i] = max(0, min(ni.gpus_total, topo.nodes[i].gpus) - ni.gpus_used)
    running: list[RunningJob] = []
    started: dict[int, tuple[float, str]] = {}
    pending: list[PendingJob] = []
    managed: dict[int, QueuedJob] = {}
    shapes: dict[int, Shape] = {}
    no_gpu: list[QueuedJob] = []
    refused: dict[int, str] = {}
    refused_jobs: dict[int, QueuedJob] = {}
    gone: list[QueuedJob] = []
    held_total = foreign = 0
    for q in queue:
        if in_partitions(q, managed_parts) and bypassed(q):
            gone.append(q)
        if q.state == "RUNNING" and q.nodes:
            started[q.job_id] = (q.start_time or now, compress(q.nodes))
            idx = [index[n] for n in q.nodes if n in index]
            if q.gpus > 0 and idx:
                per = max(1, q.gpus // len(idx))
                job = _job(q)
                end = (q.start_time or now) + job.duration
                running.append(
                    RunningJob(
                        job=job,
                        placement=Placement.of([(i, per) for i in idx]),
                        start_time=q.start_time or now,
                        remaining_s=max(1.0, end - now),
                        rate=1.0,
                        since=now,
                    )
                )
            continue
        if q.state != "PENDING":
            continue
        if q.partition not in managed_parts:
            if mode == "active" and held_for_loop(q) and in_partitions(q, managed_parts):
                # held for the loop but submitted to several partitions: Slurm chooses
                refused[q.job_id] = f"several partitions ({q.partition}): left to Slurm"
                refused_jobs[q.job_id] = q
                held_total += 1
            continue
        ours = held_for_loop(q)
        held_total += ours
        foreign += q.held and not ours
        if (mode == "active" and not ours) or (mode == "shadow" and q.held):
            continue  # active: only jobs held for the loop; shadow: held ones wait anyway
        if q.gpus <= 0:
            if ours:
                no_gpu.append(q)
            continue
        shape = job_shape(q)
        why = never_fits(shape, topo, part_nodes)
        if why is not None:
            refused[q.job_id] = why
            refused_jobs[q.job_id] = q
            continue
        managed[q.job_id] = q
        shapes[q.job_id] = shape
        pending.append(PendingJob(_job(q), remaining_s=_job(q).duration))
    for nodes_idx, per in (inflight or {}).values():
        for i in nodes_idx:
            free[i] = max(0, free[i] - per)
    pending.sort(key=lambda p: (p.job.submit_time, p.job.job_id))
    flows = link_flows(topo, (r.placement for r in running))
    for name, load in (link_load or {}).items():
        k = index.get(name)
        if k is not None and topo.nodes[k].nic_gbps > 0:
            measured = round(load / (topo.nodes[k].nic_gbps * 1e9))
            flows[k] = max(flows[k], measured)
    state = ClusterState(
        time=now,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(pending),
        link_flows=tuple(flows),
    )
    return Observation(
        state=state,
        managed=managed,
        shapes=shapes,
        no_gpu=tuple(no_gpu) + tuple(refused_jobs.values()),
        refused=refused,
        running_ids=frozenset(started),
        started=started,
        held_total=held_total,
        bypassed=tuple(gone),
        foreign_held=foreign,
    )


def check_start(
    placement: Placement, shape: Shape, free: Sequence[int], topo: Topology
) -> str | None:
    """Why a start cannot be applied as is (None when it can): Slurm runs the job on exactly
    the placement's nodes with its own GPUs per node, so the node count must match the job
    and every node needs that many free GPUs (held jobs skip Slurm's feasibility check)."""
    if any(not 0 <= n < len(topo.nodes) for n in placement.nodes):
        return "unknown node"
    if placement.num_nodes != shape.nodes:
        return f"shape: {placement.num_nodes} node(s) chosen, the job asks {shape.nodes}"
    short = [topo.nodes[n].name for n in placement.nodes if free[n] < shape.gpus_per_node]
    if short:
        return f"busy: {','.join(short)} lack {shape.gpus_per_node} free GPU(s)"
    return None


# ------------------------------------------------------------------------ policies


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy with its provenance."""

    policy: Policy
    name: str
    model_version: str
    obs_spec_version: str


def _heuristic(spec: str) -> LoadedPolicy:
    policy = PolicySpec.parse(spec).build()
    return LoadedPolicy(policy, spec, f"heuristic:{spec}", "")


def _learned(spec: str) -> LoadedPolicy:
    policy: Any = PolicySpec.parse(spec).build()
    package = str(getattr(policy, "package_dir", "") or "")
    # a registry model is recorded by its version number, which is what promotion's shadow
    # evidence looks up; a package folder by its path
    version = package.rsplit("/", 1)[-1] if package.startswith("models:/") else package or spec
    obs = getattr(getattr(policy, "spec", None), "version", "")
    return LoadedPolicy(policy, spec, version, str(obs))


def model_probe(spec: str) -> str | None:
    """A token that changes when the model behind ``spec`` changes (alias moved, package
    rewritten); None for heuristics. Raises when it cannot be read."""
    return PolicySpec.parse(spec).token()


class PolicyHolder:
    """The policy in use: loads ``spec``, reloads it when its probe changes (the ``champion``
    alias moved), keeps the previous model when a new one fails to load or verify, and uses
    the named heuristic ``fallback`` when no model could ever be loaded."""

    def __init__(
        self,
        spec: str,
        fallback: str,
        *,
        metrics: ServeMetrics,
        logger: logging.Logger = LOG,
        reload_s: float = 30.0,
        loader: Callable[[str], LoadedPolicy] | None = None,
        probe: Callable[[str], str | None] = model_probe,
    ) -> None:
        self.spec = spec
        self.is_model = PolicySpec.parse(spec).is_model
        self.loader = loader or (_learned if self.is_model else _heuristic)
        self.probe = probe
        self.reload_s = reload_s
        self.metrics = metrics
        self.log = logger
        self.fallback = _heuristic(fallback)
        self.current: LoadedPolicy | None = None
        self.token: str | None = None
        self.checked_at = -math.inf
        self.fallback_reason = ""
        self.refresh(force=True)

    @property
    def active(self) -> LoadedPolicy:
        """The policy to ask now (the fallback when no model is loaded)."""
        return self.current if self.current is not None else self.fallback

    def refresh(self, *, force: bool = False, now: float | None = None) -> None:
        """Reload when the model behind the spec changed (checked every ``reload_s``)."""
        t = time.time() if now is None else now
        if not force and 0 <= t - self.checked_at < self.reload_s:
            return
        self.checked_at = t
        try:
            token = self.probe(self.spec)
        except Exception as exc:
            log_event(self.log, "model_probe_failed", logging.WARNING, error=str(exc)[:300])
            if self.current is None:
                self._fall_back(f"probe failed: {exc}")
            return
        if self.current is not None and token == self.token:
            return
        try:
            loaded = self.loader(self.spec)
        except Exception as exc:
            self.metrics.model_reloads.labels("failed").inc()
            self.token = token  # do not retry the same broken version every cycle
            if self.current is not None:
                log_event(
                    self.log,
                    "model_reload_refused",
                    logging.ERROR,
                    spec=self.spec,
                    kept=self.current.model_version,
                    error=str(exc)[:400],
                )
            else:
                self._fall_back(f"load failed: {exc}")
            return
        previous = self.current.model_version if self.current else None
        self.current, self.token, self.fallback_reason = loaded, token, ""
        self.metrics.model_reloads.labels("ok").inc()
        log_event(
            self.log,
            "model_loaded",
            spec=self.spec,
            model_version=loaded.model_version,
            obs_spec_version=loaded.obs_spec_version,
            previous=previous,
        )

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason[:400]
        self.metrics.fallbacks.labels("model_unavailable").inc()
        log_event(
            self.log,
            "fallback",
            logging.ERROR,
            spec=self.spec,
            fallback=self.fallback.name,
            reason=self.fallback_reason,
        )


@dataclass
class GuardedPolicy:
    """A Policy over a ``PolicyHolder``: times each decision and falls back to the heuristic
    when the policy raises. ``last`` describes the latest decision."""

    holder: PolicyHolder
    metrics: ServeMetrics
    logger: logging.Logger = LOG
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.holder.active.name

    def decide(self, state: ClusterState) -> Decision:
        """The holder's decision, or the fallback's when it fails."""
        self.holder.refresh(now=state.time)
        chosen = self.holder.active
        note = f"fallback: {self.holder.fallback_reason}" if self.holder.fallback_reason else ""
        t0 = time.perf_counter()
        try:
            decision = chosen.policy.decide(state)
        except Exception as exc:
            self.metrics.fallbacks.labels("decide_error").inc()
            log_event(
                self.logger,
                "fallback",
                logging.ERROR,
                policy=chosen.name,
                fallback=self.holder.fallback.name,
                reason=f"decide failed: {exc}"[:400],
            )
            chosen = self.holder.fallback
            note = f"fallback: decide failed: {exc}"[:200]
            decision = chosen.policy.decide(state)
        latency = time.perf_counter() - t0
        self.metrics.decision_seconds.observe(latency)
        self.last = {
            "policy": chosen.name,
            "model_version": chosen.model_version,
            "obs_spec_version": chosen.obs_spec_version,
            "latency_ms": latency * 1e3,
            "note": note,
        }
        return decision


# ------------------------------------------------------------------------ backends


def read_link_load(recorder: Recorder, cluster: str, since: float) -> dict[str, float]:
    """The latest NIC load (bytes/s, the busiest device and direction) of each node."""
    rows = recorder.query(
        "SELECT node, arg_max(bytes_per_s, ts) FROM link_load "
        "WHERE ts >= ? AND link_class IN ('ib', 'eth') AND (cluster = ? OR cluster = '') "
        "GROUP BY node, device, direction",
        [since, cluster],
    )
    out: dict[str, float] = {}
    for node, load in rows or []:
        out[str(node)] = max(out.get(str(node), 0.0), float(load))
    return out


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
        self.lease: Lease | None = None
        folder = Path(lease_dir) if lease_dir is not None else Path(config.lease_root) / "_"
        self.lease_path = folder / config.lease_name
        self.locks: PartitionLocks | None = None
        self.released_ids: set[int] = set()  # released by this loop (not bypasses)
        self.watchdog_proc: subprocess.Popen[bytes] | None = None
        self.first_seen: dict[int, float] = {}
        self.inflight: dict[int, tuple[tuple[int, ...], int, float]] = {}
        self.awaiting: dict[int, float] = {}  # start decisions not yet joined with Slurm
        self.reported: set[int] = set()
        self.cycles_ok = 0
        self.cycles_failed = 0

    # -- the Backend protocol

    def observe(self) -> ClusterState:
        """Read Slurm (retrying while it does not answer) and build the state."""
        delay = min(1.0, self.cfg.interval_s)
        while True:
            self.cycle_id += 1
            self.cycle_started = time.perf_counter()
            self._renew()
            try:
                queue = self.client.queue()
                nodes = self.client.nodes()
            except SlurmError as exc:
                self.cycles_failed += 1
                self.metrics.cycles.labels("slurm_error").inc()
                log_event(
                    self.log,
                    "slurm_unavailable",
                    logging.WARNING,
                    cycle=self.cycle_id,
                    error=str(exc)[:300],
                    retry_in_s=delay,
                )
                if self.stop.is_set():
                    raise
                self._sleep(delay)
                delay = min(delay * 2, max(self.cfg.interval_s, 5.0))
                continue
            break
        now = time.time()
        load = (
            read_link_load(self.recorder, self.cluster, now - self.cfg.load_window_s)
            if self.recorder.db
            else {}
        )
        inflight = {j: (n, g) for j, (n, g, _) in self.inflight.items()}
        self.obs = build_observation(
            queue,
            nodes,
            self.topo,
            self.cfg.partitions,
            now,
            mode=self.mode,
            link_load=load,
            inflight=inflight,
        )
        self._forget_inflight(queue, now)
        self._renew()
        self.metrics.pending_jobs.set(len(self.obs.state.pending))
        self.metrics.held_jobs.set(self.obs.held_total)
        self.metrics.foreign_held_jobs.set(self.obs.foreign_held)
        self.metrics.infeasible_jobs.set(len(self.obs.refused))
        return self.obs.state

    def apply(self, decision: Decision) -> None:
        """Record the decision; in active mode validate, audit and apply each start."""
        obs = self.obs
        if obs is None:
            raise RuntimeError("apply before observe")
        info = self.policy.last
        now = time.time()
        rows: list[dict[str, Any]] = []
        for j, why in obs.refused.items():
            if j not in self.reported:
                self._report_infeasible(j, why)
                rows.append(self._row(now, j, "wait", "", 0, f"infeasible: {why}", info))
        results = self._act(decision, obs, info) if self.mode == "active" else {}
        for start in decision.starts:
            names = compress(self.topo.nodes[n].name for n in start.placement.nodes)
            note = results.get(start.job_id, "shadow")
            rows.append(
                self._row(now, start.job_id, "start", names, start.placement.num_gpus, note, info)
            )
            self.awaiting.setdefault(start.job_id, now)
        if decision.preempt:
            log_event(self.log, "preempt_ignored", jobs=list(decision.preempt))
        if not decision.starts:
            rows.append(self._row(now, None, "wait", "", 0, str(info.get("note", "")), info))
        for r in rows:
            self.metrics.decisions.labels(r["action"]).inc()
        joins = self._joins(obs)
        where = self.recorder.write(decisions=rows, joins=joins)
        for job, _, _ in joins:
            self.awaiting.pop(job, None)
        elapsed = time.perf_counter() - self.cycle_started
        self.metrics.cycle_seconds.observe(elapsed)
        self.metrics.cycles.labels("ok").inc()
        self.cycles_ok += 1
        log_event(
            self.log,
            "cycle",
            cycle=self.cycle_id,
            mode=self.mode,
            policy=info.get("policy"),
            pending=len(obs.state.pending),
            starts=len(decision.starts),
            latency_ms=round(float(info.get("latency_ms", 0.0)), 3),
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

    # -- lifecycle

    def start(self) -> None:
        """Lock the partitions, take the lease and start the watchdog (active mode); raises
        ``LeaseTaken`` when another loop manages any of the partitions."""
        self._load_awaiting()
        if self.mode != "active":
            return
        pid = os.getpid()
        path = self.lease_path
        holder = f"pid {pid} on {os.uname().nodename}, run {self.run_id}, lease {path}"
        try:
            self.locks = lock_partitions(path.parent, self.cfg.partitions, holder)
        except LeaseTaken as exc:
            if not exc.holder.startswith(WATCHDOG_HOLDER):
                raise
            # a killed loop's watchdog is handing its jobs back: seconds, then they are ours
            log_event(self.log, "waiting_for_watchdog", holder=exc.holder)
            self.locks = lock_partitions(path.parent, self.cfg.partitions, holder, wait_s=30.0)
        self.lease = Lease(
            owner_pid=pid,
            owner_start=pid_start_time(pid),
            expires_at=time.time(),
            partitions=tuple(sorted(set(self.cfg.partitions))),
            slurm_conf=self.client.runner.slurm_conf,
            db=self.recorder.db,
            run_id=self.run_id,
            spool=str(self.recorder.spool),
        )
        self._renew()
        self._ensure_watchdog()
        log_event(
            self.log,
            "lease_taken",
            lease=str(path),
            lease_s=self.cfg.lease_s,
            job_submit_lua_lease_dir=str(path.parent),
        )

    def shutdown(self) -> list[int]:
        """Hand the partitions back (``safety.hand_back``: no new holds, release what is held
        for the loop, again after a grace period) and drop the locks; the released ids."""
        if self.mode != "active" or self.lease is None:
            return []
        released: list[int] = []
        lease, self.lease = self.lease, None  # no more renewals
        try:
            for attempt in range(3):
                try:
                    released = hand_back(
                        self.client,
                        self.lease_path,
                        lease,
                        self.recorder,
                        actor="loop:shutdown",
                        logger=self.log,
                        grace_s=min(2.0, self.cfg.lease_s / 2),
                        sleep=self.sleep,
                    )
                    break
                except SlurmError as exc:
                    # the lease stays "releasing": once we exit, the watchdog finishes the job
                    log_event(self.log, "shutdown_release_failed", logging.ERROR, error=str(exc))
                    if attempt < 2:
                        time.sleep(1.0)
        finally:
            if self.locks is not None:
                self.locks.close()
                self.locks = None
        return released

    # -- internals

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(left, 0.2))
            lease = self.lease if self.mode == "active" else None
            if lease is not None and time.time() - lease.renewed_at >= min(
                1.0, self.cfg.lease_s / 10
            ):
                self._renew()

    def _renew(self) -> None:
        if self.lease is None:
            return
        obs = self.obs
        held = tuple(sorted(obs.managed)) if obs else self.lease.held
        self.lease = renewed(self.lease, time.time(), self.cfg.lease_s, held=held)
        write_lease(self.lease_path, self.lease)
        self.metrics.lease_expires.set(self.lease.expires_at)
        self._ensure_watchdog()

    def _ensure_watchdog(self) -> None:
        if not self.cfg.watchdog or self.lease is None:
            return
        if self.watchdog_proc is not None and self.watchdog_proc.poll() is None:
            return
        log_path = Path(self.cfg.state_dir) / "watchdog.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        poll = max(0.2, min(1.0, self.cfg.lease_s / 5))
        args = [sys.executable, "-m", "linkwise.deployer.watchdog"]
        args += ["--lease", str(self.lease_path), "--poll", str(poll)]
        with open(log_path, "ab") as log_fh:
            self.watchdog_proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=log_fh,
                start_new_session=True,
            )
        log_event(self.log, "watchdog_started", pid=self.watchdog_proc.pid, log=str(log_path))

    def _lease_ok(self, margin: float = 0.5) -> bool:
        if self.mode != "active" or self.lease is None:
            return False
        on_disk = read_lease(self.lease_path)
        return (
            on_disk is not None
            and on_disk.owner_pid == os.getpid()
            and on_disk.state == "active"
            and time.time() + margin < on_disk.expires_at
        )

    def _report_infeasible(self, job_id: int, why: str) -> None:
        self.reported.add(job_id)
        log_event(
            self.log,
            "infeasible_request",
            logging.WARNING,
            job_id=job_id,
            reason=why,
            action="released unchanged to Slurm, not started",
        )

    def _row(
        self,
        now: float,
        job_id: int | None,
        action: str,
        nodes: str,
        gpus: int,
        note: str,
        info: Mapping[str, Any],
    ) -> dict[str, Any]:
        return {
            "decision_id": new_id(),
            "run_id": self.run_id,
            "cycle_id": self.cycle_id,
            "ts": now,
            "mode": self.mode,
            "cluster": self.cluster,
            "partition": ",".join(self.cfg.partitions),
            "policy": str(info.get("policy", "")),
            "model_version": str(info.get("model_version", "")),
            "obs_spec_version": str(info.get("obs_spec_version", "")),
            "job_id": job_id,
            "action": action,
            "nodes": nodes,
            "gpus": gpus,
            "latency_ms": float(info.get("latency_ms", 0.0)),
            "n_pending": len(self.obs.state.pending) if self.obs else 0,
            "note": note,
        }

    def _act(self, decision: Decision, obs: Observation, info: Mapping[str, Any]) -> dict[int, str]:
        """Validate, audit, then apply each start; also release no-GPU and over-held jobs."""
        now = time.time()
        for j in obs.managed:
            self.first_seen.setdefault(j, now)
        results: dict[int, str] = {}
        if not self._lease_ok():
            log_event(self.log, "lease_lapsed_not_acting", logging.ERROR, cycle=self.cycle_id)
            return {s.job_id: "skipped: lease lapsed" for s in decision.starts}
        free = list(obs.state.free_gpus)
        plan: list[tuple[int, list[list[str]], tuple[int, ...], int]] = []
        seen: set[int] = set()
        for start in decision.starts:
            job = obs.managed.get(start.job_id)
            if job is None or start.job_id in seen:
                why = "not a held job of the managed partitions"
            else:
                why = check_start(start.placement, obs.shapes[job.job_id], free, self.topo) or ""
            if why:
                results[start.job_id] = f"rejected: {why}"
                self.metrics.rejected.labels(why.split(":")[0]).inc()
                log_event(self.log, "start_rejected", job_id=start.job_id, reason=why)
                continue
            seen.add(start.job_id)
            per = obs.shapes[start.job_id].gpus_per_node
            for n in start.placement.nodes:
                free[n] -= per
            names = [self.topo.nodes[n].name for n in start.placement.nodes]
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
            plan.append((start.job_id, cmds, start.placement.nodes, per))
        over = [
            obs.managed[j]
            for j in obs.managed
            if j not in seen and now - self.first_seen[j] > self.cfg.max_hold_s
        ]
        for q in [*obs.no_gpu, *over]:
            reason = (
                "no GPUs requested"
                if q.gpus <= 0
                else f"can never fit: {obs.refused[q.job_id]}"
                if q.job_id in obs.refused
                else f"held over {self.cfg.max_hold_s:g} s"
            )
            log_event(self.log, "handing_to_slurm", job_id=q.job_id, reason=reason)
        self._untag(obs, str(info.get("model_version", "")))
        if obs.no_gpu or over:
            self.released_ids.update(q.job_id for q in [*obs.no_gpu, *over])
            release_held(
                self.client,
                [*obs.no_gpu, *over],
                recorder=self.recorder,
                run_id=self.run_id,
                cycle_id=self.cycle_id,
                actor="loop:unmanaged",
                model_version=str(info.get("model_version", "")),
                logger=self.log,
            )
        if not plan:
            return results
        version = str(info.get("model_version", ""))
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
            for job_id, cmds, _, _ in plan
            for cmd in cmds
        ]
        try:
            self.recorder.write(audits=audits, must_persist=True)
        except RecordError as exc:
            log_event(self.log, "audit_failed_not_acting", logging.ERROR, error=str(exc)[:300])
            return {job_id: "skipped: audit not persisted" for job_id, *_ in plan}
        outcomes: list[tuple[str, str, float]] = []
        rows = iter(audits)
        for job_id, cmds, nodes_idx, per in plan:
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
                self.inflight[job_id] = (nodes_idx, per, time.time())
                self.released_ids.add(job_id)
            log_event(self.log, "start", job_id=job_id, command=cmds[0], outcome=result)
        self.recorder.write(outcomes=outcomes)
        return results

    def _untag(self, obs: Observation, model_version: str) -> None:
        """End the claim on tagged jobs no longer held; count those the loop did not release
        (bypasses: released by someone else, e.g. by their user while no live loop held)."""
        if not obs.bypassed:
            return
        others = [q for q in obs.bypassed if q.job_id not in self.released_ids]
        for q in others:
            self.metrics.hold_bypasses.inc()
            log_event(self.log, "hold_bypassed", logging.WARNING, job_id=q.job_id, user=q.user)
        release_held(
            self.client,
            obs.bypassed,
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
            if j not in pending or now - self.inflight[j][2] > 60:
                del self.inflight[j]
        for j in list(self.first_seen):
            if j not in pending:
                del self.first_seen[j]

    def _joins(self, obs: Observation) -> list[tuple[int, float, str]]:
        """(job, actual start, actual nodes) for start decisions Slurm has acted on."""
        joins = [(j, *obs.started[j]) for j in self.awaiting if j in obs.started]
        gone = [j for j in self.awaiting if j not in obs.started and j not in obs.managed]
        pending = {p.job.job_id for p in obs.state.pending}
        gone = [j for j in gone if j not in pending][:500]
        if gone and self.cycle_id % 3 == 0:
            joins += self._sacct_joins(gone)
        cutoff = time.time() - 86400
        for j in [j for j, t in self.awaiting.items() if t < cutoff]:
            del self.awaiting[j]
        return joins

    def _sacct_joins(self, ids: Sequence[int]) -> list[tuple[int, float, str]]:
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

    def _load_awaiting(self) -> None:
        rows = self.recorder.query(
            "SELECT DISTINCT job_id, min(ts) FROM decisions WHERE action = 'start' AND "
            "actual_start IS NULL AND job_id IS NOT NULL AND ts > ? GROUP BY job_id",
            [time.time() - 86400],
        )
        for job, ts in rows or []:
            self.awaiting.setdefault(int(job), float(ts))


class ShadowBackend(SlurmBackend):
    """Records what the policy would do and what Slurm did; changes nothing in Slurm."""

    mode: Mode = "shadow"


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
    if config.metrics_port is not None:
        metrics.serve_http(config.metrics_port)
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
        probe=(lambda _spec: "fixed") if policy is not None else model_probe,
    )
    guarded = GuardedPolicy(holder, metrics, logger)
    recorder = Recorder(
        config.db,
        config.spool_path,
        logger=logger,
        on_lost=lambda n: metrics.lost_records.inc(n),
        on_spooled=lambda n: metrics.spooled_records.set(n),
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
    released: list[int] = []
    try:
        drive(backend, guarded)
    finally:
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
