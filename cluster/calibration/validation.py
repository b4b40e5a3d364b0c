"""Scores of the pair predictions and alpha's cross-validation (random halves, one model
left out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import spearmanr

from linkwise.cluster.calibration.measurements import FloatArray, JobType
from linkwise.cluster.calibration.pairs import PairTerms, fit_alpha


@dataclass(frozen=True)
class PairScore:
    """A predictor's error on a set of pairs."""

    mae: float
    spearman: float  # nan for a constant predictor
    n: int


def score(pred: FloatArray, measured: FloatArray) -> PairScore:
    """Mean absolute error and Spearman rank correlation of predicted vs measured ratios."""
    p, m = np.ravel(pred), np.ravel(measured)
    mae = float(np.mean(np.abs(p - m)))
    rho = float(spearmanr(p, m).statistic) if np.ptp(p) > 0 else math.nan
    return PairScore(mae=mae, spearman=rho, n=int(p.size))


@dataclass(frozen=True)
class HeldOut:
    """Held-out scores of the fitted model and of the training-mean predictor."""

    model_mae: tuple[float, ...]
    model_spearman: tuple[float, ...]
    trivial_mae: tuple[float, ...]

    def summary(self) -> dict[str, float]:
        def mean(xs: tuple[float, ...]) -> float:
            return float(np.mean(xs))

        def sd(xs: tuple[float, ...]) -> float:
            return float(np.std(xs))

        return {
            "model_mae": mean(self.model_mae),
            "model_mae_sd": sd(self.model_mae),
            "model_spearman": mean(self.model_spearman),
            "model_spearman_sd": sd(self.model_spearman),
            "trivial_mae": mean(self.trivial_mae),
            "trivial_mae_sd": sd(self.trivial_mae),
            "folds": float(len(self.model_mae)),
        }


def _held_out(
    terms: PairTerms, measured: FloatArray, folds: Sequence[npt.NDArray[np.bool_]]
) -> HeldOut:
    mae: list[float] = []
    rho: list[float] = []
    triv: list[float] = []
    for test in folds:
        train = ~test
        alpha = fit_alpha(terms, measured, train)
        s = score(terms.ratios(alpha)[test], measured[test])
        mae.append(s.mae)
        rho.append(s.spearman)
        triv.append(float(np.mean(np.abs(measured[test] - measured[train].mean()))))
    return HeldOut(tuple(mae), tuple(rho), tuple(triv))


def random_half_folds(
    shape: tuple[int, int], repeats: int, seed: int
) -> list[npt.NDArray[np.bool_]]:
    """``repeats`` random halves of the pairs (the test half of each split)."""
    rng = np.random.default_rng(seed)
    n = shape[0] * shape[1]
    out = []
    for _ in range(repeats):
        test = np.zeros(n, dtype=bool)
        test[rng.permutation(n)[: n // 2]] = True
        out.append(test.reshape(shape))
    return out


def leave_one_model_out_folds(types: Sequence[JobType]) -> dict[str, npt.NDArray[np.bool_]]:
    """Per model, the pairs that involve it (as the job measured or as the neighbour)."""
    models = sorted({t[0] for t in types})
    out = {}
    for m in models:
        hit = np.array([t[0] == m for t in types])
        out[m] = hit[:, None] | hit[None, :]
    return out


def cross_validate(
    terms: PairTerms,
    measured: FloatArray,
    types: Sequence[JobType],
    *,
    repeats: int = 50,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Alpha refitted on part of the pairs, scored on the rest.

    ``random_half``: 50 random halves. ``leave_one_model_out``: every pair that involves one
    model held out in turn (pooled over the 6 folds). The profiles come from the isolated
    throughputs (another measurement) in both; only alpha sees the matrix.
    """
    halves = _held_out(terms, measured, random_half_folds(measured.shape, repeats, seed))
    lomo_folds = leave_one_model_out_folds(types)
    lomo = _held_out(terms, measured, list(lomo_folds.values()))
    out = {"random_half": halves.summary(), "leave_one_model_out": lomo.summary()}
    out["leave_one_model_out"].update(
        {f"mae[{m}]": v for m, v in zip(lomo_folds, lomo.model_mae, strict=True)}
    )
    return out
