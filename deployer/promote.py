"""Promotion by MLflow aliases: challenger -> shadow -> champion, and rollback.

On the registered model ``linkwise-policy`` (``models.registry``):

- ``promote_challenger``: a challenger whose gate report passed (``evaluation.gates
  .check_challenger``) gets the alias ``shadow`` (the live loop runs it in shadow mode).
  Refused when the gate failed or the ``challenger`` alias no longer points at the version
  the evidence is about (stale evidence).
- ``promote_shadow``: a shadow whose shadow-mode evidence passed (``check_shadow``) becomes
  ``champion``; the champion it replaces keeps the alias ``previous``; ``shadow`` is removed.
- ``rollback``: ``champion`` goes back to the ``previous`` version, ``previous`` is removed
  (one step back, not a toggle) and the demoted version is tagged ``linkwise.rolled_back``.

Every decision, pass or fail, is one MLflow run in the ``linkwise-promotion`` experiment
(params: action, model, versions, aliases before and after; metrics: the gates' numbers;
tags: passed; ``decision.json`` artifact with the reasons) and is printed by the CLI.

``shadow_evidence`` gathers the shadow gate's evidence from the live loop's DuckDB store: the
shadow version's cycles in the ``decisions`` table (``ts``, ``mode``, ``model_version``,
``cycle_id``), and the shadow report of its window (``evaluation.shadow_replay``): the jobs of
the logged window replayed in the simulator under the shadow policy, warm-started from the
accounting at the window's start, against the JCTs Slurm actually achieved, with the paired
bootstrap intervals the gate reads (``ShadowGates.require_ci``). The replay uses each job's
actual run time as its isolated time (real runs include real contention): an approximation to
read with the ratio, documented in the evidence.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from linkwise.evaluation.gates import GateReport, ShadowEvidence
from linkwise.evaluation.shadow_replay import shadow_report
from linkwise.models.registry import ensure_experiment, registry_client
from linkwise.policies.source import MODEL_NAME, parse_models_uri
from linkwise.policies.spec import PolicySpec

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "EXPERIMENT",
    "PREVIOUS",
    "SERVED_ALIAS",
    "SHADOW",
    "PromotionDecision",
    "current_aliases",
    "log_decision",
    "promote_challenger",
    "promote_shadow",
    "rollback",
    "serving_refusal",
    "shadow_evidence",
]

CHALLENGER, SHADOW, CHAMPION, PREVIOUS = "challenger", "shadow", "champion", "previous"
EXPERIMENT = "linkwise-promotion"
# the registry alias each mode of ``linkwise serve`` serves: a shadow loop runs the model the
# evaluation gate promoted (@shadow), gathering the evidence ``promote --stage champion``
# gates; an active loop runs only the model that gate passed (@champion)
SERVED_ALIAS: Mapping[str, str] = {"shadow": SHADOW, "active": CHAMPION}


def serving_refusal(mode: str, policy: PolicySpec) -> str | None:
    """Why ``linkwise serve --mode MODE --policy POLICY`` is refused, or None. An active loop
    decides for the cluster: from the registry it takes only ``@champion`` (a model whose shadow
    evidence passed the champion gate), never another alias such as ``@challenger`` (not gated
    on the cluster) or ``@shadow`` (gated on the evaluation only). A pinned version
    (``models:/NAME/N``), a local package and a heuristic are the operator's explicit choice."""
    source = policy.source
    if mode != "active" or source is None:
        return None
    alias: str | None = source.target if source.kind == "alias" else None
    if source.kind == "uri" and "@" in source.target:
        alias = parse_models_uri(source.target)[1]
    if alias is None or alias == CHAMPION:
        return None
    return (
        f"active mode serves the registry's @{CHAMPION} only, not @{alias}: "
        f"{policy.label} has not passed the champion gate on this cluster's shadow evidence. Serve "
        f"it in shadow mode (--mode shadow --policy model:{SHADOW} after `linkwise promote "
        f"--stage shadow`), then `linkwise promote --stage champion` and serve "
        f"model:{CHAMPION}; or pin a version explicitly (model:models:/{MODEL_NAME}/N)"
    )


@dataclass(frozen=True)
class PromotionDecision:
    """One promotion decision and what it did to the aliases."""

    action: str  # "challenger->shadow", "shadow->champion" or "rollback"
    model: str
    version: str | None
    passed: bool
    reasons: tuple[str, ...]
    aliases_before: dict[str, str]
    aliases_after: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        head = (
            f"{self.action} {self.model} version {self.version or '-'}: "
            f"{'DONE' if self.passed else 'REFUSED'}"
        )
        moved = ", ".join(f"@{a}={v}" for a, v in sorted(self.aliases_after.items())) or "none"
        lines = [head, *(f"  {r}" for r in self.reasons), f"  aliases now: {moved}"]
        if self.run_id:
            lines.append(f"  MLflow run: {self.run_id}")
        return "\n".join(lines)


