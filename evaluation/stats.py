"""Paired comparisons of two policies on the same cases, with bootstrap confidence intervals.

Every policy of a benchmark runs on the same cases (window x seed) and, inside a case, on the
same jobs, so comparisons are paired twice: by case and by job. The ratio of a statistic
(``avg``: the mean JCT, ``p99``: the 99th percentile JCT) of a policy to a baseline's is

    ratio = mean over cases of stat(policy's JCTs) / mean over cases of stat(baseline's JCTs)

(< 1: the policy is better). Its confidence interval is a seeded two-level percentile
bootstrap: each replicate draws the cases with replacement and, inside every case, the jobs
with replacement, the *same* draw for both policies (the pairing is kept, so the common
variation of the workload cancels). With one case, only the jobs are resampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from linkwise.evaluation.benchmark import Benchmark

__all__ = ["STATS", "RatioCI", "bootstrap_ratio", "paired_arrays", "paired_ratio"]

STATS = ("avg", "p99")


@dataclass(frozen=True)
class RatioCI:
    """A paired ratio policy/baseline of a JCT statistic, with its bootstrap interval and the
    share of cases where the policy's statistic is lower (``wins``)."""

    policy: str
    baseline: str
    stat: str
    ratio: float
    low: float
    high: float
    level: float
    cases: int
    wins: float
    n_boot: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _stat(x: np.ndarray, stat: str, axis: int = -1) -> np.ndarray:
    if stat == "avg":
        out: np.ndarray = x.mean(axis=axis)
        return out
    if stat == "p99":
        return np.asarray(np.percentile(x, 99, axis=axis))
    raise ValueError(f"unknown statistic {stat!r} ({', '.join(STATS)})")


def bootstrap_ratio(
    policy: Sequence[np.ndarray],
    baseline: Sequence[np.ndarray],
    stat: str = "avg",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, low, high) for paired per-case arrays (``policy[c][i]`` and ``baseline[c][i]``
    are the same job); see the module docstring. Deterministic for a seed."""
    if len(policy) != len(baseline) or not policy:
        raise ValueError("need the same, non-zero number of cases for both policies")
    for a, b in zip(policy, baseline, strict=True):
        if a.shape != b.shape or a.size == 0:
            raise ValueError("cases must pair the same, non-zero number of jobs")
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    rng = np.random.default_rng(seed)
    n_cases = len(policy)
    point_a = np.array([_stat(a, stat) for a in policy])
    point_b = np.array([_stat(b, stat) for b in baseline])
    ratio = float(point_a.mean() / point_b.mean())
    boot_a = np.empty((n_boot, n_cases))
    boot_b = np.empty((n_boot, n_cases))
    for c, (a, b) in enumerate(zip(policy, baseline, strict=True)):
        idx = rng.integers(0, a.size, size=(n_boot, a.size))
        boot_a[:, c] = _stat(a[idx], stat)
        boot_b[:, c] = _stat(b[idx], stat)
    if n_cases > 1:
        pick = rng.integers(0, n_cases, size=(n_boot, n_cases))
        rows = np.arange(n_boot)[:, None]
        num = boot_a[rows, pick].mean(axis=1)
        den = boot_b[rows, pick].mean(axis=1)
    else:
        num, den = boot_a[:, 0], boot_b[:, 0]
    ratios = num / den
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return ratio, float(low), float(high)


def paired_arrays(
    bench: Benchmark, policy: str, baseline: str
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per case, the JCTs of both policies aligned by job id."""
    a_runs, b_runs = bench.runs(policy), bench.runs(baseline)
    pa: list[np.ndarray] = []
    pb: list[np.ndarray] = []
    for a, b in zip(a_runs, b_runs, strict=True):
        if a.case_id != b.case_id or a.job_ids != b.job_ids:
            raise ValueError(f"{policy} and {baseline} did not run the same jobs in {a.case_id}")
        pa.append(np.asarray(a.jct_s))
        pb.append(np.asarray(b.jct_s))
    return pa, pb


def paired_ratio(
    bench: Benchmark,
    policy: str,
    baseline: str,
    stat: str = "avg",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> RatioCI:
    """The paired ratio of ``stat`` JCT of ``policy`` to ``baseline`` with its interval."""
    pa, pb = paired_arrays(bench, policy, baseline)
    ratio, low, high = bootstrap_ratio(pa, pb, stat, n_boot=n_boot, level=level, seed=seed)
    wins = float(np.mean([_stat(a, stat) < _stat(b, stat) for a, b in zip(pa, pb, strict=True)]))
    return RatioCI(
        policy=policy,
        baseline=baseline,
        stat=stat,
        ratio=ratio,
        low=low,
        high=high,
        level=level,
        cases=len(pa),
        wins=wins,
        n_boot=n_boot,
        seed=seed,
    )
