"""Promotion and rollback move MLflow aliases on a real sqlite store with small registered
CQL packages; shadow evidence is gathered from a real DuckDB store (decisions + jobs); every
decision, pass or fail, is an MLflow run."""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from linkwise.cli import main
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import export_dataset, read_dataset, to_mdp_dataset
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks, run_rollouts
from linkwise.datasets.store import open_store
from linkwise.datasets.windows import choose_windows
from linkwise.deployer.promote import (
    current_aliases,
    promote_challenger,
    promote_shadow,
    rollback,
)
from linkwise.evaluation.gates import Check, GateReport, ShadowGates
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.models.registry import ensure_experiment, log_policy
from linkwise.models.training import AlgoConfig, build_algo, fit
from linkwise.policies.source import MODEL_NAME
from linkwise.policies.spec import PolicySpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
CONFIG = MdpConfig(k_slots=4)
SPEC = make_spec(CONFIG)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CQL package fitted on a few hundred rollout transitions."""
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory

    from linkwise.models.packaging import save_package

    root = tmp_path_factory.mktemp("pkg")
    wins = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64), n=1, min_jobs=20
    )
    tasks = make_tasks(wins, [PolicySpec.parse("best_fit")], [0], from_spec("8x8"),
                       epsilons=(0.2,), config=CONFIG,
                       block_s=600)  # fmt: skip
    manifest = export_dataset(run_rollouts(tasks), SPEC, {"test": "promote"}, root / "data")
    df, _ = read_dataset(manifest["path"])
    d3rlpy.seed(0)
    params = AlgoConfig(n_steps=40, n_steps_per_epoch=40, batch_size=32, hidden_units=(32,),
                        target_update_interval=20)  # fmt: skip
    algo = build_algo("cql", params, "cpu:0")
    fit(algo, to_mdp_dataset(df, SPEC), params, evaluators={}, adapter=NoopAdapterFactory())
    return save_package(algo, SPEC, manifest, root / "pkg", predictor=tasks[0].predictor)


def _register(pkg: Path, uri: str) -> str:
    """Log and register the package: a new version with alias ``challenger``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(ensure_experiment(client, "linkwise-test", tracking_uri=uri))
    reg = log_policy(pkg, run_id=run.info.run_id, tracking_uri=uri)
    client.set_terminated(run.info.run_id)
    assert reg.version is not None
    return reg.version


def _report(stage: str, passed: bool) -> GateReport:
    return GateReport(stage, "x", (Check("constructed", passed, "by the test", {"v": 1.0}),))


def _decisions(uri: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("linkwise-promotion")
    assert exp is not None
    return list(client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]))


def test_challenger_shadow_champion_previous_and_rollback(package: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1 = _register(package, uri)
    assert current_aliases(uri) == {"challenger": v1}
    # a failing gate moves nothing, and is logged
    d = promote_challenger(_report("challenger->shadow", False), v1, tracking_uri=uri)
    assert not d.passed and current_aliases(uri) == {"challenger": v1}
    d = promote_challenger(_report("challenger->shadow", True), v1, tracking_uri=uri)
    assert d.passed and current_aliases(uri) == {"challenger": v1, "shadow": v1}
    d = promote_shadow(_report("shadow->champion", True), v1, tracking_uri=uri)
    assert d.passed and current_aliases(uri) == {"challenger": v1, "champion": v1}
    # a second version goes the same way; the first is kept as previous
    v2 = _register(package, uri)
    # stale evidence (about v1, while v2 is the challenger) is refused
    d = promote_challenger(_report("challenger->shadow", True), v1, tracking_uri=uri)
    assert not d.passed and any("fresh_evidence" in r for r in d.reasons)
    assert promote_challenger(_report("c", True), v2, tracking_uri=uri).passed
    assert not promote_shadow(_report("s", False), v2, tracking_uri=uri).passed
    assert current_aliases(uri) == {"challenger": v2, "shadow": v2, "champion": v1}
    d = promote_shadow(_report("s", True), v2, tracking_uri=uri)
    assert current_aliases(uri) == {"challenger": v2, "champion": v2, "previous": v1}
    assert d.aliases_before["champion"] == v1 and "@previous" in d.format()
    # rollback: champion back to v1, once
    d = rollback(tracking_uri=uri)
    assert d.passed and current_aliases(uri) == {"challenger": v2, "champion": v1}
    d = rollback(tracking_uri=uri)
    assert not d.passed and "no @previous" in d.reasons[0]
    assert current_aliases(uri) == {"challenger": v2, "champion": v1}
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=uri).get_model_version(MODEL_NAME, v2).tags
    assert "linkwise.rolled_back" in tags
    # every decision, pass or fail, is an MLflow run with its reasons
    runs = _decisions(uri)
    assert [r.data.tags["linkwise.promotion.passed"] for r in runs] == [
        "false", "true", "true", "false", "true", "false", "true", "true", "false"
    ]  # fmt: skip
    last = runs[-1]
    assert last.data.params["action"] == "rollback" and last.data.metrics["passed"] == 0.0
    assert json.loads(last.data.params["aliases_after"]) == {"challenger": v2, "champion": v1}
    first = runs[0]
    assert first.data.metrics["constructed.v"] == 1.0
    from mlflow.artifacts import download_artifacts

    body = json.loads(
        Path(
            download_artifacts(
                run_id=first.info.run_id, artifact_path="decision.json", tracking_uri=uri
            )
        ).read_text()
    )
    assert body["reasons"] == ["FAIL constructed: by the test"]


