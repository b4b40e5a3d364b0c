"""The bounds of the three fits, and what a fitted value at one of them means."""

from __future__ import annotations

from collections.abc import Sequence

# Bounds of the fits: compute_s, grad_gb and scale of stage 1 (log space), overhead_s (s),
# alpha (stage 2), and the floor of a Pollux compute_s (stage 3). The parameter report
# (``parameter_report``) says which fitted values sit at one, and why.
PROFILE_BOUNDS = (1e-9, 1e6)
OVERHEAD_BOUNDS = (0.0, 10.0)
ALPHA_BOUNDS = (0.0, 100.0)
POLLUX_COMPUTE_FLOOR = 1e-6


def snap_to_zero(x: float) -> float:
    """A parameter the optimiser pinned to its lower bound of 0 is exactly 0."""
    return 0.0 if x < 1e-9 else x


def at_bound(value: float, bounds: Sequence[float | None], rel: float = 1e-6) -> bool:
    """Whether ``value`` sits on either end of ``bounds`` (None: unbounded on that side)."""
    lo, hi = bounds
    if lo is not None and value <= lo + rel * max(abs(lo), 1e-12):
        return True
    return hi is not None and value >= hi - rel * abs(hi)
