"""``python -m linkwise.cli.watchdog --lease PATH [--poll S] [--run-id ID]``: the watchdog
process the live loop starts beside itself (``deployer.lease_keeper``), which hands held jobs
back to Slurm when the loop's lease lapses (``deployer.watchdog.watch``). Not a ``linkwise``
subcommand: nobody runs it by hand."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from linkwise.deployer import watchdog


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="linkwise-watchdog", description=watchdog.__doc__)
    parser.add_argument("--lease", required=True, help="the loop's lease file")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between checks")
    parser.add_argument("--run-id", help="the loop's run to watch (default: the lease's now)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return watchdog.watch(Path(args.lease), poll_s=args.poll, run_id=args.run_id)


if __name__ == "__main__":
    sys.exit(main())
