"""Collection as Prefect flows: Slurm accounting (``pipelines.collect_accounting``) and
interconnect telemetry (``pipelines.collect_telemetry``) into the DuckDB store.

Plain functions do the work; the flows are thin wrappers that add retries on the reads only.

Retries in the flows: the Slurm reads (``sacct``/``sinfo`` or slurmrestd), the HTTP scrapes
and the sysfs reads are pure reads, so they are Prefect tasks with retries. The DuckDB
writes are not retried inside a run: each is one idempotent transaction, so a retry would be
safe, but what makes a write fail (disk full, a schema newer than this code) does not go
away in seconds; the failed window is rolled back and the next scheduled run starts again
from the watermark. Only opening a store that another process holds is retried, for
``lock_wait_s`` seconds (DuckDB lets one process write a file), then refused with
``StoreLockedError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import AccountingBatch, NodeInfo
from linkwise.datasets.telemetry.scrape import Scrape, scrape_http
from linkwise.datasets.telemetry.sysfs import SysfsReading, read_sysfs
from linkwise.pipelines.collect_accounting import (
    DEFAULT_OVERLAP_S,
    DEFAULT_REJECT_HOLD_S,
    DEFAULT_WINDOW_S,
    AccountingSource,
    collect_accounting,
)
from linkwise.pipelines.collect_common import CollectError
from linkwise.pipelines.collect_telemetry import collect_telemetry

__all__ = ["collect_accounting_flow", "collect_telemetry_flow"]


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_accounting(client: AccountingSource, since: float, until: float | None) -> AccountingBatch:
    """Slurm accounting records of a window, and those rejected (a pure read: retried)."""
    return client.accounting(since, until)


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_nodes(client: AccountingSource) -> list[NodeInfo]:
    """The cluster's nodes (a pure read: retried)."""
    return client.nodes()


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def scrape_endpoint(url: str, timeout: float) -> Scrape:
    """GET one exporter endpoint (a pure read: retried)."""
    return scrape_http(url, timeout)


@task(retries=1, retry_delay_seconds=1, cache_policy=NO_CACHE)
def read_sysfs_tree(root: str | Path, host: str) -> SysfsReading:
    """Read one sysfs InfiniBand tree (a pure read: retried)."""
    return read_sysfs(root, host=host)


@dataclass(frozen=True, slots=True)
class _TaskReads:
    """An AccountingSource whose reads run as retrying Prefect tasks."""

    client: AccountingSource

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        return read_accounting(self.client, since, until)

    def nodes(self) -> list[NodeInfo]:
        return read_nodes(self.client)


@flow(name="collect-accounting", log_prints=False)
def collect_accounting_flow(
    db: str,
    slurm_env: str,
    transport: str = "cli",
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    overlap_s: float = DEFAULT_OVERLAP_S,
    reject_hold_s: float = DEFAULT_REJECT_HOLD_S,
) -> dict[str, Any]:
    """Collect a Slurm cluster's accounting into the DuckDB store at ``db``.

    ``slurm_env`` is an env file (``SLURM_CONF``, ``LINKWISE_SLURM_REST_URL``,
    ``LINKWISE_SLURM_CLUSTER``); ``transport`` is ``cli`` or ``rest``. Returns the report as
    a dict (``AccountingReport.to_dict``).
    """

    if transport not in ("cli", "rest"):
        raise ValueError(f"unknown transport {transport!r} (cli or rest)")
    env = read_env_file(slurm_env)
    client = SlurmClient.from_env(env, "cli" if transport == "cli" else "rest")
    name = cluster or env.get("LINKWISE_SLURM_CLUSTER") or "default"
    report = collect_accounting(
        _TaskReads(client),
        db,
        cluster=name,
        since=since,
        until=until,
        window_s=window_s,
        overlap_s=overlap_s,
        reject_hold_s=reject_hold_s,
        logger=get_run_logger(),
    )
    return report.to_dict()


@flow(name="collect-telemetry", log_prints=False)
def collect_telemetry_flow(
    db: str,
    endpoints: list[str] | None = None,
    sysfs_roots: list[str] | None = None,
    host: str | None = None,
    cluster: str = "",
    timeout: float = 5.0,
    interval_s: float = 30.0,
) -> dict[str, Any]:
    """Scrape exporter endpoints and sysfs trees into the DuckDB store at ``db``.

    Returns the report as a dict (``TelemetryCollectReport.to_dict``); raises
    ``CollectError`` (after storing the other sources) when a source could not be read.
    """
    report = collect_telemetry(
        db,
        endpoints=endpoints or [],
        sysfs_roots=sysfs_roots or [],
        host=host,
        cluster=cluster,
        timeout=timeout,
        interval_s=interval_s,
        scrape=lambda url, t: scrape_endpoint(url, t),
        read=lambda root, h: read_sysfs_tree(root, h),
        logger=get_run_logger(),
    )
    if report.errors:
        failed = "; ".join(f"{s}: {e}" for s, e in report.errors)
        raise CollectError(f"telemetry sources failed (others stored): {failed}", report)
    return report.to_dict()
