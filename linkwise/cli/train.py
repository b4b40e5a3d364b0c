"""``linkwise train`` (BC or CQL from a TOML experiment file) and ``train-ppo`` (the online
baseline): train, register, print the summary and the MLflow run id."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from linkwise.cli.common import EXIT_OK, add_command, add_json
from linkwise.datasets.operator import DEFAULT_STORE, parse_time
from linkwise.pipelines.console import quiet_libraries
from linkwise.pipelines.ppo import format_ppo_result, train_ppo
from linkwise.pipelines.train import format_result, train, train_flow


def add_run_options(p: argparse.ArgumentParser, *, config_help: str, out_help: str) -> None:
    """Add ``--config``, ``--tracking-uri``, ``--out`` and ``--no-register`` to a command."""
    p.add_argument("--config", type=Path, required=True, help=config_help)
    p.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
        "else sqlite in linkwise-out/mlflow)",
    )
    p.add_argument("--out", type=Path, default=Path("linkwise-out/train"), help=out_help)
    p.add_argument("--no-register", action="store_true", help="log the model, do not register")


def cmd_train(args: argparse.Namespace) -> int:
    """``linkwise train --config FILE``: train, register, print the summary and the run id."""
    source = {
        "path": str(args.dataset) if args.dataset else None,
        "db": str(args.db) if args.db else None,
        "since": parse_time(args.since, "--since"),
        "until": parse_time(args.until, "--until"),
    }
    kwargs: dict[str, Any] = {
        "source": {k: v for k, v in source.items() if v is not None},
        "steps": args.steps,
        "tracking_uri": args.tracking_uri,
        "out_dir": args.out,
        "register": False if args.no_register else None,
        "progress": not args.json,
    }
    with quiet_libraries():  # no gym banner (d3rlpy imports gym), no MLflow INFO lines
        result = train_flow(args.config, **kwargs) if args.prefect else train(args.config, **kwargs)
    if args.json:
        print(json.dumps(result.to_json(), default=str))
    else:
        print(format_result(result))
    return EXIT_OK


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to a CLI's subparsers (sets ``func=cmd_train``)."""
    p = add_command(
        subparsers, "train", help="train a learned policy (BC or CQL) from a TOML experiment file"
    )
    add_run_options(
        p,
        config_help="experiment TOML file",
        out_help="folder for built datasets and policy packages",
    )
    p.add_argument(
        "--dataset",
        type=Path,
        help="train on this exported dataset (build-dataset's .parquet) instead of the "
        "configuration's [dataset]",
    )
    p.add_argument(
        "--db",
        type=Path,
        help="build the dataset from this store (the cluster's own accounting, its topology "
        "from the nodes table) instead of the configuration's [dataset]; the operator TOMLs "
        f"(models/experiments/operator_*.toml) read {DEFAULT_STORE} by default",
    )
    p.add_argument(
        "--since", help="with a store: jobs submitted from then on (ISO 8601 or epoch seconds)"
    )
    p.add_argument(
        "--until",
        help="with a store: jobs submitted before then (exclusive); later windows stay "
        "held out for `linkwise evaluate`",
    )
    p.add_argument(
        "--steps", type=int, help="training steps instead of the configuration's [train] n_steps"
    )
    p.add_argument("--prefect", action="store_true", help="run as a Prefect flow")
    add_json(p, "print the result as JSON only")
    p.set_defaults(func=cmd_train)
    return p


def cmd_train_ppo(args: argparse.Namespace) -> int:
    """``linkwise train-ppo --config FILE``: train, register, print the summary."""
    result = train_ppo(
        args.config,
        tracking_uri=args.tracking_uri,
        out_dir=args.out,
        register=False if args.no_register else None,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps(result.to_json(), default=str))
    else:
        print(format_ppo_result(result))
    return EXIT_OK


def add_ppo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train-ppo`` to a CLI's subparsers (sets ``func=cmd_train_ppo``)."""
    p = add_command(
        subparsers,
        "train-ppo",
        help="train the online baseline (MaskablePPO in the simulator) from a TOML file",
    )
    add_run_options(p, config_help="PPO experiment TOML file", out_help="folder for packages")
    add_json(p, "print the result as JSON only")
    p.set_defaults(func=cmd_train_ppo)
    return p
