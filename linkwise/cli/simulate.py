"""``linkwise simulate``, ``compare``, ``topology`` and ``policies``: the simulator's commands.

The implementations are imported at the top; none of them imports scipy, matplotlib, MLflow
or torch at its own top (``tests/project/test_layering.py``), so ``linkwise --help`` stays quick.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from linkwise.cli.common import (
    EXIT_OK,
    TRACE_FORMATS,
    add_calibration,
    add_command,
    add_history_format,
    add_json,
    add_restart_cost,
    add_wide,
    default_data_dir,
)
from linkwise.cluster.calibration.measurements import load_deepshare
from linkwise.cluster.flexible import with_flexible
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.restart import parse_restart
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.topology.load import describe, load_topology
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets import synthetic
from linkwise.datasets.history import fit_history, load_history
from linkwise.datasets.traces import load_trace, write_rejected
from linkwise.evaluation.columns import MAX_WIDTH, columns_for
from linkwise.evaluation.compare import (
    Scenario,
    compare,
    make_scenario_policy,
    plot_jct_cdf,
    run_policy,
)
from linkwise.evaluation.predictions import check_predictions
from linkwise.models.build import pretrained_specs
from linkwise.pipelines.console import print_table
from linkwise.policies.catalog import policy_catalog, policy_info
from linkwise.policies.heuristics import policy_names
from linkwise.policies.spec import PolicySpec, parse_specs

DEFAULT_SYNTHETIC_JOBS = 2000


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--trace", type=Path, help="a real trace file (default: the embedded synthetic workload)"
    )
    g.add_argument(
        "--trace-format",
        default="auto",
        choices=list(TRACE_FORMATS),
        help="format of --trace (default: detect)",
    )
    g.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_SYNTHETIC_JOBS,
        help=f"jobs in the synthetic workload (default {DEFAULT_SYNTHETIC_JOBS})",
    )
    g.add_argument(
        "--load-scale", type=float, default=1.0, help="synthetic arrival-rate multiplier"
    )
    g.add_argument("--max-jobs", type=int, help="use only the first N jobs of the trace")
    g.add_argument("--seed", type=int, default=0, help="seed for the workload and profile draws")
    g.add_argument(
        "--flexible",
        type=float,
        metavar="SHARE",
        help="replay this share (0-1) of the multi-GPU jobs whose trace gives no request form "
        "as flexible (--gpus=N, any split), the rest as fixed (-N k, GPUs per node); chosen by "
        "a hash of --seed and the job id (cluster/flexible.py). Without it such jobs keep "
        "today's placement: backfill in the derived shape, the other policies any split",
    )
    c = p.add_argument_group("cluster and contention")
    c.add_argument(
        "--cluster",
        default=DEFAULT_TOPOLOGY,
        help="NODESxGPUS[,leaf=..,nic=..,oversub=..], a slurm.conf/topology.conf folder, "
        f"or the Alibaba topology CSV (default {DEFAULT_TOPOLOGY})",
    )
    c.add_argument(
        "--contention",
        default="analytic",
        choices=["analytic", "empirical", "none"],
        help="the calibrated model, DeepShare's measured table, or none (pure queueing)",
    )
    add_calibration(c, "calibration JSON (default: the shipped fit)")
    c.add_argument(
        "--data", type=Path, help="../shared/data (for the empirical model); or $LINKWISE_DATA"
    )
    c.add_argument("--tick", type=float, help="periodic decision points every S seconds")
    add_restart_cost(c)
    c.add_argument(
        "--restart-grace",
        type=float,
        metavar="SECONDS",
        help="seconds a preempted job keeps its GPUs to checkpoint (default 30; 0 with "
        "--restart-cost 0)",
    )
    h = p.add_argument_group("run-time predictions")
    h.add_argument(
        "--history",
        type=Path,
        metavar="PATH",
        help="past jobs (a trace file in any format above, or a DuckDB store) to fit the "
        "run-time predictor on: only jobs submitted before the workload's first job; needed "
        "by qssf and by learned packages that carry no predictor of their own",
    )
    add_history_format(h)
    h.add_argument(
        "--slurm-cluster",
        help="with a --history store: the Slurm cluster's name in it (default: all)",
    )
    add_json(p)
    add_wide(p)
    p.add_argument(
        "--rejected-out",
        type=Path,
        metavar="CSV",
        help="write every rejected trace row (file, line, reason, raw text) to this CSV",
    )


def _scenario(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Build the Scenario the arguments describe, and a description of it."""
    topo = load_topology(args.cluster)
    calibration = load_calibration(args.calibration)
    restart = parse_restart(args.restart_cost, args.restart_grace)
    info: dict[str, Any] = {
        "cluster": args.cluster,
        "gpus": topo.total_gpus,
        "nodes": len(topo.nodes),
        "restart": restart.describe(),
    }
    origin: float | None = None
    if args.trace is not None:
        trace = load_trace(args.trace, args.trace_format, max_jobs=args.max_jobs)
        jobs = trace.jobs
        origin = trace.origin_epoch
        info.update(trace=trace.source, format=trace.format, rejected_rows=len(trace.rejected))
        if args.rejected_out is not None:
            write_rejected(trace.rejected, args.rejected_out)
            info["rejected_rows_file"] = str(args.rejected_out)
        if trace.rejected:
            info["rejected_by_reason"] = trace.summary().get("rejected_by_reason", {})
    else:
        jobs = synthetic.generate(
            args.max_jobs or args.jobs,
            seed=args.seed,
            load_scale=args.load_scale,
            max_gpus=topo.total_gpus,
        )
        info.update(trace="synthetic (Philly statistics)", seed=args.seed)
    too_big = [j for j in jobs if j.num_gpus > topo.total_gpus]
    if too_big:
        info["left_out_too_big"] = len(too_big)
        jobs = tuple(j for j in jobs if j.num_gpus <= topo.total_gpus)
    if not jobs:
        raise ValueError("no jobs left to simulate")
    data_dir = args.data or default_data_dir()
    mix = None
    if args.contention == "empirical":
        if data_dir is None:
            raise ValueError("--contention empirical needs --data (the shared/data folder)")
        measured = set(load_deepshare(data_dir).models)
        mix = {k: v for k, v in calibration.mix.items() if k in measured} or dict.fromkeys(
            measured, 1.0
        )
    jobs = assign_profiles(jobs, calibration, seed=args.seed, mix=mix)
    info["jobs"] = len(jobs)
    if args.flexible is not None:
        jobs = with_flexible(jobs, args.flexible, seed=args.seed)
        info["flexible_jobs"] = sum(bool(j.flexible) for j in jobs)
    predictor = None
    if args.history is not None:
        history = load_history(args.history, args.history_format, slurm_cluster=args.slurm_cluster)
        predictor, fitted = fit_history(
            history,
            first_submit=min(j.submit_time for j in jobs),
            origin_epoch=origin,
            evaluated_source=str(args.trace) if args.trace is not None else None,
        )
        info.update(fitted)
    scenario = Scenario(
        topology=topo,
        jobs=tuple(jobs),
        calibration=calibration,
        contention=args.contention,
        config=SimConfig(tick_s=args.tick, restart=restart),
        data_dir=str(data_dir) if data_dir else None,
        predictor=predictor,
    )
    return scenario, info


