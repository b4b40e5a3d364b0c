"""Diagnostic (issue 16): a headline run's trained BC and CQL packages replayed on its
warm-started held-out cases (every evaluated window x seeds 0-2) under other guard settings,
beside backfill, SJF-BCO and Tiresias-LAS: job-weighted average JCT over all cases, its ratio
to backfill's, run-time inflation and guard overrides. It reads the evaluated days, so it
explains a result; it must not choose a setting (that is the validation days' job).

    nice .venv/bin/python benchmarks/guard_diagnostic.py RUN_DIR CLUSTER_SPEC

``RUN_DIR``: a ``headline_settings.py --out`` folder; ``CLUSTER_SPEC``: its cluster, e.g.
``64x8,leaf=8,oversub=2``.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import closing
from pathlib import Path

from linkwise.policies.spec import PolicySpec

HOUR = 3600.0
GUARDS = (("aging 6h", "aging", 6 * HOUR), ("aging 48h", "aging", 48 * HOUR))
GUARDS += (("idle", "idle", None), ("strict", "strict", None))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run", type=Path)
    p.add_argument("cluster")
    args = p.parse_args()

    from linkwise.cluster.simulator.run import simulate
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.backlog import backlog_from_store
    from linkwise.datasets.prediction import read_predictor
    from linkwise.datasets.rollouts import cut_windows, jobs_from_store
    from linkwise.datasets.store import open_store
    from linkwise.evaluation.benchmark import (
        _case_workload,
        _scenario,
        make_bench_policy,
        make_cases,
    )
    from linkwise.evaluation.predictions import package_predictor

    result = json.loads((args.run / "result.json").read_text())
    topo = load_topology(args.cluster)
    pred = read_predictor(args.run / "predictor.json")
    starts = {w["start"] for w in result["evaluation"]["windows"]}
    with closing(open_store(args.run / "linkwise.duckdb")) as con:
        jobs = jobs_from_store(con, cluster="demo")
        cut = cut_windows(jobs, 86400.0, max_gpus=topo.total_gpus)
        wins = [w for w in cut if w.start in starts]
        backlogs = {w.window_id: backlog_from_store(con, topo, "demo", w.start, pred) for w in wins}
    cases = make_cases(wins, [0, 1, 2], topo, block_s=3600.0, backlogs=backlogs, predictor=pred)

    variants: list[tuple[str, str, str | None, float | None]] = [
        (h, h, None, None) for h in ("backfill", "tiresias_las", "sjf_bco")
    ]
    for algo in ("bc", "cql"):
        pkg = "model:" + result["models"][algo]["package_dir"]
        variants += [(f"{algo} {label}", pkg, guard, starve) for label, guard, starve in GUARDS]
    base = None
    for label, spec, guard, starve in variants:
        jct = run_s = iso = 0.0
        n = overrides = 0
        for case in cases:
            policy = make_bench_policy(_scenario(case, ()), PolicySpec.parse(spec))
            if guard is not None:
                policy.guard = guard  # type: ignore[attr-defined]
            if starve is not None:
                policy.starve_s = starve  # type: ignore[attr-defined]
            workload, running = _case_workload(case, package_predictor(policy))
            sc = _scenario(case, workload)
            out = simulate(sc.topology, sc.jobs, sc.model(), policy, sc.config, running=running)
            held = {j.job_id for j, _ in running}
            recs = [r for r in out.records if r.job.job_id not in held]
            jct += sum(r.jct for r in recs)
            run_s += sum(r.run_s for r in recs)
            iso += sum(r.job.duration for r in recs)
            n += len(recs)
            overrides += getattr(policy, "wait_overrides", 0)
        avg = jct / n
        base = base or avg
        print(
            f"| {label} | {avg / HOUR:.2f} | {avg / base:.3f} | {run_s / iso - 1:+.0%} "
            f"| {overrides} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
