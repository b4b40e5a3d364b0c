"""A run-time predictor fit on history: what a scheduler may know of a job's run time.

No real Slurm knows a job's true run time when it decides; it knows who submitted it, its
name, its shape, its time limit and the history before now. ``RuntimePredictor.fit`` takes
finished jobs submitted before ``until`` and keeps, for every group of jobs that share
attributes, quantiles of their run times, from the most specific group to the least:
(user, name, GPUs), (user, name), (user, GPUs), (user), (GPUs), everything. A job is
predicted from the most specific group with at least ``min_count`` past jobs. Quantiles
are taken in log space (run times span seconds to weeks); a prediction never exceeds the
job's time limit, which Slurm enforces.

The predictor is plain data (``to_json`` / ``from_json``), with the span it was fit on, so
a dataset, a benchmark and the live loop can all use the same one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from linkwise.cluster.domain import Job

__all__ = ["LEVELS", "RuntimePredictor", "accuracy"]

# group keys, most specific first; () is every job
LEVELS: tuple[tuple[str, ...], ...] = (
    ("user", "name", "num_gpus"),
    ("user", "name"),
    ("user", "num_gpus"),
    ("user",),
    ("num_gpus",),
    (),
)
FORMAT = "linkwise-runtime-predictor/1"


def _key(job: Job, level: tuple[str, ...]) -> str:
    return "\x1f".join(str(getattr(job, f)) for f in level)


@dataclass(frozen=True)
class RuntimePredictor:
    """Run-time quantiles (seconds) per group of past jobs; see the module docstring."""

    quantiles: tuple[float, ...]
    min_count: int
    fit_from: float  # submit-time span of the jobs it was fit on
    fit_until: float
    n_jobs: int
    tables: tuple[Mapping[str, tuple[float, ...]], ...]  # one per level in ``LEVELS``

    @classmethod
    def fit(
        cls,
        jobs: Iterable[Job],
        *,
        until: float | None = None,
        quantiles: Sequence[float] = (0.5, 0.9),
        min_count: int = 5,
    ) -> RuntimePredictor:
        """Fit on the jobs submitted before ``until`` (all of them when None)."""
        qs = tuple(float(q) for q in quantiles)
        if not qs or not all(0 < q < 1 for q in qs) or list(qs) != sorted(qs):
            raise ValueError("quantiles must be ascending and inside (0, 1)")
        if min_count < 1:
            raise ValueError("min_count must be at least 1")
        past = [j for j in jobs if until is None or j.submit_time < until]
        if not past:
            raise ValueError("no history to fit a run-time predictor on")
        tables: list[dict[str, tuple[float, ...]]] = []
        for level in LEVELS:
            groups: dict[str, list[float]] = {}
            for j in past:
                groups.setdefault(_key(j, level), []).append(math.log(j.duration))
            need = 1 if not level else min_count
            tables.append(
                {
                    k: tuple(float(np.exp(np.quantile(v, q))) for q in qs)
                    for k, v in groups.items()
                    if len(v) >= need
                }
            )
        return cls(
            quantiles=qs,
            min_count=min_count,
            fit_from=min(j.submit_time for j in past),
            fit_until=max(j.submit_time for j in past) if until is None else float(until),
            n_jobs=len(past),
            tables=tuple(tables),
        )

    def predict(self, job: Job) -> tuple[float, ...]:
        """The job's run-time quantiles (seconds), capped at its time limit if it has one."""
        for level, table in zip(LEVELS, self.tables, strict=True):
            found = table.get(_key(job, level))
            if found is not None:
                break
        else:  # pragma: no cover - the last level always holds the global quantiles
            raise RuntimeError("the predictor has no global quantiles")
        if job.time_limit > 0:
            return tuple(min(v, job.time_limit) for v in found)
        return found

    def annotate(self, jobs: Iterable[Job]) -> tuple[Job, ...]:
        """The jobs with ``pred_s`` (first quantile) and ``pred_hi_s`` (last) from ``predict``."""
        out = []
        for job in jobs:
            qs = self.predict(job)
            out.append(replace(job, pred_s=qs[0], pred_hi_s=qs[-1]))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (what a package or a benchmark stores)."""
        return {
            "format": FORMAT,
            "quantiles": list(self.quantiles),
            "min_count": self.min_count,
            "fit_from": self.fit_from,
            "fit_until": self.fit_until,
            "n_jobs": self.n_jobs,
            "levels": [list(level) for level in LEVELS],
            "tables": [{k: list(v) for k, v in t.items()} for t in self.tables],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuntimePredictor:
        """The predictor ``to_json`` wrote; ValueError for another format or levels."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a run-time predictor of format {FORMAT}")
        if [tuple(level) for level in data.get("levels", [])] != list(LEVELS):
            raise ValueError("the predictor was fit with other group levels than this code's")
        return cls(
            quantiles=tuple(float(q) for q in data["quantiles"]),
            min_count=int(data["min_count"]),
            fit_from=float(data["fit_from"]),
            fit_until=float(data["fit_until"]),
            n_jobs=int(data["n_jobs"]),
            tables=tuple(
                {str(k): tuple(float(x) for x in v) for k, v in t.items()} for t in data["tables"]
            ),
        )


def accuracy(predictor: RuntimePredictor, jobs: Sequence[Job]) -> dict[str, float]:
    """How well the predictor does on ``jobs`` (their true run times): mean absolute error
    and Spearman correlation of the first quantile (the median by default), and the share
    of jobs at or below each quantile (coverage: ideally the quantile itself)."""
    from scipy.stats import spearmanr  # scipy takes about a second to import

    if not jobs:
        raise ValueError("no jobs to measure the predictor on")
    pred = np.array([predictor.predict(j) for j in jobs])
    true = np.array([j.duration for j in jobs])
    out: dict[str, float] = {
        "jobs": float(len(jobs)),
        "mae_h": float(np.mean(np.abs(pred[:, 0] - true)) / 3600.0),
        "median_abs_log_error": float(np.median(np.abs(np.log(pred[:, 0] / true)))),
        "spearman": float(spearmanr(pred[:, 0], true).statistic),
    }
    for i, q in enumerate(predictor.quantiles):
        out[f"coverage_q{round(q * 100)}"] = float(np.mean(true <= pred[:, i]))
    return out
