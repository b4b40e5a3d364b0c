"""The operator's path on their own cluster's store (issue 32 items 1, 2, 5, 6): evaluate
and build-dataset default to the operator's store and the cluster it describes, say how much
history a request lacks, train learns from the store, shadow-report finds the latest span
with evidence, and promote documents its exit codes. The real local Slurm end to end is
``tests/pipelines/test_operator_live.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml  # type: ignore[import-untyped]

from linkwise.cli import main
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.operator import DEFAULT_STORE
from linkwise.pipelines.history import replay_history

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "op"
EVAL = ["--policies", "backfill,fifo", "--seeds", "0", "--executor", "serial", "--no-log",
        "--n-boot", "50", "--min-jobs", "5"]  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About a day of a 3-node x 4-GPU cluster's accounting (nodes table included)."""
    db = tmp_path_factory.mktemp("store") / "store.duckdb"
    jobs = synthetic.generate(300, seed=0, max_gpus=12, load_scale=0.5)
    replay_history(jobs, from_spec("3x4"), db, cluster=CLUSTER)
    return db


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_evaluate_runs_on_the_cluster_the_store_describes(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 1: not on the default 16x8 (128 GPUs) but on the store's 3 x 4 GPUs, and the
    output says which topology and where it came from."""
    code, out, err = _run(
        ["evaluate", "--db", str(store), *EVAL, "--n-windows", "1", "--out", str(tmp_path / "e")],
        capsys,
    )
    assert code == 0, err
    assert "on op (3x4, 12 GPUs)" in out
    assert f"topology: the store's nodes table ({store}, cluster op)" in out
    report = (tmp_path / "e" / "report.md").read_text()
    assert "- **cluster**: op (3x4, 12 GPUs)" in report and "- **gpus**: 12" in report
    assert "- **topology_source**: the store's nodes table" in report


def test_evaluate_refuses_a_store_without_nodes(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare.duckdb"
    shutil.copy(store, bare)
    with duckdb.connect(str(bare)) as con:
        con.execute("DELETE FROM nodes")
    argv = ["evaluate", "--db", str(bare), *EVAL, "--out", str(tmp_path / "e")]
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert "cannot evaluate on the store's cluster: no nodes of cluster 'op' in the store" in err
    assert "collect its nodes (`linkwise collect accounting`) or name the topology" in err
    assert not (tmp_path / "e").exists()


def test_evaluate_says_how_much_history_is_missing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 2: not `no evaluation windows left` but what was asked, what the store has and
    how many windows, days and jobs are missing."""
    argv = ["evaluate", "--db", str(store), *EVAL, "--out", str(tmp_path / "e")]
    code, _, err = _run([*argv, "--n-windows", "4", "--window", "3600", "--min-jobs", "60"], capsys)
    assert code == 2
    assert "4 windows of 1 h with at least 60 jobs asked" in err
    assert "299 jobs over 1.06 d (26 windows of 1 h with jobs, 0 with at least 60 jobs)" in err
    assert "0 usable; 4 more windows missing: at least 4 h and 240 more jobs" in err
    assert "no evaluation windows left (all overlap" not in err


def test_evaluate_and_build_dataset_default_to_the_operators_store(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["evaluate", *EVAL, "--n-windows", "1"], capsys)
    assert code == 2 and f"no store at {tmp_path / DEFAULT_STORE}" in err
    (tmp_path / DEFAULT_STORE).parent.mkdir(parents=True)
    shutil.copy(store, tmp_path / DEFAULT_STORE)
    code, out, err = _run(["evaluate", *EVAL, "--n-windows", "1"], capsys)
    assert code == 0, err
    assert "on op (3x4, 12 GPUs)" in out


def test_the_evaluate_deployment_runs_on_the_stores_cluster(store: Path, tmp_path: Path) -> None:
    from linkwise.pipelines.deployments import evaluate_deployment

    out: dict[str, Any] = evaluate_deployment.fn(
        ["backfill"], db=str(store), n_windows=1, seeds=[0], min_jobs=5, n_boot=50,
        promote=False, out_dir=str(tmp_path / "e"),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )  # fmt: skip
    context = out["evaluation"]["context"]
    assert context["gpus"] == 12 and context["cluster"] == "op (3x4, 12 GPUs)"


def test_build_dataset_spans_since_until_and_says_why_fewer_rollouts(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 2: --since/--until bound the dataset; --rollouts 8 on half a day of history rolls
    out the 2 windows there are and says why, with how much history is missing."""
    argv = ["build-dataset", "--from-db", str(store), "--policies", "backfill", "--epsilons", "0",
            "--executor", "serial", "--max-steps", "20", "--out", str(tmp_path / "ds")]  # fmt: skip
    code, out, err = _run([*argv, "--rollouts", "8", "--since", "0", "--until", "43200"], capsys)
    assert code == 0, err
    assert "rollouts: 2 windows x 1 policies x 1 exploration rates x 1 seeds" in out
    assert "note: --rollouts 8: 2 windows rolled out: 8 windows of 6 h with at least 10 jobs" in out
    assert "6 more windows missing" in out
    manifest = json.loads(next((tmp_path / "ds").glob("transitions-*.json")).read_text())
    acc = manifest["sources"]["accounting"]
    assert (acc["since"], acc["until"], acc["cluster"]) == (0.0, 43200.0, CLUSTER)
    assert manifest["sources"]["rollouts"]["until"] == 43200.0
    code, _, err = _run([*argv, "--rollouts", "2", "--since", "90000", "--min-jobs", "50"], capsys)
    assert code == 2 and "no rollout windows for --rollouts 2" in err
    assert "2 more windows missing" in err


def test_train_learns_from_the_store_without_edits(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 2: the shipped operator TOML builds its dataset from the operator's store (here
    given with --db), on the store's cluster, up to --until, and registers @challenger."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = str(ROOT / "models" / "experiments" / "operator_bc.toml")
    argv = ["train", "--config", config, "--steps", "20", "--tracking-uri", uri, "--json"]
    code, _, err = _run(argv, capsys)
    assert code == 2 and f"no store at {tmp_path / DEFAULT_STORE}" in err
    code, out, err = _run([*argv, "--db", str(store), "--until", "64800"], capsys)
    assert code == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["steps"] == 20 and result["alias"] == "challenger"
    manifest = json.loads(Path(result["dataset_path"]).with_suffix(".json").read_text())
    topology = {"spec": None, "name": CLUSTER, "nodes": 3, "gpus": 12}
    assert manifest["sources"]["topology"] == topology
    assert manifest["sources"]["accounting"]["until"] == 64800.0
    assert manifest["sources"]["rollouts"]["warm_start"] is True


def test_the_operator_tomls_read_the_operators_store() -> None:
    from linkwise.models.training import TrainConfig

    for algo in ("bc", "cql"):
        toml = ROOT / "models" / "experiments" / f"operator_{algo}.toml"
        ds = TrainConfig.from_toml(toml).dataset
        assert (ds.db, ds.trace, ds.path, ds.topology) == (DEFAULT_STORE, None, None, None)
        assert ds.holdout_last_s == 86400
    with pytest.raises(ValueError, match="exactly one of path"):
        TrainConfig.from_mapping({"algo": "bc", "dataset": {"db": "a", "trace": "b"}})


def _shadow_rows(db: Path, version: str, policy: str, times: list[float]) -> None:
    """Shadow-mode decision rows of one loop run (``version``), one cycle per time."""
    with duckdb.connect(str(db)) as con:
        for i, ts in enumerate(times):
            con.execute(
                "INSERT INTO decisions (decision_id, run_id, cycle_id, ts, mode, cluster, "
                "partition, policy, model_version, obs_spec_version, job_id, action, nodes, "
                "gpus, latency_ms, n_pending, note) VALUES (?, ?, ?, ?, 'shadow', ?, 'gpu', ?, "
                "?, '', NULL, 'wait', '', 0, 1.0, 0, '')",
                [f"{version}-{i}", version, i, ts, CLUSTER, policy, version],
            )


def test_shadow_report_takes_the_latest_span_with_evidence(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 5: a later short run (no job submitted or pending in its span) no longer breaks
    the default report (`case w0/s0 has no jobs`): the latest span with evidence is used, and
    the report names the one it skipped."""
    db = tmp_path / "live.duckdb"
    shutil.copy(store, db)
    _shadow_rows(db, "heuristic:sjf_bco", "sjf_bco", [20000.0 + 60 * i for i in range(50)])
    _shadow_rows(db, "heuristic:fifo", "fifo", [900000.0 + 2 * i for i in range(5)])
    argv = ["shadow-report", "--db", str(db), "--n-boot", "50", "--no-log",
            "--out", str(tmp_path / "r")]  # fmt: skip
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert "shadow report (sjf_bco," in out
    assert "(version heuristic:sjf_bco)" in out
    assert "- skipped a later shadow span: version heuristic:fifo (fifo; 5 cycles in " in out
    assert "no finished job was submitted in its span" in out
    code, _, err = _run([*argv, "--since", "900000"], capsys)
    assert code == 2 and "no shadow span with evidence to replay" in err
    assert "has no jobs (pick busier windows)" not in err


def test_shadow_report_defaults_to_the_operators_store_and_registry(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 5: without --db and --tracking-uri it reads linkwise-out/linkwise.duckdb and logs to
    the registry every other command uses (linkwise-out/mlflow/mlflow.db), as the README says."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / DEFAULT_STORE).parent.mkdir(parents=True)
    shutil.copy(store, tmp_path / DEFAULT_STORE)
    _shadow_rows(tmp_path / DEFAULT_STORE, "heuristic:sjf_bco", "sjf_bco", [20000.0, 30000.0])
    code, out, err = _run(["shadow-report", "--n-boot", "50", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["mlflow_run_id"]
    assert (tmp_path / "linkwise-out" / "mlflow" / "mlflow.db").is_file()
    readme = (ROOT / "README.md").read_text()
    assert "--tracking-uri sqlite:///mlflow.db" not in readme


def test_promote_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 6: promote exits 3 when the gates refuse; --help and the README say so."""
    for command in ("promote", "rollback"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "exit codes: 0" in text and "3 refused" in text and "2 bad input" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`promote` and `rollback`: 0 promoted (or rolled back), 3 refused" in readme


@pytest.mark.parametrize(
    ("mode", "policy", "refused"),
    [
        ("active", "model:challenger", True),
        ("active", "model:shadow", True),
        ("active", "model:models:/linkwise-policy@challenger", True),
        ("active", "model:champion", False),
        ("active", "model:models:/linkwise-policy/7", False),
        ("active", "sjf_bco", False),
        ("shadow", "model:challenger", False),
    ],
)
def test_active_mode_serves_only_the_champion(mode: str, policy: str, refused: bool) -> None:
    from linkwise.deployer.promote import serving_refusal
    from linkwise.policies.spec import PolicySpec

    assert (serving_refusal(mode, PolicySpec.parse(policy)) is not None) is refused


def test_serve_refuses_an_unpromoted_model_in_active_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 6: `--mode active --policy model:challenger` is refused before the loop starts."""
    argv = ["serve", "--mode", "active", "--partition", "gpu", "--policy", "model:challenger",
            "--slurm-env", str(tmp_path / "none.env"), "--lease-root", str(tmp_path)]  # fmt: skip
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert "active mode serves the registry's @champion only, not @challenger" in err


def test_durations_read_in_units_a_person_reads() -> None:
    """Issue 32: 10-second windows read ``2 windows of 0.00277778 h`` and ``0.00 days``, and a
    72-second JCT ``0.02 h``; one formatter for every text report, three digits at most."""
    seconds = (10.0, 72.0, 600.0, 858.0, 3600.0, 8676.0, 9000.0, 91584.0, 276480.0)
    assert [duration_text(s) for s in seconds] == [
        "10 s", "72 s", "10 min", "14.3 min", "1 h", "2.41 h", "2.5 h", "1.06 d", "3.2 d",
    ]  # fmt: skip
    assert [duration_text(s) for s in (-30.0, float("nan"))] == ["-30 s", "-"]


def test_a_short_jct_reads_in_seconds_and_minutes_not_hours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: the result tables printed a 72-second JCT as ``0.02`` in a column of hours.
    Ten 4-GPU jobs of 72 s submitted together on one 4-GPU node: alone, each takes 72 s;
    queued, the average is 6.6 min. The JSON keeps seconds."""
    trace = tmp_path / "short.csv"
    rows = [f"{i},0,4,72" for i in range(10)]
    trace.write_text("job_id,submit_time,num_gpus,duration\n" + "\n".join(rows) + "\n")
    argv = ["simulate", "--policy", "backfill", "--trace", str(trace)]
    code, out, err = _run([*argv, "--cluster", "10x4"], capsys)
    assert code == 0, err
    assert "│ backfill │    72 s │    72 s │       0 s │" in out
    assert "mean isolated run time 72 s" in out and "0.02" not in out
    code, out, err = _run([*argv, "--cluster", "1x4"], capsys)
    assert code == 0, err
    assert "│ backfill │ 6.6 min │ 11.9 min │   5.4 min │" in out
    code, out, err = _run([*argv, "--cluster", "1x4", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["avg_jct_s"] == pytest.approx(396.0)


def _deployment(flow: str, name: str = "daily") -> dict[str, Any]:
    """A deployment's parameters in ``prefect.yaml``, by its entrypoint's flow function."""
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    (found,) = [
        d for d in deployments if d["entrypoint"].endswith(f":{flow}") and d["name"] == name
    ]
    params: dict[str, Any] = found["parameters"]
    return params


def test_the_evaluate_deployment_gates_with_fqe_evidence(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """prefect.yaml's evaluate deployment gated @challenger without FQE, the evidence the
    challenger gate requires: every verdict was a refusal for missing evidence, so nothing
    could ever be promoted. Run with the deployment's own parameters (the store, registry,
    folders and budgets test-sized), its gate reads an FQE estimate of the challenger."""
    from linkwise.pipelines.deployments import evaluate_deployment

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = str(ROOT / _deployment("train_deployment")["config"])  # train/daily's TOML
    argv = ["train", "--config", config, "--steps", "20", "--db", str(store), "--until",
            "64800", "--tracking-uri", uri, "--json"]  # fmt: skip
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    params = _deployment("evaluate_deployment") | {
        "db": str(store), "out_dir": str(tmp_path / "e"), "tracking_uri": uri,
        "executor": "serial", "n_windows": 1, "seeds": [0], "min_jobs": 5, "n_boot": 50,
        "ope_steps": 50,
    }  # fmt: skip
    out: dict[str, Any] = evaluate_deployment.fn(**params)
    decision = out["decision"]
    (fqe,) = [r for r in decision["reasons"] if "fqe_not_below_behaviour" in r]
    assert "missing evidence" not in fqe, out.get("fqe")
    assert "FQE estimate" in fqe
    assert decision["evidence"]["ope"]["estimate"] == pytest.approx(
        decision["metrics"]["fqe_not_below_behaviour.estimate"]
    )
