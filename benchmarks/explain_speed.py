"""What explaining a decision costs a learned policy (``deployer.explain``, issue 24 item 1).

States come from a busy Philly window on a 16x8 cluster scheduled by backfill in the
simulator (queues of tens to hundreds of jobs); at each where a start is allowed (the
network is asked), a plain CQL package (``tests/fixtures/packages/cql-rows``, the old shipped
one) decides with ``decide`` and with ``decide_explained`` (the hook that keeps each step's
candidates, values and runner-up), and ``explain_cycle`` builds
the rows' explanations with the base's (backfill's) decision on the same state. Prints p50 /
p99 milliseconds of each and the queue lengths seen.

    .venv/bin/python benchmarks/explain_speed.py [--states 150] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tests" / "fixtures" / "packages" / "cql-rows"
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"


def main() -> None:
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator.engine import Simulator
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.prediction import ensure_predicted
    from linkwise.datasets.rollouts import cut_windows, jobs_from_trace
    from linkwise.datasets.windows import choose_windows
    from linkwise.deployer.explain import explain_cycle
    from linkwise.models.learned import load_package
    from linkwise.policies.heuristics import make_policy

    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=150)
    ap.add_argument("--cluster", default="16x8,leaf=4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cal = load_calibration(None)
    model = AnalyticModel(cal)
    policy = load_package(PKG, model=model)
    base = make_policy("backfill")
    topo = from_spec(args.cluster)
    (w,) = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 24 * 3600.0, max_gpus=topo.total_gpus),
        n=1,
        min_jobs=400,
    )
    jobs = ensure_predicted(assign_profiles(w.jobs, cal, seed=0), policy.predictor)
    sim = Simulator(topo, jobs, model)
    t_dec: list[float] = []
    t_exp: list[float] = []
    t_rows: list[float] = []
    queue: list[int] = []
    while len(t_dec) < args.states:
        state = sim.observe()
        if state.pending:
            t0 = time.perf_counter()
            policy.decide(state)
            t1 = time.perf_counter()
            decision, steps = policy.decide_explained(state)
            t2 = time.perf_counter()
            explain_cycle(
                state, decision, policy="learned", model_version="pkg", steps=steps,
                base="backfill", base_decision=base.decide(state), model=model,
            )  # fmt: skip
            t3 = time.perf_counter()
            if not steps:  # nothing could start: the network was not asked
                sim.apply(base.decide(state))
                if not sim.advance():
                    break
                continue
            t_dec.append((t1 - t0) * 1e3)
            t_exp.append((t2 - t1) * 1e3)
            t_rows.append((t3 - t2) * 1e3)
            queue.append(len(state.pending))
        sim.apply(base.decide(state))
        if not sim.advance():
            break

    def pct(x: list[float], q: float) -> float:
        return float(np.percentile(np.asarray(x), q))

    out = {
        "states": len(t_dec),
        "queue_p50": pct([float(q) for q in queue], 50),
        "queue_max": max(queue),
        "decide_ms": {"p50": pct(t_dec, 50), "p99": pct(t_dec, 99)},
        "decide_explained_ms": {"p50": pct(t_exp, 50), "p99": pct(t_exp, 99)},
        "explain_cycle_ms": {"p50": pct(t_rows, 50), "p99": pct(t_rows, 99)},
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['states']} states, queue p50 {out['queue_p50']:.0f} max {out['queue_max']}")
    for k in ("decide_ms", "decide_explained_ms", "explain_cycle_ms"):
        print(f"{k:22s} p50 {out[k]['p50']:8.2f}  p99 {out[k]['p99']:8.2f}")


if __name__ == "__main__":
    main()
