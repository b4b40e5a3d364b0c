"""Run-time predictions for an evaluated workload, fit only on its history (``--history``).

A policy may know what a real Slurm knows at a decision (``datasets.predictor``): never the
true run time, but the run times of jobs submitted before. ``load_history`` reads a history
(a trace file in any format ``datasets.traces`` reads, or a DuckDB store of accounting) and
``fit_history`` fits a ``RuntimePredictor`` on its jobs submitted strictly before the first
evaluated job, so no evaluated job's run time is ever used. Times are aligned through the
absolute time of each source: a dated trace's ``origin_epoch``, a store's epoch seconds. A
history without dated times (Alibaba's own clock) cannot be aligned: all its jobs are used
and the caller is told so (a history that is the evaluated file itself shares its clock:
only its jobs before the evaluated ones are used).

``prediction_source`` says where a policy's predictions come from: a learned package's own
predictor (the one it was trained with) wins; otherwise the history's, which a policy that
needs predictions (``qssf``, a learned package without one) must have.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Job
from linkwise.cluster.heuristics import MissingPredictions, needs_predictions
from linkwise.datasets.predictor import RuntimePredictor

__all__ = [
    "History",
    "check_predictions",
    "fit_history",
    "is_store",
    "load_history",
    "package_predictor",
    "prediction_source",
]

_DUCKDB_MAGIC = b"DUCK"


def is_store(path: str | Path) -> bool:
    """Whether ``path`` is a DuckDB file (its header, not its name, decides)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as handle:
        head = handle.read(16)
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
    """The jobs of a trace file or a DuckDB store (finished jobs of ``slurm_cluster``, all
    clusters when None)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--history: no such file: {p}")
    if is_store(p):
        from linkwise.datasets.rollouts import jobs_from_store
        from linkwise.datasets.store import open_store
        from linkwise.datasets.traces import frame_jobs

        with closing(open_store(p)) as con:
            jobs = frame_jobs(jobs_from_store(con, cluster=slurm_cluster))
        return History(jobs=jobs, origin_epoch=0.0, source=f"store {p}")
    from linkwise.datasets.traces import load_trace

    trace = load_trace(p, fmt)
    return History(jobs=trace.jobs, origin_epoch=trace.origin_epoch, source=str(p))


def fit_history(
    history: History,
    *,
    first_submit: float,
    origin_epoch: float | None,
    evaluated_source: str | None = None,
) -> tuple[RuntimePredictor, dict[str, Any]]:
    """A predictor fit on the history's jobs submitted before the evaluated workload's first
    submit time (``first_submit`` on a clock starting at ``origin_epoch``; on the history's
    own clock when ``evaluated_source`` is the history's file), and what was done, for the
    output."""
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


def package_predictor(policy: Any) -> RuntimePredictor | None:
    """The run-time predictor a learned package carries (``policy.predictor``), if any."""
    found = getattr(policy, "predictor", None)
    return found if isinstance(found, RuntimePredictor) else None


def prediction_source(spec: str, policy: Any, history: bool) -> str | None:
    """Where the predictions a policy sees come from: ``"package"`` (a learned package's own
    predictor), ``"history"`` (``--history``) or None (no predictions)."""
    if package_predictor(policy) is not None:
        return "package"
    return "history" if history else None


def check_predictions(
    specs: Sequence[str], policies: Sequence[Any], history: bool, *, learned: bool = True
) -> None:
    """Refuse (``MissingPredictions``, a ValueError) before any simulation a policy that
    needs run-time predictions and would get none: ``qssf`` without ``--history``, or (with
    ``learned``, what the commands check) a learned package without its own predictor and
    without ``--history``."""
    for spec, policy in zip(specs, policies, strict=True):
        if history or package_predictor(policy) is not None:
            continue
        is_model = spec.strip().startswith("model:")
        if needs_predictions(spec) or (learned and is_model):
            learned_text = "its package carries no run-time predictor, so it"
            what = learned_text if is_model else "it"
            raise MissingPredictions(
                f"{spec} orders jobs by predicted run time and {what} needs --history PATH: "
                "a trace file or DuckDB store of jobs submitted before the evaluated ones, "
                "to fit the run-time predictor on (never on the evaluated jobs)"
            )
