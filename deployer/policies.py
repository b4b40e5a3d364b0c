"""The live loop's policy: the one named by ``--policy``, reloaded when the model behind it
changes, with a named heuristic as fallback (``PolicyHolder``), and timed, guarded decisions
(``GuardedPolicy``). Every policy it builds predicts contention with the one calibration in
use (``deployer.calibration``), resolved for the policy at each (re)load."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Policy
from linkwise.deployer.calibration import ServeCalibration, shipped
from linkwise.deployer.events import log_event
from linkwise.deployer.explain import decide_explained, explain_cycle
from linkwise.deployer.metrics import ServeMetrics
from linkwise.models.build import build_policy, pinned, token
from linkwise.policies.spec import PolicySpec

__all__ = ["GuardedPolicy", "LoadedPolicy", "PolicyHolder", "model_probe"]

LOG = logging.getLogger("linkwise.serve")


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy with its provenance."""

    policy: Policy
    name: str
    model_version: str
    obs_spec_version: str
    calibration: ServeCalibration | None = None  # the one it predicts with (None: not told)


def _heuristic(spec: PolicySpec, calibration: ServeCalibration | None = None) -> LoadedPolicy:
    model = AnalyticModel(calibration.calibration) if calibration is not None else None
    return LoadedPolicy(spec.build(model), spec.label, f"heuristic:{spec.label}", "", calibration)


def _learned(
    spec: PolicySpec,
    tracking_uri: str | None = None,
    calibrate: Callable[[PolicySpec], ServeCalibration] | None = None,
) -> LoadedPolicy:
    """The package ``spec`` names, predicting with ``calibrate``'s calibration for it (an
    alias pinned first: the manifest read and the package loaded are the same version)."""
    fixed = pinned(spec, tracking_uri) if calibrate is not None else spec
    calibration = calibrate(fixed) if calibrate is not None else None
    model = AnalyticModel(calibration.calibration) if calibration is not None else None
    policy: Any = build_policy(fixed, model, tracking_uri=tracking_uri)
    package = str(getattr(policy, "package_dir", "") or "")
    # a registry model is recorded by its version number, which is what promotion's shadow
    # evidence looks up; a package folder by its path
    version = (
        package.rsplit("/", 1)[-1] if package.startswith("models:/") else package or spec.label
    )
    obs = getattr(getattr(policy, "spec", None), "version", "")
    return LoadedPolicy(policy, spec.label, version, str(obs), calibration)


def model_probe(spec: PolicySpec, tracking_uri: str | None = None) -> str | None:
    """A token that changes when the model behind ``spec`` changes (alias moved, package
    rewritten), read in the registry at ``tracking_uri`` (None: the environment's); None for
    heuristics. Raises when it cannot be read."""
    return token(spec, tracking_uri)


