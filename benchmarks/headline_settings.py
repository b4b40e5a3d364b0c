"""Run the headline pipeline on one of the honest benchmark's settings (issue 15).

``philly-all`` or ``philly-multigpu`` (``pipelines/experiment.py``) on the Philly slice: the
history replayed under backfill, the dataset and the run-time predictor from the first five
weeks, BC, CQL and MaskablePPO trained, every heuristic, QSSF and the oracle ceilings
evaluated on the held-out last week (3 seeds), the gate. Writes the run into ``--out`` and
``--out/result.json`` (the demo's result, the wall time and the training plan it ran with).
The training knobs of the experiment's ``TrainingPlan`` can be overridden: steps, the CQL
alpha sweep, training seeds, validation windows (checkpoint selection) and ``[train]`` keys.

    nice .venv/bin/python benchmarks/headline_settings.py --experiment philly-all --out /tmp/h-all
    nice .venv/bin/python benchmarks/headline_settings.py --experiment philly-all --out /tmp/h-sel \
        --validation-windows 7 --alphas 0.1,0.5,1 --train-seeds 0,1 --train discount=0.95
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--experiment", choices=("philly-all", "philly-multigpu"), required=True)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0, help="training and rollout seed")
    p.add_argument("--ppo-steps", type=int, help="MaskablePPO timesteps (0: not trained)")
    p.add_argument("--bc-steps", type=int, help="BC steps")
    p.add_argument("--cql-steps", type=int, help="CQL steps")
    p.add_argument("--steps-per-epoch", type=int, help="steps per epoch (and per checkpoint)")
    p.add_argument("--alphas", type=_floats, help="CQL alpha sweep, e.g. 0.1,0.5,1")
    p.add_argument("--train-seeds", type=_ints, help="training seed offsets, e.g. 0,1,2")
    p.add_argument(
        "--validation-windows",
        type=int,
        help="last training windows that choose the checkpoint (left out of the dataset)",
    )
    p.add_argument(
        "--train",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [train] override of both TOMLs (a TOML value: 0.95, true, [64, 64], 'mlp')",
    )
    p.add_argument(
        "--ship",
        type=Path,
        metavar="DIR",
        help="copy the promoted CQL package into DIR (models/pretrained/SETTING), replacing it",
    )
    args = p.parse_args()

    from dataclasses import asdict, replace

    from linkwise.pipelines.experiment import get_experiment
    from linkwise.pipelines.headline import run_headline

    experiment = get_experiment(args.experiment)
    assert experiment.training is not None
    knobs = {
        "ppo_steps": args.ppo_steps,
        "bc_steps": args.bc_steps,
        "cql_steps": args.cql_steps,
        "steps_per_epoch": args.steps_per_epoch,
        "cql_alphas": args.alphas,
        "train_seeds": args.train_seeds,
        "validation_windows": args.validation_windows,
        "train": {**experiment.training.train, **_overrides(args.train)} if args.train else None,
    }
    training = replace(experiment.training, **{k: v for k, v in knobs.items() if v is not None})
    experiment = replace(experiment, training=training)
    t0 = time.perf_counter()
    result = run_headline(
        args.trace, args.out, experiment=experiment, seed=args.seed, progress=False
    )
    out = {
        **result.to_json(),
        "wall_s": time.perf_counter() - t0,
        "argv": sys.argv,
        "training_plan": asdict(training),
    }
    (args.out / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    for row in result.table:
        print(json.dumps(row, default=str))
    if args.ship is not None:
        import shutil

        shutil.rmtree(args.ship, ignore_errors=True)
        shutil.copytree(result.models["cql"]["package_dir"], args.ship)
        print(f"shipped the promoted CQL package to {args.ship}")
    return 0


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _overrides(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs, each value read as TOML."""
    import tomllib

    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--train {item!r}: expected KEY=VALUE")
        out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
    return out


if __name__ == "__main__":
    sys.exit(main())
