"""Parsing of real Slurm 22.05 output captured from scripts/local-slurm (no Slurm needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.slurm.client import PyslurmTransport, SlurmUnavailable
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.parse import (
    ctld_exit_codes,
    decode_wait_status,
    even_split,
    gres_gpus,
    parse_accounting,
    parse_acct_lines,
    parse_exit_pair,
    parse_nodes,
    parse_partitions,
    parse_queue,
    parse_scontrol_partitions,
    run_indexes,
)
from linkwise.cluster.slurm.rest_transport import RestTransport

FIX = Path(__file__).resolve().parent / "fixtures" / "slurm"
IDS: dict[str, int] = json.loads((FIX / "ids.json").read_text())


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIX / name).read_text(encoding="utf-8"))
    return doc


def runs_cli() -> dict[tuple[int, int], Any]:
    lines = parse_acct_lines((FIX / "sacct_lines.txt").read_text())
    codes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    idx = run_indexes((x.job_id, x.submit_time, x.state) for x in lines)
    return {(r.job_id, r.run_index): r for r in parse_accounting(load("sacct.json"), codes, idx)}


def test_exit3_is_recovered_from_sacct_lines_despite_json_defect() -> None:
    raw = next(j for j in load("sacct.json")["jobs"] if j["job_id"] == IDS["exit3"])
    assert raw["exit_code"] == {"status": "SUCCESS", "return_code": 0}  # the 22.05 defect
    run = runs_cli()[(IDS["exit3"], 0)]
    assert (run.state, run.exit_code, run.signal) == ("FAILED", 3, None)


def test_failed_without_second_source_has_unknown_exit_code() -> None:
    runs = {r.job_id: r for r in parse_accounting(load("sacct.json"))}
    assert runs[IDS["exit3"]].exit_code is None
    assert (runs[IDS["signal"]].exit_code, runs[IDS["signal"]].signal) == (0, 9)


def test_ctld_wait_status_gives_same_exit_codes() -> None:
    codes = ctld_exit_codes(load("ctld_jobs.json"))
    exit3 = next(k for k in codes if k[0] == IDS["exit3"])
    assert codes[exit3] == (3, None)
    runs = {r.job_id: r for r in parse_accounting(load("sacct.json"), codes)}
    assert runs[IDS["exit3"]].exit_code == 3


def test_requeued_job_has_two_runs() -> None:
    runs = runs_cli()
    first, second = runs[(IDS["requeue"], 0)], runs[(IDS["requeue"], 1)]
    assert first.state == "REQUEUED" and second.state == "COMPLETED"
    assert second.submit_time > first.submit_time


def test_nodes_gpus_and_names() -> None:
    runs = runs_cli()
    two = runs[(IDS["two_node"], 0)]
    assert two.nodes == ("gpu01", "gpu02") and two.gpus == 4 and two.gpus_per_node == (2, 2)
    assert two.allocation_nodes == 2 and two.settled
    assert runs[(IDS["weird"], 0)].name == "x;$(rm -rf /) ü 名前"
    assert runs[(IDS["one_gpu"], 0)].time_limit_s == 300.0
    assert runs[(IDS["cancel"], 0)].state == "CANCELLED"
    assert runs[(IDS["signal"], 0)].gpus == 0 and runs[(IDS["signal"], 0)].gpus_per_node == (0,)


def test_transient_multinode_record_is_not_settled() -> None:
    doc = copy.deepcopy(load("sacct.json"))
    rec = next(j for j in doc["jobs"] if j["job_id"] == IDS["two_node"])
    rec["allocation_nodes"], rec["nodes"] = 0, "gpu01"
    run = next(r for r in parse_accounting(doc) if r.job_id == IDS["two_node"])
    assert not run.settled and run.nodes == ("gpu01",)


def test_run_indexes_restart_after_a_normal_end() -> None:
    got = run_indexes(
        [(5, 10, "REQUEUED"), (5, 20, "COMPLETED"), (5, 30, "COMPLETED"), (6, 1, "X")]
    )
    assert got == {(5, 10): 0, (5, 20): 1, (5, 30): 0, (6, 1): 0}


def test_small_helpers() -> None:
    assert parse_exit_pair("3:0") == (3, None) and parse_exit_pair("0:9") == (0, 9)
    assert parse_exit_pair("") == (None, None)
    assert decode_wait_status(768) == (3, None) and decode_wait_status(9) == (0, 9)
    assert even_split(5, 2) == (3, 2) and even_split(3, 0) == ()
    assert gres_gpus("gpu:a100:4(S:0-1),gpu:2(IDX:0,1),mps:100") == 6
    assert gres_gpus("(null)") == 0


def test_queue_from_squeue_json() -> None:
    queue = {q.job_id: q for q in parse_queue(load("squeue.json"))}
    held = queue[IDS["held"]]
    assert held.held and held.state == "PENDING" and held.num_nodes == 4 and held.gpus == 16
    assert IDS["exit3"] not in queue  # finished jobs are not in the queue
    assert queue == {q.job_id: q for q in parse_queue(load("squeue.json"))}


def test_nodes_cli_and_rest_agree() -> None:
    cli, rest = parse_nodes(load("sinfo.json")), parse_nodes(load("rest_nodes.json"))
    assert [n.name for n in cli] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert all(n.gpus_total == 4 for n in cli) and all(n.partitions == ("gpu",) for n in cli)
    assert sum(n.gpus_used for n in cli) > 0  # captured while jobs ran
    assert [n.gpus_total for n in rest] == [4, 4, 4, 4]


def test_partitions_cli_and_rest_agree() -> None:
    cli = parse_scontrol_partitions((FIX / "scontrol_partitions.txt").read_text())
    assert cli == parse_partitions(load("rest_partitions.json"))
    assert cli[0].name == "gpu" and cli[0].nodes == ("gpu01", "gpu02", "gpu03", "gpu04")


def test_errors_in_json_raise() -> None:
    with pytest.raises(SlurmError, match="boom"):
        parse_accounting({"jobs": [], "errors": [{"error": "boom"}]})
    with pytest.raises(SlurmError, match="no 'jobs' list"):
        parse_accounting({"errors": []})


def test_rest_repr_hides_token() -> None:
    t = RestTransport("http://127.0.0.1:1", "root", lambda: "SECRET-TOKEN")
    assert "SECRET" not in repr(t)
    with pytest.raises(SlurmUnavailable) as err:
        t.nodes()
    assert "SECRET" not in str(err.value) and "127.0.0.1:1" in str(err.value)


def test_pyslurm_transport_says_why_it_is_unavailable() -> None:
    with pytest.raises(SlurmUnavailable, match="pyslurm"):
        PyslurmTransport()
