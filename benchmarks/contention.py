"""What contention costs with flexible requests on ECMP fabrics (issue 33; contention.md).

The real Philly slice (``../shared/data/traces``) at its own arrival rate: the jobs submitted
in ``--days`` after the first ``--history-days`` (whose jobs only fit the run-time
predictor), replayed on ``NODESx8,leaf=LEAF`` from an empty cluster. Per setting (a share of
the multi-GPU jobs flexible by ``cluster/flexible.py``'s rule, the rest fixed; leaf uplinks
1:1 or 2:1; pooled or ECMP uplinks) every policy runs twice, with the calibrated contention
model and with none (pure queueing, the same decisions' ideal), so what contention costs is
the average JCT between the two; and with each job at the rate it would have alone at its
placement (``Alone``: its spread's cost, no neighbour's), which splits that cost into the
spread's and the sharing's. Profiles are drawn from the calibration's mix (Philly has no
model names; seeded). Each run is a separate process (``--workers``).

    nice .venv/bin/python benchmarks/contention.py [--nodes 88] [--days 7] [--workers 2] [--json]
    nice .venv/bin/python benchmarks/contention.py --trace synthetic:llm,jobs=N,... \
        --cluster ../shared/data/topology/alibaba_lingjun_2023_topo.csv --ecmp 0,1
    nice .venv/bin/python benchmarks/contention.py --trace synthetic:llm,jobs=N,... \
        --cluster 848x8,leaf=16,rails=8 --ecmp 0     # a rail-optimised fat-tree
    .venv/bin/python benchmarks/contention.py --table results/a.json results/b.json

Columns: avg JCT h; contention's cost (avg JCT / the same policy's with no contention - 1);
run-time inflation (sum of run times over the sum of isolated run times - 1, restarts
included); the share of jobs slowed by at least 1% beyond their isolated run time less their
restarts (by neighbours on shared links, or by their own spread: the records do not separate
the two) and their share of GPU time; the share of jobs spanning nodes; of Slurm's loss
removed (1 - the policy's contention cost in hours of average JCT over ``backfill``'s on the
same cluster, fabric and share). ``--policies`` takes any spec (a named heuristic with its
parameters, ``compose:...``). ``--act-ratio R`` gives every profile ``act_gb = R * grad_gb``
(the pipeline traffic of jobs with stages, ``synthetic:llm,...,pp=P``; ``cluster.layout``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel, ContentionModel, NoContention
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.flexible import RULE, with_flexible
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.records import JobRecord
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.traces import load_trace
from linkwise.policies.spec import PolicySpec, split_specs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
SLOWED = 1.01  # a job counts as contended when it ran at least 1% longer than isolated
SLURM = "backfill"  # Slurm's own placement: the loss the others' is measured against


@dataclass(frozen=True, slots=True)
class Case:
    """One simulation: a cluster spec, a flexible share, a policy, a contention model."""

    trace: str
    cluster: str
    share: float
    policy: str
    contention: str  # "analytic", "alone" or "none"
    history_days: float
    days: float
    seed: int
    act_ratio: float = 0.0  # act_gb / grad_gb of every profile (layout jobs' pipeline traffic)


@dataclass(frozen=True)
class Alone:
    """Every job at the rate the analytic model gives it alone at its placement: what its own
    spread costs (its ring over NICs and uplinks), nothing of its neighbours'."""

    inner: AnalyticModel
    name: str = "alone"

    def best_time(self, topo: Topology, job: Job) -> float:
        return self.inner.best_time(topo, job)

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        return [self.inner.rates(topo, [one])[0] for one in placed]


def workload(case: Case) -> tuple[Any, ...]:
    """The evaluated jobs: profiles drawn, predictions fit on the history days only, the
    request forms drawn by the stated rule."""
    cal = load_calibration(None)
    jobs = assign_profiles(load_trace(case.trace).jobs, cal, seed=case.seed)
    cut = case.history_days * 86400.0
    predictor = RuntimePredictor.fit(jobs, until=cut)
    window = [j for j in jobs if cut <= j.submit_time < cut + case.days * 86400.0]
    return with_flexible(predictor.annotate(window), case.share, seed=case.seed)


def summary(records: tuple[JobRecord, ...]) -> dict[str, float]:
    """The figures of one run (module docstring)."""
    n = len(records)
    iso = sum(r.job.duration for r in records)
    gpu_time = sum(r.job.duration * r.job.num_gpus for r in records)
    slowed = [r for r in records if (r.run_s - r.restart_s) > SLOWED * r.job.duration]
    return {
        "jobs": n,
        "avg_jct_h": sum(r.jct for r in records) / n / 3600.0,
        "avg_queue_h": sum(r.queue_s for r in records) / n / 3600.0,
        "runtime_inflation": sum(r.run_s for r in records) / iso - 1.0,
        "restart_share": sum(r.restart_s for r in records) / iso,
        "slowed_jobs": len(slowed) / n,
        "slowed_gpu_time": sum(r.job.duration * r.job.num_gpus for r in slowed) / gpu_time,
        "multi_node_jobs": sum(r.nodes > 1 for r in records) / n,
        "flexible_jobs": sum(bool(r.job.flexible) for r in records) / n,
    }


