"""Which windows of a workload a run uses: the one place that selects them, for dataset
rollouts, evaluation (held-out windows) and PPO's training windows.

Windows are cut by ``datasets.rollouts.cut_windows``; ``choose_windows`` picks from them by
id, or ``n`` eligible ones (at least ``min_jobs`` jobs, not ``excluded``) either spread evenly
over the workload or the last ones in time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from linkwise.datasets.rollouts import Window

__all__ = ["choose_windows", "spread_windows"]


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
