"""Promotion gates: pure checks of evidence against thresholds from a TOML file.

Two stages (``evaluation/gates.toml`` documents every threshold):

- ``check_challenger``: challenger -> shadow. On the held-out benchmark the challenger's avg
  JCT is lower than the champion's and than the best heuristic's by a margin (paired ratio
  point estimate ``<= 1 - margin``, and with ``require_ci`` the interval's upper end ``< 1``;
  the best heuristic is the best *same-information* one, never an oracle ceiling
  (``PolicySpec.is_oracle``: an oracle reads the true run time; evidence naming one
  as the reference fails): the candidates are every non-oracle heuristic ``linkwise
  policies`` lists (``same_information_heuristics``: the frontier ``qssf_preemptive``,
  ``tiresias_consolidated`` and ``deepshare`` among them, and any ``compose:`` spec whose
  order reads no true run time), the default policy lists of ``compare`` and ``evaluate``
  run them all, and the reference is the one with the lowest avg JCT in the benchmark,
  its p99 JCT no worse (ratio ``<= 1 + p99_tolerance``); its FQE estimate is not below the
  behaviour policy's value (``estimate >= reference - fqe_tolerance * spread``, the reference
  being FQE's own estimate of the behaviour policy when given, which shares FQE's bias, else
  the behaviour's observed return); its p99 decision latency is within budget; it took no
  masked action. Without a champion the champion check passes ("no champion yet"); missing
  evidence (no FQE numbers, no heuristic in the benchmark, masked actions not checked) fails.
- ``check_shadow``: shadow -> champion. Enough shadow-mode cycles in the live loop's log,
  enough jobs in the replayed window, and the counterfactual JCTs (the shadow policy replayed
  in the simulator on the logged window, warm-started from the accounting:
  ``evaluation.shadow_replay``) no worse than what Slurm achieved, by ratio; with
  ``require_ci`` the upper end of the report's paired bootstrap interval as well.

Every check yields a ``Check`` with its numbers and a reason, pass or fail.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from linkwise.cluster.metrics import duration_text
from linkwise.evaluation.stats import RatioCI
from linkwise.policies.catalog import policy_info
from linkwise.policies.heuristics import POLICIES
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_GATES",
    "ChallengerEvidence",
    "ChallengerGates",
    "Check",
    "GateConfig",
    "GateReport",
    "OpeEvidence",
    "ShadowEvidence",
    "ShadowGates",
    "check_challenger",
    "check_robustness",
    "check_shadow",
    "load_gates",
    "ope_evidence",
    "same_information_heuristics",
]

DEFAULT_GATES = Path(__file__).with_name("gates.toml")


def same_information_heuristics(*, predictions: bool = True) -> list[str]:
    """The heuristics a gate may take as its reference, in ``linkwise policies`` order: every
    one that is no oracle ceiling (it reads no true run time), with the ones that need
    run-time predictions only when ``predictions``."""
    out = []
    for name in POLICIES:
        info = policy_info(PolicySpec.parse(name))
        if (
            info.kind == "heuristic"
            and not info.oracle
            and (predictions or not info.needs_predictions)
        ):
            out.append(name)
    return out


@dataclass(frozen=True)
class ChallengerGates:
    """Thresholds for challenger -> shadow."""

    margin_vs_champion: float = 0.02
    margin_vs_heuristic: float = 0.02
    require_ci: bool = True
    p99_tolerance: float = 0.0
    fqe_tolerance: float = 0.0
    latency_budget_ms: float = 200.0
    max_masked_actions: int = 0


@dataclass(frozen=True)
class ShadowGates:
    """Thresholds for shadow -> champion."""

    min_cycles: int = 100
    max_avg_jct_ratio: float = 1.0
    max_p99_jct_ratio: float = 1.0
    min_jobs: int = 20
    require_ci: bool = False  # the shadow report's interval must lie below the ratio too


@dataclass(frozen=True)
class GateConfig:
    """Both stages' thresholds."""

    challenger: ChallengerGates = field(default_factory=ChallengerGates)
    shadow: ShadowGates = field(default_factory=ShadowGates)
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _section(cls: Any, data: Mapping[str, Any], name: str) -> Any:
    known = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"gates [{name}]: unknown keys {unknown} (known: {sorted(known)})")
    out = cls(**data)
    for f in fields(cls):
        v = getattr(out, f.name)
        if isinstance(v, bool):
            continue
        if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"gates [{name}] {f.name}: expected a non-negative number, got {v!r}")
    return out