def _store(path: Path, version: str, *, cycles: int, slurm_wait_s: float) -> None:
    """A live store: 30 finished jobs (Slurm made each wait ``slurm_wait_s``) and the live
    loop's shadow decisions of ``version`` over their submit window."""
    with closing(open_store(path)) as con:
        rows = []
        for i in range(30):
            submit = 1000.0 + 60.0 * i
            start = submit + slurm_wait_s
            rows.append((
                "c", i + 1, 0, f"j{i}", "u", "a", "p", "COMPLETED", 0, 0, submit, start,
                start + 600.0 + 30.0 * i, None, ["n1"], 1 + i % 4, [1 + i % 4], 1, True,
                None, None, "", "test", 0.0,
            ))  # fmt: skip
        con.executemany(f"INSERT INTO jobs VALUES ({', '.join(['?'] * 24)})", rows)
        cols = (
            "decision_id, run_id, cycle_id, ts, mode, cluster, partition, policy, "
            "model_version, obs_spec_version, action, nodes, gpus, latency_ms, n_pending, note"
        )
        logged = [
            (1000.0 + 60.0 * k * 29 / max(cycles - 1, 1), "shadow", version, k)
            for k in range(cycles)
        ] + [(1500.0, "active", "other", 10_000)]
        con.executemany(
            f"INSERT INTO decisions ({cols}) VALUES ({', '.join(['?'] * 16)})",
            [(f"d{c}", "r", c, ts, mode, "c", "p", "model:shadow", v, "obs", "wait", "", 0, 1.0,
              0, "") for ts, mode, v, c in logged],
        )  # fmt: skip


@pytest.mark.parametrize(("cycles", "wait", "promoted"), [(12, 18000.0, True), (12, 0.0, False),
                                                          (3, 18000.0, False)])  # fmt: skip
def test_shadow_evidence_from_the_live_store_gates_the_champion(
    package: Path, tmp_path: Path, cycles: int, wait: float, promoted: bool
) -> None:
    from linkwise.pipelines.evaluate import promote_from_shadow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1 = _register(package, uri)
    promote_challenger(_report("c", True), v1, tracking_uri=uri, log=False)
    db = tmp_path / "live.duckdb"
    _store(db, v1, cycles=cycles, slurm_wait_s=wait)
    from linkwise.evaluation.gates import GateConfig

    gates = GateConfig(shadow=ShadowGates(min_cycles=10, min_jobs=20))
    d = promote_from_shadow(db, tracking_uri=uri, gates=gates, cluster="2x8")
    ev = d.evidence
    assert ev["cycles"] == cycles and ev["jobs"] == 30
    # Slurm made every job wait five hours; the replay (an idle 16-GPU cluster) does not
    assert (ev["avg_jct_ratio"] < 1.0) == (wait > 0)
    assert d.passed is promoted, d.format()
    want = {"challenger": v1, "champion": v1} if promoted else {"challenger": v1, "shadow": v1}
    assert current_aliases(uri) == want
    (run,) = _decisions(uri)
    assert run.data.tags["linkwise.promotion.passed"] == str(promoted).lower()
    assert run.data.metrics["shadow_cycles.cycles"] == cycles


