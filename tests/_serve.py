"""For tests that run ``linkwise serve`` as a process: a free port for its ``/metrics`` and
the cycles it has run, read there (``linkwise_serve_cycles_total{outcome="ok"}``). Idle
cycles write no log line (``deployer.cycle_lines.CycleLines``): the log does not count cycles."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request

__all__ = ["cycles_run", "free_port"]

_OK = re.compile(r'^linkwise_serve_cycles_total\{outcome="ok"\} (\S+)$', re.MULTILINE)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cycles_run(port: int) -> int:
    """The cycles the loop serving ``/metrics`` on ``port`` has completed; 0 while it does not
    answer yet (starting)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode("utf-8")
    except (urllib.error.URLError, OSError):
        return 0
    found = _OK.search(text)
    return int(float(found.group(1))) if found else 0
