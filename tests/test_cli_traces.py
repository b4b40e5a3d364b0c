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
