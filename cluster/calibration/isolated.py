"""Stage 1: DeepShare's profiles, scales and overhead from its isolated throughputs
(``fit_deepshare_profiles``), and how well they determine each compute time
(``compute_share_scan``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from linkwise.cluster.calibration.bounds import OVERHEAD_BOUNDS, PROFILE_BOUNDS, snap_to_zero
from linkwise.cluster.calibration.measurements import (
    DEEPSHARE_BATCH,
    DEEPSHARE_MODELS,
    DEEPSHARE_NIC_GBPS,
    FloatArray,
    JobType,
    table_types,
)
from linkwise.cluster.contention import PairwiseTable, ring_iteration_time
from linkwise.cluster.profiles import CommProfile

# DeepShare models whose compute_s is one parameter with another model's. DeepShare's isolated
# throughputs do not determine MoE's compute_s (its own error is 0.289 to 0.299 whether compute
# is 0% or 50% of its iteration, ``compute_share_scan``); fitted free it runs to the lower
# bound 1e-9, a purely communication-bound job. MoE and FSDP are the same model body in
# DeepShare's launch scripts: fairscale's benchmark TransformerLM (``golden_configs.lm_wikitext2``)
# on WikiText-2 with a per-GPU batch of 8 on the same TITAN Xp GPUs (slurm_examples/moe.py,
# fsdp.py); MoE swaps the feed-forward blocks for experts and trains under DDP, so its gradient
# is larger (which the fit keeps free) while the compute per iteration stays that of the same
# network and batch. FSDP's compute_s is determined by its own throughputs (20% of its
# 2-GPU iteration), so MoE shares it: MoE's compute share becomes 15% of its 2-GPU iteration,
# inside the flat valley (its error 0.291 against 0.289 free).
COMPUTE_TIES: Mapping[str, str] = {"MoE": "FSDP"}

# Weight of the log-space prior that ties each DeepShare scale to DEEPSHARE_BATCH.
DEFAULT_SCALE_PRIOR_WEIGHT = 1.0
# Starting values of overhead_s (seconds) for the multi-start fit of stage 1.
OVERHEAD_STARTS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)


@dataclass(frozen=True)
class IsolatedFit:
    """Stage 1's result: DeepShare profiles, scales and the overhead, with their fit."""

    profiles: Mapping[str, CommProfile]
    scale: Mapping[str, float]  # samples per iteration per GPU
    overhead_s: float
    predicted: Mapping[JobType, float]  # samples/s
    measured: Mapping[JobType, float]

    def rel_errors(self) -> dict[JobType, float]:
        """Predicted / measured - 1 per job type."""
        return {t: self.predicted[t] / self.measured[t] - 1.0 for t in self.measured}

    def rms_log_error(self) -> float:
        """Root mean square of log(predicted / measured)."""
        logs = [math.log(self.predicted[t] / self.measured[t]) for t in self.measured]
        return math.sqrt(sum(x * x for x in logs) / len(logs))


def isolated_throughput(
    profile: CommProfile, scale: float, gpus: int, nodes: int, nic_gbps: float, overhead_s: float
) -> float:
    """Samples/s of a DeepShare job alone: ``scale * gpus / tau(gpus, nodes)``.

    Every DeepShare type spans two or more nodes, so its ring is bottlenecked by the NIC.
    """
    tau = ring_iteration_time(profile, gpus, nodes, nic_gbps, overhead_s)
    return scale * gpus / tau