class PolicyHolder:
    """The policy in use: loads ``spec``, reloads it when its probe changes (the ``champion``
    alias moved), keeps the previous model when a new one fails to load or verify, and uses
    the named heuristic ``fallback`` when no model could ever be loaded. A registry model is
    looked up at ``tracking_uri`` (None: the environment's registry).

    ``calibrate(spec)`` gives the calibration for a policy (``deployer.calibration``; default:
    the shipped one, no lookup): resolved at each (re)load, and every ``calibration_every_s``
    while it is a cluster's fit or the shipped one (a newer fit reloads the policy). The
    policy, the fallback and the explanations predict with it (``model``); each change is
    logged (``calibration``) and exported (``linkwise_serve_calibration_info``)."""

    def __init__(
        self,
        spec: PolicySpec,
        fallback: PolicySpec,
        *,
        metrics: ServeMetrics,
        logger: logging.Logger = LOG,
        reload_s: float = 30.0,
        loader: Callable[[PolicySpec], LoadedPolicy] | None = None,
        probe: Callable[[PolicySpec], str | None] | None = None,
        tracking_uri: str | None = None,
        calibrate: Callable[[PolicySpec], ServeCalibration] | None = None,
        calibration_every_s: float = 600.0,
    ) -> None:
        self.spec = spec
        self.is_model = spec.is_model
        self.calibrate = calibrate or (lambda _spec: shipped())
        self.loader = loader or (
            partial(_learned, tracking_uri=tracking_uri, calibrate=self.calibrate)
            if self.is_model
            else (lambda s: _heuristic(s, self.calibrate(s)))
        )
        self.probe = probe or partial(model_probe, tracking_uri=tracking_uri)
        self.reload_s = reload_s
        self.calibration_every_s = calibration_every_s
        self.metrics = metrics
        self.log = logger
        self.fallback_spec = fallback
        self.fallback = _heuristic(fallback)
        self.calibration: ServeCalibration | None = None
        self.model: AnalyticModel | None = None
        self.calibration_checked = -math.inf
        self.current: LoadedPolicy | None = None
        self.token: str | None = None
        self.checked_at = -math.inf
        self.fallback_reason = ""
        self.refresh(force=True)
        if self.calibration is None:  # no policy loaded with one: the rule without a package
            self._use(self.calibrate(fallback))

    def _use(self, calibration: ServeCalibration, now: float | None = None) -> None:
        """Make ``calibration`` the one in use (the fallback rebuilt with it); logged and
        exported when it changes. A failed lookup keeps the one in use (logged)."""
        self.calibration_checked = time.time() if now is None else now
        if calibration.warning:
            log_event(
                self.log, "calibration_lookup_failed", logging.WARNING, error=calibration.warning
            )
            if self.calibration is not None:
                return
        if self.calibration is not None and self.calibration.key == calibration.key:
            return
        self.calibration = calibration
        self.model = AnalyticModel(calibration.calibration)
        self.fallback = _heuristic(self.fallback_spec, calibration)
        self.metrics.observe_calibration(calibration.source, calibration.run_id)
        log_event(self.log, "calibration", spec=self.spec.label, **calibration.fields())

    def _calibration_moved(self, now: float) -> bool:
        """Whether a newer cluster fit (or none any more) replaces the one in use: looked up
        every ``calibration_every_s`` while the one in use is not a file or a package's."""
        cal = self.calibration
        if cal is None or cal.source not in ("cluster-fit", "shipped"):
            return False
        if now - self.calibration_checked < self.calibration_every_s:
            return False
        self.calibration_checked = now
        fresh = self.calibrate(self.fallback_spec)  # the rule without a package
        return not fresh.warning and fresh.key != cal.key

    @property
    def active(self) -> LoadedPolicy:
        """The policy to ask now (the fallback when no model is loaded)."""
        return self.current if self.current is not None else self.fallback

    def refresh(self, *, force: bool = False, now: float | None = None) -> None:
        """Reload when the model behind the spec changed (checked every ``reload_s``)."""
        t = time.time() if now is None else now
        if not force and 0 <= t - self.checked_at < self.reload_s:
            return
        self.checked_at = t
        try:
            token = self.probe(self.spec)
        except Exception as exc:
            log_event(self.log, "model_probe_failed", logging.WARNING, error=str(exc)[:300])
            if self.current is None:
                self._fall_back(f"probe failed: {exc}")
            return
        if self.current is not None and token == self.token and not self._calibration_moved(t):
            return
        try:
            loaded = self.loader(self.spec)
        except Exception as exc:
            self.metrics.model_reloads.labels("failed").inc()
            self.token = token  # do not retry the same broken version every cycle
            if self.current is not None:
                log_event(
                    self.log,
                    "model_reload_refused",
                    logging.ERROR,
                    spec=self.spec.label,
                    kept=self.current.model_version,
                    error=str(exc)[:400],
                )
            else:
                self._fall_back(f"load failed: {exc}")
            return
        previous = self.current.model_version if self.current else None
        self.current, self.token, self.fallback_reason = loaded, token, ""
        if loaded.calibration is not None:
            self._use(loaded.calibration, t)
        self.metrics.model_reloads.labels("ok").inc()
        log_event(
            self.log,
            "model_loaded",
            spec=self.spec.label,
            model_version=loaded.model_version,
            obs_spec_version=loaded.obs_spec_version,
            previous=previous,
        )

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason[:400]
        self.metrics.fallbacks.labels("model_unavailable").inc()
        log_event(
            self.log,
            "fallback",
            logging.ERROR,
            spec=self.spec.label,
            fallback=self.fallback.name,
            reason=self.fallback_reason,
        )


