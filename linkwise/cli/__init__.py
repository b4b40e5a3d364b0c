"""The ``linkwise`` command line: ``main``, ``build_parser`` and the registry of commands.

Every command's options are defined in this package, one module per group of commands; the
library (``cluster``, ``datasets``, ``models``, ``evaluation``, ``pipelines``, ``deployer``)
takes typed arguments and defines none:

- ``simulate``: ``simulate``, ``compare``, ``topology``, ``policies``
- ``calibrate``: ``calibrate`` (and ``python -m linkwise.cli.calibrate``, the shipped fit's
  refit)
- ``data``: ``collect accounting|telemetry``, ``build-dataset``, ``label``, ``profiles``
- ``train``: ``train``, ``train-ppo``
- ``evaluate``: ``evaluate``, ``promote``, ``rollback``, ``ope``, ``robust``
- ``serve``: ``serve``, ``explain``, ``shadow-report``
- ``demo``: ``demo``
- ``watchdog``: ``python -m linkwise.cli.watchdog``, the process the live loop starts beside
  itself (no subcommand)
- ``common``: exit codes, the help formatter (every default shown) and the options several
  commands share.

Exit codes: 0 success, 1 unexpected failure, 2 bad usage or bad input (a clear message on
stderr, nothing half-written), 3 refused by a gate (``promote``, ``rollback``, ``robust``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from linkwise import __version__
from linkwise.cli.common import EXIT_INPUT
from linkwise.supervise import supervise

# ``serve`` stops itself on SIGINT/SIGTERM (it hands its held jobs back), systemd watches its
# own process (sd_notify) and its watchdog process must outlive it: not supervised
UNSUPERVISED = frozenset({"serve"})


def commands() -> tuple[Callable[[Any], object], ...]:
    """The registry: each command's parser adder, in the order ``linkwise --help`` lists
    them."""
    # The command modules import most of the library (polars, DuckDB): loaded when a parser
    # is built, never by importing this package, so the live loop's watchdog process
    # (``python -m linkwise.cli.watchdog``) loads 246 modules, 40 MB, not 920, 118 MB
    # (measured); the way out is main and the registry in a module of their own (the
    # console script's target changes: the venv's ``linkwise`` script is reinstalled).
    from linkwise.cli import calibrate, data, demo, evaluate, serve, simulate, train

    return (
        simulate.add_simulate_parser,
        simulate.add_compare_parser,
        calibrate.add_calibrate_parser,
        simulate.add_topology_parser,
        simulate.add_policies_parser,
        data.add_collect_parser,
        data.add_build_dataset_parser,
        train.add_train_parser,
        train.add_ppo_parser,
        evaluate.add_evaluate_parser,
        evaluate.add_promote_parser,
        evaluate.add_rollback_parser,
        evaluate.add_ope_parser,
        serve.add_serve_parser,
        serve.add_explain_parser,
        serve.add_shadow_report_parser,
        demo.add_demo_parser,
        evaluate.add_robust_parser,
        data.add_label_parser,
        data.add_profiles_parser,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linkwise",
        description="Contention-aware scheduling for Slurm GPU clusters: "
        "simulate and compare policies.",
    )
    parser.add_argument("--version", action="version", version=f"linkwise {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in commands():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; run as a program (``argv`` None), a command runs in a child process
    that SIGINT/SIGTERM end with its workers (``linkwise.supervise``)."""
    args = build_parser().parse_args(argv)
    if argv is None and args.command not in UNSUPERVISED:
        code = supervise(args.command)
        if code is not None:
            return code
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"linkwise {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
