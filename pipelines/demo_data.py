"""The demo's data (steps 2 and 3 of ``pipelines.demo``): the cluster's calibration tried on
the history (``calibrate_history``), where the history is cut (the dataset's
part, the validation windows that choose the checkpoints, the held-out windows), the run's
one run-time predictor fit before the cut with its accuracy on the held-out jobs, and the
dataset built from the first part."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Topology
from linkwise.cluster.metrics import duration_text
from linkwise.datasets.contention_fit.report import render_fit_text
from linkwise.datasets.decisions import store_predictor
from linkwise.datasets.prediction import predictor_digest, write_predictor
from linkwise.datasets.predictor import RuntimePredictor, accuracy
from linkwise.datasets.rollouts import Window, cut_windows, jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.pipelines.build_dataset import build_dataset
from linkwise.pipelines.experiment import Experiment, TrainingPlan
from linkwise.pipelines.history import accounting_jobs
from linkwise.pipelines.selection import validation_windows
from linkwise.pipelines.workspace import Workspace
from linkwise.policies.spec import PolicySpec

__all__ = [
    "accuracy_text",
    "build_demo_dataset",
    "calibrate_history",
    "check_disjoint",
    "fit_run_predictor",
    "history_split",
    "split_time",
    "training_plan",
    "utc_text",
    "validation_split",
    "with_validation",
]


def split_time(
    first_submit: float, last_submit: float, window_s: float, eval_windows: int
) -> float:
    """The dataset's ``until``: a window boundary leaving the last ``eval_windows`` windows
    (on the evaluation's grid: windows of ``window_s`` from the first submit) held out."""
    n = max(1, math.ceil((last_submit - first_submit) / window_s + 1e-9))
    train = max(1, n - eval_windows)
    return first_submit + train * window_s


def training_plan(exp: Experiment) -> TrainingPlan:
    """The experiment's training budget; ValueError for one without (``DAILY``)."""
    if exp.training is None:
        raise ValueError(f"experiment {exp.name!r} has no training budget to run the demo with")
    return exp.training


def history_split(db: Path, slurm_cluster: str, topo: Topology, exp: Experiment) -> dict[str, Any]:
    """Where the history is cut: the dataset from its first submit ``until`` the held-out
    windows (the last ``exp.evaluation.heldout_windows`` of its window grid)."""
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con, cluster=slurm_cluster)
    jobs = jobs.filter(jobs["num_gpus"] <= topo.total_gpus)
    first = float(jobs["submit_time"].min())  # type: ignore[arg-type]
    last = float(jobs["submit_time"].max())  # type: ignore[arg-type]
    window_s = exp.windows.window_s
    until = split_time(first, last, window_s, exp.evaluation.heldout_windows)
    return {
        "first_submit": first,
        "until": until,
        "last_submit": last,
        "window_s": window_s,
        "train_windows": round((until - first) / window_s),
        "heldout_windows": exp.evaluation.heldout_windows,
        "dataset_until": until,
    }


def utc_text(t: float) -> str:
    """A time as the demo prints it (UTC, to the minute)."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def validation_split(
    db: Path, slurm_cluster: str, topo: Topology, exp: Experiment, until: float
) -> list[Window]:
    """The training span's last ``validation_windows`` windows before ``until`` on the
    evaluation's grid (``pipelines.selection.validation_windows``); none without. ValueError
    when the held-out part has fewer busy windows than the evaluation takes."""
    n = training_plan(exp).validation_windows
    if n <= 0:
        return []
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con, cluster=slurm_cluster)
    cut = cut_windows(jobs, exp.windows.window_s, max_gpus=topo.total_gpus)
    held = [w for w in cut if w.start >= until and len(w.jobs) >= exp.windows.min_jobs]
    if len(held) < exp.evaluation.heldout_windows:  # refused before training, not after
        raise ValueError(
            f"{len(held)} held-out windows of {exp.windows.min_jobs}+ jobs: the evaluation "
            f"would take validation windows to make {exp.evaluation.heldout_windows}"
        )
    return validation_windows(cut, until, n, exp.windows.min_jobs)


def with_validation(split: Mapping[str, Any], windows: Sequence[Window]) -> dict[str, Any]:
    """The split with its validation windows: the dataset ends where the first begins."""
    return {
        **split,
        "dataset_until": min(w.start for w in windows),
        "validation_windows": [
            {"window_id": w.window_id, "start": w.start, "end": w.end, "jobs": len(w.jobs)}
            for w in windows
        ],
    }


def check_disjoint(
    evaluated: Sequence[Mapping[str, Any]], validation: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse an evaluation window that overlaps a validation window (the evaluation picks
    the last windows outside the dataset, which the validation windows are too)."""
    for e in evaluated:
        for v in validation:
            if float(e["start"]) < float(v["end"]) and float(v["start"]) < float(e["end"]):
                raise ValueError(f"evaluation window {e} overlaps validation window {v}")


