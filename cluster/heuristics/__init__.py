"""Heuristic schedulers behind the ``Policy`` protocol, and a registry to build them by name.

``fifo`` (strict FIFO, first fit), ``backfill`` (EASY backfill as Slurm's sched/backfill),
``best_fit`` (greedy scan, consolidated placement), ``sjf_bco`` (SJF-BCO, MobiHoc'22),
``tiresias_las`` (Tiresias' discretised 2D-LAS, preemptive), ``random`` (seeded) and
``qssf`` (Helios' quasi-shortest-service-first on predicted GPU time: needs run-time
predictions, ``Job.pred_s``); the frontier (``frontier``): ``qssf_preemptive``,
``tiresias_consolidated`` and ``deepshare``.

Every one but ``random`` is a named composition of parts (``cluster.compose``: its
``composition`` property is the ``compose:`` spec it is); ``policy_info`` says what each
is (preemptive, migrates, oracle, needs predictions).

Oracle ceilings, which read the true remaining run time no real scheduler has
(``ORACLE_POLICIES``, ``is_oracle``): ``sjf_bco_oracle`` and ``srtf_oracle`` (preemptive).
Tables mark them ``oracle``; gates never take one as a reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from linkwise.cluster.compose import ComposeSpec
from linkwise.cluster.domain import Policy
from linkwise.cluster.heuristics._common import MissingPredictions
from linkwise.cluster.heuristics.backfill import Backfill
from linkwise.cluster.heuristics.best_fit import BestFit
from linkwise.cluster.heuristics.fifo import Fifo
from linkwise.cluster.heuristics.frontier import DeepShare, QssfPreemptive, TiresiasConsolidated
from linkwise.cluster.heuristics.oracle import SjfBcoOracle, SrtfOracle
from linkwise.cluster.heuristics.qssf import Qssf
from linkwise.cluster.heuristics.random_policy import RandomPolicy
from linkwise.cluster.heuristics.sjf_bco import SjfBco
from linkwise.cluster.heuristics.tiresias import TiresiasLas

__all__ = [
    "ORACLE_POLICIES",
    "POLICIES",
    "PREDICTION_POLICIES",
    "Backfill",
    "BestFit",
    "DeepShare",
    "Fifo",
    "MissingPredictions",
    "PolicyInfo",
    "Qssf",
    "QssfPreemptive",
    "RandomPolicy",
    "SjfBco",
    "SjfBcoOracle",
    "SrtfOracle",
    "TiresiasConsolidated",
    "TiresiasLas",
    "is_oracle",
    "make_policy",
    "needs_predictions",
    "policy_info",
    "policy_names",
    "spec_name",
]

POLICIES: Mapping[str, Callable[..., Policy]] = MappingProxyType(
    {
        "fifo": Fifo,
        "backfill": Backfill,
        "best_fit": BestFit,
        "sjf_bco": SjfBco,
        "tiresias_las": TiresiasLas,
        "random": RandomPolicy,
        "qssf": Qssf,
        "qssf_preemptive": QssfPreemptive,
        "tiresias_consolidated": TiresiasConsolidated,
        "deepshare": DeepShare,
        "sjf_bco_oracle": SjfBcoOracle,
        "srtf_oracle": SrtfOracle,
    }
)

# heuristics that read the true run time: ceilings, marked ``oracle``, never a gate reference
ORACLE_POLICIES: frozenset[str] = frozenset({"sjf_bco_oracle", "srtf_oracle"})
# heuristics that order by predicted run time (``Job.pred_s``): they need a fitted predictor
PREDICTION_POLICIES: frozenset[str] = frozenset({"qssf", "qssf_preemptive"})


def spec_name(spec: str) -> str:
    """The heuristic name of a policy spec or label (``sjf_bco_oracle:lam=2`` ->
    ``sjf_bco_oracle``); ``model`` for a learned policy (``model:...``), ``compose`` for a
    composed one."""
    return spec.strip().partition(":")[0].strip()


def _composed(spec: str) -> ComposeSpec | None:
    """The parsed ``compose:`` spec, None for another spec or one that does not parse."""
    if spec_name(spec) != "compose":
        return None
    try:
        return ComposeSpec.parse(spec)
    except ValueError:
        return None


def is_oracle(spec: str) -> bool:
    """Whether a policy spec (``name[:key=value,...]`` or ``compose:...``) names an oracle
    ceiling (one whose order reads the true run time)."""
    composed = _composed(spec)
    if composed is not None:
        return composed.oracle
    if spec_name(spec) == "lookahead":  # a search policy: an oracle only with oracle=true
        from linkwise.cluster.lookahead import LookaheadSpec

        try:
            return LookaheadSpec.parse(spec).oracle
        except ValueError:  # a table's label such as "lookahead", not a spec
            return False
    return spec_name(spec) in ORACLE_POLICIES


def needs_predictions(spec: str) -> bool:
    """Whether a heuristic spec needs run-time predictions on its jobs (``qssf``, the
    preemptive QSSF, a composition ordered by predictions). Learned policies
    (``model:...``) carry or need a predictor too: see ``compare``."""
    composed = _composed(spec)
    if composed is not None:
        return composed.needs_predictions
    if spec_name(spec) == "lookahead":  # its forks draw run times from the predictions
        return True
    return spec_name(spec) in PREDICTION_POLICIES


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


def policy_info(spec: str) -> PolicyInfo:
    """What the heuristic (or ``compose:``) spec ``spec`` is (ValueError if unknown)."""
    name = spec_name(spec)
    if name == "compose":
        composed = ComposeSpec.parse(spec)
        return PolicyInfo(
            name=composed.describe(),
            kind="heuristic",
            preemptive=composed.preemptive,
            migrates=composed.migrates,
            oracle=composed.oracle,
            needs_predictions=composed.needs_predictions,
            description="a composition of parts (cluster.compose)",
            composition=composed.describe(),
        )
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}, compose:...")
    text: str | None = getattr(factory(), "composition", None)
    doc = (factory.__doc__ or "").strip().splitlines()
    parts = ComposeSpec.parse(text) if text else None
    return PolicyInfo(
        name=name,
        kind="heuristic",
        preemptive=parts.preemptive if parts else False,
        migrates=parts.migrates if parts else False,
        oracle=name in ORACLE_POLICIES,
        needs_predictions=name in PREDICTION_POLICIES,
        description=doc[0] if doc else "",
        composition=text,
    )


def policy_names(*, predictions: bool = False, oracles: bool = True) -> list[str]:
    """The registered heuristic names, in registry order: those that run on any workload,
    with the ones that need run-time predictions (``qssf``) only when ``predictions``, and
    the oracle ceilings unless ``oracles`` is False."""
    return [
        n
        for n in POLICIES
        if (predictions or n not in PREDICTION_POLICIES) and (oracles or n not in ORACLE_POLICIES)
    ]


def make_policy(name: str, **params: Any) -> Policy:
    """Build the heuristic ``name`` with ``params``; ValueError naming the known ones if
    unknown. ``make_policy("compose:...")`` builds a composition."""
    if spec_name(name) == "compose" and not params:
        return ComposeSpec.parse(name).build()
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(**params)
