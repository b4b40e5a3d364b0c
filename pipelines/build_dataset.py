"""Build the transition dataset: decision points from the logs plus simulator rollouts, exported.

``build_dataset`` is the plain function (tested without Prefect when ``executor="serial"``);
``build_dataset_flow`` is the thin Prefect flow around it. Steps:

1. Logs (when ``db_path`` is given): ``datasets.decisions.build_log_transitions`` over the
   store's accounting, on the topology given (``topology``) or rebuilt from the store's
   ``nodes`` table.
2. Rollouts (when ``rollouts`` is None or positive, or ``windows`` are named): the jobs of
   ``trace`` (else the store's accounting) cut into ``window_s`` windows; ``rollouts`` windows
   with at least ``min_jobs`` jobs are picked evenly over the workload (None: every one of
   them, i.e. every training window; or the ``windows`` ids), and every (policy, epsilon,
   window, seed) is one rollout (``datasets.rollouts``; policies are behaviour specs such as
   ``sjf_bco:lam=2``), run by ``executor`` ("serial", "local[:N]", "dask" or
   "dask://HOST:PORT").
   ``log_share`` caps the log transitions at that share of the dataset: whole log episodes
   are kept in a fixed pseudo-random order (by a hash of the episode name) while they fit
   (``cap_log_share``); the manifest records it (``sources.log_share``), so the hash changes
   with it.
Before either, one run-time predictor (``datasets.predictor``) is fit on the history before
the dataset's end (``until``): the store's accounting, else the trace, or ``history`` when
given (a trace or a store), unless ``predictor`` is passed in. Logs, rollouts and warm starts
all annotate their jobs with it, and the manifest records it (``sources.predictor``: its
JSON, SHA-256 and fit span), so the learned packages trained on the dataset carry it.

3. Export: the frames concatenated and written as content-hashed Parquet with a manifest
   (``datasets.export``), logged to MLflow when a tracking URI is configured.

``linkwise build-dataset`` (``linkwise/cli/data.py``) calls ``build_dataset``.
"""

from __future__ import annotations

import math
import os
import textwrap
import time
import zlib
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Topology
from linkwise.cluster.mdp import MdpConfig, ObsSpec, make_spec
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.backlog import Backlog, backlog_from_store
from linkwise.datasets.comm_profiles import (
    EMPTY_BOOK,
    ProfileCounts,
    apply_history_frame,
    load_profile_book,
)
from linkwise.datasets.decisions import build_log_transitions, store_predictor
from linkwise.datasets.export import export_dataset, file_sha256, log_to_mlflow
from linkwise.datasets.history import predictor_from_history
from linkwise.datasets.log_jobs import store_cluster, topology_from_store
from linkwise.datasets.prediction import predictor_record
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import (
    Window,
    cut_windows,
    jobs_from_store,
    jobs_from_trace,
    make_tasks,
    run_rollouts,
)
from linkwise.datasets.store import open_store
from linkwise.datasets.transitions import empty_frame
from linkwise.datasets.windows import choose_windows, window_supply
from linkwise.models.learned import LearnedPolicy
from linkwise.models.registry import load_source, open_registry
from linkwise.parallel import patient_prefect_server
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_POLICIES",
    "build_dataset",
    "build_dataset_flow",
    "cap_log_share",
]

DEFAULT_POLICIES: tuple[PolicySpec, ...] = tuple(
    PolicySpec.parse(s) for s in ("backfill", "best_fit", "sjf_bco", "tiresias_las")
)
DEFAULT_EPSILONS: tuple[float, ...] = (0.0, 0.1)


def _log_transitions(
    db_path: str,
    topo: Topology,
    spec: ObsSpec,
    model: AnalyticModel,
    *,
    slurm_cluster: str | None,
    since: float | None,
    until: float | None,
    log_window_s: float | None,
    seed: int,
    predictor: RuntimePredictor,
) -> tuple[pl.DataFrame, dict[str, Any]]:
    with closing(open_store(db_path)) as con:
        frame, report = build_log_transitions(
            con,
            topology=topo,
            spec=spec,
            model=model,
            cluster=slurm_cluster,
            since=since,
            until=until,
            window_s=log_window_s,
            seed=seed,
            predictor=predictor,
        )
    rep = report.to_json() if hasattr(report, "to_json") else {}
    return frame, rep


