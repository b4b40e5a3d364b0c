"""Errors raised by the Slurm client; messages name the command, never a secret."""

from __future__ import annotations


class SlurmError(RuntimeError):
    """A Slurm command or request failed."""


class SlurmTimeout(SlurmError):
    """A Slurm command or request did not answer within its timeout."""


class SlurmUnavailable(SlurmError):
    """Slurm (a daemon, slurmrestd, or the client library) cannot be reached."""
