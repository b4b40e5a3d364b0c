"""``linkwise serve``: the live scheduling loop's command line (see ``deployer.loop``).

    linkwise serve --config FILE            (every setting from a TOML file; see service_config)
    linkwise serve --config FILE --check-config   (check it, the registry and the model; one line)
    linkwise serve --mode shadow|active --partition NAME [--policy model:champion|HEURISTIC]
                   [--tracking-uri URI] [--fallback HEURISTIC] [--slurm-env FILE] [--db PATH]
                   [--interval S]
                   [--lease S] [--lease-root DIR] [--metrics-port N] [--max-cycles N]
                   [--migrate-budget N] [--migrate-min-run S] [--migrate-grace S]

Also runnable as ``python -m linkwise.deployer.serve ...``. Logs are JSON lines on stderr.
Exit status 2 on bad options and when another loop manages any of the named partitions.

A model the loop is told to serve must be there when it starts (``serving_problem``): a
registry model in the registry it is configured to find (``--tracking-uri``, else
``$MLFLOW_TRACKING_URI``, else ``./linkwise-out/mlflow/mlflow.db``; with ``--config`` the file's
``[policy] tracking_uri``, relative to the file), a package folder where it is named. Else
serve exits 2 with one line naming where it looked, instead of deciding with the fallback
and creating an empty registry (issue 32 item 4). Later, while it runs, a model that cannot
be reloaded still falls back to the heuristic, as before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from linkwise.deployer.loop import DEFAULT_LEASE_ROOT, ServeConfig, serve
from linkwise.deployer.migration import MigrationConfig
from linkwise.deployer.promote import serving_refusal
from linkwise.deployer.safety import LeaseTaken
from linkwise.deployer.service_config import (
    DEFAULT_REGISTRY,
    configure_logging,
    resolve_tracking_uri,
    service_from_args,
)
from linkwise.models.registry import ModelSource, resolve_version

SQLITE = "sqlite:///"


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``add_subparsers()`` object."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the live scheduling loop on Slurm (shadow or active)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    configure_parser(p)
    p.set_defaults(func=cmd_serve)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    """The options of ``serve``."""
    p.add_argument(
        "--mode",
        choices=("shadow", "active"),
        default="shadow",
        help="shadow (default): record only; active: place and release jobs held for the loop",
    )
    p.add_argument(
        "--partition",
        action="append",
        metavar="NAME",
        help="a partition to manage (repeat or comma-separate for several; required unless "
        "--config)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="every setting from this TOML file (deployer/service_config.py; "
        "ops/linkwise-serve.example.toml); no other option may be given with it",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="check the settings, the registry and the model, print one line and exit "
        "(0 good, 2 not) without starting the loop",
    )
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="the model registry: an MLflow tracking URI or the path of its SQLite file "
        f"(default: $MLFLOW_TRACKING_URI, else ./{DEFAULT_REGISTRY})",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text: the JSON events as they are; json: every log record one JSON line",
    )
    p.add_argument(
        "--policy",
        default="backfill",
        help=(
            "shadow mode serves model:shadow (the model `promote --stage shadow` passed), "
            "active mode model:champion (passed on shadow evidence; any other registry alias "
            "is refused in active mode); "
            "model:ALIAS (the registry's linkwise-policy@ALIAS), model:models:/NAME@ALIAS|/N, "
            "model:./PATH[#sha256=DIGEST] (a local package: only as trustworthy as the "
            "checksums.sha256 beside it unless DIGEST, the SHA-256 of that file, is given), "
            "or a heuristic"
        ),
    )
    p.add_argument(
        "--fallback",
        default="backfill",
        help="the heuristic used when the model cannot be loaded or fails",
    )
    p.add_argument(
        "--slurm-env",
        default="/tmp/linkwise-slurm/env",
        help="env file with SLURM_CONF (scripts/local-slurm writes one)",
    )
    p.add_argument("--transport", choices=("cli", "rest"), default="cli")
    p.add_argument("--db", default="linkwise-out/linkwise.duckdb", help="the DuckDB store")
    p.add_argument(
        "--state-dir", default="linkwise-out/serve", help="spool and watchdog log (not the lease)"
    )
    p.add_argument("--interval", type=float, default=2.0, help="seconds between cycles")
    p.add_argument(
        "--lease",
        type=float,
        default=30.0,
        help="seconds the held jobs stay ours without a renewal",
    )
    p.add_argument(
        "--max-hold",
        type=float,
        default=900.0,
        help="release a job held for the loop unchanged after this many seconds",
    )
    p.add_argument(
        "--reload", type=float, default=30.0, help="seconds between checks of the model alias"
    )
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port")
    p.add_argument("--max-cycles", type=int, default=None, help="stop after N cycles")
    p.add_argument(
        "--lease-root",
        default=DEFAULT_LEASE_ROOT,
        help=(
            "where leases and partition locks live (one per cluster below it, derived from "
            "slurm.conf; job_submit.lua's LEASE_DIR): the same for every loop of this host"
        ),
    )
    p.add_argument(
        "--migrate-budget",
        type=int,
        default=MigrationConfig.budget,
        help="preemptions/migrations per opted-in job over its life (Slurm's restart count)",
    )
    p.add_argument(
        "--migrate-min-run",
        type=float,
        default=MigrationConfig.min_run_s,
        help="seconds an opted-in job runs after each (re)start before it may be moved",
    )
    p.add_argument(
        "--migrate-grace",
        type=float,
        default=MigrationConfig.grace_s,
        help="checkpoint seconds after USR1 when the job's linkwise:migratable tag names none",
    )
    p.add_argument(
        "--default-profile",
        default="",
        metavar="NAME",
        help="communication profile of a job that declares none (--comment "
        "linkwise:profile=NAME) and has no earlier run in the store; default: a draw from "
        "the calibration's mix by a hash of the job id",
    )
    p.add_argument(
        "--no-watchdog",
        action="store_true",
        help="do not start the watchdog process (active mode; not recommended)",
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """A ``ServeConfig`` from parsed arguments."""
    items = args.partition or ()
    parts = tuple(p.strip() for item in items for p in item.split(",") if p.strip())
    if args.policy.strip().startswith("model:"):
        ModelSource.parse(args.policy)  # an ambiguous or malformed source is refused here
    return ServeConfig(
        mode=args.mode,
        partitions=parts,
        policy=args.policy,
        fallback=args.fallback,
        slurm_env=args.slurm_env,
        transport=args.transport,
        db=args.db or None,
        state_dir=args.state_dir,
        interval_s=args.interval,
        lease_s=args.lease,
        max_hold_s=args.max_hold,
        reload_s=args.reload,
        metrics_port=args.metrics_port,
        max_cycles=args.max_cycles,
        watchdog=not args.no_watchdog,
        lease_root=args.lease_root,
        migration=MigrationConfig(
            grace_s=args.migrate_grace, budget=args.migrate_budget, min_run_s=args.migrate_min_run
        ),
        default_profile=args.default_profile.strip(),
        tracking_uri=resolve_tracking_uri(
            args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_REGISTRY,
            Path.cwd(),
        ),
    )


def serving_problem(spec: str, tracking_uri: str) -> str | None:
    """Why the model ``spec`` names cannot be served now (where it was looked for), or None:
    heuristics always can. A SQLite registry that does not exist is reported before any
    MLflow client opens it (which would create an empty one)."""
    if not spec.strip().startswith("model:"):
        return None
    source = ModelSource.parse(spec)
    if source.registry_uri is None:
        if not Path(source.target).is_dir():
            return f"{spec}: no package folder at {source.target}"
        return None
    if tracking_uri.startswith(SQLITE):
        db = Path(tracking_uri.removeprefix(SQLITE))
        if not db.is_file():
            return f"{spec}: no model registry at {tracking_uri} (no such file)"
    try:
        resolve_version(source.registry_uri, tracking_uri)
    except ValueError as exc:
        return str(exc)
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``linkwise serve``; prints a JSON summary on stdout."""
    try:
        config, log_format = service_from_args(args, config_from_args)
    except ValueError as exc:
        print(f"linkwise serve: {exc}", file=sys.stderr)
        return 2
    refusal = serving_refusal(config.mode, config.policy)
    if refusal is not None:
        print(f"linkwise serve: refusing to start: {refusal}", file=sys.stderr)
        return 2
    problem = serving_problem(config.policy, config.tracking_uri)
    if problem is not None:
        print(f"linkwise serve: refusing to start: {problem}", file=sys.stderr)
        return 2
    if args.check_config:
        where = f" (registry {config.tracking_uri})" if config.policy.startswith("model:") else ""
        print(
            f"linkwise serve: {args.config or 'the options'}: good: {config.mode} on "
            f"{','.join(config.partitions)}, policy {config.policy}{where}"
        )
        return 0
    configure_logging(log_format)
    try:
        summary = serve(config, install_signals=True)
    except LeaseTaken as exc:
        print(f"linkwise serve: refusing to start: {exc}", file=sys.stderr)
        return 2
    summary.pop("metrics", None)
    print(json.dumps(summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m linkwise.deployer.serve``."""
    parser = argparse.ArgumentParser(prog="linkwise serve", description=__doc__)
    configure_parser(parser)
    return cmd_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
