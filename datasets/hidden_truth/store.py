"""The hidden truth through the real ingest (``fill_truth_store``): per scrape and node,
dcgm-exporter's and node_exporter's text (``exposition``) with the samples and counters the
hidden model gives, then the InfiniBand rates, and the accounting as ``sacct --json`` prints
it read by the collector's own parser (``parse_sacct_output``), into a DuckDB store."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from linkwise.cluster.contention import ring_comm_time
from linkwise.cluster.domain import Job, Topology
from linkwise.cluster.slurm.accounting import parse_sacct_output
from linkwise.datasets.hidden_truth.exposition import (
    GpuSample,
    IbPort,
    accounting,
    dcgm_exposition,
    node_exporter_exposition,
)
from linkwise.datasets.hidden_truth.sacct import sacct_json, sacct_lines
from linkwise.datasets.hidden_truth.truth import (
    HiddenTruth,
    Piece,
    Timeline,
    simulate_timeline,
    truth_workload,
)
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus

__all__ = ["TruthReport", "fill_truth_store"]

W32_BYTES = 4.0 * (2**32 - 1)
"""Where node_exporter's 32-bit ``port_data`` byte counters (words x 4) saturate."""
M64 = float(2**64)


@dataclass(frozen=True, slots=True)
class _JobTerms:
    """What the hidden model says of a job, rate aside."""

    compute_share: float  # compute_s / best_time: SM activity at rate 1
    iter_per_rate: float  # iterations per second at rate 1 (1 / best_time)
    ring_bytes: float  # bytes one GPU sends per iteration, 2 (g - 1) / g x grad_gb x 1e9
    overhead: float  # per-iteration overhead of its placement, seconds


def _job_terms(truth: HiddenTruth, topo: Topology, job: Job, nodes: int) -> _JobTerms:
    model = truth.model()
    prof = model.profile(job)
    best = model.best_time(topo, job)
    ring = ring_comm_time(prof, job.num_gpus, 1.0) * 1e9
    over = truth.calibration.overhead_s * nodes if nodes > 1 else 0.0
    return _JobTerms(prof.compute_s / best, 1.0 / best, ring, over)


@dataclass(frozen=True)
class TruthReport:
    """What ``fill_truth_store`` emitted: jobs and runs, scrapes done and skipped, the bad
    samples put in on purpose (per job: the (node, epoch) instants with an out-of-range SM
    sample, and the NaN samples), ingest results and wall time."""

    jobs: int
    runs: int
    running_at_end: int
    scrapes: int
    skipped: tuple[tuple[str, float], ...]
    out_of_range: Mapping[int, tuple[tuple[str, float], ...]]
    nan_samples: int
    ib_rate_report: Mapping[str, Any]
    seconds: float
    timeline: Timeline

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "runs": self.runs,
            "running_at_end": self.running_at_end,
            "scrapes": self.scrapes,
            "skipped": len(self.skipped),
            "out_of_range_instants": sum(len(v) for v in self.out_of_range.values()),
            "nan_samples": self.nan_samples,
            "ib_rates": dict(self.ib_rate_report),
            "seconds": self.seconds,
        }


def _nic_rates(timeline: Timeline, terms: Mapping[int, _JobTerms], nodes: int) -> list[list[float]]:
    """Per node and segment, the bytes/s its NIC sends (and receives): one ring edge of every
    split job on it."""
    out = [[0.0] * len(timeline.starts) for _ in range(nodes)]
    for s, (_, _, pieces) in enumerate(timeline.segments()):
        for p in pieces:
            if len(p.placement.alloc) > 1:
                jt = terms[p.job_id]
                rate = jt.ring_bytes * p.rate * jt.iter_per_rate
                for n in p.placement.nodes:
                    out[n][s] += rate
    return out


