"""Which cycles of the live loop write a log line, and the line.

A cycle is logged (``cycle``) when it did or met something: a start applied or refused, a
move, a hand-back, a read fault before it, or a change in what it saw or decided (the policy,
the pending jobs, the decision: a shadow loop deciding the same starts again is not news,
where its records went); the first cycle always is. An idle cycle is silent, and an idle
loop says it is alive at most once a minute (``idle``, with the cycles since the last line;
``CycleLines``). What counts cycles is ``linkwise_serve_cycles_total`` on ``/metrics`` and
``serve_stop``'s ``cycles``, never the log lines.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.domain import ClusterState, Decision
from linkwise.deployer.events import log_event

__all__ = ["IDLE_LOG_S", "CycleLines", "log_cycle"]

IDLE_LOG_S = 60.0  # an idle loop logs that it is alive at most this often


@dataclass
class CycleLines:
    """Which cycles get a log line: every cycle that did something or saw a change (``busy``,
    or ``seen`` unlike the last cycle's), and for idle ones one ``idle`` line at most every
    ``every_s`` seconds since the last line (``now`` on a monotonic clock)."""

    every_s: float = IDLE_LOG_S
    last_seen: tuple[object, ...] | None = None
    last_line: float = 0.0  # when the last line was written
    quiet: int = 0  # idle cycles since then

    def note(self, seen: tuple[object, ...], busy: bool, now: float) -> tuple[str, int]:
        """(``"cycle"``, 0) to log this cycle, (``"idle"``, idle cycles since the last line)
        for a heartbeat, (``""``, idle cycles so far) to stay silent."""
        changed, self.last_seen = seen != self.last_seen, seen
        if busy or changed:
            self.last_line, self.quiet = now, 0
            return "cycle", 0
        self.quiet += 1
        if now - self.last_line < self.every_s:
            return "", self.quiet
        idle, self.last_line, self.quiet = self.quiet, now, 0
        return "idle", idle


def log_cycle(
    log: logging.Logger,
    lines: CycleLines,
    *,
    cycle_id: int,
    mode: str,
    state: ClusterState,
    decision: Decision,
    info: Mapping[str, Any],
    where: str,
    busy: bool,
    elapsed: float,
    now: float,
) -> None:
    """Write the cycle's line, an ``idle`` heartbeat, or nothing (``lines`` decides)."""
    pending = tuple(p.job.job_id for p in state.pending)
    decided = (
        tuple((s.job_id, s.placement.nodes) for s in decision.starts),
        tuple(decision.preempt),
        tuple((s.job_id, s.placement.nodes) for s in decision.migrate),
    )
    seen = (info.get("policy"), info.get("model_version"), pending, decided, where)
    line, idle = lines.note(seen, busy, now)
    if line == "idle":
        log_event(
            log, "idle", cycles=idle, cycle=cycle_id, mode=mode,
            policy=info.get("policy"), pending=len(pending), records=where,
        )  # fmt: skip
    elif line == "cycle":
        log_event(
            log,
            "cycle",
            cycle=cycle_id,
            mode=mode,
            policy=info.get("policy"),
            pending=len(pending),
            starts=len(decision.starts),
            latency_ms=round(float(info.get("latency_ms", 0.0)), 3),
            explain_ms=round(float(info.get("explain_ms", 0.0)), 3),
            cycle_ms=round(elapsed * 1e3, 3),
            records=where,
        )