def run_case(case: Case) -> dict[str, Any]:
    """Simulate one case in this process; its figures and CPU seconds."""
    topo = load_topology(case.cluster)
    jobs = workload(case)
    cal = load_calibration(None)
    if case.act_ratio:
        acts = {n: replace(p, act_gb=case.act_ratio * p.grad_gb) for n, p in cal.profiles.items()}
        cal = replace(cal, profiles=acts)
    analytic = AnalyticModel(cal)
    models: dict[str, ContentionModel] = {
        "analytic": analytic,
        "alone": Alone(analytic),
        "none": NoContention(),
    }
    cpu0 = time.process_time()
    # the policy predicts with the shipped calibration, never the scenario's model
    policy = PolicySpec.parse(case.policy).build()
    result = simulate(topo, jobs, models[case.contention], policy, SimConfig())
    row: dict[str, Any] = {
        "cluster": case.cluster,
        "share": case.share,
        "policy": case.policy,
        "contention": case.contention,
    }
    row |= summary(result.records)
    row["cpu_s"] = time.process_time() - cpu0
    return row


def cases(args: argparse.Namespace) -> list[Case]:
    """Every (share, oversubscription, fabric, policy) with the model, and every (share,
    policy) without it (the fabric does not matter without contention: one pooled 1:1 run)."""
    out: list[Case] = []
    base = args.cluster or f"{args.nodes}x8,leaf={args.leaf}"
    policies = split_specs(args.policies)
    shares = [float(s) for s in args.shares.split(",")]
    for share in shares:
        for policy in policies:
            common = (args.trace, share, policy)
            for ideal in args.models.split(","):  # the fabric matters to neither
                out.append(Case(common[0], base, share, policy, ideal, args.history_days,
                                args.days, args.seed, args.act_ratio))  # fmt: skip
            for oversub in args.oversubs.split(","):
                for ecmp in [e == "1" for e in args.ecmp.split(",")] if args.fabrics else ():
                    spec = f"{base},oversub={oversub}" + (",ecmp=1" if ecmp else "")
                    out.append(Case(common[0], spec, share, policy, "analytic",
                                    args.history_days, args.days, args.seed,
                                    args.act_ratio))  # fmt: skip
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table: each model run beside its policy's no-contention run and (where
    run) its spread-alone run, per cluster size."""

    def key(r: dict[str, Any]) -> tuple[str, float, str]:
        return (r["cluster"].split(",")[0], r["share"], r["policy"])

    ideal = {key(r): r for r in rows if r["contention"] == "none"}
    alone = {key(r): r for r in rows if r["contention"] == "alone"}
    # Slurm's loss per (cluster with fabric, share): its avg JCT over its no-contention one
    slurm = {
        (r["cluster"], r["share"]): r["avg_jct_h"] - ideal[key(r)]["avg_jct_h"]
        for r in rows
        if r["contention"] == "analytic" and r["policy"] == SLURM and key(r) in ideal
    }
    lines = [
        "| cluster | flexible share | fabric | policy | avg JCT h | no-contention avg JCT h | "
        "contention's cost | of which the spread alone | run-time inflation | jobs slowed | "
        "GPU time slowed | multi-node jobs | of Slurm's loss removed | CPU s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["contention"] != "analytic":
            continue
        base, own = ideal[key(r)], alone.get(key(r))
        size, *opts = r["cluster"].split(",")
        fabric = ",".join(o for o in opts if not o.startswith("leaf=")) or "default"
        spread = "" if own is None else f"{own['avg_jct_h'] / base['avg_jct_h'] - 1:+.1%}"
        lost = slurm.get((r["cluster"], r["share"]))
        removed = (
            ""
            if not lost or r["policy"] == SLURM
            else f"{1 - (r['avg_jct_h'] - base['avg_jct_h']) / lost:.0%}"
        )
        lines.append(
            f"| {size} | {r['share']:g} | {fabric} | {r['policy']} | {r['avg_jct_h']:.2f} | "
            f"{base['avg_jct_h']:.2f} | {r['avg_jct_h'] / base['avg_jct_h'] - 1:+.1%} | "
            f"{spread} | {r['runtime_inflation']:+.1%} | {r['slowed_jobs']:.1%} | "
            f"{r['slowed_gpu_time']:.1%} | {r['multi_node_jobs']:.1%} | {removed} | "
            f"{r['cpu_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", default=str(DEFAULT_TRACE))
    p.add_argument("--nodes", type=int, default=88)
    p.add_argument("--leaf", type=int, default=16)
    p.add_argument("--cluster", help="a topology (load_topology) instead of NODESx8,leaf=LEAF")
    p.add_argument("--ecmp", default="0,1", help="pooled (0) and/or ECMP (1) uplinks")
    p.add_argument("--history-days", type=float, default=14.0)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--shares", default="1,0.5")
    p.add_argument("--oversubs", default="1,2")
    p.add_argument("--policies", default="backfill,qssf_preemptive")
    p.add_argument("--models", default="none,alone", help="the runs beside the model's")
    p.add_argument(
        "--no-fabrics", dest="fabrics", action="store_false", help="only the --models runs"
    )
    p.add_argument("--table", type=Path, nargs="+", help="print the table of these --out files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--act-ratio", type=float, default=0.0, help="act_gb / grad_gb of profiles")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args()
    if args.table:
        print(table([r for f in args.table for r in json.loads(f.read_text())["rows"]]))
        return 0
    todo = cases(args)
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for row in pool.map(run_case, todo):
            rows.append(row)
            if args.out is not None:  # after every run, so a cut-off run keeps its rows
                args.out.write_text(json.dumps({"rule": RULE, "rows": rows}, indent=1))
    print(json.dumps(rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