def current_aliases(tracking_uri: str, name: str | None = None) -> dict[str, str]:
    """The registered model's aliases (alias -> version); empty when it does not exist."""
    # MLflow takes about a second to import: only where a run or the registry is used
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    try:
        rm = client.get_registered_model(name or MODEL_NAME)
    except MlflowException:
        return {}
    return {str(a): str(v) for a, v in (rm.aliases or {}).items()}


def log_decision(
    decision: PromotionDecision, *, tracking_uri: str, experiment: str = EXPERIMENT
) -> str:
    """Record a decision as an MLflow run (see the module docstring); the run id."""

    client = registry_client(tracking_uri)
    exp = ensure_experiment(client, experiment, tracking_uri=tracking_uri)
    run = client.create_run(
        exp,
        run_name=f"{decision.action} v{decision.version or '-'}",
        tags={
            "linkwise.promotion.passed": str(decision.passed).lower(),
            "linkwise.promotion.action": decision.action,
        },
    )
    rid = str(run.info.run_id)
    try:
        params = {
            "action": decision.action,
            "model": decision.model,
            "version": decision.version or "",
            "passed": str(decision.passed),
            "aliases_before": json.dumps(decision.aliases_before, sort_keys=True),
            "aliases_after": json.dumps(decision.aliases_after, sort_keys=True),
        }
        for key, text in params.items():
            client.log_param(rid, key, text[:500])
        client.log_metric(rid, "passed", 1.0 if decision.passed else 0.0)
        for k, v in decision.metrics.items():
            if math.isfinite(v):
                client.log_metric(rid, k, float(v))
        with tempfile.TemporaryDirectory(prefix="linkwise-decision-") as tmp:
            path = Path(tmp) / "decision.json"
            body = {**decision.to_json(), "run_id": rid, "logged_at": time.time()}
            path.write_text(json.dumps(body, indent=1, default=str) + "\n")
            client.log_artifact(rid, str(path))
    finally:
        client.set_terminated(rid)
    return rid


def _finish(d: PromotionDecision, tracking_uri: str, log: bool) -> PromotionDecision:
    if not log:
        return d
    rid = log_decision(d, tracking_uri=tracking_uri)
    return PromotionDecision(**{**asdict(d), "run_id": rid})


def _refused(
    action: str,
    name: str,
    version: str | None,
    reasons: list[str],
    aliases: dict[str, str],
    report: GateReport | None,
    evidence: Mapping[str, Any] | None,
) -> PromotionDecision:
    return PromotionDecision(
        action=action,
        model=name,
        version=version,
        passed=False,
        reasons=tuple(reasons),
        aliases_before=aliases,
        aliases_after=aliases,
        metrics=report.metrics() if report else {},
        evidence=dict(evidence or {}),
    )


def _promote(
    report: GateReport,
    version: str,
    *,
    action: str,
    holder: str,
    move: Callable[[Any, str, str, Mapping[str, str]], list[str]],
    tracking_uri: str,
    name: str | None,
    evidence: Mapping[str, Any] | None,
    log: bool,
) -> PromotionDecision:
    """Apply ``move`` (client, model, version, aliases before -> reasons) if ``version`` still
    holds the alias ``holder`` and its gate report passed; log the decision either way."""

    model = name or MODEL_NAME
    before = current_aliases(tracking_uri, model)
    reasons = list(report.reasons)
    stale = before.get(holder) != str(version)
    if stale:
        reasons.append(
            f"FAIL fresh_evidence: @{holder} is {before.get(holder, 'unset')}, "
            f"the evidence is about version {version}"
        )
    if stale or not report.passed:
        return _finish(
            _refused(action, model, version, reasons, before, report, evidence), tracking_uri, log
        )
    reasons += move(registry_client(tracking_uri), model, str(version), before)
    d = PromotionDecision(
        action=action,
        model=model,
        version=str(version),
        passed=True,
        reasons=tuple(reasons),
        aliases_before=before,
        aliases_after=current_aliases(tracking_uri, model),
        metrics=report.metrics(),
        evidence=dict(evidence or {}),
    )
    return _finish(d, tracking_uri, log)


def _to_shadow(client: Any, model: str, version: str, before: Mapping[str, str]) -> list[str]:
    client.set_registered_model_alias(model, SHADOW, version)
    return [f"@shadow -> version {version}"]


def _to_champion(client: Any, model: str, version: str, before: Mapping[str, str]) -> list[str]:
    reasons: list[str] = []
    old = before.get(CHAMPION)
    if old is not None and old != version:
        client.set_registered_model_alias(model, PREVIOUS, old)
        reasons.append(f"@previous -> version {old} (the champion it replaces)")
    client.set_registered_model_alias(model, CHAMPION, version)
    client.delete_registered_model_alias(model, SHADOW)
    reasons.append(f"@champion -> version {version}; @shadow removed")
    return reasons


def promote_challenger(
    report: GateReport,
    version: str,
    *,
    tracking_uri: str,
    name: str | None = None,
    evidence: Mapping[str, Any] | None = None,
    log: bool = True,
) -> PromotionDecision:
    """Point ``shadow`` at ``version`` if its gate report passed and it is still the
    challenger; log the decision either way."""
    return _promote(
        report,
        version,
        action="challenger->shadow",
        holder=CHALLENGER,
        move=_to_shadow,
        tracking_uri=tracking_uri,
        name=name,
        evidence=evidence,
        log=log,
    )


