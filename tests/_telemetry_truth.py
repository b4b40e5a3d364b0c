"""A small cluster whose telemetry is known: hand-written jobs on GPUs of nodes (the truth,
GPU indices included), and what its exporters would print at every scrape (dcgm-exporter
text with or without the ``hpc_job`` label, node_exporter's InfiniBand byte counters: the
library's exposition functions, ``datasets.hidden_truth.exposition``, whose simulated
cluster grows from this), stored through the real collectors' ingest (``ingest_prometheus``,
``derive_ib_link_load``) beside the accounting (``ingest_job_runs``) in a DuckDB store."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import duckdb

from linkwise.datasets.hidden_truth.exposition import (
    GpuSample,
    IbPort,
    dcgm_exposition,
    node_exporter_exposition,
)
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus
from linkwise.testkit.history import completed_run

T0 = 1.7e9
INTERVAL_S = 30.0
GPUS_PER_NODE = 8
CLUSTER = "c"


@dataclass(frozen=True)
class TruthJob:
    """One run: its GPUs per node (indices), when, and what it does while it runs: SM
    activity (a ratio), NVLink tx bytes/s per GPU (rx the same), NIC tx bytes/s per node (rx
    the same)."""

    job_id: int
    start: float
    end: float
    alloc: Mapping[str, tuple[int, ...]]
    activity: float
    nvlink_tx: float = 0.0
    nic_tx: float = 0.0
    name: str = ""
    user: str = "u"
    bad: Mapping[tuple[str, float], float] = field(default_factory=dict)  # (node, ts) -> value

    def on(self, node: str, ts: float) -> bool:
        return node in self.alloc and self.start <= ts < self.end


def dcgm_text(node: str, ts: float, jobs: Sequence[TruthJob], *, labelled: bool) -> str:
    """What dcgm-exporter prints on ``node`` at ``ts``: every GPU's SM activity, GPU
    utilisation and NVLink bytes; a GPU outside every running job idle."""
    owner: dict[int, TruthJob] = {}
    for j in jobs:
        if j.on(node, ts):
            owner.update((g, j) for g in j.alloc[node])
    samples = []
    for g in range(GPUS_PER_NODE):
        j = owner.get(g)
        if j is None:
            samples.append(GpuSample(g, None, 0.0, 0, 0.0, 0.0))
            continue
        util = min(100, round(100 * j.activity) + 20)
        active = j.bad.get((node, ts), j.activity)
        label = j.job_id if labelled else None
        samples.append(GpuSample(g, label, active, util, j.nvlink_tx, j.nvlink_tx))
    return dcgm_exposition(node, samples)


def nic_bytes(node: str, t: float, jobs: Sequence[TruthJob]) -> float:
    """Bytes the node's NIC has sent by ``t`` (and received: the same) since ``T0``."""
    return sum(
        j.nic_tx * max(0.0, min(t, j.end) - max(T0, j.start)) for j in jobs if node in j.alloc
    )


def node_exporter_text(node: str, ts: float, jobs: Sequence[TruthJob], base: float) -> str:
    """node_exporter's InfiniBand byte counters of ``node``'s one HCA port at ``ts``
    (starting at ``base`` bytes)."""
    total = base + nic_bytes(node, ts, jobs)
    return node_exporter_exposition([IbPort(total, total)])


def fill_store(
    con: duckdb.DuckDBPyConnection,
    jobs: Sequence[TruthJob],
    *,
    nodes: Sequence[str],
    until: float,
    labelled: bool = False,
    skip: frozenset[tuple[str, float]] = frozenset(),
    ib_base: float = 1.0e12,
    start: float = T0,
    running: Collection[int] = (),
) -> None:
    """Accounting of ``jobs`` and every scrape of ``nodes`` from ``start`` to ``until``
    (every ``INTERVAL_S``; ``skip``: (node, ts) scrapes that never happened), through the
    real ingest functions; then the InfiniBand rates derived. The jobs in ``running`` are
    accounted as still running (no end)."""
    runs = [
        replace(
            completed_run(
                j.job_id,
                j.start - 60.0,
                j.start,
                j.end,
                {n: len(g) for n, g in j.alloc.items()},
                cluster=CLUSTER,
                name=j.name or f"j{j.job_id}",
            ),
            user=j.user,
        )
        for j in jobs
    ]
    runs = [
        replace(r, state="RUNNING", exit_code=None, end_time=None) if r.job_id in running else r
        for r in runs
    ]
    ingest_job_runs(con, runs, source=f"accounting:{CLUSTER}")
    ts = start
    while ts <= until:
        for node in nodes:
            if (node, ts) in skip:
                continue
            ingest_prometheus(
                con,
                dcgm_text(node, ts, jobs, labelled=labelled),
                source=f"prometheus:http://{node}:9400/metrics",
                ts=ts,
                host=node,
                cluster=CLUSTER,
                interval_s=INTERVAL_S,
            )
            ingest_prometheus(
                con,
                node_exporter_text(node, ts, jobs, ib_base),
                source=f"prometheus:http://{node}:9100/metrics",
                ts=ts,
                host=node,
                cluster=CLUSTER,
                interval_s=INTERVAL_S,
            )
        ts += INTERVAL_S
    derive_ib_link_load(
        con,
        since=start - INTERVAL_S,
        until=until + INTERVAL_S,
        expected_interval_s=INTERVAL_S,
        cluster=CLUSTER,
    )
