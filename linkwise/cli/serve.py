"""The live loop's commands: ``linkwise serve`` (the scheduling loop in front of Slurm),
``explain`` (why it decided what it did about a job) and ``shadow-report`` (the shadow
window replayed under the shadow policy, backfill and the accounting).

    linkwise serve --config FILE            (every setting from a TOML file; see service_config)
    linkwise serve --config FILE --check-config   (check it, the registry and the model; one line)
    linkwise serve --mode shadow|active --partition NAME [--policy model:champion|HEURISTIC]
                   [--tracking-uri URI] [--fallback HEURISTIC] [--calibration FILE]
                   [--slurm-env FILE] [--db PATH]
                   [--interval S]
                   [--lease S] [--lease-root DIR] [--metrics-port N] [--max-cycles N]
                   [--migrate-budget N] [--migrate-min-run S] [--migrate-grace S]

Logs are JSON lines on stderr. ``serve`` exits 2 on bad options, when another loop manages
any of the named partitions, and when the model it is told to serve is not there
(``deployer.serve.serving_problem``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from linkwise.cli.common import (
    EXIT_INPUT,
    EXIT_OK,
    STORE_CALIBRATION_HELP,
    add_calibration,
    add_command,
    add_json,
)
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.log_jobs import topology_from_store
from linkwise.datasets.operator import DEFAULT_STORE, operator_store
from linkwise.datasets.store import open_store
from linkwise.deployer.explain import explain_lines, job_decisions
from linkwise.deployer.locks import LeaseTaken
from linkwise.deployer.loop import DEFAULT_LEASE_ROOT, ServeConfig, serve
from linkwise.deployer.migration import MigrationConfig
from linkwise.deployer.promote import serving_refusal
from linkwise.deployer.serve import serving_problem
from linkwise.deployer.service_config import (
    DEFAULT_REGISTRY,
    ConfigError,
    configure_logging,
    load_service_config,
    resolve_tracking_uri,
)
from linkwise.evaluation.shadow_replay import shadow_report
from linkwise.evaluation.shadow_report import log_shadow_report, write_shadow_report
from linkwise.models.calibrations import calibration_for_store
from linkwise.models.registry import default_tracking_uri
from linkwise.policies.spec import PolicySpec

# ------------------------------------------------------------------------ serve


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``add_subparsers()`` object."""
    p = add_command(
        sub,
        "serve",
        help="run the live scheduling loop on Slurm (shadow or active)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    configure_parser(p)
    p.set_defaults(func=cmd_serve)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    """The options of ``serve``: what it serves, how it reaches Slurm and holds jobs, and
    how it moves them (in that order in ``--help``)."""
    _add_policy_options(p)
    _add_loop_options(p)
    _add_migration_options(p)


def _add_policy_options(p: argparse.ArgumentParser) -> None:
    """The mode, the partitions, the settings file, the registry and the policies."""
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
    add_calibration(
        p,
        "calibration JSON the contention model uses (default: the serving package's own, "
        "else the newest one `linkwise calibrate --db` logged in --tracking-uri for the Slurm "
        "cluster, else the shipped one; deployer/calibration.py)",
    )


def _add_loop_options(p: argparse.ArgumentParser) -> None:
    """How the loop reaches Slurm, where it keeps its state, its cycle and its leases."""
    p.add_argument(
        "--slurm-env",
        default="/tmp/linkwise-slurm/env",
        help="env file with SLURM_CONF (scripts/local-slurm writes one)",
    )
    p.add_argument(
        "--transport",
        choices=("cli", "rest"),
        default="cli",
        help="Slurm through its commands (cli) or slurmrestd (rest)",
    )
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


def _add_migration_options(p: argparse.ArgumentParser) -> None:
    """Preemption and migration of opted-in jobs, the default profile and the watchdog."""
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
    return ServeConfig(
        mode=args.mode,
        partitions=parts,
        policy=PolicySpec.parse(args.policy),  # an ambiguous or malformed one is refused here
        fallback=PolicySpec.parse(args.fallback),
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
        calibration=str(args.calibration) if args.calibration is not None else None,
    )


def service_from_args(
    args: argparse.Namespace, from_args: Callable[[argparse.Namespace], ServeConfig]
) -> tuple[ServeConfig, str]:
    """The loop's configuration and log format: from ``--config FILE`` (no other ``serve``
    option may be given then), else from the options (``from_args``)."""
    path = getattr(args, "config", None)
    if path is None:
        return from_args(args), str(getattr(args, "log_format", "text"))
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    options = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    given = [
        opt
        for dest, opt in options.items()
        if dest not in ("config", "help", "check_config")
        and getattr(args, dest, None) != parser.get_default(dest)
    ]
    if given:
        raise ConfigError(
            f"--config {path}: set {', '.join(given)} in the file, not on the command line "
            "(--config and the other options are mutually exclusive)"
        )
    service = load_service_config(path)
    return service.serve, service.log_format


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``linkwise serve``; prints a JSON summary on stdout."""
    try:
        config, log_format = service_from_args(args, config_from_args)
    except ValueError as exc:
        print(f"linkwise serve: {exc}", file=sys.stderr)
        return EXIT_INPUT
    refusal = serving_refusal(config.mode, config.policy)
    if refusal is not None:
        print(f"linkwise serve: refusing to start: {refusal}", file=sys.stderr)
        return EXIT_INPUT
    problem = serving_problem(config.policy, config.tracking_uri)
    if problem is not None:
        print(f"linkwise serve: refusing to start: {problem}", file=sys.stderr)
        return EXIT_INPUT
    if args.check_config:
        where = f" (registry {config.tracking_uri})" if config.policy.is_model else ""
        print(
            f"linkwise serve: {args.config or 'the options'}: good: {config.mode} on "
            f"{','.join(config.partitions)}, policy {config.policy.label}{where}"
        )
        return EXIT_OK
    configure_logging(log_format)
    try:
        summary = serve(config, install_signals=True)
    except LeaseTaken as exc:
        print(f"linkwise serve: refusing to start: {exc}", file=sys.stderr)
        return EXIT_INPUT
    summary.pop("metrics", None)
    print(json.dumps(summary))
    return EXIT_OK


# ------------------------------------------------------------------------ explain


def cmd_explain(args: argparse.Namespace) -> int:
    """``linkwise explain JOB_ID --db STORE [--json]``."""
    db = Path(args.db)
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such store")
    with closing(open_store(db, lock_wait_s=args.lock_wait)) as con:
        rows = job_decisions(con, args.job_id)
    if args.json:
        print(json.dumps(rows, default=str))
        return EXIT_OK
    if not rows:
        print(f"no decision of the loop names job {args.job_id} in {db}")
        return EXIT_OK
    print("\n".join(explain_lines(rows, args.job_id)))
    return EXIT_OK


def add_explain_parser(sub: Any) -> None:
    """``linkwise explain``."""
    p = add_command(sub, "explain", help="why the live loop decided what it did about a job")
    p.add_argument("job_id", type=int, metavar="JOB_ID", help="the Slurm job id")
    p.add_argument("--db", type=Path, required=True, help="the live loop's DuckDB store")
    p.add_argument(
        "--lock-wait", type=float, default=10.0, metavar="S", help="wait for a held store"
    )
    add_json(p, "the decision rows as JSON")
    p.set_defaults(func=cmd_explain)


# ------------------------------------------------------------------------ shadow-report


def _time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        try:
            t = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not a time: {text!r} (epoch seconds or ISO 8601)") from None
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def cmd_shadow_report(args: argparse.Namespace) -> int:
    """``linkwise shadow-report``."""
    db = operator_store(args.db)
    assert db is not None
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such store")
    uri = args.tracking_uri or default_tracking_uri()
    policy = PolicySpec.parse(args.policy) if args.policy else None  # refused before any work
    since, until = _time(args.since), _time(args.until)
    if since is not None and until is not None and until < since:
        raise ValueError("--until is before --since")
    choice = calibration_for_store(
        args.calibration,
        db,
        slurm_cluster=args.slurm_cluster,
        tracking_uri=uri,
        lock_wait_s=args.lock_wait,
    )
    with closing(open_store(db, lock_wait_s=args.lock_wait)) as con:
        topo = (
            load_topology(args.cluster)
            if args.cluster
            else topology_from_store(con, args.slurm_cluster)
        )
        report = shadow_report(
            con,
            topology=topo,
            calibration=load_calibration(choice.path),
            calibration_used=choice.to_dict(),
            policy=policy,
            since=since,
            until=until,
            cluster=args.slurm_cluster,
            tracking_uri=uri,
            seed=args.seed,
            n_boot=args.n_boot,
        )
    paths = write_shadow_report(report, args.out)
    run_id = None
    if not args.no_log:
        run_id = log_shadow_report(report, args.out, tracking_uri=uri)
    if args.json:
        doc = {**report.to_json(), "files": {k: str(v) for k, v in paths.items()}}
        doc["calibration_used"] = choice.to_dict()
        print(json.dumps({**doc, "mlflow_run_id": run_id}, default=str))
    else:
        print(paths["markdown"].read_text(), end="")
        print(f"calibration: {choice.describe()}")
        print(f"written to {args.out}" + (f"; MLflow run {run_id}" if run_id else ""))
    return EXIT_OK


def add_shadow_report_parser(sub: Any) -> None:
    """``linkwise shadow-report``."""
    p = add_command(
        sub,
        "shadow-report",
        help="replay the shadow window under the shadow policy, backfill and the accounting",
    )
    p.add_argument(
        "--db", type=Path, help=f"the live loop's DuckDB store (default: {DEFAULT_STORE})"
    )
    p.add_argument(
        "--since",
        help="window start, epoch seconds or ISO (default: the first decision of the latest "
        "shadow version whose span has finished jobs; later spans without any are skipped "
        "and named)",
    )
    p.add_argument("--until", help="window end, epoch seconds or ISO (default: its last decision)")
    p.add_argument(
        "--policy",
        help="the policy to replay (default: the decisions' own, pinned to the logged version)",
    )
    p.add_argument("--cluster", help="topology spec or folder (default: the store's nodes)")
    p.add_argument("--slurm-cluster", help="the Slurm cluster's name in the store")
    p.add_argument("--calibration", type=Path, help=STORE_CALIBRATION_HELP)
    p.add_argument(
        "--tracking-uri",
        help="MLflow: where models:/ specs load from and the report is logged (default: "
        "$MLFLOW_TRACKING_URI, else sqlite:///linkwise-out/mlflow/mlflow.db under the working "
        "folder, as for train, evaluate and promote)",
    )
    p.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    p.add_argument(
        "--out", type=Path, default=Path("linkwise-out/shadow-report"), help="report folder"
    )
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap draws")
    p.add_argument(
        "--lock-wait", type=float, default=10.0, metavar="S", help="wait for a held store"
    )
    add_json(p, "print the report as JSON")
    p.set_defaults(func=cmd_shadow_report)
