"""All three stages together: ``fit_calibration`` -> a ``Calibration`` with its diagnostics,
and ``write_calibration``, the JSON the package ships (``SHIPPED_CALIBRATION``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.calibration.isolated import (
    COMPUTE_TIES,
    DEFAULT_SCALE_PRIOR_WEIGHT,
    compute_share_scan,
    fit_deepshare_profiles,
)
from linkwise.cluster.calibration.measurements import (
    DEEPSHARE_BATCH,
    DEEPSHARE_NIC_GBPS,
    POLLUX_INTRA_GBPS,
    POLLUX_NIC_GBPS,
    JobType,
    load_deepshare,
    load_pollux,
    ratio_matrix,
    table_types,
)
from linkwise.cluster.calibration.pairs import fit_alpha, pair_terms
from linkwise.cluster.calibration.pollux import fit_pollux_profiles
from linkwise.cluster.calibration.report import parameter_report
from linkwise.cluster.calibration.validation import cross_validate, score
from linkwise.cluster.profiles import Calibration

SHIPPED_CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "calibration.json"


SOURCE = (
    "fitted by linkwise.cluster.calibration from shared/data/calibration: DeepShare "
    "(github.com/gajagajago/deepshare scheduler/jobs: isolated_thp.csv, shared_thp_ratio.csv) "
    "and Pollux (github.com/petuum/adaptdl osdi21-artifact simulator/traces/*/placements.csv)"
)


def _type_key(t: JobType) -> str:
    return f"{t[0]},{t[1]},{t[2]}"


def _clean(x: float) -> float | None:
    return None if math.isnan(x) else x


def fit_calibration(
    data_dir: str | Path, *, prior_weight: float = DEFAULT_SCALE_PRIOR_WEIGHT
) -> Calibration:
    """Fit every parameter of the analytic model from shared/data (stages 1-3 above).

    Profiles: the 6 DeepShare and 6 Pollux models, named by model. ``alpha`` is fitted for
    duty-cycle sharing (``AnalyticModel``'s default); ``fit["alpha_flows"]`` for SJF-BCO's flow
    count. ``mix`` is uniform over the 12 profiles: the Philly trace names no models, and no
    measurement says which of these models its jobs were.
    """
    table = load_deepshare(data_dir)
    frames = load_pollux(data_dir)
    iso = fit_deepshare_profiles(table, prior_weight=prior_weight)
    types = table_types(table)
    measured = ratio_matrix(table)
    fits: dict[str, Any] = {}
    alphas: dict[str, float] = {}
    for sharing in ("duty", "flows"):
        terms = pair_terms(iso.profiles, iso.overhead_s, types, sharing)
        alpha = fit_alpha(terms, measured)
        alphas[sharing] = alpha
        in_sample = score(terms.ratios(alpha), measured)
        cv = cross_validate(terms, measured, types)
        fits[sharing] = {
            "alpha": alpha,
            "mae": in_sample.mae,
            "spearman": in_sample.spearman,
            "cv_random_half": cv["random_half"],
            "cv_leave_one_model_out": cv["leave_one_model_out"],
        }
    pollux = fit_pollux_profiles(frames, iso.overhead_s)
    profiles = {**iso.profiles, **pollux.profiles}
    scan = compute_share_scan(table, prior_weight=prior_weight)
    rel = iso.rel_errors()
    abs_rel = sorted(abs(v) for v in rel.values())
    fit: dict[str, Any] = {
        "sharing": "duty",
        "alpha_flows": alphas["flows"],
        "deepshare_isolated": {
            "nic_gbps": DEEPSHARE_NIC_GBPS,
            "prior_weight": prior_weight,
            "scale": dict(iso.scale),
            "scale_prior": dict(DEEPSHARE_BATCH),
            "rms_log_error": iso.rms_log_error(),
            "median_abs_rel_error": float(np.median(abs_rel)),
            "max_abs_rel_error": abs_rel[-1],
            "rel_error": {_type_key(t): v for t, v in rel.items()},
            "compute_ties": dict(COMPUTE_TIES),
            "compute_share_scan": {m: {str(k): v for k, v in e.items()} for m, e in scan.items()},
        },
        "deepshare_pairs": {
            "n_pairs": int(measured.size),
            "measured_mean": float(measured.mean()),
            "trivial_mae": float(np.mean(np.abs(measured - measured.mean()))),
            **{sharing: _nan_to_none(v) for sharing, v in fits.items()},
        },
        "pollux": {
            "nic_nominal_gbps": POLLUX_NIC_GBPS,
            "nic_effective_gbps": pollux.nic_effective_gbps,
            "intra_gbps": POLLUX_INTRA_GBPS,
            "typical_local_bsz": dict(pollux.typical_local_bsz),
            "rms_log_error": dict(pollux.rms_log_error),
        },
        "parameters": parameter_report(iso, scan, alphas, pollux, prior_weight),
    }
    return Calibration(
        profiles=profiles,
        alpha=alphas["duty"],
        overhead_s=iso.overhead_s,
        mix={name: 1.0 for name in profiles},
        source=SOURCE,
        fit=fit,
    )


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, float):
        return _clean(value)
    return value


def write_calibration(cal: Calibration, path: str | Path) -> None:
    """Write a calibration as the JSON ``load_calibration`` reads."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=2) + "\n")
