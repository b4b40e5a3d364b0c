"""Counterfactual labelling throughput (issue 23 item 2): labels per second per core.

The embedded synthetic workload on the default topology, the predictor fit on the first
day, the next days labelled (``datasets.labels``): ``--points`` decision points per
rollout, ``--alternatives`` moves each, ``--samples`` forks per move over ``--horizon``
hours, on the serial executor and a local process pool of ``--workers``.

    nice .venv/bin/python benchmarks/labels_speed.py [--base qssf_preemptive] [--workers 2]

prints a Markdown table for ``benchmarks/labels_speed.md``. A label is one scored move at
one decision point (n forked continuations of the horizon each).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, run_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.policies.spec import PolicySpec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base", default="qssf_preemptive")
    p.add_argument("--cluster", default=DEFAULT_TOPOLOGY)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--points", type=int, default=4)
    p.add_argument("--alternatives", type=int, default=6)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--horizon", type=float, default=6.0, help="hours")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    topo = load_topology(args.cluster)
    jobs = synthetic.generate(2000, seed=0, max_gpus=topo.total_gpus)
    windows = cut_windows(jobs_frame(jobs), 86400.0, max_gpus=topo.total_gpus, min_jobs=5)
    predictor = RuntimePredictor.fit(windows[0].jobs, until=windows[1].start)
    spec = PolicySpec.parse(args.base)
    tasks = [
        LabelTask(
            base=spec.build(),
            base_name=spec.describe(),
            window=w,
            topology=topo,
            config=MdpConfig(),
            predictor=predictor,
            horizon_s=args.horizon * 3600.0,
            n=args.samples,
            points=args.points,
            alternatives=args.alternatives,
        )
        for w in windows[1 : 1 + args.windows]
    ]
    rows = []
    for executor, cores in (("serial", 1), (f"local:{args.workers}", args.workers)):
        t = time.perf_counter()
        df = run_labels(tasks, executor)
        wall = time.perf_counter() - t
        points = df.select("episode", "point").unique().height
        rows.append((executor, cores, df.height, points, wall, df.height / wall / cores))
    print(
        f"base `{spec.describe()}`, {args.cluster}, {len(tasks)} windows of 24 h, "
        f"{args.points} points per rollout, up to {args.alternatives} moves, n={args.samples}, "
        f"horizon {args.horizon:g} h; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| executor | cores | labels | decision points | wall s | labels/s/core |")
    print("|---|---:|---:|---:|---:|---:|")
    for ex, cores, n, pts, wall, rate in rows:
        print(f"| {ex} | {cores} | {n} | {pts} | {wall:.1f} | {rate:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