def test_evaluate_then_gate_the_challenger_end_to_end(package: Path, tmp_path: Path) -> None:
    """The registered challenger in the benchmark (pinned to its version, its actions checked
    against the mask), gated: without FQE evidence the gate refuses, logged in MLflow."""
    from linkwise.pipelines.evaluate import evaluate, gate_challenger, promote_from_evaluation

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1 = _register(package, uri)
    report, _ = evaluate(
        [PolicySpec.parse(s) for s in ("backfill", "best_fit", "model:challenger")],
        trace=PHILLY, n_windows=1, seeds=[0],
        cluster="4x8", window_s=3600.0, block_s=600.0, min_jobs=25, out_dir=tmp_path / "ev",
        tracking_uri=uri, log=False, n_boot=200,
    )  # fmt: skip
    assert report.context["model_versions"] == {"model:challenger": v1}
    assert report.context["specs"]["model:challenger"] == f"model:models:/{MODEL_NAME}/{v1}"
    row = {r["policy"]: r for r in report.summary}["model:challenger"]
    assert row["masked_actions"] == 0 and row["decisions"] > 0
    assert isinstance(row["guard_overrides"], int) and row["guard_overrides"] >= 0
    gate, evidence, version = gate_challenger(tmp_path / "ev", tracking_uri=uri)
    assert version == v1 and evidence.champion is None and evidence.masked_actions == 0
    assert evidence.best_heuristic in ("backfill", "best_fit")
    assert {c.name for c in gate.checks if not c.passed} >= {"fqe_not_below_behaviour"}
    ope = {"model:challenger": {"estimate": 0.0, "behaviour_return": -1.0, "spread": 0.1}}
    gate2, _, _ = gate_challenger(tmp_path / "ev", tracking_uri=uri, ope=ope)
    assert all(c.passed for c in gate2.checks if c.name == "fqe_not_below_behaviour")
    d = promote_from_evaluation(tmp_path / "ev", tracking_uri=uri)
    assert not d.passed and any("missing evidence" in r for r in d.reasons)
    assert current_aliases(uri) == {"challenger": v1}
    (run,) = _decisions(uri)
    assert run.data.params["action"] == "challenger->shadow"
    assert run.data.tags["linkwise.promotion.passed"] == "false"


def test_promote_to_champion_uses_the_clusters_calibration_by_default_and_records_it(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``promote --stage champion`` without --calibration: the shipped one while none is
    fitted for the store's cluster, the newest fitted one once there is; said on stdout and
    recorded in the decision's evidence (its MLflow artifact ``decision.json``)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1 = _register(package, uri)
    promote_challenger(_report("c", True), v1, tracking_uri=uri, log=False)
    db = tmp_path / "live.duckdb"
    _store(db, v1, cycles=12, slurm_wait_s=18000.0)
    args = ["promote", "--stage", "champion", "--db", str(db), "--cluster", "2x8",
            "--tracking-uri", uri]  # fmt: skip

    def run() -> tuple[str, dict[str, Any]]:
        assert main(args) in (0, 3)  # passed or refused: the decision is logged either way
        printed = capsys.readouterr().out
        client = MlflowClient(tracking_uri=uri)
        run = _decisions(uri)[-1]
        local = client.download_artifacts(run.info.run_id, "decision.json", str(tmp_path))
        return printed, json.loads(Path(local).read_text())["evidence"]["calibration"]

    printed, used = run()
    assert "calibration: shipped" in printed and used["kind"] == "shipped"
    promote_challenger(_report("c", True), v1, tracking_uri=uri, log=False)  # @shadow again
    fitted = replace(load_calibration(None), alpha=0.9, source="test: a cluster fit")
    run_id = log_cluster_calibration(uri, fitted, "c")
    printed, used = run()
    assert f"calibration: cluster c's fitted calibration (MLflow run {run_id}" in printed
    assert (used["kind"], used["run_id"]) == ("cluster", run_id)
