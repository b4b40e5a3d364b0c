"""The teacher as a policy on a headline setting's days: the lookahead search policy
(``policies.lookahead``) against its base on warm-started validation (or held-out) windows,
the frontier's cases (``frontier.headline_setting``, ``warm_cases``). Its ratio to the base
is the headroom the counterfactual labels can teach at best (issue 23 item 2: "its result is
the teacher's headroom"). Progress (decision points, searched points, seconds) goes to
stderr; the figures to ``--out`` as JSON.

    nice -n 5 .venv/bin/python benchmarks/lookahead_days.py --experiment philly-multigpu \\
        --part validation --windows 1 --spec lookahead:base=qssf_preemptive,horizon=2h,n=2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontier import headline_setting, warm_cases, with_flexible_windows

from linkwise.policies.spec import PolicySpec

HOUR = 3600.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import linkwise.policies.lookahead as la
    from linkwise.evaluation.benchmark import PolicyRef, run_benchmark

    s = headline_setting(args.experiment, None, args.work, cluster=args.cluster)
    if args.flexible is not None:
        s = with_flexible_windows(s, args.flexible)
    windows = (s.validation if args.part == "validation" else s.heldout)[: args.windows]
    seeds = [int(x) for x in args.seeds.split(",")]
    cases = warm_cases(s, windows, seeds)
    t0 = time.perf_counter()
    decide = la.Lookahead.decide

    def progress(self: Any, state: Any) -> Any:  # a line every 100 decision points
        if self.decisions % 100 == 0:
            print(
                f"  [{time.perf_counter() - t0:.0f} s] t={state.time / HOUR:.1f} h "
                f"decisions {self.decisions} searched {self.searched} "
                f"deviations {self.deviations}",
                file=sys.stderr,
                flush=True,
            )
        return decide(self, state)

    la.Lookahead.decide = progress  # type: ignore[method-assign]
    base = args.spec.split("base=", 1)[1].split(",", 1)[0]
    refs = [
        PolicyRef("base", PolicySpec.parse(base)),
        PolicyRef("lookahead", PolicySpec.parse(args.spec)),
    ]
    bench = run_benchmark(refs, cases, executor="serial")
    rows = {r["policy"]: r for r in bench.summary()}
    b, lk = rows["base"], rows["lookahead"]
    return {
        "experiment": args.experiment,
        "cluster": s.experiment.topology,
        "flexible_share": args.flexible,
        "part": args.part,
        "windows": [w.window_id for w in windows],
        "seeds": seeds,
        "spec": args.spec,
        "base": base,
        "base_avg_jct_s": b["avg_jct_s"],
        "lookahead_avg_jct_s": lk["avg_jct_s"],
        "ratio_to_base": lk["avg_jct_s"] / b["avg_jct_s"],
        "base_p99_jct_s": b.get("p99_jct_s"),
        "lookahead_p99_jct_s": lk.get("p99_jct_s"),
        "decision_points": lk.get("decisions"),  # mean per case
        "deviations_per_1000": lk.get("deviations_per_1000"),
        "latency_ms_p99": lk.get("latency_ms_p99"),
        "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--experiment", default="philly-multigpu", choices=("philly-multigpu", "philly-all")
    )
    p.add_argument("--part", default="validation", choices=("validation", "heldout"))
    p.add_argument("--windows", type=int, default=1, help="the first N windows of the part")
    p.add_argument("--seeds", default="0")
    p.add_argument("--spec", default="lookahead:base=qssf_preemptive,horizon=2h,n=2")
    p.add_argument("--work", type=Path, default=Path("/tmp/lookahead-days"))
    p.add_argument("--cluster", help="a cluster spec in place of the experiment's")
    p.add_argument("--flexible", type=float, help="replay this share of multi-GPU jobs as flexible")
    p.add_argument("--out", type=Path, help="default: benchmarks/results/lookahead_days.json")
    args = p.parse_args()
    result = run(args)
    result["argv"] = sys.argv
    result["load_average"] = os.getloadavg()
    out = args.out or Path("benchmarks/results/lookahead_days.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
