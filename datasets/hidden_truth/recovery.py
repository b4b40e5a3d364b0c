"""The fitted calibration against the hidden truth, parameter by parameter (``recovery``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.profiles import Calibration
from linkwise.datasets.comm_profiles import PROFILE_PREFIX
from linkwise.datasets.hidden_truth.truth import HiddenTruth

__all__ = ["Recovered", "recovery"]


@dataclass(frozen=True, slots=True)
class Recovered:
    """One fitted parameter against the truth, the truth in the fit's time unit (telemetry
    holds ratios only: the fit expresses times in its reference job's isolated iteration,
    so the truth's seconds are scaled by fitted over true compute time of that job)."""

    parameter: str
    truth: float
    fitted: float
    status: str
    runs: int

    @property
    def rel_error(self) -> float:
        return self.fitted / self.truth - 1.0 if self.truth else math.inf


def recovery(truth: HiddenTruth, fitted: Calibration, reference: str) -> tuple[Recovered, ...]:
    """Every parameter of ``fitted.fit["parameters"]`` (``fit_cluster_calibration``'s
    report) against the hidden truth: alpha, overhead_s and, per job name, compute_s,
    grad_gb and gb_per_compute_s (a name absent from the truth is skipped)."""
    params: Mapping[str, Mapping[str, Mapping[str, Any]]] = fitted.fit["parameters"]
    true = truth.calibration.profiles
    ref = params[f"{PROFILE_PREFIX}name={reference}"]["compute_s"]["value"]
    unit = float(ref) / true[reference].compute_s
    shared = params["shared"]
    out = [
        Recovered(
            "alpha", truth.calibration.alpha, shared["alpha"]["value"], shared["alpha"]["status"], 0
        ),
        Recovered(
            "overhead_s",
            truth.calibration.overhead_s * unit,
            shared["overhead_s"]["value"],
            shared["overhead_s"]["status"],
            0,
        ),
    ]
    for key, entries in params.items():
        name = key.removeprefix(f"{PROFILE_PREFIX}name=")
        if key == "shared" or name not in true:
            continue
        prof = true[name]
        runs = int(entries["runs"]["value"])
        values = {
            "compute_s": prof.compute_s * unit,
            "grad_gb": prof.grad_gb * unit,
            "gb_per_compute_s": prof.grad_gb / prof.compute_s,
        }
        for what, value in values.items():
            e = entries[what]
            out.append(
                Recovered(f"{name}.{what}", value, float(e["value"]), str(e["status"]), runs)
            )
    return tuple(out)
