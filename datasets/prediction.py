"""One run-time predictor per run, carried everywhere it is used (``docs/INFORMATION.md``).

A policy never reads a job's true run time (``Job.duration``, the simulator's alone); it
reads the predictions ``Job.pred_s`` / ``pred_hi_s`` that a ``RuntimePredictor`` fit on
history before the span it is used on sets (``datasets.predictor``). This module is how that
one predictor travels:

- ``load_history`` / ``predictor_from_history`` / ``fit_history``: a history file (a trace or
  a DuckDB store) and a predictor fit on its jobs before a time, or before an evaluated
  workload on another file's clock (``--history``);
- ``predictor_record`` / ``predictor_from_record``: the predictor as a manifest entry (its
  JSON with its SHA-256 and fit span), what a dataset's manifest and a PPO workload manifest
  hold, and what a learned package's ``predictor.json`` is written from
  (``predictor_from_manifest``);
- ``canonical_bytes``: the one serialisation, so the digest in a manifest is the SHA-256 of
  the ``predictor.json`` file;
- ``ensure_predicted`` / ``annotate_state``: annotate what has no predictions yet (jobs
  already annotated keep theirs, so one predictor set upstream is never replaced);
- ``shift_running``: the prediction of a job that has run ``elapsed`` seconds and restarts in
  a warm-started simulator with its attained service reset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import ClusterState, Job
from linkwise.datasets.predictor import RuntimePredictor

__all__ = [
    "RECORD_FORMAT",
    "History",
    "annotate_state",
    "canonical_bytes",
    "ensure_predicted",
    "fit_history",
    "is_store",
    "load_history",
    "predictor_digest",
    "predictor_from_history",
    "predictor_from_manifest",
    "predictor_from_record",
    "predictor_record",
    "read_predictor",
    "shift_running",
    "write_predictor",
]

RECORD_FORMAT = "linkwise-predictor-record/1"


def canonical_bytes(predictor: RuntimePredictor) -> bytes:
    """The predictor's JSON, sorted and compact: what ``predictor.json`` holds and its digest
    is taken of."""
    return json.dumps(predictor.to_json(), sort_keys=True, separators=(",", ":")).encode()


def predictor_digest(predictor: RuntimePredictor) -> str:
    """SHA-256 of ``canonical_bytes``."""
    return hashlib.sha256(canonical_bytes(predictor)).hexdigest()


def predictor_record(
    predictor: RuntimePredictor, source: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest entry of a predictor: its digest, fit span, size, what it was fit on
    (``source``) and the predictor itself."""
    return {
        "format": RECORD_FORMAT,
        "sha256": predictor_digest(predictor),
        "fit_from": predictor.fit_from,
        "fit_until": predictor.fit_until,
        "n_jobs": predictor.n_jobs,
        "quantiles": list(predictor.quantiles),
        "source": dict(source or {}),
        "predictor": predictor.to_json(),
    }


def predictor_from_record(record: Mapping[str, Any]) -> RuntimePredictor:
    """The predictor of a manifest entry; ValueError when its digest does not match."""
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a predictor record of format {RECORD_FORMAT}")
    predictor = RuntimePredictor.from_json(record["predictor"])
    if predictor_digest(predictor) != record.get("sha256"):
        raise ValueError("the predictor record's SHA-256 does not match its predictor")
    return predictor


def predictor_from_manifest(manifest: Mapping[str, Any]) -> RuntimePredictor | None:
    """The predictor a dataset manifest (``sources.predictor``) or a PPO workload manifest
    (``predictor``) records; None when it records none."""
    sources = manifest.get("sources")
    record = sources.get("predictor") if isinstance(sources, Mapping) else None
    if record is None:
        record = manifest.get("predictor")
    return None if record is None else predictor_from_record(record)


def write_predictor(predictor: RuntimePredictor, path: str | Path) -> Path:
    """Write ``canonical_bytes`` to ``path``."""
    p = Path(path)
    p.write_bytes(canonical_bytes(predictor))
    return p


def read_predictor(path: str | Path) -> RuntimePredictor:
    """A predictor JSON file (``write_predictor``, or any ``to_json`` dump)."""
    return RuntimePredictor.from_json(json.loads(Path(path).read_text()))


def ensure_predicted(jobs: Iterable[Job], predictor: RuntimePredictor | None) -> tuple[Job, ...]:
    """The jobs, those without predictions annotated by ``predictor`` (unchanged when None)."""
    out = tuple(jobs)
    if predictor is None or all(j.predicted for j in out):
        return out
    missing = [j for j in out if not j.predicted]
    done = iter(predictor.annotate(missing))
    return tuple(j if j.predicted else next(done) for j in out)


