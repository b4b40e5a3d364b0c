"""Reading Slurm from the live loop: what a failed read is, how long to wait before the next,
and the ``sacct`` joins of jobs that left the queue unseen.

A Slurm read that fails (``READ_FAULTS``: a ``SlurmError``, or a ``KeyError``/``TypeError``/
``ValueError`` out of parsing what Slurm printed) is counted by kind (``read_fault_kind``);
the read is retried after a backoff from ``min(1, interval)`` doubling (``next_backoff``) up
to ``backoff_max_s``; a stop requested meanwhile ends it (``LoopStopped``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from linkwise.cluster.hostlist import compress, expand
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.schema import SlurmSchemaError
from linkwise.deployer.events import log_event

__all__ = [
    "READ_FAULTS",
    "UNREACHABLE",
    "LoopStopped",
    "next_backoff",
    "read_fault_kind",
    "sacct_joins",
]

# what a failed Slurm read raises: the client's errors, and what parsing Slurm's output may
READ_FAULTS: tuple[type[Exception], ...] = (SlurmError, KeyError, TypeError, ValueError)
UNREACHABLE = frozenset({"unavailable", "timeout"})  # no hand-back: it could not be done


class LoopStopped(RuntimeError):
    """A stop (SIGINT/SIGTERM) came while the loop waited to read Slurm again."""


def read_fault_kind(exc: BaseException) -> str:
    """The kind of a failed Slurm read: unavailable, timeout, schema (JSON this client does not
    read), command (any other Slurm error) or parse (a value parsing could not take)."""
    if isinstance(exc, SlurmUnavailable):
        return "unavailable"
    if isinstance(exc, SlurmTimeout):
        return "timeout"
    if isinstance(exc, SlurmSchemaError):
        return "schema"
    return "command" if isinstance(exc, SlurmError) else "parse"


def next_backoff(delay: float, max_s: float) -> float:
    """The wait after ``delay`` when the next read fails too: doubled, at most ``max_s``."""
    return min(delay * 2, max_s)


def sacct_joins(
    client: SlurmClient, ids: Sequence[int], log: logging.Logger
) -> list[tuple[int, float, str]]:
    """(job, start, nodes) from ``sacct`` for jobs that left the queue unseen."""
    args = ["sacct", "-a", "-X", "-P", "-n", "-o", "JobIDRaw,Start,End,NNodes,NodeList"]
    args += ["-j", ",".join(str(i) for i in ids)]
    try:
        text = client.runner.run(args, extra_env={"SLURM_TIME_FORMAT": "%s"})
    except SlurmError as exc:
        log_event(log, "join_failed", logging.WARNING, error=str(exc)[:200])
        return []
    out: list[tuple[int, float, str]] = []
    now = time.time()
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        job, start, end, nnodes, nodelist = parts
        if not start.isdigit() or nodelist in ("", "None assigned"):
            continue
        try:
            hosts = expand(nodelist)
        except ValueError:
            continue
        settled = end.isdigit() and now - int(end) > 5 and str(len(hosts)) == nnodes
        if settled:
            out.append((int(job), float(start), compress(hosts)))
    return out
