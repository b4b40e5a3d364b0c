"""The lease: what the loop holds and until when, the watchdog's input.

One per (cluster, sorted partition set), in a directory derived from slurm.conf
(ClusterName, SlurmctldHost, SlurmctldPort) under a lease root, never from ``--state-dir``
(``lease_dir_for``). The lease JSON (who holds it: pid, its start time, host; until when; its
state: active, releasing, released) is the watchdog's input; ``<partition>.expires`` files
(expiry, owner pid, start time, host) are ``job_submit.lua``'s: it holds new jobs only while
the lease is active, unexpired and its owner process still runs (``pid_alive``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

LeaseState = Literal["active", "releasing", "released"]


def pid_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if given, started at ``start_time``."""
    now = pid_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


@dataclass(frozen=True)
class Lease:
    """What the loop holds and until when (the watchdog's input; see the module)."""

    owner_pid: int
    owner_start: int | None
    expires_at: float
    partitions: tuple[str, ...]
    slurm_conf: str | None
    db: str | None
    run_id: str
    held: tuple[int, ...] = ()
    state: LeaseState = "active"
    renewed_at: float = field(default_factory=time.time)
    host: str = field(default_factory=lambda: os.uname().nodename)
    spool: str | None = None  # where the watchdog's records go when the store is unavailable
    slurm_bin: str | None = None  # a folder of Slurm's commands (LINKWISE_SLURM_BIN)

    @property
    def released(self) -> bool:
        """Handed back completely (swept twice after new holds stopped)."""
        return self.state == "released"


def lease_dir_for(root: str | os.PathLike[str], slurm_conf_text: str) -> Path:
    """The lease directory of a cluster: ``root/<ClusterName>-<SlurmctldHost>-<port>``, the
    same for every loop of that cluster whatever its ``--state-dir`` (job_submit.lua's
    ``LEASE_DIR``)."""
    keys: dict[str, str] = {}
    for raw in slurm_conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() not in keys:
            keys[key.strip().lower()] = value.strip().split()[0] if value.strip() else ""
    host = (keys.get("slurmctldhost") or keys.get("controlmachine") or "").split("(")[0]
    parts = (keys.get("clustername", ""), host, keys.get("slurmctldport") or "6817")
    return Path(root) / "-".join(re.sub(r"[^A-Za-z0-9_.]", "_", x) or "_" for x in parts)


def _expires_line(lease: Lease) -> str:
    expiry = int(lease.expires_at) if lease.state == "active" else 0
    return f"{expiry} {lease.owner_pid} {lease.owner_start or 0} {lease.host}\n"


def write_lease(path: str | os.PathLike[str], lease: Lease) -> None:
    """Atomically (write, fsync, rename) write the lease file and, beside it, one
    ``<partition>.expires`` per partition for ``job_submit.lua``: one line, ``expiry pid
    start host`` (expiry 0 unless the lease is active)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = _expires_line(lease)
    if lease.state != "active":  # the plugin stops holding before anything else changes
        for p in lease.partitions:
            _atomic_write(target.with_name(f"{p}.expires"), line)
    _atomic_write(target, json.dumps(asdict(lease)))
    if lease.state == "active":
        for p in lease.partitions:
            _atomic_write(target.with_name(f"{p}.expires"), line)


def _atomic_write(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def read_lease(path: str | os.PathLike[str]) -> Lease | None:
    """The lease in ``path``; None if there is none (or it cannot be parsed)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        state = str(data.get("state", "active"))
        if state not in ("active", "releasing", "released"):
            return None
        return Lease(
            owner_pid=int(data["owner_pid"]),
            owner_start=data.get("owner_start"),
            expires_at=float(data["expires_at"]),
            partitions=tuple(str(p) for p in data.get("partitions") or ()),
            slurm_conf=data.get("slurm_conf"),
            db=data.get("db"),
            run_id=str(data.get("run_id", "")),
            held=tuple(int(x) for x in data.get("held") or ()),
            state=state,  # type: ignore[arg-type]
            renewed_at=float(data.get("renewed_at", 0.0)),
            host=str(data.get("host", "")),
            spool=data.get("spool"),
            slurm_bin=data.get("slurm_bin"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def lease_live(lease: Lease, now: float) -> bool:
    """Active, unexpired and renewed by a live owner: what job_submit.lua holds jobs under."""
    return (
        lease.state == "active"
        and now < lease.expires_at
        and pid_alive(lease.owner_pid, lease.owner_start)
    )


def lease_expired(lease: Lease, now: float) -> bool:
    """True once an active lease ran out or its owner process is gone."""
    return lease.state == "active" and not lease_live(lease, now)


def renewed(lease: Lease, now: float, lease_s: float, **changes: Any) -> Lease:
    """The lease extended to ``now + lease_s`` with ``changes`` applied."""
    return replace(lease, expires_at=now + lease_s, renewed_at=now, **changes)
