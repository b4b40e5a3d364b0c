"""The live loop's health as Prometheus metrics (prometheus-client), one registry per loop.

``ServeMetrics()`` builds its own ``CollectorRegistry`` (no process-global state);
``serve_http(port)`` exposes it on ``/metrics``; ``text()`` renders it (tests, logs).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServeMetrics:
    """Cycle time, decision latency, decisions, fallbacks, held jobs (the loop's and others'),
    hold bypasses, errors, records."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.rejected = Counter(
            "linkwise_serve_rejected_starts",
            "Starts refused by validation",
            ["reason"],
            registry=r,
        )
        self.actions = Counter(
            "linkwise_serve_actions", "Slurm actions applied", ["command", "outcome"], registry=r
        )
        self.held_jobs = Gauge(
            "linkwise_serve_held_jobs", "Held jobs of the managed partitions", registry=r
        )
        self.pending_jobs = Gauge("linkwise_serve_pending_jobs", "Pending jobs seen", registry=r)
        self.foreign_held_jobs = Gauge(
            "linkwise_serve_foreign_held_jobs",
            "Held jobs of the managed partitions not held for the loop (left alone)",
            registry=r,
        )
        self.hold_bypasses = Counter(
            "linkwise_serve_hold_bypasses",
            "Jobs held for the loop found released by someone else (e.g. their user)",
            registry=r,
        )
        self.infeasible_jobs = Gauge(
            "linkwise_serve_infeasible_jobs", "Held requests that can never fit", registry=r
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
        self.model_reloads = Counter(
            "linkwise_serve_model_reloads", "Model (re)loads", ["outcome"], registry=r
        )
        self.lease_expires = Gauge(
            "linkwise_serve_lease_expires_timestamp",
            "When the lease expires (epoch s)",
            registry=r,
        )

    def text(self) -> str:
        """The exposition text of every metric."""
        return generate_latest(self.registry).decode("utf-8")

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Expose ``/metrics`` on ``addr:port`` in a daemon thread; returns the server."""
        return start_http_server(port, addr=addr, registry=self.registry)
