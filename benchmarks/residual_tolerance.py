"""A residual's range rule against looser ones: the same network, base and margin, the
feature-range tolerance of its deferral widened (``models.residual.Deferral.tolerance``) or
some features allowed outside their range (``Deferral.max_out``),
on a headline setting's warm-started validation and held-out days (3 seeds), avg JCT as a
ratio to the base and deviations per 1,000 decisions. A diagnostic: the validation days
choose; the held-out figures are for the record.

    .venv/bin/python benchmarks/residual_tolerance.py RESIDUAL LEARNED --tolerances 0.05,0.5,2 \\
        --max-out 0,1
"""

import argparse
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frontier import headline_setting, warm_cases

from linkwise.evaluation.benchmark import PolicyRef, run_benchmark
from linkwise.models.residual import Deferral, write_residual_package
from linkwise.policies.spec import PolicySpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("residual", type=Path, help="a residual package (its base, margin, deferral)")
    p.add_argument("learned", type=Path, help="the learned package it was written from")
    p.add_argument("--experiment", default="philly-multigpu")
    p.add_argument("--tolerances", default="0.05,0.5,2")
    p.add_argument("--max-out", default="0", help="features allowed outside their range")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--work", type=Path, default=Path("/tmp/residual-tolerance"))
    args = p.parse_args()
    res = json.loads((args.residual / "policy.json").read_text())["residual"]
    deferral = Deferral.from_json(res["deferral"])
    refs = [PolicyRef("base", PolicySpec.parse(res["base"]))]
    tolerances = [float(t) for t in args.tolerances.split(",")]
    max_outs = [int(k) for k in args.max_out.split(",")]
    for tol, k in itertools.product(tolerances, max_outs):
        name = f"tolerance-{tol}" + (f"-out-{k}" if k else "")
        out = args.work / name
        if not out.exists():
            rule = replace(deferral, tolerance=tol, max_out=k)
            write_residual_package(
                args.learned, out, base=res["base"], margin=res["margin"], deferral=rule
            )
        refs.append(PolicyRef(name, PolicySpec.parse(f"model:{out}")))
    seeds = [int(x) for x in args.seeds.split(",")]
    s = headline_setting(args.experiment, None, args.work / "setting")
    for name, windows in (("validation", s.validation), ("heldout", s.heldout)):
        rows = {
            r["policy"]: r for r in run_benchmark(refs, warm_cases(s, windows, seeds)).summary()
        }
        base = rows["base"]["avg_jct_s"]
        figures = {k: {"ratio_to_base": round(r["avg_jct_s"] / base, 4),
                       "deviations_per_1000": round(r.get("deviations_per_1000") or 0.0, 1)}
                   for k, r in rows.items()}  # fmt: skip
        print(name, json.dumps(figures))


if __name__ == "__main__":
    main()
