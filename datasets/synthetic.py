"""The embedded default workload: jobs drawn from statistics of the real Philly trace.

``data/philly_stats.json`` holds figures derived (by :func:`derive_stats`, run by
``scripts/derive_philly_stats.py``) from the Microsoft Philly trace slice in
``../shared/data/traces``; it holds no rows. :func:`generate` draws a seeded workload from
it: non-homogeneous Poisson arrivals following the hour-of-week arrival profile, GPU counts
from the empirical distribution, run times by inverse-CDF sampling of the per-GPU-class
quantiles of log run time.

The Philly slice (jobs submitted 2017-09-04 .. 2017-10-15) is sparse in its first weeks:
about 70 long jobs before 2017-09-24, then some 1,400 a day. The arrival statistics are
taken over the dense window (from the first day with at least a tenth of the median daily
count) so the rate is the cluster's real one; the GPU and run-time distributions use all jobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.domain import Job
from linkwise.datasets.traces import Trace

__all__ = [
    "CLASS_BOUNDS",
    "PHILLY_PROVENANCE",
    "QUANTILE_LEVELS",
    "derive_stats",
    "generate",
    "load_stats",
]

STATS_VERSION = 1
PHILLY_PROVENANCE = (
    "Microsoft Philly trace (github.com/msr-fiddle/philly-traces) as shipped in "
    "github.com/petuum/adaptdl, branch osdi21-artifact, simulator/traces/philly.csv; "
    "slice of jobs submitted 2017-09-04..2017-10-15"
)
CLASS_BOUNDS: tuple[int, ...] = (1, 2, 4, 8, 16)  # GPU-count classes: [1], [2,3], [4,7], ...
# Quantile levels of log run time: every 5% up to 0.95, then finer in the heavy tail (with only
# 5% steps the top interval, log-uniform from the 95th percentile to the longest job, would
# triple the mean run time of 1-GPU jobs; with these levels means match within a few %).
QUANTILE_LEVELS: tuple[float, ...] = (
    *(round(0.05 * i, 2) for i in range(20)),  # 0.0 .. 0.95
    0.96,
    0.97,
    0.98,
    0.99,
    0.995,
    0.999,
    1.0,
)
HOURS_PER_WEEK = 168
_EPOCH_HOUR_OF_WEEK = 72  # 1970-01-01 00:00 UTC was a Thursday: 72 h after Monday 00:00
_DENSE_FRACTION = 0.1  # a day is "dense" with at least this fraction of the median daily count

FloatArray = npt.NDArray[np.float64]


# --------------------------------------------------------------------------- deriving


def derive_stats(
    trace: Trace,
    *,
    provenance: str = PHILLY_PROVENANCE,
    class_bounds: Sequence[int] = CLASS_BOUNDS,
    levels: Sequence[float] = QUANTILE_LEVELS,
) -> dict[str, Any]:
    """Workload statistics of a trace: GPU counts, run-time quantiles per class, arrival rates.

    Pure function of the trace's jobs and origin; floats are rounded so the result is stable
    and small. Traces without an absolute origin are taken to start on a Monday at 00:00.
    """
    if not trace.jobs:
        raise ValueError("derive_stats needs a trace with jobs")
    gpus = np.array([j.num_gpus for j in trace.jobs], dtype=np.int64)
    durations = np.array([j.duration for j in trace.jobs], dtype=np.float64)
    origin = trace.origin_epoch if trace.origin_epoch is not None else _monday_origin()
    absolute = origin + np.array([j.submit_time for j in trace.jobs], dtype=np.float64)
    return {
        "version": STATS_VERSION,
        "source": {
            "file": Path(trace.source).name,
            "format": trace.format,
            "provenance": provenance,
            "jobs": len(trace.jobs),
            "rejected_rows": len(trace.rejected),
            "first_submit_utc": _utc(float(absolute.min())),
            "last_submit_utc": _utc(float(absolute.max())),
        },
        "gpu_counts": _gpu_counts(gpus),
        "durations": _durations(gpus, durations, class_bounds, levels),
        "arrivals": _arrivals(absolute),
    }


def _monday_origin() -> float:
    return float(datetime(2024, 1, 1, tzinfo=UTC).timestamp())  # a Monday


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _gpu_counts(gpus: npt.NDArray[np.int64]) -> dict[str, Any]:
    values, counts = np.unique(gpus, return_counts=True)
    return {
        "values": [int(v) for v in values],
        "counts": [int(c) for c in counts],
        "probs": [round(float(c) / len(gpus), 8) for c in counts],
    }


def _durations(
    gpus: npt.NDArray[np.int64],
    durations: FloatArray,
    class_bounds: Sequence[int],
    quantile_levels: Sequence[float],
) -> dict[str, Any]:
    bounds = np.asarray(sorted(class_bounds), dtype=np.int64)
    if bounds[0] > gpus.min():
        raise ValueError(f"class bounds {list(bounds)} do not cover {int(gpus.min())} GPUs")
    levels = np.asarray(quantile_levels, dtype=np.float64)
    if levels[0] != 0.0 or levels[-1] != 1.0 or np.any(np.diff(levels) <= 0):
        raise ValueError("quantile levels must increase from 0 to 1")
    which = np.searchsorted(bounds, gpus, side="right") - 1
    classes = []
    for k, low in enumerate(bounds):
        logs = np.log(durations[which == k])
        if logs.size == 0:
            continue
        high = int(bounds[k + 1]) - 1 if k + 1 < len(bounds) else None
        classes.append(
            {
                "min_gpus": int(low),
                "max_gpus": high,
                "jobs": int(logs.size),
                "log_quantiles": [round(float(q), 6) for q in np.quantile(logs, levels)],
            }
        )
    return {
        "unit": "s",
        "levels": [round(float(x), 6) for x in levels],
        "classes": classes,
        "overall_median_s": round(float(np.median(durations)), 3),
    }


def _hour_of_week(t: FloatArray) -> npt.NDArray[np.int64]:
    return ((np.floor(t / 3600.0).astype(np.int64) + _EPOCH_HOUR_OF_WEEK) % HOURS_PER_WEEK).astype(
        np.int64
    )


def _dense_start(absolute: FloatArray) -> float:
    """Midnight (UTC) of the first day holding at least a tenth of the median daily count."""
    days = np.floor(absolute / 86400.0).astype(np.int64)
    first, last = int(days.min()), int(days.max())
    daily = np.bincount(days - first, minlength=last - first + 1)
    threshold = _DENSE_FRACTION * float(np.median(daily[daily > 0]))
    dense_day = first + int(np.argmax(daily >= threshold))
    return float(max(dense_day * 86400.0, absolute.min()))


def _arrivals(absolute: FloatArray) -> dict[str, Any]:
    start, end = _dense_start(absolute), float(absolute.max())
    inside = absolute[absolute >= start]
    if end <= start:
        raise ValueError("the trace spans no time: cannot derive an arrival rate")
    # Hours of each hour-of-week (and hour-of-day) the window covers, fractional at its ends.
    hours = np.arange(np.floor(start / 3600.0), np.floor(end / 3600.0) + 1.0)
    overlap = np.minimum(end, (hours + 1.0) * 3600.0) - np.maximum(start, hours * 3600.0)
    overlap = np.clip(overlap, 0.0, None) / 3600.0
    slot = _hour_of_week(hours * 3600.0)
    exposure_w = np.bincount(slot, weights=overlap, minlength=HOURS_PER_WEEK)
    exposure_d = np.bincount(slot % 24, weights=overlap, minlength=24)
    slot_jobs = _hour_of_week(inside)
    counts_w = np.bincount(slot_jobs, minlength=HOURS_PER_WEEK).astype(np.float64)
    counts_d = np.bincount(slot_jobs % 24, minlength=24).astype(np.float64)
    span_h = (end - start) / 3600.0
    mean_rate = inside.size / span_h
    rate_w = np.where(exposure_w > 0, counts_w / np.maximum(exposure_w, 1e-12), mean_rate)
    rate_d = np.where(exposure_d > 0, counts_d / np.maximum(exposure_d, 1e-12), mean_rate)
    return {
        "unit": "jobs per hour",
        "window_start_utc": _utc(start),
        "window_end_utc": _utc(end),
        "window_days": round(span_h / 24.0, 6),
        "jobs_in_window": int(inside.size),
        "jobs_per_day": round(mean_rate * 24.0, 4),
        "mean_rate_per_hour": round(mean_rate, 6),
        "start_hour_of_week": int(_hour_of_week(np.array([start]))[0]),
        "hour_of_week_rate": [round(float(r), 4) for r in rate_w],
        "hour_of_day_rate": [round(float(r), 4) for r in rate_d],
    }


# --------------------------------------------------------------------------- loading


def load_stats(path: str | Path | None = None) -> dict[str, Any]:
    """Workload statistics from a JSON file; by default the shipped Philly statistics."""
    if path is None:
        ref = resources.files("linkwise.datasets").joinpath("data/philly_stats.json")
        text = ref.read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    stats: dict[str, Any] = json.loads(text)
    _validate(stats)
    return stats


def _validate(stats: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``stats`` has the shape :func:`generate` needs."""
    try:
        values, probs = stats["gpu_counts"]["values"], stats["gpu_counts"]["probs"]
        levels, classes = stats["durations"]["levels"], stats["durations"]["classes"]
        arrivals = stats["arrivals"]
        rates, start = arrivals["hour_of_week_rate"], arrivals["start_hour_of_week"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"workload statistics lack a field: {exc}") from exc
    if not values or len(values) != len(probs) or min(values) <= 0 or min(probs) < 0:
        raise ValueError("gpu_counts needs matching positive values and probabilities")
    if not classes or any(len(c["log_quantiles"]) != len(levels) for c in classes):
        raise ValueError("every duration class needs one log quantile per level")
    if any(np.diff(c["log_quantiles"]).min() < 0 for c in classes if len(levels) > 1):
        raise ValueError("duration quantiles must be non-decreasing")
    if min(values) < min(c["min_gpus"] for c in classes):
        raise ValueError("duration classes do not cover the smallest GPU count")
    if len(rates) != HOURS_PER_WEEK or min(rates) < 0 or sum(rates) <= 0:
        raise ValueError(f"hour_of_week_rate needs {HOURS_PER_WEEK} non-negative rates")
    if not 0 <= int(start) < HOURS_PER_WEEK:
        raise ValueError("start_hour_of_week must be in 0..167")


