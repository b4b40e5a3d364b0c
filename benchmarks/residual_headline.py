"""The residual policy on a headline setting (issue 23 items 5 and 7): the frontier's
warm-started cases (``frontier.headline_setting``), the base chosen on the validation days
among every same-information heuristic, counterfactual labels under it on the training days
before them, BC and CQL on the labels (one MLflow run each with the label set's hash), the
margin chosen on the validation days, the held-out days x 3 seeds (base against both
residuals: paired 95% bootstrap intervals of the average and p99 JCT ratios, deviations per
1,000 decisions), the robustness cases (0.5x/1x/2x the nodes x the setting's and a 4:1
oversubscribed fabric, ``evaluation.gates.check_robustness`` at 1.02x) and the search policy
beside on a subset.

    nice -n 5 .venv/bin/python benchmarks/residual_headline.py --experiment philly-multigpu \\
        --ship models/pretrained/philly-multigpu

writes ``benchmarks/results/residual_headline_EXPERIMENT.json`` and, with ``--ship DIR``, the
promoted residual package (the learner passing robustness with the better validation figure;
margin ``inf``, i.e. its base, when neither beats the base on the validation days).
The label windows, the validation and the held-out cases all start from the accounting's
state at their start (warm start), as the frontier's (``--cold-labels``: labels from an
empty cluster).

A contention setting (issue 33 item 5, ``contention.md``): ``--cluster`` replaces the
experiment's cluster (``64x8,leaf=16,oversub=1,ecmp=1``), ``--flexible SHARE`` replays that
share of every window's multi-GPU jobs as flexible (``cluster.flexible``'s rule, seed 0; the
warm start's backlog keeps fixed shapes); ``--base-candidates``, ``--learners``,
``--heldout-windows`` and ``--skip-robustness`` cut the budget (each stated in the results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontier import (
    HeadlineSetting,
    headline_setting,
    warm_backlogs,
    warm_cases,
    with_flexible_windows,
)

HOUR = 3600.0


def _h(x: float | None) -> str:
    return "-" if x is None else f"{x / HOUR:.3f} h"


def base_from_frontier(path: Path) -> Any:
    """The base choice a frontier run made on the same validation cases (its
    ``validation`` summary: every heuristic; oracles and search policies left out)."""
    from linkwise.pipelines.residual import BaseChoice
    from linkwise.policies.spec import PolicySpec

    data = json.loads(path.read_text())
    figures = {
        str(s["policy"]): float(s["avg_jct_s"])
        for s in data["validation"]["summary"]
        if not s.get("oracle") and not str(s["policy"]).startswith("lookahead")
    }
    best = str(data["best_on_validation"])
    return BaseChoice(PolicySpec.parse(best), figures[best], dict(figures))


def label_chain(labels: Any) -> dict[str, Any]:
    """The teacher's headroom (``pipelines.residual.label_headroom``) in hours: points with a
    better move than the base's, the mean label gain per point (hours of jobs-in-system saved
    by the best move), the best moves' kinds."""
    from linkwise.pipelines.residual import label_headroom

    h = label_headroom(labels)
    return {
        "points": h["points"],
        "points_with_a_better_move": h["points_with_a_better_move"],
        "share_with_a_better_move": (
            h["points_with_a_better_move"] / h["points"] if h["points"] else 0.0
        ),
        "mean_gain_h_per_point": h["mean_gain_s"] / HOUR,
        "mean_gain_h_where_better": h["mean_gain_s_where_better"] / HOUR,
        "best_move_kinds": h["better_move_kinds"],
    }


def _training(r: Any) -> dict[str, Any]:
    """A ``pipelines.residual.LabelTraining`` as the results JSON records it."""
    return {
        "label_match": r.label_match,
        "steps_per_s": r.steps_per_s,
        "transitions": r.transitions,
        "run_id": r.run_id,
        "dataset_hash": r.dataset_hash,
        "learned": r.package_dir,
    }


