"""The watchdog: a separate process that hands held jobs back to Slurm when the loop's lease
lapses (the loop crashed, was killed with ``kill -9``, hung, or could not decide in time).

``python -m linkwise.deployer.watchdog --lease PATH [--poll S]``. It polls the lease file;
once the lease expires or its owner process is gone, it releases (audited, unchanged) every
held job of the managed partitions except the refused ones, and repeats that while the lease
stays expired. It exits when the lease was released cleanly, when the lease file is gone,
or after a final sweep once the owner is dead (job_submit.lua stops holding new jobs then).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from linkwise.cluster.slurm.cli_transport import CliTransport, CommandRunner
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.deployer.safety import (
    Lease,
    Recorder,
    lease_expired,
    log_event,
    pid_alive,
    read_lease,
    release_held,
    write_lease,
)

LOG = logging.getLogger("linkwise.watchdog")


def sweep(lease: Lease, client: SlurmClient, recorder: Recorder) -> list[int]:
    """Release every held job of the lease's partitions except the refused ones."""
    managed = set(lease.partitions)
    refused = set(lease.refused)
    queue = client.queue()
    jobs = [j for j in queue if j.held and j.partition in managed and j.job_id not in refused]
    return release_held(
        client,
        jobs,
        recorder=recorder,
        run_id=lease.run_id,
        cycle_id=-1,
        actor="watchdog",
        model_version="",
        logger=LOG,
    )


def watch(lease_path: Path, *, poll_s: float = 1.0, max_s: float | None = None) -> int:
    """Watch ``lease_path`` until the loop is gone and its jobs are released; exit status."""
    started = time.time()
    client: SlurmClient | None = None
    recorder: Recorder | None = None
    while max_s is None or time.time() - started < max_s:
        lease = read_lease(lease_path)
        if lease is None:
            log_event(LOG, "watchdog_exit", reason="no lease file", lease=str(lease_path))
            return 0
        if lease.released:
            log_event(LOG, "watchdog_exit", reason="lease released cleanly")
            return 0
        now = time.time()
        if lease_expired(lease, now):
            if client is None:
                runner = CommandRunner(lease.slurm_conf, timeout=20)
                client = SlurmClient(CliTransport(runner), runner)
            if recorder is None:
                spool = lease_path.with_name(lease_path.name + ".spool.jsonl")
                recorder = Recorder(lease.db, spool, logger=LOG)
            owner_gone = not pid_alive(lease.owner_pid, lease.owner_start)
            log_event(
                LOG,
                "lease_expired",
                owner_pid=lease.owner_pid,
                owner_gone=owner_gone,
                late_s=round(now - lease.expires_at, 3),
            )
            try:
                released = sweep(lease, client, recorder)
            except SlurmError as exc:
                log_event(LOG, "sweep_failed", logging.WARNING, error=str(exc)[:300])
                time.sleep(poll_s)
                continue
            log_event(LOG, "sweep", released=released)
            if owner_gone:
                # a later loop may have taken the lease meanwhile: only mark ours released
                current = read_lease(lease_path)
                if current is not None and current.owner_pid == lease.owner_pid:
                    write_lease(lease_path, replace(current, released=True))
                log_event(LOG, "watchdog_exit", reason="owner gone, jobs released")
                return 0
        time.sleep(poll_s)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="linkwise-watchdog", description=__doc__)
    parser.add_argument("--lease", required=True, help="the loop's lease file")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between checks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return watch(Path(args.lease), poll_s=args.poll)


if __name__ == "__main__":
    sys.exit(main())
