"""Slurm's ``--switches=1@T`` against ``backfill_switches`` (``evaluation.slurm_switches``).

Each case of ``CASES`` (``--repeats`` times) on the local Slurm of ``--slurm-dir`` (start it
with ``LINKWISE_SLURM_TOPOLOGY=tree``): Slurm's start (seconds after the job's submission)
and nodes of the job, and of the job behind it where there is one, with the pending reasons
squeue showed, against the simulator's on the same state. Prints Markdown (one row per job
and run, then every disagreement) and, with ``--json``, every result.

    LINKWISE_SLURM_DIR=/tmp/lw-slurm-switches .venv/bin/python benchmarks/switches_vs_slurm.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    from linkwise.cluster.slurm.client import SlurmClient, read_env_file
    from linkwise.cluster.topology.load import load_topology
    from linkwise.evaluation.slurm_switches import CASES, TOLERANCE_S, Outcome, run_cases

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--cases", default=",".join(c.name for c in CASES))
    p.add_argument(
        "--slurm-dir", default=os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm")
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    env = read_env_file(Path(args.slurm_dir) / "env")
    client = SlurmClient.from_env(env, "cli")
    topo = load_topology(str(Path(args.slurm_dir) / "etc"))
    wanted = set(args.cases.split(","))
    todo = [c for c in CASES if c.name in wanted] * args.repeats
    t0 = time.perf_counter()
    results = run_cases(client, topo, todo)
    wall = time.perf_counter() - t0

    def show(o: Outcome) -> str:
        if o.start_s is None:
            return "not started"
        return f"{o.start_s:.0f} s, {','.join(o.nodes)}"

    if args.json:
        rows = [
            {
                "case": r.case.name,
                "free": list(r.free),
                "horizon_s": round(r.horizon_s, 1),
                "slurm": [
                    {"start_s": o.start_s, "nodes": o.nodes, "reasons": o.reasons} for o in r.slurm
                ],
                "model": [{"start_s": o.start_s, "nodes": o.nodes} for o in r.model],
                "agrees": r.agrees,
            }
            for r in results
        ]
        print(json.dumps(rows, indent=1))
        return 0
    version = client.runner.run(["scontrol", "--version"]).strip()
    print(
        f"{version}, topology/{topo.plugin or 'none'}, {len(results)} runs, {wall:.0f} s; "
        f"agree: the same nodes and starts within {TOLERANCE_S:.0f} s\n"
    )
    print("| case | free GPUs | job | T s | Slurm: start, nodes | reasons | model | agrees |")
    print("|---|---|---|---:|---|---|---|---|")
    for r in results:
        asks = [r.case.job] if r.case.later is None else [r.case.job, r.case.later]
        for k, (ask, s, m) in enumerate(zip(asks, r.slurm, r.model, strict=True)):
            what = f"{ask.nodes} x {ask.gpus_per_node}" + (" `--switches`" if k == 0 else " later")
            wait = str(r.case.wait_s) if k == 0 else ""
            print(
                f"| {r.case.name} | {list(r.free)} | {what} | {wait} | {show(s)} | "
                f"{', '.join(s.reasons) or '-'} | {show(m)} | {'yes' if s.agrees(m) else 'NO'} |"
            )
    agreeing = sum(r.agrees for r in results)
    print(f"\n{agreeing} / {len(results)} runs agree.")
    for r in results:
        if not r.agrees:
            print(
                f"\n{r.case.name} ({r.case.what}): Slurm {[show(o) for o in r.slurm]}; "
                f"model {[show(o) for o in r.model]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