def load_gates(path: str | Path | None = None) -> GateConfig:
    """Gate thresholds from a TOML file (default: ``evaluation/gates.toml``)."""
    p = Path(path) if path is not None else DEFAULT_GATES
    data = tomllib.loads(p.read_text())
    unknown = sorted(set(data) - {"challenger", "shadow"})
    if unknown:
        raise ValueError(f"{p}: unknown sections {unknown} (challenger, shadow)")
    return GateConfig(
        challenger=_section(ChallengerGates, data.get("challenger", {}), "challenger"),
        shadow=_section(ShadowGates, data.get("shadow", {}), "shadow"),
        source=str(p),
    )


# ------------------------------------------------------------------------ evidence


@dataclass(frozen=True)
class OpeEvidence:
    """FQE's estimated value of a policy, the behaviour policy's observed return and, when
    known, FQE's estimate of the behaviour policy itself (the fairer reference)."""

    estimate: float
    behaviour_return: float
    spread: float = 0.0
    behaviour_estimate: float | None = None

    @property
    def reference(self) -> float:
        """What the estimate is compared with: like for like where possible."""
        if self.behaviour_estimate is not None:
            return self.behaviour_estimate
        return self.behaviour_return


def ope_evidence(ope: Mapping[str, Any] | None, policy: str) -> OpeEvidence | None:
    """A policy's entry of an OPE mapping ``policy -> {estimate, behaviour_return, spread}``
    (as ``evaluation.ope`` gives it), or None when absent."""
    if not ope or policy not in ope:
        return None
    e = ope[policy]
    data: Mapping[str, Any] = e if isinstance(e, Mapping) else vars(e)
    return OpeEvidence(
        estimate=float(data["estimate"]),
        behaviour_return=float(data["behaviour_return"]),
        spread=float(data.get("spread", 0.0) or 0.0),
        behaviour_estimate=(
            float(data["behaviour_estimate"])
            if data.get("behaviour_estimate") is not None
            else None
        ),
    )


@dataclass(frozen=True)
class ChallengerEvidence:
    """What the challenger gate looks at (from the benchmark, its statistics and FQE)."""

    challenger: str
    version: str | None
    champion: str | None
    avg_vs_champion: RatioCI | None
    p99_vs_champion: RatioCI | None
    best_heuristic: str | None
    avg_vs_heuristic: RatioCI | None
    p99_vs_heuristic: RatioCI | None
    ope: OpeEvidence | None
    latency_ms_p99: float
    masked_actions: int | None
    # whether ``best_heuristic`` is an oracle ceiling (``PolicySpec.is_oracle`` of its spec)
    best_heuristic_oracle: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ShadowEvidence:
    """What the shadow gate looks at: the live loop's cycles of the shadow version and the
    counterfactual replay of its logged window against Slurm's actual JCTs."""

    version: str
    cycles: int
    since: float | None
    until: float | None
    jobs: int
    sim_avg_jct_s: float
    actual_avg_jct_s: float
    sim_p99_jct_s: float
    actual_p99_jct_s: float
    # the shadow report's paired bootstrap intervals of the ratios (evaluation.shadow_replay)
    avg_jct_ci: tuple[float, float] | None = None
    p99_jct_ci: tuple[float, float] | None = None

    @property
    def avg_jct_ratio(self) -> float:
        return self.sim_avg_jct_s / self.actual_avg_jct_s if self.actual_avg_jct_s > 0 else math.nan

    @property
    def p99_jct_ratio(self) -> float:
        return self.sim_p99_jct_s / self.actual_p99_jct_s if self.actual_p99_jct_s > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "avg_jct_ratio": self.avg_jct_ratio,
            "p99_jct_ratio": self.p99_jct_ratio,
        }


# ------------------------------------------------------------------------ results


@dataclass(frozen=True)
class Check:
    """One gate's outcome."""

    name: str
    passed: bool
    reason: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GateReport:
    """All checks of a stage for one subject; passed when every check passed."""

    stage: str  # "challenger->shadow" or "shadow->champion"
    subject: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def reasons(self) -> list[str]:
        return [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.reason}" for c in self.checks]

    def metrics(self) -> dict[str, float]:
        """Every number of every check, as ``name.key`` (finite values only)."""
        return {
            f"{c.name}.{k}": float(v)
            for c in self.checks
            for k, v in c.values.items()
            if math.isfinite(float(v))
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "subject": self.subject,
            "passed": self.passed,
            "checks": [asdict(c) for c in self.checks],
        }

    def format(self) -> str:
        head = f"{self.stage} {self.subject}: {'PASSED' if self.passed else 'REFUSED'}"
        return "\n".join([head, *(f"  {r}" for r in self.reasons)])


