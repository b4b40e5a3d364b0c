"""systemd's notification protocol (sd_notify(3)) without libsystemd: ``READY=1`` once the loop
runs, ``WATCHDOG=1`` while it makes progress, ``STOPPING=1`` on the way out.

Under ``Type=notify`` and ``WatchdogSec=`` (``ops/systemd/linkwise-serve.service``) systemd
restarts a loop that stops sending ``WATCHDOG=1`` (it hangs). The loop sends one each time it
starts to read Slurm (also between retries while Slurm does not answer), so an outage of
Slurm is not taken for a hang. Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["SystemdNotify"]


class SystemdNotify:
    """Datagrams to ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace)."""

    def __init__(self, address: str | None) -> None:
        self.address = address or None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SystemdNotify:
        """The notifier systemd asked for (``$NOTIFY_SOCKET``), a no-op one without it."""
        return cls((os.environ if env is None else env).get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, state: str) -> bool:
        """Send ``state`` (``KEY=VALUE`` lines); False when not under systemd or it failed."""
        if self.address is None:
            return False
        addr = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(state.encode("utf-8"), addr)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """The loop runs (``READY=1``; ``STATUS=`` shown by ``systemctl status``)."""
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def alive(self) -> bool:
        """The loop makes progress (``WATCHDOG=1``)."""
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        """The loop hands back and exits (``STOPPING=1``)."""
        return self.send("STOPPING=1")
