"""The heuristic frontier (issue 22, item 5): every non-learned policy of ``linkwise policies``
on a headline setting (``philly-all``, ``philly-multigpu``) or the embedded default
(``full``), with the simulator's default (honest) restart cost, on the same warm-started cases
as the headline: the history replayed under backfill into a store, one run-time predictor fit
on the jobs before the held-out days, the last week's windows x 3 seeds evaluated.

The best same-information policy is chosen on the validation days (the windows just before
the held-out ones, as the learners' checkpoints are) and reported on the evaluated days; the
best on the evaluated days is printed beside it, for the record only.

    nice .venv/bin/python benchmarks/frontier.py --experiment philly-multigpu --out OUT

writes ``OUT/frontier.json`` (rows of both parts, the choice, the command and wall time) and
prints a Markdown table for ``benchmarks/frontier.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from linkwise.policies.spec import PolicySpec

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "../shared/data/traces"
PHILLY = "philly_2017-09-04_2017-10-15.csv"
HOUR = 3600.0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--experiment", default="philly-multigpu", help="an experiment's name")
    p.add_argument("--trace", type=Path, help="the trace (default: the shared Philly slice)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--policies", help="comma-separated specs (default: every non-learned one)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--validation-windows", type=int, default=3)
    p.add_argument("--restart-cost", default=None, help="as `linkwise compare --restart-cost`")
    p.add_argument("--search", action="store_true", help="the search policies too")
    p.add_argument("--table", type=Path, help="print the table of an earlier frontier.json")
    args = p.parse_args()
    if args.table is not None:
        print(markdown(json.loads(args.table.read_text())))
        return 0
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = time.perf_counter() - t0
    result["argv"] = sys.argv
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontier.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(markdown(result))
    return 0


def default_policies(search: bool = False) -> list[str]:
    """Every heuristic ``linkwise policies`` lists (oracles included, marked), and its search
    policies too with ``search`` (reported beside, never counted as a heuristic)."""
    from linkwise.policies.catalog import policy_catalog

    kinds = {"heuristic", "search"} if search else {"heuristic"}
    return [p.name for p in policy_catalog() if p.kind in kinds]


@dataclass(frozen=True)
class HeadlineSetting:
    """A headline setting's warm-startable cases: the history replayed under backfill into
    the store ``db``, the predictor fit on the jobs before the held-out days, the cut windows
    (``windows``), the held-out ones and the validation ones just before them."""

    experiment: Any  # pipelines.experiment.Experiment
    topology: Any  # cluster.domain.Topology
    db: Path
    workload: str
    history: dict[str, Any]
    predictor: Any  # datasets.predictor.RuntimePredictor
    until: float
    windows: list[Any]  # datasets.rollouts.Window, every cut window
    heldout: list[Any]
    validation: list[Any]

    def training(self, n: int) -> list[Any]:
        """The last ``n`` windows of ``min_jobs`` jobs or more before the validation ones."""
        first = min(w.start for w in self.validation)
        keep = [w for w in self.windows if w.end <= first]
        keep = [w for w in keep if len(w.jobs) >= self.experiment.windows.min_jobs]
        return keep[-n:] if n > 0 else []


def headline_setting(
    experiment: str,
    trace: Path | None,
    out: Path,
    validation_windows: int = 3,
    cluster: str | None = None,
) -> HeadlineSetting:
    """Replay the experiment's history into ``out/linkwise.duckdb`` and cut its windows (the
    frontier's and the residual's cases); ``cluster``: a cluster spec in place of the
    experiment's (e.g. ``64x8,leaf=16,oversub=1,ecmp=1``)."""
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.decisions import store_predictor
    from linkwise.datasets.rollouts import cut_windows, jobs_from_store
    from linkwise.datasets.store import open_store
    from linkwise.pipelines.demo_data import split_time
    from linkwise.pipelines.experiment import get_experiment
    from linkwise.pipelines.history import replay_history, workload_jobs
    from linkwise.pipelines.selection import validation_windows as validation

    exp = get_experiment(experiment)
    if cluster is not None:
        exp = replace(exp, topology=cluster)
    topo = load_topology(exp.topology)
    if trace is None and exp.workload is None:
        trace = (DEFAULT_TRACE / PHILLY).resolve()
    synthetic = exp.workload
    jobs, workload = workload_jobs(
        trace,
        "philly" if trace is not None else "auto",
        jobs=synthetic.jobs if synthetic else 0,
        load_scale=synthetic.load_scale if synthetic else 1.0,
        max_gpus=topo.total_gpus,
        seed=0,
        min_gpus=exp.min_gpus,
    )
    out.mkdir(parents=True, exist_ok=True)
    db = out / "linkwise.duckdb"
    db.unlink(missing_ok=True)
    history = replay_history(jobs, topo, db, cluster="demo", seed=0)
    with closing(open_store(db)) as con:
        frame = jobs_from_store(con, cluster="demo")
        first = float(frame["submit_time"].min())  # type: ignore[arg-type]
        last = float(frame["submit_time"].max())  # type: ignore[arg-type]
        until = split_time(first, last, exp.windows.window_s, exp.evaluation.heldout_windows)
        predictor = store_predictor(con, "demo", until)
    cut = cut_windows(frame, exp.windows.window_s, max_gpus=topo.total_gpus)
    held = [w for w in cut if w.start >= until and len(w.jobs) >= exp.windows.min_jobs]
    held = held[-exp.evaluation.heldout_windows :]
    val = validation(cut, until, validation_windows, exp.windows.min_jobs)
    return HeadlineSetting(
        exp, topo, db, workload, history.to_json(), predictor, until, cut, held, val
    )


