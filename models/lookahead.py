"""The lookahead search policy built from its spec (``cluster.lookahead``): the base and the
alternatives are any policy specs (``models.policy_spec``), built here, at the edge."""

from __future__ import annotations

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.heuristics import PolicyInfo
from linkwise.cluster.lookahead import Lookahead, LookaheadSpec
from linkwise.cluster.profiles import load_calibration

__all__ = ["DEFAULT_SPEC", "build_lookahead", "lookahead_info"]

DEFAULT_SPEC = "lookahead:base=qssf_preemptive,horizon=6h,n=6"
"""The lookahead ``linkwise policies`` lists: over the preemptive QSSF."""


def build_lookahead(spec: LookaheadSpec, model: ContentionModel | None = None) -> Lookahead:
    """The lookahead policy: its base and alternatives built from their specs; its forks
    predict contention with ``model`` (default: the shipped calibration's analytic model,
    what a scheduler knows, not the scenario's true contention)."""
    from linkwise.models.policy_spec import PolicySpec  # policy_spec imports this module

    belief = model or AnalyticModel(load_calibration(None))
    base = PolicySpec.parse(spec.base).build(belief)
    alts = tuple(PolicySpec.parse(a).build(belief) for a in spec.alternatives)
    return spec.make(base, alts, belief)


def lookahead_info(spec: LookaheadSpec) -> PolicyInfo:
    """What the lookahead is (``linkwise policies``): kind ``search``; preemptive or
    migrating when its base or an alternative is; it needs run-time predictions (its forks
    draw run times from them); an oracle only with ``oracle=true``."""
    from linkwise.models.policy_spec import PolicySpec

    parts = [PolicySpec.parse(s).info() for s in (spec.base, *spec.alternatives)]
    return PolicyInfo(
        name=spec.describe(),
        kind="search",
        preemptive=any(p.preemptive for p in parts),
        migrates=any(p.migrates for p in parts),
        oracle=spec.oracle,
        needs_predictions=True,
        description="lookahead search: the best of several policies' moves, each continued "
        "by the base in forks of the simulator (run times drawn from the predictor)",
        composition=None,
    )
