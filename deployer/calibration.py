"""The one calibration the live loop uses (issue 34 item 3): for its heuristics' contention
model, the explanations, the jobs' profiles (``deployer.profiles``) and the drift monitor
(``deployer.drift``).

The rule (``CalibrationResolver``), resolved at start-up and on every policy reload:

1. ``flag``: the file ``--calibration PATH`` names (``[policy] calibration`` in a settings
   file), read once at start (a file that cannot be read stops serve there);
2. ``package``: the calibration the serving package's dataset manifest records
   (``models.calibrations.recorded_calibration``: a cluster's fit, fetched again from its
   MLflow run, or the file it was built with): the model decides on the contention it was
   trained with. A package built with the shipped calibration records none;
3. ``cluster-fit``: the newest calibration ``linkwise calibrate --db`` logged for the Slurm
   cluster in the tracking store (``models.calibrations.resolve_calibration``; a SQLite store
   that does not exist is not created to look);
4. ``shipped``: the one shipped with linkwise.

A lookup that fails (the tracking store does not answer, a recorded run is gone) or takes
longer than ``timeout_s`` (MLflow's own HTTP retries last minutes) gives the shipped
calibration with a warning at start, and keeps the calibration in use later; it never stops
serve. Which calibration is in use is logged (the ``calibration`` event: source, MLflow run
id, data span) and exported (``linkwise_serve_calibration_info{source,run_id}``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.models.build import model_manifest
from linkwise.models.calibrations import recorded_calibration, resolve_calibration
from linkwise.policies.spec import PolicySpec

__all__ = [
    "SOURCES",
    "CalibrationResolver",
    "ServeCalibration",
    "shipped",
    "within",
]

Source = Literal["flag", "package", "cluster-fit", "shipped"]
SOURCES: tuple[Source, ...] = ("flag", "package", "cluster-fit", "shipped")
T = TypeVar("T")


@dataclass(frozen=True)
class ServeCalibration:
    """The calibration in use, where it came from (``SOURCES``), its file (None: shipped),
    its MLflow run (a cluster's fit) and, when the lookup failed, why (``warning``)."""

    source: Source
    calibration: Calibration
    path: str | None = None
    run_id: str = ""
    warning: str = ""

    @property
    def key(self) -> tuple[str, str | None, str]:
        """Changes when the calibration in use changes."""
        return (self.source, self.path, self.run_id)

    @property
    def span(self) -> str:
        """The data it was fitted on (``fit.data``: since, until, jobs, hours); "" for one
        not fitted on a cluster's telemetry."""
        data = self.calibration.fit.get("data", {}) if self.calibration.fit else {}
        parts = []
        if data.get("since") is not None and data.get("until") is not None:
            parts.append(f"{data['since']} to {data['until']}")
        if data.get("runs_summarized") is not None:
            parts.append(f"{data['runs_summarized']} jobs")
        if data.get("hours") is not None:
            parts.append(f"{float(data['hours']):.1f} h")
        return ", ".join(parts)

    def fields(self) -> dict[str, Any]:
        """The ``calibration`` log event's fields."""
        out: dict[str, Any] = {"source": self.source, "run_id": self.run_id or None}
        out |= {"span": self.span or None, "path": self.path, "text": self.calibration.source}
        return out | ({"warning": self.warning} if self.warning else {})


def shipped(warning: str = "") -> ServeCalibration:
    """The shipped calibration (with why, when a lookup failed)."""
    return ServeCalibration("shipped", load_calibration(None), warning=warning)


def within(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` in a daemon thread; TimeoutError when it has not answered in ``timeout_s``
    (the thread is left to finish on its own), its exception when it raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="linkwise-calibration", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class CalibrationResolver:
    """The module's rule for ``linkwise serve``: ``resolver(spec)`` is the calibration for
    the policy ``spec`` names (a package's own where it records one). ``manifest(spec,
    tracking_uri)`` reads a package's dataset manifest (``models.build.model_manifest``)."""

    def __init__(
        self,
        flag: str | Path | None,
        cluster: str | None,
        tracking_uri: str | None,
        *,
        timeout_s: float = 10.0,
        manifest: Callable[[PolicySpec, str | None], Mapping[str, Any] | None] = model_manifest,
    ) -> None:
        self.flagged = ServeCalibration("flag", load_calibration(flag), str(flag)) if flag else None
        self.cluster = cluster
        self.tracking_uri = tracking_uri
        self.timeout_s = timeout_s
        self.manifest = manifest

    def __call__(self, spec: PolicySpec) -> ServeCalibration:
        if self.flagged is not None:
            return self.flagged
        try:
            return within(partial(self._lookup, spec), self.timeout_s)
        except Exception as exc:
            return shipped(f"calibration lookup failed ({type(exc).__name__}: {exc})"[:400])

    def _lookup(self, spec: PolicySpec) -> ServeCalibration:
        found = self.manifest(spec, self.tracking_uri) if spec.is_model else None
        sources = (found or {}).get("sources") or {}
        path = recorded_calibration(sources, self.tracking_uri) if sources else None
        if path is not None:
            used = sources.get("calibration_used") or {}
            run_id = str(used.get("run_id") or "") if used.get("kind") == "cluster" else ""
            return ServeCalibration("package", load_calibration(path), path, run_id)
        choice = resolve_calibration(None, cluster=self.cluster, tracking_uri=self.tracking_uri)
        if choice.kind != "cluster" or choice.path is None:
            return shipped()
        return ServeCalibration(
            "cluster-fit", load_calibration(choice.path), choice.path, choice.run_id or ""
        )
