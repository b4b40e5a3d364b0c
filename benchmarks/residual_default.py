"""The residual policy on the embedded default (issue 23 items 1, 3, 5): base chosen on the
validation days, counterfactual labels under it, BC and CQL on them, the margin chosen on
the validation days, the held-out days against the base, the robustness cases.

The embedded default is ``make demo``'s setting (``pipelines.experiment.DEMO_FULL``: the
synthetic Philly-like workload, daily windows; since issue 23 item 6 3,000 jobs at load 0.28
on ``16x8,leaf=4,oversub=2``, and ``benchmarks/residual.md`` was run at the former 0.22 on
``16x8,leaf=4``); the demo itself runs the recipe warm-started (``pipelines.demo_residual``);
the last three days are evaluated, the two before them validate, the labels come from the
days before those. Windows start from an empty cluster (no warm start: a synthetic
workload has no accounting). Writes ``benchmarks/results/residual_default.json``.

    nice .venv/bin/python benchmarks/residual_default.py [--points 6 --n 2 --horizon-h 3]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, read_labels, run_labels, write_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.evaluation.benchmark import PolicyRef, make_cases, run_benchmark
from linkwise.evaluation.gates import check_robustness
from linkwise.models.residual import topology_signature
from linkwise.models.training import AlgoConfig
from linkwise.pipelines.experiment import DEMO_FULL, DEMO_MULTIGPU, SyntheticWorkload
from linkwise.pipelines.residual import (
    choose_base,
    choose_margin,
    label_deferral,
    robustness,
    robustness_topologies,
    train_on_labels,
)
from linkwise.policies.spec import PolicySpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label-windows", type=int, default=6)
    p.add_argument("--points", type=int, default=6)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--alternatives", type=int, default=5)
    p.add_argument("--horizon-h", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--executor", default="local:2")
    p.add_argument("--labels", type=Path, help="reuse this label set (same setting)")
    p.add_argument(
        "--setting",
        choices=("default", "multigpu", "busy"),
        default="default",
        help="the embedded default, or its multi-GPU-heavy oversubscribed variant",
    )
    p.add_argument("--out", type=Path, help="default: benchmarks/results/residual_SETTING.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    exp = DEMO_FULL if args.setting == "default" else DEMO_MULTIGPU
    if args.setting == "busy":  # the multi-GPU variant busy enough to queue without a backlog
        exp = replace(DEMO_MULTIGPU, name="busy-multigpu",
                      workload=SyntheticWorkload(jobs=40000, load_scale=2.5))  # fmt: skip
    out_path = args.out or Path(f"benchmarks/results/residual_{args.setting}.json")
    topo = from_spec(exp.topology)
    cfg = MdpConfig(k_slots=8, slot_order="mixed",
                    generators=("bounded", "least_contention", "best_fit"))  # fmt: skip
    jobs = synthetic.generate(exp.workload.jobs, seed=0, load_scale=exp.workload.load_scale,
                              max_gpus=topo.total_gpus)  # fmt: skip
    jobs = tuple(j for j in jobs if j.num_gpus >= exp.min_gpus)
    windows = cut_windows(jobs_frame(jobs), exp.windows.window_s, max_gpus=topo.total_gpus,
                          min_jobs=exp.windows.min_jobs)  # fmt: skip
    held, val, train = windows[-3:], windows[-5:-3], windows[:-5]
    predictor = RuntimePredictor.fit(jobs, until=val[0].start)
    val_cases = make_cases(val, (0,), topo, predictor=predictor, block_s=exp.windows.block_s)
    out: dict[str, Any] = {"setting": exp.name, "topology": exp.topology, "jobs": len(jobs),
                           "windows": {"train": len(train), "validation": len(val),
                                       "heldout": len(held)}}  # fmt: skip

    base = choose_base(val_cases)
    out["base"] = base.to_json()
    print(f"base {base.spec} ({base.avg_jct_s / 3600:.2f} h) [{time.perf_counter() - t0:.0f} s]")
    for k, v in sorted(base.figures.items(), key=lambda kv: kv[1] or math.inf):
        print(f"  {k:<24} {'-' if v is None else f'{v / 3600:.2f} h'}")

    belief = AnalyticModel(load_calibration(None))
    base_policy = base.spec.build(belief)
    tasks = [
        LabelTask(
            base=base_policy,
            base_name=base.spec,
            window=w,
            topology=topo,
            seed=0,
            config=cfg,
            predictor=predictor,
            block_s=exp.windows.block_s,
            horizon_s=args.horizon_h * 3600.0,
            n=args.n,
            points=args.points,
            alternatives=args.alternatives,
        )
        for w in train[-args.label_windows :]
    ]
    t = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="linkwise-residual-"))
    if args.labels is not None:  # a label set of an earlier run of the same setting
        labels, _ = read_labels(args.labels)
    else:
        labels = run_labels(tasks, args.executor)
    label_s = time.perf_counter() - t
    manifest = write_labels(labels, cfg, {"base": base.spec, "horizon_s": args.horizon_h * 3600,
                                          "n": args.n}, tmp / "labels")  # fmt: skip
    points = labels.select("episode", "point").unique().height
    better = manifest["counts"]["points_with_a_better_move"]
    out["labels"] = {"rows": labels.height, "points": points, "points_with_a_better_move": better,
                     "seconds": label_s, "hash": manifest["hash"]}  # fmt: skip
    print(f"labels {labels.height} rows at {points} points ({better} with a better move) "
          f"in {label_s:.0f} s")  # fmt: skip

    spec_sig = [topology_signature(topo)]
    from linkwise.cluster.mdp import make_spec

    deferral = label_deferral(labels, make_spec(cfg), spec_sig, min_support=3)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    params = AlgoConfig(n_steps=args.steps, n_steps_per_epoch=args.steps, batch_size=64,
                        hidden_units=(128, 128), alpha=1.0, gamma=0.0,
                        target_update_interval=100)  # fmt: skip
    chosen: dict[str, Any] = {}
    for algo in ("bc", "cql"):
        r = train_on_labels(labels, manifest, algo, params, tmp / "pkgs", predictor=predictor,
                            tracking_uri=uri)  # fmt: skip
        m = choose_margin(r.package_dir, base, deferral, val_cases, tmp / f"res-{algo}")
        chosen[algo] = {"train": {"label_match": r.label_match, "steps_per_s": r.steps_per_s,
                                  "transitions": r.transitions, "run_id": r.run_id},
                        "margin": m.to_json(), "package": m.package_dir}  # fmt: skip
        print(f"{algo}: label match {r.label_match:.2f}, margin {m.margin} "
              f"[{time.perf_counter() - t0:.0f} s]")  # fmt: skip
        for k, f in m.figures.items():
            jct = f["avg_jct_s"]
            print(f"  {k:<14} {'-' if jct is None else f'{jct / 3600:.3f} h'} "
                  f"dev/1k {f['deviations_per_1000']}")  # fmt: skip
    out["learners"] = chosen

    held_cases = make_cases(held, (0, 1, 2), topo, predictor=predictor,
                            block_s=exp.windows.block_s)  # fmt: skip
    refs = [PolicyRef("base", base.spec)] + [
        PolicyRef(f"residual-{a}", PolicySpec.parse(f"model:{c['package']}"))
        for a, c in chosen.items()
    ]
    bench = run_benchmark(refs, held_cases)
    rows = {r["policy"]: r for r in bench.summary()}
    out["heldout"] = {
        k: {
            "avg_jct_s": r["avg_jct_s"],
            "p99_jct_s": r.get("p99_jct_s"),
            "deviations_per_1000": r.get("deviations_per_1000"),
            "ratio_to_base": r["avg_jct_s"] / rows["base"]["avg_jct_s"],
        }
        for k, r in rows.items()
    }
    print("held-out days (3 windows x 3 seeds):")
    for k, v in out["heldout"].items():
        print(f"  {k:<14} {v['avg_jct_s'] / 3600:.3f} h  x{v['ratio_to_base']:.3f}  "
              f"dev/1k {v['deviations_per_1000']}")  # fmt: skip

    topos = robustness_topologies(exp.topology)
    robust: dict[str, Any] = {}
    for algo, c in chosen.items():
        rc = robustness(c["package"], base.spec, topos, held[:1], (0,), predictor=predictor,
                        trained=spec_sig)  # fmt: skip
        off = {r.name: (r.avg_jct_s, r.base_avg_jct_s) for r in rc if not r.trained_on}
        report = check_robustness(algo, off)
        robust[algo] = {"cases": [r.to_json() for r in rc], "passed": report.passed}
        print(f"robustness {algo}: {'PASSED' if report.passed else 'REFUSED'}")
        for r in rc:
            print(f"  {r.name:<16} x{r.ratio:.3f} dev/1k {r.deviations_per_1000}")
    out["robustness"] = robust
    # promoted: the learner whose residual passes the robustness gate with the lower validation
    # avg JCT at its chosen margin (ties: BC, listed first)
    passing = [a for a in chosen if robust[a]["passed"]]
    val_jct = {
        a: chosen[a]["margin"]["candidates"][f"margin-{chosen[a]['margin']['margin']}"]["avg_jct_s"]
        for a in passing
    }
    out["promoted"] = min(passing, key=lambda a: val_jct[a]) if passing else None
    print(f"promoted: {out['promoted']}")
    out["seconds"] = time.perf_counter() - t0
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {out_path} [{out['seconds']:.0f} s]")


if __name__ == "__main__":
    main()
