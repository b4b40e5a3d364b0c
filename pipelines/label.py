"""``linkwise label``: counterfactual labels from the simulator (``datasets.labels``).

The base policy spec is resolved here, at the pipeline's edge (``models.policy_spec``), and
travels to the workers as a built policy, so ``datasets/`` never imports ``models/``. The
workload is a trace (``--trace``) or the embedded synthetic one, cut into windows; the
run-time predictor is fit on ``--history`` when given, else on the windows before the
labelled ones (never on the labelled jobs). Output: a content-hashed Parquet label set and
its manifest in ``--out``; ``--json`` prints the manifest with the throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_label_parser", "cmd_label"]


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
    """Build the tasks, label them on the chosen executor, write the label set."""
    from linkwise.cluster.mdp import MdpConfig
    from linkwise.cluster.profiles import load_calibration
    from linkwise.cluster.restart import parse_restart
    from linkwise.cluster.topology import load_topology
    from linkwise.datasets import synthetic
    from linkwise.datasets.labels import LabelTask, run_labels, write_labels
    from linkwise.datasets.prediction import predictor_record
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.rollouts import cut_windows
    from linkwise.datasets.traces import jobs_frame, load_trace
    from linkwise.models.policy_spec import PolicySpec

    spec = PolicySpec.parse(args.base)
    if spec.is_oracle or spec.is_model or spec.search is not None:
        raise ValueError(
            f"--base {args.base}: the base must be a same-information heuristic or "
            "composition (never an oracle, a learned package or a search policy)"
        )
    topo = load_topology(args.cluster)
    calibration = load_calibration(args.calibration)
    restart = parse_restart(args.restart_cost)
    if args.trace is not None:
        jobs = load_trace(args.trace, args.trace_format).jobs
    else:
        jobs = synthetic.generate(args.jobs, seed=args.seed, max_gpus=topo.total_gpus)
    windows = cut_windows(
        jobs_frame(jobs), args.window_hours * 3600.0, max_gpus=topo.total_gpus, min_jobs=5
    )
    first = 0 if args.history is not None else args.fit_windows
    chosen = windows[first : first + args.windows]
    if not chosen:
        raise ValueError(
            f"no window to label: {len(windows)} windows of {args.window_hours:g} h with 5+ "
            f"jobs, {first} kept for fitting the predictor"
        )
    if args.history is not None:
        predictor = RuntimePredictor.fit(load_trace(args.history, "auto").jobs)
    else:
        past = [j for w in windows[:first] for j in w.jobs]
        if not past:
            raise ValueError("no jobs before the labelled windows to fit the predictor on")
        predictor = RuntimePredictor.fit(past, until=chosen[0].start)
    config = MdpConfig(k_slots=args.k_slots, running_slots=args.running_slots)
    base = spec.build()
    tasks = [
        LabelTask(
            base=base,
            base_name=spec.describe(),
            window=w,
            topology=topo,
            seed=s,
            config=config,
            calibration=calibration,
            restart=restart,
            predictor=predictor,
            horizon_s=args.horizon,
            n=args.samples,
            points=args.points,
            alternatives=args.alternatives,
        )
        for w in chosen
        for s in args.seeds
    ]
    executor = f"dask://{args.dask_address}" if args.dask_address else args.executor
    t = time.perf_counter()
    df = run_labels(tasks, executor)
    wall = time.perf_counter() - t
    sources: dict[str, Any] = {
        "base": spec.describe(),
        "horizon_s": args.horizon,
        "samples": args.samples,
        "points_per_rollout": args.points,
        "alternatives": args.alternatives,
        "windows": [w.window_id for w in chosen],
        "seeds": list(args.seeds),
        "trace": str(args.trace) if args.trace is not None else "synthetic",
        "cluster": args.cluster,
        "restart": restart.describe(),
        "predictor": predictor_record(predictor),
    }
    manifest = write_labels(df, config, sources, args.out)
    cores = _cores(executor)
    speed = {
        "wall_s": wall,
        "labels": df.height,
        "cores": cores,
        "labels_per_s_per_core": df.height / wall / cores if wall > 0 else 0.0,
    }
    if args.json:
        print(json.dumps({**manifest, "speed": speed}))
    else:
        print(
            f"{df.height} labels at {manifest['counts']['points']} decision points "
            f"({manifest['counts']['points_with_a_better_move']} with a move better than the "
            f"base) -> {manifest['path']}; {speed['labels_per_s_per_core']:.2f} labels/s/core"
        )
    return 0


def _cores(executor: str) -> int:
    name, _, arg = executor.partition(":")
    if executor == "serial":
        return 1
    if name == "local":
        return int(arg) if arg else os.cpu_count() or 1
    return os.cpu_count() or 1  # a Dask cluster's size is its own; this machine's as a guess


def add_label_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``label`` to a CLI's subparsers (sets ``func=cmd_label``)."""
    from linkwise.cluster.topology import DEFAULT_TOPOLOGY

    p: argparse.ArgumentParser = subparsers.add_parser(
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
    p.add_argument("--calibration", type=Path, help="calibration JSON (default: the shipped)")
    p.add_argument("--restart-cost", default="sia", help="sia (default), 0 or seconds")
    p.add_argument(
        "--executor",
        default="local",
        help="serial, local[:N] (a local process pool, the default) or dask://HOST:PORT",
    )
    p.add_argument("--dask-address", help="a running Dask scheduler (HOST:PORT)")
    p.add_argument("--out", type=Path, default=Path("linkwise-out/labels"), help="output folder")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=cmd_label)
    return p


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="linkwise")
    add_label_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args()
    sys.exit(int(ns.func(ns)))