def fit_deepshare_profiles(
    table: PairwiseTable,
    *,
    nic_gbps: float = DEEPSHARE_NIC_GBPS,
    scale_prior: Mapping[str, float] = DEEPSHARE_BATCH,
    prior_weight: float = DEFAULT_SCALE_PRIOR_WEIGHT,
    fixed_compute: Mapping[str, float] | None = None,
    compute_ties: Mapping[str, str] = COMPUTE_TIES,
) -> IsolatedFit:
    """Fit compute_s, grad_gb and scale per DeepShare model and one overhead_s.

    ``fixed_compute``: models whose compute_s is held at a given value (identifiability
    checks, ``compute_share_scan``). ``compute_ties``: model -> model whose compute_s it
    shares: the fit is run without it, then again with the model's compute_s held at its
    sibling's fitted value (``COMPUTE_TIES``; the sibling's fit is not pulled by the tied
    model's data); a model in ``fixed_compute`` is not tied.

    Model: ``thp(w, n) = scale * w / tau(w, n)``, ``tau`` SJF-BCO's ring iteration time
    (``ring_iteration_time``) at the nominal NIC bandwidth. Least squares on
    ``log(predicted / measured)`` over the 36 types, plus ``prior_weight * log(scale /
    scale_prior)`` per model.

    The prior is needed, not decoration: multiplying every compute_s, grad_gb, scale and
    overhead_s by one factor leaves every throughput unchanged, and a model whose throughput
    does not fall with the number of nodes (MobileNetV3, GraphSage, FSDP) leaves its own scale
    free. The prior sets these free directions to the per-GPU batch sizes of DeepShare's launch
    scripts. With a weak prior the scales drift to unphysical values (Transformer-XL loses its
    gradient and becomes compute plus per-node overhead) that fit the isolated throughputs
    better but predict the measured contention worse than a constant (see
    benchmarks/contention_validation.md).
    """
    types = table_types(table)
    present = {t[0] for t in types}
    models = [m for m in DEEPSHARE_MODELS if m in present] + sorted(present - set(DEEPSHARE_MODELS))
    measured = np.array([table.isolated[t] for t in types])
    index = {m: i for i, m in enumerate(models)}
    nm = len(models)
    prior = np.log(np.array([scale_prior.get(m, 1.0) for m in models]))
    has_prior = np.array([m in scale_prior for m in models], dtype=np.float64)

    ties = {
        m: to
        for m, to in compute_ties.items()
        if m in index and to in index and m not in (fixed_compute or {})
    }
    if ties:  # fit without the tied models' compute, then hold it at their siblings' fitted one
        untied = fit_deepshare_profiles(
            table,
            nic_gbps=nic_gbps,
            scale_prior=scale_prior,
            prior_weight=prior_weight,
            fixed_compute=fixed_compute,
            compute_ties={},
        )
        held = {m: untied.profiles[to].compute_s for m, to in ties.items()}
        return fit_deepshare_profiles(
            table,
            nic_gbps=nic_gbps,
            scale_prior=scale_prior,
            prior_weight=prior_weight,
            fixed_compute={**(fixed_compute or {}), **held},
            compute_ties={},
        )

    def unpack(x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, float]:
        return np.exp(x[:nm]), np.exp(x[nm : 2 * nm]), np.exp(x[2 * nm : 3 * nm]), float(x[-1])

    mi = np.array([index[m] for m, _, _ in types])
    w = np.array([t[1] for t in types], dtype=np.float64)
    n = np.array([t[2] for t in types], dtype=np.float64)

    def predict_fast(x: FloatArray) -> FloatArray:
        # ring_iteration_time, vectorised (every type is split, so the overhead always counts);
        # the final throughputs below go through the model function itself.
        c, g, s, o = unpack(x)
        tau = c[mi] + (g[mi] / w) * 2.0 * (w - 1.0) / nic_gbps + o * n
        return np.asarray(s[mi] * w / tau, dtype=np.float64)

    def predict(x: FloatArray) -> FloatArray:
        c, g, s, o = unpack(x)
        out = np.empty(len(types))
        for k, (m, gpus, nodes) in enumerate(types):
            i = index[m]
            out[k] = isolated_throughput(CommProfile(m, c[i], g[i]), s[i], gpus, nodes, nic_gbps, o)
        return out

    def residuals(x: FloatArray) -> FloatArray:
        fit = np.log(predict_fast(x) / measured)
        pri = prior_weight * has_prior * (x[2 * nm : 3 * nm] - prior)
        return np.concatenate([fit, pri])

    starts, lo, hi = _starts_and_bounds(table, models, prior, nic_gbps, fixed_compute or {})
    sols = [
        least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", xtol=1e-12, ftol=1e-12)
        for x0 in starts
    ]
    sol = min(sols, key=lambda r: float(r.cost))
    c, g, s, o = unpack(sol.x)
    o = snap_to_zero(o)
    src = (
        "DeepShare isolated throughput, 4x8 TITAN Xp, 40 Gb/s IB (github.com/gajagajago/deepshare)"
    )
    profiles = {m: CommProfile(m, float(c[i]), float(g[i]), src) for m, i in index.items()}
    pred = predict(sol.x)
    return IsolatedFit(
        profiles=profiles,
        scale={m: float(s[i]) for m, i in index.items()},
        overhead_s=o,
        predicted={t: float(v) for t, v in zip(types, pred, strict=True)},
        measured={t: table.isolated[t] for t in types},
    )