def _metrics_table(rows: Sequence[dict[str, Any]], title: str, wide: bool = False) -> Any:

    table = Table(title=title)
    cols = columns_for("compare", wide)  # evaluation/columns.py decides the default columns
    for c in cols:
        table.add_column(c.head(""), justify="left" if c.left else "right")
    for row in rows:
        table.add_row(*(c.cell(row, "") for c in cols))
    if rows:
        table.caption = (
            f"LB: mean isolated run time {duration_text(rows[0]['lower_bound_isolated_s'])} "
            "(no queueing, no contention); queue LB: pooled-GPU SRPT "
            f"{duration_text(rows[0]['lower_bound_queue_s'])}; run-time inflation: mean run "
            "time / mean isolated run time - 1; oracle: reads the true run time (a ceiling)"
        )
    return table


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """The row with NaN and infinite numbers as null (strict JSON has neither)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def _build_checked(scenario: Any, specs: Sequence[Any]) -> list[Any]:
    """The policies, built once each; refuse, before any simulation, one that needs run-time
    predictions it would not get (``qssf``, a learned package without a predictor, when
    there is no ``--history``)."""
    policies = [make_scenario_policy(scenario, s) for s in specs]
    check_predictions(specs, policies, scenario.predictor is not None, learned=True)
    return policies


def _predictions_note(rows: Sequence[dict[str, Any]], history: bool) -> None:
    """Say on stderr when learned packages use their own predictor beside --history."""
    own = [str(r["policy"]) for r in rows if r.get("predictions") == "package"]
    if own and history:
        print(
            f"linkwise: note: {', '.join(own)} use the run-time predictor in their package; "
            "--history fits the one the other policies use",
            file=sys.stderr,
        )


def cmd_simulate(args: argparse.Namespace) -> int:
    spec = PolicySpec.parse(args.policy)  # a bad spec is refused before the workload is read
    scenario, info = _scenario(args)
    (policy,) = _build_checked(scenario, [spec])
    run = run_policy(scenario, spec, policy)
    out = run.row()
    _predictions_note([out], scenario.predictor is not None)
    if args.json:
        counts: dict[str, Any] = {"rejected_rows": 0, "left_out_too_big": 0}
        counts |= {k: info[k] for k in (*counts, "rejected_rows_file", "trace") if k in info}
        counts |= {
            k: v for k, v in info.items() if k.startswith(("history", "predictor", "flexible"))
        }
        print(json.dumps(_finite({**out, **counts})))
        return EXIT_OK
    console = _stdout_console()
    console.print(_describe_scenario(info))
    print_table(console, _metrics_table([out], "linkwise simulate", args.wide), args.wide)
    return EXIT_OK


def _stdout_console() -> Any:
    """A rich console: the terminal's width, 120 columns when piped (``print_table`` widens
    it for ``--wide``)."""
    return Console(width=None if sys.stdout.isatty() else MAX_WIDTH)


def _describe_scenario(info: dict[str, Any]) -> str:
    return "  ".join(f"[bold]{k}[/]={v}" for k, v in info.items())


def cmd_compare(args: argparse.Namespace) -> int:

    history = args.history is not None
    # parsed once: a bad spec is refused before the workload is read
    specs = parse_specs(args.policies or ",".join(policy_names(predictions=history)))
    scenario, info = _scenario(args)
    built = _build_checked(scenario, specs)
    console = Console(stderr=True, quiet=args.json)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console, disable=args.json,
    ) as progress:  # fmt: skip
        task = progress.add_task(f"simulating {len(scenario.jobs)} jobs", total=len(specs))
        runs = compare(
            scenario,
            specs,
            workers=args.workers,
            on_done=lambda _: progress.advance(task),
            learned_need_predictions=True,
            built=built,
        )
    rows = [r.row() for r in runs]
    _predictions_note(rows, history)
    plot = plot_jct_cdf(runs, args.plot, title=f"{info['trace']} on {info['cluster']}")
    if args.json:
        print(json.dumps([_finite(r) for r in rows]))
        return EXIT_OK
    out = _stdout_console()
    out.print(_describe_scenario(info))
    print_table(out, _metrics_table(rows, "linkwise compare", args.wide), args.wide)
    out.print(f"JCT CDF plot: {plot}")
    return EXIT_OK


def cmd_topology(args: argparse.Namespace) -> int:
    info = describe(load_topology(args.cluster))
    print(json.dumps(info, indent=None if args.json else 2, default=str))
    return EXIT_OK


def cmd_policies(args: argparse.Namespace) -> int:
    if args.spec:
        infos = [policy_info(PolicySpec.parse(s)) for s in args.spec]
    else:
        infos = policy_catalog(pretrained_specs())
    if args.json:
        print(json.dumps([i.to_json() for i in infos]))
        return EXIT_OK
    for line in policies_table(infos, wide=args.wide, verbose=args.verbose):
        print(line)
    return EXIT_OK


def policies_table(infos: Sequence[Any], wide: bool = False, verbose: bool = False) -> list[str]:
    """``linkwise policies``' text table: within ``MAX_WIDTH`` columns (long names cut with
    an ellipsis, descriptions wrapped) unless ``wide``; ``--json`` has every field."""
    flags = ("preemptive", "migrates", "oracle", "needs_predictions")
    heads = ("name", "kind", *flags)
    rows = [[i.name, i.kind, *("yes" if getattr(i, f) else "-" for f in flags)] for i in infos]
    if not wide:
        rows = [[_cut(r[0], 28), *r[1:]] for r in rows]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)) + "  description"]
    for r, i in zip(rows, infos, strict=True):
        line = "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + "  "
        if wide:
            lines.append(line + i.description)
            continue
        parts = textwrap.wrap(i.description, max(MAX_WIDTH - len(line), 20)) or [""]
        lines.append(line + parts[0])
        lines.extend(" " * len(line) + p for p in parts[1:])
        if i.composition and verbose:
            lines.append(" " * 4 + i.composition)
    return lines


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and end around an ellipsis."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


# ------------------------------------------------------------------------ parsers


def add_simulate_parser(sub: Any) -> None:
    p = add_command(sub, "simulate", help="run one policy on a workload in the simulator")
    p.add_argument(
        "--policy",
        default="backfill",
        help=(
            "a heuristic name[:key=value,...] (typed parameters) or model:ALIAS, "
            "model:models:/NAME/N, model:./PATH[#sha256=DIGEST] (default backfill)"
        ),
    )
    _add_workload_args(p)
    p.set_defaults(func=cmd_simulate)


def add_compare_parser(sub: Any) -> None:
    p = add_command(sub, "compare", help="run several policies on the same workload and compare")
    p.add_argument(
        "--policies",
        help="comma-separated policies, heuristics or model:ALIAS|PATH (default: every "
        "heuristic, the oracle ceilings included; qssf too with --history)",
    )
    p.add_argument(
        "--plot", type=Path, default=Path("linkwise-out/jct_cdf.png"), help="JCT CDF PNG path"
    )
    p.add_argument("--workers", type=int, default=1, help="policies simulated in parallel")
    _add_workload_args(p)
    p.set_defaults(func=cmd_compare)


def add_topology_parser(sub: Any) -> None:
    p = add_command(sub, "topology", help="describe a cluster topology")
    p.add_argument("cluster", help="a spec (64x8,leaf=16), a slurm.conf folder, or the Alibaba CSV")
    add_json(p, "compact JSON")
    p.set_defaults(func=cmd_topology)


def add_policies_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "policies",
        help="list every policy: kind, preemptive, migrates, oracle, needs predictions",
    )
    p.add_argument(
        "spec", nargs="*", help="describe these specs (a name, compose:..., model:...) only"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show each composition's spec")
    p.add_argument("--wide", action="store_true", help="full names and descriptions")
    add_json(p, "JSON: a list of objects")
    p.set_defaults(func=cmd_policies)
