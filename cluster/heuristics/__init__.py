"""Heuristic schedulers behind the ``Policy`` protocol, and a registry to build them by name.

``fifo`` (strict FIFO, first fit), ``backfill`` (EASY backfill as Slurm's sched/backfill),
``best_fit`` (greedy scan, consolidated placement), ``sjf_bco`` (SJF-BCO, MobiHoc'22),
``tiresias_las`` (Tiresias' discretised 2D-LAS, preemptive) and ``random`` (seeded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from linkwise.cluster.domain import Policy
from linkwise.cluster.heuristics.backfill import Backfill
from linkwise.cluster.heuristics.best_fit import BestFit
from linkwise.cluster.heuristics.fifo import Fifo
from linkwise.cluster.heuristics.random_policy import RandomPolicy
from linkwise.cluster.heuristics.sjf_bco import SjfBco
from linkwise.cluster.heuristics.tiresias import TiresiasLas

__all__ = [
    "POLICIES",
    "Backfill",
    "BestFit",
    "Fifo",
    "RandomPolicy",
    "SjfBco",
    "TiresiasLas",
    "make_policy",
    "policy_names",
]

POLICIES: Mapping[str, Callable[..., Policy]] = MappingProxyType(
    {
        "fifo": Fifo,
        "backfill": Backfill,
        "best_fit": BestFit,
        "sjf_bco": SjfBco,
        "tiresias_las": TiresiasLas,
        "random": RandomPolicy,
    }
)


def policy_names() -> list[str]:
    """The registered heuristic names, in registry order."""
    return list(POLICIES)


def make_policy(name: str, **params: Any) -> Policy:
    """Build the heuristic ``name`` with ``params``; ValueError naming the known ones if unknown."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(**params)
