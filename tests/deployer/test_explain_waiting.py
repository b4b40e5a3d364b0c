"""Issue 32 item 7: ``linkwise explain`` answers "why is my job still waiting?" for any job the
loop saw, not only those its policy started (``No decision of the loop names job 97`` for a
job that queued through shadow mode), in units a person reads: the rule that held it, how
long it has waited and its predicted run time, in minutes below an hour."""

from __future__ import annotations

import json
import logging
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
)
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.store import open_store
from linkwise.deployer.decision_log import DecisionLog
from linkwise.deployer.explain import duration_words, explain_cycle, explain_lines, job_decisions
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import Observation
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.policies.spec import PolicySpec

TOPO = from_spec("1x4")
LOG = logging.getLogger("test.explain_waiting")
T = 100_000.0


def _state() -> ClusterState:
    big = Job(10, T - 5400.0, 4, 7200.0, profile="bert", pred_s=9000.0, pred_hi_s=12000.0)
    small = Job(11, T - 60.0, 1, 600.0, profile="bert", pred_s=600.0, pred_hi_s=900.0)
    held = Job(1, T - 9000.0, 2, 20000.0, profile="bert")
    run = RunningJob(held, Placement.of([(0, 2)]), T - 3000.0, 17000.0, 1.0, since=T)
    return ClusterState(
        time=T,
        topology=TOPO,
        free_gpus=(2,),
        running=(run,),
        pending=(PendingJob(big, 7200.0), PendingJob(small, 600.0)),
    )


def _rows(cycles: int) -> list[dict[str, Any]]:
    """The rows ``job_decisions`` would read back for job 10: one start row per cycle."""
    state = _state()
    decision = Decision(starts=(Start(11, Placement.of([(0, 1)])),))
    why = explain_cycle(
        state,
        decision,
        policy="fifo",
        model_version="",
        steps=None,
        base="backfill",
        base_decision=Decision(starts=(Start(11, Placement.of([(0, 1)])),)),
        model=AnalyticModel(load_calibration(None)),
    )
    row = {
        "cycle_id": 0,
        "mode": "shadow",
        "policy": "fifo",
        "model_version": "",
        "job_id": 11,
        "action": "start",
        "nodes": "node000",
        "gpus": 1,
        "n_pending": 2,
        "note": "shadow",
        "actual_start": None,
        "explanation": json.loads(json.dumps(why[11])),
    }
    return [{**row, "cycle_id": c, "ts": T + 2.0 * c} for c in range(cycles)]


def test_a_job_the_policy_never_started_is_named_with_the_rule_that_held_it() -> None:
    rows = _rows(3)
    e = rows[0]["explanation"]
    assert 10 in e["jobs"]  # what job_decisions finds it by
    (q,) = [q for q in e["queue"] if q["job_id"] == 10]
    assert (q["position"], q["gpus"], q["waited_h"], q["pred_h"], q["started"]) == (
        1,
        4,
        1.5,
        2.5,
        False,
    )
    text = explain_lines(rows, 10)
    waiting = (
        "waiting: position 1 of 2, 4 GPUs, waited 1.5 h, predicted run time 2.5 h; held by: "
        "too few free GPUs: it needs 4, 1 free after this cycle's starts"
    )
    assert text[0] == f"job 10, last seen at 1970-01-02 03:46:44 UTC: {waiting}"
    assert f"  {waiting}" in text
    assert "  decided: start job 11 on node000, not job 10" in text
    # the three cycles that held it the same way are one entry
    assert text.count("  decided: start job 11 on node000, not job 10") == 1
    assert "  (held the same way in 2 more cycle(s), until 1970-01-02 03:46:44 UTC)" in text


def test_durations_read_as_every_report_prints_them() -> None:
    assert duration_words(0.02) == "72 s"
    assert duration_words(0.5) == "30 min"
    assert duration_words(2.25) == "2.25 h"
    assert duration_words(None) == "unknown"


def _observation(state: ClusterState) -> Observation:
    return Observation(state=state, managed={}, shapes={}, no_gpu=(), refused={},
                       running_ids=frozenset(), started={}, held_total=0)  # fmt: skip


def _cycles(tmp_path: Path, name: str, states: list[ClusterState], every: bool) -> Path:
    """The decision log of ``states``, one a cycle, in a store; ``every``: the queue stored in
    every cycle (as before snapshots were kept only when they change)."""
    db = tmp_path / f"{name}.duckdb"
    now = [T]
    metrics = ServeMetrics()
    log = DecisionLog(
        Recorder(str(db), tmp_path / f"{name}.spool", logger=LOG), metrics, "run", "shadow",
        "c", ("gpu",), LOG, clock=lambda: now[0],
    )  # fmt: skip
    holder = PolicyHolder(PolicySpec.parse("fifo"), PolicySpec.parse("fifo"), metrics=metrics)
    guarded = GuardedPolicy(holder, metrics)
    for cycle, state in enumerate(states, start=1):
        now[0] = state.time
        if every:
            log.stored_queue = None
        decision = guarded.decide(state)
        assert not decision.starts  # fifo: the 4-GPU head of the queue waits, and so do all
        log.record(cycle, _observation(state), decision, guarded.last, TOPO, {})
    return db


def test_an_unchanged_queue_is_stored_once_and_explain_answers_as_before(tmp_path: Path) -> None:
    """Five cycles over the same queue store one snapshot; a sixth without job 11 stores the
    next. ``explain`` answers for the waiting jobs exactly as when every cycle stored it."""
    base = _state()
    states = [replace(base, time=T + 2.0 * c) for c in range(5)]
    states.append(replace(states[-1], time=T + 10.0, pending=base.pending[:1]))
    lean = _cycles(tmp_path, "lean", states, every=False)
    full = _cycles(tmp_path, "full", states, every=True)
    snaps = "SELECT cycle_id FROM decisions WHERE json_type(explanation, '$.queue') = 'ARRAY'"
    with closing(open_store(lean)) as con, closing(open_store(full)) as old:
        assert con.execute("SELECT count(*) FROM decisions").fetchone() == (6,)
        assert [c for (c,) in con.execute(snaps + " ORDER BY 1").fetchall()] == [1, 6]
        for job in (10, 11):
            rows, before = job_decisions(con, job), job_decisions(old, job)
            assert len(rows) == len(before) == (6 if job == 10 else 5)
            assert explain_lines(rows, job) == explain_lines(before, job)
            for r, b in zip(rows, before, strict=True):
                got, want = r["explanation"]["queue"], b["explanation"]["queue"]
                assert [{**q, "waited_h": 0} for q in got] == [{**q, "waited_h": 0} for q in want]
                for q, w in zip(got, want, strict=True):  # waited: the snapshot's, moved on
                    assert abs(q["waited_h"] - w["waited_h"]) <= 2e-4
        last = job_decisions(con, 10)[-2]["explanation"]["queue"][0]
        assert last["job_id"] == 10 and last["waited_h"] == round((5400.0 + 8.0) / 3600, 4)
