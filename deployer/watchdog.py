"""The watchdog: a separate process that hands held jobs back to Slurm when the loop's lease
lapses (the loop crashed, was killed with ``kill -9``, hung, or could not decide in time).

``python -m linkwise.cli.watchdog --lease PATH [--poll S]`` runs ``watch``, which polls the
lease file.
While the owner runs but the lease ran out (a hung loop; job_submit.lua holds nothing new
then), it releases the jobs held for the loop, and again while it stays expired. Once the
owner process is gone it takes the partitions' locks (so no new loop starts meanwhile), marks
the lease releasing, sweeps, waits, sweeps again and marks it released (``hand_back``). It
only ever releases jobs held for the loop (``holds.held_for_loop``): never an
administrator's or a user's own hold. It exits when the lease was released, when the lease
file is gone, or when a new loop already took the partitions (it manages those jobs).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from linkwise.cluster.slurm.cli_transport import CliTransport, CommandRunner
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.deployer.events import log_event
from linkwise.deployer.lease import Lease, pid_alive, read_lease
from linkwise.deployer.locks import WATCHDOG_HOLDER, LeaseTaken, lock_partitions
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.release import hand_back, sweep

LOG = logging.getLogger("linkwise.watchdog")


def _tools(lease: Lease, lease_path: Path) -> tuple[SlurmClient, Recorder]:
    runner = CommandRunner(lease.slurm_conf, timeout=20, bin_dir=lease.slurm_bin)
    spool = lease.spool or str(lease_path.with_name(lease_path.name + ".spool.jsonl"))
    return SlurmClient(CliTransport(runner), runner), Recorder(lease.db, spool, logger=LOG)


def take_over(lease_path: Path, lease: Lease, *, poll_s: float) -> int:
    """The owner is gone: hand its partitions back to Slurm under their locks."""
    try:
        locks = lock_partitions(
            lease_path.parent,
            lease.partitions,
            f"{WATCHDOG_HOLDER} (pid {lease.owner_pid}, run {lease.run_id}), releasing its "
            "jobs; retry in a few seconds",
            wait_s=5.0,
        )
    except LeaseTaken as exc:
        log_event(LOG, "watchdog_exit", reason=f"a new loop took over: {exc}")
        return 0
    try:
        current = read_lease(lease_path)
        if current is None or current.run_id != lease.run_id or current.released:
            log_event(LOG, "watchdog_exit", reason="the lease changed hands meanwhile")
            return 0
        client, recorder = _tools(current, lease_path)
        for attempt in range(30):
            try:
                released = hand_back(
                    client,
                    lease_path,
                    current,
                    recorder,
                    actor="watchdog",
                    logger=LOG,
                    grace_s=max(2.0, 2 * poll_s),
                )
                log_event(
                    LOG, "watchdog_exit", reason="owner gone, jobs released", released=released
                )
                return 0
            except SlurmError as exc:
                log_event(
                    LOG, "sweep_failed", logging.WARNING, attempt=attempt, error=str(exc)[:300]
                )
                time.sleep(min(10.0, 1.0 + attempt))
        log_event(LOG, "watchdog_gave_up", logging.ERROR, lease=str(lease_path))
        return 1
    finally:
        locks.close()


def watch(
    lease_path: Path,
    *,
    poll_s: float = 1.0,
    max_s: float | None = None,
    run_id: str | None = None,
) -> int:
    """Watch ``lease_path`` until the loop is gone and its jobs are released; exit status.
    It watches one run of the loop (``run_id``, else the first one it reads): once the lease
    names another run, a later loop holds it, with its own watchdog, and this one exits."""
    started = time.time()
    tools: tuple[SlurmClient, Recorder] | None = None
    while max_s is None or time.time() - started < max_s:
        lease = read_lease(lease_path)
        if lease is None:
            log_event(LOG, "watchdog_exit", reason="no lease file", lease=str(lease_path))
            return 0
        run_id = run_id or lease.run_id
        if lease.run_id != run_id:
            log_event(LOG, "watchdog_exit", reason="a later run of the loop holds the lease")
            return 0
        if lease.released:
            log_event(LOG, "watchdog_exit", reason="lease released")
            return 0
        if not pid_alive(lease.owner_pid, lease.owner_start):
            log_event(LOG, "owner_gone", owner_pid=lease.owner_pid, state=lease.state)
            return take_over(lease_path, lease, poll_s=poll_s)
        now = time.time()
        if lease.state == "active" and now >= lease.expires_at:
            log_event(
                LOG, "lease_expired", owner_pid=lease.owner_pid, late_s=now - lease.expires_at
            )
            tools = tools or _tools(lease, lease_path)
            try:
                released = sweep(tools[0], lease, tools[1], actor="watchdog", logger=LOG)
                log_event(LOG, "sweep", released=released)
            except SlurmError as exc:
                log_event(LOG, "sweep_failed", logging.WARNING, error=str(exc)[:300])
        time.sleep(poll_s)
    return 0
