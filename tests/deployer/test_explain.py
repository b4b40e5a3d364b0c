"""Why each decision: the demo's shadow loop (``pipelines.sim_shadow.run_shadow``, the live
loop's own DecisionLog over the simulator) with a registered learned package records an
explanation with every decision row, and ``linkwise explain`` reads a job's decisions back in
time order, in words and as JSON; a heuristic is its own base; ``decide_explained`` makes the
same decisions as ``decide``."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from linkwise.cli import main
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace
from linkwise.datasets.store import open_store
from linkwise.datasets.windows import choose_windows
from linkwise.deployer.explain import job_decisions
from linkwise.models.learned import load_package
from linkwise.policies.spec import PolicySpec

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tests" / "fixtures" / "packages" / "cql-rows"  # a plain CQL package
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "8x8,leaf=4"


def _window_jobs() -> tuple[Any, ...]:
    (w,) = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3 * 3600.0, max_gpus=64), n=1, min_jobs=40
    )
    return w.jobs


@pytest.fixture(scope="module")
def shadow_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The demo's shadow part: the pretrained package registered as @challenger, run by the
    shadow loop over a Philly window scheduled by backfill."""
    from mlflow.tracking import MlflowClient

    from linkwise.models.registry import ensure_experiment, log_policy
    from linkwise.pipelines.sim_shadow import run_shadow

    root = tmp_path_factory.mktemp("explain")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(ensure_experiment(client, "linkwise-test", tracking_uri=uri))
    reg = log_policy(PKG, run_id=run.info.run_id, tracking_uri=uri)
    client.set_terminated(run.info.run_id)
    db = root / "live.duckdb"
    summary = run_shadow(
        db, _window_jobs(), from_spec(TOPO), spec=PolicySpec.parse("model:challenger"),
        tracking_uri=uri,
        cluster="explain-test", state_dir=root / "serve", max_cycles=80,
    )  # fmt: skip
    assert summary["model_version"] == str(reg.version), summary["fallback_reason"]
    return db, summary


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(open_store(db)) as con:
        return con.execute(sql).fetchall()


def test_every_shadow_decision_row_is_explained(shadow_db: tuple[Path, dict[str, Any]]) -> None:
    db, summary = shadow_db
    rows = _rows(db, "SELECT action, job_id, nodes, deviated, explanation, model_version "
                     "FROM decisions WHERE note NOT LIKE 'infeasible%'")  # fmt: skip
    assert len(rows) == summary["decisions"] and summary["shadow_starts"] > 0
    starts = 0
    for action, job_id, nodes, deviated, raw, version in rows:
        assert raw is not None and deviated is not None
        e = json.loads(raw)
        assert e["policy"] == "model:challenger" and e["model_version"] == version
        assert e["base"]["policy"] == "backfill" and e["base"]["itself"] is False
        assert e["deviated"] == deviated and e["advantage"] is None
        if action == "start":
            starts += 1
            assert e["chosen"] == {**e["chosen"], "job_id": job_id, "nodes": nodes}
            assert isinstance(e["chosen"]["score"], float)  # a Q-value of the package
            sd = e["predicted_slowdown"]
            assert sd["job"] >= 0.0 and sd["neighbours"] >= 0.0
            # deviated exactly when backfill would not start this job on these nodes
            theirs = {s["job_id"]: s["nodes"] for s in e["base"]["starts"]}
            assert deviated == (theirs.get(job_id) != nodes)
            assert job_id in e["jobs"]
        else:
            assert e["chosen"]["action"] == "wait"
            assert deviated == bool(e["base"]["starts"])
        if e["runner_up"] is not None:
            assert e["runner_up"] != e["chosen"]
    assert starts == summary["shadow_starts"]


def test_explain_prints_a_jobs_decisions_in_time_order(
    shadow_db: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = shadow_db
    (job,) = _rows(db, "SELECT job_id FROM decisions WHERE action = 'start' "
                       "ORDER BY ts, cycle_id LIMIT 1")[0]  # fmt: skip
    assert main(["explain", str(job), "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    with closing(open_store(db)) as con:
        assert [r["decision_id"] for r in rows] == [
            r["decision_id"] for r in job_decisions(con, job)
        ]
    mine = [r for r in rows if r["job_id"] == job and r["action"] == "start"]
    assert mine and all(job in r["explanation"]["jobs"] for r in rows)
    assert main(["explain", str(job), "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert f"job {job}: {len(rows)} decision(s), oldest first" in text
    assert f"decided: start job {job} on {mine[0]['nodes']}" in text
    assert "predicted slowdown" in text and "base backfill would" in text
    assert "what Slurm did" in text


def test_explain_refuses_a_missing_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", "1", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no such store" in capsys.readouterr().err
    assert not (tmp_path / "none.duckdb").exists()


def test_decide_explained_decides_as_decide() -> None:
    """The hook's steps are the policy's own: same starts, one step per start (+ the wait)."""
    cal = load_calibration(None)
    model = AnalyticModel(cal)
    policy = load_package(PKG, model=model)
    jobs = ensure_predicted(assign_profiles(_window_jobs(), cal, seed=0), policy.predictor)
    sim = Simulator(from_spec(TOPO), jobs, model)
    seen = 0
    for _ in range(40):
        state = sim.observe()
        a = policy.decide(state)
        b, steps = policy.decide_explained(state)
        assert a == b
        if state.pending:
            assert len(steps) in (len(b.starts), len(b.starts) + 1)
            for step, start in zip(steps, b.starts, strict=False):
                assert step.candidates.start_for(step.action) == start
                assert step.runner_up != step.action
            seen += len(b.starts)
        sim.apply(b)
        if not sim.advance():
            break
    assert seen > 0


def test_a_heuristic_is_its_own_base() -> None:
    from linkwise.deployer.explain import explain_cycle
    from linkwise.policies.heuristics import make_policy

    cal = load_calibration(None)
    model = AnalyticModel(cal)
    jobs = assign_profiles(_window_jobs(), cal, seed=0)
    sim = Simulator(from_spec(TOPO), jobs, model)
    state = sim.observe()
    while not state.pending:
        sim.advance()
        state = sim.observe()
    d = make_policy("best_fit").decide(state)
    assert d.starts
    out = explain_cycle(state, d, policy="best_fit", model_version="heuristic:best_fit",
                        steps=None, base="best_fit", base_decision=None, model=model)  # fmt: skip
    for start in d.starts:
        e = out[start.job_id]
        assert e["deviated"] is False and e["base"]["itself"] is True
        assert e["chosen"]["score"] is None and e["runner_up"] is None
        assert e["predicted_slowdown"]["job"] is not None
