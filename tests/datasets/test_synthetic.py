"""The embedded Philly-derived workload: shipped statistics, and jobs drawn from them."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linkwise.datasets.synthetic import derive_stats, generate, load_stats
from linkwise.datasets.traces import load_trace, write_native

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
SHIPPED = ROOT / "datasets" / "data" / "philly_stats.json"
N = 20_000


@pytest.fixture(scope="module")
def stats() -> dict[str, Any]:
    return load_stats()


@pytest.fixture(scope="module")
def workload() -> tuple[Any, ...]:
    return generate(N, seed=11)


def _profile(stats: Mapping[str, Any], scale: float = 1.0) -> np.ndarray:
    """Hourly rates starting at the generator's first hour."""
    arrivals = stats["arrivals"]
    rates = np.asarray(arrivals["hour_of_week_rate"], dtype=float) * scale
    return np.roll(rates, -int(arrivals["start_hour_of_week"]))


def _expected_count(stats: Mapping[str, Any], horizon_s: float, scale: float = 1.0) -> float:
    """Integrated arrival intensity over [0, horizon]."""
    rates = _profile(stats, scale)
    hours = horizon_s / 3600.0
    whole = int(hours)
    full = rates.sum() * (whole // 168) + rates[: whole % 168].sum()
    return float(full + rates[whole % 168] * (hours - whole))


def _mean_of_quantile_law(levels: list[float], logq: list[float]) -> float:
    """E[exp(L)] when L is linear in u between the quantile levels (what the generator draws)."""
    total = 0.0
    for l0, l1, a, b in zip(levels, levels[1:], logq, logq[1:], strict=False):
        width = l1 - l0
        total += width * (np.exp(a) if b == a else (np.exp(b) - np.exp(a)) / (b - a))
    return total


# --------------------------------------------------------------------------- the shipped stats


def test_shipped_stats_are_what_the_real_trace_gives(stats: dict[str, Any]) -> None:
    derived = json.loads(json.dumps(derive_stats(load_trace(PHILLY))))
    assert derived == stats
    assert json.loads(SHIPPED.read_text()) == stats
    assert SHIPPED.stat().st_size < 10_000
    source = stats["source"]
    assert source["file"] == PHILLY.name
    assert "philly-traces" in source["provenance"] and "osdi21-artifact" in source["provenance"]
    assert source["jobs"] == 30_065


def test_shipped_stats_figures(stats: dict[str, Any]) -> None:
    counts = dict(zip(stats["gpu_counts"]["values"], stats["gpu_counts"]["counts"], strict=True))
    assert counts == {1: 28_673, 2: 521, 4: 360, 8: 450, 16: 43, 32: 18}
    assert sum(stats["gpu_counts"]["probs"]) == pytest.approx(1.0, abs=1e-6)
    assert stats["durations"]["overall_median_s"] == 2029.0
    # The slice is dense from 2017-09-24: ~29,996 jobs in ~22 days.
    arrivals = stats["arrivals"]
    assert arrivals["window_start_utc"] == "2017-09-24 00:00:00"
    assert arrivals["jobs_in_window"] == 29_996
    assert arrivals["jobs_per_day"] == pytest.approx(29_996 / arrivals["window_days"], rel=1e-4)
    assert len(arrivals["hour_of_week_rate"]) == 168 and len(arrivals["hour_of_day_rate"]) == 24


def test_quantile_law_keeps_the_mean_run_time() -> None:
    """The tail levels keep the mean run time of each large class close to the trace's."""
    trace = load_trace(PHILLY)
    stats = derive_stats(trace)
    levels = stats["durations"]["levels"]
    gpus = np.array([j.num_gpus for j in trace.jobs])
    durations = np.array([j.duration for j in trace.jobs])
    for cls in stats["durations"]["classes"]:
        high = cls["max_gpus"] if cls["max_gpus"] is not None else 10**9
        real = durations[(gpus >= cls["min_gpus"]) & (gpus <= high)]
        if real.size < 300:
            continue
        model = _mean_of_quantile_law(levels, cls["log_quantiles"])
        assert model == pytest.approx(real.mean(), rel=0.1)


def test_load_stats_from_a_file_and_validation(tmp_path: Path, stats: dict[str, Any]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stats))
    assert load_stats(path) == stats
    broken = copy.deepcopy(stats)
    del broken["arrivals"]["hour_of_week_rate"]
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="lack a field"):
        load_stats(path)
    short = copy.deepcopy(stats)
    short["arrivals"]["hour_of_week_rate"] = [1.0] * 24
    with pytest.raises(ValueError, match="168"):
        generate(10, stats=short)