def _ci_values(r: RatioCI) -> dict[str, float]:
    return {"ratio": r.ratio, "low": r.low, "high": r.high}


def _better(name: str, ref: str, r: RatioCI | None, margin: float, require_ci: bool) -> Check:
    if r is None:
        return Check(name, False, f"missing evidence: no paired avg-JCT ratio against {ref}")
    limit = 1.0 - margin
    ok = r.ratio <= limit and (not require_ci or r.high < 1.0)
    ci = f"{r.level:.0%} CI [{r.low:.3f}, {r.high:.3f}]"
    why = (
        f"avg JCT ratio vs {r.baseline} {r.ratio:.3f} ({ci}) "
        f"{'<=' if r.ratio <= limit else '>'} {limit:.3f}"
    )
    if require_ci:
        why += f"; CI upper end {'<' if r.high < 1.0 else '>='} 1"
    return Check(name, ok, why, {**_ci_values(r), "limit": limit})


def _no_worse(name: str, ref: str, r: RatioCI | None, tolerance: float) -> Check:
    if r is None:
        return Check(name, False, f"missing evidence: no paired p99-JCT ratio against {ref}")
    limit = 1.0 + tolerance
    ok = r.ratio <= limit
    why = f"p99 JCT ratio vs {r.baseline} {r.ratio:.3f} {'<=' if ok else '>'} {limit:.3f}"
    return Check(name, ok, why, {**_ci_values(r), "limit": limit})


def check_challenger(ev: ChallengerEvidence, cfg: ChallengerGates) -> GateReport:
    """The challenger -> shadow gate (see the module docstring)."""
    checks: list[Check] = []
    if ev.champion is None:
        checks.append(Check("better_than_champion", True, "no champion yet"))
        checks.append(Check("p99_vs_champion", True, "no champion yet"))
    else:
        checks.append(
            _better(
                "better_than_champion",
                ev.champion,
                ev.avg_vs_champion,
                cfg.margin_vs_champion,
                cfg.require_ci,
            )
        )
        checks.append(
            _no_worse("p99_vs_champion", ev.champion, ev.p99_vs_champion, cfg.p99_tolerance)
        )
    ref = ev.best_heuristic or "the best heuristic"
    if ev.best_heuristic is not None and ev.best_heuristic_oracle:
        why = (
            f"{ev.best_heuristic} is an oracle ceiling (it reads the true run time): never a "
            "gate reference; compare with the best non-oracle heuristic"
        )
        checks.append(Check("better_than_best_heuristic", False, why))
        checks.append(Check("p99_vs_best_heuristic", False, why))
    else:
        checks.append(
            _better(
                "better_than_best_heuristic",
                ref,
                ev.avg_vs_heuristic if ev.best_heuristic else None,
                cfg.margin_vs_heuristic,
                cfg.require_ci,
            )
        )
        checks.append(
            _no_worse(
                "p99_vs_best_heuristic",
                ref,
                ev.p99_vs_heuristic if ev.best_heuristic else None,
                cfg.p99_tolerance,
            )
        )
    if ev.ope is None:
        checks.append(
            Check(
                "fqe_not_below_behaviour",
                False,
                "missing evidence: no FQE estimate for the challenger",
            )
        )
    else:
        o = ev.ope
        floor = o.reference - cfg.fqe_tolerance * o.spread
        ok = o.estimate >= floor
        what = "behaviour FQE estimate" if o.behaviour_estimate is not None else "behaviour return"
        checks.append(
            Check(
                "fqe_not_below_behaviour",
                ok,
                f"FQE estimate {o.estimate:.4g} (spread {o.spread:.3g}) {'>=' if ok else '<'} "
                f"{what} {o.reference:.4g}"
                + (f" - {cfg.fqe_tolerance:g} x spread" if cfg.fqe_tolerance else ""),
                {
                    "estimate": o.estimate,
                    "behaviour_return": o.behaviour_return,
                    "reference": o.reference,
                    "spread": o.spread,
                    "floor": floor,
                },
            )
        )
    lat_ok = math.isfinite(ev.latency_ms_p99) and ev.latency_ms_p99 <= cfg.latency_budget_ms
    checks.append(
        Check(
            "decision_latency",
            lat_ok,
            f"p99 decision latency {ev.latency_ms_p99:.1f} ms "
            f"{'<=' if lat_ok else '>'} budget {cfg.latency_budget_ms:g} ms",
            {"p99_ms": ev.latency_ms_p99, "budget_ms": cfg.latency_budget_ms},
        )
    )
    if ev.masked_actions is None:
        checks.append(
            Check(
                "no_masked_actions",
                False,
                "missing evidence: the challenger's actions were not checked "
                "against the mask (not a step policy)",
            )
        )
    else:
        ok = ev.masked_actions <= cfg.max_masked_actions
        checks.append(
            Check(
                "no_masked_actions",
                ok,
                f"{ev.masked_actions} masked actions taken (allowed {cfg.max_masked_actions})",
                {"masked_actions": float(ev.masked_actions)},
            )
        )
    subject = ev.challenger + (f" (version {ev.version})" if ev.version else "")
    return GateReport("challenger->shadow", subject, tuple(checks))


