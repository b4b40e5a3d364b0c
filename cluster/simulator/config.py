"""The simulator's options."""

from __future__ import annotations

from dataclasses import dataclass, field

from linkwise.cluster.restart import RestartModel


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulator options.

    ``tick_s``: a periodic decision point every so many seconds while jobs are pending
    (None: decide only at arrivals and completions). ``restart``: what a preemption or a
    migration costs (default: Sia's measured costs per profile and a 30 s grace;
    ``RestartModel.free()`` for free preemption). ``quiet_events``: the step budget, the
    most events in a row (ticks aside) in which no job arrives or finishes before the run
    raises ``NoProgress`` instead of running on forever.
    """

    tick_s: float | None = None
    restart: RestartModel = field(default_factory=RestartModel.sia)
    quiet_events: int = 20_000

    def __post_init__(self) -> None:
        if self.tick_s is not None and not self.tick_s > 0:
            raise ValueError("tick_s must be positive")
        if self.quiet_events < 1:
            raise ValueError(f"quiet_events must be at least 1, got {self.quiet_events}")
