"""``linkwise demo``: the whole pipeline end to end (``pipelines.demo.run_demo``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from linkwise.cli.common import EXIT_OK, TRACE_FORMATS, add_command, add_json, add_wide
from linkwise.pipelines import demo
from linkwise.pipelines.console import quiet_libraries
from linkwise.pipelines.experiment import DEMO_EXPERIMENTS


def cmd_demo(args: argparse.Namespace) -> int:
    """``linkwise demo``: run the pipeline (the stage log and the table on stderr; ``--json``:
    the result as JSON on stdout, nothing else)."""
    with quiet_libraries():
        result = demo.run_demo(
            args.out,
            trace=args.trace,
            trace_format=args.trace_format,
            jobs=args.jobs,
            cluster=args.cluster,
            experiment=args.experiment,
            seed=args.seed,
            tracking_uri=args.tracking_uri,
            progress=not args.json,
            wide=args.wide,
        )
    if args.json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    return EXIT_OK


def add_demo_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``linkwise demo`` to the CLI's subparsers."""
    p = add_command(
        sub,
        "demo",
        help="the whole pipeline end to end on the embedded default workload (or --trace)",
        description=demo.__doc__.split("\n\n")[1] if demo.__doc__ else None,
    )
    p.add_argument("--trace", type=Path, help="a real trace file (default: synthetic workload)")
    p.add_argument(
        "--trace-format",
        default="auto",
        choices=list(TRACE_FORMATS),
        help="format of --trace",
    )
    p.add_argument("--jobs", type=int, help="synthetic jobs (default: the experiment's)")
    p.add_argument("--cluster", help="NODESxGPUS[,leaf=..] (default: the experiment's)")
    p.add_argument(
        "--experiment",
        "--budget",
        dest="experiment",
        choices=DEMO_EXPERIMENTS,
        default="full",
        help="the experiment's numbers (pipelines/experiment.py; default: full)",
    )
    p.add_argument("--out", type=Path, default=Path("linkwise-out/demo"), help="output folder")
    p.add_argument("--seed", type=int, default=0, help="the workload's and the runs' seed")
    p.add_argument("--tracking-uri", help="MLflow (default: sqlite in OUT/mlflow)")
    add_json(p)
    add_wide(p)
    p.set_defaults(func=cmd_demo)
    return p
