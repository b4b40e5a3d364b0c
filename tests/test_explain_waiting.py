"""Issue 32 item 7: ``linkwise explain`` answers "why is my job still waiting?" for any job the
loop saw, not only those its policy started (``No decision of the loop names job 97`` for a
job that queued through shadow mode), in units a person reads: the rule that held it, how
long it has waited and its predicted run time, in minutes below an hour."""

from __future__ import annotations

import json
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
from linkwise.cluster.topology import from_spec
from linkwise.deployer.explain import duration_words, explain_cycle, explain_lines

TOPO = from_spec("1x4")
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


def test_durations_read_in_minutes_below_an_hour() -> None:
    assert duration_words(0.02) == "1 min"
    assert duration_words(0.5) == "30 min"
    assert duration_words(2.25) == "2.2 h"
    assert duration_words(None) == "unknown"
