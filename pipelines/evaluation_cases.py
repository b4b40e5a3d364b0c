"""What an evaluation runs on (``pipelines.evaluate.evaluate``): the topology
(``evaluation_topology``), the workload with its jobs (``load_workload``: a trace or the store's
accounting, optionally with a share of flexible requests), the held-out windows
(``held_out_windows``: named ones checked against the training spans, else the free ones),
the run-time predictor (``window_predictor``), each window's starting backlog
(``window_backlogs``) and its jobs' communication profiles (``window_profiles``: learned from
the store's job telemetry of earlier runs, the default mix elsewhere)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from linkwise.cluster.domain import Topology
from linkwise.cluster.flexible import draw_summary, with_flexible
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.backlog import Backlog, backlog_from_store
from linkwise.datasets.comm_profiles import ProfileCounts, apply_history_windows, load_profile_book
from linkwise.datasets.export import file_sha256
from linkwise.datasets.history import fit_history, load_history
from linkwise.datasets.llm_workload import is_generated, parse_spec, spec_sha256
from linkwise.datasets.log_jobs import topology_from_store
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, cut_windows, jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import frame_jobs, jobs_frame, load_trace
from linkwise.datasets.windows import choose_windows, window_supply
from linkwise.evaluation.holdout import (
    Span,
    check_heldout,
    overlaps_any,
    trace_source,
    window_spans,
)

__all__ = [
    "EvaluationTopology",
    "HeldOut",
    "Workload",
    "evaluation_topology",
    "flexible_frame",
    "held_out_windows",
    "load_workload",
    "window_backlogs",
    "window_predictor",
    "window_profiles",
]


@dataclass(frozen=True)
class EvaluationTopology:
    """The cluster an evaluation runs on, what the output calls it and where it came from."""

    topology: Topology
    name: str
    source: str


def evaluation_topology(
    cluster: str | None, db: str | Path | None, slurm_cluster: str | None = None
) -> EvaluationTopology:
    """The topology to evaluate on: ``cluster`` (a spec, or a folder with ``slurm.conf`` and
    ``topology.conf``) when given; else, for a store, the cluster the store describes (its
    ``nodes`` table, as ``build-dataset`` reads it; ValueError when it has none); else the one
    default ``DEFAULT_TOPOLOGY``."""
    if cluster:
        return EvaluationTopology(load_topology(cluster), cluster, "given (--cluster)")
    if db is None:
        topo = load_topology(DEFAULT_TOPOLOGY)
        return EvaluationTopology(topo, DEFAULT_TOPOLOGY, "the default (no --cluster)")
    with closing(open_store(db)) as con:
        try:
            topo = topology_from_store(con, slurm_cluster)
        except ValueError as exc:
            raise ValueError(
                f"{db}: cannot evaluate on the store's cluster: {exc}; collect its nodes "
                "(`linkwise collect accounting`) or name the topology with --cluster (a spec "
                "such as 4x4, or the folder of slurm.conf and topology.conf)"
            ) from None
    gpus = sorted({n.gpus for n in topo.nodes})
    shape = f"{len(topo.nodes)}x{gpus[0]}" if len(gpus) == 1 else f"{len(topo.nodes)} nodes"
    return EvaluationTopology(
        topo,
        f"{topo.name} ({shape}, {topo.total_gpus} GPUs)",
        f"the store's nodes table ({db}, cluster {topo.name})",
    )


@dataclass(frozen=True)
class Workload:
    """The jobs an evaluation draws its windows from, and what the report says of them."""

    jobs: pl.DataFrame
    source: str  # the held-out spans' source name (``evaluation.holdout``)
    description: str  # what the report calls it
    origin: float | None  # the epoch of the trace's time 0 (a store's times are Unix seconds)
    traces: Mapping[str, str | Path]  # sha256 -> trace file, for the datasets' spans
    flexible: Mapping[str, Any] | None  # the flexible draw (``flexible_frame``), if any


def load_workload(
    trace: str | Path | None,
    db: str | Path | None,
    slurm_cluster: str | None,
    flexible: float | None,
    seed: int,
) -> Workload:
    """The jobs of ``trace`` (a file or a generated workload's spec), else of the store's
    accounting, with ``flexible`` of the multi-GPU ones flexible (``flexible_frame``)."""
    traces: dict[str, str | Path] = {}
    origin: float | None = 0.0
    if trace is not None:
        sha = spec_sha256(parse_spec(trace)) if is_generated(trace) else file_sha256(trace)
        loaded = load_trace(trace)
        source, jobs, origin = trace_source(sha), jobs_frame(loaded.jobs), loaded.origin_epoch
        traces[sha] = trace
        described = f"{trace} (sha256 {sha[:16]})"
    else:
        with closing(open_store(db)) as con:  # type: ignore[arg-type]
            jobs = jobs_from_store(con, cluster=slurm_cluster)
        source, described = f"slurm:{slurm_cluster or ''}", f"store {db} ({slurm_cluster or 'all'})"
    forms: dict[str, Any] | None = None
    if flexible is not None:
        jobs, forms = flexible_frame(jobs, flexible, seed)
    return Workload(jobs, source, described, origin, traces, forms)


def flexible_frame(
    jobs: pl.DataFrame, share: float, seed: int
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The jobs frame with ``share`` of its multi-GPU jobs flexible (``cluster.flexible``'s
    rule under ``seed``) and what the report says of it."""
    drawn = with_flexible(frame_jobs(jobs), share, seed=seed)
    return jobs_frame(drawn), draw_summary(drawn, share, seed)


@dataclass(frozen=True)
class HeldOut:
    """The evaluation windows and, when fewer were free than asked, what the report says."""

    chosen: tuple[Window, ...]
    shortfall: str | None


def held_out_windows(
    workload: Workload,
    topo: Topology,
    used: Sequence[Span],
    *,
    windows: Sequence[int] | None,
    n_windows: int,
    min_jobs: int,
    window_s: float,
) -> HeldOut:
    """The named ``windows`` (refused when one overlaps a training span in ``used``), else
    the last ``n_windows`` free windows with ``min_jobs`` jobs (spread over the workload when
    nothing is held out); ValueError when none is free."""
    cut = cut_windows(workload.jobs, window_s, max_gpus=topo.total_gpus)
    if windows:
        chosen = choose_windows(cut, ids=windows)
        check_heldout(window_spans(chosen, workload.source), used)
        return HeldOut(tuple(chosen), None)
    excluded = overlaps_any(workload.source, used)
    supply = window_supply(
        cut, asked=n_windows, min_jobs=min_jobs, window_s=window_s, excluded=excluded
    )
    if not supply.free:
        raise ValueError(
            supply.message(
                "no evaluation windows left",
                "or train on an earlier span (build-dataset/train --until) so that later "
                "windows stay held out",
            )
        )
    shortfall = supply.message("fewer evaluation windows than asked") if supply.missing else None
    chosen = choose_windows(
        cut,
        n=n_windows,
        min_jobs=min_jobs,
        excluded=excluded,
        where="last" if used else "spread",
    )
    return HeldOut(tuple(chosen), shortfall)


def window_predictor(
    predictor: RuntimePredictor | None,
    history: str | Path | None,
    history_format: str,
    slurm_cluster: str | None,
    chosen: Sequence[Window],
    workload: Workload,
    trace: str | Path | None,
) -> tuple[RuntimePredictor | None, dict[str, Any] | None]:
    """The run-time predictor every case's jobs get, and what the report says of it: the one
    given, else one fit on ``history``'s jobs submitted before the first window, else none."""
    fitted: dict[str, Any] | None = None
    if predictor is not None:
        fitted = {"predictor_fit_until": predictor.fit_until, "history_jobs": predictor.n_jobs}
    if history is not None:
        predictor, fitted = fit_history(
            load_history(history, history_format, slurm_cluster=slurm_cluster),
            first_submit=min(w.start for w in chosen),
            origin_epoch=workload.origin,
            evaluated_source=str(trace) if trace is not None else None,
        )
    return predictor, fitted


def window_backlogs(
    db: str | Path | None,
    topo: Topology,
    slurm_cluster: str | None,
    chosen: Sequence[Window],
    predictor: RuntimePredictor | None,
) -> dict[int, Backlog]:
    """Per window, the cluster's running and queued jobs in the store's accounting at its
    start (a trace has none: ``db`` None is refused)."""
    if db is None:
        raise ValueError("a backlog needs the accounting store (db)")
    backlogs: dict[int, Backlog] = {}
    with closing(open_store(db)) as con:
        for w in chosen:
            backlogs[w.window_id] = backlog_from_store(con, topo, slurm_cluster, w.start, predictor)
    return backlogs


def window_profiles(
    db: str | Path | None,
    slurm_cluster: str | None,
    chosen: Sequence[Window],
    calibration: str | Path | None,
) -> tuple[list[Window], Calibration, ProfileCounts | None]:
    """The windows' jobs with the profile learned from the store's job telemetry of runs
    ended before the first window where one exists (``datasets.comm_profiles``; a fitted
    calibration's ``history:name=NAME`` keeps its values), the calibration extended with the
    rest of the book, and the counts; a trace (``db`` None) is left to the default mix.
    ``calibration``: its file (None: the shipped one)."""
    cal = load_calibration(calibration)
    if db is None:
        return list(chosen), cal, None
    with closing(open_store(db)) as con:
        book = load_profile_book(con, cluster=slurm_cluster, until=min(w.start for w in chosen))
    learned, extended, counts = apply_history_windows(chosen, cal, book)
    return list(learned), extended, counts
