"""Every heuristic on the Philly slice at several cluster sizes, for one checkout of the code.

Each (cluster, policy) runs in a fresh child process that imports linkwise from
``--repo`` (default: this checkout; a ``git worktree`` of an older commit gives the
"before" figures). Appends one JSON line per run to ``--out``; ``--table`` prints a
Markdown table of such a file.

    nice .venv/bin/python benchmarks/baselines.py --repo /tmp/lw-before --out before.jsonl
    .venv/bin/python benchmarks/baselines.py --table before.jsonl

With ``--eval-from DATE`` (UTC) the workload is the evaluated slice instead, the jobs
submitted from that day on, replayed from an empty cluster, and a run-time predictor
(``datasets/predictor.RuntimePredictor``) fit on the trace's jobs submitted before it gives
every slice job its quantiles (backfill estimates a job without a time limit by the upper
one). A policy written ``nopred:SPEC`` runs on the same slice without predictions (backfill
then believes the 7-day default limit):

    nice .venv/bin/python benchmarks/baselines.py --eval-from 2017-10-09 \
        --policies backfill,nopred:backfill,sjf_bco --out slice.jsonl

Preemption costs what the simulator's default restart model says (``--restart-cost sia``:
Sia's measured checkpoint plus restore seconds per profile and a 30 s grace,
``cluster/restart.py``); ``--restart-cost 0`` makes it free, as before issue 22. A checkout
older than the restart model (``--repo``) ignores the option.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from linkwise.policies.spec import PolicySpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
POLICIES = "fifo,backfill,best_fit,sjf_bco,tiresias_las,random"
CLUSTERS = "64x8,80x8,104x8"


NOPRED = "nopred:"


def run_one(
    trace: Path,
    cluster: str,
    spec: str,
    contention: str,
    seed: int,
    eval_from: str | None = None,
    restart_cost: str = "sia",
    restart_grace: float | None = None,
) -> dict[str, object]:
    """Load, simulate and summarise one policy in this process (linkwise from sys.path).

    ``eval_from``: simulate only the jobs submitted from that UTC day on, with run-time
    predictions fit on the jobs before it (none for a ``nopred:`` spec). ``restart_cost``,
    ``restart_grace``: the restart model (``cluster.restart.parse_restart``)."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.traces import load_trace
    from linkwise.evaluation.compare import Scenario, run_policy

    topo = load_topology(cluster)
    cal = load_calibration()
    loaded = load_trace(trace, "philly")
    jobs = assign_profiles(loaded.jobs, cal, seed=seed)
    jobs = tuple(j for j in jobs if j.num_gpus <= topo.total_gpus)
    extra: dict[str, object] = {"eval_from": eval_from, "predictions": False}
    predictor = None
    policy = spec.removeprefix(NOPRED)
    if eval_from is not None:
        from datetime import UTC, datetime

        from linkwise.datasets.predictor import RuntimePredictor

        origin = loaded.origin_epoch or 0.0
        split = datetime.fromisoformat(eval_from).replace(tzinfo=UTC).timestamp() - origin
        if not spec.startswith(NOPRED):
            predictor = RuntimePredictor.fit(jobs, until=split)
            extra.update(predictions=True, predictor_jobs=predictor.n_jobs)
        jobs = tuple(j for j in jobs if j.submit_time >= split)
    config: dict[str, object] = {}
    try:
        from linkwise.cluster.restart import parse_restart
        from linkwise.cluster.simulator.config import SimConfig

        restart = parse_restart(restart_cost, restart_grace)
        config["config"] = SimConfig(restart=restart)
        extra.update(restart=restart.name, free_preemption=restart.is_free)
    except ImportError:  # a checkout before the restart model: preemption was free
        extra.update(restart="free (before the restart model)", free_preemption=True)
    scenario = Scenario(
        topology=topo,
        jobs=jobs,
        calibration=cal,
        contention=contention,
        predictor=predictor,
        **config,  # type: ignore[arg-type]
    )
    cpu0 = time.process_time()
    m = run_policy(scenario, PolicySpec.parse(policy)).metrics.to_dict()
    m["sim_cpu_s"] = time.process_time() - cpu0  # the wall time is the load's as much as ours
    m.update(cluster=cluster, spec=spec, contention=contention, jobs=len(jobs), **extra)
    return m


def table(path: Path) -> str:
    """A Markdown table of the runs in ``path`` (JSON lines)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [
        "| cluster | policy | predictions | restart cost | avg JCT h | mean queue h | GPU util "
        "| contention slowdown | preempt/job | restart s/job | wall s | CPU s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        pred = f"fit before {r['eval_from']}" if r.get("predictions") else "none"
        per_job = r.get("preemptions_per_job", r["preemptions"] / r["jobs"])
        out.append(
            f"| {r['cluster']} | {r['spec']} | {pred} | {r.get('restart', 'free')} | "
            f"{r['avg_jct_s'] / 3600:,.1f} | "
            f"{r['avg_queue_s'] / 3600:,.1f} | {r['gpu_utilization']:.2f} | "
            f"{r['avg_contention_slowdown']:.3f} | {per_job:.2f} | "
            f"{r.get('restart_s_per_job', 0.0):.0f} | {r['wall_s']:.0f} | "
            + (f"{r['sim_cpu_s']:.0f} |" if "sim_cpu_s" in r else "- |")
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repo", type=Path, default=REPO, help="checkout to import linkwise from")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--clusters", default=CLUSTERS)
    p.add_argument("--policies", default=POLICIES)
    p.add_argument("--contention", default="analytic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--eval-from", help="simulate the slice from this UTC day, with run-time predictions"
    )
    p.add_argument(
        "--restart-cost", default="sia", help="sia (default), 0 (free preemption) or seconds"
    )
    p.add_argument("--restart-grace", type=float, help="signal grace, s (default 30)")
    p.add_argument("--out", type=Path, help="JSON lines file to append to")
    p.add_argument("--table", type=Path, help="print the Markdown table of a JSON lines file")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if args.one:
        cluster, spec = args.one.split("|", 1)
        m = run_one(
            args.trace,
            cluster,
            spec,
            args.contention,
            args.seed,
            args.eval_from,
            args.restart_cost,
            args.restart_grace,
        )
        print(json.dumps(m))
        return 0
    if args.out is None:
        p.error("--out is required")
    env = dict(os.environ, PYTHONPATH=str(args.repo.resolve()))
    for cluster in args.clusters.split(","):
        for spec in args.policies.split(","):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"{cluster}|{spec}"]
            cmd += ["--trace", str(args.trace), "--contention", args.contention]
            cmd += ["--seed", str(args.seed), "--restart-cost", args.restart_cost]
            if args.restart_grace is not None:
                cmd += ["--restart-grace", str(args.restart_grace)]
            if args.eval_from:
                cmd += ["--eval-from", args.eval_from]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, env=env, cwd=args.repo, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{cluster} {spec}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["child_wall_s"] = time.perf_counter() - t0
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{cluster} {spec}: {row['avg_jct_s'] / 3600:.1f} h", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
