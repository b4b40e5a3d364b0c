"""One OS lock (``flock``) per partition in the lease directory: a second loop on any
overlapping partition is refused (``LeaseTaken``), naming who holds it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def valid_name(name: str) -> bool:
    """Whether ``name`` is safe as a partition or file name part (no path, no spaces)."""
    return bool(_NAME.match(name)) and len(name) <= 100


WATCHDOG_HOLDER = "the watchdog of a stopped loop"  # how a handing-back watchdog signs


class LeaseTaken(RuntimeError):
    """Another loop (or its watchdog) holds a partition's lock: ``holder`` says who."""

    def __init__(self, message: str, *, partition: str = "", holder: str = "") -> None:
        super().__init__(message)
        self.partition = partition
        self.holder = holder


@dataclass(frozen=True)
class PartitionLocks:
    """``flock``-ed ``<dir>/<partition>.lock`` files, held until ``close()`` or the process
    ends (``kill -9`` included: the kernel drops them; children do not inherit them)."""

    fds: tuple[int, ...]

    def close(self) -> None:
        """Release every lock (call once: a closed descriptor's number is reused)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_partitions(
    lease_dir: str | os.PathLike[str],
    partitions: Iterable[str],
    holder: str,
    *,
    wait_s: float = 0.0,
) -> PartitionLocks:
    """Lock every partition (sorted, so two takers never deadlock) or none: ``LeaseTaken``
    names the partition and its holder. ``holder`` is written into each lock file."""
    folder = Path(lease_dir)
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    fds: list[int] = []
    try:
        for p in sorted(set(partitions)):
            if not valid_name(p):
                raise ValueError(f"invalid partition name {p!r}")
            path = folder / f"{p}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        other = path.read_text(encoding="utf-8", errors="replace").strip()
                        raise LeaseTaken(
                            f"partition {p} is managed by another loop ({other or 'unknown'}; "
                            f"lock {path}): stop it first",
                            partition=p,
                            holder=other,
                        ) from None
                    time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode("utf-8"), 0)
    except BaseException:
        PartitionLocks(tuple(fds)).close()
        raise
    return PartitionLocks(tuple(fds))
