"""Credit over hours (issue 16, item 4): masked CQL trained on one dataset with (a) gamma 0.99
per step (today), (b) a time-aware discount (``gamma_h`` per hour of simulated time), (c) (b)
with n-step returns, (d) (c) with the episode-mean reward baseline (``datasets.credit``);
same seeds, steps and split; each learned policy's average JCT in the simulator on held-out
windows of the trace. Results: ``benchmarks/credit_ablation.md``.

    nice -n 10 .venv/bin/python benchmarks/credit_ablation.py --out /tmp/credit-bench

The dataset and evaluation are ``benchmarks/masked_training.py``'s (``cql.toml``'s rollouts
of best_fit, SJF-BCO and backfill, with and without exploration, on the real Philly arrivals,
a 2x8 cluster, 3-hour windows); the hyperparameters are ``cql.toml``'s with the steps here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from small_dataset import REPO, build, evaluate_on_heldout  # benchmarks/ is the script's folder


def variants(gamma_h: float, horizon_s: float, n_step: int) -> dict[str, dict[str, Any]]:
    """The four settings: name -> AlgoConfig fields."""
    time_ = {"discount": "time", "gamma": gamma_h, "horizon_s": horizon_s}
    return {
        "a-step": {"discount": "step", "gamma": 0.99},
        "b-time": time_,
        "c-time-n": {**time_, "n_step": n_step},
        "d-time-n-base": {**time_, "n_step": n_step, "reward_baseline": "episode_mean"},
    }


def train_one(
    name: str, fields: dict[str, Any], seed: int, steps: int, dataset: str, out: Path
) -> dict[str, Any]:
    from linkwise.models.training import DatasetConfig, TrainConfig
    from linkwise.pipelines.train import train

    base = TrainConfig.from_toml(REPO / "models" / "experiments" / "cql.toml")
    per_epoch = min(base.params.n_steps_per_epoch, steps)
    params = dataclasses.replace(base.params, n_steps=steps, n_steps_per_epoch=per_epoch, **fields)
    cfg = dataclasses.replace(
        base,
        name=f"cql-{name}-s{seed}",
        seed=seed,
        device="cpu",
        dataset=DatasetConfig(path=dataset, holdout=0.25),
        params=params,
    )
    r = train(cfg, tracking_uri=f"sqlite:///{out / 'mlflow.db'}", out_dir=out / "train",
              register=False, progress=False)  # fmt: skip
    return {"name": cfg.name, "variant": name, "seed": seed, "fields": fields,
            "package": r.package_dir, "metrics": r.metrics}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="/tmp/credit-bench")
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--cluster", default="2x8", help="topology (small: queues form)")
    ap.add_argument("--window", type=float, default=3 * 3600.0, help="window length, s")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--gamma-h", type=float, default=0.7, help="time discount per horizon")
    ap.add_argument("--horizon", type=float, default=3600.0, help="the discount's unit, s")
    ap.add_argument("--n-step", type=int, default=8)
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--eval-seeds", default="0,1")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest = build(out, args.rollouts, args.cluster, args.window)
    counts = manifest["counts"]
    print(f"dataset {manifest['hash'][:16]}: {counts['transitions']} transitions, "
          f"{counts['episodes']} episodes ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    runs = []
    for name, fields in variants(args.gamma_h, args.horizon, args.n_step).items():
        for seed in (int(s) for s in args.seeds.split(",")):
            t = time.perf_counter()
            runs.append(train_one(name, fields, seed, args.steps, manifest["path"], out))
            m = runs[-1]["metrics"]
            print(f"{runs[-1]['name']}: match {m.get('heldout_action_match', float('nan')):.3f} "
                  f"choice {m.get('heldout_choice_match', float('nan')):.3f} "
                  f"({time.perf_counter() - t:.0f} s)")  # fmt: skip
    (out / "runs.json").write_text(json.dumps(runs, indent=2, default=str))

    from linkwise.pipelines.evaluate import format_evaluation

    models = {f"model:{r['package']}": r["name"] for r in runs}
    report = evaluate_on_heldout(
        ["best_fit", "backfill", *models],
        manifest,
        out,
        cluster=args.cluster,
        window_s=args.window,
        n_windows=args.eval_windows,
        seeds=[int(s) for s in args.eval_seeds.split(",")],
    )
    print(format_evaluation(report, None))
    print("models:", json.dumps(models, indent=1))
    result = {"dataset": {k: manifest[k] for k in ("hash", "counts", "path")}, "runs": runs,
              "models": models, "evaluation": report.to_json(), "args": vars(args)}  # fmt: skip
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"total {time.perf_counter() - t0:.0f} s; {out / 'result.json'}")


if __name__ == "__main__":
    main()