# --------------------------------------------------------------------------- generating


def generate(
    n_jobs: int,
    *,
    seed: int = 0,
    stats: Mapping[str, Any] | None = None,
    load_scale: float = 1.0,
    max_gpus: int | None = None,
) -> tuple[Job, ...]:
    """Draw ``n_jobs`` jobs from workload statistics (default: the shipped Philly ones).

    Arrivals are a non-homogeneous Poisson process following the hour-of-week profile times
    ``load_scale``, starting at the profile's ``start_hour_of_week``; times are shifted so the
    first job submits at 0. GPU counts above ``max_gpus`` are never drawn (the distribution is
    renormalised over the sizes that fit: the same law as resampling). Deterministic in ``seed``.
    """
    if n_jobs < 0:
        raise ValueError(f"n_jobs must be non-negative, got {n_jobs}")
    if not load_scale > 0:
        raise ValueError(f"load_scale must be positive, got {load_scale}")
    stats = load_stats() if stats is None else stats
    _validate(stats)
    if n_jobs == 0:
        return ()
    rng = np.random.default_rng(seed)
    submit = _arrival_times(rng, n_jobs, stats["arrivals"], load_scale)
    gpus = _gpu_counts_draw(rng, n_jobs, stats["gpu_counts"], max_gpus)
    durations = _durations_draw(rng, gpus, stats["durations"])
    return tuple(
        Job(job_id=i, submit_time=float(t), num_gpus=int(g), duration=float(d))
        for i, (t, g, d) in enumerate(zip(submit, gpus, durations, strict=True))
    )


