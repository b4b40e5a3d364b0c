"""Slurm 24.11 (data_parser v0.0.42) and 26.05 (v0.0.45) output -> the same typed records
as 22.05's (tests/cluster/test_slurm_parse.py), from the real captures of the job mix in
../shared/data/slurm (its README: what was submitted, on which packages); and a generation
this client does not read is refused."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.slurm.accounting import (
    ctld_exit_codes,
    parse_accounting_batch,
    parse_accounting_batch_json,
    parse_acct_lines,
    run_indexes,
)
from linkwise.cluster.slurm.cli_transport import parse_release
from linkwise.cluster.slurm.nodes import parse_nodes
from linkwise.cluster.slurm.partitions import parse_partitions
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.rest_transport import pick_api, served_apis
from linkwise.cluster.slurm.schema import (
    SlurmSchemaError,
    exit_status,
    generation,
    job_state_text,
    node_state_text,
    number,
)
from linkwise.tests._slurm import SHARED_SLURM_DATA

FIXTURES = Path(__file__).parents[1] / "fixtures"
VERSIONS = {"24.11": "v0.0.42", "26.05": "v0.0.45"}


def _doc(version: str, name: str) -> dict[str, Any]:
    doc = json.loads((SHARED_SLURM_DATA / version / name).read_text())
    assert isinstance(doc, dict)
    return doc


def _final_runs(version: str, phase: str = "final") -> Any:
    text = (SHARED_SLURM_DATA / version / phase / "sacct.json").read_text()
    lines = parse_acct_lines(_epoch_lines(version, phase))
    codes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    indexes = run_indexes((x.job_id, x.submit_time, x.state) for x in lines)
    return parse_accounting_batch_json(text, codes, indexes)


def _epoch_lines(version: str, phase: str) -> str:
    """The captured ``sacct -P`` lines with their local-time Submit as epoch seconds (the
    transport asks for ``SLURM_TIME_FORMAT=%s``): the capture's JSON gives each time."""
    doc = _doc(version, f"{phase}/sacct.json")
    by_job: dict[int, list[int]] = {}
    for rec in doc["jobs"]:
        by_job.setdefault(rec["job_id"], []).append(rec["time"]["submission"])
    out = []
    seen: dict[int, int] = {}
    text = (SHARED_SLURM_DATA / version / phase / "sacct-lines.txt").read_text()
    for line in text.splitlines():
        if not line.strip():
            continue
        job, _submit, state, code = line.split("|")
        i = seen.get(int(job), 0)
        seen[int(job)] = i + 1
        out.append(f"{job}|{sorted(by_job[int(job)])[i]}|{state}|{code}")
    return "\n".join(out)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_accounting_of_the_job_mix_is_read_whole(version: str) -> None:
    batch = _final_runs(version)
    assert batch.rejected == ()
    assert len(batch.runs) == 13
    runs = {(r.job_id, r.run_index): r for r in batch.runs}
    # the requeued job: its first run REQUEUED (the -P line's word, not PENDING), then a
    # second run that completed
    first, second = runs[(6, 0)], runs[(6, 1)]
    assert first.state == "REQUEUED" and second.state == "COMPLETED"
    assert first.comment == second.comment == "linkwise:migratable"
    assert second.submit_time > first.submit_time
    # an exit 3 reads 3 from the JSON itself (22.05's defect is gone)
    assert (runs[(4, 0)].state, runs[(4, 0)].exit_code, runs[(4, 0)].signal) == ("FAILED", 3, None)
    assert runs[(9, 0)].state == "TIMEOUT"
    assert runs[(5, 0)].state == "CANCELLED"
    # time limits are minutes inside {set, infinite, number}
    assert runs[(1, 0)].time_limit_s == 300.0 and runs[(7, 0)].time_limit_s == 180.0
    # shapes: -N2 --gres=gpu:4 is 8 GPUs over 2 nodes, -N4 16 over 4
    assert runs[(2, 0)].nodes == ("gpu02", "gpu03") and runs[(2, 0)].gpus == 8
    assert runs[(2, 0)].gpus_per_node == (4, 4)
    assert len(runs[(7, 0)].nodes) == 4 and runs[(7, 0)].gpus == 16
    assert all(r.settled for r in batch.runs)
    # the array: four tasks 0-3 of array job 3
    tasks = sorted(r.array_task_id for r in batch.runs if r.array_job_id == 3)
    assert tasks == [0, 1, 2, 3]
    assert runs[(1, 0)].array_task_id is None and runs[(1, 0)].array_job_id is None


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_states_agree_with_the_text_lines(version: str) -> None:
    """Every record's state is the word ``sacct -P`` prints for that run."""
    for phase in ("running", "final"):
        batch = _final_runs(version, phase)
        assert batch.rejected == ()
        lines = parse_acct_lines(_epoch_lines(version, phase))
        words = {(x.job_id, x.submit_time): x.state for x in lines}
        for run in batch.runs:
            assert run.state == words[(run.job_id, int(run.submit_time))], run


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_rest_accounting_is_the_same_records(version: str) -> None:
    api = VERSIONS[version]
    doc = _doc(version, f"rest-{api}/slurmdb_{api}_jobs.json")
    batch = parse_accounting_batch(doc)
    assert batch.rejected == () and len(batch.runs) == 12  # the list omits run 0 of job 6
    cli = {(r.job_id, r.submit_time): r for r in _final_runs(version).runs}
    for run in batch.runs:
        other = cli[(run.job_id, run.submit_time)]
        assert (run.state, run.nodes, run.gpus, run.exit_code) == (
            other.state,
            other.nodes,
            other.gpus,
            other.exit_code,
        )


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_queue_reads_new_shapes(version: str) -> None:
    jobs = {j.job_id: j for j in parse_queue(_doc(version, "running/squeue.json"))}
    assert jobs, "the running capture has pending and running jobs"
    for job in jobs.values():
        assert job.state in ("PENDING", "RUNNING")
        assert job.submit_time > 1.7e9
        assert job.unmodelled == (), job  # gres/gpu:N is a GPU request, not unmodelled
        assert job.gpus > 0
    held = jobs[8]
    assert held.held and held.state == "PENDING" and held.reason == "JobHeldUser"
    assert not jobs[7].held and jobs[7].num_nodes == 4 and jobs[7].gpus == 16
    assert jobs[7].time_limit_s == 180.0
    assert jobs[2].state == "RUNNING" and jobs[2].nodes == ("gpu02", "gpu03")
    assert jobs[6].requeue and jobs[6].comment == "linkwise:migratable"


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_nodes_and_partitions(version: str) -> None:
    api = VERSIONS[version]
    for doc in [_doc(version, f"rest-{api}/slurm_{api}_nodes.json")] + (
        [_doc(version, "running/scontrol-show-nodes.json")] if version == "24.11" else []
    ):
        nodes = parse_nodes(doc)
        assert [n.name for n in nodes] == ["gpu01", "gpu02", "gpu03", "gpu04"]
        assert all(n.gpus_total == 4 and n.cpus == 8 and n.memory_mb == 16000 for n in nodes)
        assert all(n.partitions == ("gpu",) for n in nodes)
        assert all(n.state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED") for n in nodes)
    (part,) = parse_partitions(_doc(version, f"rest-{api}/slurm_{api}_partitions.json"))
    assert (part.name, part.nodes, part.state) == (
        "gpu",
        ("gpu01", "gpu02", "gpu03", "gpu04"),
        "UP",
    )


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_grouped_sinfo_is_refused_naming_the_command(version: str) -> None:
    with pytest.raises(SlurmSchemaError, match="scontrol --json show nodes"):
        parse_nodes(_doc(version, "final/sinfo.json"))


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_controller_exit_codes_of_new_objects(version: str) -> None:
    api = VERSIONS[version]
    codes = ctld_exit_codes(_doc(version, f"rest-{api}/slurm_{api}_jobs.json"))
    by_job = {job: status for (job, _submit), status in codes.items()}
    assert by_job[9] == (0, 15)  # the time-out: SIGTERM
    assert by_job[7] == (0, None)


def test_generations_are_named_and_unknown_ones_refused() -> None:
    assert generation(_doc("24.11", "final/sacct.json"), "x") == "v0.0.42"
    assert generation(_doc("26.05", "final/sacct.json"), "x") == "v0.0.45"
    legacy = json.loads((FIXTURES / "slurm" / "sacct.json").read_text())
    assert generation(legacy, "x") == "v0.0.38"
    future = copy.deepcopy(_doc("26.05", "final/sacct.json"))
    future["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.46"
    with pytest.raises(SlurmSchemaError, match=r"v0\.0\.46.*supported: v0\.0\.38"):
        parse_accounting_batch(future)
    with pytest.raises(SlurmSchemaError, match=r"v0\.0\.46"):
        parse_queue({**_doc("26.05", "running/squeue.json"), "meta": future["meta"]})
    with pytest.raises(SlurmSchemaError, match=r"meta\.plugin"):
        parse_queue({"meta": {}, "jobs": [], "errors": []})


def test_an_unreadable_queue_record_is_a_schema_error_not_a_type_error() -> None:
    doc = copy.deepcopy(_doc("24.11", "running/squeue.json"))
    doc["jobs"][0]["submit_time"] = {"set": True, "infinite": False, "number": {"x": 1}}
    with pytest.raises(SlurmSchemaError, match=r"job 1: unreadable record"):
        parse_queue(doc)


def test_a_record_with_a_bad_state_is_rejected_not_crashing() -> None:
    doc = copy.deepcopy(_doc("24.11", "final/sacct.json"))
    doc["jobs"][0]["state"]["current"] = [1, 2]
    batch = parse_accounting_batch(doc)
    assert len(batch.runs) == 12
    (bad,) = batch.rejected
    assert (bad.job_id, bad.field) == ("1", "state")


def test_cpus_per_task_is_modelled_other_tres_are_not() -> None:
    """24.11+ write ``-c 4`` as ``tres_per_task: cpu=4``: that is a CPU request the loop
    models; a license-like TRES per task or per job is not."""
    doc = copy.deepcopy(_doc("24.11", "running/squeue.json"))
    doc["jobs"] = doc["jobs"][:3]
    doc["jobs"][0]["tres_per_task"] = "cpu=4"
    doc["jobs"][1]["tres_per_task"] = "cpu=2,gres/shard=1"
    doc["jobs"][2]["tres_per_job"] = "gres/shard:2"
    first, second, third = parse_queue(doc)
    assert first.unmodelled == ()
    assert second.unmodelled == ("tres_per_task=cpu=2,gres/shard=1",)
    assert third.unmodelled == ("tres_per_job=gres/shard:2",)


def test_value_readers() -> None:
    assert number({"set": True, "infinite": False, "number": 5}) == 5
    assert number({"set": False, "infinite": False, "number": 0}) is None
    assert number({"set": False, "infinite": True, "number": 0}) == math.inf
    assert number(7) == 7 and number(None) is None and number("12") == 12
    with pytest.raises(ValueError):
        number(True)
    assert job_state_text(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert job_state_text(["RUNNING", "COMPLETING"]) == "COMPLETING"
    assert job_state_text(["PENDING", "REQUEUE_HOLD"]) == "REQUEUE_HOLD"
    assert job_state_text(["RUNNING"]) == "RUNNING"
    assert job_state_text("CANCELLED by 0") == "CANCELLED"
    assert node_state_text(["IDLE", "DRAIN"]) == "IDLE+DRAIN"
    assert node_state_text("idle", ["DRAIN"]) == "IDLE+DRAIN"
    legacy = {"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9}}
    assert exit_status(legacy) == ("SIGNALED", 0, 9)
    sig = {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}
    unset = {"set": False, "infinite": False, "number": 0}
    modern = {"status": ["SIGNALED"], "return_code": unset, "signal": sig}
    assert exit_status(modern) == ("SIGNALED", None, 15)


def test_the_rest_api_is_the_newest_served_and_read() -> None:
    paths = {
        f"/{family}/{v}/{leaf}": {}
        for family in ("slurm", "slurmdb")
        for v in ("v0.0.40", "v0.0.41", "v0.0.42")
        for leaf in ("jobs", "diag")
    }
    assert pick_api({"paths": paths}) == "v0.0.42"
    assert served_apis({"paths": paths})["slurmdb"] == {"v0.0.40", "v0.0.41", "v0.0.42"}
    newer = {"/slurm/v0.0.47/jobs": {}, "/slurmdb/v0.0.47/jobs": {}, "/slurm/v0.0.45/x": {}}
    with pytest.raises(SlurmSchemaError, match=r"serves API versions v0\.0\.45, v0\.0\.47"):
        pick_api({"paths": newer})


def test_release_of_scontrol_version() -> None:
    assert parse_release("slurm 24.11.5\n") == (24, 11)
    assert parse_release("slurm-wlm 22.05.8") == (22, 5)


def test_exclusive_reads_both_generations_and_topo_is_not_whole_nodes() -> None:
    doc = copy.deepcopy(_doc("24.11", "running/squeue.json"))
    doc["jobs"] = doc["jobs"][:4]
    doc["jobs"][0]["shared"] = ["none"]
    doc["jobs"][1]["exclusive"] = ["topo"]
    doc["jobs"][2]["exclusive"] = ["true"]
    flags = [j.exclusive for j in parse_queue(doc)]
    assert flags == [True, False, True, False]
    legacy = json.loads((FIXTURES / "slurm" / "squeue.json").read_text())
    legacy["jobs"] = [j for j in legacy["jobs"] if j["job_state"] in ("PENDING", "RUNNING")][:1]
    legacy["jobs"][0]["shared"] = "user"
    assert [j.exclusive for j in parse_queue(legacy)] == [True]
