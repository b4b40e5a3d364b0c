"""``linkwise evaluate`` (policies on held-out windows), ``promote`` and ``rollback`` (the
registry's aliases through the gates), ``ope`` (off-policy evaluation) and ``robust`` (a
package against its base on other clusters).

Exit codes of ``promote``, ``rollback`` and ``robust``: 3 when the gates refuse.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from linkwise.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    STORE_CALIBRATION_HELP,
    add_calibration,
    add_command,
    add_executor,
    add_history_format,
    add_json,
    add_restart_cost,
    add_tracking_uri,
    add_window,
    csv_list,
)
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.operator import DEFAULT_STORE, operator_store
from linkwise.deployer.promote import rollback
from linkwise.evaluation.gates import load_gates
from linkwise.models.calibrations import calibration_for_store
from linkwise.models.registry import default_tracking_uri
from linkwise.pipelines.evaluate import (
    evaluate,
    format_evaluation,
    ope_estimates,
    promote_from_evaluation,
    promote_from_shadow,
)
from linkwise.pipelines.residual import robustness_check
from linkwise.policies.heuristics import policy_names
from linkwise.policies.spec import PolicySpec, parse_specs

EXIT_CODES = (
    "exit codes: 0 {done}, 3 refused ({why}; the decision is printed and logged in "
    "MLflow), 2 bad input (a message on stderr), 1 failure"
)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``linkwise evaluate``."""

    db = operator_store(args.db, args.trace)
    choice = calibration_for_store(
        args.calibration, db, slurm_cluster=args.slurm_cluster, tracking_uri=args.tracking_uri
    )
    report, run_id = evaluate(
        parse_specs(args.policies or ",".join(policy_names(predictions=args.history is not None))),
        trace=args.trace,
        db=db,
        slurm_cluster=args.slurm_cluster,
        windows=csv_list(args.windows, int),
        n_windows=args.n_windows,
        holdout_from=args.holdout_from or [],
        seeds=csv_list(args.seeds, int) or [0, 1, 2],
        cluster=args.cluster,
        window_s=args.window,
        block_s=args.block,
        min_jobs=args.min_jobs,
        calibration=choice.path,
        calibration_used=choice,
        baseline=args.baseline,
        executor=args.executor,
        out_dir=args.out,
        tracking_uri=args.tracking_uri,
        log=not args.no_log,
        n_boot=args.n_boot,
        warm_start=args.warm_start,
        history=args.history,
        history_format=args.history_format,
        learned_need_predictions=True,
        wide=args.wide,
        restart_cost=args.restart_cost,
        restart_grace=args.restart_grace,
        flexible=args.flexible,
    )
    if args.json:
        doc = {**report.to_json(), "mlflow_run_id": run_id, "calibration_used": choice.to_dict()}
        print(json.dumps(doc, default=str))
    else:
        print(format_evaluation(report, run_id, args.wide))
        print(f"calibration: {choice.describe()}")
    return EXIT_OK


def cmd_promote(args: argparse.Namespace) -> int:
    """``linkwise promote``: exit 0 when promoted, 3 when the gates refused."""

    uri = args.tracking_uri or default_tracking_uri()
    gates = load_gates(args.gates)
    if args.stage == "shadow":
        if args.evaluation is None:
            raise ValueError("--stage shadow needs --evaluation DIR (from linkwise evaluate)")
        decision = promote_from_evaluation(
            args.evaluation, tracking_uri=uri, gates=gates, ope=args.ope
        )
    else:
        db = operator_store(args.db)
        assert db is not None
        choice = calibration_for_store(
            args.calibration, db, slurm_cluster=args.slurm_cluster, tracking_uri=uri
        )
        decision = promote_from_shadow(
            db,
            tracking_uri=uri,
            gates=gates,
            cluster=args.cluster,
            slurm_cluster=args.slurm_cluster,
            calibration=choice.path,
            calibration_used=choice,
        )
        if args.json:
            doc = {**decision.to_json(), "calibration_used": choice.to_dict()}
            print(json.dumps(doc, default=str))
        else:
            print(decision.format())
            print(f"calibration: {choice.describe()}")
        return EXIT_OK if decision.passed else EXIT_REFUSED
    print(json.dumps(decision.to_json(), default=str) if args.json else decision.format())
    return EXIT_OK if decision.passed else EXIT_REFUSED


def cmd_rollback(args: argparse.Namespace) -> int:
    """``linkwise rollback``: champion back to previous (exit 3 when there is none)."""

    decision = rollback(tracking_uri=args.tracking_uri or default_tracking_uri())
    print(json.dumps(decision.to_json(), default=str) if args.json else decision.format())
    return EXIT_OK if decision.passed else EXIT_REFUSED