def _submitted(jobs: pl.DataFrame, since: float | None, until: float | None) -> pl.DataFrame:
    """The jobs submitted in ``[since, until)`` (either bound optional), as the store's
    query bounds them: a trace's rollouts never reach past the dataset's end."""
    keep = pl.lit(True)
    if since is not None:
        keep &= pl.col("submit_time") >= since
    if until is not None:
        keep &= pl.col("submit_time") < until
    return jobs.filter(keep)


def cap_log_share(
    logs: pl.DataFrame, others: int, share: float
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The log transitions subsampled by whole episodes so that they are at most ``share`` of
    a dataset that also holds ``others`` transitions, and the record of what was kept.

    Episodes are taken in a fixed pseudo-random order (CRC-32 of the episode name, so the
    same logs always keep the same episodes), each kept while the kept total stays within
    ``share / (1 - share) * others``; ``share`` 1 keeps everything, 0 nothing."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"log_share must be in [0, 1], got {share}")
    sizes = logs.group_by("episode").len().sort("episode").rows()
    total = sum(n for _, n in sizes)
    cap = total if share >= 1.0 else math.floor(share / (1.0 - share) * others + 1e-9)
    kept: list[str] = []
    used = 0
    for episode, n in sorted(sizes, key=lambda r: (zlib.crc32(r[0].encode()), r[0])):
        if used + n <= cap:
            kept.append(episode)
            used += n
    record = {
        "share": share,
        "episodes": {"kept": len(kept), "total": len(sizes)},
        "transitions": {"kept": used, "total": total, "others": others},
        "order": "crc32 of the episode name",
    }
    return logs.filter(pl.col("episode").is_in(kept)), record


def _predictor(
    given: RuntimePredictor | None,
    history: str | Path | None,
    db: str | None,
    trace: str | Path | None,
    slurm_cluster: str | None,
    until: float | None,
) -> tuple[RuntimePredictor, dict[str, Any]]:
    """The dataset's one predictor and what it was fit on (``build_dataset``)."""
    if given is not None:
        return given, {"given": True}
    if history is not None:
        fitted = predictor_from_history(history, until=until, cluster=slurm_cluster)
        return fitted, {"history": str(history), "cluster": slurm_cluster, "until": until}
    if db is not None:
        with closing(open_store(db)) as con:
            fitted = store_predictor(con, slurm_cluster, until)
        return fitted, {"history": db, "cluster": slurm_cluster, "until": until}
    assert trace is not None
    return predictor_from_history(trace, until=until), {"history": str(trace), "until": until}


def build_dataset(
    db_path: str | Path | None = None,
    trace: str | Path | None = None,
    *,
    out_dir: str | Path = "linkwise-out/datasets",
    rollouts: int | None = 0,
    policies: Sequence[PolicySpec] = DEFAULT_POLICIES,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    windows: Sequence[int] | None = None,
    seeds: Sequence[int] = (0,),
    window_s: float = 6 * 3600.0,
    block_s: float = 1800.0,
    min_jobs: int = 10,
    topology: str | None = None,
    slurm_cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
    log_window_s: float | None = None,
    config: MdpConfig | None = None,
    calibration: str | None = None,
    executor: str = "local",
    batch: int = 4,
    max_steps: int | None = None,
    seed: int = 0,
    tracking_uri: str | None = None,
    warm_start: bool = False,
    history: str | Path | None = None,
    predictor: RuntimePredictor | None = None,
    log_share: float | None = None,
    calibration_used: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build, export and (optionally) log a dataset; the manifest (``path``, ``hash``,
    ``counts``, ``report``, ``sources``, ``seconds``).

    ``rollouts``: how many trace windows to roll out (each with every policy, epsilon and
    seed; None: every window with ``min_jobs`` jobs before ``until``); ``windows`` names
    window ids instead. ``log_share``: the log transitions' largest share of the dataset
    (``cap_log_share``; None: all of them). ``batch``: rollouts per Prefect task run.
    ``seed`` draws the log jobs' profiles. ``warm_start`` (rollouts from the store): every
    rollout window starts from the accounting's running and queued jobs at its start
    (``datasets.backlog``), as the evaluation does. ``predictor`` (else one fit on
    ``history``, else on the store's accounting, else on the trace, before ``until``) gives
    every job its run-time predictions; the manifest records it (module docstring).
    """
    t0 = time.perf_counter()
    db = str(db_path) if db_path is not None else None
    if db is None and trace is None:
        raise ValueError("nothing to build from: give a store (db_path) and/or a trace")
    spec = make_spec(config)
    cal = load_calibration(calibration)
    model = AnalyticModel(cal)
    slurm_cluster, topo = _cluster_and_topology(db, topology, slurm_cluster)
    sources: dict[str, Any] = {
        "topology": _topology_source(topo, topology or (None if db else DEFAULT_TOPOLOGY)),
        "calibration": calibration,
        # which calibration (models.calibrations.CalibrationChoice.to_dict), when resolved
        "calibration_used": dict(calibration_used) if calibration_used else None,
    }
    predictor, fitted_on = _predictor(predictor, history, db, trace, slurm_cluster, until)
    sources["predictor"] = predictor_record(predictor, fitted_on)
    if log_share is not None and not 0.0 <= log_share <= 1.0:
        raise ValueError(f"log_share must be in [0, 1], got {log_share}")
    span = Span(db, trace, slurm_cluster, since, until)
    want = rollouts is None or rollouts > 0 or bool(windows)
    # the rollout windows first: a history too short is refused before any work
    plan = _plan_rollouts(span, cal, topo, rollouts, windows, window_s, min_jobs) if want else None
    frames: list[pl.DataFrame] = [empty_frame()]
    logs = empty_frame()
    log_report: dict[str, Any] | None = None
    if db is not None:
        logs, log_report = _log_transitions(
            db,
            topo,
            spec,
            model,
            slurm_cluster=slurm_cluster,
            since=since,
            until=until,
            log_window_s=log_window_s,
            seed=seed,
            predictor=predictor,
        )
        sources["accounting"] = _accounting_source(span, logs, log_report, log_window_s, seed)
    rollout_note: dict[str, Any] | None = None
    if plan is not None:
        if warm_start and (trace is not None or db is None):
            raise ValueError("warm_start needs rollouts from the store (no trace)")
        options = RolloutOptions(
            tuple(policies),
            tuple(epsilons),
            tuple(seeds),
            window_s,
            block_s,
            max_steps,
            warm_start,
            executor,
            batch,
        )
        frame, sources["rollouts"], episodes = _roll_out(
            plan, options, span, topo, spec, cal, predictor
        )
        frames.append(frame)
        rollout_note = {"asked": rollouts, "episodes": episodes, "shortfall": plan.shortfall}
    if log_share is not None and db is not None:
        others = sum(f.height for f in frames)
        logs, sources["log_share"] = cap_log_share(logs, others, log_share)
    df = pl.concat([*frames, logs], how="vertical")
    manifest = export_dataset(df, spec, sources, out_dir)
    open_registry(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""))
    run_id = log_to_mlflow(manifest["path"], manifest, tracking_uri=tracking_uri)
    seconds = time.perf_counter() - t0
    return {
        **manifest,
        "log_report": log_report,
        "profiles": plan.counts.to_dict() if plan is not None else None,
        "rollout_report": rollout_note,
        "mlflow_run_id": run_id,
        "seconds": seconds,
        "transitions_per_s": df.height / seconds if seconds > 0 else math.inf,
    }


@dataclass(frozen=True)
class Span:
    """Where a dataset's history comes from: the store (``db``) and/or a ``trace``, the
    store's cluster, and the submit-time span [since, until)."""

    db: str | None
    trace: str | Path | None
    cluster: str | None
    since: float | None
    until: float | None


@dataclass(frozen=True)
class RolloutPlan:
    """The rollout windows chosen before any work, where their jobs came from (``origin``),
    the calibration they run with (learned profiles where jobs have them) and the shortfall
    against the windows asked for."""

    chosen: tuple[Window, ...]
    origin: Mapping[str, Any]
    calibration: Calibration
    counts: ProfileCounts
    shortfall: str | None


def _cluster_and_topology(
    db: str | None, topology: str | None, slurm_cluster: str | None
) -> tuple[str | None, Topology]:
    """The store's cluster (spans are named by it, given or not) and the topology: the one
    named, else the store's, else the default."""
    if db is not None:
        with closing(open_store(db)) as con:
            slurm_cluster = store_cluster(con, slurm_cluster)
    topo: Topology | None = load_topology(topology) if topology else None
    if topo is None and db is not None:
        with closing(open_store(db)) as con:
            topo = topology_from_store(con, slurm_cluster)
    if topo is None:
        topo = load_topology(DEFAULT_TOPOLOGY)
    return slurm_cluster, topo


def _topology_source(topo: Topology, spec: str | None) -> dict[str, Any]:
    return {"spec": spec, "name": topo.name, "nodes": len(topo.nodes), "gpus": topo.total_gpus}


def _plan_rollouts(
    span: Span,
    cal: Calibration,
    topo: Topology,
    rollouts: int | None,
    windows: Sequence[int] | None,
    window_s: float,
    min_jobs: int,
) -> RolloutPlan:
    """The jobs submitted in the span (from the trace, else the store) with their profiles,
    cut into windows, and the windows chosen (``build_dataset``'s ``rollouts``/``windows``);
    a ``ValueError`` when none is free."""
    if span.trace is not None:
        jobs = _submitted(jobs_from_trace(span.trace), span.since, span.until)
        origin: dict[str, Any] = {
            "trace": str(span.trace),
            "sha256": file_sha256(span.trace),
            "since": span.since,
            "until": span.until,
        }
    else:
        assert span.db is not None
        with closing(open_store(span.db)) as con:
            jobs = jobs_from_store(con, cluster=span.cluster, since=span.since, until=span.until)
        origin = {"db": span.db, "cluster": span.cluster, "since": span.since, "until": span.until}
    # profiles learned from the store's job telemetry before ``until`` where a job has one
    # (datasets.comm_profiles), the default mix elsewhere; no telemetry changes nothing
    book = EMPTY_BOOK
    if span.db is not None:
        with closing(open_store(span.db)) as con:
            book = load_profile_book(con, cluster=span.cluster, until=span.until)
    jobs, roll_cal, counts = apply_history_frame(jobs, cal, book)
    cut = cut_windows(jobs, window_s, max_gpus=topo.total_gpus)
    n = len(cut) if rollouts is None else rollouts
    chosen = choose_windows(cut, ids=windows, n=n, min_jobs=min_jobs)
    shortfall: str | None = None
    if not windows and rollouts is not None:
        supply = window_supply(cut, asked=rollouts, min_jobs=min_jobs, window_s=window_s)
        hint = "lower --window or --min-jobs, or widen --since/--until"
        if not supply.free:
            raise ValueError(supply.message(f"no rollout windows for --rollouts {n}", hint))
        if supply.missing:
            shortfall = supply.message(f"--rollouts {n}: {len(chosen)} windows rolled out", hint)
    return RolloutPlan(tuple(chosen), origin, roll_cal, counts, shortfall)


def _accounting_source(
    span: Span,
    frame: pl.DataFrame,
    log_report: Mapping[str, Any],
    log_window_s: float | None,
    seed: int,
) -> dict[str, Any]:
    """``sources["accounting"]``: the store, the span and the decision times it gave."""
    window = (
        frame.select(pl.col("time").min().alias("from"), pl.col("time").max().alias("to")).row(
            0, named=True
        )
        if frame.height
        else {"from": None, "to": None}
    )
    return {
        "db": span.db,
        "cluster": span.cluster or log_report.get("cluster"),
        "since": span.since,
        "until": span.until,
        "window_s": log_window_s,
        "decision_times": window,
        "profile_seed": seed,
    }


@dataclass(frozen=True)
class RolloutOptions:
    """How the chosen windows are rolled out (``build_dataset``'s arguments of that name)."""

    policies: tuple[PolicySpec, ...]
    epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    window_s: float
    block_s: float
    max_steps: int | None
    warm_start: bool
    executor: str
    batch: int


def _roll_out(
    plan: RolloutPlan,
    options: RolloutOptions,
    span: Span,
    topo: Topology,
    spec: ObsSpec,
    cal: Calibration,
    predictor: RuntimePredictor,
) -> tuple[pl.DataFrame, dict[str, Any], int]:
    """Every chosen window with every policy, epsilon and seed: the transitions, what
    ``sources["rollouts"]`` says of them, and how many episodes ran."""
    tasks = make_tasks(
        plan.chosen,
        options.policies,
        options.seeds,
        topo,
        epsilons=options.epsilons,
        config=spec.config,
        calibration=plan.calibration,
        block_s=options.block_s,
        max_steps=options.max_steps,
        backlogs=_backlogs(span, topo, plan.chosen, predictor) if options.warm_start else {},
        predictor=predictor,
        learned=resolve_learned(options.policies, spec, cal),
    )
    frame = run_rollouts(tasks, options.executor, batch=options.batch)
    source = {
        **plan.origin,
        "policies": [p.label for p in options.policies],
        "epsilons": [float(e) for e in options.epsilons],
        "seeds": [int(s) for s in options.seeds],
        "windows": [w.window_id for w in plan.chosen],
        "window_s": options.window_s,
        "block_s": options.block_s,
        "max_steps": options.max_steps,
        "warm_start": options.warm_start,
        "resampling": "block bootstrap of the window's arrivals (datasets.rollouts)",
        **({"profiles": plan.counts.to_dict()} if plan.counts.history else {}),
    }
    return frame, source, len(tasks)


def _backlogs(
    span: Span, topo: Topology, chosen: Sequence[Window], predictor: RuntimePredictor
) -> dict[int, Backlog]:
    """Per window, the accounting's running and queued jobs at its start (``warm_start``)."""
    assert span.db is not None
    with closing(open_store(span.db)) as con:
        return {
            w.window_id: backlog_from_store(con, topo, span.cluster, w.start, predictor)
            for w in chosen
        }


def _flow() -> Any:
    from prefect import flow  # Prefect (heavy, starts a server) only for a flow run

    return flow(name="build-dataset", validate_parameters=False)(build_dataset)


def build_dataset_flow(**kwargs: Any) -> dict[str, Any]:
    """``build_dataset`` as a Prefect flow run (same keyword arguments)."""
    with patient_prefect_server():
        result: dict[str, Any] = _flow()(**kwargs)
    return result


# ------------------------------------------------------------------------ edges and report


def resolve_learned(
    policies: Sequence[PolicySpec], spec: ObsSpec, calibration: Calibration | None = None
) -> dict[PolicySpec, LearnedPolicy]:
    """The learned behaviours among ``policies`` (``model:PATH``) loaded and verified at the
    pipeline's edge (``datasets`` never imports ``models``), once each: spec -> policy, each
    encoding with the rollouts' ``spec`` (PackageError for a package built for other
    observations)."""
    out: dict[PolicySpec, LearnedPolicy] = {}
    for policy in policies:
        if policy.source is not None and policy not in out:
            model = AnalyticModel(calibration if calibration is not None else load_calibration())
            out[policy] = load_source(policy.source, model=model, expected_obs_spec=spec.version)
    return out


def _counts(d: dict[str, Any]) -> dict[str, int]:
    return {k: int(d[k]) for k in ("declared", "history_name", "history_shape", "default")}


def format_report(m: dict[str, Any]) -> str:
    """The human-readable dataset report."""
    rep = m["report"]
    acts = rep["actions"]
    exact = rep["exact_match_share"]
    lines = [
        f"dataset {m['hash'][:16]}: {rep['transitions']} transitions, {rep['episodes']} episodes",
        f"  file: {m['path']}",
        f"  obs spec: {m['obs_spec_version']} ({m['obs_spec']['dim']} features, "
        f"{m['obs_spec']['n_actions']} actions)",
    ]
    pred = m.get("sources", {}).get("predictor")
    if pred:
        lines.append(
            f"  run-time predictor {pred['sha256'][:16]}: fit on {pred['n_jobs']} jobs submitted "
            f"before {pred['fit_until']:.0f}"
        )
    for src, c in rep["by_source"].items():
        lines.append(f"  {src}: {c['transitions']} transitions, {c['episodes']} episodes")
    roll = m.get("sources", {}).get("rollouts")
    if roll:
        lines.append(
            f"  rollouts: {len(roll['windows'])} windows x {len(roll['policies'])} policies x "
            f"{len(roll['epsilons'])} exploration rates x {len(roll['seeds'])} seeds"
        )
    note = (m.get("rollout_report") or {}).get("shortfall")
    if note:
        lines.extend("  " + part for part in textwrap.wrap(f"note: {note}", 118))
    lines.append(
        "  exact-match share: "
        + ("n/a" if exact is None else f"{exact:.1%}")
        + "".join(
            f"; {src} {v['exact_share']:.1%} of {v['starts']} starts"
            for src, v in rep["match_by_source"].items()
        )
    )
    log = m.get("log_report")
    if log and log.get("starts"):
        lines.append(
            f"  log starts: {log['exact_match_share']:.1%} exact of {log['starts']}, "
            f"{log['nearest']} nearest, {log['unslotted']} outside the slots (applied, no step)"
        )
    if m.get("profiles"):
        lines.append(f"  rollout jobs' {ProfileCounts(**_counts(m['profiles'])).line()}")
    top = ", ".join(f"{a}:{n}" for a, n in acts["top"])
    cand = ", ".join(f"{g} {n}" for g, n in acts["by_candidate"].items())
    lines += [
        f"  actions: wait {acts['wait_share']:.1%}, {acts['distinct']} distinct; top {top}",
        f"  starts by slot: {acts['by_slot']}",
        f"  starts by candidate: {cand}",
        f"  built in {m['seconds']:.1f} s ({m['transitions_per_s']:.0f} transitions/s)",
    ]
    if m.get("mlflow_run_id"):
        lines.append(f"  MLflow run: {m['mlflow_run_id']}")
    return "\n".join(lines)