# --------------------------------------------------------------------------- generation


def test_same_seed_same_jobs_different_seed_different() -> None:
    a, b, c = generate(500, seed=4), generate(500, seed=4), generate(500, seed=5)
    assert a == b
    assert a != c
    assert [j.duration for j in a] != [j.duration for j in c]


def test_jobs_are_well_formed(workload: tuple[Any, ...]) -> None:
    assert len(workload) == N
    assert [j.job_id for j in workload] == list(range(N))
    times = [j.submit_time for j in workload]
    assert times[0] == 0.0 and times == sorted(times)
    assert all(j.profile == "" and j.num_gpus >= 1 and j.duration >= 1.0 for j in workload)
    assert generate(0) == ()


def test_gpu_distribution_matches(workload: tuple[Any, ...], stats: dict[str, Any]) -> None:
    gpus = np.array([j.num_gpus for j in workload])
    for value, p in zip(stats["gpu_counts"]["values"], stats["gpu_counts"]["probs"], strict=True):
        observed = float(np.mean(gpus == value))
        assert abs(observed - p) <= 4 * np.sqrt(p * (1 - p) / N) + 1e-4, value
    assert set(gpus.tolist()) <= set(stats["gpu_counts"]["values"])


def test_durations_match_per_class(workload: tuple[Any, ...], stats: dict[str, Any]) -> None:
    gpus = np.array([j.num_gpus for j in workload])
    durations = np.array([j.duration for j in workload])
    levels = stats["durations"]["levels"]
    for cls in stats["durations"]["classes"]:
        high = cls["max_gpus"] if cls["max_gpus"] is not None else 10**9
        mine = durations[(gpus >= cls["min_gpus"]) & (gpus <= high)]
        if mine.size < 100:
            continue
        for level in (0.25, 0.5, 0.75):
            q = np.exp(cls["log_quantiles"][levels.index(level)])
            below = float(np.mean(mine <= q))
            assert abs(below - level) <= 4 * np.sqrt(level * (1 - level) / mine.size), (cls, level)
    median = stats["durations"]["overall_median_s"]
    assert np.median(durations) == pytest.approx(median, rel=0.05)


def test_arrival_rate_follows_the_profile(workload: tuple[Any, ...], stats: dict[str, Any]) -> None:
    times = np.array([j.submit_time for j in workload])
    expected = _expected_count(stats, float(times[-1]))
    assert abs(N - expected) <= 4 * np.sqrt(N) + 2
    per_day = N / (times[-1] / 86_400)
    assert per_day == pytest.approx(stats["arrivals"]["jobs_per_day"], rel=0.1)
    # Hour-by-hour: arrivals per hour follow the hour-of-week profile.
    hours = np.floor(times / 3600).astype(int)
    last = hours[-1]
    exposure = np.bincount(np.arange(last) % 168, minlength=168)
    counts = np.bincount(hours[hours < last] % 168, minlength=168)
    assert np.corrcoef(counts / exposure, _profile(stats))[0, 1] > 0.95


def test_load_scale_scales_the_arrival_rate(stats: dict[str, Any]) -> None:
    base = generate(5_000, seed=2)
    double = generate(5_000, seed=2, load_scale=2.0)
    t_double = double[-1].submit_time
    assert abs(5_000 - _expected_count(stats, t_double, 2.0)) <= 4 * np.sqrt(5_000) + 2
    assert t_double < 0.7 * base[-1].submit_time
    assert [j.num_gpus for j in base] == [j.num_gpus for j in double]
    with pytest.raises(ValueError, match="load_scale"):
        generate(10, load_scale=0.0)


def test_max_gpus_renormalises(stats: dict[str, Any]) -> None:
    jobs = generate(N, seed=7, max_gpus=8)
    gpus = np.array([j.num_gpus for j in jobs])
    assert gpus.max() == 8
    values = np.array(stats["gpu_counts"]["values"])
    probs = np.array(stats["gpu_counts"]["probs"])
    fit = probs[values <= 8] / probs[values <= 8].sum()
    for value, p in zip(values[values <= 8], fit, strict=True):
        assert abs(float(np.mean(gpus == value)) - p) <= 4 * np.sqrt(p * (1 - p) / N) + 1e-4
    with pytest.raises(ValueError, match="max_gpus"):
        generate(10, max_gpus=0)


def test_generated_workload_round_trips_through_native(tmp_path: Path) -> None:
    jobs = generate(300, seed=9)
    path = tmp_path / "synthetic.parquet"
    write_native(jobs, path)
    assert load_trace(path).jobs == jobs