def fit_run_predictor(
    ws: Workspace, slurm_cluster: str, topo: Topology, until: float
) -> tuple[RuntimePredictor, dict[str, Any]]:
    """The run's one run-time predictor, fit on the accounting's jobs submitted before
    ``until`` (never on the held-out part), written to ``predictor.json``; and its summary
    with its accuracy on the held-out jobs (their true run times, for the report only)."""
    with closing(open_store(ws.db)) as con:
        predictor = store_predictor(con, slurm_cluster, until)
    path = write_predictor(predictor, ws.out / "predictor.json")
    heldout = accounting_jobs(ws.db, cluster=slurm_cluster, since=until, max_gpus=topo.total_gpus)
    with warnings.catch_warnings():  # constant predictions (no users or names): no Spearman
        warnings.simplefilter("ignore")
        measured = accuracy(predictor, heldout) if heldout else None
    return predictor, {
        "path": str(path),
        "sha256": predictor_digest(predictor),
        "fit_from": predictor.fit_from,
        "fit_until": predictor.fit_until,
        "n_jobs": predictor.n_jobs,
        "heldout_accuracy": measured,
    }


def accuracy_text(info: Mapping[str, Any]) -> str:
    """The predictor's held-out accuracy in one line."""
    acc = info.get("heldout_accuracy")
    if not acc:
        return "no held-out jobs"
    cov = ", ".join(f"{k.removeprefix('coverage_')} covers {v:.0%}" for k, v in acc.items()
                    if k.startswith("coverage_"))  # fmt: skip
    rho = acc["spearman"]
    rank = "n/a (constant predictions)" if math.isnan(rho) else f"{rho:.2f}"
    return f"Spearman {rank}, MAE {duration_text(acc['mae_h'] * 3600.0)}, {cov}"


def build_demo_dataset(
    ws: Workspace,
    exp: Experiment,
    *,
    slurm_cluster: str,
    until: float,
    seed: int,
    predictor: RuntimePredictor,
) -> dict[str, Any]:
    """The dataset (log transitions and rollouts) from the history before ``until``, its jobs
    annotated by ``predictor``: its path, hash, counts and build time."""
    built = build_dataset(
        ws.db,
        out_dir=ws.out / "datasets",
        rollouts=exp.dataset.rollouts,
        policies=[PolicySpec.parse(s) for s in exp.dataset.policies],
        epsilons=exp.dataset.epsilons,
        seeds=exp.dataset.seeds,
        window_s=exp.windows.window_s,
        block_s=exp.windows.block_s,
        min_jobs=exp.windows.min_jobs,
        topology=exp.topology,
        slurm_cluster=slurm_cluster,
        until=until,
        log_window_s=exp.dataset.log_window_s,
        config=exp.mdp,
        executor="serial",
        max_steps=exp.dataset.max_steps,
        seed=seed,
        tracking_uri=ws.uri,
        warm_start=exp.windows.warm_start,
        predictor=predictor,
        log_share=exp.dataset.log_share,
    )
    return {
        "path": str(built["path"]),
        "hash": built["hash"],
        "counts": built.get("counts"),
        "seconds": built["seconds"],
    }


NO_TELEMETRY = (
    "the demo's history is replayed in the simulator and stored as accounting only (jobs, "
    "their nodes): no exporter telemetry (DCGM GPU activity, link counters) exists to fit "
    "the contention model on, so every later stage uses the shipped calibration "
    "(DeepShare/Pollux testbeds). On a cluster: `linkwise collect telemetry`, then "
    "`linkwise calibrate --db STORE` (docs/OPERATIONS.md)."
)
"""What the demo says when its history cannot be calibrated on."""


def calibrate_history(db: str | Path, cluster: str, topology: str) -> dict[str, Any]:
    """``linkwise calibrate --db`` on the demo's store (``calibrate_store``, not logged: the
    demo's stages take their calibration as they are told): ``fitted``, the text to print
    (what was fitted, from how many jobs and hours, the validation error; or why nothing
    was, plainly), the fit's data and validation when fitted, and the seconds it took."""
    # the fit imports scipy at its top (about 1 s): only when the demo calibrates, not when
    # the command line starts (pipelines.demo builds its parser)
    from linkwise.pipelines.cluster_calibration import calibrate_store  # scipy: start-up

    t0 = time.perf_counter()
    try:
        done = calibrate_store(db, slurm_cluster=cluster, topology=topology)
    except ValueError as exc:
        text = f"calibration: not fitted: {exc}\n{NO_TELEMETRY}\n"
        return {"fitted": False, "text": text, "seconds": time.perf_counter() - t0}
    fit = done.fit.calibration.fit
    return {
        "fitted": True,
        "text": f"calibration of cluster {done.cluster}:\n{render_fit_text(done.fit)}",
        "data": fit["data"],
        "validation": fit["validation"],
        "seconds": time.perf_counter() - t0,
    }
