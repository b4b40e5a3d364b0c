"""The parameter report: each fitted parameter's value, bounds and status (determined,
weakly determined or constrained) with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linkwise.cluster.calibration.bounds import (
    ALPHA_BOUNDS,
    OVERHEAD_BOUNDS,
    POLLUX_COMPUTE_FLOOR,
    PROFILE_BOUNDS,
    at_bound,
)
from linkwise.cluster.calibration.isolated import COMPUTE_TIES, IsolatedFit
from linkwise.cluster.calibration.measurements import DEEPSHARE_BATCH
from linkwise.cluster.calibration.pollux import PolluxFit

# Across the shares of ``compute_share_scan``, a model's own rms log error must move by more
# than this for its compute_s to count as determined by its throughputs.
DETERMINED_RANGE = 0.02
SCAN_SHARES = ("0.05", "0.1", "0.25", "0.5")


def parameter_entry(
    value: float, bounds: tuple[float | None, float | None], status: str, basis: str
) -> dict[str, Any]:
    """One parameter of the report; a value at a bound is always reported as constrained."""
    hit = at_bound(value, bounds)
    return {
        "value": value,
        "bounds": list(bounds),
        "at_bound": hit,
        "status": "constrained" if hit else status,
        "basis": basis,
    }


def parameter_report(
    iso: IsolatedFit,
    scan: Mapping[str, Mapping[float, float]],
    alphas: Mapping[str, float],
    pollux: PolluxFit,
    prior_weight: float,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per profile (and ``"shared"`` for the model-wide parameters), each fitted parameter's
    value, its fit bounds, whether it sits at one, and its status with the reason:

    - ``determined``: the measurements pin it (for a DeepShare compute_s: its own error moves
      by more than ``DETERMINED_RANGE`` across a 5-50% compute share);
    - ``weakly determined``: an interior value of a flat valley (kept, but not a measurement);
    - ``constrained``: set by a tie, a prior or a bound, not by its own measurements; every
      value at a fit bound is reported so, with the reason.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    b = PROFILE_BOUNDS
    for m, prof in iso.profiles.items():
        e = scan[m]
        fixed = [e[float(k)] for k in SCAN_SHARES]
        spread = f"its own rms log error {min(fixed):.3f}-{max(fixed):.3f} at a 5-50% share"
        share = f"compute share {e[-2.0]:.0%} of its smallest type's iteration"
        if m in COMPUTE_TIES:
            status = "constrained"
            basis = (
                f"held at {COMPUTE_TIES[m]}'s fitted compute_s (COMPUTE_TIES: the same network "
                f"and per-GPU batch in DeepShare's launch scripts; {share}); its throughputs "
                f"leave it free ({spread})"
            )
        elif max(fixed) - min(fixed) > DETERMINED_RANGE:
            status, basis = "determined", f"by its throughputs ({share}; {spread})"
        else:
            status = "weakly determined"
            basis = (
                f"a flat valley of its throughputs ({share}; {spread}): compute and gradient "
                "trade off"
            )
        grad_status = "weakly determined" if status == "weakly determined" else "determined"
        grad_basis = "by the fall of its throughput with GPUs and nodes, given compute_s"
        out[m] = {
            "compute_s": parameter_entry(prof.compute_s, b, status, basis),
            "grad_gb": parameter_entry(prof.grad_gb, b, grad_status, grad_basis),
            "scale": parameter_entry(
                iso.scale[m],
                b,
                "constrained",
                f"a log-space prior (weight {prior_weight:g}) to the per-GPU batch "
                f"{DEEPSHARE_BATCH.get(m, 1.0):g} of DeepShare's launch script: the "
                "throughputs cannot separate it from a common time scale",
            ),
        }
    for m, prof in pollux.profiles.items():
        out[m] = {
            "compute_s": parameter_entry(
                prof.compute_s,
                (POLLUX_COMPUTE_FLOOR, None),
                "determined",
                "measured: a line through step_time - sync_time against local batch, at the "
                f"median local batch {pollux.typical_local_bsz[m]:g}",
            ),
            "grad_gb": parameter_entry(
                prof.grad_gb,
                (None, None),
                "determined",
                "by its all-reduce times over placements (rms log error "
                f"{pollux.rms_log_error[m]:.2f})",
            ),
        }
    out["shared"] = {
        "alpha": parameter_entry(
            alphas["duty"],
            ALPHA_BOUNDS,
            "determined",
            "by DeepShare's 1296 shared/isolated ratios (cross-validated)",
        ),
        "overhead_s": parameter_entry(
            iso.overhead_s,
            OVERHEAD_BOUNDS,
            "determined",
            "at its lower bound 0: one per-node constant large enough for MoE's and "
            "Transformer-XL's slowdown with nodes would wreck GraphSage's 4 ms iteration, so "
            "the ring model carries no per-node overhead",
        ),
        "alpha_flows": parameter_entry(
            alphas["flows"],
            ALPHA_BOUNDS,
            "determined",
            "SJF-BCO's whole-ring count (a diagnostic, not shipped): at its lower bound 0, "
            "even f(2) = 2 predicts more slowdown than DeepShare measured",
        ),
        "pollux_nic_effective_gbps": parameter_entry(
            pollux.nic_effective_gbps,
            (None, None),
            "determined",
            "by Pollux's one-node against multi-node all-reduce times of all six models",
        ),
    }
    return out
