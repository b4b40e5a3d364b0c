"""The data commands: ``linkwise collect accounting|telemetry`` (Slurm's accounting and the
telemetry into the store), ``build-dataset`` (transitions), ``label`` (counterfactual
labels) and ``profiles`` (per-job telemetry and communication profiles).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from linkwise.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    STORE_CALIBRATION_HELP,
    add_calibration,
    add_command,
    add_executor,
    add_json,
    add_lock_wait,
    add_tracking_uri,
    add_window,
    csv_list,
)
from linkwise.cluster.mdp import SLOT_ORDERS, MdpConfig
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.comm_profiles import ProfileCounts
from linkwise.datasets.job_telemetry import ATTRIBUTION_RULE
from linkwise.datasets.operator import DEFAULT_STORE, operator_store, parse_time
from linkwise.datasets.store import StoreLockedError
from linkwise.models.calibrations import calibration_for_store
from linkwise.pipelines.build_dataset import (
    DEFAULT_EPSILONS,
    DEFAULT_POLICIES,
    build_dataset,
    format_report,
)
from linkwise.pipelines.collect_accounting import collect_accounting
from linkwise.pipelines.collect_common import CollectError
from linkwise.pipelines.collect_telemetry import collect_telemetry
from linkwise.pipelines.label import label
from linkwise.pipelines.profiles import format_profiles, profiles_report
from linkwise.policies.spec import PolicySpec, parse_specs

# ------------------------------------------------------------------------ collect


def cmd_collect_accounting(args: argparse.Namespace) -> int:
    since = parse_time(args.since, "--since")
    until = parse_time(args.until, "--until")
    env_file = args.slurm_env or os.environ.get("LINKWISE_SLURM_ENV")
    env = read_env_file(env_file) if env_file else dict(os.environ)
    cluster = args.slurm_cluster or env.get("LINKWISE_SLURM_CLUSTER")
    if not cluster:
        raise ValueError("no cluster name: pass --slurm-cluster (or LINKWISE_SLURM_CLUSTER)")
    try:
        client = SlurmClient.from_env(env, args.transport, timeout=args.timeout)
        report = collect_accounting(
            client,
            args.db,
            cluster=cluster,
            since=since,
            until=until,
            window_s=args.window,
            overlap_s=args.overlap,
            lock_wait_s=args.lock_wait,
            reject_hold_s=args.reject_hold,
        )
    except CollectError as exc:
        done = exc.report.to_dict()
        if args.json:
            print(json.dumps({"error": str(exc), **done}, default=str))
        print(f"linkwise collect accounting: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except (SlurmError, StoreLockedError) as exc:
        print(f"linkwise collect accounting: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    out = report.to_dict()
    if args.json:
        print(json.dumps(out, default=str))
        return EXIT_OK
    print(
        f"{args.db}: cluster {cluster}, {out['nodes']} nodes, {len(out['windows'])} window(s); "
        f"{out['received']} records: {out['inserted']} new, {out['updated']} updated, "
        f"{out['unchanged']} unchanged, {out['kept_settled']} kept settled, "
        f"{out['unsettled']} unsettled, {out['rejected']} rejected "
        f"({out['new_rejects']} new, {out['resolved']} resolved, {out['open_rejects']} open); "
        f"watermark {out['watermark']}"
    )
    for reason, n in out["rejected_reasons"].items():
        print(f"  rejected {n}: {reason}")
    if report.held_at is not None:
        print(f"  watermark held at {report.held_at}: {report.held_reason}")
    return EXIT_OK


def cmd_collect_telemetry(args: argparse.Namespace) -> int:
    try:
        report = collect_telemetry(
            args.db,
            endpoints=args.endpoint or [],
            sysfs_roots=args.sysfs or [],
            host=args.host,
            cluster=args.slurm_cluster,
            timeout=args.timeout,
            interval_s=args.interval,
            lock_wait_s=args.lock_wait,
        )
    except StoreLockedError as exc:
        print(f"linkwise collect telemetry: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    out = report.to_dict()
    if args.json:
        print(json.dumps(out, default=str))
    else:
        for s in out["sources"]:
            if s["error"]:
                print(f"{s['source']}: FAILED: {s['error']}")
                continue
            print(
                f"{s['source']}: {s['samples']} samples, {s['link_load_rows']} link_load rows, "
                f"{s['malformed']} malformed lines, DCGM blanks {s['sentinels'] or 0}, "
                f"{s['unsupported']} unsupported counters"
            )
            for reason, n in s["rejected_reasons"].items():
                print(f"  rejected {n}: {reason}")
        print(f"InfiniBand link_load rows derived: {out['ib_link_load_rows']}")
        rates = out["rates"] or {}
        if rates:
            print(
                f"{rates['port_directions']} InfiniBand port directions, "
                f"{rates['ports_without_rate']} without a rate"
            )
            for reason, n in rates["without_rate"].items():
                print(f"  no rate, {reason}: {n}")
    for source, error in out["errors"].items():
        print(f"linkwise collect telemetry: error: {source}: {error}", file=sys.stderr)
    return EXIT_FAIL if out["errors"] else EXIT_OK


def add_collect_parser(sub: Any) -> None:
    p = add_command(sub, "collect", help="collect Slurm accounting or telemetry into DuckDB")
    csub = p.add_subparsers(dest="collect_what", required=True, metavar="WHAT")

    a = add_command(csub, "accounting", help="Slurm accounting records and nodes, incrementally")
    a.add_argument("--db", type=Path, required=True, help="the DuckDB store (created if missing)")
    a.add_argument("--since", help="ISO time or epoch seconds (default: from the watermark)")
    a.add_argument("--until", help="ISO time or epoch seconds (default: now)")
    a.add_argument(
        "--transport",
        choices=["cli", "rest"],
        default="cli",
        help="Slurm through its commands (cli) or slurmrestd (rest)",
    )
    a.add_argument(
        "--slurm-env",
        type=Path,
        help="env file with SLURM_CONF, LINKWISE_SLURM_REST_URL, LINKWISE_SLURM_CLUSTER "
        "(default: $LINKWISE_SLURM_ENV, else the environment)",
    )
    a.add_argument(
        "--slurm-cluster", help="the Slurm cluster's name (default: LINKWISE_SLURM_CLUSTER)"
    )
    add_window(a)
    a.add_argument("--overlap", type=float, default=600.0, help="window overlap, seconds")
    a.add_argument(
        "--reject-hold",
        type=float,
        default=86400.0,
        metavar="S",
        help="records the parser rejects hold the watermark for S seconds (default one day; "
        "a run that accepts no record at all holds until one does)",
    )
    a.add_argument("--timeout", type=float, default=30.0, help="per Slurm call, seconds")
    add_lock_wait(a)
    add_json(a)
    a.set_defaults(func=cmd_collect_accounting)

    t = add_command(csub, "telemetry", help="scrape exporter endpoints and sysfs counters")
    t.add_argument("--db", type=Path, required=True, help="the DuckDB store (created if missing)")
    t.add_argument("--endpoint", action="append", metavar="URL", help="exporter URL (repeatable)")
    t.add_argument("--sysfs", action="append", metavar="PATH", help="sysfs root (repeatable)")
    t.add_argument("--host", help="node name for samples without a host label")
    t.add_argument(
        "--slurm-cluster", default="", help="the Slurm cluster's name stored with link_load rows"
    )
    t.add_argument(
        "--timeout", type=float, default=5.0, help="deadline of each whole scrape, seconds"
    )
    t.add_argument("--interval", type=float, default=30.0, help="scrape interval, seconds")
    add_lock_wait(t)
    add_json(t)
    t.set_defaults(func=cmd_collect_telemetry)


# ------------------------------------------------------------------------ build-dataset


def _rollouts_arg(text: str) -> int | None:
    """``--rollouts``: a count, or ``all`` (None: every eligible window)."""
    return None if text.strip().lower() == "all" else int(text)


def mdp_from_args(args: argparse.Namespace) -> MdpConfig:
    """The MDP configuration the options ask for (defaults for the rest); it is written into
    the dataset's manifest, which training then follows."""
    given = {"k_slots": args.k_slots, "slot_order": args.slot_order}
    return MdpConfig.from_json({k: v for k, v in given.items() if v is not None})


