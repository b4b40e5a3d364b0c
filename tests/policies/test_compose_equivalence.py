"""Today's heuristics make, decision by decision, the decisions recorded before they became
compositions of parts (issue 22).

``tests/data/heuristic_decisions.json.gz`` was recorded by
``tests/data/record_heuristic_decisions.py`` with the fused implementations (commit before
the refactor): every state each heuristic saw on three seeded workloads and topologies,
and what it decided. Each run's states are replayed here, in order, through one instance of
the policy built from the same spec (Tiresias keeps its queues between decisions), and
every decision must be the recorded one: the same starts on the same placements in the
same order, the same preemptions, the same wake-up time. The preemptions are compared as
a set (sorted): a decision's preemptions are all applied before its starts, so their order
means nothing, and the fused Tiresias listed them in queue order, SRTF in running order.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
    Topology,
)
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.spec import PolicySpec

FIXTURE = Path(__file__).parents[1] / "data" / "heuristic_decisions.json.gz"


@cache
def _doc() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _placement(alloc: list[list[int]]) -> Placement:
    return Placement(tuple((int(n), int(g)) for n, g in alloc))


def _state(raw: dict[str, Any], topo: Topology, jobs: dict[int, Job]) -> ClusterState:
    running = tuple(
        RunningJob(
            job=jobs[r[0]],
            placement=_placement(r[1]),
            start_time=r[2],
            remaining_s=r[3],
            rate=r[4],
            attained_gpu_s=r[5],
            preemptions=r[6],
            since=r[7],
        )
        for r in raw["running"]
    )
    pending = tuple(
        PendingJob(job=jobs[p[0]], remaining_s=p[1], attained_gpu_s=p[2], preemptions=p[3])
        for p in raw["pending"]
    )
    return ClusterState(
        time=raw["time"],
        topology=topo,
        free_gpus=tuple(raw["free"]),
        running=running,
        pending=pending,
        link_flows=tuple(raw["flows"]),
    )


def _decision(raw: dict[str, Any]) -> Decision:
    return Decision(
        starts=tuple(Start(j, _placement(a)) for j, a in raw["starts"]),
        preempt=tuple(sorted(raw["preempt"])),
        wake_at=float("inf") if raw["wake_at"] is None else raw["wake_at"],
    )


def _runs() -> list[tuple[str, str]]:
    return [(r["workload"], r["policy"]) for r in _doc()["runs"]]


def test_fixture_covers_every_heuristic_and_preemption() -> None:
    names = {PolicySpec.parse(p).heuristic for _, p in _runs()}
    assert {
        "fifo",
        "backfill",
        "best_fit",
        "sjf_bco",
        "qssf",
        "tiresias_las",
        "random",
        "sjf_bco_oracle",
        "srtf_oracle",
    } <= names
    preempts = sum(len(s["decision"]["preempt"]) for r in _doc()["runs"] for s in r["steps"])
    assert preempts > 100  # the preemptive ones were recorded preempting


@pytest.mark.parametrize(("workload", "spec"), _runs())
def test_same_decisions_as_recorded(workload: str, spec: str) -> None:
    doc = _doc()
    wl = next(w for w in doc["workloads"] if w["label"] == workload)
    run = next(r for r in doc["runs"] if r["workload"] == workload and r["policy"] == spec)
    topo = from_spec(wl["topology"])
    jobs = {j["job_id"]: Job(**j) for j in wl["jobs"]}
    policy = PolicySpec.parse(spec).build()
    assert run["steps"]
    for i, step in enumerate(run["steps"]):
        state = _state(step["state"], topo, jobs)
        got = policy.decide(state)
        got = replace(got, preempt=tuple(sorted(got.preempt)))
        want = _decision(step["decision"])
        assert got == want, f"{spec} on {workload}: decision {i} at t={state.time} differs"
