"""Counterfactual labels from the simulator (``datasets.labels``): ``linkwise label``.

The base policy spec is resolved here, at the pipeline's edge (``policies.spec``), and
travels to the workers as a built policy, so ``datasets/`` never imports ``models/``. The
workload is a trace (``trace``) or the embedded synthetic one, cut into windows; the
run-time predictor is fit on ``history`` when given, else on the windows before the
labelled ones (never on the labelled jobs). Output: a content-hashed Parquet label set and
its manifest in ``out``; ``label`` returns the manifest with the throughput.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.restart import parse_restart
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets import synthetic
from linkwise.datasets.comm_profiles import EMPTY_BOOK, apply_history_windows, load_profile_book
from linkwise.datasets.labels import LabelTask, run_labels, write_labels
from linkwise.datasets.prediction import predictor_record
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import jobs_frame, load_trace
from linkwise.models.calibrations import CalibrationChoice
from linkwise.policies.spec import PolicySpec

__all__ = ["label"]


def label(
    *,
    base: PolicySpec,
    trace: Path | None,
    trace_format: str,
    jobs: int,
    seed: int,
    history: Path | None,
    fit_windows: int,
    windows: int,
    window_hours: float,
    seeds: Sequence[int],
    horizon_s: float,
    samples: int,
    points: int,
    alternatives: int,
    k_slots: int,
    running_slots: int,
    cluster: str,
    calibration: Path | None,
    restart_cost: str,
    executor: str,
    out: Path,
    calibration_used: CalibrationChoice | None = None,
    db: Path | None = None,
    slurm_cluster: str | None = None,
) -> dict[str, Any]:
    """Build the tasks, label them on ``executor``, write the label set; its manifest with
    ``speed`` (wall seconds, labels, cores, labels per second per core). The manifest's
    sources name the calibration (``calibration_used``: how it was chosen; default: a file
    given, else the shipped one). ``db``: a store whose job telemetry gives the labelled
    jobs of a name (else of a user and GPU count) seen there the profile learned from those
    runs (``datasets.comm_profiles``, of ``slurm_cluster``), the default mix the others; the
    manifest's sources count which jobs had which (all the default mix without a store)."""
    spec = base
    if spec.is_oracle or spec.is_model or spec.search is not None:
        raise ValueError(
            f"--base {base.label}: the base must be a same-information heuristic or "
            "composition (never an oracle, a learned package or a search policy)"
        )
    topo = load_topology(cluster)
    cal = load_calibration(calibration)
    restart = parse_restart(restart_cost)
    if trace is not None:
        workload = load_trace(trace, trace_format).jobs
    else:
        workload = synthetic.generate(jobs, seed=seed, max_gpus=topo.total_gpus)
    cut = cut_windows(
        jobs_frame(workload), window_hours * 3600.0, max_gpus=topo.total_gpus, min_jobs=5
    )
    first = 0 if history is not None else fit_windows
    chosen = cut[first : first + windows]
    if not chosen:
        raise ValueError(
            f"no window to label: {len(cut)} windows of {window_hours:g} h with 5+ "
            f"jobs, {first} kept for fitting the predictor"
        )
    book = EMPTY_BOOK
    if db is not None:
        with closing(open_store(db)) as con:
            book = load_profile_book(con, cluster=slurm_cluster)
    learned, cal, profiles = apply_history_windows(chosen, cal, book)
    chosen = list(learned)
    if history is not None:
        predictor = RuntimePredictor.fit(load_trace(history, "auto").jobs)
    else:
        past = [j for w in cut[:first] for j in w.jobs]
        if not past:
            raise ValueError("no jobs before the labelled windows to fit the predictor on")
        predictor = RuntimePredictor.fit(past, until=chosen[0].start)
    config = MdpConfig(k_slots=k_slots, running_slots=running_slots)
    built = spec.build()
    tasks = [
        LabelTask(
            base=built,
            base_name=spec.describe(),
            window=w,
            topology=topo,
            seed=s,
            config=config,
            calibration=cal,
            restart=restart,
            predictor=predictor,
            horizon_s=horizon_s,
            n=samples,
            points=points,
            alternatives=alternatives,
        )
        for w in chosen
        for s in seeds
    ]
    t = time.perf_counter()
    df = run_labels(tasks, executor)
    wall = time.perf_counter() - t
    sources: dict[str, Any] = {
        "base": spec.describe(),
        "horizon_s": horizon_s,
        "samples": samples,
        "points_per_rollout": points,
        "alternatives": alternatives,
        "windows": [w.window_id for w in chosen],
        "seeds": list(seeds),
        "trace": str(trace) if trace is not None else "synthetic",
        "cluster": cluster,
        "restart": restart.describe(),
        "predictor": predictor_record(predictor),
        "calibration": None if calibration is None else str(calibration),
        "calibration_used": (calibration_used or CalibrationChoice.given(calibration)).to_dict(),
        "profiles": profiles.to_dict(),
        "profiles_from": None if db is None else str(db),
    }
    manifest = write_labels(df, config, sources, out)
    cores = _cores(executor)
    speed = {
        "wall_s": wall,
        "labels": df.height,
        "cores": cores,
        "labels_per_s_per_core": df.height / wall / cores if wall > 0 else 0.0,
    }
    return {**manifest, "speed": speed}


def _cores(executor: str) -> int:
    name, _, arg = executor.partition(":")
    if executor == "serial":
        return 1
    if name == "local":
        return int(arg) if arg else os.cpu_count() or 1
    return os.cpu_count() or 1  # a Dask cluster's size is its own; this machine's as a guess