def run(args: argparse.Namespace, t0: float) -> dict[str, Any]:
    import polars as pl

    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.mdp import MdpConfig, make_spec
    from linkwise.cluster.profiles import load_calibration
    from linkwise.datasets.labels import LabelTask, read_labels, run_labels, write_labels
    from linkwise.evaluation.benchmark import PolicyRef, run_benchmark
    from linkwise.evaluation.gates import check_robustness
    from linkwise.evaluation.stats import paired_ratio
    from linkwise.models.residual import topology_signature, write_residual_package
    from linkwise.models.training import AlgoConfig
    from linkwise.pipelines.residual import (
        DEFAULT_MARGINS,
        choose_base,
        choose_margin,
        dagger_round,
        label_deferral,
        robustness,
        robustness_topologies,
        train_on_labels,
    )
    from linkwise.policies.spec import PolicySpec

    def stamp() -> str:
        return f"[{time.perf_counter() - t0:.0f} s]"

    work = args.work or Path(tempfile.mkdtemp(prefix=f"lw-res-{args.experiment}-"))
    s: HeadlineSetting = headline_setting(args.experiment, args.trace, work, cluster=args.cluster)
    if args.flexible is not None:
        s = with_flexible_windows(s, args.flexible)
    if args.heldout_windows is not None:
        s = replace(s, heldout=s.heldout[: args.heldout_windows])
    exp, topo = s.experiment, s.topology
    seeds = [int(x) for x in args.seeds.split(",")]
    val_seeds = [int(x) for x in args.val_seeds.split(",")]
    out: dict[str, Any] = {
        "experiment": exp.name,
        "cluster": exp.topology,
        "workload": s.workload,
        "history": s.history,
        "predictor_fit_until": s.predictor.fit_until,
        "windows": {
            "validation": [w.window_id for w in s.validation],
            "heldout": [w.window_id for w in s.heldout],
        },
        "seeds": seeds,
        "validation_seeds": val_seeds,
        "flexible_share": args.flexible,
    }
    print(f"setting {exp.name} on {exp.topology}: {len(s.windows)} windows {stamp()}")
    val_cases = warm_cases(s, s.validation, val_seeds)

    # 1. the base
    if args.base_from is not None:
        base = base_from_frontier(args.base_from)
        out["base_from"] = str(args.base_from)
    else:
        cands = (
            [PolicySpec.parse(c) for c in args.base_candidates.split(";")]
            if args.base_candidates
            else None
        )
        base = choose_base(val_cases, cands, executor=args.bench_executor)
    out["base"] = base.to_json()
    print(f"base {base.spec} ({_h(base.avg_jct_s)}) {stamp()}")
    for k, v in sorted(base.figures.items(), key=lambda kv: kv[1] or math.inf):
        print(f"  {k:<24} {_h(v)}")

    # 2. labels on the training days before the validation ones
    cfg = MdpConfig(
        k_slots=8,
        slot_order="mixed",
        running_slots=args.running_slots,
        generators=("bounded", "least_contention", "best_fit"),
    )
    belief = AnalyticModel(load_calibration(None))
    base_policy = base.spec.build(belief)
    train = s.training(args.label_windows)
    label_seeds = [int(x) for x in args.label_seeds.split(",")]

    def label_tasks(windows: list[Any], seeds: list[int] = label_seeds) -> list[Any]:
        backlogs = warm_backlogs(s, windows) if not args.cold_labels else {}
        return [
            LabelTask(
                base=base_policy,
                base_name=base.spec,
                window=w,
                topology=topo,
                seed=seed,
                config=cfg,
                predictor=s.predictor,
                block_s=exp.windows.block_s,
                horizon_s=args.horizon_h * HOUR,
                n=args.n,
                points=args.points,
                alternatives=args.alternatives,
                backlog=backlogs.get(w.window_id),
                terminal=args.terminal,
            )
            for w in windows
            for seed in seeds
        ]

    tasks = label_tasks(train)
    t = time.perf_counter()
    if args.labels is not None:
        labels, _ = read_labels(args.labels)
    else:
        labels = run_labels(tasks, args.executor)
    label_s = time.perf_counter() - t
    inputs = {
        "base": base.spec.label,  # a PolicySpec: JSON needs its text
        "horizon_s": args.horizon_h * HOUR,
        "n": args.n,
        "experiment": exp.name,
        "windows": [w.window_id for w in train],
        "warm_start": not args.cold_labels,
        "terminal": args.terminal,
        "seeds": label_seeds,
    }
    manifest = write_labels(labels, cfg, inputs, work / "labels")
    workers = int(args.executor.partition(":")[2] or os.cpu_count() or 1)
    chain = label_chain(labels)
    out["labels"] = {
        "windows": [w.window_id for w in train],
        "points_per_window": args.points,
        "seeds": label_seeds,
        "n": args.n,
        "horizon_h": args.horizon_h,
        "alternatives": args.alternatives,
        "running_slots": args.running_slots,
        "rows": labels.height,
        "hash": manifest["hash"],
        "seconds": label_s,
        "reused": str(args.labels) if args.labels else None,
        "executor": args.executor,
        "rows_per_s": labels.height / label_s if label_s > 0 else None,
        "points_per_s": chain["points"] / label_s if label_s > 0 else None,
        "points_per_s_per_core": chain["points"] / label_s / workers if label_s > 0 else None,
        "path": str(next((work / "labels").glob("*.parquet"), work / "labels")),
        "warm_start": not args.cold_labels,
        **chain,
    }
    print(
        f"labels: {labels.height} rows at {chain['points']} points "
        f"({chain['points_with_a_better_move']} with a better move, mean gain "
        f"{chain['mean_gain_h_per_point']:.3f} h/point) in {label_s:.0f} s {stamp()}"
    )

    # 3. BC and CQL on the labels, the margin on the validation days
    trained_sig = [topology_signature(topo)]
    deferral = label_deferral(labels, make_spec(cfg), trained_sig, min_support=3)
    uri = args.tracking_uri or f"sqlite:///{work / 'mlflow.db'}"
    params = AlgoConfig(
        n_steps=args.steps,
        n_steps_per_epoch=args.steps,
        batch_size=64,
        hidden_units=(128, 128),
        alpha=1.0,
        gamma=0.0,
        target_update_interval=100,
    )
    margins = [float(m) for m in args.margins.split(",")] if args.margins else DEFAULT_MARGINS
    learners: dict[str, Any] = {}
    for algo in args.learners.split(","):
        r = train_on_labels(
            labels, manifest, algo, params, work / "pkgs", predictor=s.predictor, tracking_uri=uri
        )
        m = choose_margin(
            r.package_dir, base, deferral, val_cases, work / f"res-{algo}", margins,
            executor=args.bench_executor,
        )  # fmt: skip
        learners[algo] = {
            "train": _training(r),
            "margin": m.to_json(),
            "margin_value": m.margin,
            "package": m.package_dir,
        }
        print(f"{algo}: label match {r.label_match:.2f}, margin {m.margin} {stamp()}")
        for k, f in m.figures.items():
            print(f"  {k:<14} {_h(f['avg_jct_s'])} dev/1k {f['deviations_per_1000']}")
    out["learners"] = learners
    out["mlflow"] = uri

    # 3a. DAgger rounds for one learner: label the states its residual visits on the training
    # days (the base still scores and continues every fork), retrain on the union, choose its
    # margin again; a round is kept only if its validation figure improves
    rounds: list[dict[str, Any]] = []
    dagger_seeds = [int(x) for x in args.dagger_seeds.split(",")]
    dl = args.dagger_learner
    for k in range(1, args.dagger_rounds + 1):
        c = learners[dl]
        t = time.perf_counter()
        union, r = dagger_round(
            labels, manifest, c["package"], label_tasks(train, dagger_seeds), params,
            work / f"pkgs-dagger{k}", predictor=s.predictor, tracking_uri=uri,
            executor=args.executor, algo=dl,
        )  # fmt: skip
        added = union.height - labels.height
        labels = union
        manifest = {**manifest, "hash": r.dataset_hash}
        deferral = label_deferral(labels, make_spec(cfg), trained_sig, min_support=3)
        m = choose_margin(
            r.package_dir, base, deferral, val_cases, work / f"res-{dl}-dagger{k}", margins,
            executor=args.bench_executor,
        )  # fmt: skip
        before = c["margin"]["candidates"][f"margin-{c['margin']['margin']}"]["avg_jct_s"]
        after = m.figures[f"margin-{m.to_json()['margin']}"]["avg_jct_s"]
        rounds.append(
            {
                "round": k,
                "learner": dl,
                "rows_added": added,
                "rows": labels.height,
                "label_hash": r.dataset_hash,
                "seconds": time.perf_counter() - t,
                "label_match": r.label_match,
                "margin": m.to_json(),
                "validation_avg_jct_s": after,
                "previous_validation_avg_jct_s": before,
                "kept": bool(after is not None and before is not None and after < before),
            }
        )
        print(f"dagger round {k}: +{added} rows, margin {m.margin}, validation "
              f"{_h(before)} -> {_h(after)} {stamp()}")  # fmt: skip
        if rounds[-1]["kept"]:
            learners[dl] = {
                **c,
                "train": _training(r),
                "margin": m.to_json(),
                "margin_value": m.margin,
                "package": m.package_dir,
                "dagger_round": k,
            }
    out["dagger"] = rounds

    # 3b. refit on the training and validation days' labels, each learner at the margin the
    # validation days chose for it (the held-out days stay unseen)
    if args.refit_with_validation:
        t = time.perf_counter()
        vlabels = run_labels(label_tasks(s.validation), args.executor)
        labels = pl.concat([labels, vlabels], how="vertical")
        inputs = {**inputs, "windows": inputs["windows"] + out["windows"]["validation"]}
        manifest = write_labels(labels, cfg, {**inputs, "refit": True}, work / "labels-refit")
        deferral = label_deferral(labels, make_spec(cfg), trained_sig, min_support=3)
        out["labels"]["refit"] = {
            "validation_rows": vlabels.height,
            "rows": labels.height,
            "hash": manifest["hash"],
            "seconds": time.perf_counter() - t,
            **label_chain(labels),
        }
        for algo, c in learners.items():
            r = train_on_labels(
                labels,
                manifest,
                algo,
                params,
                work / "pkgs-refit",
                predictor=s.predictor,
                tracking_uri=uri,
            )
            pkg = write_residual_package(
                r.package_dir,
                work / f"refit-{algo}",
                base=base.spec,
                margin=c["margin_value"],
                deferral=deferral,
                chosen={"base": base.to_json(), "refit_with_validation": True},
            )
            c["train_before_refit"] = c["train"]
            c["train"] = _training(r)
            c["package"] = str(pkg)
        print(f"refit on {labels.height} label rows (validation days added) {stamp()}")

    # 4. the held-out days: base against both residuals, paired
    held_cases = warm_cases(s, s.heldout, seeds)
    refs = [PolicyRef("base", base.spec)] + [
        PolicyRef(f"residual-{a}", PolicySpec.parse(f"model:{c['package']}"))
        for a, c in learners.items()
    ]
    t = time.perf_counter()
    bench = run_benchmark(refs, held_cases, executor=args.bench_executor)
    rows = {r["policy"]: r for r in bench.summary()}
    held: dict[str, Any] = {}
    for k, r in rows.items():
        entry: dict[str, Any] = {
            "avg_jct_s": r["avg_jct_s"],
            "p99_jct_s": r.get("p99_jct_s"),
            "deviations_per_1000": r.get("deviations_per_1000"),
            "decision_points": r.get("decisions"),  # mean per case
            "preemptions_per_job": r.get("preemptions_per_job"),
        }
        if k != "base":
            for stat in ("avg", "p99"):
                ci = paired_ratio(bench, k, "base", stat, n_boot=2000, seed=0)
                entry[f"{stat}_ratio_to_base"] = {
                    "ratio": ci.ratio,
                    "low": ci.low,
                    "high": ci.high,
                    "wins": ci.wins,
                }
        held[k] = entry
    out["heldout"] = {
        "cases": len(held_cases),
        "seconds": time.perf_counter() - t,
        "best_same_information": base.spec.label,
        "policies": held,
    }
    print(f"held-out days ({len(held_cases)} cases) {stamp()}:")
    for k, v in held.items():
        a = v.get("avg_ratio_to_base")
        ci = "" if a is None else f" x{a['ratio']:.3f} [{a['low']:.3f}, {a['high']:.3f}]"
        print(
            f"  {k:<14} {_h(v['avg_jct_s'])}{ci} p99 {_h(v['p99_jct_s'])} "
            f"dev/1k {v['deviations_per_1000']}"
        )

    # 5. robustness: sizes and fabrics not trained on, one held-out day, cold-started
    topos = robustness_topologies(exp.topology)
    robust: dict[str, Any] = {}
    for algo, c in learners.items():
        if args.skip_robustness:  # not checked: every learner may be promoted
            robust[algo] = {"cases": [], "passed": True, "skipped": True}
            continue
        rc = robustness(
            c["package"],
            base.spec,
            topos,
            s.heldout[:1],
            (0,),
            predictor=s.predictor,
            trained=trained_sig,
        )
        off = {r.name: (r.avg_jct_s, r.base_avg_jct_s) for r in rc if not r.trained_on}
        report = check_robustness(algo, off)
        robust[algo] = {"cases": [r.to_json() for r in rc], "passed": report.passed}
        print(f"robustness {algo}: {'PASSED' if report.passed else 'REFUSED'} {stamp()}")
        for r in rc:
            mark = " (trained)" if r.trained_on else ""
            print(f"  {r.name + mark:<22} x{r.ratio:.3f} dev/1k {r.deviations_per_1000}")
    out["robustness"] = robust

    # 6. promotion: passes robustness, the lower validation avg JCT at its margin; margin inf
    # (the base itself) when neither beats the base on the validation days
    def val_jct(a: str, margin: Any = None) -> float:
        c = learners[a]["margin"]
        key = f"margin-{c['margin'] if margin is None else margin}"
        return float(c["candidates"][key]["avg_jct_s"])

    passing = [a for a in learners if robust[a]["passed"]]
    # against margin inf on the same validation cases (the base itself)
    better = [a for a in passing if val_jct(a) < val_jct(a, "inf")]
    promoted = min(better, key=val_jct) if better else None
    out["promoted"] = {
        "learner": promoted or (passing[0] if passing else "bc"),
        "margin": learners[promoted]["margin"]["margin"] if promoted else "inf",
        "beats_base_on_validation": promoted is not None,
    }
    print(f"promoted: {out['promoted']}")

    # 7. the package (before the slow search policy)
    if args.ship is not None:
        ship(args.ship, out, learners, base, manifest)
        print(f"shipped {args.ship} {stamp()}")

    # 8. the search policy beside, on a subset of the held-out cases
    if args.lookahead and args.lookahead_cases > 0:
        sub = held_cases[: args.lookahead_cases]
        t = time.perf_counter()
        lb = run_benchmark(
            [
                PolicyRef("base", base.spec),
                PolicyRef("lookahead", PolicySpec.parse(args.lookahead)),
            ],
            sub,
            executor=args.bench_executor,
        )
        lrows = {r["policy"]: r for r in lb.summary()}
        la = lrows.get("lookahead", {})
        out["lookahead"] = {
            "spec": args.lookahead,
            "cases": [(c.window.window_id, c.seed) for c in sub],
            "seconds": time.perf_counter() - t,
            "avg_jct_s": la.get("avg_jct_s"),
            "base_avg_jct_s": lrows["base"]["avg_jct_s"],
            "ratio_to_base": (la["avg_jct_s"] / lrows["base"]["avg_jct_s"]) if la else None,
            "p99_jct_s": la.get("p99_jct_s"),
            "latency_ms_p99": la.get("latency_ms_p99"),
            "decision_points": la.get("decisions"),  # mean per case
        }
        print(f"lookahead on {len(sub)} cases: {out['lookahead']} {stamp()}")

    return out


