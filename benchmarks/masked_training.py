"""Masked vs unmasked training (issue 16, item 3): BC and CQL trained on the same dataset with
and without action masks (``[train] masked``), compared on held-out action agreement and in
the simulator on held-out windows of the same trace. Results: ``benchmarks/masked_training.md``.

    .venv/bin/python benchmarks/masked_training.py --out /tmp/masked-bench

The dataset is ``models/experiments/cql.toml``'s (rollouts of best_fit, SJF-BCO and backfill,
with and without exploration, on the real Philly arrivals, K=4) on a small cluster and
longer windows (default 2x8, 3 hours: queues form, so the heuristics differ); the
hyperparameters are ``bc.toml``'s and ``cql.toml``'s with the steps given here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from small_dataset import REPO, build, evaluate_on_heldout  # benchmarks/ is the script's folder


def train_one(
    algo: str, masked: bool, seed: int, steps: int, dataset: str, out: Path, alpha: float | None
) -> dict[str, Any]:
    from linkwise.models.training import DatasetConfig, TrainConfig
    from linkwise.pipelines.train import train

    base = TrainConfig.from_toml(REPO / "models" / "experiments" / f"{algo}.toml")
    per_epoch = min(base.params.n_steps_per_epoch, steps)
    params = base.params if alpha is None else dataclasses.replace(base.params, alpha=alpha)
    tag = "" if alpha is None else f"-a{alpha:g}"
    cfg = dataclasses.replace(
        base,
        name=f"{algo}{tag}-{'masked' if masked else 'plain'}-s{seed}",
        seed=seed,
        device="cpu",
        dataset=DatasetConfig(path=dataset, holdout=0.25),
        params=dataclasses.replace(
            params, masked=masked, n_steps=steps, n_steps_per_epoch=per_epoch
        ),
    )
    r = train(cfg, tracking_uri=f"sqlite:///{out / 'mlflow.db'}", out_dir=out / "train",
              register=False, progress=False)  # fmt: skip
    return {"name": cfg.name, "algo": algo, "masked": masked, "seed": seed,
            "package": r.package_dir, "metrics": r.metrics}  # fmt: skip


def leak(package: str, dataset: str) -> dict[str, float]:
    """What the impossible actions do in a trained package, on every state of the dataset:
    the share of states whose unmasked best action is disallowed; for Q-values, the mean
    excess of the best value over all actions over the best allowed one (what an unmasked
    max/argmax adds to a target); for BC, the mean probability on disallowed actions."""
    import numpy as np

    from linkwise.datasets.export import read_dataset
    from linkwise.models.learned import load_package
    from linkwise.models.training import frame_arrays

    df, _ = read_dataset(dataset)
    pkg = load_package(package)
    obs, masks, _ = frame_arrays(df, pkg.spec)
    values = pkg.action_values(obs).astype(np.float64)
    best_allowed = np.where(masks, values, -np.inf).max(axis=1)
    out = {"greedy_disallowed": float(np.mean(~masks[np.arange(len(obs)), values.argmax(axis=1)]))}
    if pkg.values == "q":
        out["max_excess"] = float(np.mean(values.max(axis=1) - best_allowed))
    else:
        out["p_disallowed"] = float(np.mean(np.where(masks, 0.0, np.exp(values)).sum(axis=1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="/tmp/masked-bench")
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--cluster", default="2x8", help="topology (small: queues form)")
    ap.add_argument("--window", type=float, default=3 * 3600.0, help="window length, s")
    ap.add_argument("--bc-steps", type=int, default=1000)
    ap.add_argument("--cql-steps", type=int, default=1500)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--eval-seeds", default="0,1")
    ap.add_argument("--algos", default="bc,cql")
    ap.add_argument("--alphas", default="", help="CQL alphas to sweep (default: cql.toml's)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest = build(out, args.rollouts, args.cluster, args.window)
    counts = manifest["counts"]
    took = time.perf_counter() - t0
    print(f"dataset {manifest['hash'][:16]}: {counts['transitions']} transitions, "
          f"{counts['episodes']} episodes ({took:.0f} s)")  # fmt: skip
    runs = []
    alphas: list[float | None] = [float(a) for a in args.alphas.split(",") if a] or [None]
    plan = [("bc", args.bc_steps, None)] if "bc" in args.algos.split(",") else []
    if "cql" in args.algos.split(","):
        plan += [("cql", args.cql_steps, a) for a in alphas]
    for algo, steps, alpha in plan:
        for masked in (True, False):
            for seed in (int(s) for s in args.seeds.split(",")):
                t = time.perf_counter()
                runs.append(train_one(algo, masked, seed, steps, manifest["path"], out, alpha))
                m = runs[-1]["metrics"]
                match = m.get("heldout_action_match", float("nan"))
                choice = m.get("heldout_choice_match", float("nan"))
                took = time.perf_counter() - t
                print(f"{runs[-1]['name']}: match {match:.3f} choice {choice:.3f} "
                      f"{m['steps_per_s']:.0f} steps/s ({took:.0f} s)")  # fmt: skip
    for r in runs:
        r["leak"] = leak(r["package"], manifest["path"])
    (out / "runs.json").write_text(json.dumps(runs, indent=2))

    models = {f"model:{r['package']}": r["name"] for r in runs}
    report = evaluate_on_heldout(
        ["best_fit", "sjf_bco", "backfill", "fifo", "random", *models],
        manifest,
        out,
        cluster=args.cluster,
        window_s=args.window,
        n_windows=args.eval_windows,
        seeds=[int(s) for s in args.eval_seeds.split(",")],
    )
    result = {"dataset": {k: manifest[k] for k in ("hash", "counts", "path")}, "runs": runs,
              "models": models, "evaluation": report.to_json()}  # fmt: skip
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"total {time.perf_counter() - t0:.0f} s; {out / 'result.json'}")


if __name__ == "__main__":
    main()
