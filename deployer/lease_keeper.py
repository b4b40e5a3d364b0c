"""The active loop's lease: the partition locks, the lease file it renews every cycle (what
``job_submit.lua`` and the watchdog read), the watchdog process, and the hand-back on the way
out (``release.hand_back``: no new holds, release what is held for the loop, again after a
grace period)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.deployer.events import log_event
from linkwise.deployer.lease import Lease, pid_start_time, read_lease, renewed, write_lease
from linkwise.deployer.locks import WATCHDOG_HOLDER, LeaseTaken, PartitionLocks, lock_partitions
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.release import hand_back

__all__ = ["LeaseKeeper"]

WAIT_FOR_WATCHDOG_S = 30.0  # a killed loop's watchdog hands its jobs back within seconds


@dataclass
class LeaseKeeper:
    """One active loop's claim on its partitions (``take``, ``renew``, ``ok``,
    ``hand_back``)."""

    path: Path  # the lease file; its folder holds the partition locks
    partitions: tuple[str, ...]
    lease_s: float
    run_id: str
    metrics: ServeMetrics
    logger: logging.Logger
    state_dir: Path  # the watchdog's log
    watchdog: bool = True
    sleep: Callable[[float], None] = time.sleep
    lease: Lease | None = None
    locks: PartitionLocks | None = None
    watchdog_proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def take(
        self, slurm_conf: str | None, db: str | None, spool: str, slurm_bin: str | None = None
    ) -> None:
        """Lock the partitions, write the lease and start the watchdog; ``LeaseTaken`` when
        another loop manages any of the partitions (after waiting for a killed loop's
        watchdog to finish handing back). ``slurm_bin``: the folder of Slurm's commands the
        watchdog runs (the env file's ``LINKWISE_SLURM_BIN``; None: the PATH's)."""
        pid = os.getpid()
        holder = f"pid {pid} on {os.uname().nodename}, run {self.run_id}, lease {self.path}"
        try:
            self.locks = lock_partitions(self.path.parent, self.partitions, holder)
        except LeaseTaken as exc:
            if not exc.holder.startswith(WATCHDOG_HOLDER):
                raise
            log_event(self.logger, "waiting_for_watchdog", holder=exc.holder)
            self.locks = lock_partitions(
                self.path.parent, self.partitions, holder, wait_s=WAIT_FOR_WATCHDOG_S
            )
        self.lease = Lease(
            owner_pid=pid,
            owner_start=pid_start_time(pid),
            expires_at=time.time(),
            partitions=tuple(sorted(set(self.partitions))),
            slurm_conf=slurm_conf,
            db=db,
            run_id=self.run_id,
            spool=spool,
            slurm_bin=slurm_bin,
        )
        self.renew(None)
        log_event(
            self.logger,
            "lease_taken",
            lease=str(self.path),
            lease_s=self.lease_s,
            job_submit_lua_lease_dir=str(self.path.parent),
        )

    def renew(self, held: tuple[int, ...] | None) -> None:
        """Extend the lease by ``lease_s`` (``held``: the jobs held for the loop now; None
        keeps the last list) and restart the watchdog if it died."""
        if self.lease is None:
            return
        self.lease = renewed(
            self.lease, time.time(), self.lease_s, held=self.lease.held if held is None else held
        )
        write_lease(self.path, self.lease)
        self.metrics.lease_expires.set(self.lease.expires_at)
        self._ensure_watchdog()

    def due(self) -> bool:
        """Whether a renewal is due while the loop waits between cycles."""
        return self.lease is not None and time.time() - self.lease.renewed_at >= min(
            1.0, self.lease_s / 10
        )

    def ok(self, margin: float = 0.5) -> bool:
        """Whether the lease on disk is still this loop's, active and fresh: acting is safe."""
        if self.lease is None:
            return False
        on_disk = read_lease(self.path)
        return (
            on_disk is not None
            and on_disk.owner_pid == os.getpid()
            and on_disk.state == "active"
            and time.time() + margin < on_disk.expires_at
        )

    def hand_back(self, client: SlurmClient, recorder: Recorder) -> list[int]:
        """Hand the partitions back and drop the locks; the released job ids. A Slurm error
        leaves the lease "releasing": once the loop exits, the watchdog finishes."""
        if self.lease is None:
            return []
        released: list[int] = []
        lease, self.lease = self.lease, None  # no more renewals
        try:
            for attempt in range(3):
                try:
                    released = hand_back(
                        client,
                        self.path,
                        lease,
                        recorder,
                        actor="loop:shutdown",
                        logger=self.logger,
                        grace_s=min(2.0, self.lease_s / 2),
                        sleep=self.sleep,
                    )
                    break
                except SlurmError as exc:
                    log_event(self.logger, "shutdown_release_failed", logging.ERROR, error=str(exc))
                    if attempt < 2:
                        time.sleep(1.0)
        finally:
            if self.locks is not None:
                self.locks.close()
                self.locks = None
        return released

    def _ensure_watchdog(self) -> None:
        if not self.watchdog or self.lease is None:
            return
        if self.watchdog_proc is not None and self.watchdog_proc.poll() is None:
            return
        log_path = self.state_dir / "watchdog.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        poll = max(0.2, min(1.0, self.lease_s / 5))
        args = [sys.executable, "-m", "linkwise.cli.watchdog"]
        args += ["--lease", str(self.path), "--poll", str(poll), "--run-id", self.run_id]
        with open(log_path, "ab") as log_fh:
            self.watchdog_proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=log_fh,
                start_new_session=True,
            )
        log_event(self.logger, "watchdog_started", pid=self.watchdog_proc.pid, log=str(log_path))