def cmd_build_dataset(args: argparse.Namespace) -> int:
    """``linkwise build-dataset``: build, export, print the report (or JSON)."""
    db = operator_store(args.from_db, args.trace)
    choice = calibration_for_store(
        args.calibration, db, slurm_cluster=args.slurm_cluster, tracking_uri=args.tracking_uri
    )
    manifest = build_dataset(
        db,
        args.trace,
        out_dir=args.out,
        rollouts=args.rollouts,
        policies=parse_specs(args.policies or "") or DEFAULT_POLICIES,
        epsilons=csv_list(args.epsilons, float) or list(DEFAULT_EPSILONS),
        windows=csv_list(args.windows, int),
        seeds=csv_list(args.seeds, int) or [0],
        window_s=args.window,
        block_s=args.block,
        min_jobs=args.min_jobs,
        topology=args.cluster,
        slurm_cluster=args.slurm_cluster,
        since=parse_time(args.since, "--since"),
        until=parse_time(args.until, "--until"),
        calibration=choice.path,
        calibration_used=choice.to_dict(),
        config=mdp_from_args(args),
        executor=args.executor,
        batch=args.batch,
        max_steps=args.max_steps,
        tracking_uri=args.tracking_uri,
        warm_start=args.warm_start,
        history=args.history,
        log_share=args.log_share,
    )
    if args.json:
        print(json.dumps(manifest, default=str))
    else:
        print(format_report(manifest))
        print(f"calibration: {choice.describe()}")
    return EXIT_OK


