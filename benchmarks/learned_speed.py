"""Learned-policy simulation speed: a packaged policy on the Philly slice, one core.

Simulates ``model:PACKAGE`` (default ``models/pretrained/philly-all``) on the shared Philly
slice at philly-all's ``88x8,leaf=8`` in a child process with one torch thread, and reports
the simulation's wall time, decision points, network calls and time per decision point;
``--profile N`` prints cProfile's top ``N`` functions by own time instead (what dominates).
``--max-jobs`` takes the first jobs of the trace (a smaller slice while iterating).

    .venv/bin/python benchmarks/learned_speed.py [--max-jobs N] [--package DIR] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
DEFAULT_PACKAGE = REPO / "models" / "pretrained" / "philly-all"


class _Counting:
    """A policy wrapper counting decision points and the network's calls."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.decisions = 0
        self.calls = 0
        net = policy.network

        def counted(x: Any) -> Any:
            self.calls += 1
            return net(x)

        policy.network = counted

    def decide(self, state: Any) -> Any:
        self.decisions += 1
        return self.policy.decide(state)


def run(
    trace: Path, cluster: str, package: Path, max_jobs: int | None, seed: int
) -> dict[str, Any]:
    """Load the slice and the package, simulate, summarise."""
    import torch

    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.metrics import summarize
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator import simulate
    from linkwise.cluster.topology import load_topology
    from linkwise.datasets.traces import load_trace
    from linkwise.models.learned import load_package

    torch.set_num_threads(1)
    topo = load_topology(cluster)
    cal = load_calibration()
    jobs = assign_profiles(load_trace(trace, "philly", max_jobs=max_jobs).jobs, cal, seed=seed)
    jobs = [j for j in jobs if j.num_gpus <= topo.total_gpus]
    model = AnalyticModel(cal)
    learned = load_package(package, model=model)
    jobs = list(learned.predictor.annotate(jobs)) if learned.predictor is not None else jobs
    policy = _Counting(learned)
    t0 = time.perf_counter()
    result = simulate(topo, jobs, model, policy)
    wall = time.perf_counter() - t0
    m = summarize(result.records, total_gpus=topo.total_gpus, events=result.events, wall_s=wall)
    return {
        "jobs": len(jobs),
        "cluster": cluster,
        "package": package.name,
        "wall_s": wall,
        "decision_points": policy.decisions,
        "network_calls": policy.calls,
        "ms_per_decision_point": 1000 * wall / max(1, policy.decisions),
        "avg_jct_h": m.avg_jct_s / 3600,
        "wait_overrides": learned.wait_overrides,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--cluster", default="88x8,leaf=8")
    p.add_argument("--package", type=Path, default=DEFAULT_PACKAGE)
    p.add_argument("--max-jobs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, help="print the top N functions (own time)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        row = run(args.trace, args.cluster, args.package, args.max_jobs, args.seed)
        prof.disable()
        print(json.dumps(row))
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        return 0
    row = run(args.trace, args.cluster, args.package, args.max_jobs, args.seed)
    if args.json:
        print(json.dumps(row))
        return 0
    print("| " + " | ".join(row) + " |")
    print("|" + "---|" * len(row))
    print(
        "| "
        + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values())
        + " |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
