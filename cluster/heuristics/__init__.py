"""Heuristic schedulers behind the ``Policy`` protocol, and a registry to build them by name.

``fifo`` (strict FIFO, first fit), ``backfill`` (EASY backfill as Slurm's sched/backfill),
``best_fit`` (greedy scan, consolidated placement), ``sjf_bco`` (SJF-BCO, MobiHoc'22),
``tiresias_las`` (Tiresias' discretised 2D-LAS, preemptive), ``random`` (seeded) and
``qssf`` (Helios' quasi-shortest-service-first on predicted GPU time: needs run-time
predictions, ``Job.pred_s``).

Oracle ceilings, which read the true remaining run time no real scheduler has
(``ORACLE_POLICIES``, ``is_oracle``): ``sjf_bco_oracle`` and ``srtf_oracle`` (preemptive).
Tables mark them ``oracle``; gates never take one as a reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from linkwise.cluster.domain import Policy
from linkwise.cluster.heuristics._common import MissingPredictions
from linkwise.cluster.heuristics.backfill import Backfill
from linkwise.cluster.heuristics.best_fit import BestFit
from linkwise.cluster.heuristics.fifo import Fifo
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
    "Fifo",
    "MissingPredictions",
    "Qssf",
    "RandomPolicy",
    "SjfBco",
    "SjfBcoOracle",
    "SrtfOracle",
    "TiresiasLas",
    "is_oracle",
    "make_policy",
    "needs_predictions",
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
        "sjf_bco_oracle": SjfBcoOracle,
        "srtf_oracle": SrtfOracle,
    }
)

# heuristics that read the true run time: ceilings, marked ``oracle``, never a gate reference
ORACLE_POLICIES: frozenset[str] = frozenset({"sjf_bco_oracle", "srtf_oracle"})
# heuristics that order by predicted run time (``Job.pred_s``): they need a fitted predictor
PREDICTION_POLICIES: frozenset[str] = frozenset({"qssf"})


def spec_name(spec: str) -> str:
    """The heuristic name of a policy spec or label (``sjf_bco_oracle:lam=2`` ->
    ``sjf_bco_oracle``); ``model`` for a learned policy (``model:...``)."""
    return spec.strip().partition(":")[0].strip()


def is_oracle(spec: str) -> bool:
    """Whether a policy spec (``name[:key=value,...]``) names an oracle ceiling."""
    return spec_name(spec) in ORACLE_POLICIES


def needs_predictions(spec: str) -> bool:
    """Whether a heuristic spec needs run-time predictions on its jobs (``qssf``).
    Learned policies (``model:...``) carry or need a predictor too: see ``compare``."""
    return spec_name(spec) in PREDICTION_POLICIES


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
    """Build the heuristic ``name`` with ``params``; ValueError naming the known ones if unknown."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(**params)