def ship(
    dest: Path,
    out: dict[str, Any],
    learners: dict[str, Any],
    base: Any,
    manifest: dict[str, Any],
) -> None:
    """The promoted residual into ``dest`` (replaced), its ``policy.json`` recording how the
    base and margin were chosen and the held-out and robustness figures."""
    from linkwise.models.residual import Deferral, write_residual_package

    p = out["promoted"]
    algo, margin = p["learner"], p["margin"]
    c = learners[algo]
    # the deferral the promoted package was evaluated with (a DAgger round or the refit may
    # have given it labels of its own)
    meta = json.loads((Path(c["package"]) / "policy.json").read_text())
    deferral = Deferral.from_json(meta["residual"]["deferral"])
    chosen = {
        "base": base.to_json(),
        "margin": c["margin"],
        "learner": algo,
        "beats_base_on_validation": p["beats_base_on_validation"],
        "labels": {k: out["labels"][k] for k in ("hash", "rows", "points", "windows")},
        "refit_with_validation": {
            k: v
            for k, v in out["labels"].get("refit", {}).items()
            if k in ("hash", "rows", "points")
        },
        "label_seeds": out["labels"].get("seeds", [0]),
        "experiment": out["experiment"],
        "heldout": out["heldout"]["policies"],
        "robustness": out["robustness"][algo],
    }
    tmp = dest.with_name(dest.name + ".new")
    if tmp.exists():
        shutil.rmtree(tmp)
    write_residual_package(
        c["train"]["learned"],
        tmp,
        base=base.spec,
        margin=math.inf if margin == "inf" else float(margin),
        deferral=deferral,
        chosen=json.loads(json.dumps(chosen, default=str)),
    )
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def ship_from(results: Path, dest: Path) -> int:
    """Ship the promoted package of a finished run (its results JSON; the run's working
    folder must still hold its packages)."""
    from linkwise.pipelines.residual import BaseChoice
    from linkwise.policies.spec import PolicySpec

    out = json.loads(results.read_text())
    b = out["base"]
    base = BaseChoice(
        PolicySpec.parse(str(b["base"])), float(b["avg_jct_s"]), dict(b["candidates"])
    )
    ship(dest, out, out["learners"], base, {})
    print(f"shipped {dest} from {results}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--experiment", default="philly-multigpu", choices=("philly-multigpu", "philly-all")
    )
    p.add_argument("--trace", type=Path, help="the trace (default: the shared Philly slice)")
    p.add_argument("--work", type=Path, help="working folder (default: a fresh temporary one)")
    p.add_argument("--cluster", help="a cluster spec in place of the experiment's")
    p.add_argument("--flexible", type=float, help="replay this share of multi-GPU jobs as flexible")
    p.add_argument("--heldout-windows", type=int, help="the first N held-out windows only")
    p.add_argument(
        "--base-candidates",
        help="';'-separated base candidates (default: every same-information heuristic)",
    )
    p.add_argument(
        "--out", type=Path, help="default: benchmarks/results/residual_headline_EXP.json"
    )
    p.add_argument(
        "--base-from",
        type=Path,
        help="a frontier.json of the same setting: its validation choice as the base",
    )
    p.add_argument("--label-windows", type=int, default=10)
    p.add_argument("--points", type=int, default=6)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--alternatives", type=int, default=5)
    p.add_argument("--horizon-h", type=float, default=4.0)
    p.add_argument("--running-slots", type=int, default=2, help="running rows (preempt/migrate)")
    p.add_argument("--cold-labels", action="store_true", help="label windows from an empty cluster")
    p.add_argument(
        "--terminal", action="store_true", help="labels add the fork's terminal cost (LabelTask)"
    )
    p.add_argument("--label-seeds", default="0", help="resampling seeds of each label window")
    p.add_argument(
        "--refit-with-validation",
        action="store_true",
        help="after the margins are chosen, retrain on the training and validation days' labels",
    )
    p.add_argument("--dagger-rounds", type=int, default=0, help="DAgger rounds")
    p.add_argument("--dagger-learner", choices=("bc", "cql"), default="bc")
    p.add_argument("--dagger-seeds", default="0", help="resampling seeds of a DAgger round")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--learners", default="bc,cql", help="comma-separated: bc, cql")
    p.add_argument("--skip-robustness", action="store_true", help="no robustness cases (budget)")
    p.add_argument("--margins", help="comma-separated margins (default: inf,2,1,0.5,0.25)")
    p.add_argument("--executor", default="local:2", help="labelling executor")
    p.add_argument("--bench-executor", default="serial", help="benchmark executor")
    p.add_argument("--labels", type=Path, help="reuse this label set (same setting and base)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--val-seeds", default="0,1,2")
    p.add_argument("--lookahead", default="lookahead:base=qssf_preemptive,horizon=6h,n=6")
    p.add_argument("--lookahead-cases", type=int, default=1, help="0: skip the search policy")
    p.add_argument("--tracking-uri", help="MLflow (default: sqlite in the working folder)")
    p.add_argument("--ship", type=Path, help="write the promoted package here (replaced)")
    p.add_argument(
        "--ship-from",
        type=Path,
        help="a finished run's results JSON: ship its promoted package to --ship, run nothing",
    )
    args = p.parse_args()
    if args.ship_from is not None:
        if args.ship is None:
            p.error("--ship-from needs --ship DIR")
        return ship_from(args.ship_from, args.ship)
    t0 = time.perf_counter()
    result = run(args, t0)
    result["wall_s"] = time.perf_counter() - t0
    result["argv"] = sys.argv
    result["load_average"] = os.getloadavg()
    path = args.out or Path(f"benchmarks/results/residual_headline_{args.experiment}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path} [{result['wall_s']:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
