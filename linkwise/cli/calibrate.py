"""``linkwise calibrate``: fit the contention model to the measurements in shared/data, write
it anywhere and print its diagnostics; with ``--db``, fit the cluster's own calibration on a
store's telemetry (``pipelines.cluster_calibration``), print what was fitted and its
validation, write it (``--out``) and log it in MLflow (``--log``, or whenever a tracking URI is
given or set: ``models.calibrations``); and ``python -m linkwise.cli.calibrate`` (``main``),
which refits and writes, by default over the calibration shipped in ``cluster/data``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from linkwise.cli.common import (
    EXIT_OK,
    MLFLOW_URI_HELP,
    add_command,
    add_json,
    add_tracking_uri,
    default_data_dir,
)
from linkwise.datasets.contention_fit.report import render_fit_text
from linkwise.datasets.operator import parse_time
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.models.registry import default_tracking_uri


def cmd_calibrate_store(args: argparse.Namespace) -> int:
    """``linkwise calibrate --db``: fit on the store, print, write, log."""
    # these import scipy at their top (about 1 s, 585 modules): only when the command runs
    from linkwise.cluster.calibration.fit import write_calibration  # scipy: start-up
    from linkwise.pipelines.cluster_calibration import calibrate_store  # scipy: start-up

    done = calibrate_store(
        args.db,
        slurm_cluster=args.slurm_cluster,
        topology=args.cluster,
        since=parse_time(args.since, "--since"),
        until=parse_time(args.until, "--until"),
        interval_s=args.interval,
    )
    cal = done.fit.calibration
    if args.out is not None:
        write_calibration(cal, args.out)
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None and args.log:
        uri = default_tracking_uri()
    run_id = (
        log_cluster_calibration(uri, cal, done.cluster, db=done.db) if uri is not None else None
    )
    if args.json:
        print(
            json.dumps(
                {
                    "db": done.db,
                    "cluster": done.cluster,
                    "topology": {"name": done.topology.name, "source": done.topology_source},
                    "job_telemetry": done.built.to_dict(),
                    "out": None if args.out is None else str(args.out),
                    "mlflow_run_id": run_id,
                    **done.fit.to_json(),
                },
                default=str,
            )
        )
        return EXIT_OK
    print(
        f"cluster {done.cluster} from {done.db}; topology: {done.topology.name}, "
        f"{done.topology_source}; job telemetry: {done.built.built} runs summarized now"
    )
    print(render_fit_text(done.fit), end="")
    if args.out is not None:
        print(f"wrote {args.out}")
    if run_id is not None:
        print(f"logged as MLflow run {run_id} (experiment linkwise-calibration)")
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.db is not None:
        return cmd_calibrate_store(args)
    if args.out is None:
        raise ValueError("--out is required without --db (the calibration JSON to write)")
    # cluster.calibration.fit imports scipy (about 1 s): only when the command runs
    from linkwise.cluster.calibration.fit import fit_calibration, write_calibration  # scipy

    data_dir = args.data or default_data_dir()
    if data_dir is None:
        raise ValueError("no data folder: pass --data PATH/TO/shared/data")
    cal = fit_calibration(data_dir)
    write_calibration(cal, args.out)
    summary = {
        "out": str(args.out),
        "profiles": sorted(cal.profiles),
        "alpha": cal.alpha,
        "fit": cal.fit,
    }
    print(json.dumps(summary, indent=None if args.json else 2, default=str))
    return EXIT_OK


def add_calibrate_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "calibrate",
        help="fit the contention model to the measurements in shared/data, or (--db) to the "
        "cluster's own telemetry",
    )
    p.add_argument("--data", type=Path, help="the shared/data folder (default: ../shared/data)")
    p.add_argument(
        "--out",
        type=Path,
        help="calibration JSON to write (required without --db; with --db, optional)",
    )
    store = p.add_argument_group("the cluster's own calibration (--db)")
    store.add_argument("--db", type=Path, help="fit on this DuckDB store's telemetry")
    store.add_argument(
        "--since", help="the fit's window starts here (ISO 8601 or epoch; default: the history's)"
    )
    store.add_argument("--until", help="the fit's window ends here (default: the history's end)")
    store.add_argument("--slurm-cluster", help="the Slurm cluster's name in the store (if several)")
    store.add_argument(
        "--cluster",
        "--topology",
        dest="cluster",
        help="topology spec or folder (default: the store's nodes table)",
    )
    store.add_argument(
        "--interval", type=float, default=30.0, help="the telemetry scrape interval, s (30)"
    )
    store.add_argument(
        "--log",
        action="store_true",
        help="log the calibration in MLflow (default: only when a tracking URI is given or set)",
    )
    add_tracking_uri(p, MLFLOW_URI_HELP)
    add_json(p, "compact JSON")
    p.set_defaults(func=cmd_calibrate)


def main(argv: Sequence[str] | None = None, *, printer: Callable[[str], None] = print) -> int:
    """Refit and write the calibration (default: the one shipped in cluster/data)."""
    # cluster.calibration.fit imports scipy (about 1 s): only when the program runs
    from linkwise.cluster.calibration.fit import (
        SHIPPED_CALIBRATION,
        fit_calibration,
        write_calibration,
    )

    parser = argparse.ArgumentParser(prog="python -m linkwise.cli.calibrate")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="shared/data")
    parser.add_argument(
        "--out",
        type=Path,
        default=SHIPPED_CALIBRATION,
        help="JSON to write (default: the shipped calibration)",
    )
    args = parser.parse_args(argv)
    cal = fit_calibration(args.data)
    write_calibration(cal, args.out)
    printer(f"wrote {args.out}: alpha={cal.alpha:.4g} overhead_s={cal.overhead_s:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
