"""Which windows of a workload a run uses: the one place that selects them, for dataset
rollouts, evaluation (held-out windows) and PPO's training windows.

Windows are cut by ``datasets.rollouts.cut_windows``; ``choose_windows`` picks from them by
id, or ``n`` eligible ones (at least ``min_jobs`` jobs, not ``excluded``) either spread evenly
over the workload or the last ones in time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.metrics import duration_text
from linkwise.datasets.rollouts import Window

__all__ = ["WindowSupply", "choose_windows", "spread_windows", "window_supply"]


@dataclass(frozen=True)
class WindowSupply:
    """How many windows a workload offers a run that asks for ``asked`` of them: the history
    needed, stated up front (issue 32 item 2). ``cut``: windows with any job; ``busy``: with at
    least ``min_jobs`` jobs; ``free``: busy and not excluded (not overlapping the training
    data); ``jobs`` and ``span_s``: the workload's jobs and its submit span."""

    asked: int
    cut: int
    busy: int
    free: int
    window_s: float
    min_jobs: int
    jobs: int
    span_s: float

    @property
    def missing(self) -> int:
        """Windows short of ``asked``."""
        return max(0, self.asked - self.free)

    def message(self, what: str, hint: str = "") -> str:
        """One sentence: what was asked, what the workload has, what is missing and (``hint``)
        what else to do."""
        window = duration_text(self.window_s)
        have = (
            f"the history has {self.jobs} jobs over {duration_text(self.span_s)} "
            f"({self.cut} windows of {window} with jobs, {self.busy} with at least "
            f"{self.min_jobs} jobs"
            + (
                f", {self.busy - self.free} of them overlapping the training data"
                if self.busy > self.free
                else ""
            )
            + f"): {self.free} usable"
        )
        if not self.missing:
            return f"{what}: {self.asked} windows asked, {have}"
        rate = self.jobs / self.span_s if self.span_s > 0 else 0.0
        more_s = self.missing * self.window_s
        need_jobs = self.missing * self.min_jobs
        pace = (
            f" (at its pace of {rate * 86400.0:.0f} jobs a day, about "
            f"{duration_text(max(more_s, need_jobs / rate))} more)"
            if rate > 0 and math.isfinite(rate)
            else ""
        )
        return (
            f"{what}: {self.asked} windows of {window} with at least {self.min_jobs} jobs "
            f"asked, {have}; {self.missing} more windows missing: at least "
            f"{duration_text(more_s)} and {need_jobs} more jobs of history{pace}"
            + (f"; {hint}" if hint else "")
        )


def window_supply(
    windows: Sequence[Window],
    *,
    asked: int,
    min_jobs: int,
    window_s: float,
    excluded: Callable[[Window], bool] | None = None,
) -> WindowSupply:
    """What ``windows`` (``cut_windows``' output, every window with a job) offer a run asking
    for ``asked`` windows of ``min_jobs`` jobs (pure)."""
    busy = [w for w in windows if len(w.jobs) >= min_jobs]
    free = [w for w in busy if excluded is None or not excluded(w)]
    submits = [j.submit_time for w in windows for j in w.jobs]
    return WindowSupply(
        asked=asked,
        cut=len(windows),
        busy=len(busy),
        free=len(free),
        window_s=window_s,
        min_jobs=min_jobs,
        jobs=len(submits),
        span_s=(max(submits) - min(submits)) if submits else 0.0,
    )


def spread_windows(windows: Sequence[Window], n: int) -> list[Window]:
    """``n`` of ``windows`` evenly spread over them: the middle one of each of ``n`` equal
    runs (deterministic; all of them when there are fewer)."""
    if n <= 0 or not windows:
        return []
    k = min(n, len(windows))
    return [windows[int((i + 0.5) * len(windows) / k)] for i in range(k)]


def choose_windows(
    windows: Sequence[Window],
    *,
    ids: Sequence[int] | None = None,
    n: int = 0,
    min_jobs: int = 1,
    excluded: Callable[[Window], bool] | None = None,
    where: Literal["spread", "last"] = "spread",
) -> list[Window]:
    """The windows a run uses. With ``ids``: exactly those, in time order (ValueError naming
    any that ``windows`` lacks). Otherwise ``n`` of the eligible windows (at least
    ``min_jobs`` jobs, not ``excluded``), spread evenly (``"spread"``) or the last ones in time
    (``"last"``)."""
    if ids:
        wanted = set(ids)
        chosen = [w for w in windows if w.window_id in wanted]
        missing = sorted(wanted - {w.window_id for w in chosen})
        if missing:
            raise ValueError(f"no jobs in windows {missing}")
        return chosen
    eligible = [
        w for w in windows if len(w.jobs) >= min_jobs and (excluded is None or not excluded(w))
    ]
    if where == "last":
        return eligible[-n:] if n > 0 else []
    return spread_windows(eligible, n)
