"""Why a residual package stands with its base: its deferrals by reason (``topology``, ``range``,
``support``; ``models.residual.Deferral``) and deviations, summed over a headline setting's
warm-started validation and held-out windows (seed 0).

    .venv/bin/python benchmarks/residual_deferrals.py PACKAGE [--experiment philly-multigpu]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frontier import headline_setting, warm_cases

import linkwise.evaluation.benchmark as bm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("package", type=Path)
    p.add_argument("--experiment", default="philly-multigpu")
    p.add_argument("--work", type=Path, default=Path("/tmp/residual-deferrals"))
    args = p.parse_args()
    seen: list[dict[str, float]] = []
    original = bm._deviations

    def spy(policy: object) -> float | None:  # the policy's counters after each case
        stats = getattr(policy, "stats", None)
        seen.append(stats() if callable(stats) else {})
        return original(policy)  # type: ignore[arg-type]

    bm._deviations = spy
    s = headline_setting(args.experiment, None, args.work)
    for name, windows in (("validation", s.validation), ("heldout", s.heldout)):
        total: dict[str, float] = {}
        for case in warm_cases(s, windows, [0]):
            seen.clear()
            ref = bm.PolicyRef("residual", f"model:{args.package}")
            bm.run_task(bm.BenchTask(ref, case, None))
            for k, v in seen[0].items():
                if k != "deviations_per_1000":
                    total[k] = total.get(k, 0.0) + v
        print(name, json.dumps(total))


if __name__ == "__main__":
    main()
