"""What the simulator raises when a policy asks the impossible or makes no progress."""

from __future__ import annotations


class InvalidDecision(ValueError):
    """A policy asked for something impossible (unknown job, GPUs not free, wrong size)."""


class SimulationStalled(RuntimeError):
    """Jobs are pending, nothing runs, nothing will arrive, and the policy keeps waiting."""


class NoProgress(RuntimeError):
    """Events follow one another but no job arrives or finishes: the policy makes no progress
    (a livelock, e.g. jobs preempting each other back and forth), ``SimConfig.quiet_events``
    of them in a row."""