def _cumulative(timeline: Timeline, rates: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per node, the bytes sent by each segment's start (and by the timeline's end, last)."""
    out = []
    for per_seg in rates:
        total, acc = 0.0, []
        for (a, b, _), r in zip(timeline.segments(), per_seg, strict=True):
            acc.append(total)
            total += r * (b - a)
        acc.append(total)
        out.append(acc)
    return out


def _sent(
    timeline: Timeline, cumulative: Sequence[float], rates: Sequence[float], t: float
) -> float:
    """Bytes a node's NIC has sent by simulated time ``t``."""
    if t >= timeline.end:
        return cumulative[-1]
    s = _segment_index(timeline, t)
    return 0.0 if s < 0 else cumulative[s] + rates[s] * (t - timeline.starts[s])


def _segment_index(timeline: Timeline, t: float) -> int:
    return bisect.bisect_right(timeline.starts, t) - 1


@dataclass(frozen=True, slots=True)
class _Counter:
    """How a node's InfiniBand counter reads: from ``base`` (64-bit, wrapping at 2**64),
    cleared at ``reset_at`` (simulated seconds; inf: never), or a 32-bit one stuck at its
    saturation value."""

    base: float
    reset_at: float
    port32: bool

    def port(self, sent: float, sent_at_reset: float, t: float) -> IbPort:
        if self.port32:
            value = min(self.base + sent, W32_BYTES)
            return IbPort(None, None, value, value)
        cleared = t >= self.reset_at
        value = sent - sent_at_reset if cleared else math.fmod(self.base + sent, M64)
        return IbPort(value, value)


def _counters(
    truth: HiddenTruth,
    timeline: Timeline,
    names: Sequence[str],
    cumulative: Sequence[Sequence[float]],
    rates: Sequence[Sequence[float]],
) -> list[_Counter]:
    out = []
    for n, node in enumerate(names):
        if node in truth.port32_nodes:
            out.append(_Counter(W32_BYTES, math.inf, True))
            continue
        base = 1.0e12 * (n + 1)
        if node in truth.wrap_nodes:  # wraps once it has sent half its bytes of the window
            half = _sent(timeline, cumulative[n], rates[n], truth.window_s) / 2.0
            base = M64 - max(half, 1.0e9)
        reset = truth.window_s / 2.0 if node in truth.reset_nodes else math.inf
        out.append(_Counter(base, reset, False))
    return out


def _gpu_samples(
    truth: HiddenTruth,
    node: int,
    gpus: int,
    pieces: Sequence[Piece],
    terms: Mapping[int, _JobTerms],
    rng: np.random.Generator,
) -> tuple[list[GpuSample], list[int], int]:
    """One node's GPUs at one scrape: the samples, the jobs given an out-of-range SM sample
    and the NaN samples put in."""
    owner = {g: p for p in pieces for g in p.gpus.get(node, ())}
    samples: list[GpuSample] = []
    bad: list[int] = []
    nans = 0
    for gpu in range(gpus):
        p = owner.get(gpu)
        if p is None or p.rate <= 0:
            samples.append(GpuSample(gpu, None, 0.0, 0, 0.0, 0.0))
            continue
        jt = terms[p.job_id]
        mean = p.rate * jt.compute_share
        spread = truth.noise * min(mean, 1.0 - mean)  # never pushed past 0 or 1: unbiased
        active = min(1.0, max(0.0, mean + spread * float(rng.standard_normal())))
        if truth.bad_rate and rng.random() < truth.bad_rate:
            if rng.random() < 0.5:
                active = 1.0 + float(rng.uniform(0.05, 1.0))
                bad.append(p.job_id)
            else:
                active = math.nan
                nans += 1
        iteration = 1.0 / (p.rate * jt.iter_per_rate)
        util = round(100.0 * (1.0 - jt.overhead / iteration))
        mine = len(p.gpus[node])
        edge = (mine - 1) / mine if len(p.placement.alloc) > 1 else 1.0
        nvlink = jt.ring_bytes * p.rate * jt.iter_per_rate * edge
        job = p.job_id if truth.labelled else None
        samples.append(GpuSample(gpu, job, active, util, nvlink, nvlink))
    return samples, bad, nans


