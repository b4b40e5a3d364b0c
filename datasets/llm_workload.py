"""An LLM-era synthetic workload drawn from published figures (issue 33 item 3b).

SYNTHETIC: no job here ran anywhere. Every job is named ``synthetic-llm-<i>`` with user
``synthetic``, and the trace's source and format say ``synthetic:llm``. Each figure drawn from
is named with its source (``FIGURES``):

- **Job sizes** (GPUs): a distribution over powers of two whose mean is Kalos's 26.77 GPUs per
  GPU job and median 1 (Acme, NSDI'24: ``data/cluster_summary.csv`` of github.com/InternLM/
  AcmeTrace, commit 6d6ac9cd; max 1,024), with 10.3% of jobs at 128 GPUs or more (Crux,
  SIGCOMM'24: "over 10%" of Lingjun's jobs, 512 GPUs at most; 1,024, Kalos's largest, takes
  0.1%). The weights of 2, 4, 16, 32, 64 and 128-1,024 GPUs are stated choices (``SIZE_WEIGHTS``);
  those of 1 and 8 GPUs follow from the total and Kalos's mean (``size_pmf``).
- **Run times** (s): log-normal with median ``exp(LOG_MEDIAN_S) * gpus ** SIZE_EXPONENT`` and
  log-sd ``SIGMA``, cut at Kalos's longest GPU job (625,740 s). The three parameters were fitted
  (least squares on 400,000 seeded draws) to Kalos's median run time of GPU jobs (124 s), its
  mean (1,259.7 s) and its GPU time per GPU job (5,333,180,061 GPU-s over 19,907 jobs =
  267,905 GPU-s; completed, cancelled and failed jobs alike, as Acme counts them): a mean
  GPU time ten times the product of the mean size and mean run time says large jobs run long.
- **Arrivals**: a Poisson process whose rate offers ``load`` times the cluster's GPUs
  (``gpus``; default the Lingjun topology's 6,776, ``../shared/data/topology``) in expected
  GPU time. Acme publishes no arrival rate this project could check, so the load is a knob.
- **Request forms**: ``flexible`` (a share) as ``cluster/flexible.py``'s seeded rule; none by
  default (backfill then keeps the derived shape).
- **Parallel layouts** (``pp=P``, none by default): every job of at least ``pp_gpus`` GPUs
  (default 128, Crux's large jobs above) gets ``P`` pipeline stages (``Job.pp``,
  ``cluster.layout``: TP inside a node, DP over each stage's nodes), a stated rule, not a
  drawn figure; P = 8 is Megatron-LM's pipeline depth for its 145B GPT on 1,536 GPUs
  (Narayanan et al., SC'21, Table 1: TP 8, PP 8). A job whose GPUs do not split in P keeps none.

Not drawn but the yardstick for what a simulation shows: Crux's 36.3% of jobs (51% of GPUs)
exposed to contention (``FIGURES``). Sizes and run times are drawn independently of arrivals;
no model names (the caller assigns communication profiles). ``--trace synthetic:llm,jobs=N,
seed=S[,gpus=G][,load=L][,flexible=F][,pp=P][,pp_gpus=G]`` reaches it from simulate, compare and
evaluate.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from linkwise.cluster.domain import Job
from linkwise.cluster.flexible import with_flexible

__all__ = [
    "FIGURES",
    "PREFIX",
    "LlmSpec",
    "generate",
    "is_generated",
    "parse_spec",
    "size_pmf",
    "spec_sha256",
]

PREFIX = "synthetic:llm"
ACME = "Acme (NSDI'24), github.com/InternLM/AcmeTrace data/cluster_summary.csv, Kalos"
CRUX = "Crux (SIGCOMM'24), Alibaba Lingjun"


@dataclass(frozen=True, slots=True)
class Figure:
    """A published figure the generator draws from (or is checked against) and its source."""

    name: str
    value: float
    source: str


FIGURES: tuple[Figure, ...] = (
    Figure("mean GPUs per GPU job", 26.77, ACME),
    Figure("median GPUs per GPU job", 1.0, ACME),
    Figure("largest GPU job (GPUs)", 1024.0, ACME),
    Figure("share of jobs with 128 GPUs or more (over 10%)", 0.10, CRUX),
    Figure("largest job (GPUs)", 512.0, CRUX),
    Figure("median run time of GPU jobs (s)", 124.0, ACME),
    Figure("mean run time of GPU jobs (s)", 1259.689, ACME),
    Figure("longest GPU job (s)", 625740.0, ACME),
    Figure("GPU time per GPU job (GPU-s)", 5333180061.0 / 19907.0, ACME),
    Figure("share of jobs exposed to contention (not drawn; a yardstick)", 0.363, CRUX),
)
KALOS_MEAN_GPUS = 26.77
LONGEST_S = 625740.0
# stated choices; 1 and 8 GPUs take the rest (size_pmf)
SIZE_WEIGHTS: dict[int, float] = {
    2: 0.05,
    4: 0.05,
    16: 0.03,
    32: 0.02,
    64: 0.01,
    128: 0.06,
    256: 0.03,
    512: 0.012,
    1024: 0.001,
}
LOG_MEDIAN_S = 4.0133  # median run time of a 1-GPU job: 55.3 s
SIZE_EXPONENT = 0.7671
SIGMA = 1.3711
LINGJUN_GPUS = 6776  # 847 hosts x 8 GPUs (../shared/data/topology)
PP_GPUS = 128  # the fewest GPUs of a job given pipeline stages (``pp=``)
_FIELDS = ("jobs", "seed", "gpus", "load", "flexible", "pp", "pp_gpus")


@dataclass(frozen=True, slots=True)
class LlmSpec:
    """What ``--trace synthetic:llm,...`` asks: jobs, seed, cluster GPUs, load, flexible."""

    jobs: int = 2000
    seed: int = 0
    gpus: int = LINGJUN_GPUS
    load: float = 0.8
    flexible: float | None = None
    pp: int = 0  # pipeline stages of the large jobs (0: no layouts)
    pp_gpus: int = PP_GPUS  # the fewest GPUs a job with stages has

    def text(self) -> str:
        flex = "" if self.flexible is None else f",flexible={self.flexible:g}"
        if self.pp > 1:
            flex += f",pp={self.pp}" + (
                f",pp_gpus={self.pp_gpus}" if self.pp_gpus != PP_GPUS else ""
            )
        return (
            f"{PREFIX},jobs={self.jobs},seed={self.seed},gpus={self.gpus},load={self.load:g}{flex}"
        )


def is_generated(source: object) -> bool:
    """Whether a ``--trace`` value names this generator rather than a file."""
    return str(source).startswith(PREFIX)


def parse_spec(source: object) -> LlmSpec:
    """``synthetic:llm[,jobs=N][,seed=S][,gpus=G][,load=L][,flexible=F][,pp=P][,pp_gpus=G]``
    as an ``LlmSpec``."""
    text = str(source)
    if not is_generated(text):
        raise ValueError(f"not a synthetic LLM workload: {text!r} (expected {PREFIX},...)")
    fields: dict[str, str] = {}
    for part in text[len(PREFIX) :].split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in _FIELDS:
            raise ValueError(f"{text!r}: unknown field {part!r} ({', '.join(_FIELDS)})")
        fields[key.strip()] = value.strip()
    spec = LlmSpec(
        jobs=int(fields.get("jobs", 2000)),
        seed=int(fields.get("seed", 0)),
        gpus=int(fields.get("gpus", LINGJUN_GPUS)),
        load=float(fields.get("load", 0.8)),
        flexible=float(fields["flexible"]) if "flexible" in fields else None,
        pp=int(fields.get("pp", 0)),
        pp_gpus=int(fields.get("pp_gpus", PP_GPUS)),
    )
    if spec.jobs <= 0 or spec.gpus <= 0 or not spec.load > 0:
        raise ValueError(f"{text!r}: jobs, gpus and load must be positive")
    if spec.pp < 0 or spec.pp_gpus <= 0:
        raise ValueError(f"{text!r}: pp must be non-negative and pp_gpus positive")
    return spec


def spec_sha256(spec: LlmSpec) -> str:
    """A digest naming the workload (what a file's SHA-256 is to a trace file)."""
    return hashlib.sha256(spec.text().encode()).hexdigest()


def size_pmf(max_gpus: int | None = None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """GPU counts and their probabilities (module docstring): 1 and 8 GPUs share what
    ``SIZE_WEIGHTS`` leave so that the mean is Kalos's; renormalised over counts up to
    ``max_gpus`` when given."""
    rest = 1.0 - sum(SIZE_WEIGHTS.values())
    known = sum(g * w for g, w in SIZE_WEIGHTS.items())
    p8 = (KALOS_MEAN_GPUS - known - rest) / 7.0  # p1 + p8 = rest, p1 + 8 p8 = mean - known
    weights = {1: rest - p8, 8: p8, **SIZE_WEIGHTS}
    kept = sorted(g for g in weights if max_gpus is None or g <= max_gpus)
    if not kept:
        raise ValueError(f"no job size fits {max_gpus} GPUs")
    total = sum(weights[g] for g in kept)
    return tuple(kept), tuple(weights[g] / total for g in kept)


def expected_gpu_seconds(sizes: tuple[int, ...], probs: tuple[float, ...]) -> float:
    """Expected GPU time of a job (uncut log-normal run times), for the arrival rate."""
    return sum(
        p * g * math.exp(LOG_MEDIAN_S + SIZE_EXPONENT * math.log(g) + SIGMA**2 / 2)
        for g, p in zip(sizes, probs, strict=True)
    )


def generate(spec: LlmSpec) -> tuple[Job, ...]:
    """The seeded jobs (module docstring), submit times from 0, ids 0.. in submit order."""
    rng = np.random.default_rng([spec.seed, 33])
    sizes, probs = size_pmf(spec.gpus)
    rate = spec.load * spec.gpus / expected_gpu_seconds(sizes, probs)  # jobs per second
    gaps = rng.exponential(1.0 / rate, size=spec.jobs)
    submits = np.cumsum(gaps) - gaps[0]
    gpus = rng.choice(np.array(sizes), size=spec.jobs, p=np.array(probs))
    log_median = LOG_MEDIAN_S + SIZE_EXPONENT * np.log(gpus)
    runs = np.minimum(np.exp(log_median + SIGMA * rng.standard_normal(spec.jobs)), LONGEST_S)
    jobs = tuple(
        Job(
            job_id=i,
            submit_time=float(submits[i]),
            num_gpus=int(gpus[i]),
            duration=max(1.0, float(runs[i])),
            user="synthetic",
            name=f"synthetic-llm-{i}",
        )
        for i in range(spec.jobs)
    )
    if spec.pp > 1:
        jobs = tuple(with_layout(j, spec.pp) if j.num_gpus >= spec.pp_gpus else j for j in jobs)
    return jobs if spec.flexible is None else with_flexible(jobs, spec.flexible, seed=spec.seed)


def with_layout(job: Job, pp: int) -> Job:
    """The job with ``pp`` pipeline stages where its GPUs split in them (else as it is)."""
    return replace(job, pp=pp) if job.num_gpus % pp == 0 else job