@dataclass
class GuardedPolicy:
    """A Policy over a ``PolicyHolder``: times each decision and falls back to the heuristic
    when the policy raises. ``last`` describes the latest decision, with its explanations
    (``deployer.explain``; ``explain_ms``: their cost, outside ``latency_ms``)."""

    holder: PolicyHolder
    metrics: ServeMetrics
    logger: logging.Logger = LOG
    last: dict[str, Any] = field(default_factory=dict)
    # the explanations' contention model for a heuristic (None: the holder's calibration's)
    model: ContentionModel | None = None

    @property
    def name(self) -> str:
        return self.holder.active.name

    def decide(self, state: ClusterState) -> Decision:
        """The holder's decision, or the fallback's when it fails."""
        self.holder.refresh(now=state.time)
        chosen = self.holder.active
        note = f"fallback: {self.holder.fallback_reason}" if self.holder.fallback_reason else ""
        t0 = time.perf_counter()
        steps: tuple[Any, ...] | None = None
        try:
            decision, steps = decide_explained(chosen.policy, state)
        except Exception as exc:
            self.metrics.fallbacks.labels("decide_error").inc()
            log_event(
                self.logger,
                "fallback",
                logging.ERROR,
                policy=chosen.name,
                fallback=self.holder.fallback.name,
                reason=f"decide failed: {exc}"[:400],
            )
            chosen = self.holder.fallback
            note = f"fallback: decide failed: {exc}"[:200]
            decision = chosen.policy.decide(state)
        latency = time.perf_counter() - t0
        self.metrics.decision_seconds.observe(latency)
        self.metrics.serving(
            chosen.name, chosen.model_version, fallback=chosen is self.holder.fallback
        )
        t1 = time.perf_counter()
        explanation = self._explain(state, decision, chosen, steps, note)
        self.last = {
            "policy": chosen.name,
            "model_version": chosen.model_version,
            "obs_spec_version": chosen.obs_spec_version,
            "latency_ms": latency * 1e3,
            "note": note,
            "explanation": explanation,
            "explain_ms": (time.perf_counter() - t1) * 1e3,
        }
        return decision

    def _explain(
        self,
        state: ClusterState,
        decision: Decision,
        chosen: LoadedPolicy,
        steps: tuple[Any, ...] | None,
        note: str,
    ) -> dict[int | None, dict[str, Any]] | None:
        """The cycle's explanations (``deployer.explain``): a model's base is the fallback
        heuristic (asked on the same state), a heuristic is its own base. None (logged) when
        they cannot be built: an explanation never stops a decision."""
        fallback = self.holder.fallback
        own = not self.holder.is_model or chosen is fallback
        try:
            if steps is not None:
                model = chosen.policy.model  # type: ignore[attr-defined]
            else:
                model = self.model or self.holder.model or AnalyticModel(shipped().calibration)
            return explain_cycle(
                state,
                decision,
                policy=chosen.name,
                model_version=chosen.model_version,
                steps=steps,
                base=chosen.name if own else fallback.name,
                base_decision=None if own else fallback.policy.decide(state),
                model=model,
                note=note,
            )
        except Exception as exc:
            log_event(self.logger, "explain_failed", logging.WARNING, error=str(exc)[:300])
            return None
