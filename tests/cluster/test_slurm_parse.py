"""Parsing of real Slurm 22.05 output captured from scripts/local-slurm (no Slurm needed)."""

from __future__ import annotations

import copy
import gc
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.accounting import (
    NO_NODES,
    ExitStatus,
    RunKey,
    _accounting_exit,
    ctld_exit_codes,
    decode_wait_status,
    parse_accounting,
    parse_accounting_json,
    parse_acct_lines,
    parse_exit_pair,
    run_indexes,
)
from linkwise.cluster.slurm.client import PyslurmTransport, SlurmUnavailable
from linkwise.cluster.slurm.document import epoch_or_none, gc_paused, int_or_zero, limit_seconds
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.gpu_counts import even_split, gres_gpus, tres_gpus
from linkwise.cluster.slurm.nodes import parse_nodes
from linkwise.cluster.slurm.partitions import parse_partitions, parse_scontrol_partitions
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import JobRun
from linkwise.cluster.slurm.rest_transport import RestTransport

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
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


def reference_job_run(
    rec: Mapping[str, Any], codes: Mapping[RunKey, ExitStatus], indexes: Mapping[RunKey, int]
) -> JobRun:
    """The straightforward per-record parse (before the fast path), kept as the oracle."""
    t = rec.get("time") or {}
    job_id = int(rec["job_id"])
    submit = int_or_zero(t.get("submission"))
    key = (job_id, submit)
    state = str((rec.get("state") or {}).get("current", "UNKNOWN")).split(" ")[0]
    node_expr = str(rec.get("nodes") or "")
    nodes = tuple(expand(node_expr)) if node_expr and node_expr != NO_NODES else ()
    gpus = tres_gpus(((rec.get("tres") or {}).get("allocated")) or [])
    allocation_nodes = int(rec.get("allocation_nodes") or 0)
    array = rec.get("array") or {}
    array_job = int(array.get("job_id") or 0)
    task = array.get("task_id")
    code, signal = _accounting_exit(state, rec.get("exit_code"), codes.get(key))
    return JobRun(
        cluster=str(rec.get("cluster") or ""),
        job_id=job_id,
        run_index=indexes.get(key, 0),
        name=str(rec.get("name") or ""),
        user=str(rec.get("user") or ""),
        account=str(rec.get("account") or ""),
        partition=str(rec.get("partition") or ""),
        state=state,
        exit_code=code,
        signal=signal,
        submit_time=float(submit),
        start_time=epoch_or_none(t.get("start")),
        end_time=epoch_or_none(t.get("end")),
        time_limit_s=limit_seconds(t.get("limit")),
        nodes=nodes,
        gpus=gpus,
        gpus_per_node=even_split(gpus, len(nodes)),
        allocation_nodes=allocation_nodes,
        settled=allocation_nodes > 0 or node_expr in (NO_NODES, ""),
        array_job_id=array_job or None,
        array_task_id=int(task) if array_job and task is not None else None,
        comment=str((rec.get("comment") or {}).get("job") or ""),
    )


def odd_records_doc() -> dict[str, Any]:
    """sacct.json with the shapes the captures lack: arrays, comments, nulls, odd states."""
    doc = copy.deepcopy(load("sacct.json"))
    jobs = doc["jobs"]
    extra = copy.deepcopy(jobs)
    for i, rec in enumerate(extra):
        rec["job_id"] = 1000 + i
    extra[0]["array"] = {"job_id": 999, "task_id": 3}
    extra[1]["array"] = {"job_id": 999, "task_id": None}
    extra[2]["comment"] = {"job": "note ü", "administrator": None, "system": None}
    extra[3]["time"]["limit"] = None
    extra[4]["nodes"], extra[4]["allocation_nodes"] = "gpu[01-03],cpu7", 0
    extra[5]["state"] = {"current": "CANCELLED by 0"}
    extra[6]["exit_code"] = None
    extra[7]["tres"] = {"allocated": [{"type": "gres", "name": "gpu", "count": 3}]}
    extra[7]["nodes"], extra[7]["allocation_nodes"] = "gpu[02-03]", 2
    extra[8]["time"] = None
    del extra[8]["state"], extra[8]["tres"], extra[8]["array"], extra[8]["comment"]
    doc["jobs"] = jobs + extra
    return doc


