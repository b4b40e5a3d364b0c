"""The lookahead: a search policy that chooses among strong moves by forking the simulator.

At each decision point the base policy proposes its decision; a few other policies propose
theirs (``alternatives``: by default QSSF, SJF-BCO, Tiresias-LAS, backfill and the frontier
policies) and waiting is one more. When they differ, each distinct decision is applied in
``n`` forks of the cluster as the policy knows it (``cluster.fork``: run times drawn from
the run-time predictor's distribution, never read; the same draws for every decision) and
continued by the base for ``horizon_s``; the decision with the least mean jobs-in-system
time is kept, the base's on ties (another must be better by ``margin`` of the base's cost).
``oracle=True`` forks with the true remaining work: a measured ceiling, marked oracle.

Spec (``linkwise policies`` lists it as kind ``search``):

    lookahead:base=SPEC,horizon=6h,n=6[,alts=a;b;c][,wait=true][,seed=0][,oracle=false]

``base`` is any policy spec; items after it that are not lookahead keys (``LOOKAHEAD_KEYS``)
belong to it (``lookahead:base=sjf_bco:lam=2,n=4``), so a base parameter named like a
lookahead key cannot be given. ``horizon`` takes ``s``, ``m`` or ``h``; ``restart`` is the
restart model the forks assume (``sia``, ``0`` or seconds: ``cluster.restart``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import WAIT, ClusterState, Decision, Policy
from linkwise.cluster.fork import Arrivals, RunTimeBelief, score_decisions
from linkwise.cluster.restart import parse_restart
from linkwise.cluster.simulator import SimConfig

__all__ = [
    "DEFAULT_ALTERNATIVES",
    "LOOKAHEAD_KEYS",
    "Lookahead",
    "LookaheadSpec",
    "decision_key",
    "is_lookahead",
]

PREFIX = "lookahead"
DEFAULT_ALTERNATIVES: tuple[str, ...] = (
    "qssf",
    "sjf_bco",
    "tiresias_las",
    "backfill",
    "qssf_preemptive",
    "tiresias_consolidated",
)
LOOKAHEAD_KEYS = frozenset(
    {"base", "horizon", "n", "alts", "wait", "seed", "oracle", "margin", "restart"}
)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


def is_lookahead(spec: str) -> bool:
    """Whether a policy spec names the lookahead."""
    return spec.strip().partition(":")[0].strip() == PREFIX


def _seconds(raw: str) -> float:
    text = raw.strip().lower()
    unit = _UNITS.get(text[-1:])
    try:
        value = float(text[:-1]) * unit if unit is not None else float(text)
    except ValueError:
        raise ValueError(f"horizon {raw!r}: expected seconds or a number with s, m or h") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"horizon {raw!r} must be positive")
    return value


def _flag(key: str, raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(f"lookahead {key}={raw!r}: expected true or false")


@dataclass(frozen=True)
class LookaheadSpec:
    """A parsed ``lookahead:`` spec (see the module docstring); base and alternatives stay
    spec strings, built by ``models.policy_spec``."""

    base: str
    alternatives: tuple[str, ...] = DEFAULT_ALTERNATIVES
    horizon_s: float = 6 * 3600.0
    n: int = 6
    wait: bool = True
    seed: int = 0
    oracle: bool = False
    margin: float = 0.0
    restart: str = "sia"

    @classmethod
    def parse(cls, text: str) -> LookaheadSpec:
        """Parse ``lookahead:...`` (ValueError naming what is wrong)."""
        head, _, rest = text.strip().partition(":")
        if head.strip() != PREFIX:
            raise ValueError(f"not a lookahead spec: {text!r}")
        values: dict[str, str] = {}
        base_parts: list[str] = []
        last = ""
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if sep and key in LOOKAHEAD_KEYS:
                if key in values:
                    raise ValueError(f"lookahead: {key} given twice")
                values[key] = value.strip()
                last = key
                if key == "base":
                    base_parts = [value.strip()]
            elif last == "base":
                base_parts.append(item)
            else:
                known = ", ".join(sorted(LOOKAHEAD_KEYS))
                raise ValueError(f"lookahead: unknown item {item!r} (its keys: {known})")
        if not base_parts or not base_parts[0]:
            raise ValueError("lookahead needs base=SPEC (the policy that continues every move)")
        base = ",".join(base_parts)
        if is_lookahead(base):
            raise ValueError("lookahead: the base cannot itself be a lookahead")
        alts = DEFAULT_ALTERNATIVES
        if "alts" in values:
            alts = tuple(a.strip() for a in values["alts"].split(";") if a.strip())
            if any(is_lookahead(a) for a in alts):
                raise ValueError("lookahead: an alternative cannot be a lookahead")
        try:
            n = int(values.get("n", "6"))
            seed = int(values.get("seed", "0"))
            margin = float(values.get("margin", "0"))
        except ValueError as exc:
            raise ValueError(f"lookahead: {exc}") from None
        if n < 1:
            raise ValueError("lookahead: n must be at least 1")
        if not 0.0 <= margin < 1.0:
            raise ValueError("lookahead: margin must be in [0, 1)")
        restart = values.get("restart", "sia")
        parse_restart(restart)  # ValueError for a bad restart model
        return cls(
            base=base,
            alternatives=alts,
            horizon_s=_seconds(values.get("horizon", "6h")),
            n=n,
            wait=_flag("wait", values.get("wait", "true")),
            seed=seed,
            oracle=_flag("oracle", values.get("oracle", "false")),
            margin=margin,
            restart=restart,
        )

    def describe(self) -> str:
        """The spec as text (every value; the base last-but-alternatives so that its own
        parameters follow it)."""
        h = self.horizon_s
        horizon = f"{h / 3600:g}h" if h % 3600 == 0 else f"{h:g}s"
        parts = [
            f"base={self.base}",
            f"horizon={horizon}",
            f"n={self.n}",
            f"alts={';'.join(self.alternatives)}",
        ]
        if not self.wait:
            parts.append("wait=false")
        if self.seed:
            parts.append(f"seed={self.seed}")
        if self.margin:
            parts.append(f"margin={self.margin:g}")
        if self.restart != "sia":
            parts.append(f"restart={self.restart}")
        if self.oracle:
            parts.append("oracle=true")
        return f"{PREFIX}:" + ",".join(parts)

    def make(
        self, base: Policy, alternatives: tuple[Policy, ...], model: ContentionModel
    ) -> Lookahead:
        """The policy, given the built base and alternatives and the contention model the
        forks predict with."""
        return Lookahead(
            base=base,
            alternatives=alternatives,
            model=model,
            config=SimConfig(restart=parse_restart(self.restart)),
            horizon_s=self.horizon_s,
            n=self.n,
            wait=self.wait,
            seed=self.seed,
            oracle=self.oracle,
            margin=self.margin,
            name=self.describe(),
        )


def decision_key(d: Decision) -> tuple[Any, ...]:
    """What a decision does (its wake-up left out): equal keys, the same moves."""
    return (
        tuple(sorted((s.job_id, s.placement.alloc) for s in d.starts)),
        tuple(sorted(d.preempt)),
        tuple(sorted((s.job_id, s.placement.alloc) for s in d.migrate)),
    )


@dataclass
class Lookahead:
    """The lookahead search policy (see the module docstring). Counts its decision points,
    the ones it searched, the ones where it deviated from the base, and its time."""

    base: Policy
    alternatives: tuple[Policy, ...]
    model: ContentionModel
    config: SimConfig = field(default_factory=SimConfig)
    horizon_s: float = 6 * 3600.0
    n: int = 6
    wait: bool = True
    seed: int = 0
    oracle: bool = False
    margin: float = 0.0
    name: str = PREFIX
    belief: RunTimeBelief = field(default_factory=RunTimeBelief)
    arrivals: Arrivals | None = None
    decisions: int = 0
    searched: int = 0
    deviations: int = 0
    busy_s: float = 0.0

    def decide(self, state: ClusterState) -> Decision:
        """The base's decision unless a forked continuation shows another one is better."""
        t = time.perf_counter()
        try:
            return self._decide(state)
        finally:
            self.decisions += 1
            self.busy_s += time.perf_counter() - t

    def _decide(self, state: ClusterState) -> Decision:
        proposals = [self.base.decide(state), *(p.decide(state) for p in self.alternatives)]
        if self.wait:
            proposals.append(WAIT)
        wake = min(d.wake_at for d in proposals)
        distinct: list[Decision] = []
        seen: set[tuple[Any, ...]] = set()
        for d in proposals:
            key = decision_key(d)
            if key not in seen:
                seen.add(key)
                distinct.append(d)
        base = proposals[0]
        if len(distinct) == 1 or not (state.pending or state.running):
            return _waking(base, wake)
        self.searched += 1
        costs = score_decisions(
            state,
            distinct,
            self.base,
            self.model,
            self.config,
            horizon_s=self.horizon_s,
            n=self.n,
            seed=self.seed + int(state.time),
            belief=self.belief,
            arrivals=self.arrivals,
            oracle=self.oracle,
        )
        best = min(range(len(distinct)), key=lambda i: (costs[i], i))
        if best == 0 or costs[best] >= costs[0] * (1.0 - self.margin) - 1e-9:
            return _waking(base, wake)
        self.deviations += 1
        return _waking(distinct[best], wake)

    def stats(self) -> dict[str, float]:
        """Decision points, searched ones, deviations and the mean decision latency (ms)."""
        return {
            "decision_points": float(self.decisions),
            "searched_points": float(self.searched),
            "deviations_per_1000": 1000.0 * self.deviations / max(1, self.decisions),
            "decision_ms": 1000.0 * self.busy_s / max(1, self.decisions),
        }


def _waking(d: Decision, wake: float) -> Decision:
    """``d`` with the earliest wake-up any proposal asked for (a Tiresias threshold)."""
    if d.wake_at == wake:
        return d
    return Decision(starts=d.starts, preempt=d.preempt, wake_at=wake, migrate=d.migrate)
