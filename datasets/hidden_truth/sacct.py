"""What ``sacct`` prints of the hidden truth's runs: ``sacct -a -D --json`` (``sacct_json``)
and ``sacct -a -D -X -P -n -o JobIDRaw,Submit,State,ExitCode`` under ``SLURM_TIME_FORMAT=%s``
(``sacct_lines``), the two outputs the collector reads (``CliTransport.accounting``).

A record is written in the schema of one Slurm release (``SLURM_RELEASES``): 22.05
(``openapi/dbv0.0.38``: plain numbers, a state and an exit status as text, ``null`` for
unset text), 24.11 (``data_parser/v0.0.42``: ``{set, infinite, number}`` numbers, a state
as a list) and 26.05 (``data_parser/v0.0.45``: 24.11's and ``sluid``, ``exclusive``,
``oversubscribe``, ``segment_size``, a step's own output paths and limit, no step ``pid``).
The fields and their shapes follow what Debian's Slurm 22.05.8, 24.11.5 and 26.05.5 print
for a batch job (``tests/fixtures/slurm/sacct.json``; ``../shared/data/slurm/``), and
``tests/datasets/test_hidden_truth_slurm.py`` runs the truth's job shapes on the real local
Slurm and checks that its records and these parse to the same ``JobRun``.

What Slurm keeps of a job's GPUs, and so what is printed here: the job's total in
``tres.allocated`` (``gres/gpu``; no count per node) over its node list (a hostlist in the
cluster's node order), one CPU per node (sbatch's default), and one ``batch`` step on the
first node with that node's own GPUs (the only per-node count sacct holds of a job without
``srun`` steps). A time limit is INFINITE; a running job has no end, and sacct's
``SUCCESS``/0 exit status, as Slurm prints it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.hostlist import compress, sort_hosts

__all__ = ["SLURM_RELEASES", "SacctJob", "sacct_json", "sacct_lines"]

SLURM_RELEASES: Mapping[str, tuple[str, str]] = {
    "22.05": ("22.05.8", "v0.0.38"),
    "24.11": ("24.11.5", "v0.0.42"),
    "26.05": ("26.05.5", "v0.0.45"),
}
"""The Slurm releases whose ``sacct --json`` schema ``sacct_json`` writes: release, schema."""
INFINITE = 0xFFFFFFFF  # Slurm's INFINITE (a time limit without end, 22.05's plain number)
_GPU_TRES_ID = 1001  # the id Slurm's accounting gives the first GRES TRES (gres/gpu)


@dataclass(frozen=True, slots=True)
class SacctJob:
    """One job as the accounting holds it: ``nodes`` in the cluster's node order with the
    GPUs Slurm allocated on each (``gpus_per_node``, aligned); ``end`` None while running;
    times in epoch seconds."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    cluster: str
    state: str  # COMPLETED, RUNNING, FAILED, ...
    exit_code: int  # the batch script's (0 while running, as sacct prints it)
    submit: int
    start: int
    end: int | None
    nodes: tuple[str, ...]
    gpus_per_node: tuple[int, ...]
    mem_per_node_mb: int = 16000  # a whole node's memory: what sbatch requests by default
    group: str = "root"
    workdir: str = "/tmp"

    def __post_init__(self) -> None:
        if not self.nodes or len(self.nodes) != len(self.gpus_per_node):
            raise ValueError("a job needs its nodes and one GPU count per node")
        if tuple(sort_hosts(self.nodes)) != self.nodes:
            raise ValueError(f"nodes {self.nodes} are not in Slurm's order (sort_hosts)")


def sacct_json(jobs: Sequence[SacctJob], slurm: str = "24.11") -> str:
    """``sacct -a -D --json``'s text of ``jobs`` in the schema of Slurm release ``slurm``."""
    if slurm not in SLURM_RELEASES:
        raise ValueError(f"no sacct schema for Slurm {slurm!r} (known: {sorted(SLURM_RELEASES)})")
    release, schema = SLURM_RELEASES[slurm]
    record = _record_v38 if schema == "v0.0.38" else _record_v42
    doc = {
        "meta": _meta(release, schema),
        "errors": [],
        "warnings": [],
        "jobs": [_adjust(record(j), j, slurm) for j in jobs],
    }
    if schema == "v0.0.38":
        del doc["warnings"]
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def sacct_lines(jobs: Sequence[SacctJob]) -> str:
    """``sacct -a -D -X -P -n -o JobIDRaw,Submit,State,ExitCode`` with epoch times."""
    return "".join(f"{j.job_id}|{j.submit}|{j.state}|{j.exit_code}:0\n" for j in jobs)


def _meta(release: str, schema: str) -> dict[str, Any]:
    major, minor, micro = release.split(".")
    if schema == "v0.0.38":
        return {
            "plugin": {"type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38"},
            "Slurm": {
                "version": {"major": int(major), "micro": int(micro), "minor": int(minor)},
                "release": release,
            },
        }
    return {
        "plugin": {
            "type": "",
            "name": "",
            "data_parser": f"data_parser/{schema}",
            "accounting_storage": "accounting_storage/slurmdbd",
        },
        "client": {"source": "", "user": "root", "group": "root"},
        "command": ["/usr/bin/sacct", "-a", "-D", "--json"],
        "slurm": {
            "version": {"major": major, "micro": micro, "minor": minor},
            "release": release,
            "cluster": "",
        },
    }