def cmd_ope(args: argparse.Namespace) -> int:
    """``linkwise ope``: FQE estimates vs the behaviour policy's return, per policy."""

    if args.tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri
    table = ope_estimates(
        args.dataset,
        parse_specs(args.policies),
        seeds=tuple(int(x) for x in args.seeds.split(",") if x.strip()),
        holdout=args.holdout,
        split_seed=args.split_seed,
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(table, indent=2, default=float))
    if args.json:
        print(json.dumps(table, default=float))
        return EXIT_OK
    for name, row in table.items():
        print(
            f"{name}: estimate {row['estimate']:.4g} (spread {row['spread']:.3g}) "
            f"vs behaviour return {row['behaviour_return']:.4g}"
        )
    if args.out is not None:
        print(f"table: {args.out}")
    return EXIT_OK


def cmd_robust(args: argparse.Namespace) -> int:
    """``linkwise robust PACKAGE``: the package and its base on 0.5x/1x/2x the cluster's
    nodes, default and oversubscribed fabrics, on the embedded synthetic workload; the
    robustness gate's verdict (exit 0 passed, 3 refused)."""
    base, rows, report = robustness_check(
        args.package,
        base=PolicySpec.parse(args.base) if args.base else None,
        cluster=args.cluster,
        oversub=args.oversub,
        jobs=args.jobs,
        load_scale=args.load_scale,
        window_h=args.window_h,
        windows=args.windows,
        seeds=[int(s) for s in str(args.seeds).split(",") if s.strip()],
        seed=args.seed,
        max_ratio=args.max_ratio,
    )
    if args.json:
        print(json.dumps({"base": base, "cases": [r.to_json() for r in rows],
                          "gate": report.to_json()}, indent=2))  # fmt: skip
    else:
        print(f"{'case':<18} {'topology':<28} {'avg JCT':>9} {'base':>9} {'ratio':>6} "
              f"{'dev/1k':>7}")  # fmt: skip
        for r in rows:
            dev = "-" if r.deviations_per_1000 is None else f"{r.deviations_per_1000:.1f}"
            mark = " (trained)" if r.trained_on else ""
            print(f"{r.name + mark:<18} {r.topology:<28} {duration_text(r.avg_jct_s):>9} "
                  f"{duration_text(r.base_avg_jct_s):>9} {r.ratio:>6.3f} {dev:>7}")  # fmt: skip
        print(report.format())
    return EXIT_OK if report.passed else EXIT_REFUSED


def add_evaluate_parser(sub: Any) -> None:
    p = add_command(sub, "evaluate", help="benchmark policies on held-out windows; report + MLflow")
    p.add_argument(
        "--policies",
        help="comma-separated specs: heuristics, model:ALIAS|PATH (default: every heuristic)",
    )
    p.add_argument("--trace", type=Path, help="trace file of the evaluation workload")
    p.add_argument(
        "--db",
        type=Path,
        help=f"DuckDB store: its accounting as the workload (default without --trace: the "
        f"operator's store {DEFAULT_STORE})",
    )
    p.add_argument("--slurm-cluster", help="cluster name in the store")
    p.add_argument("--windows", help="comma-separated window ids (checked against --holdout-from)")
    p.add_argument(
        "--holdout-from",
        type=Path,
        action="append",
        metavar="MANIFEST",
        help="dataset manifest whose windows must not be evaluated (repeatable)",
    )
    p.add_argument(
        "--n-windows",
        type=int,
        default=4,
        help="without --windows: the last N held-out windows (default 4)",
    )
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    p.add_argument(
        "--cluster",
        help="topology: a spec or the folder of slurm.conf and topology.conf (default: the "
        f"cluster the store's nodes table describes; with --trace {DEFAULT_TOPOLOGY})",
    )
    add_window(p)
    p.add_argument(
        "--flexible",
        type=float,
        metavar="SHARE",
        help="replay this share (0-1) of the multi-GPU jobs whose workload gives no request "
        "form as flexible (--gpus=N, any split), the rest as fixed (-N k, GPUs per node); "
        "chosen by a hash of seed 0 and the job id, before windows are cut (the rule of "
        "simulate --flexible, cluster/flexible.py); the report and MLflow params state it",
    )
    p.add_argument("--block", type=float, default=1800.0, help="bootstrap block, s (0: replay)")
    p.add_argument("--min-jobs", type=int, default=10, help="fewest jobs in a picked window")
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="with --db: start each window from the accounting's running and pending jobs",
    )
    p.add_argument(
        "--history",
        type=Path,
        metavar="PATH",
        help="past jobs (a trace or a DuckDB store; the workload itself will do) to fit the "
        "run-time predictor on, only jobs submitted before the first evaluation window; "
        "needed by qssf and by learned packages without a predictor of their own",
    )
    add_history_format(p)
    add_calibration(p, STORE_CALIBRATION_HELP)
    p.add_argument(
        "--baseline",
        help="policy the ratios are taken to (default: the first heuristic that is no oracle)",
    )
    add_executor(p)
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples")
    add_restart_cost(p)
    p.add_argument(
        "--restart-grace",
        type=float,
        metavar="SECONDS",
        help="seconds a preempted job keeps its GPUs to checkpoint (default 30)",
    )
    p.add_argument("--out", type=Path, default=Path("linkwise-out/evaluation"), help="report dir")
    add_tracking_uri(p)
    p.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    add_json(p, "print the result as JSON only")
    p.add_argument(
        "--wide",
        action="store_true",
        help="every column, printed and in report.md (default: those that fit 120 columns)",
    )
    p.set_defaults(func=cmd_evaluate)