def add_build_dataset_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``build-dataset`` to a CLI's subparsers (sets ``func=cmd_build_dataset``)."""
    p = add_command(
        subparsers, "build-dataset", help="transitions from logs and simulator rollouts, exported"
    )
    p.add_argument(
        "--from-db",
        type=Path,
        help="the DuckDB store (transitions from the logs; default without --trace: the "
        f"operator's store {DEFAULT_STORE})",
    )
    p.add_argument(
        "--since",
        help="the dataset's span starts here: jobs submitted from then on (ISO 8601, local "
        "time unless it has an offset, or epoch seconds; default: the history's start)",
    )
    p.add_argument(
        "--until",
        help="the dataset's span ends here (exclusive; default: the history's end); later "
        "windows stay free for `linkwise evaluate`",
    )
    p.add_argument("--trace", type=Path, help="trace file for rollouts (default: the store's jobs)")
    p.add_argument(
        "--rollouts",
        type=_rollouts_arg,
        default=0,
        help="trace windows to roll out (0: none; all: every window with --min-jobs jobs)",
    )
    p.add_argument(
        "--min-jobs", type=int, default=10, help="windows with fewer jobs are not rolled out"
    )
    p.add_argument(
        "--policies",
        help=f"comma-separated behaviour specs, e.g. sjf_bco:lam=2 or model:PATH "
        f"(default {','.join(p.label for p in DEFAULT_POLICIES)})",
    )
    p.add_argument("--epsilons", help="comma-separated exploration rates (default 0,0.1)")
    p.add_argument("--seeds", help="comma-separated resampling seeds (default 0)")
    p.add_argument("--windows", help="comma-separated window ids (instead of --rollouts)")
    add_window(p)
    p.add_argument("--block", type=float, default=1800.0, help="bootstrap block, seconds (0: off)")
    p.add_argument(
        "--cluster",
        help=f"topology for rollouts, as in simulate (default: the store's nodes, else "
        f"{DEFAULT_TOPOLOGY})",
    )
    p.add_argument("--slurm-cluster", help="the Slurm cluster's name in the store (if several)")
    add_calibration(p, STORE_CALIBRATION_HELP)
    p.add_argument(
        "--k-slots", type=int, help=f"queue slots of the decision (default {MdpConfig.k_slots})"
    )
    p.add_argument(
        "--slot-order",
        choices=SLOT_ORDERS,
        help=f"which queued jobs fill the slots (default {MdpConfig.slot_order})",
    )
    add_executor(p)
    p.add_argument(
        "--batch", type=int, default=4, help="rollouts sent to a worker together (a task run)"
    )
    p.add_argument("--max-steps", type=int, help="cut rollout episodes after so many steps")
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="rollouts from the store start from its running and queued jobs at each window",
    )
    p.add_argument(
        "--history",
        type=Path,
        help="a trace or store to fit the run-time predictor on (default: the store, else the "
        "trace); recorded in the manifest",
    )
    p.add_argument(
        "--log-share",
        type=float,
        help="at most this share of the dataset from the logs (whole episodes; default: all)",
    )
    p.add_argument("--out", type=Path, default=Path("linkwise-out/datasets"), help="output folder")
    add_tracking_uri(p, "MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")
    add_json(p, "print the manifest as JSON only")
    p.set_defaults(func=cmd_build_dataset)
    return p


