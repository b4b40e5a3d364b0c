"""The decision log's explanations: recorded with each row through the store and through the
spool (a store outage loses nothing of them), an older store migrated with its rows kept
(explained as "no explanation recorded"), and a heuristic's failing prediction recorded as
unknown rather than losing the row's explanation."""

from __future__ import annotations

import json
import logging
from contextlib import closing
from pathlib import Path
from typing import Any

import duckdb
import pytest

from linkwise.cli import main
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.store import MIGRATIONS, apply_migrations, open_store, schema_version
from linkwise.datasets.synthetic import generate
from linkwise.deployer.decision_log import DecisionLog
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import Observation
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec

LOG = logging.getLogger("test.decision_log")


def _busy_state() -> ClusterState:
    cal = load_calibration(None)
    jobs = assign_profiles(generate(60, seed=3, max_gpus=16, load_scale=20.0), cal, seed=0)
    sim = Simulator(from_spec("2x8"), jobs, AnalyticModel(cal))
    state = sim.observe()
    fifo, best = make_policy("fifo"), make_policy("best_fit")
    while len(state.pending) < 2 or not state.running or not best.decide(state).starts:
        sim.apply(fifo.decide(state))
        assert sim.advance()
        state = sim.observe()
    return state  # jobs running and waiting, and best fit would start some now


def _observation(state: ClusterState) -> Observation:
    return Observation(state=state, managed={}, shapes={}, no_gpu=(), refused={},
                       running_ids=frozenset(), started={}, held_total=0)  # fmt: skip


def _log(recorder: Recorder) -> DecisionLog:
    return DecisionLog(recorder, ServeMetrics(), "run", "shadow", "c", ("gpu",), LOG)


def test_explanations_survive_a_store_outage(tmp_path: Path) -> None:
    state = _busy_state()
    metrics = ServeMetrics()
    guarded = GuardedPolicy(
        PolicyHolder(PolicySpec.parse("best_fit"), PolicySpec.parse("backfill"), metrics=metrics),
        metrics,
    )
    decision = guarded.decide(state)
    info = guarded.last
    assert info["explanation"] is not None and info["explain_ms"] >= 0.0
    db, spool = tmp_path / "s.duckdb", tmp_path / "spool.jsonl"
    open_store(db).close()

    def down(_path: str) -> Any:
        raise duckdb.IOException("Could not set lock on file: store down for the test")

    where = _log(Recorder(str(db), spool, logger=LOG, open_store=down)).record(
        1, _observation(state), decision, info, state.topology, {}
    )
    assert where == "spool" and spool.exists()
    # the store is back: the next write replays the spool first
    assert Recorder(str(db), spool, logger=LOG).write() == "store"
    with closing(open_store(db)) as con:
        rows = con.execute(
            "SELECT job_id, action, deviated, explanation FROM decisions ORDER BY job_id"
        ).fetchall()
    want = {s.job_id for s in decision.starts} or {None}
    assert {r[0] for r in rows} == want
    for job_id, _, deviated, raw in rows:
        e = json.loads(raw)
        assert e == json.loads(json.dumps(info["explanation"][job_id], default=str))
        assert deviated is False and e["base"]["itself"] is True


def test_an_older_store_is_migrated_and_its_rows_explained_as_unexplained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    apply_migrations(con, MIGRATIONS[:4])
    con.execute(
        "INSERT INTO decisions (decision_id, run_id, cycle_id, ts, mode, cluster, partition, "
        "policy, model_version, obs_spec_version, job_id, action, nodes, gpus, latency_ms, "
        "n_pending, note) VALUES ('d1', 'r', 1, 1000.0, 'shadow', 'c', 'gpu', 'fifo', "
        "'heuristic:fifo', '', 7, 'start', 'gpu01', 1, 0.1, 3, 'shadow')"
    )
    con.close()
    assert main(["explain", "7", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "decided: start job 7 on gpu01" in out and "no explanation recorded" in out
    with closing(open_store(db)) as con2:
        assert schema_version(con2) >= 5
        assert con2.execute("SELECT deviated, explanation FROM decisions").fetchall() == [
            (None, None)
        ]
    assert main(["explain", "7", "--db", str(db), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["explanation"] is None and row["decision_id"] == "d1"
    assert main(["explain", "8", "--db", str(db)]) == 0
    assert "no decision of the loop names job 8" in capsys.readouterr().out


def test_a_job_the_model_cannot_predict_keeps_its_explanation() -> None:
    """squeue's jobs carry no communication profile: the slowdown is unknown, with why."""
    from dataclasses import replace

    from linkwise.deployer.explain import explain_cycle

    state = _busy_state()
    pending = tuple(replace(p, job=replace(p.job, profile="")) for p in state.pending)
    blind = replace(state, pending=pending)
    metrics = ServeMetrics()
    d = PolicyHolder(
        PolicySpec.parse("best_fit"), PolicySpec.parse("backfill"), metrics=metrics
    ).active.policy.decide(blind)
    assert d.starts
    out = explain_cycle(blind, d, policy="best_fit", model_version="h", steps=None,
                        base="best_fit", base_decision=None,
                        model=AnalyticModel(load_calibration(None)))  # fmt: skip
    for s in d.starts:
        sd = out[s.job_id]["predicted_slowdown"]
        assert sd["job"] is None and "unknown profile" in sd["unknown"]
