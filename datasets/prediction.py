"""One run-time predictor per run, carried everywhere it is used (``docs/INFORMATION.md``).

A policy never reads a job's true run time (``Job.duration``, the simulator's alone); it
reads the predictions ``Job.pred_s`` / ``pred_hi_s`` that a ``RuntimePredictor`` fit on
history before the span it is used on sets (``datasets.predictor``). This module is how that
one predictor travels:

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
from dataclasses import replace
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import ClusterState, Job
from linkwise.datasets.predictor import RuntimePredictor

__all__ = [
    "RECORD_FORMAT",
    "annotate_state",
    "canonical_bytes",
    "ensure_predicted",
    "predictor_digest",
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