def test_fast_path_equals_reference_on_all_fixtures() -> None:
    lines = parse_acct_lines((FIX / "sacct_lines.txt").read_text())
    codes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    idx = run_indexes((x.job_id, x.submit_time, x.state) for x in lines)
    ctld = ctld_exit_codes(load("ctld_jobs.json"))
    texts = [(FIX / n).read_text(encoding="utf-8") for n in ("sacct.json", "sacct_running.json")]
    texts.append(json.dumps(odd_records_doc()))
    for text in texts:
        for c, i in [({}, {}), (codes, idx), (ctld, {})]:
            ref = [reference_job_run(r, c, i) for r in json.loads(text)["jobs"]]
            assert parse_accounting_json(text, c, i) == ref
            assert parse_accounting_json(text.encode(), c, i) == ref
            assert parse_accounting(json.loads(text), c, i) == ref
    odd = {r.job_id: r for r in parse_accounting_json(texts[-1])}
    assert (odd[1000].array_job_id, odd[1000].array_task_id) == (999, 3)
    assert odd[1004].nodes == ("gpu01", "gpu02", "gpu03", "cpu7") and not odd[1004].settled
    assert odd[1007].gpus_per_node == (2, 1) and odd[1008].state == "UNKNOWN"


def test_fast_path_errors_and_check() -> None:
    with pytest.raises(SlurmError, match="not JSON"):
        parse_accounting_json('{"jobs": [')
    with pytest.raises(SlurmError, match="not an object"):
        parse_accounting_json("[]")
    with pytest.raises(SlurmError, match="boom"):
        parse_accounting_json('{"jobs": [], "errors": [{"error": "boom"}]}')
    seen: list[dict[str, Any]] = []
    assert parse_accounting_json('{"jobs": [], "errors": []}', check=seen.append) == []
    assert seen == [{"jobs": [], "errors": []}]


def test_gc_paused_restores_the_collector_state() -> None:
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), gc_paused():
        assert not gc.isenabled()
        _ = 1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left off as it was found
    finally:
        gc.enable()


def _one(**changes: Any) -> dict[str, Any]:
    """The fixture's first accounting record with some fields replaced (None deletes)."""
    rec = copy.deepcopy(load("sacct.json")["jobs"][0])
    for path, value in changes.items():
        node = rec
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return rec


