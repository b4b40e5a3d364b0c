"""Speed of building transitions from accounting logs (``datasets/decisions.py``).

A simulated history stands in for real accounting: synthetic Philly-like jobs on a 64x8
cluster (16 nodes per leaf) scheduled by a heuristic in the simulator, their starts, ends and
placements written to a DuckDB store with ``ingest_job_runs`` as if Slurm had reported
them. The script times ``build_log_transitions`` (load + replay + candidates + encoding) and
reports transitions per second.

    .venv/bin/python benchmarks/decisions_speed.py [--jobs 3000] [--policy backfill] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.domain import Topology


def history(
    n_jobs: int, policy: str, seed: int, load: float
) -> tuple[DuckDBPyConnection, Topology, AnalyticModel]:
    """(store connection, topology, model) holding one simulated accounting history."""
    from linkwise.datasets.ingest import ingest_job_runs
    from linkwise.datasets.store import open_store
    from linkwise.testkit.history import simulated_history

    runs, topo, model = simulated_history(
        n_jobs,
        topology="64x8,leaf=16",
        seed=seed,
        max_gpus=64,
        load_scale=load,
        policy=policy,
        cluster="bench",
    )
    con = open_store(":memory:")
    ingest_job_runs(con, runs, source="bench")
    return con, topo, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--policy", default="backfill")
    ap.add_argument("--load", type=float, default=4.0, help="arrival load scale")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from linkwise.cluster.mdp import make_spec
    from linkwise.datasets.decisions import build_log_transitions

    con, topo, model = history(args.jobs, args.policy, args.seed, args.load)
    spec = make_spec()
    best = None
    for _ in range(args.repeat):
        t = time.perf_counter()
        df, rep = build_log_transitions(con, topology=topo, spec=spec, model=model)
        wall = time.perf_counter() - t
        best = wall if best is None else min(best, wall)
    assert best is not None
    out = {
        "jobs": rep.jobs,
        "transitions": rep.transitions,
        "starts": rep.starts,
        "waits": rep.waits,
        "exact_match_share": round(rep.exact_match_share, 4),
        "unslotted": rep.unslotted,
        "seconds": round(best, 3),
        "transitions_per_s": round(rep.transitions / best, 1),
        "jobs_per_s": round(rep.jobs / best, 1),
        "frame_mb": round(df.estimated_size() / 1e6, 1),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()