def _num(value: int, *, infinite: bool = False) -> dict[str, Any]:
    return {"set": True, "infinite": infinite, "number": 0 if infinite else value}


_UNSET: dict[str, Any] = {"set": False, "infinite": False, "number": 0}


def _tres(j: SacctJob, null: Any) -> dict[str, list[dict[str, Any]]]:
    """A job's allocated and requested TRES: one CPU and a whole node's memory per node."""
    n, gpus = len(j.nodes), sum(j.gpus_per_node)

    def item(kind: str, tres_id: int, count: Any, name: Any = null) -> dict[str, Any]:
        return {"type": kind, "name": name, "id": tres_id, "count": count}

    energy = null if null is None else -2  # 22.05 prints null, later releases -2 (NO_VAL)
    gpu = [item("gres", _GPU_TRES_ID, gpus, "gpu")] if gpus else []
    allocated = [item("cpu", 1, n), item("energy", 3, energy), item("node", 4, n)]
    requested = [item("cpu", 1, n), item("mem", 2, j.mem_per_node_mb * n), item("node", 4, n)]
    return {
        "allocated": [*allocated, item("billing", 5, n), *gpu],
        "requested": [*requested, item("billing", 5, n), *gpu],
    }


def _step_tres(j: SacctJob, null: Any) -> dict[str, Any]:
    """The batch step's TRES: its node (the first), one CPU, that node's GPUs."""
    gpus = j.gpus_per_node[0]
    allocated = [
        {"type": "cpu", "name": null, "id": 1, "count": 1},
        {"type": "mem", "name": null, "id": 2, "count": 0},
        {"type": "node", "name": null, "id": 4, "count": 1},
    ]
    if gpus:
        allocated.append({"type": "gres", "name": "gpu", "id": _GPU_TRES_ID, "count": gpus})
    empty: dict[str, list[Any]] = {"max": [], "min": [], "average": [], "total": []}
    return {"requested": dict(empty), "consumed": dict(empty), "allocated": allocated}


def _elapsed(j: SacctJob) -> int:
    return max(0, (j.end if j.end is not None else j.start) - j.start)


def _record_v42(j: SacctJob) -> dict[str, Any]:
    """One record as Slurm 24.11 (``data_parser/v0.0.42``) prints it."""
    exit_code = {
        "status": ["SUCCESS" if j.exit_code == 0 else "ERROR"],
        "return_code": _num(j.exit_code),
        "signal": {"id": dict(_UNSET), "name": ""},
    }
    cpu_times = {
        "system": {"seconds": 0, "microseconds": 0},
        "total": {"seconds": 0, "microseconds": 0},
        "user": {"seconds": 0, "microseconds": 0},
    }
    end = j.end or 0
    first = j.nodes[0]
    step = {
        "time": {
            "elapsed": _elapsed(j),
            "end": _num(end),
            "start": _num(j.start),
            "suspended": 0,
            **cpu_times,
        },
        "exit_code": exit_code,
        "nodes": {"count": 1, "range": first, "list": [first]},
        "tasks": {"count": 1},
        "pid": "",
        "CPU": {"requested_frequency": {"min": _num(0), "max": _num(0)}, "governor": "0"},
        "kill_request_user": "",
        "state": [j.state],
        "statistics": {"CPU": {"actual_frequency": 0}, "energy": {"consumed": _num(0)}},
        "step": {"id": f"{j.job_id}.batch", "name": "batch"},
        "task": {"distribution": "Unknown"},
        "tres": _step_tres(j, ""),
    }
    return {
        "account": j.account,
        "comment": {"administrator": "", "job": "", "system": ""},
        "allocation_nodes": len(j.nodes),
        "array": {
            "job_id": 0,
            "limits": {"max": {"running": {"tasks": 0}}},
            "task_id": dict(_UNSET),
            "task": "",
        },
        "association": {
            "account": j.account,
            "cluster": j.cluster,
            "partition": "",
            "user": j.user,
            "id": 0,
        },
        "block": "",
        "cluster": j.cluster,
        "constraints": "",
        "container": "",
        "derived_exit_code": {
            "status": ["SUCCESS"],
            "return_code": _num(0),
            "signal": {"id": dict(_UNSET), "name": ""},
        },
        "time": {
            "elapsed": _elapsed(j),
            "eligible": j.submit,
            "end": end,
            "planned": _num(j.start - j.submit),
            "start": j.start,
            "submission": j.submit,
            "suspended": 0,
            "system": {"seconds": 0, "microseconds": 0},
            "limit": _num(0, infinite=True),
            "total": {"seconds": 0, "microseconds": 0},
            "user": {"seconds": 0, "microseconds": 0},
        },
        "exit_code": exit_code,
        "extra": "",
        "failed_node": "",
        "flags": ["STARTED_ON_SCHEDULE", "START_RECEIVED"],
        "group": j.group,
        "het": {"job_id": 0, "job_offset": dict(_UNSET)},
        "job_id": j.job_id,
        "name": j.name,
        "licenses": "",
        "mcs": {"label": ""},
        "nodes": compress(j.nodes),
        "partition": j.partition,
        "hold": False,
        "priority": _num(1),
        "qos": "normal",
        "qosreq": "",
        "required": {
            "CPUs": len(j.nodes),
            "memory_per_cpu": dict(_UNSET),
            "memory_per_node": _num(0),
        },
        "kill_request_user": "",
        "restart_cnt": 0,
        "reservation": {"id": 0, "name": ""},
        "script": "",
        "stdin_expanded": "/dev/null",
        "stdout_expanded": "/dev/null",
        "stderr_expanded": "",
        "stdout": "/dev/null",
        "stderr": "",
        "stdin": "/dev/null",
        "state": {"current": [j.state], "reason": "None"},
        "steps": [step],
        "submit_line": "",
        "tres": _tres(j, ""),
        "used_gres": "",
        "user": j.user,
        "wckey": {"wckey": "", "flags": []},
        "working_directory": j.workdir,
    }


