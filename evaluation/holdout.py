"""Held-out discipline: evaluation windows never overlap what a dataset was built from.

A dataset's manifest (``datasets.export``) names its sources: trace windows rolled out
(``sources.rollouts``: the trace's SHA-256 or the store it came from, the window ids and
``window_s``) and the accounting replayed (``sources.accounting``: the cluster, ``since`` /
``until`` and the decision times seen). ``dataset_spans`` turns them into absolute time
spans of a named workload source (``trace:SHA256`` or ``slurm:CLUSTER``); window ids are
turned back into times the way ``datasets.rollouts.cut_windows`` cut them (from the first
submit time of the jobs that fit the dataset's cluster).

``check_heldout`` refuses (``HoldoutError``, a ValueError) any evaluation span of the same
source that overlaps a dataset span; spans are half-open ``[start, end)``.
``overlaps_any`` tells which windows of a workload overlap something used (held-out
selection excludes them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from linkwise.datasets.export import file_sha256
from linkwise.datasets.rollouts import Window, jobs_from_store, jobs_from_trace
from linkwise.datasets.store import open_store

__all__ = [
    "HoldoutError",
    "Span",
    "check_heldout",
    "dataset_spans",
    "overlaps_any",
    "trace_source",
    "window_spans",
]


class HoldoutError(ValueError):
    """Evaluation data overlaps the data a policy was trained on (or cannot be checked)."""


@dataclass(frozen=True)
class Span:
    """``[start, end)`` of a workload source, with what it is (for reports and errors)."""

    source: str
    start: float
    end: float
    label: str

    def overlaps(self, other: Span) -> bool:
        return self.source == other.source and self.start < other.end and other.start < self.end

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trace_source(sha256: str) -> str:
    """The source name of a trace file by content."""
    return f"trace:{sha256}"


def window_spans(windows: Sequence[Window], source: str, label: str = "") -> list[Span]:
    """The spans of evaluation (or training) windows."""
    return [Span(source, w.start, w.end, f"{label}window {w.window_id}") for w in windows]


def _t0(jobs: pl.DataFrame, max_gpus: int | None) -> float:
    df = jobs if max_gpus is None else jobs.filter(pl.col("num_gpus") <= max_gpus)
    if df.is_empty():
        raise HoldoutError("the dataset's workload has no jobs: cannot place its windows")
    return float(df["submit_time"].min())  # type: ignore[arg-type]


def _rollout_jobs(
    roll: Mapping[str, Any], traces: Mapping[str, str | Path]
) -> tuple[str, pl.DataFrame]:

    if roll.get("trace") is not None:
        sha = str(roll.get("sha256", ""))
        path = traces.get(sha) or roll["trace"]
        if not Path(path).is_file():
            raise HoldoutError(
                f"the dataset was built from trace {roll['trace']} (sha256 {sha[:16]}), which "
                "is not here: pass it so its windows can be placed"
            )
        if sha and file_sha256(path) != sha:
            raise HoldoutError(f"{path} is not the trace the dataset was built from (sha256)")
        return trace_source(sha or file_sha256(path)), jobs_from_trace(path)

    with closing(open_store(roll["db"])) as con:
        jobs = jobs_from_store(
            con, cluster=roll.get("cluster"), since=roll.get("since"), until=roll.get("until")
        )
    return f"slurm:{roll.get('cluster') or ''}", jobs


def dataset_spans(
    manifest: Mapping[str, Any], *, traces: Mapping[str, str | Path] | None = None
) -> list[Span]:
    """Every time span a dataset was built from (see the module docstring). ``traces`` maps
    a trace's SHA-256 to where it is now, when not at the path the manifest recorded."""
    sources = manifest.get("sources", {})
    short = str(manifest.get("hash", ""))[:16]
    out: list[Span] = []
    roll = sources.get("rollouts")
    if roll:
        source, jobs = _rollout_jobs(roll, traces or {})
        gpus = sources.get("topology", {}).get("gpus")
        t0 = _t0(jobs, int(gpus) if gpus is not None else None)
        ws = float(roll["window_s"])
        out += [
            Span(source, t0 + w * ws, t0 + (w + 1) * ws, f"dataset {short} rollout window {w}")
            for w in roll.get("windows", [])
        ]
    acc = sources.get("accounting")
    if acc:
        seen = acc.get("decision_times") or {}
        start = acc.get("since") if acc.get("since") is not None else seen.get("from")
        end = acc.get("until") if acc.get("until") is not None else seen.get("to")
        if start is not None and end is not None:
            # decision times are instants: the last one is inside the span
            out.append(
                Span(
                    f"slurm:{acc.get('cluster') or ''}",
                    float(start),
                    float(end) + (1e-6 if acc.get("until") is None else 0.0),
                    f"dataset {short} accounting",
                )
            )
    return out


def check_heldout(evaluation: Sequence[Span], used: Sequence[Span]) -> None:
    """Raise HoldoutError naming every evaluation span that overlaps a used one."""
    clashes = [(e, u) for e in evaluation for u in used if e.overlaps(u)]
    if clashes:
        lines = "; ".join(
            f"{e.label} [{e.start:.0f}, {e.end:.0f}) overlaps "
            f"{u.label} [{u.start:.0f}, {u.end:.0f})"
            for e, u in clashes[:5]
        )
        more = f" (and {len(clashes) - 5} more)" if len(clashes) > 5 else ""
        raise HoldoutError(
            f"evaluation data overlaps the training data of {evaluation[0].source}: {lines}{more}"
        )


def overlaps_any(source: str, used: Sequence[Span]) -> Callable[[Window], bool]:
    """Whether a window of ``source`` overlaps any ``used`` span (what held-out selection
    excludes, ``datasets.windows.choose_windows``)."""

    def overlaps(w: Window) -> bool:
        return any(s.overlaps(Span(source, w.start, w.end, "")) for s in used)

    return overlaps
