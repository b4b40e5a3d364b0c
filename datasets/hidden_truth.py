"""A hidden truth: a simulated cluster whose contention parameters and communication
profiles the calibration does not know, observed only through what real exporters print and
what Slurm's accounting holds (issue 34 item 4).

The truth is a ``Calibration`` (``alpha``, ``overhead_s``, one ``CommProfile`` per job name)
on a topology of its own (link speeds unlike the shipped defaults). Its jobs run in the real
simulator (``cluster.simulator.engine.Simulator`` with an ``AnalyticModel`` of the hidden
calibration, scheduled by the seeded ``RandomPolicy``, which spreads jobs over nodes and so
makes rings share links); every running set is recorded with its rates (``Timeline``). What
the cluster's exporters would print at every scrape follows from it:

- dcgm-exporter (``dcgm_exposition``): per GPU ``DCGM_FI_PROF_SM_ACTIVE`` (a ratio),
  ``DCGM_FI_DEV_GPU_UTIL`` (a percentage) and NVLink tx/rx bytes/s, with the ``hpc_job``
  label of DCGM's job mapping. A ring all-reduce job computes, then communicates with its
  GPUs idle, so its SM activity is its compute share of an iteration: at rate r (the model's
  isolated time at its best placement over its time now) it shows r x its compute share at
  the best placement, plus a seeded noise of sd ``noise`` x min(activity, 1 - activity) (so
  no sample is clipped at 0 or 1 and the mean stays the model's); GPU_UTIL counts every kernel
  (compute and NCCL), the iteration less the per-node overhead;
- node_exporter (``node_exporter_exposition``): each node's InfiniBand byte counters, the
  ring edge of every split job on the node (one per node, ``2 (g - 1) / g x grad_gb`` per
  iteration each way). 64-bit counters (``legacy``, counters_ext) start near 2**64 on some
  nodes so they wrap; ``reset_nodes`` have their counter cleared once (a driver reload);
  ``port32_nodes`` expose only the 32-bit PMA counters, which saturate at 4 x (2**32 - 1)
  and so never give a rate (as on HCAs without extended counters);
- the accounting (``accounting``): ``JobRun`` records as ``sacct --json`` gives them when the
  window ends: epoch seconds, the node list with the GPU total split evenly over it (sacct
  keeps no GPUs per node), still-running jobs without an end.

Some samples are bad on purpose: a share ``bad_rate`` of SM samples is out of range (above
1) or NaN, and a share ``miss_rate`` of scrapes never happens; the report lists them so tests
can check they are counted, not guessed.

``fill_truth_store`` sends it all through the real ingest functions (``ingest_prometheus`` per
scrape and exporter, ``derive_ib_link_load``, ``ingest_job_runs``) into a DuckDB store.

The workload is synthetic: GPU counts from the multi-GPU part of the Philly trace's GPU-count
distribution (``datasets/data/philly_stats.json``: 2, 4, 8, 16 GPUs in proportion 521 : 360 :
450 : 43; one-GPU jobs never communicate, so none is drawn), run times log-uniform in
[``min_s``, ``max_s``] (not Philly's, which run for hours: a few hours of telemetry must hold
many runs), Poisson arrivals at ``load`` x the cluster's GPUs, job names drawn by ``weights``.
The hidden profiles (``TRUTH_PROFILES``) are invented, H100-scale numbers: they are not
measurements of the models they are named after.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from linkwise.cluster.contention import AnalyticModel, ring_comm_time
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.slurm.gpu_counts import even_split
from linkwise.cluster.slurm.records import JobRun
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.comm_profiles import PROFILE_PREFIX
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.synthetic import load_stats
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus
from linkwise.policies.random_policy import RandomPolicy

__all__ = [
    "DEFAULT_T0",
    "TRUTH_PROFILES",
    "TRUTH_WEIGHTS",
    "GpuSample",
    "HiddenTruth",
    "IbPort",
    "Piece",
    "Recovered",
    "Timeline",
    "TruthReport",
    "accounting",
    "dcgm_exposition",
    "fill_truth_store",
    "node_exporter_exposition",
    "recovery",
    "simulate_timeline",
    "truth_workload",
]

DEFAULT_T0 = 1.7e9
"""The epoch second simulated time 0 maps to."""
GPU_MODEL = "NVIDIA H100 80GB HBM3"
W32_BYTES = 4.0 * (2**32 - 1)
"""Where node_exporter's 32-bit ``port_data`` byte counters (words x 4) saturate."""
M64 = float(2**64)

