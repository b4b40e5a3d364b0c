"""Hostile accounting through the real command path: ``linkwise collect accounting`` runs
``sacct``/``sinfo`` as subprocesses; here they are stand-in executables on PATH printing the
real captured Slurm 22.05 output plus hostile records (user-controlled names with bytes that
are not UTF-8, ids and times of the wrong type, absurd GPU counts, a million-node list)."""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from linkwise.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"

FAKE = """#!{python}
import os, sys
args = sys.argv[1:]
name = os.path.basename(sys.argv[0])
out = sys.stdout.buffer
if name == "scontrol" and args == ["--version"]:  # the release picks sinfo --json
    out.write(b"slurm 22.05.8\\n")
elif name == "sinfo":
    out.write(open({sinfo!r}, "rb").read())
elif "--json" in args:
    out.write(open({doc!r}, "rb").read())
elif args[args.index("-o") + 1] == "JobIDRaw":
    out.write(b"12\\n13\\n14\\n")
"""


def _rec(base: dict[str, Any], job_id: object, **fields: Any) -> dict[str, Any]:
    rec = copy.deepcopy(base)
    rec["job_id"] = job_id
    rec.update(fields)
    return rec


def _hostile_doc(path: Path) -> int:
    """The real fixture's records plus hostile ones; returns how many are hostile."""
    doc = json.loads((FIX / "sacct.json").read_text())
    base = doc["jobs"][1]  # job 12: one GPU on gpu01
    gpus = {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 5_000_000_000}]}
    many = {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 64}]}
    hostile = [
        _rec(base, "12x"),
        _rec(base, None),
        _rec(base, 901, time="yesterday"),
        _rec(base, 902, tres=gpus),
        _rec(base, 903, tres=many),  # more GPUs than the cluster's 16
        _rec(base, 904, nodes="gpu[1-1000000]", allocation_nodes=1000000),
        _rec(base, 905, time={**base["time"], "start": -5}),
        _rec(base, 906, name="NONUTF8"),  # kept: the name's bytes become U+FFFD
    ]
    doc["jobs"] += hostile
    text = json.dumps(doc).encode().replace(b"NONUTF8", b"caf\xe9 \xff")
    path.write_bytes(text)
    return len(hostile) - 1


@pytest.fixture()
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    doc = tmp_path / "sacct.json"
    n_hostile = _hostile_doc(doc)
    script = FAKE.format(python=sys.executable, sinfo=str(FIX / "sinfo.json"), doc=str(doc))
    for name in ("sacct", "sinfo", "scontrol"):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    env = tmp_path / "env"
    env.write_text(f"SLURM_CONF={tmp_path / 'slurm.conf'}\nLINKWISE_SLURM_CLUSTER=linkwise\n")
    return env, n_hostile


def test_hostile_records_are_rejected_one_by_one_and_the_window_commits(
    fake_slurm: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env, n_hostile = fake_slurm
    db = tmp_path / "store.duckdb"
    until = time.time()
    args = ["collect", "accounting", "--db", str(db), "--slurm-env", str(env)]
    args += ["--since", str(until - 3600), "--until", str(until), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    # the parser's rejects hold the watermark at the window's start (read again next time)
    assert out["rejected"] == out["new_rejects"] == n_hostile and out["watermark"] == until - 3600
    assert out["watermark_held"] and out["held_at"] == until - 3600
    assert out["received"] == 9 + n_hostile + 1
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT job_id, field, reason FROM rejected_rows ORDER BY job_id NULLS FIRST"
        ).fetchall()
        name = con.execute("SELECT name FROM jobs WHERE job_id = 906").fetchall()
        jobs = con.execute("SELECT count(*), max(gpus) FROM jobs").fetchall()[0]
        node_rows = con.execute("SELECT count(*) FROM job_nodes").fetchall()[0][0]
        raw = con.execute("SELECT max(length(raw)) FROM rejected_rows").fetchall()[0][0]
    assert rows == [
        (None, "job_id", "job_id is missing"),
        ("12x", "job_id", "job_id is not an integer"),
        ("901", "time", "time is not an object"),
        ("902", "tres.allocated", "tres.allocated: absurd GPU count"),
        ("903", "gpus", "more GPUs than the cluster has"),
        ("904", "nodes", "more nodes than the cluster has"),
        ("905", "time.start", "time.start is negative"),
    ]
    assert name == [("caf\ufffd \ufffd",)]
    # 10 runs: the fixture's 9 records (job 16 requeued: two runs, kept apart by their submit
    # times since issue 21's key) and job 906
    assert jobs[0] == 10 and jobs[1] <= 16 and node_rows < 20 and raw <= 64 * 1024
    # a second run reads the same window again: nothing new, the same rejects kept once
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["inserted"], again["rejected"], again["new_rejects"]) == (0, n_hostile, 0)
    with duckdb.connect(str(db), read_only=True) as con:
        seen = con.execute("SELECT count(*), min(seen), max(seen) FROM rejected_rows").fetchall()
    assert seen == [(n_hostile, 2, 2)]


def test_text_output_names_the_rejections(
    fake_slurm: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env, n_hostile = fake_slurm
    until = time.time()
    args = ["collect", "accounting", "--db", str(tmp_path / "s.duckdb"), "--slurm-env", str(env)]
    assert main([*args, "--since", str(until - 60), "--until", str(until)]) == 0
    text = capsys.readouterr().out
    assert f"{n_hostile} rejected" in text
    assert "rejected 1: more nodes than the cluster has" in text


def test_a_missing_cluster_name_names_the_real_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21 (11): the error names ``--slurm-cluster``, the flag that exists."""
    env = tmp_path / "env"
    env.write_text(f"SLURM_CONF={tmp_path / 'slurm.conf'}\n")
    code = main(["collect", "accounting", "--db", str(tmp_path / "s.duckdb"), "--slurm-env",
                 str(env)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "pass --slurm-cluster" in err and "--cluster " not in err
    assert not (tmp_path / "s.duckdb").exists()  # refused before touching the store
