"""Run the headline pipeline on one of the honest benchmark's settings (issue 15).

``philly-all`` or ``philly-multigpu`` (``pipelines/experiment.py``) on the Philly slice: the
history replayed under backfill, the dataset and the run-time predictor from the first five
weeks, BC, CQL and MaskablePPO trained, every heuristic, QSSF and the oracle ceilings
evaluated on the held-out last week (3 seeds), the gate. Writes the run into ``--out`` and
``--out/result.json`` (the demo's result plus the wall time).

    nice .venv/bin/python benchmarks/headline_settings.py --experiment philly-all --out /tmp/h-all
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
    args = p.parse_args()

    from dataclasses import replace

    from linkwise.pipelines.experiment import get_experiment
    from linkwise.pipelines.headline import run_headline

    experiment = get_experiment(args.experiment)
    if args.ppo_steps is not None and experiment.training is not None:
        experiment = replace(
            experiment, training=replace(experiment.training, ppo_steps=args.ppo_steps)
        )
    t0 = time.perf_counter()
    result = run_headline(
        args.trace, args.out, experiment=experiment, seed=args.seed, progress=False
    )
    out = {**result.to_json(), "wall_s": time.perf_counter() - t0, "argv": sys.argv}
    (args.out / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    for row in result.table:
        print(json.dumps(row, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