TRUTH_PROFILES: tuple[CommProfile, ...] = (
    CommProfile("llm-1b", 0.42, 2.6, "hidden truth (invented)"),
    CommProfile("moe-8x", 0.25, 9.0, "hidden truth (invented)"),
    CommProfile("vit-l", 0.30, 0.6, "hidden truth (invented)"),
    CommProfile("dlrm", 0.05, 1.1, "hidden truth (invented)"),
    CommProfile("gpt-7b", 1.10, 14.0, "hidden truth (invented)"),
    CommProfile("rare-rnn", 0.15, 0.9, "hidden truth (invented)"),
)
"""The hidden profiles, one per job name (compute seconds and gradient GB per iteration)."""
TRUTH_WEIGHTS: Mapping[str, float] = {
    "llm-1b": 0.26,
    "moe-8x": 0.2,
    "vit-l": 0.2,
    "dlrm": 0.2,
    "gpt-7b": 0.12,
    "rare-rnn": 0.02,
}
"""How often each job name is drawn (``rare-rnn`` is seen only a few times)."""
# The multi-GPU part of Philly's GPU-count distribution (datasets/data/philly_stats.json).
_PHILLY_MULTI_GPU = (2, 4, 8, 16)


@dataclass(frozen=True)
class HiddenTruth:
    """The truth's parameters (``calibration``: what the fit must recover), its cluster, the
    synthetic workload's knobs and the exporters' flaws."""

    calibration: Calibration
    topology_spec: str = "4x8,leaf=2,nic=50,intra=450,oversub=2"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(TRUTH_WEIGHTS))
    hours: float = 4.0
    load: float = 1.3  # offered GPU-seconds per second over the cluster's GPUs
    min_s: float = 600.0
    max_s: float = 2400.0
    max_gpus: int = 16
    interval_s: float = 60.0
    noise: float = 0.04  # sd of one SM_ACTIVE sample over min(activity, 1 - activity)
    bad_rate: float = 0.0
    miss_rate: float = 0.0
    wrap_nodes: tuple[str, ...] = ()  # 64-bit counters that wrap halfway through the window
    reset_nodes: tuple[str, ...] = ()  # counters cleared once, in the middle of the window
    port32_nodes: tuple[str, ...] = ()  # only 32-bit (saturating) counters
    labelled: bool = True  # dcgm-exporter's hpc_job label (DCGM job mapping on)
    cluster: str = "truth"
    seed: int = 0
    t0: float = DEFAULT_T0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(self.calibration.profiles))
        if unknown:
            raise ValueError(f"weights name profiles the truth lacks: {unknown}")
        if not (self.hours > 0 and self.load > 0 and 0 < self.min_s <= self.max_s):
            raise ValueError("hours, load and run times must be positive (min_s <= max_s)")
        if not self.interval_s > 0 or self.noise < 0:
            raise ValueError("interval_s must be positive and noise non-negative")
        if not (0 <= self.bad_rate < 1 and 0 <= self.miss_rate < 1):
            raise ValueError("bad_rate and miss_rate must be in [0, 1)")

    @staticmethod
    def default(**overrides: Any) -> HiddenTruth:
        """The default truth: alpha 0.9 and a 4 ms per-node overhead (the shipped calibration
        has 0.40 and 0), the ``TRUTH_PROFILES``, on H100-class nodes (450 GB/s NVLink, 400
        Gb/s = 50 GB/s rails, leaf uplinks oversubscribed 2:1); ``overrides`` replace fields
        (``alpha``/``overhead_s`` those of the calibration)."""
        alpha = float(overrides.pop("alpha", 0.9))
        overhead = float(overrides.pop("overhead_s", 0.004))
        cal = Calibration(
            profiles={p.name: p for p in TRUTH_PROFILES},
            alpha=alpha,
            overhead_s=overhead,
            mix=dict(TRUTH_WEIGHTS),
            source="hidden truth (synthetic; datasets/hidden_truth.py)",
        )
        return HiddenTruth(calibration=cal, **overrides)

    def topology(self) -> Topology:
        return from_spec(self.topology_spec)

    def model(self) -> AnalyticModel:
        return AnalyticModel(self.calibration)

    @property
    def window_s(self) -> float:
        return self.hours * 3600.0


