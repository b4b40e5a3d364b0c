"""The least squares of the contention fit: per job name its starting profile
(``fit_profiles``), where each parameter sits in the fit's vector (``Layout``), the observed
means (``observations``), the solution with its standard errors (``solve``: Jacobian and
bootstrap; ``covariance``), the time unit that pins the overhead best (``best_reference``)
and a parameter's status from its standard error (``parameter_status``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl
from scipy.optimize import least_squares

from linkwise.cluster.calibration.bounds import ALPHA_BOUNDS, OVERHEAD_BOUNDS, PROFILE_BOUNDS
from linkwise.cluster.profiles import Calibration
from linkwise.datasets.comm_profiles import ProfileBook, learn_profiles
from linkwise.datasets.contention_fit.data import FloatArray, IntArray
from linkwise.datasets.contention_fit.terms import ContentionTerms

__all__ = [
    "BOOTSTRAP",
    "DETERMINED_REL",
    "PRIOR_WEIGHT",
    "RHO_BOUNDS",
    "Layout",
    "Profiles",
    "Solution",
    "best_reference",
    "covariance",
    "fit_profiles",
    "observations",
    "parameter_status",
    "solve",
    "standard_errors",
]

DETERMINED_REL = 0.03
"""A parameter whose standard error is within this share of its value is determined (three
standard errors inside the issue's 10%: the residuals of one run are not independent, and
on the hidden truth two standard errors were exceeded)."""
BOOTSTRAP = 20
"""Refits on runs drawn with replacement behind each standard error (``solve``)."""
WEAK_REL = 0.5
"""Beyond this relative standard error a parameter is held by its start, not the data."""
PRIOR_WEIGHT = 0.003
"""Weight of the log-space prior holding each fitted compute time and gradient per compute
second to its start (``comm_profiles``' value): negligible beside any data that see it
(well under 1% of the curvature of a determined one), it keeps a parameter the data do not
see where it started instead of letting it drift to a bound."""
RHO_BOUNDS = (1e-6, 1e4)
"""Bounds of a fitted gradient per compute second, GB/s."""
OVERHEAD_STARTS = (0.0, 0.003, 0.03)
"""Starting overheads of the multi-start fit, as shares of the reference compute time."""


@dataclass
class Profiles:
    """Per job name: the profile index, the start values, what is fitted."""

    names: list[str]
    compute0: FloatArray
    rho0: FloatArray
    rho_known: npt.NDArray[np.bool_]
    runs: list[int]
    fallback: int  # index of the profile of runs without a learned one
    book: ProfileBook


def fit_profiles(train: pl.DataFrame, telemetry: pl.DataFrame, min_gpu_s: float) -> Profiles:
    """One profile per job name with an observed run in ``train`` (compute time and gradient
    per compute second from ``comm_profiles`` over ``telemetry`` where it learned one, else
    from the runs' activity and the median gradient), and one fixed fallback (the medians)
    for the rest. The first is the reference: among the names ``comm_profiles`` learned,
    the one with the most multi-node runs (its compute time against the overhead sets the
    overhead in the time unit), else the one with the most runs."""
    book = learn_profiles(telemetry, min_runs=1, min_gpu_s=min_gpu_s)
    observed = train.filter(
        (pl.col("activity_alone_gpu_s") >= min_gpu_s)
        | (pl.col("activity_beside_gpu_s") >= min_gpu_s)
    )
    counts = (
        observed.group_by("name")
        .agg(pl.len().alias("runs"), (pl.col("nodes").list.len() > 1).sum().alias("multi"))
        .sort(["runs", "name"], descending=[True, False])
    )
    names = [str(n) for n in counts["name"] if str(n)]
    multi = dict(zip(counts["name"].cast(pl.String), counts["multi"], strict=True))
    learned_names = sorted((n for n in names if n in book.by_name), key=lambda n: -int(multi[n]))
    if learned_names:
        names.remove(learned_names[0])
        names.insert(0, learned_names[0])
    rhos = [p.rho_gb for p in book.by_name.values()]
    rho_med = float(np.median(rhos)) if rhos else 1.0
    compute, rho, known, runs = [], [], [], []
    for name in names:
        learned = book.by_name.get(name)
        mine = observed.filter(pl.col("name") == name)
        act = pl.concat([mine["activity_alone"].drop_nulls(), mine["activity_beside"].drop_nulls()])
        if learned is not None:
            compute.append(learned.profile.compute_s)
            rho.append(learned.rho_gb)
            known.append(True)
        else:
            compute.append(float(act.median()) if act.len() else 0.5)  # type: ignore[arg-type]
            rho.append(rho_med)
            known.append(False)
        runs.append(mine.height)
    compute.append(float(np.median(compute)) if compute else 0.5)
    rho.append(rho_med)
    known.append(True)
    runs.append(0)
    return Profiles(
        names=names,
        compute0=np.asarray(compute, dtype=np.float64),
        rho0=np.asarray(rho, dtype=np.float64),
        rho_known=np.asarray(known, dtype=bool),
        runs=runs,
        fallback=len(names),
        book=book,
    )


@dataclass(frozen=True)
class Layout:
    """Where each parameter sits in the fit's vector."""

    ref: int  # profile whose compute time is fixed
    compute: tuple[int, ...]  # profiles with a fitted compute time (log)
    rho: tuple[int, ...]  # profiles with a fitted gradient per compute second (log)

    @property
    def size(self) -> int:
        return 2 + len(self.compute) + len(self.rho)

    def unpack(self, x: FloatArray, prof: Profiles) -> tuple[float, float, FloatArray, FloatArray]:
        c = prof.compute0.copy()
        rho = prof.rho0.copy()
        c[list(self.compute)] = np.exp(x[2 : 2 + len(self.compute)])
        rho[list(self.rho)] = np.exp(x[2 + len(self.compute) :])
        return float(x[0]), float(x[1]), c, rho * c


def observations(
    runs: pl.DataFrame, mask: pl.Expr, min_gpu_s: float
) -> tuple[IntArray, FloatArray, IntArray, FloatArray]:
    """Indices and observed means of the runs under ``mask`` with enough activity alone, and
    likewise beside others."""
    idx = runs.with_row_index("_i").filter(mask & pl.col("summarized"))
    alone = idx.filter(pl.col("activity_alone_gpu_s") >= min_gpu_s)
    beside = idx.filter(pl.col("activity_beside_gpu_s") >= min_gpu_s)
    return (
        alone["_i"].to_numpy().astype(np.int64),
        alone["activity_alone"].to_numpy().astype(np.float64),
        beside["_i"].to_numpy().astype(np.int64),
        beside["activity_beside"].to_numpy().astype(np.float64),
    )


def covariance(
    jac: FloatArray, s2: float, scale: FloatArray, *, rcond: float = 1e-9
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """The parameters' covariance in units of their ``scale`` (what a relative change means
    for each), from the Jacobian of the residuals at the solution: ``s2`` (the residuals'
    variance) times the inverse normal matrix, by the SVD of the Jacobian in those units;
    and which parameters lie in a direction the data do not see (singular value below
    ``rcond`` of the largest): their error is infinite (a pseudo-inverse would give them
    none)."""
    _, sv, vt = np.linalg.svd(jac * scale, full_matrices=False)
    blind = sv <= rcond * (sv.max() if sv.size else 0.0)
    inv = np.where(blind, 0.0, 1.0 / np.where(blind, 1.0, sv) ** 2)
    cov: FloatArray = s2 * (vt.T * inv) @ vt
    unseen: npt.NDArray[np.bool_] = np.asarray(((vt**2 > 1e-6) & blind[:, None]).any(axis=0))
    return cov, unseen


def standard_errors(
    jac: FloatArray, s2: float, scale: FloatArray, *, rcond: float = 1e-9
) -> FloatArray:
    """Each parameter's standard error relative to its ``scale`` (``covariance``; infinite
    for one the data do not see)."""
    cov, unseen = covariance(jac, s2, scale, rcond=rcond)
    out: FloatArray = np.where(unseen, np.inf, np.sqrt(np.clip(np.diag(cov), 0.0, None)))
    return out


def parameter_status(rel: float, held: str, runs_note: str) -> tuple[str, str]:
    """Status and reason of a parameter from its relative standard error: determined,
    weakly determined, or (beyond ``WEAK_REL``) constrained by what ``held`` says holds
    it."""
    err = "no" if math.isinf(rel) else f"{rel:.1%}"
    if rel <= DETERMINED_REL:
        return "determined", f"by {runs_note} (standard error {err})"
    if rel <= WEAK_REL:
        return "weakly determined", f"{runs_note} leave it loose (standard error {err})"
    return "constrained", f"{held}: the data do not determine it (standard error {err})"


@dataclass(frozen=True)
class Solution:
    """One least-squares solution with ``layout.ref`` as the time unit."""

    layout: Layout
    x: FloatArray
    cov: FloatArray  # in the units of ``scale``
    se: FloatArray  # relative standard errors (inf: unseen)
    rms: float  # of the data residuals


def solve(
    terms: ContentionTerms,
    prof: Profiles,
    ref: int,
    obs: tuple[IntArray, FloatArray, IntArray, FloatArray],
    shipped: Calibration,
    start: Solution | None,
    bootstrap: int = 0,
) -> Solution:
    """Least squares of the log activity means with profile ``ref``'s compute time fixed;
    from a few overheads, or from ``start`` rescaled to this time unit. Standard errors:
    from the Jacobian, and with ``bootstrap`` > 0 the larger of that and the spread of as
    many refits on runs drawn with replacement (a run's residuals are not independent, and
    a curved valley is wider than its tangent says)."""
    a_idx, a_obs, b_idx, b_obs = obs
    n_obs = len(a_idx) + len(b_idx)
    layout = Layout(
        ref=ref,
        compute=tuple(i for i in range(len(prof.names)) if i != ref),
        rho=tuple(i for i in range(len(prof.names)) if not prof.rho_known[i]),
    )
    nc = len(layout.compute)
    x_base = np.concatenate(
        [
            [shipped.alpha, shipped.overhead_s],
            np.log(prof.compute0[list(layout.compute)]),
            np.log(prof.rho0[list(layout.rho)]),
        ]
    )
    lo = np.concatenate(
        [
            [ALPHA_BOUNDS[0], OVERHEAD_BOUNDS[0]],
            np.full(nc, math.log(PROFILE_BOUNDS[0])),
            np.full(len(layout.rho), math.log(RHO_BOUNDS[0])),
        ]
    )
    hi = np.concatenate(
        [
            [ALPHA_BOUNDS[1], OVERHEAD_BOUNDS[1]],
            np.full(nc, math.log(PROFILE_BOUNDS[1])),
            np.full(len(layout.rho), math.log(RHO_BOUNDS[1])),
        ]
    )

    weights = np.ones(n_obs)

    def residuals(x: FloatArray) -> FloatArray:
        alpha, over, c, g = layout.unpack(x, prof)
        pa, pb = terms.means(terms.activity(alpha, over, c, g))
        prior = PRIOR_WEIGHT * (x[2:] - x_base[2:])
        data = np.concatenate([np.log(a_obs / pa[a_idx]), np.log(b_obs / pb[b_idx])])
        return np.concatenate([data * weights, prior])

    c_ref = float(prof.compute0[ref])
    starts = []
    if start is None:
        for share in OVERHEAD_STARTS:
            x0 = x_base.copy()
            x0[1] = share * c_ref
            starts.append(np.clip(x0, lo, hi))
    else:  # the same solution in this time unit: every time x c_ref / its fitted value
        alpha, over, c, g = start.layout.unpack(start.x, prof)
        lam = c_ref / c[ref]
        x0 = np.concatenate(
            [
                [alpha, over * lam],
                np.log(c[list(layout.compute)] * lam),
                np.log((g / c)[list(layout.rho)]),
            ]
        )
        starts.append(np.clip(x0, lo, hi))
    sols = [
        least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", xtol=1e-10, ftol=1e-10)
        for x0 in starts
    ]
    sol = min(sols, key=lambda r: float(r.cost))
    res = np.asarray(sol.fun, dtype=np.float64)[:n_obs]
    s2 = float(res @ res) / max(1, n_obs - layout.size)
    alpha, over, _, _ = layout.unpack(sol.x, prof)
    scale = np.ones(layout.size)
    scale[0], scale[1] = max(alpha, 0.05), max(over, 1e-3 * c_ref)
    jac = np.asarray(sol.jac, dtype=np.float64)[:n_obs]
    cov, unseen = covariance(jac, s2, scale)
    se = np.where(unseen, np.inf, np.sqrt(np.clip(np.diag(cov), 0.0, None)))
    if bootstrap > 0:
        owner = np.concatenate([a_idx, b_idx])
        members = np.unique(owner)
        rng = np.random.default_rng(0)
        draws = []
        for _ in range(bootstrap):
            picked = np.bincount(
                np.searchsorted(members, rng.choice(members, size=members.size)),
                minlength=members.size,
            )
            weights = np.sqrt(picked[np.searchsorted(members, owner)].astype(np.float64))
            again = least_squares(
                residuals, sol.x, bounds=(lo, hi), x_scale="jac", xtol=1e-8, ftol=1e-8
            )
            draws.append((np.asarray(again.x) - sol.x) / scale)
        weights = np.ones(n_obs)
        spread = np.std(np.asarray(draws), axis=0)
        se = np.maximum(se, spread)
    rms = math.sqrt(float(res @ res) / max(1, n_obs))
    return Solution(layout, np.asarray(sol.x, dtype=np.float64), cov, se, rms)


def best_reference(sol: Solution, prof: Profiles, multi_of: Sequence[bool]) -> int:
    """The time unit that pins the overhead best: among the names ``comm_profiles`` learned
    with multi-node runs, the one whose overhead over compute time (``log o - log c``, what
    its runs see) has the smallest variance; the first name when none has one."""
    layout, cov, se = sol.layout, sol.cov, sol.se
    best, best_var = layout.ref, math.inf
    for i in range(len(prof.names)):
        if not (multi_of[i] and prof.rho_known[i]):
            continue
        if i == layout.ref:
            var = float(cov[1, 1]) if math.isfinite(se[1]) else math.inf
        else:
            k = 2 + layout.compute.index(i)
            finite = math.isfinite(se[1]) and math.isfinite(se[k])
            var = float(cov[1, 1] + cov[k, k] - 2.0 * cov[1, k]) if finite else math.inf
        if var < best_var:
            best, best_var = i, var
    return best
