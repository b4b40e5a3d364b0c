"""Per-job telemetry and communication profiles on a store: the flow and the report.

The Prefect flow ``job-telemetry`` (``pipelines.deployments.job_telemetry_flow``: not here,
so that building the command line imports no Prefect) summarizes the runs the telemetry has
passed since the last build (``datasets.job_telemetry.build_job_telemetry``; incremental and
idempotent), so it follows ``collect-telemetry`` / ``collect-accounting`` on their schedule.
``profiles_report`` builds (unless told not to) and learns the profiles
(``datasets.comm_profiles``); ``format_profiles`` is what ``linkwise profiles`` prints: how
many runs had telemetry, how many profiles were learned from how many runs and hours.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

from linkwise.cluster.metrics import duration_text
from linkwise.datasets.comm_profiles import ProfileBook, load_profile_book
from linkwise.datasets.job_telemetry import (
    ATTRIBUTION_RULE,
    JobTelemetryReport,
    build_job_telemetry,
)
from linkwise.datasets.store import open_store, scalar

__all__ = [
    "format_profiles",
    "profiles_report",
]


def profiles_report(
    db: str | Path,
    *,
    cluster: str | None = None,
    interval_s: float = 30.0,
    build: bool = True,
    min_runs: int = 1,
    until: float | None = None,
) -> dict[str, Any]:
    """Build the store's job telemetry (``build``), learn the profiles of runs ended before
    ``until`` (from at least ``min_runs`` runs each) and report both as a dict."""
    path = Path(db)
    if not path.exists():
        raise FileNotFoundError(f"no store at {path}")
    with closing(open_store(path)) as con:
        built: JobTelemetryReport | None = (
            build_job_telemetry(con, cluster=cluster, interval_s=interval_s) if build else None
        )
        book: ProfileBook = load_profile_book(con, cluster=cluster, until=until, min_runs=min_runs)
        finished = scalar(
            con,
            "SELECT count(*) FROM jobs WHERE end_time IS NOT NULL AND start_time IS NOT NULL "
            "AND (CAST(? AS VARCHAR) IS NULL OR cluster = ?)",
            [cluster, cluster],
        )
    return {
        "db": str(path),
        "cluster": cluster,
        "finished_runs": int(str(finished)),
        "build": built.to_dict() if built is not None else None,
        "rule": ATTRIBUTION_RULE,
        "profiles": book.to_dict(),
    }


def format_profiles(report: dict[str, Any]) -> str:
    """The human-readable report."""
    book = report["profiles"]
    lines = [f"store {report['db']}: {report['finished_runs']} finished runs"]
    built = report.get("build")
    if built is not None:
        if built["horizon"] is None:
            lines.append("  job telemetry: the store holds no telemetry; nothing built")
        else:
            c = built["counts"]
            lines += [
                f"  job telemetry: {built['built']} runs summarized now "
                f"({built['with_telemetry']} with telemetry), {built['waiting']} waiting for "
                "telemetry past their end",
                f"  link intervals: {c['link_used']} used, {c['link_shared']} shared, "
                f"{c['link_edge']} at an edge, {c['link_missing']} missing; activity "
                f"instants: {c['activity_used']} used, {c['activity_shared']} shared, "
                f"{c['activity_bad']} bad, {c['activity_missing']} missing",
            ]
    lines.append(
        f"  runs with telemetry: {book['runs_with_telemetry']} of {book['runs_summarized']} "
        f"summarized, {book['job_hours']:.1f} job-hours over "
        f"{duration_text(book['span_hours'] * 3600.0)}; "
        f"{book['runs_used']} usable for profiles (multi-GPU, activity and traffic alone)"
    )
    lines.append(
        f"  profiles learned (at least {book['min_runs']} runs): {len(book['by_name'])} by "
        f"job name, {len(book['by_shape'])} by user and GPUs"
    )
    for section in ("by_name", "by_shape"):
        for key, p in book[section].items():
            lines.append(
                f"    {section[3:]} {key}: {p['runs']} runs, compute_s {p['activity']:.3f}, "
                f"grad_gb {p['profile']['grad_gb']:.4g}, {p['rho_gb']:.4g} GB per compute "
                f"second (spread {p['rho_spread']:.1%}), sensitivity {p['sensitivity']:.2f}"
            )
    return "\n".join(lines)
