"""``simulate`` on a trace with bad rows: the JSON output counts them, and every rejected row
can be written out with its file, line and reason."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from linkwise.cli import main


def test_simulate_json_counts_rejections_and_writes_each_rejected_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_time,num_gpus,duration\n"
        "1,0,1,100\n"
        "2,10,abc,100\n"  # line 3: not a number
        "3,20,64,100\n"  # more GPUs than 2x4: left out
        "4,30,2,-5\n"  # line 5: duration <= 0
        "5,40,4,50\n"
    )
    out_file = tmp_path / "rejected.csv"
    args = ["simulate", "--trace", str(trace), "--cluster", "2x4", "--json"]
    assert main([*args, "--rejected-out", str(out_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rejected_rows"] == 2 and out["left_out_too_big"] == 1
    with out_file.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["file"], r["line"], r["reason"]) for r in rows] == [
        (str(trace), "3", "non-numeric num_gpus"),
        (str(trace), "5", "duration <= 0"),
    ]
    assert rows[0]["raw"] == "2,10,abc,100"


def test_a_directory_given_as_a_trace_is_a_clear_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--trace", str(tmp_path), "--cluster", "2x4", "--json"]) == 2
    assert "is a directory, not a trace file" in capsys.readouterr().err


# ------------------------------------------------------------------ --history and predictions


def _trace(path: Path, t0: int, n: int, seed: int = 1) -> Path:
    """A native trace of ``n`` jobs from ``t0`` (dated seconds), users with typical run times."""
    import random

    rng = random.Random(seed)
    lines = ["job_id,submit_time,num_gpus,duration,user,name"]
    for i in range(n):
        user = rng.choice(["alice", "bob", "carol"])
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        base = {"alice": 600, "bob": 3600, "carol": 20000}[user]
        lines.append(f"{i},{t0 + i * 120},{gpus},{base * rng.uniform(0.5, 2):.0f},{user},j{gpus}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    return _trace(tmp_path / "old.csv", 1_000_000, 120), _trace(
        tmp_path / "new.csv", 1_020_000, 80, 2
    )


def test_compare_with_history_gives_predictions_bounds_and_the_jct_split(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = traces
    argv = ["compare", "--trace", str(new), "--history", str(old), "--json"]
    argv += ["--policies", "backfill,sjf_bco,qssf", "--cluster", "48x8"]
    assert main([*argv, "--plot", str(tmp_path / "p.png")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["backfill", "sjf_bco", "qssf"]
    for r in rows:
        assert r["predictions"] == "history" and r["oracle"] is False
        for key in (
            "avg_queue_s",
            "avg_runtime_inflation",
            "lower_bound_isolated_s",
            "lower_bound_queue_s",
            "avg_jct_over_lb",
            "avg_jct_over_queue_lb",
        ):
            assert isinstance(r[key], float), key  # fmt: skip
        assert r["lower_bound_queue_s"] >= r["lower_bound_isolated_s"] > 0
        assert r["avg_jct_over_queue_lb"] >= 1 - 1e-9 and r["avg_jct_over_lb"] >= 1 - 1e-9
        # the split: avg JCT = queueing + isolated run time inflated by contention
        split = r["avg_queue_s"] + r["lower_bound_isolated_s"] * (1 + r["avg_runtime_inflation"])
        assert split == pytest.approx(r["avg_jct_s"])


def test_qssf_without_history_is_refused_before_simulating(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = traces
    plot = tmp_path / "p.png"
    argv = ["compare", "--trace", str(new), "--policies", "backfill,qssf", "--plot", str(plot)]
    assert main([*argv, "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "qssf" in out.err and "--history" in out.err
    assert not plot.exists()
    assert main(["simulate", "--trace", str(new), "--policy", "qssf", "--cluster", "4x8"]) == 2
    assert "--history" in capsys.readouterr().err


def test_history_is_fit_only_on_jobs_before_the_evaluated_ones(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = traces
    both = tmp_path / "both.csv"  # the history and the evaluated jobs in one file
    rows = old.read_text().splitlines()[1:] + new.read_text().splitlines()[1:]
    renumbered = [f"{i},{row.split(',', 1)[1]}" for i, row in enumerate(rows)]
    both.write_text("\n".join([old.read_text().splitlines()[0], *renumbered]) + "\n")
    argv = ["simulate", "--trace", str(new), "--history", str(both), "--policy", "qssf"]
    assert main([*argv, "--cluster", "4x8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["history_jobs"] == 120 and out["history_jobs_left_out"] == 80
    assert (
        out["predictor_fit_until"] == 20_000.0
    )  # the new trace's first job, on the history's clock
    # the evaluated trace as its own history: nothing before it
    assert main(["simulate", "--trace", str(new), "--history", str(new), "--policy", "qssf"]) == 2
    assert "submitted before" in capsys.readouterr().err


def test_oracles_are_marked_in_json_rows_and_tables(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = traces
    argv = ["compare", "--trace", str(new), "--cluster", "4x8", "--plot", str(tmp_path / "p.png")]
    argv += ["--policies", "sjf_bco,sjf_bco_oracle,srtf_oracle"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["policy"]: r["oracle"] for r in rows} == {
        "sjf_bco": False, "sjf_bco_oracle": True, "srtf_oracle": True,
    }  # fmt: skip
    assert all(r["predictions"] is None for r in rows)
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "sjf_bco_oracle (oracle)" in table and "srtf_oracle (oracle)" in table
    assert "sjf_bco (oracle)" not in table


def test_a_store_of_accounting_is_a_history_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from linkwise.datasets.ingest import ingest_job_runs
    from linkwise.datasets.store import open_store
    from linkwise.testkit.history import completed_run

    t0 = 1.7e9
    runs = [  # 12 finished jobs before the trace, 3 after its first job (left out)
        completed_run(i + 1, t0 + 100 * i, t0 + 100 * i + 5, t0 + 100 * i + 600, {"gpu1": 2})
        for i in range(15)
    ]
    with open_store(tmp_path / "acct.duckdb") as con:
        ingest_job_runs(con, runs, source="test")
    trace = tmp_path / "new.csv"
    trace.write_text(
        "job_id,submit_time,num_gpus,duration\n"
        + "".join(f"{i},{t0 + 1200 + 60 * i:.0f},2,{300 + i}\n" for i in range(10))
    )
    argv = ["simulate", "--trace", str(trace), "--history", str(tmp_path / "acct.duckdb")]
    assert main([*argv, "--policy", "qssf", "--cluster", "2x4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["history_jobs"] == 12 and out["history_jobs_left_out"] == 3
    assert out["predictions"] == "history" and out["jobs"] == 10
