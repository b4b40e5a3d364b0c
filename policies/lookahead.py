"""The lookahead: a search policy that chooses among strong moves by forking the simulator.

At each decision point the base policy proposes its decision; a few other policies propose
theirs (``alternatives``: by default the first moves of QSSF, SJF-BCO, Tiresias-LAS,
backfill and the frontier policies qssf_preemptive and tiresias_consolidated, the candidate
set of issue 22's prototype) and waiting is one more. When they differ, each distinct
decision is applied in ``n`` forks of the cluster as the policy knows it (``cluster.fork``:
run times drawn from the run-time predictor's distribution, never read; the same draws for
every decision) and continued by the base for ``horizon_s``; the decision with the least
mean cost is kept, the base's on ties (another must be better by ``margin`` times the jobs
in the system now times the horizon, the scale of the horizon's jobs-in-system time).
``oracle=True`` forks with the true remaining work: a measured ceiling, marked oracle.

The cost (``cluster.fork.rollout_cost``) is the jobs-in-system time over the horizon plus,
with ``terminal`` (the default), the terminal cost: an estimate of what the jobs still in
the system at the horizon's end will spend in it from then on (their drawn work left, and
their queueing on the pooled cluster: ``cluster.fork.terminal_cost_s``). Without it, work
done for a job that does not finish inside the horizon is worth nothing: GPUs left idle, a
long job started late, a preemption's lost work cost nothing once past the horizon, so a
wait or a deferral looks free and, chosen again at every event, idles the cluster.

Without the terminal cost a wait priced as "the base acts at the next event" looked nearly
free and, re-chosen at that event, became a chain of deferrals none of which was priced
(over Tiresias-LAS: 1.73x its average JCT on the congested case of
``benchmarks/lookahead_headroom.md``; with the terminal cost 0.98x). ``hold=DURATION``
prices and keeps a wait as a commitment instead: in the forks the base is not asked for
``hold`` after a wait (completions or not), and a wait the lookahead chooses holds as long
(it returns waits without searching until then). It also ends the chain, but measured worse
than the terminal cost alone (the cluster idles through completions), so the default is 0,
a wait until the next event. ``wait=false`` drops waiting, the alternatives' proposals that
do nothing included (not advised with the terminal cost over a preemptive base: measured
1.64x over qssf_preemptive, its deviations to another policy's preemptions re-taken at every
event and churning; see the benchmark).

Spec (``linkwise policies`` lists it as kind ``search``):

    lookahead:base=SPEC,horizon=6h,n=6[,alts=a;b;c][,wait=true][,hold=0]
        [,terminal=true][,margin=0][,seed=0][,restart=sia][,oracle=false]

``base`` is any policy spec; items after it that are not lookahead keys (``LOOKAHEAD_KEYS``)
belong to it (``lookahead:base=sjf_bco:lam=2,n=4``), so a base parameter named like a
lookahead key cannot be given. ``horizon`` and ``hold`` take ``s``, ``m`` or ``h``;
``restart`` is the restart model the forks assume (``sia``, ``0`` or seconds:
``cluster.restart``). ``Lookahead`` built directly keeps the earlier pricing
(``terminal=False``, ``hold_s=0``); the spec's defaults are the ones above.
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
from linkwise.cluster.simulator.config import SimConfig

__all__ = [
    "DEFAULT_ALTERNATIVES",
    "LOOKAHEAD_KEYS",
    "Lookahead",
    "LookaheadSpec",
    "decision_key",
    "is_lookahead",
]

PREFIX = "lookahead"
DEFAULT_HOLD_S = 0.0
"""How long a wait the lookahead chooses holds (``hold``; 0: until the next event)."""
DEFAULT_ALTERNATIVES: tuple[str, ...] = (
    "qssf",
    "sjf_bco",
    "tiresias_las",
    "backfill",
    "qssf_preemptive",
    "tiresias_consolidated",
)
LOOKAHEAD_KEYS = frozenset(
    {
        "base",
        "horizon",
        "n",
        "alts",
        "wait",
        "seed",
        "oracle",
        "margin",
        "restart",
        "terminal",
        "hold",
    }
)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


def is_lookahead(spec: str) -> bool:
    """Whether a policy spec names the lookahead."""
    return spec.strip().partition(":")[0].strip() == PREFIX


def _seconds(raw: str, key: str = "horizon", zero: bool = False) -> float:
    text = raw.strip().lower()
    unit = _UNITS.get(text[-1:])
    try:
        value = float(text[:-1]) * unit if unit is not None else float(text)
    except ValueError:
        raise ValueError(f"{key} {raw!r}: expected seconds or a number with s, m or h") from None
    if not (value > 0 or (zero and value == 0)) or not math.isfinite(value):
        raise ValueError(f"{key} {raw!r} must be {'non-negative' if zero else 'positive'}")
    return value


def _duration(s: float) -> str:
    return f"{s / 3600:g}h" if s % 3600 == 0 and s else f"{s / 60:g}m" if s % 60 == 0 else f"{s:g}s"


def _flag(key: str, raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(f"lookahead {key}={raw!r}: expected true or false")


@dataclass(frozen=True)
class LookaheadSpec:
    """A parsed ``lookahead:`` spec (see the module docstring); base and alternatives stay
    spec text here (``policies.spec.PolicySpec`` parses them once beside it and builds
    them, handing the built policies to ``make``)."""

    base: str
    alternatives: tuple[str, ...] = DEFAULT_ALTERNATIVES
    horizon_s: float = 6 * 3600.0
    n: int = 6
    wait: bool = True
    seed: int = 0
    oracle: bool = False
    margin: float = 0.0
    restart: str = "sia"
    terminal: bool = True
    hold_s: float = DEFAULT_HOLD_S

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
            terminal=_flag("terminal", values.get("terminal", "true")),
            hold_s=_seconds(values.get("hold", str(DEFAULT_HOLD_S)), "hold", zero=True),
        )

    def describe(self) -> str:
        """The spec as text (every value; the base last-but-alternatives so that its own
        parameters follow it)."""
        parts = [
            f"base={self.base}",
            f"horizon={_duration(self.horizon_s)}",
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
        if not self.terminal:
            parts.append("terminal=false")
        if self.hold_s != DEFAULT_HOLD_S:
            parts.append(f"hold={_duration(self.hold_s) if self.hold_s else 0}")
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
            terminal=self.terminal,
            hold_s=self.hold_s,
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
    terminal: bool = False
    hold_s: float = 0.0
    name: str = PREFIX
    belief: RunTimeBelief = field(default_factory=RunTimeBelief)
    arrivals: Arrivals | None = None
    decisions: int = 0
    searched: int = 0
    deviations: int = 0
    busy_s: float = 0.0
    holds: int = 0
    _hold_until: float = -math.inf

    def decide(self, state: ClusterState) -> Decision:
        """The base's decision unless a forked continuation shows another one is better."""
        t = time.perf_counter()
        try:
            return self._decide(state)
        finally:
            self.decisions += 1
            self.busy_s += time.perf_counter() - t

    def _decide(self, state: ClusterState) -> Decision:
        if state.time < self._hold_until - 1e-9:  # a wait chosen earlier holds
            return Decision(wake_at=self._hold_until)
        proposals = [self.base.decide(state), *(p.decide(state) for p in self.alternatives)]
        wake = min(d.wake_at for d in proposals)
        if self.wait:
            proposals.append(WAIT)
        else:  # no wait move: an alternative that does nothing here is one too
            proposals = proposals[:1] + [d for d in proposals[1:] if not d.is_wait]
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
            terminal=self.terminal,
            hold_s=self.hold_s,
        )
        best = min(range(len(distinct)), key=lambda i: (costs[i], i))
        jobs = len(state.pending) + len(state.running) + len(state.transit)
        if best == 0 or costs[best] >= costs[0] - self.margin * jobs * self.horizon_s - 1e-9:
            return _waking(base, wake)
        self.deviations += 1
        if distinct[best].is_wait and self.hold_s > 0:  # kept as long as it was priced
            self.holds += 1
            self._hold_until = state.time + self.hold_s
            return Decision(wake_at=self._hold_until)
        return _waking(distinct[best], wake)

    def stats(self) -> dict[str, float]:
        """Decision points, searched ones, deviations and the mean decision latency (ms)."""
        return {
            "decision_points": float(self.decisions),
            "searched_points": float(self.searched),
            "deviations_per_1000": 1000.0 * self.deviations / max(1, self.decisions),
            "holds": float(self.holds),
            "decision_ms": 1000.0 * self.busy_s / max(1, self.decisions),
        }


def _waking(d: Decision, wake: float) -> Decision:
    """``d`` with the earliest wake-up any proposal asked for (a Tiresias threshold)."""
    if d.wake_at == wake:
        return d
    return Decision(starts=d.starts, preempt=d.preempt, wake_at=wake, migrate=d.migrate)