def truth_workload(truth: HiddenTruth) -> tuple[Job, ...]:
    """The synthetic jobs (module docstring): arrivals over the window, each named after the
    hidden profile it runs, its user ``u-<name>``."""
    rng = np.random.default_rng(truth.seed)
    counts = load_stats()["gpu_counts"]
    philly = dict(zip(counts["values"], counts["counts"], strict=True))
    sizes = [g for g in _PHILLY_MULTI_GPU if g <= truth.max_gpus]
    if not sizes:
        raise ValueError(f"max_gpus={truth.max_gpus} leaves no multi-GPU size")
    p = np.array([philly[g] for g in sizes], dtype=np.float64)
    p /= p.sum()
    lo, hi = math.log(truth.min_s), math.log(truth.max_s)
    mean_s = (truth.max_s - truth.min_s) / (hi - lo) if hi > lo else truth.min_s
    rate = truth.load * truth.topology().total_gpus / (float(np.dot(p, sizes)) * mean_s)
    names = sorted(n for n, w in truth.weights.items() if w > 0)
    w = np.array([truth.weights[n] for n in names], dtype=np.float64)
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= truth.window_s:
            break
        g = int(rng.choice(sizes, p=p))
        d = math.exp(float(rng.uniform(lo, hi)))
        name = names[int(rng.choice(len(names), p=w / w.sum()))]
        jobs.append(
            Job(
                job_id=len(jobs) + 1,
                submit_time=t,
                num_gpus=g,
                duration=d,
                profile=name,
                user=f"u-{name}",
                name=name,
            )
        )
    return tuple(jobs)


# ------------------------------------------------------------------------ the timeline


@dataclass(frozen=True, slots=True)
class Piece:
    """One job running through a segment: its placement, rate, and GPU indices per node."""

    job_id: int
    placement: Placement
    rate: float
    gpus: Mapping[int, tuple[int, ...]]  # node index -> GPU indices


@dataclass(frozen=True)
class Timeline:
    """What ran when: segments ``[starts[i], starts[i + 1])`` (the last to ``end``) with the
    jobs running through them; every job's first start and end (simulated seconds)."""

    jobs: Mapping[int, Job]
    starts: tuple[float, ...]
    pieces: tuple[tuple[Piece, ...], ...]
    started: Mapping[int, float]
    ended: Mapping[int, float]
    end: float

    def at(self, t: float) -> tuple[Piece, ...]:
        """The jobs running at simulated time ``t``."""
        i = bisect.bisect_right(self.starts, t) - 1
        return self.pieces[i] if i >= 0 and t < self.end else ()

    def segments(self) -> Iterator[tuple[float, float, tuple[Piece, ...]]]:
        bounds = (*self.starts[1:], self.end)
        yield from zip(self.starts, bounds, self.pieces, strict=True)


