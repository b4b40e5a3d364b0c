"""The live loop's health as Prometheus metrics (prometheus-client), one registry per loop.

``ServeMetrics()`` builds its own ``CollectorRegistry`` (no process-global state);
``serve_http(port)`` exposes it on ``/metrics``; ``text()`` renders it (tests, logs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from linkwise.deployer.drift import REASONS, DriftReport
from linkwise.deployer.profiles import SOURCES

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServeMetrics:
    """Cycle time, decision latency, decisions, fallbacks, held jobs (the loop's and others'),
    hold bypasses, errors, records, the calibration in use, the contention model's drift."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._serving: set[tuple[str, str]] = set()
        self._cycle_metrics(self.registry)
        self._start_metrics(self.registry)
        self._hold_metrics(self.registry)
        self._io_metrics(self.registry)
        self._policy_metrics(self.registry)
        self._drift_metrics(self.registry)
        self.job_profiles = Gauge(
            "linkwise_serve_job_profiles",
            "Jobs in the last queue read by where their communication profile came from "
            "(declared, learned from earlier runs' telemetry, history: declared by an earlier "
            "run, default; deployer/profiles.py)",
            ["source"],
            registry=self.registry,
        )
        self._known_labels()

    def _cycle_metrics(self, r: CollectorRegistry) -> None:
        """Cycles, the policy's decisions and their latency, fallbacks, deviations."""
        self.cycle_seconds = Histogram(
            "linkwise_serve_cycle_seconds",
            "Wall time of one cycle",
            buckets=_CYCLE_BUCKETS,
            registry=r,
        )
        self.decision_seconds = Histogram(
            "linkwise_serve_decision_seconds",
            "Time the policy took to decide",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cycles = Counter("linkwise_serve_cycles", "Cycles run", ["outcome"], registry=r)
        self.decisions = Counter(
            "linkwise_serve_decisions", "Decisions recorded", ["action"], registry=r
        )
        self.fallbacks = Counter(
            "linkwise_serve_fallbacks",
            "Times the fallback policy decided",
            ["reason"],
            registry=r,
        )
        self.deviations = Counter(
            "linkwise_serve_deviations",
            "Decision rows where the policy departed from its base heuristic (deployer.explain)",
            registry=r,
        )

    def _start_metrics(self, r: CollectorRegistry) -> None:
        """What became of the starts: refused, moved, applied, node lists cleared."""
        self.rejected = Counter(
            "linkwise_serve_rejected_starts",
            "Starts refused by validation",
            ["reason"],
            registry=r,
        )
        self.moved_starts = Counter(
            "linkwise_serve_moved_starts",
            "Starts moved off nodes the job's constraints refuse onto nodes that accept it",
            registry=r,
        )
        self.actions = Counter(
            "linkwise_serve_actions", "Slurm actions applied", ["command", "outcome"], registry=r
        )
        self.unstranded = Counter(
            "linkwise_serve_unstranded",
            "Released jobs Slurm could not run on the loop's node list: the list was cleared",
            registry=r,
        )

    def _hold_metrics(self, r: CollectorRegistry) -> None:
        """The queue and the holds: held (the loop's and others'), pending, infeasible, bypasses,
        partition changes, hand-backs, the oldest hold against the max-hold."""
        self.held_jobs = Gauge(
            "linkwise_serve_held_jobs", "Held jobs of the managed partitions", registry=r
        )
        self.pending_jobs = Gauge("linkwise_serve_pending_jobs", "Pending jobs seen", registry=r)
        self.foreign_held_jobs = Gauge(
            "linkwise_serve_foreign_held_jobs",
            "Held jobs of the managed partitions not held for the loop (left alone)",
            registry=r,
        )
        self.infeasible_jobs = Gauge(
            "linkwise_serve_infeasible_jobs", "Held requests that can never fit", registry=r
        )
        self.hold_bypasses = Counter(
            "linkwise_serve_hold_bypasses",
            "Jobs held for the loop found released by someone else (e.g. their user)",
            registry=r,
        )
        self.partition_changes = Counter(
            "linkwise_serve_partition_changes",
            "Jobs held for the loop whose partition someone changed (also hold bypasses)",
            registry=r,
        )
        self.handed_back = Counter(
            "linkwise_serve_handed_back",
            "Held jobs released unchanged to Slurm, by why (no_gpu, never_fits, max_hold, "
            "shape, split, heterogeneous, array, constraint, unmodelled, several_partitions, "
            "slurm_fault, partition_changed, widen)",
            ["reason"],
            registry=r,
        )
        self.oldest_hold = Gauge(
            "linkwise_serve_oldest_hold_seconds",
            "Age (since submission) of the oldest job held for the loop; 0 when none",
            registry=r,
        )
        self.max_hold = Gauge(
            "linkwise_serve_max_hold_seconds",
            "The loop's max-hold: held jobs older than this are released unchanged",
            registry=r,
        )

    def _io_metrics(self, r: CollectorRegistry) -> None:
        """Slurm reads that failed, bad store rows, records spooled or lost, the lease."""
        self.slurm_read_errors = Counter(
            "linkwise_slurm_read_errors",
            "Slurm reads that failed, by kind (unavailable, timeout, schema, command, parse)",
            ["kind"],
            registry=r,
        )
        self.bad_rows = Counter(
            "linkwise_serve_bad_store_rows",
            "Rows read from the store that were ignored (NaN, infinite or negative)",
            ["table"],
            registry=r,
        )
        self.audit_unwritten = Counter(
            "linkwise_serve_audit_unwritten",
            "Audit records that could be neither stored nor spooled (logged on stderr)",
            registry=r,
        )
        self.spooled_records = Gauge(
            "linkwise_serve_spooled_records",
            "Records waiting in the spool for the store",
            registry=r,
        )
        self.lost_records = Counter(
            "linkwise_serve_lost_records",
            "Records that could be neither stored nor spooled",
            registry=r,
        )
        self.lease_expires = Gauge(
            "linkwise_serve_lease_expires_timestamp",
            "When the lease expires (epoch s; 0: no lease, shadow mode)",
            registry=r,
        )

    def _policy_metrics(self, r: CollectorRegistry) -> None:
        """The deciding policy (for the dashboard and the alerts, ``ops/``) and its reloads."""
        self.model_reloads = Counter(
            "linkwise_serve_model_reloads", "Model (re)loads", ["outcome"], registry=r
        )
        self.model_info = Gauge(
            "linkwise_serve_model_info",
            "1 for the policy deciding now and its registry version",
            ["policy", "model_version"],
            registry=r,
        )
        self.fallback_active = Gauge(
            "linkwise_serve_fallback_active",
            "1 while the fallback heuristic decides instead of the configured policy",
            registry=r,
        )
        self.calibration_info = Gauge(
            "linkwise_serve_calibration_info",
            "1 for the calibration the loop predicts contention with (deployer/calibration.py): "
            "source flag|package|cluster-fit|shipped, the MLflow run of a cluster's fit",
            ["source", "run_id"],
            registry=r,
        )

    def _drift_metrics(self, r: CollectorRegistry) -> None:
        """Observed against predicted slowdown of the running jobs (``deployer.drift``; the
        alert ``LinkwiseContentionModelDrift``): one series per job with both, and the
        running jobs without, by why."""
        self.slowdown_observed = Gauge(
            "linkwise_serve_slowdown_observed",
            "A running job's GPU activity alone over its activity now (1: as fast as alone)",
            ["job_id"],
            registry=r,
        )
        self.slowdown_predicted = Gauge(
            "linkwise_serve_slowdown_predicted",
            "A running job's slowdown the cluster's calibrated contention model predicts at "
            "its current placement",
            ["job_id"],
            registry=r,
        )
        self.slowdown_ratio = Gauge(
            "linkwise_serve_slowdown_ratio",
            "Observed over predicted slowdown of a running job (1: the model is right)",
            ["job_id"],
            registry=r,
        )
        self.slowdown_unobserved = Gauge(
            "linkwise_serve_slowdown_unobserved_jobs",
            "Running jobs without a slowdown series, by why (no_calibration, no_store, "
            "not_in_store, no_profile, neighbour_unknown, too_few_alone, too_few_recent, "
            "no_activity_now)",
            ["reason"],
            registry=r,
        )

    def _known_labels(self) -> None:
        """The label values known in advance start at 0, so their series exist from the start."""
        for outcome in ("ok", "slurm_error"):
            self.cycles.labels(outcome)
        for action in ("start", "wait"):
            self.decisions.labels(action)
        for reason in ("model_unavailable", "decide_error"):
            self.fallbacks.labels(reason)
        for outcome in ("ok", "failed"):
            self.model_reloads.labels(outcome)
        for reason in (
            "no_gpu",
            "never_fits",
            "shape",
            "split",
            "max_hold",
            "partition_changed",
            "widen",
        ):
            self.handed_back.labels(reason)
        self.handed_back.labels("slurm_fault")
        for reason in REASONS:
            self.slowdown_unobserved.labels(reason)
        for source in SOURCES:
            self.job_profiles.labels(source)
        for kind in ("unavailable", "timeout", "schema", "command", "parse"):
            self.slurm_read_errors.labels(kind)
        for command in ("update", "release"):
            for outcome in ("ok", "error"):
                self.actions.labels(command, outcome)

    def serving(self, policy: str, model_version: str, *, fallback: bool) -> None:
        """Record which policy decides now (one ``model_info`` series) and whether it is the
        fallback."""
        if (policy, model_version) not in self._serving:
            self.model_info.clear()
            self._serving = {(policy, model_version)}
        self.model_info.labels(policy, model_version).set(1)
        self.fallback_active.set(1 if fallback else 0)

    def observe_calibration(self, source: str, run_id: str) -> None:
        """The calibration in use: one ``calibration_info`` series (the previous removed)."""
        self.calibration_info.clear()
        self.calibration_info.labels(source, run_id).set(1)

    def observe_holds(self, submit_times: Iterable[float], now: float) -> None:
        """The oldest hold's age, from the submit times of the jobs held for the loop."""
        self.oldest_hold.set(max((now - t for t in submit_times), default=0.0))

    def observe_profiles(self, counts: Mapping[str, int]) -> None:
        """How many jobs of the last queue read got their profile from each source."""
        for source, n in counts.items():
            self.job_profiles.labels(source).set(n)

    def observe_drift(self, report: DriftReport) -> None:
        """The slowdown series of the running jobs now (those of jobs gone are removed)."""
        for gauge in (self.slowdown_observed, self.slowdown_predicted, self.slowdown_ratio):
            gauge.clear()
        for job in report.jobs:
            label = str(job.job_id)
            self.slowdown_observed.labels(label).set(job.observed)
            self.slowdown_predicted.labels(label).set(job.predicted)
            self.slowdown_ratio.labels(label).set(job.ratio)
        for reason in REASONS:
            self.slowdown_unobserved.labels(reason).set(report.missing.get(reason, 0))

    def text(self) -> str:
        """The exposition text of every metric."""
        return generate_latest(self.registry).decode("utf-8")

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Expose ``/metrics`` on ``addr:port`` in a daemon thread; returns the server."""
        return start_http_server(port, addr=addr, registry=self.registry)