def _gpu_tres(count: object) -> dict[str, Any]:
    return {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": count}]}


def test_each_bad_accounting_record_is_rejected_with_its_job_field_and_reason() -> None:
    from linkwise.cluster.slurm.accounting import parse_accounting_batch

    good = _one()
    bad = [
        _one(job_id="abc"),
        _one(job_id=None),
        _one(job_id=True),
        _one(time="yesterday"),
        _one(time__submission="x"),
        _one(time__start=-5),
        _one(tres=_gpu_tres(5_000_000_000)),
        _one(tres=_gpu_tres(99999999999999999999)),
        _one(tres=_gpu_tres("many")),
        _one(nodes="gpu[1-"),
        _one(name={"not": "text"}),
        _one(state="COMPLETED"),
        _one(allocation_nodes=-1),
        "not a record",
    ]
    batch = parse_accounting_batch({"jobs": [good, *bad], "errors": []})
    assert [r.job_id for r in batch.runs] == [good["job_id"]]
    got = [(r.job_id, r.field) for r in batch.rejected]
    jid = str(good["job_id"])
    assert got == [
        ("abc", "job_id"),
        (None, "job_id"),
        ("True", "job_id"),
        (jid, "time"),
        (jid, "time.submission"),
        (jid, "time.start"),
        (jid, "tres.allocated"),
        (jid, "tres.allocated"),
        (jid, "tres.allocated"),
        (jid, "nodes"),
        (jid, "name"),
        (jid, "state"),
        (jid, "allocation_nodes"),
        (None, "record"),
    ]
    reasons = [r.reason for r in batch.rejected]
    assert reasons[0] == "job_id is not an integer" and reasons[5] == "time.start is negative"
    assert reasons[6] == reasons[7] == "tres.allocated: absurd GPU count"
    assert all(r.raw for r in batch.rejected)
    assert json.loads(batch.rejected[0].raw)["job_id"] == "abc"
    with pytest.raises(SlurmError, match=r"job abc: job_id is not an integer"):
        parse_accounting({"jobs": [good, bad[0]], "errors": []})


def test_non_utf8_bytes_in_a_job_name_become_replacement_characters() -> None:
    from linkwise.cluster.slurm.accounting import parse_accounting_batch_json

    text = json.dumps({"jobs": [_one(name="NAME")], "errors": []}).encode()
    raw = text.replace(b"NAME", b"bad \xff\xfe name")
    batch = parse_accounting_batch_json(raw)
    assert not batch.rejected and batch.runs[0].name == "bad \ufffd\ufffd name"
    lone = text.replace(b"NAME", b"half \\ud800 pair")  # an escape that is no character
    assert parse_accounting_batch_json(lone).runs[0].name == "half \ufffd pair"


def test_unreadable_exit_code_lines_are_skipped_not_fatal() -> None:
    text = "12|1795976332|FAILED|3:0\n13|soon|COMPLETED|0:0\n14|1795976333|FAILED|x:y\n"
    lines = parse_acct_lines(text)
    assert [(x.job_id, x.exit_code) for x in lines] == [(12, 3)]


def test_an_integer_beyond_64_bits_rejects_its_record_not_the_document() -> None:
    from linkwise.cluster.slurm.accounting import parse_accounting_batch_json

    good = _one()
    text = json.dumps({"jobs": [good, _one(job_id=77, tres=_gpu_tres(12345))], "errors": []})
    text = text.replace('"count": 12345', '"count": 99999999999999999999')
    batch = parse_accounting_batch_json(text)
    assert [r.job_id for r in batch.runs] == [good["job_id"]]
    assert [(r.job_id, r.reason) for r in batch.rejected] == [
        ("77", "tres.allocated: absurd GPU count")
    ]


def test_rest_accounting_keeps_good_records_beside_hostile_ones() -> None:
    """slurmrestd answers served over HTTP: a name with bytes that are not UTF-8 and a
    record whose id is not an integer (read per record, never the whole answer refused)."""
    import http.server
    import threading

    good = _one(name="NAME")
    bad = _one(job_id="x1")
    jobs = json.dumps({"jobs": [good, bad], "errors": []}).encode()
    jobs = jobs.replace(b"NAME", b"caf\xe9")
    one = json.dumps({"jobs": [good], "errors": []}).encode().replace(b"NAME", b"caf\xe9")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if "/slurm/" in self.path:
                body = b'{"jobs": [], "errors": []}'
            elif "/job/" in self.path:
                body = one
            else:
                body = jobs
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        rest = RestTransport(
            f"http://127.0.0.1:{httpd.server_address[1]}", "root", lambda: "t", api="v0.0.38"
        )
        batch = rest.accounting(0.0, 1.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [r.name for r in batch.runs] == ["caf\ufffd"]
    assert batch.rejected == ()  # the bad id is not listed by job_ids: never fetched
    with pytest.raises(SlurmError):
        RestTransport("http://127.0.0.1:1", "root", lambda: "t", timeout=1.0).accounting(0, 1)


def test_controller_exit_codes_skip_unreadable_jobs() -> None:
    doc = {
        "jobs": [
            {"job_id": 5, "submit_time": 10, "job_state": "FAILED", "exit_code": 768},
            {"job_id": "x", "submit_time": 10, "job_state": "FAILED", "exit_code": 768},
            {"job_id": 6, "submit_time": "soon", "job_state": "FAILED", "exit_code": 768},
            {"job_id": 7, "submit_time": 10, "job_state": "FAILED", "exit_code": "?"},
            "not a job",
        ]
    }
    assert ctld_exit_codes(doc) == {(5, 10): (3, None)}
