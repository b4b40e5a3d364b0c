"""The LLM-era synthetic workload (issue 33 item 3b): the drawn figures match their published
sources within stated tolerances (100,000 jobs, seed 0), every job is labelled synthetic, the
draw is seeded, and ``--trace synthetic:llm,...`` reaches simulate and evaluate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linkwise.datasets.llm_workload import FIGURES, LlmSpec, generate, parse_spec, size_pmf
from linkwise.datasets.traces import load_trace
from linkwise.pipelines.evaluate import evaluate
from linkwise.policies.spec import PolicySpec

FIG = {f.name: f.value for f in FIGURES}


@pytest.fixture(scope="module")
def drawn() -> tuple[np.ndarray, np.ndarray]:
    jobs = generate(LlmSpec(jobs=100_000, seed=0))
    return np.array([j.num_gpus for j in jobs]), np.array([j.duration for j in jobs])


def test_sizes_match_acme_and_crux(drawn: tuple[np.ndarray, np.ndarray]) -> None:
    gpus, _ = drawn
    sizes, probs = size_pmf()
    assert sum(g * p for g, p in zip(sizes, probs, strict=True)) == pytest.approx(26.77)
    assert gpus.mean() == pytest.approx(FIG["mean GPUs per GPU job"], rel=0.03)  # Acme Kalos
    assert np.median(gpus) == FIG["median GPUs per GPU job"]
    assert gpus.max() == FIG["largest GPU job (GPUs)"]
    big = float((gpus >= 128).mean())  # Crux: over 10% of jobs at 128 GPUs or more
    assert FIG["share of jobs with 128 GPUs or more (over 10%)"] < big < 0.11


def test_run_times_match_acme(drawn: tuple[np.ndarray, np.ndarray]) -> None:
    gpus, runs = drawn
    assert np.median(runs) == pytest.approx(FIG["median run time of GPU jobs (s)"], rel=0.03)
    assert runs.mean() == pytest.approx(FIG["mean run time of GPU jobs (s)"], rel=0.06)
    assert (gpus * runs).mean() == pytest.approx(FIG["GPU time per GPU job (GPU-s)"], rel=0.08)
    assert runs.max() <= FIG["longest GPU job (s)"]


def test_labelled_seeded_and_flexible() -> None:
    a, b = generate(LlmSpec(jobs=500, seed=3)), generate(LlmSpec(jobs=500, seed=3))
    assert a == b and a != generate(LlmSpec(jobs=500, seed=4))
    assert all(j.user == "synthetic" and j.name.startswith("synthetic-llm-") for j in a)
    half = generate(LlmSpec(jobs=2000, seed=3, flexible=0.5))
    multi = [j for j in half if j.num_gpus > 1]
    assert 0.4 < sum(bool(j.flexible) for j in multi) / len(multi) < 0.6
    small = generate(LlmSpec(jobs=2000, seed=3, gpus=64))
    assert max(j.num_gpus for j in small) == 64
    trace = load_trace("synthetic:llm,jobs=100,seed=3,load=0.5")
    assert "synthetic" in trace.source and len(trace.jobs) == 100
    with pytest.raises(ValueError, match="unknown field"):
        parse_spec("synthetic:llm,size=3")


def test_simulate_and_evaluate_take_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "linkwise.cli", "simulate", "--policy", "backfill", "--trace",
         "synthetic:llm,jobs=200,gpus=512,flexible=1", "--cluster", "64x8,leaf=16,ecmp=1",
         "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(out.stdout)
    assert row["jobs"] == 200 and "synthetic:llm" in row["trace"]
    report, _ = evaluate([PolicySpec.parse("backfill")], trace="synthetic:llm,jobs=400,gpus=256",
                         cluster="32x8", n_windows=1, seeds=[0], window_s=12 * 3600.0, block_s=0.0,
                         min_jobs=20, out_dir=tmp_path, log=False, n_boot=50)  # fmt: skip
    assert report.context["workload"].startswith("synthetic:llm,jobs=400")