def _arrival_times(
    rng: np.random.Generator, n: int, arrivals: Mapping[str, Any], load_scale: float
) -> FloatArray:
    """Poisson arrivals by time change: unit-rate arrivals mapped through the inverse of the
    cumulative (piecewise-linear) intensity."""
    rates = np.roll(
        np.asarray(arrivals["hour_of_week_rate"], dtype=np.float64),
        -int(arrivals["start_hour_of_week"]),
    )
    rates = rates * load_scale
    unit = np.cumsum(rng.exponential(1.0, size=n))
    weeks = int(unit[-1] // rates.sum()) + 1
    cumulative = np.concatenate(([0.0], np.cumsum(np.tile(rates, weeks))))
    hours = np.interp(unit, cumulative, np.arange(cumulative.size, dtype=np.float64))
    times: FloatArray = (hours - hours[0]) * 3600.0
    return times


def _gpu_counts_draw(
    rng: np.random.Generator, n: int, counts: Mapping[str, Any], max_gpus: int | None
) -> npt.NDArray[np.int64]:
    values = np.asarray(counts["values"], dtype=np.int64)
    probs = np.asarray(counts["probs"], dtype=np.float64)
    if max_gpus is not None:
        fits = values <= max_gpus
        if not fits.any() or probs[fits].sum() <= 0:
            raise ValueError(f"no GPU count in the statistics fits max_gpus={max_gpus}")
        values, probs = values[fits], probs[fits]
    drawn: npt.NDArray[np.int64] = rng.choice(values, size=n, p=probs / probs.sum())
    return drawn


def _durations_draw(
    rng: np.random.Generator, gpus: npt.NDArray[np.int64], durations: Mapping[str, Any]
) -> FloatArray:
    levels = np.asarray(durations["levels"], dtype=np.float64)
    classes = sorted(durations["classes"], key=lambda c: int(c["min_gpus"]))
    bounds = np.array([int(c["min_gpus"]) for c in classes], dtype=np.int64)
    which = np.searchsorted(bounds, gpus, side="right") - 1
    u = rng.random(gpus.size)
    logs = np.empty(gpus.size, dtype=np.float64)
    for k, cls in enumerate(classes):
        mask = which == k
        logs[mask] = np.interp(u[mask], levels, np.asarray(cls["log_quantiles"], dtype=float))
    result: FloatArray = np.exp(logs)
    return result