def fill_truth_store(
    con: duckdb.DuckDBPyConnection, truth: HiddenTruth, jobs: Sequence[Job] | None = None
) -> TruthReport:
    """Simulate the truth (``jobs``: default ``truth_workload``) and store what its
    exporters and its accounting give, through the real ingest functions, scrape by scrape
    over the window; then the InfiniBand rates derived as the collection flow does, and
    sacct's text of the runs (``truth.slurm``'s schema) parsed as ``linkwise collect`` parses
    it."""
    t_start = time.perf_counter()
    topo = truth.topology()
    work = truth_workload(truth) if jobs is None else tuple(jobs)
    timeline = simulate_timeline(truth, work)
    names = [n.name for n in topo.nodes]
    terms: dict[int, _JobTerms] = {}
    for _, _, ps in timeline.segments():
        for p in ps:
            if p.job_id not in terms:
                job = timeline.jobs[p.job_id]
                terms[p.job_id] = _job_terms(truth, topo, job, len(p.placement.alloc))
    rates = _nic_rates(timeline, terms, len(names))
    cumulative = _cumulative(timeline, rates)
    counters = _counters(truth, timeline, names, cumulative, rates)
    at_reset = [
        _sent(timeline, c, r, truth.window_s / 2.0) for c, r in zip(cumulative, rates, strict=True)
    ]
    rng = np.random.default_rng([truth.seed, 1])
    skipped: list[tuple[str, float]] = []
    out_of_range: dict[int, list[tuple[str, float]]] = {}
    nan_samples = 0
    scrapes = 0
    k = 0
    while (t := k * truth.interval_s) <= truth.window_s:
        k += 1
        pieces = timeline.at(t)
        epoch = truth.t0 + t
        for n, node in enumerate(names):
            if truth.miss_rate and rng.random() < truth.miss_rate:
                skipped.append((node, epoch))
                continue
            samples, bad, nans = _gpu_samples(truth, n, topo.nodes[n].gpus, pieces, terms, rng)
            nan_samples += nans
            for job_id in sorted(set(bad)):
                out_of_range.setdefault(job_id, []).append((node, epoch))
            ingest_prometheus(
                con,
                dcgm_exposition(node, samples),
                source=f"prometheus:http://{node}:9400/metrics",
                ts=epoch,
                host=node,
                cluster=truth.cluster,
                interval_s=truth.interval_s,
            )
            sent = _sent(timeline, cumulative[n], rates[n], t)
            ingest_prometheus(
                con,
                node_exporter_exposition([counters[n].port(sent, at_reset[n], t)]),
                source=f"prometheus:http://{node}:9100/metrics",
                ts=epoch,
                host=node,
                cluster=truth.cluster,
                interval_s=truth.interval_s,
            )
            scrapes += 1
    _, rate_report = derive_ib_link_load(
        con,
        since=truth.t0 - truth.interval_s,
        until=truth.t0 + truth.window_s + truth.interval_s,
        expected_interval_s=truth.interval_s,
        cluster=truth.cluster,
    )
    held = accounting(truth, timeline)
    batch = parse_sacct_output(sacct_json(held, truth.slurm), sacct_lines(held))
    runs = batch.runs
    ingest_job_runs(con, runs, source=f"accounting:{truth.cluster}", rejected=batch.rejected)
    return TruthReport(
        jobs=len(work),
        runs=len(runs),
        running_at_end=sum(r.end_time is None for r in runs),
        scrapes=scrapes,
        skipped=tuple(skipped),
        out_of_range={j: tuple(v) for j, v in out_of_range.items()},
        nan_samples=nan_samples,
        ib_rate_report={
            "rates": rate_report.rates,
            "wraps": rate_report.wraps,
            "resets": rate_report.resets,
            "saturated": rate_report.saturated,
            "gaps": rate_report.gaps,
        },
        seconds=time.perf_counter() - t_start,
        timeline=timeline,
    )