def promote_shadow(
    report: GateReport,
    version: str,
    *,
    tracking_uri: str,
    name: str | None = None,
    evidence: Mapping[str, Any] | None = None,
    log: bool = True,
) -> PromotionDecision:
    """Make the shadow ``version`` the champion if its shadow gate passed (the old champion
    becomes ``previous``, ``shadow`` is removed); log the decision either way."""
    return _promote(
        report,
        version,
        action="shadow->champion",
        holder=SHADOW,
        move=_to_champion,
        tracking_uri=tracking_uri,
        name=name,
        evidence=evidence,
        log=log,
    )


def rollback(*, tracking_uri: str, name: str | None = None, log: bool = True) -> PromotionDecision:
    """Move ``champion`` back to ``previous`` (refused, and logged, when there is none)."""

    model = name or MODEL_NAME
    before = current_aliases(tracking_uri, model)
    prev, cur = before.get(PREVIOUS), before.get(CHAMPION)
    if prev is None:
        d = _refused(
            "rollback",
            model,
            cur,
            ["FAIL previous: no @previous version to roll back to"],
            before,
            None,
            None,
        )
        return _finish(d, tracking_uri, log)
    client = registry_client(tracking_uri)
    client.set_registered_model_alias(model, CHAMPION, prev)
    client.delete_registered_model_alias(model, PREVIOUS)
    if cur is not None:
        client.set_model_version_tag(model, cur, "linkwise.rolled_back", str(time.time()))
    d = PromotionDecision(
        action="rollback",
        model=model,
        version=prev,
        passed=True,
        reasons=(f"@champion {cur or 'unset'} -> version {prev}; @previous removed",),
        aliases_before=before,
        aliases_after=current_aliases(tracking_uri, model),
    )
    return _finish(d, tracking_uri, log)


# ------------------------------------------------------------------------ shadow evidence


def shadow_evidence(
    con: Any,
    version: str,
    *,
    policy: PolicySpec | None = None,
    topology: Any,
    calibration: Any,
    cluster: str | None = None,
    seed: int = 0,
    tracking_uri: str | None = None,
    n_boot: int = 2000,
) -> tuple[ShadowEvidence, dict[str, Any]]:
    """The shadow gate's evidence from a live store (see the module docstring): the shadow
    report of the version's shadow window (``evaluation.shadow_replay``) and a JSON-able
    description (window, headline, deviations, the simulator's check, approximations).
    ``policy``: the spec to replay; None replays the registry version itself,
    ``model:models:/NAME/VERSION`` at ``tracking_uri``."""
    (row,) = con.execute(
        "SELECT count(DISTINCT cycle_id), min(ts), max(ts) FROM decisions "
        "WHERE mode = 'shadow' AND model_version = ?",
        [str(version)],
    ).fetchall()
    cycles = int(row[0]) if row else 0
    since = float(row[1]) if row and row[1] is not None else None
    until = float(row[2]) if row and row[2] is not None else None
    info: dict[str, Any] = {
        "since": since,
        "until": until,
        "approximations": "replay warm-started from the accounting at the window's start; "
        "isolated time = Slurm's actual run time (includes real contention, so the replay is "
        "pessimistic for the shadow policy); unfinished jobs left out",
    }
    empty = ShadowEvidence(
        str(version), cycles, since, until, 0, math.nan, math.nan, math.nan, math.nan
    )
    if since is None or until is None:
        return empty, info
    spec = policy or PolicySpec.parse(f"model:models:/{MODEL_NAME}/{version}")
    try:
        report = shadow_report(
            con,
            topology=topology,
            calibration=calibration,
            policy=spec,
            model_version=str(version),
            cluster=cluster,
            tracking_uri=tracking_uri,
            seed=seed,
            n_boot=n_boot,
        )
    except ValueError as exc:  # no finished job in the window: nothing to compare
        return empty, {**info, "shadow_report": str(exc)}
    avg, p99 = report.interval("avg_jct"), report.interval("p99_jct")
    ev = ShadowEvidence(
        version=str(version),
        cycles=cycles,
        since=since,
        until=until,
        jobs=report.jobs,
        sim_avg_jct_s=report.values["policy"]["avg_jct"],
        actual_avg_jct_s=report.values["accounting"]["avg_jct"],
        sim_p99_jct_s=report.values["policy"]["p99_jct"],
        actual_p99_jct_s=report.values["accounting"]["p99_jct"],
        avg_jct_ci=_ci(avg),
        p99_jct_ci=_ci(p99),
    )
    info |= {
        "headline": report.headline(),
        "policy_spec": report.policy_spec,
        "backlog": report.backlog,
        "deviations": report.deviations,
        "profiles": report.profiles,  # the window's jobs: learned from history or the mix
        "backfill_over_accounting_avg_jct": report.interval(
            "avg_jct", "backfill", "accounting"
        ).words(),
    }
    return ev, info


def _ci(i: Any) -> tuple[float, float] | None:
    return None if i.low is None or i.high is None else (float(i.low), float(i.high))
