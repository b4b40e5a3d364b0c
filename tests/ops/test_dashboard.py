"""The Grafana dashboard (ops/grafana/linkwise-serve.json) names only metrics the live loop
exports (deployer/metrics.py, deployer/migration.py), and has a panel for the calibration in
use, the contention model's drift and failed Slurm reads. Its expressions are asked of a real
Prometheus in tests/ops/test_prometheus_live.py (services)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics_core import Metric

from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.migration import MigrationMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "linkwise-serve.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _exported() -> set[str]:
    """Every sample name the loop's registry can export (a labelled metric with no series
    yet included)."""
    metrics = ServeMetrics()
    MigrationMetrics(metrics.registry)
    families: list[Metric] = list(metrics.registry.collect())
    return {f.name + s for f in families for s in SUFFIXES.get(f.type, ("",))}


def _exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_every_dashboard_metric_is_one_the_loop_exports() -> None:
    exported = _exported()
    named = {m for e in _exprs() for m in re.findall(r"\blinkwise_\w+", e)}
    assert named and named <= exported, sorted(named - exported)


def test_the_dashboard_shows_the_calibration_the_drift_and_slurm_read_failures() -> None:
    named = {m for e in _exprs() for m in re.findall(r"\blinkwise_\w+", e)}
    assert named >= {
        "linkwise_serve_calibration_info",
        "linkwise_serve_slowdown_observed",
        "linkwise_serve_slowdown_predicted",
        "linkwise_serve_slowdown_ratio",
        "linkwise_serve_slowdown_unobserved_jobs",
        "linkwise_slurm_read_errors_total",
    }
