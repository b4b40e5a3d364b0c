"""Why a residual package stands with its base: its deferrals by reason (``topology``, ``range``,
``support``; ``models.residual.Deferral``) and deviations, summed over a headline setting's
warm-started validation and held-out windows (seed 0). ``--features``: for the range rule,
how many features lie outside their training range at each decision point, the features
most often outside, and those features' training range against the days' quantiles.

    .venv/bin/python benchmarks/residual_deferrals.py PACKAGE [--experiment philly-multigpu] \\
        [--features]
"""

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frontier import headline_setting, warm_cases

import linkwise.evaluation.benchmark as bm
import linkwise.models.residual as res
from linkwise.policies.spec import PolicySpec


def _features(names: list[str], seen: list[tuple[Any, np.ndarray]], top: int) -> dict[str, Any]:
    """Counts of features outside the range per decision point, the most frequent ones,
    and their training range against the quantiles of the days' values."""
    rule = seen[0][0]
    lo = np.asarray(rule.feature_lo) - rule.tolerance
    hi = np.asarray(rule.feature_hi) + rule.tolerance
    x = np.stack([obs for _, obs in seen])
    out = (x < lo) | (x > hi)
    per_point = collections.Counter(int(k) for k in out.sum(axis=1))
    counts = out.sum(axis=0)
    order = np.argsort(-counts)[:top]
    return {
        "points": int(x.shape[0]),
        "outside_per_point": {str(k): per_point[k] for k in sorted(per_point)},
        "most_often_outside": [
            {
                "feature": names[i],
                "points": int(counts[i]),
                "training_range": [rule.feature_lo[i], rule.feature_hi[i]],
                "quantiles_50_90_99": [float(q) for q in np.quantile(x[:, i], [0.5, 0.9, 0.99])],
            }
            for i in order
            if counts[i] > 0
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("package", type=Path)
    p.add_argument("--experiment", default="philly-multigpu")
    p.add_argument("--work", type=Path, default=Path("/tmp/residual-deferrals"))
    p.add_argument("--features", action="store_true", help="which features the range rule hits")
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args()
    seen: list[dict[str, float]] = []
    original = bm._deviations
    observed: list[tuple[Any, np.ndarray]] = []
    reason = res.Deferral.obs_reason

    def spy(policy: object) -> float | None:  # the policy's counters after each case
        stats = getattr(policy, "stats", None)
        seen.append(stats() if callable(stats) else {})
        return original(policy)  # type: ignore[arg-type]

    def watch(self: res.Deferral, obs: np.ndarray) -> str:  # every observation ranged
        observed.append((self, np.asarray(obs, dtype=np.float64).reshape(-1)))
        return reason(self, obs)

    bm._deviations = spy
    if args.features:
        res.Deferral.obs_reason = watch  # type: ignore[method-assign]
    names = json.loads((args.package / "obs_spec.json").read_text())["feature_names"]
    s = headline_setting(args.experiment, None, args.work)
    for name, windows in (("validation", s.validation), ("heldout", s.heldout)):
        total: dict[str, float] = {}
        observed.clear()
        for case in warm_cases(s, windows, [0]):
            seen.clear()
            ref = bm.PolicyRef("residual", PolicySpec.parse(f"model:{args.package}"))
            bm.run_task(bm.BenchTask(ref, case, None))
            for k, v in seen[0].items():
                if k != "deviations_per_1000":
                    total[k] = total.get(k, 0.0) + v
        print(name, json.dumps(total))
        if observed:
            print(name, "features", json.dumps(_features(names, observed, args.top), indent=1))


if __name__ == "__main__":
    main()
