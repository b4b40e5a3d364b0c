"""The contention fit scored on the later runs (``Validation``): the fitted model, the
shipped calibration's alpha and overhead with the same starting profiles, and a constant."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.calibration.validation import PairScore, score
from linkwise.cluster.profiles import Calibration
from linkwise.datasets.contention_fit.data import FloatArray, IntArray
from linkwise.datasets.contention_fit.solve import Layout, Profiles, observations
from linkwise.datasets.contention_fit.terms import ContentionTerms

__all__ = ["Validation", "validate"]


@dataclass(frozen=True)
class Validation:
    """Scores on the later runs (ended after ``split_time``), for the fitted model, for the
    shipped calibration's alpha and overhead with the same starting profiles, and for a
    constant (the training mean): of every activity mean (alone and beside others), and of
    the drop beside others (each mean beside others over the model's own activity for the
    run alone at its placement, against the model's predicted rate there: how well the
    slowdown is predicted once the isolated level is the model's)."""

    split_time: float
    runs: int  # later runs with a profile and some activity
    without_profile: int  # later runs whose name had no run in the training part
    activity_fit: PairScore
    activity_shipped: PairScore
    activity_constant_mae: float
    drop_fit: PairScore
    drop_shipped: PairScore
    drop_constant_mae: float

    def to_dict(self) -> dict[str, Any]:
        def sc(s: PairScore) -> dict[str, Any]:
            return {
                "mae": None if math.isnan(s.mae) else s.mae,
                "spearman": None if math.isnan(s.spearman) else s.spearman,
                "n": s.n,
            }

        def num(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {
            "split_time": self.split_time,
            "runs": self.runs,
            "without_profile": self.without_profile,
            "activity": {
                "fit": sc(self.activity_fit),
                "shipped": sc(self.activity_shipped),
                "constant_mae": num(self.activity_constant_mae),
            },
            "drop": {
                "fit": sc(self.drop_fit),
                "shipped": sc(self.drop_shipped),
                "constant_mae": num(self.drop_constant_mae),
            },
        }


def validate(
    runs: pl.DataFrame,
    terms: ContentionTerms,
    layout: Layout,
    prof: Profiles,
    x: FloatArray,
    shipped: Calibration,
    split_time: float,
    min_gpu_s: float,
    train: tuple[IntArray, FloatArray, IntArray, FloatArray],
) -> Validation:
    later = pl.col("t1") > split_time
    va_idx, va_obs, vb_idx, vb_obs = observations(runs, later & pl.col("_profiled"), min_gpu_s)
    without = runs.filter(later & pl.col("summarized") & ~pl.col("_profiled")).height
    x_ship = x.copy()
    x_ship[0], x_ship[1] = shipped.alpha, shipped.overhead_s
    x_ship[2 : 2 + len(layout.compute)] = np.log(prof.compute0[list(layout.compute)])
    x_ship[2 + len(layout.compute) :] = np.log(prof.rho0[list(layout.rho)])

    def predict(xv: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        alpha, over, c, g = layout.unpack(xv, prof)
        pa, pb = terms.means(terms.activity(alpha, over, c, g))
        return pa, pb, terms.isolated(over, c, g)

    obs = np.concatenate([va_obs, vb_obs])
    _, ta_obs, tb_idx, tb_obs = train
    fa, fb, fiso = predict(x)
    const_act = float(np.mean(np.concatenate([ta_obs, tb_obs])))
    const_drop = float(np.mean(tb_obs / fiso[tb_idx])) if tb_idx.size else 1.0

    def scores(pa: FloatArray, pb: FloatArray, iso: FloatArray) -> tuple[PairScore, PairScore]:
        act = _score(np.concatenate([pa[va_idx], pb[vb_idx]]), obs)
        drop = _score(pb[vb_idx] / iso[vb_idx], vb_obs / iso[vb_idx])
        return act, drop

    act_fit, drop_fit = scores(fa, fb, fiso)
    act_ship, drop_ship = scores(*predict(x_ship))
    return Validation(
        split_time=split_time,
        runs=len(np.union1d(va_idx, vb_idx)),
        without_profile=without,
        activity_fit=act_fit,
        activity_shipped=act_ship,
        activity_constant_mae=float(np.mean(np.abs(obs - const_act))) if obs.size else math.nan,
        drop_fit=drop_fit,
        drop_shipped=drop_ship,
        drop_constant_mae=(
            float(np.mean(np.abs(vb_obs / fiso[vb_idx] - const_drop))) if vb_idx.size else math.nan
        ),
    )


def _score(pred: FloatArray, obs: FloatArray) -> PairScore:
    if pred.size == 0:
        return PairScore(mae=math.nan, spearman=math.nan, n=0)
    if pred.size == 1:
        return PairScore(mae=float(abs(pred[0] - obs[0])), spearman=math.nan, n=1)
    return score(pred, obs)


# ------------------------------------------------------------------------ the report