def check_shadow(ev: ShadowEvidence, cfg: ShadowGates) -> GateReport:
    """The shadow -> champion gate (see the module docstring)."""
    checks = [
        Check(
            "shadow_cycles",
            ev.cycles >= cfg.min_cycles,
            f"{ev.cycles} shadow-mode cycles logged (need {cfg.min_cycles})",
            {"cycles": float(ev.cycles), "min": float(cfg.min_cycles)},
        ),
        Check(
            "replayed_jobs",
            ev.jobs >= cfg.min_jobs,
            f"{ev.jobs} jobs in the logged window replayed (need {cfg.min_jobs})",
            {"jobs": float(ev.jobs), "min": float(cfg.min_jobs)},
        ),
    ]
    for stat, ratio, limit, sim, act, ci in (
        ("avg", ev.avg_jct_ratio, cfg.max_avg_jct_ratio, ev.sim_avg_jct_s, ev.actual_avg_jct_s,
         ev.avg_jct_ci),
        ("p99", ev.p99_jct_ratio, cfg.max_p99_jct_ratio, ev.sim_p99_jct_s, ev.actual_p99_jct_s,
         ev.p99_jct_ci),
    ):  # fmt: skip
        ok = math.isfinite(ratio) and ratio <= limit
        reason = (
            f"replayed {stat} JCT {duration_text(sim)} vs Slurm's {duration_text(act)}: "
            f"ratio {ratio:.3f} "
            f"{'<=' if ok else '>'} {limit:.3f}"
        )
        values = {"ratio": ratio, "limit": limit, "simulated_s": sim, "actual_s": act}
        if ci is not None:
            values |= {"low": ci[0], "high": ci[1]}
            reason += f"; interval [{ci[0]:.3f}, {ci[1]:.3f}]"
        if cfg.require_ci:
            below = ci is not None and math.isfinite(ci[1]) and ci[1] <= limit
            if ci is None:
                reason += "; no interval (missing evidence)"
            elif not below:
                reason += f": the interval's upper end is not <= {limit:.3f}"
            ok = ok and below
        checks.append(Check(f"counterfactual_{stat}_jct", ok, reason, values))
    return GateReport("shadow->champion", f"version {ev.version}", tuple(checks))


ROBUST_MAX_RATIO = 1.02  # issue 23 item 5: no off-cluster case worse than 1.02x the base


def check_robustness(
    subject: str,
    cases: Mapping[str, tuple[float, float]],
    max_ratio: float = ROBUST_MAX_RATIO,
    *,
    min_cases: int = 5,
) -> GateReport:
    """The robustness gate: for each off-cluster case (name -> (the package's avg JCT, its
    base's)), the ratio at most ``max_ratio``; fewer than ``min_cases`` cases (three sizes
    by two fabrics, less the trained one) is missing evidence. ``pipelines.residual.robustness``
    gives the figures."""
    checks = [
        Check(
            "robust_cases",
            len(cases) >= min_cases,
            f"{len(cases)} off-cluster cases (need {min_cases})",
            {"cases": float(len(cases)), "min": float(min_cases)},
        )
    ]
    for name, (avg, base) in cases.items():
        ratio = avg / base if base > 0 else math.inf
        ok = math.isfinite(ratio) and ratio <= max_ratio
        checks.append(
            Check(
                f"robust_{name}",
                ok,
                f"avg JCT {duration_text(avg)} vs its base's {duration_text(base)}: "
                f"ratio {ratio:.3f} "
                f"{'<=' if ok else '>'} {max_ratio:.3f}",
                {"ratio": ratio, "limit": max_ratio, "avg_jct_s": avg, "base_avg_jct_s": base},
            )
        )
    return GateReport("robustness", subject, tuple(checks))