def simulate_timeline(truth: HiddenTruth, jobs: Sequence[Job]) -> Timeline:
    """Run ``jobs`` in the simulator with the hidden model (``RandomPolicy``: every job that
    fits starts at once, on a random one of the placement generators' candidates) and record
    every running set with its rates. GPU indices: each job takes the lowest free ones on
    each of its nodes."""
    topo = truth.topology()
    sim = Simulator(topo, jobs, truth.model(), SimConfig(restart=RestartModel.free()))
    policy = RandomPolicy(seed=truth.seed, start_prob=1.0)
    free = [set(range(n.gpus)) for n in topo.nodes]
    held: dict[int, dict[int, tuple[int, ...]]] = {}
    starts: list[float] = []
    pieces: list[tuple[Piece, ...]] = []
    started: dict[int, float] = {}
    while True:
        sim.apply(policy.decide(sim.observe()))
        state = sim.observe()
        running = {r.job.job_id: r for r in state.running}
        for job_id in [j for j in held if j not in running]:
            for node, idx in held.pop(job_id).items():
                free[node].update(idx)
        for job_id, r in running.items():
            if job_id not in held:
                taken: dict[int, tuple[int, ...]] = {}
                for node, g in r.placement.alloc:
                    idx = tuple(sorted(free[node])[:g])
                    free[node].difference_update(idx)
                    taken[node] = idx
                held[job_id] = taken
                started[job_id] = state.time
        now = tuple(Piece(j, r.placement, r.rate, held[j]) for j, r in sorted(running.items()))
        if starts and starts[-1] == state.time:
            pieces[-1] = now
        else:
            starts.append(state.time)
            pieces.append(now)
        if not sim.advance():
            break
    ended = {rec.job.job_id: rec.end for rec in sim.records}
    return Timeline(
        jobs={j.job_id: j for j in jobs},
        starts=tuple(starts),
        pieces=tuple(pieces),
        started=started,
        ended=ended,
        end=max(ended.values(), default=0.0),
    )