def add_promote_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "promote",
        help="gate and promote: challenger -> shadow -> champion",
        description="Gate and promote through the registry's aliases: --stage shadow gates "
        "@challenger on an evaluation and moves @shadow (what a shadow loop serves, "
        "model:shadow); --stage champion gates @shadow on its shadow-mode evidence in the "
        "store and moves @champion (what an active loop serves, model:champion).",
        epilog=EXIT_CODES.format(done="promoted", why="a gate failed"),
    )
    p.add_argument("--gates", type=Path, help="gates TOML (default: evaluation/gates.toml)")
    p.add_argument(
        "--stage",
        choices=["shadow", "champion"],
        default="shadow",
        help="shadow: gate @challenger on --evaluation; champion: gate @shadow on "
        "its shadow-mode evidence in --db",
    )
    p.add_argument("--evaluation", type=Path, help="folder written by linkwise evaluate")
    p.add_argument(
        "--ope", type=Path, help="FQE JSON: policy -> {estimate, behaviour_return, spread}"
    )
    p.add_argument(
        "--db",
        type=Path,
        help=f"the live loop's DuckDB store (decisions, jobs; default: {DEFAULT_STORE})",
    )
    p.add_argument("--cluster", help="topology for the replay (default: the store's nodes)")
    p.add_argument("--slurm-cluster", help="cluster name in the store")
    add_calibration(p, STORE_CALIBRATION_HELP)
    add_tracking_uri(p)
    add_json(p, "print the decision as JSON only")
    p.set_defaults(func=cmd_promote)


def add_rollback_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "rollback",
        help="move @champion back to @previous",
        epilog=EXIT_CODES.format(done="rolled back", why="no previous champion"),
    )
    add_tracking_uri(p)
    add_json(p, "print the decision as JSON only")
    p.set_defaults(func=cmd_rollback)


def add_ope_parser(sub: Any) -> None:
    p = add_command(sub, "ope", help="off-policy evaluation (FQE) of learned policies on a dataset")
    p.add_argument("--dataset", type=Path, required=True, help="an exported transitions .parquet")
    p.add_argument("--policies", required=True, help="comma-separated model:ALIAS|PATH specs")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated FQE seeds (default 0,1,2)")
    p.add_argument(
        "--holdout",
        type=float,
        default=0.2,
        help="share of episodes held out as training split them (default 0.2; 0: all)",
    )
    p.add_argument("--split-seed", type=int, default=0, help="the training split's seed")
    p.add_argument("--out", type=Path, help="write the table (the --ope input of promote) here")
    add_tracking_uri(p)
    add_json(p, "print the table as JSON only")
    p.set_defaults(func=cmd_ope)


def add_robust_parser(sub: Any) -> None:
    """``linkwise robust``: the robustness check of a package (``cmd_robust``)."""
    p = add_command(
        sub,
        "robust",
        help="a package against its base on 0.5x/1x/2x the nodes and an oversubscribed fabric",
    )
    p.add_argument("package", help="a policy package folder (a residual names its base)")
    p.add_argument("--base", help="the reference policy spec (default: the residual's base)")
    p.add_argument("--cluster", default=DEFAULT_TOPOLOGY, help="the compact topology spec scaled")
    p.add_argument("--oversub", type=float, default=4.0, help="leaf uplink oversubscription")
    p.add_argument("--jobs", type=int, default=2000, help="synthetic jobs drawn")
    p.add_argument("--load-scale", type=float, default=0.22, help="synthetic arrival scale")
    p.add_argument("--window-h", type=float, default=24.0, help="window length, hours")
    p.add_argument("--windows", type=int, default=2, help="the last N windows are evaluated")
    p.add_argument("--seeds", default="0", help="comma-separated resampling seeds")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed")
    p.add_argument("--max-ratio", type=float, default=1.02, help="the gate's limit per case")
    add_json(p, "JSON: cases and the gate")
    p.set_defaults(func=cmd_robust)
