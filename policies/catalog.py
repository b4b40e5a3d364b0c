"""What each policy is, as ``linkwise policies`` lists it: kind (heuristic, search or
learned), preemptive, migrates, oracle, needs predictions, a one-line description and, for
a composition, the ``compose:`` spec it is (rendered from its parts, ``ComposeSpec.of``).

``policy_catalog`` lists every policy: the named heuristics (each a composition but
``random``), the lookahead over the preemptive QSSF (``DEFAULT_LOOKAHEAD``), and the learned
packages it is given (the command line passes the ones shipped in ``models/pretrained``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from linkwise.policies.compose import ComposeSpec
from linkwise.policies.composed import Composed
from linkwise.policies.heuristics import POLICIES
from linkwise.policies.spec import PolicySpec

__all__ = ["DEFAULT_LOOKAHEAD", "PolicyInfo", "policy_catalog", "policy_info"]

DEFAULT_LOOKAHEAD = "lookahead:base=qssf_preemptive,horizon=6h,n=6"
"""The lookahead ``linkwise policies`` lists: over the preemptive QSSF."""


@dataclass(frozen=True)
class PolicyInfo:
    """What a policy is, as ``linkwise policies`` lists it."""

    name: str
    kind: str  # "heuristic", "search" or "learned"
    preemptive: bool
    migrates: bool
    oracle: bool
    needs_predictions: bool
    description: str
    composition: str | None  # the compose: spec it is (None: not a composition)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def policy_info(spec: PolicySpec) -> PolicyInfo:
    """What the policy ``spec`` names is (a learned one is described, not loaded)."""
    if spec.source is not None:
        return PolicyInfo(
            name=spec.describe(),
            kind=spec.kind,
            preemptive=False,
            migrates=False,
            oracle=False,
            needs_predictions=True,
            description="a learned policy package (its encoder reads run-time predictions)",
            composition=None,
        )
    if spec.search is not None:
        parts = [policy_info(s) for s in spec.inner]
        return PolicyInfo(
            name=spec.describe(),
            kind=spec.kind,
            preemptive=any(p.preemptive for p in parts),
            migrates=any(p.migrates for p in parts),
            oracle=spec.is_oracle,
            needs_predictions=True,
            description="lookahead search: the best of several policies' moves, each continued "
            "by the base in forks of the simulator (run times drawn from the predictor)",
            composition=None,
        )
    policy = spec.build()
    composed = policy if isinstance(policy, Composed) else None
    composition = None if composed is None else ComposeSpec.of(composed).describe()
    if spec.composed is not None:
        name, description = spec.describe(), "a composition of parts (policies.parts)"
        composition = spec.composed.describe()
    else:
        doc = (POLICIES[str(spec.heuristic)].__doc__ or "").strip().splitlines()
        name, description = str(spec.heuristic), doc[0] if doc else ""
    return PolicyInfo(
        name=name,
        kind="heuristic",
        preemptive=composed is not None and composed.preemptive,
        migrates=composed is not None and composed.migrates,
        oracle=spec.is_oracle,
        needs_predictions=spec.needs_predictions,
        description=description,
        composition=composition,
    )


def policy_catalog(learned: Iterable[str] = ()) -> list[PolicyInfo]:
    """Every policy ``linkwise policies`` lists: the registered heuristics (registry order),
    the lookahead, and the learned packages ``learned`` names (``model:PATH`` specs)."""
    specs = [*POLICIES, DEFAULT_LOOKAHEAD, *learned]
    return [policy_info(PolicySpec.parse(s)) for s in specs]
