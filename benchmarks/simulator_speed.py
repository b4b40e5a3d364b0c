"""Simulator speed: the real Philly slice on a 64x8 cluster, every heuristic.

Each policy runs in a fresh child process (one core), so wall time and peak memory
(max RSS) are its own. Prints a Markdown table; ``--json`` prints the rows.

    .venv/bin/python benchmarks/simulator_speed.py [--trace PATH] [--cluster 64x8] [--policies a,b]

``cpu s`` is the simulation's CPU time (beside ``wall s``, which other processes inflate on
a loaded machine). Preemption costs the default restart model (``--restart-cost sia``,
``cluster/restart.py``); ``--restart-cost 0`` makes it free.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from linkwise.policies.spec import PolicySpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"


def run_one(
    trace: Path, cluster: str, spec: str, seed: int, restart_cost: str = "sia"
) -> dict[str, object]:
    """Load, simulate and summarise one policy in this process."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.restart import parse_restart
    from linkwise.cluster.simulator.config import SimConfig
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.traces import load_trace
    from linkwise.evaluation.compare import Scenario, run_policy

    t0 = time.perf_counter()
    topo = load_topology(cluster)
    cal = load_calibration()
    jobs = assign_profiles(load_trace(trace, "philly").jobs, cal, seed=seed)
    jobs = tuple(j for j in jobs if j.num_gpus <= topo.total_gpus)
    # the policies that order by predicted run time (qssf, qssf_preemptive, ...) read a
    # predictor's quantiles: fit on the slice's first two weeks, every job annotated (a
    # speed benchmark: what the predictions are worth is predictor.md's business)
    first = min(j.submit_time for j in jobs)
    jobs = RuntimePredictor.fit(jobs, until=first + 14 * 86400.0).annotate(jobs)
    load_s = time.perf_counter() - t0
    config = SimConfig(restart=parse_restart(restart_cost))
    cpu0 = time.process_time()
    scenario = Scenario(topology=topo, jobs=jobs, calibration=cal, config=config)
    run = run_policy(scenario, PolicySpec.parse(spec))
    m = run.metrics.to_dict()
    m["restart"] = run.restart
    m["load_s"] = load_s
    # CPU time of the simulation (its wall time, less what other processes took of the core)
    m["cpu_s"] = time.process_time() - cpu0
    m["events_per_s"] = m["events"] / m["wall_s"]
    m["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return m


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--cluster", default="64x8")
    p.add_argument(
        "--policies",
        default="fifo,backfill,best_fit,sjf_bco,tiresias_las,random,qssf,qssf_preemptive,"
        "tiresias_consolidated,deepshare",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restart-cost", default="sia", help="sia (default), 0 (free) or seconds")
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        row = run_one(args.trace, args.cluster, args.one, args.seed, args.restart_cost)
        print(json.dumps(row))
        return 0
    rows = []
    for spec in args.policies.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--one",
            spec,
            "--trace",
            str(args.trace),
            "--cluster",
            args.cluster,
            "--restart-cost",
            args.restart_cost,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"trace: {args.trace.name}, cluster: {args.cluster}, jobs: {rows[0]['jobs']}, "
        f"restart cost: {rows[0]['restart']}\n"
    )
    heads = ["policy", "wall s", "cpu s", "events", "events/s", "peak RSS MB", "avg JCT h"]
    heads += ["p99 JCT h"]
    heads += ["avg queue h", "contention x", "GPU util", "preempt/job", "restart s/job"]
    print("| " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * (len(heads) - 1))
    for r in rows:
        print(
            f"| {r['policy']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['events']} | "
            f"{r['events_per_s']:.0f} | "
            f"{r['peak_rss_mb']:.0f} | {r['avg_jct_s'] / 3600:.1f} | {r['p99_jct_s'] / 3600:.1f} | "
            f"{r['avg_queue_s'] / 3600:.1f} | {r['avg_contention_slowdown']:.3f} | "
            f"{r['gpu_utilization']:.1%} | {r['preemptions_per_job']:.2f} | "
            f"{r['restart_s_per_job']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