def annotate_state(state: ClusterState, predictor: RuntimePredictor | None) -> ClusterState:
    """The state with its pending and running jobs annotated where they have no predictions
    (the same state when nothing needs it)."""
    if predictor is None:
        return state
    if all(p.job.predicted for p in state.pending) and all(r.job.predicted for r in state.running):
        return state
    pending = ensure_predicted((p.job for p in state.pending), predictor)
    running = ensure_predicted((r.job for r in state.running), predictor)
    return replace(
        state,
        pending=tuple(replace(p, job=j) for p, j in zip(state.pending, pending, strict=True)),
        running=tuple(replace(r, job=j) for r, j in zip(state.running, running, strict=True)),
    )


def shift_running(job: Job, elapsed: float) -> Job:
    """A predicted job that has run ``elapsed`` seconds, as a warm start restarts it (its
    attained service reset): the predictions less ``elapsed``, at least a second."""
    if not job.predicted:
        return job
    lo = max(1.0, job.pred_s - elapsed)
    return replace(job, pred_s=lo, pred_hi_s=max(lo, job.pred_hi_s - elapsed))


# ------------------------------------------------------------------------ history files

_DUCKDB_MAGIC = b"DUCK"


def is_store(path: str | Path) -> bool:
    """Whether ``path`` is a DuckDB store, not a trace: its header when the file exists, its
    suffix (``.duckdb``, ``.db``) otherwise."""
    p = Path(path)
    if not p.is_file():
        return p.suffix in (".duckdb", ".db")
    with p.open("rb") as f:
        head = f.read(16)
    return head[8:12] == _DUCKDB_MAGIC


@dataclass(frozen=True)
class History:
    """Past jobs and where their clock starts: ``origin_epoch`` is the absolute time (Unix
    seconds) of submit time 0, None when the source has no dated times."""

    jobs: tuple[Job, ...]
    origin_epoch: float | None
    source: str


def load_history(
    path: str | Path, fmt: str = "auto", *, slurm_cluster: str | None = None
) -> History:
    """The finished jobs of a trace file or a DuckDB store (the accounting of
    ``slurm_cluster``, every cluster when None), with users, names and time limits."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"history: no such file: {p}")
    if is_store(p):
        from linkwise.datasets.rollouts import jobs_from_store
        from linkwise.datasets.store import open_store
        from linkwise.datasets.traces import frame_jobs

        with closing(open_store(str(p))) as con:
            jobs = frame_jobs(jobs_from_store(con, cluster=slurm_cluster))
        return History(jobs=jobs, origin_epoch=0.0, source=f"store {p}")
    from linkwise.datasets.traces import load_trace

    trace = load_trace(p, fmt)
    return History(jobs=trace.jobs, origin_epoch=trace.origin_epoch, source=str(p))


def predictor_from_history(
    path: str | Path,
    *,
    until: float | None = None,
    cluster: str | None = None,
    trace_format: str = "auto",
) -> RuntimePredictor:
    """A predictor fit on a history's jobs submitted before ``until`` (on the history's own
    clock; all when None); ValueError when it holds none."""
    jobs = load_history(path, trace_format, slurm_cluster=cluster).jobs
    before = [j for j in jobs if until is None or j.submit_time < until]
    if not before:
        raise ValueError(f"{path}: no finished job before {until} to fit a run-time predictor on")
    return RuntimePredictor.fit(before, until=until)


def fit_history(
    history: History,
    *,
    first_submit: float,
    origin_epoch: float | None,
    evaluated_source: str | None = None,
) -> tuple[RuntimePredictor, dict[str, Any]]:
    """A predictor fit on the history's jobs submitted before an evaluated workload's first
    submit time (``first_submit`` on a clock starting at ``origin_epoch``; on the history's
    own clock when ``evaluated_source`` is the history's file), and what was done, for the
    output. A history without dated times cannot be aligned: all its jobs are used and the
    output says so."""
    info: dict[str, Any] = {"history": history.source}
    same = evaluated_source is not None and (
        Path(evaluated_source).resolve() == Path(history.source).resolve()
    )
    until: float | None
    if same:  # one file, one clock, dated or not
        until = first_submit
    elif history.origin_epoch is not None and origin_epoch is not None:
        until = origin_epoch + first_submit - history.origin_epoch
    else:
        until = None
        info["history_note"] = (
            "times not dated: every history job is taken as submitted before the evaluated ones"
        )
    before = [j for j in history.jobs if until is None or j.submit_time < until]
    if not before:
        raise ValueError(
            f"--history {history.source}: none of its {len(history.jobs)} jobs was submitted "
            "before the evaluated workload's first job (the predictor is fit only on the past)"
        )
    predictor = RuntimePredictor.fit(before, until=until)
    info.update(
        history_jobs=len(before),
        history_jobs_left_out=len(history.jobs) - len(before),
        predictor_fit_until=predictor.fit_until,
    )
    return predictor, info
