"""The hidden truth (``HiddenTruth``: a hidden ``Calibration`` on its own topology), its
synthetic workload (``truth_workload``) and what ran when in the real simulator
(``simulate_timeline`` -> ``Timeline``); the package docstring says what it is for."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.synthetic import load_stats
from linkwise.policies.random_policy import RandomPolicy

__all__ = [
    "DEFAULT_T0",
    "TRUTH_PROFILES",
    "TRUTH_WEIGHTS",
    "HiddenTruth",
    "Piece",
    "Timeline",
    "simulate_timeline",
    "truth_workload",
]

DEFAULT_T0 = 1.7e9
"""The epoch second simulated time 0 maps to."""

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
    slurm: str = "24.11"  # the release whose sacct --json schema the accounting is printed in
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
            source="hidden truth (synthetic; datasets/hidden_truth/truth.py)",
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
    """The synthetic jobs (the package docstring): arrivals over the window, each named after the
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
