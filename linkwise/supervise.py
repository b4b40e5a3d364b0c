"""A long command ends on SIGINT or SIGTERM, its worker processes included (issue 32 item 3).

``linkwise evaluate --executor local:2`` interrupted with SIGINT left both process-pool
workers computing for another 15 minutes, and with SIGTERM the main process kept retrying
its dead Prefect server while it reported the crash: Prefect replaces the SIGTERM handler
for the length of a flow run and waits on its API and its pool, so no handler inside the
command's own process can be relied on to end it.

So the command runs in a child process and the process the operator started supervises it
(``supervise``): it waits for the child, and on SIGINT or SIGTERM it sends that signal to
every process of the command's tree (the child, its process-pool or Dask workers, Prefect's
temporary server), gives them ``grace_s`` to exit, kills what is left, prints one line and
exits 128 + the signal's number (130, 143). The supervisor is the tree's subreaper (Linux),
so a worker whose parent died first is still found, and reaped. When the child ends by
itself, whatever it left running is ended the same way, quietly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

__all__ = ["Stopped", "descendants", "die_with_parent", "end_processes", "exit_code", "supervise"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 3.0
LEAD_S = 0.5
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


class Stopped(Exception):
    """The supervisor received ``signum`` (raised by its handler, out of ``waitpid``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _parent_of(stat: str) -> tuple[int, str]:
    """(parent pid, state letter) from the text of ``/proc/PID/stat`` (the command name,
    in parentheses, may hold spaces and parentheses itself)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def _process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process ``/proc`` lists now."""
    table: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            table[int(entry.name)] = _parent_of((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # it ended while we looked
    return table


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """The live processes below ``root`` (children first), zombies left out."""
    rows = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in rows.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if rows[pid][1] not in ("Z", "X"):
            found.append(pid)
        todo += children.get(pid, [])
    return found


def _alive(pid: int) -> bool:
    try:
        _, state = _parent_of(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return False
    return state not in ("Z", "X")


def _send(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue


def _reap() -> None:
    """Collect every child that has ended (the supervisor's own, and orphans it adopted)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_gone(pids: Iterable[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        _reap()
        time.sleep(0.05)


def end_processes(signum: int, grace_s: float = GRACE_S, command: int | None = None) -> int:
    """End every process below this one; how many there were. ``command`` (the child that
    runs the command) gets ``signum`` first and ``LEAD_S`` to act on it (a Prefect flow
    reports its crash to its server while the server still runs); then every process below
    gets SIGTERM (a pool worker ends without a traceback), and those still there after
    ``grace_s`` (or started meanwhile) are killed and reaped."""
    me = os.getpid()
    seen = set(descendants(me))
    if command is not None:
        _send([command], signum)
        _wait_gone([command], LEAD_S)
        signum = signal.SIGTERM
    _send(descendants(me), signum)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        left = descendants(me)
        if not left:
            break
        new = [p for p in left if p not in seen]  # started meanwhile (a pool refilling)
        seen.update(new)
        _send(new, signum)
        time.sleep(0.05)
    deadline = time.monotonic() + grace_s
    left = descendants(me)
    while left and time.monotonic() < deadline:
        seen.update(left)
        _send(left, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
        left = [p for p in descendants(me) if _alive(p)]
    _reap()
    return len(seen)


def exit_code(status: int) -> int:
    """A shell's exit status for a ``waitpid`` status: the code, or 128 + the signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _become_subreaper() -> bool:
    """Make orphans below this process its children (Linux ``PR_SET_CHILD_SUBREAPER``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent``, the process that started it, ends
    (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing): a process-pool worker's initializer
    (``linkwise.parallel``), so no worker outlives its command, even one killed outright."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(1)


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def supervise(command: str, grace_s: float = GRACE_S) -> int | None:
    """Fork: in the child, None (run the command there); in this process, supervise it
    until it ends and return the exit status to exit with (module docstring)."""
    _become_subreaper()
    sys.stdout.flush()
    sys.stderr.flush()
    previous = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    child = os.fork()
    if child == 0:  # the command: the signals as they were
        for s, handler in previous.items():
            signal.signal(s, handler)
        return None
    try:
        _, status = os.waitpid(child, 0)
    except Stopped as stop:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C does not cut the clean-up
        ended = end_processes(stop.signum, grace_s, command=child)
        name = signal.Signals(stop.signum).name
        # on a line of its own: a process killed mid-line (Prefect's API log) leaves no newline
        print(
            f"\nlinkwise {command}: stopped by {name}; {ended} processes ended",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stop.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    end_processes(signal.SIGTERM, grace_s)  # anything the command left running
    return exit_code(status)
