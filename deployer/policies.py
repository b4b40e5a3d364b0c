"""The live loop's policy: the one named by ``--policy``, reloaded when the model behind it
changes, with a named heuristic as fallback (``PolicyHolder``), and timed, guarded decisions
(``GuardedPolicy``)."""

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
from linkwise.cluster.profiles import load_calibration
from linkwise.deployer.events import log_event
from linkwise.deployer.explain import decide_explained, explain_cycle
from linkwise.deployer.metrics import ServeMetrics
from linkwise.models.build import build_policy, token
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


def _heuristic(spec: PolicySpec) -> LoadedPolicy:
    return LoadedPolicy(spec.build(), spec.label, f"heuristic:{spec.label}", "")


def _learned(spec: PolicySpec, tracking_uri: str | None = None) -> LoadedPolicy:
    policy: Any = build_policy(spec, tracking_uri=tracking_uri)
    package = str(getattr(policy, "package_dir", "") or "")
    # a registry model is recorded by its version number, which is what promotion's shadow
    # evidence looks up; a package folder by its path
    version = (
        package.rsplit("/", 1)[-1] if package.startswith("models:/") else package or spec.label
    )
    obs = getattr(getattr(policy, "spec", None), "version", "")
    return LoadedPolicy(policy, spec.label, version, str(obs))


def model_probe(spec: PolicySpec, tracking_uri: str | None = None) -> str | None:
    """A token that changes when the model behind ``spec`` changes (alias moved, package
    rewritten), read in the registry at ``tracking_uri`` (None: the environment's); None for
    heuristics. Raises when it cannot be read."""
    return token(spec, tracking_uri)


class PolicyHolder:
    """The policy in use: loads ``spec``, reloads it when its probe changes (the ``champion``
    alias moved), keeps the previous model when a new one fails to load or verify, and uses
    the named heuristic ``fallback`` when no model could ever be loaded. A registry model is
    looked up at ``tracking_uri`` (None: the environment's registry)."""

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
    ) -> None:
        self.spec = spec
        self.is_model = spec.is_model
        self.loader = loader or (
            partial(_learned, tracking_uri=tracking_uri) if self.is_model else _heuristic
        )
        self.probe = probe or partial(model_probe, tracking_uri=tracking_uri)
        self.reload_s = reload_s
        self.metrics = metrics
        self.log = logger
        self.fallback = _heuristic(fallback)
        self.current: LoadedPolicy | None = None
        self.token: str | None = None
        self.checked_at = -math.inf
        self.fallback_reason = ""
        self.refresh(force=True)

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
        if self.current is not None and token == self.token:
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
    model: ContentionModel | None = None  # the explanations' contention model (a heuristic's)

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
                if self.model is None:
                    self.model = AnalyticModel(load_calibration(None))
                model = self.model
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