# ------------------------------------------------------------------------ exporters


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU in one dcgm-exporter scrape."""

    gpu: int
    job: int | None  # the hpc_job label's job id (None: idle, or no job mapping)
    sm_active: float
    gpu_util: int
    nvlink_tx: float  # bytes/s
    nvlink_rx: float


def _gpu_labels(node: str, gpu: int, job: int | None) -> str:
    job_label = f',hpc_job="{job}"' if job is not None else ""
    return (
        f'gpu="{gpu}",UUID="GPU-{node}-{gpu:04d}",device="nvidia{gpu}",'
        f'modelName="{GPU_MODEL}",Hostname="{node}"{job_label}'
    )


def dcgm_exposition(node: str, samples: Sequence[GpuSample]) -> str:
    """What dcgm-exporter prints for ``node``'s GPUs: SM activity, GPU utilisation and the
    NVLink byte rates, each GPU with its ``hpc_job`` label where it has one."""
    lines = [
        "# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.",
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
    ]
    lines += [
        f"DCGM_FI_PROF_SM_ACTIVE{{{_gpu_labels(node, s.gpu, s.job)}}} {s.sm_active!r}"
        for s in samples
    ]
    lines.append("# TYPE DCGM_FI_DEV_GPU_UTIL gauge")
    lines += [
        f"DCGM_FI_DEV_GPU_UTIL{{{_gpu_labels(node, s.gpu, s.job)}}} {s.gpu_util}" for s in samples
    ]
    for metric, attr in (
        ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx"),
        ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx"),
    ):
        lines.append(f"# TYPE {metric} gauge")
        lines += [
            f"{metric}{{{_gpu_labels(node, s.gpu, s.job)}}} {getattr(s, attr)!r}" for s in samples
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class IbPort:
    """One HCA port's byte counters in one node_exporter scrape: the 64-bit ``legacy`` ones
    (counters_ext) and/or the 32-bit ``port`` ones (counters/), None where absent."""

    legacy_tx: float | None
    legacy_rx: float | None
    port_tx: float | None = None
    port_rx: float | None = None
    device: str = "mlx5_0"
    port: str = "1"


def node_exporter_exposition(ports: Sequence[IbPort]) -> str:
    """node_exporter's InfiniBand byte counters of the ports."""
    lines: list[str] = []
    for what, legacy, port in (
        ("transmitted", "legacy_tx", "port_tx"),
        ("received", "legacy_rx", "port_rx"),
    ):
        for kind, attr in (("legacy", legacy), ("port", port)):
            metric = f"node_infiniband_{kind}_data_{what}_bytes_total"
            values = [(p, getattr(p, attr)) for p in ports if getattr(p, attr) is not None]
            if values:
                lines.append(f"# TYPE {metric} counter")
                lines += [
                    f'{metric}{{device="{p.device}",port="{p.port}"}} {v!r}' for p, v in values
                ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ scrapes


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


def accounting(truth: HiddenTruth, timeline: Timeline) -> list[JobRun]:
    """The ``JobRun`` records sacct holds at the end of the window (module docstring)."""
    topo = truth.topology()
    names = [n.name for n in topo.nodes]
    first = {p.job_id: p for _, _, ps in timeline.segments() for p in ps}
    out: list[JobRun] = []
    for job_id, start in sorted(timeline.started.items()):
        if start >= truth.window_s:
            continue
        job = timeline.jobs[job_id]
        end = timeline.ended.get(job_id, math.inf)
        done = end <= truth.window_s
        nodes = tuple(names[n] for n in first[job_id].placement.nodes)
        out.append(
            JobRun(
                cluster=truth.cluster,
                job_id=job_id,
                run_index=0,
                name=job.name,
                user=job.user,
                account="a",
                partition="gpu",
                state="COMPLETED" if done else "RUNNING",
                exit_code=0 if done else None,
                signal=None,
                submit_time=float(math.floor(truth.t0 + job.submit_time)),
                start_time=float(math.floor(truth.t0 + start)),
                end_time=float(math.floor(truth.t0 + end)) if done else None,
                time_limit_s=None,
                nodes=nodes,
                gpus=job.num_gpus,
                gpus_per_node=even_split(job.num_gpus, len(nodes)),
                allocation_nodes=len(nodes),
                settled=True,
            )
        )
    return out


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
    over the window; then the InfiniBand rates derived as the collection flow does."""
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
    runs = accounting(truth, timeline)
    ingest_job_runs(con, runs, source=f"accounting:{truth.cluster}")
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


# ------------------------------------------------------------------------ recovery


@dataclass(frozen=True, slots=True)
class Recovered:
    """One fitted parameter against the truth, the truth in the fit's time unit (telemetry
    holds ratios only: the fit expresses times in its reference job's isolated iteration,
    so the truth's seconds are scaled by fitted over true compute time of that job)."""

    parameter: str
    truth: float
    fitted: float
    status: str
    runs: int

    @property
    def rel_error(self) -> float:
        return self.fitted / self.truth - 1.0 if self.truth else math.inf


def recovery(truth: HiddenTruth, fitted: Calibration, reference: str) -> tuple[Recovered, ...]:
    """Every parameter of ``fitted.fit["parameters"]`` (``fit_cluster_calibration``'s
    report) against the hidden truth: alpha, overhead_s and, per job name, compute_s,
    grad_gb and gb_per_compute_s (a name absent from the truth is skipped)."""
    params: Mapping[str, Mapping[str, Mapping[str, Any]]] = fitted.fit["parameters"]
    true = truth.calibration.profiles
    ref = params[f"{PROFILE_PREFIX}name={reference}"]["compute_s"]["value"]
    unit = float(ref) / true[reference].compute_s
    shared = params["shared"]
    out = [
        Recovered(
            "alpha", truth.calibration.alpha, shared["alpha"]["value"], shared["alpha"]["status"], 0
        ),
        Recovered(
            "overhead_s",
            truth.calibration.overhead_s * unit,
            shared["overhead_s"]["value"],
            shared["overhead_s"]["status"],
            0,
        ),
    ]
    for key, entries in params.items():
        name = key.removeprefix(f"{PROFILE_PREFIX}name=")
        if key == "shared" or name not in true:
            continue
        prof = true[name]
        runs = int(entries["runs"]["value"])
        values = {
            "compute_s": prof.compute_s * unit,
            "grad_gb": prof.grad_gb * unit,
            "gb_per_compute_s": prof.grad_gb / prof.compute_s,
        }
        for what, value in values.items():
            e = entries[what]
            out.append(
                Recovered(f"{name}.{what}", value, float(e["value"]), str(e["status"]), runs)
            )
    return tuple(out)