def _starts_and_bounds(
    table: PairwiseTable,
    models: Sequence[str],
    prior: FloatArray,
    nic_gbps: float,
    fixed_compute: Mapping[str, float],
) -> tuple[list[FloatArray], FloatArray, FloatArray]:
    """Stage 1's starting points and bounds: x = log compute_s, log grad_gb, log scale per
    model, then overhead_s; a model in ``fixed_compute`` has its compute_s pinned."""
    types = table_types(table)
    index = {m: i for i, m in enumerate(models)}
    nm = len(models)
    # Start: half compute, half network at the smallest measured type, scale at the prior.
    s0 = np.exp(prior)
    tau0 = np.array([s0[index[m]] * w / table.isolated[(m, w, n)] for m, w, n in types])
    first = {m: k for k, (m, _, _) in reversed(list(enumerate(types)))}
    c0 = np.array([0.5 * tau0[first[m]] for m in models])
    w_first = np.array([types[first[m]][1] for m in models])
    g0 = c0 * nic_gbps * w_first / (2.0 * (w_first - 1))
    lo = np.concatenate([np.full(3 * nm, math.log(PROFILE_BOUNDS[0])), [OVERHEAD_BOUNDS[0]]])
    hi = np.concatenate([np.full(3 * nm, math.log(PROFILE_BOUNDS[1])), [OVERHEAD_BOUNDS[1]]])
    for m, value in fixed_compute.items():
        c0[index[m]] = value
        lo[index[m]], hi[index[m]] = math.log(value) - 1e-12, math.log(value) + 1e-12
    # The objective has several local minima: start from a few overheads, keep the best.
    starts = [np.concatenate([np.log(c0), np.log(g0), prior, [o0]]) for o0 in OVERHEAD_STARTS]
    return starts, lo, hi


def compute_share_scan(
    table: PairwiseTable,
    shares: Sequence[float] = (0.05, 0.1, 0.25, 0.5),
    **fit_kwargs: Any,
) -> dict[str, dict[float, float]]:
    """How well the isolated throughputs determine each DeepShare model's compute time.

    For each model and each share, the stage-1 fit is redone with that model's compute_s
    held at ``share`` of its iteration time at its smallest measured type (its gradient,
    scale and every other model free), and the model's own rms log error is returned; the
    key ``-1.0`` holds the free fit's error and ``-2.0`` its fitted share. A model whose
    error barely moves across shares has an undetermined compute_s.
    """
    base = fit_deepshare_profiles(table, **fit_kwargs)
    types = table_types(table)
    out: dict[str, dict[float, float]] = {}
    for m in sorted({t[0] for t in types}):
        mine = [t for t in types if t[0] == m]
        smallest = min(mine, key=lambda t: (t[1], t[2]))
        tau = base.scale[m] * smallest[1] / table.isolated[smallest]
        errs = {
            -1.0: float(
                np.sqrt(
                    np.mean([math.log(base.predicted[t] / base.measured[t]) ** 2 for t in mine])
                )
            ),
            -2.0: base.profiles[m].compute_s / tau,
        }
        for share in shares:
            fit = fit_deepshare_profiles(table, fixed_compute={m: share * tau}, **fit_kwargs)
            errs[share] = float(
                np.sqrt(np.mean([math.log(fit.predicted[t] / fit.measured[t]) ** 2 for t in mine]))
            )
        out[m] = errs
    return out
