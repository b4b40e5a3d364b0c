"""``backfill`` against the real local Slurm: workloads run by Slurm, decided by the simulator.

For each seed: a workload of ``--jobs`` jobs (``evaluation.slurm_replay.workload``) runs on
``scripts/local-slurm`` (4 nodes x 4 GPUs, bf_interval=2); then (1) at every instant Slurm
started jobs, ``backfill`` decides on Slurm's own state there, and (2) the whole workload is
replayed in the simulator. Prints Markdown (and ``--json``).

    .venv/bin/python benchmarks/backfill_vs_slurm.py --seeds 0,1 --jobs 24
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BF_INTERVAL_S = 2.0


def main() -> int:
    from linkwise.cluster.slurm.client import SlurmClient, read_env_file
    from linkwise.cluster.topology.load import load_topology
    from linkwise.evaluation.slurm_replay import (
        check_instants,
        compare,
        replay,
        replay_jobs,
        run_on_slurm,
        workload,
    )

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--jobs", type=int, default=24)
    p.add_argument(
        "--slurm-dir", default=os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm")
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    client = SlurmClient.from_env(read_env_file(Path(args.slurm_dir) / "env"), "cli")
    topo = load_topology(str(Path(args.slurm_dir) / "etc"))
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        while client.queue():
            time.sleep(2)
        t0 = time.perf_counter()
        runs, released, foreign = run_on_slurm(client, workload(args.jobs, seed))
        checks = check_instants(runs, topo, released, BF_INTERVAL_S)
        full = compare(runs, replay(topo, replay_jobs(runs, released)), topo, released)
        deltas = [j.delta_s for j in full.jobs]
        rows.append(
            {
                "seed": seed,
                "jobs": len(runs),
                "slurm_wall_s": round(time.perf_counter() - t0, 1),
                "others_jobs_meanwhile": foreign,
                "instants": len(checks),
                "instants_agreeing": sum(c.agrees for c in checks),
                "disagreements": [
                    {"t": c.time, "slurm": c.slurm, "backfill": c.decided}
                    for c in checks
                    if not c.agrees
                ],
                "replay_same_nodes": full.same_nodes,
                "replay_order_inversions_over_2s": len(full.order_inversions(BF_INTERVAL_S)),
                "replay_mean_start_delta_s": sum(deltas) / len(deltas),
                "replay_max_abs_start_delta_s": full.max_abs_delta_s,
                "slurm_mean_start_s": sum(j.slurm_start for j in full.jobs) / len(full.jobs),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        "| seed | jobs | instants: backfill = Slurm | replay: same nodes | replay: order "
        "inversions > 2 s | replay: mean / max abs start delta s | Slurm mean start s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['jobs']} | {r['instants_agreeing']} / {r['instants']} | "
            f"{r['replay_same_nodes']} / {r['jobs']} | {r['replay_order_inversions_over_2s']} | "
            f"{r['replay_mean_start_delta_s']:+.1f} / {r['replay_max_abs_start_delta_s']:.0f} | "
            f"{r['slurm_mean_start_s']:.1f} |"
        )
    for r in rows:
        for d in r["disagreements"]:
            print(
                f"\nseed {r['seed']}, t={d['t']:.0f} s: "
                f"Slurm {d['slurm']}; backfill {d['backfill']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
