"""Size the two headline settings of the honest benchmark (issue 15, item 3) on the Philly slice.

For each (workload, cluster, policy) the whole slice is replayed from an empty cluster (so
the evaluated days start with the backlog the earlier weeks leave), and the figures are
taken over the jobs submitted on the evaluated days (from ``--eval-from``, the end of the
five development weeks):

- average JCT, mean queue, mean contention slowdown, and the mean run-time inflation of the
  jobs that ran on more than one node (actual over isolated run time, minus 1);
- the isolated lower bound (mean isolated run time) and the pooled-SRPT queue bound
  (``cluster/bounds.py``) of those jobs on the cluster's GPUs, from an empty cluster: a
  valid but weaker bound under a backlog (the pooled relaxation may preempt the backlog).

Every job carries the run-time predictor's quantiles, fit on the jobs submitted before
``--eval-from`` only (backfill estimates run times by the upper quantile, Philly has no
time limits). Each run is a child process; one JSON line per run goes to ``--out``;
``--table`` prints the Markdown table of such a file.

    nice .venv/bin/python benchmarks/settings.py --workload multigpu \
        --clusters 48x8,leaf=8,oversub=4 --policies fifo,best_fit,sjf_bco,backfill --out s.jsonl
    .venv/bin/python benchmarks/settings.py --table s.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from linkwise.policies.spec import PolicySpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
EVAL_FROM = "2017-10-09"  # five weeks after the slice's first day, 2017-09-04


def run_one(
    trace: Path, workload: str, cluster: str, spec: str, eval_from: str, seed: int
) -> dict[str, object]:
    """Replay the slice with one policy on one cluster; figures over the evaluated days."""
    import numpy as np

    from linkwise.cluster.bounds import isolated_total, pooled_srpt_total
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator.run import simulate
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.traces import load_trace
    from linkwise.evaluation.compare import Scenario, make_scenario_policy

    topo = load_topology(cluster)
    cal = load_calibration()
    loaded = load_trace(trace, "philly")
    origin = loaded.origin_epoch or 0.0
    split = datetime.fromisoformat(eval_from).replace(tzinfo=UTC).timestamp() - origin
    jobs = tuple(j for j in loaded.jobs if j.num_gpus <= topo.total_gpus)
    if workload == "multigpu":
        jobs = tuple(j for j in jobs if j.num_gpus > 1)
    jobs = assign_profiles(jobs, cal, seed=seed)
    jobs = RuntimePredictor.fit(jobs, until=split).annotate(jobs)
    scenario = Scenario(topology=topo, jobs=jobs, calibration=cal)
    t0 = time.perf_counter()
    result = simulate(
        topo, jobs, scenario.model(), make_scenario_policy(scenario, PolicySpec.parse(spec))
    )
    wall = time.perf_counter() - t0
    recs = [r for r in result.records if r.job.submit_time >= split]
    evaluated = [r.job for r in recs]
    jct = np.array([r.jct for r in recs])
    queue = np.array([r.queue_s for r in recs])
    slow = np.array([r.contention_slowdown for r in recs])
    multi = np.array([r.contention_slowdown for r in recs if r.nodes > 1])
    n = len(recs)
    iso = isolated_total(evaluated) / n
    pooled = pooled_srpt_total(evaluated, topo.total_gpus) / n
    return {
        "workload": workload,
        "cluster": cluster,
        "spec": spec,
        "jobs": n,
        "avg_jct_s": float(jct.mean()),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "avg_queue_s": float(queue.mean()),
        "avg_contention_slowdown": float(slow.mean()),
        "multi_node_jobs": len(multi),
        "multi_node_inflation": float(multi.mean() - 1.0) if len(multi) else 0.0,
        "lower_bound_isolated_s": iso,
        "lower_bound_queue_s": max(iso, pooled),
        "wall_s": wall,
    }


def table(path: Path) -> str:
    """A Markdown table of the runs in ``path`` (JSON lines)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [
        "| workload | cluster | policy | jobs | avg JCT h | mean queue h | JCT / queue bound"
        " | contention slowdown | multi-node jobs | their inflation | wall s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['workload']} | {r['cluster']} | {r['spec']} | {r['jobs']} | "
            f"{r['avg_jct_s'] / 3600:,.2f} | {r['avg_queue_s'] / 3600:,.2f} | "
            f"{r['avg_jct_s'] / r['lower_bound_queue_s']:.2f} | "
            f"{r['avg_contention_slowdown']:.3f} | {r['multi_node_jobs']} | "
            f"{100 * r['multi_node_inflation']:.0f}% | {r['wall_s']:.0f} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--workload", choices=("all", "multigpu"), default="all")
    p.add_argument("--clusters", default="88x8", help="';'-separated cluster specs")
    p.add_argument("--policies", default="fifo,best_fit,sjf_bco,backfill")
    p.add_argument("--eval-from", default=EVAL_FROM, help="first evaluated day (UTC date)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON lines file to append to")
    p.add_argument("--table", type=Path, help="print the Markdown table of a JSON lines file")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if args.one:
        cluster, spec = args.one.split("|", 1)
        row = run_one(args.trace, args.workload, cluster, spec, args.eval_from, args.seed)
        print(json.dumps(row))
        return 0
    if args.out is None:
        p.error("--out is required")
    for cluster in args.clusters.split(";"):
        for spec in args.policies.split(","):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"{cluster}|{spec}"]
            cmd += ["--trace", str(args.trace), "--workload", args.workload]
            cmd += ["--eval-from", args.eval_from, "--seed", str(args.seed)]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{cluster} {spec}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"{cluster} {spec}: {row['avg_jct_s'] / 3600:.2f} h, queue "
                f"{row['avg_queue_s'] / 3600:.2f} h, multi-node +"
                f"{100 * row['multi_node_inflation']:.0f}%",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