# ------------------------------------------------------------------------ profiles


def cmd_profiles(args: argparse.Namespace) -> int:
    """``linkwise profiles``: build job telemetry, learn profiles, print the report."""
    report = profiles_report(
        args.db,
        cluster=args.slurm_cluster,
        interval_s=args.interval,
        build=not args.no_build,
        min_runs=args.min_runs,
        until=args.until,
    )
    print(json.dumps(report, default=str) if args.json else format_profiles(report))
    return EXIT_OK


def add_profiles_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``linkwise profiles``."""
    p = add_command(
        subparsers,
        "profiles",
        help="per-job telemetry and communication profiles learned from the store's history",
        description=f"Attribution: {ATTRIBUTION_RULE}",
    )
    p.add_argument("--db", type=Path, required=True, help="the DuckDB store")
    p.add_argument("--slurm-cluster", help="the Slurm cluster's name in the store (if several)")
    p.add_argument(
        "--interval", type=float, default=30.0, help="the telemetry scrape interval, s (30)"
    )
    p.add_argument(
        "--no-build", action="store_true", help="read the job telemetry as built, build nothing"
    )
    p.add_argument(
        "--min-runs", type=int, default=1, help="runs a profile needs at least (default 1)"
    )
    p.add_argument("--until", type=float, help="learn only from runs ended before this epoch time")
    add_json(p, "print the report as JSON")
    p.set_defaults(func=cmd_profiles)
    return p


# ------------------------------------------------------------------------ label


def _seconds(text: str) -> float:
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip().lower()
    try:
        value = float(raw[:-1]) * units[raw[-1]] if raw[-1:] in units else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, or a number with s, m or h") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None


def cmd_label(args: argparse.Namespace) -> int:
    """``linkwise label``: label on the chosen executor, write the label set, print it."""
    choice = calibration_for_store(
        args.calibration, args.db, slurm_cluster=args.slurm_cluster, tracking_uri=args.tracking_uri
    )
    manifest = label(
        base=PolicySpec.parse(args.base),
        trace=args.trace,
        trace_format=args.trace_format,
        jobs=args.jobs,
        seed=args.seed,
        history=args.history,
        fit_windows=args.fit_windows,
        windows=args.windows,
        window_hours=args.window_hours,
        seeds=args.seeds,
        horizon_s=args.horizon,
        samples=args.samples,
        points=args.points,
        alternatives=args.alternatives,
        k_slots=args.k_slots,
        running_slots=args.running_slots,
        cluster=args.cluster,
        calibration=None if choice.path is None else Path(choice.path),
        restart_cost=args.restart_cost,
        executor=f"dask://{args.dask_address}" if args.dask_address else args.executor,
        out=args.out,
        calibration_used=choice,
        db=args.db,
        slurm_cluster=args.slurm_cluster,
    )
    speed = manifest["speed"]
    if args.json:
        print(json.dumps({**manifest, "calibration_used": choice.to_dict()}))
    else:
        print(
            f"{speed['labels']} labels at {manifest['counts']['points']} decision points "
            f"({manifest['counts']['points_with_a_better_move']} with a move better than the "
            f"base) -> {manifest['path']}; {speed['labels_per_s_per_core']:.2f} labels/s/core"
        )
        print(f"calibration: {choice.describe()}")
        print(ProfileCounts.from_dict(manifest["sources"]["profiles"]).line())
    return EXIT_OK


def add_label_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``label`` to a CLI's subparsers (sets ``func=cmd_label``)."""
    p = add_command(
        subparsers,
        "label",
        help="counterfactual labels: each move's jobs-in-system time against the base's",
    )
    p.add_argument("--base", default="qssf_preemptive", help="the base policy spec")
    p.add_argument("--trace", type=Path, help="a trace (default: the embedded synthetic one)")
    p.add_argument("--trace-format", default="auto", help="format of --trace (default: detect)")
    p.add_argument("--jobs", type=int, default=2000, help="synthetic jobs (without --trace)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload")
    p.add_argument("--history", type=Path, help="past jobs to fit the run-time predictor on")
    p.add_argument(
        "--db",
        type=Path,
        help="a store whose job telemetry gives jobs the profile learned from earlier runs of "
        "their name (else user and GPUs), and whose cluster's fitted calibration is the default "
        "(default: none; every job draws from the calibration's mix)",
    )
    p.add_argument(
        "--fit-windows",
        type=int,
        default=1,
        help="without --history: the first windows fit the predictor, the next are labelled",
    )
    p.add_argument("--windows", type=int, default=2, help="windows to label (default 2)")
    p.add_argument("--window-hours", type=float, default=24.0, help="window length, hours")
    p.add_argument("--seeds", type=_seeds, default=(0,), help="resampling seeds, e.g. 0,1")
    p.add_argument("--horizon", type=_seconds, default=6 * 3600.0, help="e.g. 6h (default)")
    p.add_argument("--samples", type=int, default=4, help="forked samples per move (4)")
    p.add_argument("--points", type=int, default=8, help="decision points per rollout (8)")
    p.add_argument("--alternatives", type=int, default=6, help="moves scored per point (6)")
    p.add_argument("--k-slots", type=int, default=8, help="MDP queue slots (8)")
    p.add_argument("--running-slots", type=int, default=0, help="MDP preempt/migrate slots")
    p.add_argument("--cluster", default=DEFAULT_TOPOLOGY, help="topology spec or folder")
    p.add_argument(
        "--calibration",
        type=Path,
        help="calibration JSON (default: the --slurm-cluster's newest fitted one in MLflow, "
        "else the shipped)",
    )
    p.add_argument(
        "--slurm-cluster", help="the cluster whose fitted calibration to use (linkwise calibrate)"
    )
    add_tracking_uri(p, "MLflow tracking URI to find it in (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--restart-cost", default="sia", help="sia (default), 0 or seconds")
    add_executor(p)
    p.add_argument("--dask-address", help="a running Dask scheduler (HOST:PORT)")
    p.add_argument("--out", type=Path, default=Path("linkwise-out/labels"), help="output folder")
    add_json(p, "print the manifest as JSON")
    p.set_defaults(func=cmd_label)
    return p
