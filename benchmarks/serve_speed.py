"""Cycle time and decision latency of ``linkwise serve`` with 1,000 pending jobs on a real Slurm.

Starts its own local cluster (``scripts/local-slurm``, dir /tmp/lw-slurm-bench, ports 19000+),
submits 1,000 tiny jobs that stay pending (``--begin=now+1h``: not held, so the shadow loop
sees them all as pending), runs the shadow loop for a number of cycles per policy, prints
p50/p99 of the cycle time (squeue + sinfo JSON, state, decision, explanation, DuckDB
record), of the decision latency and of the explanation (``deployer.explain``), then cancels
the jobs and stops the cluster.

    .venv/bin/python benchmarks/serve_speed.py [--jobs 1000] [--cycles 30]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.deployer.loop import ServeConfig, serve

ROOT = Path(__file__).resolve().parents[1]
DIR = "/tmp/lw-slurm-bench"
ENV = {"LINKWISE_SLURM_DIR": DIR, "LINKWISE_SLURM_PORT_BASE": "19000"}


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.cycles: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        doc = json.loads(record.getMessage())
        if doc.get("event") == "cycle":
            self.cycles.append(doc)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--policies", default="fifo,backfill,best_fit")
    args = ap.parse_args()
    env = {**os.environ, **ENV}
    script = str(ROOT / "scripts" / "local-slurm")
    subprocess.run([script, "start"], env=env, check=True, capture_output=True)
    client = SlurmClient.from_env(read_env_file(Path(DIR) / "env"))
    try:
        t0 = time.time()
        for i in range(args.jobs):
            client.submit(
                "true", name="bench", gpus_per_node=1 + i % 4, extra_args=["--begin=now+3600"]
            )
        submit_s = time.time() - t0
        pending = sum(1 for q in client.queue() if q.state == "PENDING")
        print(f"submitted {args.jobs} jobs in {submit_s:.1f} s; pending now: {pending}")
        log = logging.getLogger("bench.serve")
        log.setLevel(logging.INFO)
        log.propagate = False
        for policy in args.policies.split(","):
            handler = Collect()
            log.handlers = [handler]
            with tempfile.TemporaryDirectory() as tmp:
                cfg = ServeConfig(
                    mode="shadow", partitions=("gpu",), policy=policy, fallback=policy,
                    slurm_env=str(Path(DIR) / "env"), db=str(Path(tmp) / "s.duckdb"),
                    state_dir=tmp, interval_s=0.05, max_cycles=args.cycles,
                )  # fmt: skip
                serve(cfg, logger=log)
            cyc = [c["cycle_ms"] for c in handler.cycles[2:]]  # skip warm-up
            lat = [c["latency_ms"] for c in handler.cycles[2:]]
            why = [c.get("explain_ms", 0.0) for c in handler.cycles[2:]]
            seen = handler.cycles[-1]["pending"]
            print(
                f"{policy:10s} pending seen {seen:5d}  cycle p50 {pct(cyc, 0.5):7.1f} ms "
                f"p99 {pct(cyc, 0.99):7.1f} ms  decision p50 {pct(lat, 0.5):7.2f} ms "
                f"p99 {pct(lat, 0.99):7.2f} ms  explanation p50 {pct(why, 0.5):7.2f} ms "
                f"p99 {pct(why, 0.99):7.2f} ms  (mean cycle {statistics.mean(cyc):.1f} ms, "
                f"n={len(cyc)})"
            )
    finally:
        client.runner.run(["scancel", "--name=bench"])
        subprocess.run([script, "stop"], env=env, check=False, capture_output=True)


if __name__ == "__main__":
    main()
