"""The result of a cluster's contention fit (``ClusterFit``), kept apart from the fit so that
readers (the report, the live loop) need no optimiser (scipy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.profiles import Calibration

__all__ = ["ClusterFit"]


@dataclass(frozen=True)
class ClusterFit:
    """The fitted calibration (its ``fit`` holds ``parameters``, ``data``, ``validation``)
    and how long it took."""

    calibration: Calibration
    reference: str  # the job name whose compute time is the time unit
    seconds: float

    @property
    def parameters(self) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
        params: Mapping[str, Mapping[str, Mapping[str, Any]]] = self.calibration.fit["parameters"]
        return params

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "seconds": self.seconds,
            "calibration": self.calibration.to_json(),
        }