def with_flexible_windows(setting: HeadlineSetting, share: float) -> HeadlineSetting:
    """The setting with that share of every window's multi-GPU jobs flexible
    (``cluster.flexible.with_flexible``, seed 0: the rule ``--flexible SHARE`` states); the
    warm start's backlog (the history replayed under backfill) keeps its fixed shapes."""
    from linkwise.cluster.flexible import with_flexible

    def flex(windows: list[Any]) -> list[Any]:
        return [replace(w, jobs=with_flexible(w.jobs, share, seed=0)) for w in windows]

    return replace(
        setting,
        windows=flex(setting.windows),
        heldout=flex(setting.heldout),
        validation=flex(setting.validation),
    )


def warm_backlogs(setting: HeadlineSetting, windows: list[Any]) -> dict[int, Any]:
    """Window id -> the accounting's state at the window's start (``datasets.backlog``)."""
    from linkwise.datasets.backlog import backlog_from_store
    from linkwise.datasets.store import open_store

    with closing(open_store(setting.db)) as con:
        return {
            w.window_id: backlog_from_store(
                con, setting.topology, "demo", w.start, setting.predictor
            )
            for w in windows
        }


def warm_cases(
    setting: HeadlineSetting, windows: list[Any], seeds: list[int] | tuple[int, ...]
) -> list[Any]:
    """``evaluate --warm-start``'s cases: every window x seed started from the accounting's
    state at its start, the setting's predictor and block length, Sia's restart costs."""
    from linkwise.evaluation.benchmark import make_cases

    return make_cases(
        windows,
        seeds,
        setting.topology,
        block_s=setting.experiment.windows.block_s,
        backlogs=warm_backlogs(setting, windows),
        predictor=setting.predictor,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from linkwise.pipelines.evaluate import evaluate

    setting = headline_setting(args.experiment, args.trace, args.out, args.validation_windows)
    exp, db, predictor = setting.experiment, setting.db, setting.predictor
    held, val = setting.heldout, setting.validation
    policies = args.policies.split(",") if args.policies else default_policies(args.search)
    seeds = [int(s) for s in args.seeds.split(",")]
    extra: dict[str, Any] = {}
    if args.restart_cost is not None:
        extra["restart_cost"] = args.restart_cost
    parts: dict[str, Any] = {}
    for part, wins in (("validation", val), ("evaluation", held)):
        report, _ = evaluate(
            [PolicySpec.parse(p) for p in policies],
            db=db,
            slurm_cluster="demo",
            windows=[w.window_id for w in wins],
            seeds=seeds,
            cluster=exp.topology,
            window_s=exp.windows.window_s,
            block_s=exp.windows.block_s,
            min_jobs=exp.windows.min_jobs,
            baseline="backfill",
            out_dir=args.out / part,
            log=False,
            warm_start=True,
            predictor=predictor,
            **extra,
        )
        parts[part] = {
            "windows": [w.window_id for w in wins],
            "summary": report.summary,
            "ratios": [r.to_json() for r in report.ratios],
            "references": report.references,
            "context": {k: report.context.get(k) for k in ("restart", "cases", "cluster")},
        }
    return {
        "experiment": exp.name,
        "cluster": exp.topology,
        "workload": setting.workload,
        "history": setting.history,
        "predictor_fit_until": predictor.fit_until,
        "policies": policies,
        "seeds": seeds,
        "best_on_validation": best_same_information(parts["validation"]["summary"]),
        "best_on_evaluation": best_same_information(parts["evaluation"]["summary"]),
        **parts,
    }


def best_same_information(summary: list[dict[str, Any]]) -> str | None:
    """The lowest average JCT among the heuristics that are no oracle (a search policy is
    reported beside them, never chosen)."""
    rows = [
        s
        for s in summary
        if not s.get("oracle")
        and s.get("avg_jct_s") is not None
        and not str(s["policy"]).startswith("lookahead")
    ]
    return min(rows, key=lambda s: float(s["avg_jct_s"]))["policy"] if rows else None


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(float(x), spec)


def markdown(result: dict[str, Any]) -> str:
    """The evaluated days' table: avg JCT, ratios to backfill (paired 95% interval), to QSSF
    and to the policy chosen on the validation days, p99, queue, inflation, preemptions,
    migrations and restart seconds per job, and the ratio to the queue-aware lower bound."""
    ev = result["evaluation"]
    by = {s["policy"]: s for s in ev["summary"]}
    ratio = {r["policy"]: r for r in ev["ratios"] if r.get("stat") == "avg"}
    chosen = result["best_on_validation"]
    ref = by.get(chosen, {}).get("avg_jct_s")
    qssf = by.get("qssf", {}).get("avg_jct_s")
    lines = [
        f"{result['experiment']} on {result['cluster']}: {ev['context'].get('cases')} cases; "
        f"best same-information policy on the validation days: **{chosen}** "
        f"(on the evaluated days: {result['best_on_evaluation']}); wall "
        f"{result.get('wall_s', 0) / 60:.1f} min",
        "",
        "| policy | avg JCT h | / backfill [95% CI] | / qssf | / chosen | p99 JCT h | avg queue h "
        "| run-time inflation | preemptions/job | migrations/job | restart s/job | / queue bound |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sorted(ev["summary"], key=lambda s: float(s.get("avg_jct_s") or 1e30)):
        name = s["policy"] + (" (oracle)" if s.get("oracle") else "")
        r = ratio.get(s["policy"])
        ci = "1" if r is None else f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
        jct = s.get("avg_jct_s")
        to_ref = None if not ref or jct is None else jct / ref
        to_qssf = None if not qssf or jct is None else jct / qssf
        jobs = s.get("jobs") or 0
        migrations = (s.get("migrations") or 0) / jobs if jobs else None
        lines.append(
            f"| {name} | {_fmt((jct or 0) / HOUR, '.2f')} | {ci} | {_fmt(to_qssf, '.3f')} "
            f"| {_fmt(to_ref, '.3f')} | {_fmt((s.get('p99_jct_s') or 0) / HOUR, '.1f')} "
            f"| {_fmt((s.get('avg_queue_s') or 0) / HOUR, '.2f')} "
            f"| {_fmt(100 * (s.get('avg_runtime_inflation') or 0), '+.0f')}% "
            f"| {_fmt(s.get('preemptions_per_job'), '.2f')} | {_fmt(migrations, '.3f')} "
            f"| {_fmt(s.get('restart_s_per_job'), '.0f')} "
            f"| {_fmt(s.get('avg_jct_over_queue_lb'), '.2f')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
