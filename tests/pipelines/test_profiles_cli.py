"""``linkwise profiles`` and the dataset builder's use of learned profiles, on a store filled
through the real ingest with the exporter text of named jobs (tests/_telemetry_truth.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.datasets.store import open_store
from linkwise.pipelines.build_dataset import build_dataset, format_report
from linkwise.policies.spec import PolicySpec
from linkwise.tests._telemetry_truth import INTERVAL_S, T0, TruthJob, fill_store

RUN_S = 900.0


def _jobs() -> list[TruthJob]:
    """Three runs of one 8-GPU job name, one after another on n1, alone."""
    return [
        TruthJob(
            10 + k,
            T0 + 5.0 + k * (RUN_S + 60.0),
            T0 + 5.0 + k * (RUN_S + 60.0) + RUN_S,
            {"n1": tuple(range(8))},
            activity=0.6,
            nvlink_tx=4.0e9,
            name="llm",
        )
        for k in range(3)
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "store.duckdb"
    con = open_store(path)
    fill_store(con, _jobs(), nodes=["n1"], until=T0 + 3 * (RUN_S + 60.0) + 4 * INTERVAL_S)
    con.close()
    return path


def test_profiles_command_builds_and_reports(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profiles", "--db", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["build"]["built"] == 3 and out["build"]["with_telemetry"] == 3
    book = out["profiles"]
    assert book["runs_with_telemetry"] == 3 and list(book["by_name"]) == ["llm"]
    llm = book["by_name"]["llm"]
    assert llm["runs"] == 3 and llm["activity"] == pytest.approx(0.6)
    # 8 GPUs on one node: the ring volume per GPU-second is half the NVLink bytes per GPU-s
    assert llm["rho_gb"] == pytest.approx(4.0e9 / 0.6 * 8 / 14 / 1e9)
    assert book["job_hours"] == pytest.approx(3 * RUN_S / 3600)
    # built once: a second run builds nothing and reads the same profiles
    assert main(["profiles", "--db", str(store)]) == 0
    text = capsys.readouterr().out
    assert "0 runs summarized now" in text
    assert "1 by job name" in text and "name llm: 3 runs" in text


def test_missing_store_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no store at" in capsys.readouterr().err


def test_build_dataset_reports_the_jobs_given_history_profiles(store: Path, tmp_path: Path) -> None:
    assert main(["profiles", "--db", str(store), "--json"]) == 0
    m = build_dataset(
        store,
        out_dir=tmp_path,
        rollouts=1,
        policies=(PolicySpec.parse("fifo"),),
        epsilons=(0.0,),
        window_s=6 * 3600.0,
        min_jobs=1,
        topology="2x8",
        executor="serial",
    )
    assert m["profiles"]["history_name"] == 3 and m["profiles"]["default"] == 0
    assert m["sources"]["rollouts"]["profiles"]["history"] == 3
    assert "rollout jobs' profiles: 3 jobs from history" in format_report(m)
