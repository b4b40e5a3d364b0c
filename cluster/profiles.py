"""Communication profiles of training jobs and the calibrated parameters of the contention model.

The shipped parameters (``cluster/data/calibration.json``) are fitted by
``linkwise.cluster.calibration`` from real measurements in ``../shared/data/calibration``
(DeepShare's isolated and shared throughputs, Pollux's placement step/sync times).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.domain import Job


@dataclass(frozen=True, slots=True)
class CommProfile:
    """One model's per-iteration cost: compute time and the gradient volume its ring all-reduces.

    ``act_gb`` matters only to a job with a parallel layout (``Job.pp``, ``cluster.layout``):
    what each GPU of a pipeline stage sends its peer in the next stage per iteration (forward
    activations plus the backward gradients of them), GB; 0 when not stated."""

    name: str
    compute_s: float  # per-iteration compute (forward, backward, optimizer), seconds
    grad_gb: float  # gradient size all-reduced per iteration, GB
    source: str = ""
    act_gb: float = 0.0  # per GPU per iteration across a pipeline boundary, GB (layouts only)


@dataclass(frozen=True)
class Calibration:
    """Parameters of the analytic contention model.

    ``alpha``: SJF-BCO's sharing penalty, f(k) = k + alpha (k - 1) for k rings on a link.
    ``overhead_s``: per-node synchronisation overhead of a split ring (SJF-BCO's xi2).
    ``mix``: default sampling weights of profiles for traces without model names.
    """

    profiles: Mapping[str, CommProfile]
    alpha: float
    overhead_s: float
    mix: Mapping[str, float]
    source: str = ""
    fit: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("a calibration needs at least one profile")
        unknown = set(self.mix) - set(self.profiles)
        if unknown:
            raise ValueError(f"mix names unknown profiles: {sorted(unknown)}")
        if self.alpha < 0 or self.overhead_s < 0:
            raise ValueError("alpha and overhead_s must be non-negative")

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "alpha": self.alpha,
            "overhead_s": self.overhead_s,
            "mix": dict(self.mix),
            "profiles": {
                p.name: {"compute_s": p.compute_s, "grad_gb": p.grad_gb, "source": p.source}
                | ({"act_gb": p.act_gb} if p.act_gb else {})
                for p in self.profiles.values()
            },
            "fit": dict(self.fit),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Calibration:
        try:
            profiles = {
                name: CommProfile(
                    name,
                    float(p["compute_s"]),
                    float(p["grad_gb"]),
                    str(p.get("source", "")),
                    float(p.get("act_gb", 0.0)),
                )
                for name, p in data["profiles"].items()
            }
            return Calibration(
                profiles=profiles,
                alpha=float(data["alpha"]),
                overhead_s=float(data["overhead_s"]),
                mix={k: float(v) for k, v in data.get("mix", {}).items()}
                or {k: 1.0 for k in profiles},
                source=str(data.get("source", "")),
                fit=dict(data.get("fit", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed calibration: {exc!r}") from exc


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Load a calibration file; without a path, the one shipped with linkwise."""
    if path is None:
        text = resources.files("linkwise.cluster").joinpath("data/calibration.json").read_text()
    else:
        text = Path(path).read_text()
    return Calibration.from_json(json.loads(text))


def assign_profiles(
    jobs: Sequence[Job],
    calibration: Calibration,
    *,
    seed: int = 0,
    mix: Mapping[str, float] | None = None,
) -> tuple[Job, ...]:
    """Give every job without a profile one drawn from ``mix`` (default: the calibration's).

    Deterministic for a seed: the draw for a job depends only on the seed and its position.
    Jobs that name a profile keep it; an unknown name is an error.
    """
    weights = dict(mix if mix is not None else calibration.mix)
    unknown = sorted(set(weights) - set(calibration.profiles))
    if unknown:
        raise ValueError(f"mix names unknown profiles: {unknown}")
    names = sorted(n for n, w in weights.items() if w > 0)
    if not names:
        raise ValueError("profile mix has no positive weight")
    p = np.array([weights[n] for n in names], dtype=float)
    draws = np.random.default_rng(seed).choice(len(names), size=len(jobs), p=p / p.sum())
    out: list[Job] = []
    for job, k in zip(jobs, draws, strict=True):
        if job.profile:
            if job.profile not in calibration.profiles:
                known = ", ".join(sorted(calibration.profiles))
                raise ValueError(
                    f"job {job.job_id}: unknown profile {job.profile!r} (known: {known})"
                )
            out.append(job)
        else:
            out.append(replace(job, profile=names[int(k)]))
    return tuple(out)
