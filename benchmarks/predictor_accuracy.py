"""Accuracy of the run-time predictor (``datasets.predictor``) on the real Philly slice.

Development split only: fit on the trace's first four weeks, measured on the fifth (both
inside the five weeks the headline builds its dataset from; the evaluation days after them
are never looked at). Philly's only attributes are the virtual cluster (``Job.user``) and
the GPU count: no job names, no time limits.

    .venv/bin/python benchmarks/predictor_accuracy.py [--trace PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

from linkwise.cluster.domain import Job
from linkwise.datasets.predictor import RuntimePredictor, accuracy
from linkwise.datasets.traces import load_trace

PHILLY = (
    Path(__file__).resolve().parents[1].parent
    / "shared/data/traces/philly_2017-09-04_2017-10-15.csv"
)
DAY = 86400.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=PHILLY)
    p.add_argument("--fit-days", type=float, default=28.0)
    p.add_argument("--dev-days", type=float, default=7.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    jobs = load_trace(args.trace).jobs
    t0 = min(j.submit_time for j in jobs)
    split = t0 + args.fit_days * DAY
    dev = [j for j in jobs if split <= j.submit_time < split + args.dev_days * DAY]
    rows = []
    for min_count in (1, 5, 20):
        start = time.perf_counter()
        pred = RuntimePredictor.fit(jobs, until=split, min_count=min_count)
        fit_s = time.perf_counter() - start
        rows.append(
            {"min_count": min_count, "fit_jobs": pred.n_jobs, "fit_s": fit_s, **accuracy(pred, dev)}
        )
    # the baseline: one quantile of every past job, whatever its attributes
    anonymous = [Job(j.job_id, j.submit_time, 1, j.duration) for j in jobs]
    anon_dev = [Job(j.job_id, j.submit_time, 1, j.duration) for j in dev]
    constant = RuntimePredictor.fit(anonymous, until=split)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Spearman of a constant prediction is undefined
        base = accuracy(constant, anon_dev)
    rows.append({"min_count": 0, "fit_jobs": constant.n_jobs, "fit_s": 0.0, **base})
    if args.json:
        print(json.dumps(rows))
        return
    head = ["predictor", "fit jobs", "dev jobs", "MAE of median h", "median abs log error"]
    head += ["Spearman", "p50 coverage", "p90 coverage"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        name = f"groups, min_count {r['min_count']}" if r["min_count"] else "one global quantile"
        cells = [name, str(r["fit_jobs"]), str(int(r["jobs"])), f"{r['mae_h']:.2f}"]
        cells += [f"{r['median_abs_log_error']:.2f}", f"{r['spearman']:.3f}"]
        cells += [f"{r['coverage_q50']:.3f}", f"{r['coverage_q90']:.3f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