def _v45(rec: dict[str, Any], j: SacctJob) -> None:
    """26.05's (``data_parser/v0.0.45``) changes to a 24.11 record, in place."""
    sluid = f"s{j.job_id:013d}"
    rec.update(
        sluid=sluid, original_sluid=sluid, exclusive="NO", oversubscribe="NO", segment_size=0
    )
    rec["reservation"]["requested"] = ""
    for step in rec["steps"]:
        del step["pid"]
        step["time"]["limit"] = {"set": False, "infinite": True, "number": 0}
        step["submit_line"] = ""
        step["step"].update(
            stderr="",
            stdin="",
            stdout="",
            stderr_expanded="",
            stdin_expanded="",
            stdout_expanded="",
        )


def _adjust(rec: dict[str, Any], j: SacctJob, slurm: str) -> dict[str, Any]:
    if slurm == "26.05":
        _v45(rec, j)
    return rec


def _record_v38(j: SacctJob) -> dict[str, Any]:
    """One record as Slurm 22.05 (``openapi/dbv0.0.38``) prints it."""
    exit_code = {"status": "SUCCESS" if j.exit_code == 0 else "FAILED", "return_code": j.exit_code}
    cpu_times = {
        "system": {"seconds": 0, "microseconds": 0},
        "total": {"seconds": 0, "microseconds": 0},
        "user": {"seconds": 0, "microseconds": 0},
    }
    end = j.end or 0
    first = j.nodes[0]
    step = {
        "nodes": {"list": [first], "count": 1, "range": first},
        "tres": _step_tres(j, None),
        "time": {"elapsed": _elapsed(j), "end": end, "start": j.start, "suspended": 0, **cpu_times},
        "exit_code": exit_code,
        "tasks": {"count": 1},
        "pid": None,
        "CPU": {"requested_frequency": {"min": 0, "max": 0}, "governor": []},
        "kill_request_user": None,
        "state": j.state,
        "statistics": {"CPU": {"actual_frequency": 0}, "energy": {"consumed": 0}},
        "step": {"job_id": j.job_id, "het": {"component": None}, "id": "batch", "name": "batch"},
        "task": {"distribution": "Unknown"},
    }
    return {
        "account": j.account,
        "comment": {"administrator": None, "job": None, "system": None},
        "allocation_nodes": len(j.nodes),
        "array": {
            "job_id": 0,
            "limits": {"max": {"running": {"tasks": 0}}},
            "task": None,
            "task_id": None,
        },
        "association": {
            "account": j.account,
            "cluster": j.cluster,
            "partition": None,
            "user": j.user,
        },
        "cluster": j.cluster,
        "constraints": "",
        "container": None,
        "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": {
            "elapsed": _elapsed(j),
            "eligible": j.submit,
            "end": end,
            "start": j.start,
            "submission": j.submit,
            "suspended": 0,
            "system": {"seconds": 0, "microseconds": 0},
            "limit": INFINITE,
            "total": {"seconds": 0, "microseconds": 0},
            "user": {"seconds": 0, "microseconds": 0},
        },
        "exit_code": exit_code,
        "flags": ["CLEAR_SCHEDULING", "STARTED_ON_SCHEDULE"],
        "group": j.group,
        "het": {"job_id": 0, "job_offset": None},
        "job_id": j.job_id,
        "name": j.name,
        "mcs": {"label": ""},
        "nodes": compress(j.nodes),
        "partition": j.partition,
        "priority": 1,
        "qos": "normal",
        "required": {"CPUs": len(j.nodes), "memory": 0},
        "kill_request_user": None,
        "reservation": {"id": 0, "name": 0},
        "state": {"current": j.state, "reason": "None"},
        "steps": [step],
        "tres": _tres(j, None),
        "user": j.user,
        "wckey": {"wckey": "", "flags": []},
        "working_directory": j.workdir,
    }
