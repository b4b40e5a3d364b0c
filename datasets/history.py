"""The history a run-time predictor is fit on (``datasets.prediction`` carries the fitted
one): ``load_history`` reads a history file (a trace or a DuckDB store's accounting),
``predictor_from_history`` fits a predictor on its jobs before a time, ``fit_history`` before
an evaluated workload on another file's clock (``--history``)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Job
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import frame_jobs, load_trace

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
        with closing(open_store(str(p))) as con:
            jobs = frame_jobs(jobs_from_store(con, cluster=slurm_cluster))
        return History(jobs=jobs, origin_epoch=0.0, source=f"store {p}")
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
