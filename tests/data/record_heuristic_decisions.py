"""Record every heuristic's decisions, state by state, on a few seeded workloads and topologies.

Run once with the implementation being refactored (issue 22: the heuristics became named
compositions of parts); ``tests/policies/test_compose_equivalence.py`` replays every
recorded state, in order, through today's policies and asserts the same decision. The states carry
everything a policy may read (the oracles read ``remaining_s``), so a later change to the
simulator does not change what is checked.

    .venv/bin/python tests/data/record_heuristic_decisions.py
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.spec import PolicySpec

OUT = Path(__file__).with_name("heuristic_decisions.json.gz")

# (label, policy spec) pairs: every registered heuristic with its defaults, and variants
POLICIES: tuple[str, ...] = (
    "fifo",
    "backfill",
    "best_fit",
    "sjf_bco",
    "sjf_bco:kappa=2,lam=1.5",
    "qssf",
    "qssf:lam=inf",
    "tiresias_las",
    "tiresias_las:order=submit,thresholds=3600,starve_factor=10",
    "random",
    "sjf_bco_oracle",
    "srtf_oracle",
)
# (label, topology spec, jobs, seed, mean interarrival s)
WORKLOADS: tuple[tuple[str, str, int, int, float], ...] = (
    ("4x4", "4x4,leaf=2", 45, 1, 400.0),
    ("6x8", "6x8,leaf=3", 60, 2, 90.0),
    ("3x8", "3x8", 40, 3, 250.0),
)
# restart cost 30 s, no grace: the simulator as it was before the restart model (issue 22)
CONFIG = SimConfig(tick_s=None, restart=RestartModel.constant(30.0, grace_s=0.0))


def workload(n: int, seed: int, gap: float, total_gpus: int) -> list[Job]:
    """Seeded jobs: mixed sizes, heavy-tailed run times, noisy predictions, some limits."""
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.expovariate(1.0 / gap)
        gpus = min(total_gpus, rng.choice([1, 1, 1, 2, 2, 4, 4, 8, 12, 16]))
        duration = rng.lognormvariate(7.5, 1.3)
        pred = duration * rng.lognormvariate(0.0, 0.6)
        limit = rng.choice([0.0, 0.0, duration * 2.0, 86400.0])
        jobs.append(
            Job(
                i,
                round(t, 3),
                gpus,
                round(duration, 3),
                user=f"u{i % 3}",
                time_limit=round(limit, 3),
                pred_s=round(pred, 3),
                pred_hi_s=round(pred * 2.5, 3),
            )
        )
    return jobs


def state_json(state: ClusterState) -> dict[str, Any]:
    return {
        "time": state.time,
        "free": list(state.free_gpus),
        "flows": list(state.link_flows),
        "running": [
            [
                r.job.job_id,
                [list(a) for a in r.placement.alloc],
                r.start_time,
                r.remaining_s,
                r.rate,
                r.attained_gpu_s,
                r.preemptions,
                r.since,
            ]
            for r in state.running
        ],
        "pending": [
            [p.job.job_id, p.remaining_s, p.attained_gpu_s, p.preemptions] for p in state.pending
        ],
    }


def decision_json(d: Decision) -> dict[str, Any]:
    return {
        "starts": [[s.job_id, [list(a) for a in s.placement.alloc]] for s in d.starts],
        "preempt": list(d.preempt),
        "wake_at": None if d.wake_at == float("inf") else d.wake_at,
    }


def main() -> None:
    cal = load_calibration()
    model = AnalyticModel(cal)
    runs = []
    for label, topo_spec, n, seed, gap in WORKLOADS:
        topo = from_spec(topo_spec)
        jobs = assign_profiles(workload(n, seed, gap, topo.total_gpus), cal, seed=seed)
        for spec in POLICIES:
            policy = PolicySpec.parse(spec).build()
            steps: list[dict[str, Any]] = []

            def record(
                state: ClusterState, d: Decision, steps: list[dict[str, Any]] = steps
            ) -> None:
                steps.append({"state": state_json(state), "decision": decision_json(d)})

            drive(Simulator(topo, jobs, model, CONFIG), policy, on_decision=record)
            runs.append({"workload": label, "policy": spec, "steps": steps})
            print(f"{label:5} {spec:60} {len(steps):5} decisions")
    doc = {
        "workloads": [
            {
                "label": label,
                "topology": topo_spec,
                "jobs": [
                    {
                        "job_id": j.job_id,
                        "submit_time": j.submit_time,
                        "num_gpus": j.num_gpus,
                        "duration": j.duration,
                        "profile": j.profile,
                        "user": j.user,
                        "time_limit": j.time_limit,
                        "pred_s": j.pred_s,
                        "pred_hi_s": j.pred_hi_s,
                    }
                    for j in assign_profiles(
                        workload(n, seed, gap, from_spec(topo_spec).total_gpus), cal, seed=seed
                    )
                ],
            }
            for label, topo_spec, n, seed, gap in WORKLOADS
        ],
        "runs": runs,
    }
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
