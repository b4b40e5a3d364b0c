"""The live loop keeps what a job asked for (issue 31): the request read from squeue's JSON
(``cluster.slurm.request``), not its pending ``node_count`` (an estimate: 2 for a held
``--gres=gpu:4 -n1 -c4`` job on 22.05.8), and the loop's shapes, hand-backs and last guard.

The fixtures are real ``squeue --json`` captures of held jobs in every form, from a local Slurm
22.05.8 (``tests/fixtures/slurm/squeue_request_forms.json``) and 24.11.5
(``tests/fixtures/slurm/squeue_request_forms_24.11.json``), each job named by its form. The
same forms on a running Slurm: tests/deployer/test_request_shape_live.py."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.domain import Decision, Placement, Shape, Start
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.slurm.request import (
    Request,
    count_request,
    flexible_gpus,
    read_request,
    widens,
)
from linkwise.cluster.topology.spec import from_spec
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.job_requests import job_request, job_shape
from linkwise.deployer.loop import ServeConfig, SlurmBackend
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import build_observation
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.policies.spec import PolicySpec

LOG = logging.getLogger("test.request_shape")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = {
    "22.05": FIXTURES / "slurm" / "squeue_request_forms.json",
    "24.11": FIXTURES / "slurm" / "squeue_request_forms_24.11.json",
}
TOPO = from_spec("4x4")
NAMES = [n.name for n in TOPO.nodes]

# job name (the form it was submitted with) -> the shape a node list must keep (None: flexible)
SHAPES: dict[str, Shape | None] = {
    "N2-gres4": Shape(2, 4),  # -N2 --gres=gpu:4
    "gres4-n1-c4": Shape(1, 4),  # --gres=gpu:4 -n1 -c4 (22.05: node_count 2)
    "N1-n1-c4-gres4": Shape(1, 4),  # -N1 -n1 -c4 --gres=gpu:4 (22.05: node_count 2)
    "n2-c2-gres1": Shape(1, 1),  # -n2 -c2 --gres=gpu:1 (22.05: node_count 2)
    "gpus4": None,  # --gpus=4 (24.11 holds max_nodes 1: below)
    "gpus8-N2": None,  # --gpus=8 -N2: Slurm chooses the split
    "ntasks4-gpt1": None,  # --ntasks=4 --gpus-per-task=1
    "gres2": Shape(1, 2),  # --gres=gpu:2
    "N2-gpn2": Shape(2, 2),  # -N2 --gpus-per-node=2
    "n8-c4": Shape(1, 0),  # -n8 -c4: no GPUs
    "N1-3-gres1": None,  # -N1-3 --gres=gpu:1
}
VERSION_SHAPES = {"22.05": SHAPES, "24.11": SHAPES | {"gpus4": Shape(1, 4)}}
FLEXIBLE_WHY = {
    "gpus4": "per job",
    "gpus8-N2": "Slurm chooses the split",
    "ntasks4-gpt1": "per task",
    "N1-3-gres1": "1-3 nodes",
}
# flexible requests the loop places itself (a GPU count in any split: ``flexible_gpus``)
PLACEABLE = {"gpus4": 4, "gpus8-N2": 8, "ntasks4-gpt1": 4}


def capture(version: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CAPTURES[version].read_text())
    return doc


def records(version: str) -> dict[str, dict[str, Any]]:
    return {str(j["name"]): j for j in capture(version)["jobs"]}


def queue(version: str, *, for_loop: bool = True) -> dict[str, QueuedJob]:
    """The capture's jobs by name: held for the loop (tagged as job_submit.lua tags them), or
    neither held nor tagged (what shadow mode plans)."""
    out = {}
    for q in parse_queue(capture(version)):
        if for_loop:
            out[q.name] = dataclasses.replace(q, admin_comment=HOLD_TAG)
        else:
            out[q.name] = dataclasses.replace(q, held=False, reason="Priority")
    return out


def ninfo(name: str) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", partitions=("gpu",), cpus=8, gpus_total=4,
                    gpus_used=0, memory_mb=64000)  # fmt: skip


@pytest.mark.parametrize("version", sorted(CAPTURES))
def test_the_captures_hold_every_form_and_22_05s_estimate(version: str) -> None:
    recs = records(version)
    assert set(recs) == set(SHAPES)
    meta = capture(version)["meta"]
    assert ("openapi/v0.0.38" if version == "22.05" else "data_parser/v0.0.42") in str(meta)
    if version == "22.05":  # what misled the loop: the estimate, beside the TRES request
        for name in ("gres4-n1-c4", "N1-n1-c4-gres4", "n2-c2-gres1"):
            assert recs[name]["node_count"] == 2, name
            assert ",node=1," in recs[name]["tres_req_str"], name


@pytest.mark.parametrize("version", sorted(CAPTURES))
def test_every_form_reads_as_the_shape_slurm_holds(version: str) -> None:
    for name, rec in records(version).items():
        r = read_request(rec)
        want = VERSION_SHAPES[version][name]
        if want is None:
            assert r.flexible and (r.nodes, r.gpus_per_node) == (0, 0), (name, r)
            assert FLEXIBLE_WHY[name] in r.flexible, (name, r.flexible)
        else:
            assert not r.flexible, (name, r)
            assert Shape(r.nodes, r.gpus_per_node) == want, (name, r)
            assert r.gpus == want.num_gpus == r.tres_gpus, (name, r)
    r = read_request(records(version)["N1-3-gres1"])
    assert (r.min_nodes, r.max_nodes, r.node_gpus) == (1, 3, 1)
    r = read_request(records(version)["ntasks4-gpt1"])
    assert (r.tasks, r.task_gpus, r.tres_gpus) == (4, 1, 4)
    r = read_request(records(version)["gpus8-N2"])
    assert (r.job_gpus, r.min_nodes, r.max_nodes) == (8, 2, 2)


@pytest.mark.parametrize("version", sorted(CAPTURES))
def test_the_queue_carries_the_request_and_cpus_over_its_nodes(version: str) -> None:
    jobs = queue(version)
    for name, q in jobs.items():
        assert q.request == read_request(records(version)[name])
        assert job_shape(q) == VERSION_SHAPES[version][name]
    # -n2 -c2 on one node: 4 CPUs there (over 22.05's estimate of 2 nodes it read 2)
    assert jobs["n2-c2-gres1"].cpus_per_node == 4
    assert jobs["gres4-n1-c4"].cpus_per_node == 4
    assert jobs["N2-gres4"].cpus_per_node == 1
    if version == "22.05":
        assert jobs["gres4-n1-c4"].num_nodes == 2  # squeue's number, kept as it printed it


def gpu_record(**kw: Any) -> dict[str, Any]:
    """A record of one generation's shape with only the request fields."""
    rec: dict[str, Any] = {
        "node_count": 1, "max_nodes": 0, "tasks": 1, "tres_per_node": "", "tres_per_job": "",
        "tres_per_task": "", "tres_req_str": "cpu=1,mem=100M,node=1,billing=1",
    }  # fmt: skip
    rec.update(kw)
    return rec


def num(n: int, *, set_: bool = True, infinite: bool = False) -> dict[str, Any]:
    return {"set": set_, "infinite": infinite, "number": n}


def test_gpu_items_of_either_generation_typed_or_not() -> None:
    for per_node, kind in [
        ("gres:gpu:2", ""), ("gres/gpu:2", ""), ("gres:gpu:a100:2", "a100"),
        ("gres/gpu:a100:2", "a100"), ("gres/shard:3,gres/gpu:2", ""), ("gres/gpu=2", ""),
    ]:  # fmt: skip
        r = read_request(gpu_record(
            node_count=2, max_nodes=2, tres_per_node=per_node,
            tres_req_str="cpu=2,node=2,gres/gpu=4" + (f",gres/gpu:{kind}=4" if kind else ""),
        ))  # fmt: skip
        assert (r.nodes, r.gpus_per_node, r.gpu_type, r.flexible) == (2, 2, kind, ""), per_node
    # 24.11 writes -c4 as tres_per_task cpu=4: not a GPU request
    r = read_request(gpu_record(tres_per_node="gres/gpu:1", tres_per_task="cpu=4",
                                tres_req_str="cpu=4,node=1,gres/gpu=1"))  # fmt: skip
    assert (r.nodes, r.gpus_per_node, r.task_gpus) == (1, 1, 0)


def test_counts_plain_or_set_infinite_number() -> None:
    new = gpu_record(node_count=num(2), max_nodes=num(0), tasks=num(2), tres_per_node="gres/gpu:1",
                     tres_req_str="cpu=2,node=1,gres/gpu=1")  # fmt: skip
    old = gpu_record(node_count=2, max_nodes=0, tasks=2, tres_per_node="gres:gpu:1",
                     tres_req_str="cpu=2,node=1,gres/gpu=1")  # fmt: skip
    assert read_request(new) == read_request(old)
    assert (read_request(new).nodes, read_request(new).node_count) == (1, 2)
    for unset in (num(5, set_=False), num(0, infinite=True), 0xFFFFFFFE, None):
        r = read_request(gpu_record(max_nodes=unset, tres_per_node="gres:gpu:1",
                                    tres_req_str="node=1,gres/gpu=1"))  # fmt: skip
        assert (r.max_nodes, r.nodes, r.gpus_per_node) == (0, 1, 1), unset


def test_a_record_without_a_tres_request_falls_back_to_node_count() -> None:
    r = read_request(gpu_record(node_count=2, tres_per_node="gres:gpu:2", tres_req_str=""))
    assert (r.tres_nodes, r.min_nodes, r.nodes, r.gpus_per_node) == (0, 2, 2, 2)
    r = read_request(gpu_record(node_count=0, tres_req_str=""))
    assert (r.min_nodes, r.nodes, r.gpus_per_node) == (1, 1, 0)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (dict(tres_per_node="gres:gpu:1", tres_per_job="gres:gpu:2"), "two ways"),
        (dict(tres_per_node="gres/gpu:1", tres_per_task="gres/gpu=1"), "two ways"),
        (dict(tres_per_node="gres:gpu"), "not read"),  # no count
        (dict(tres_per_node="gres:gpu:a100:1,gres:gpu:v100:1"), "not read"),  # two types
        (dict(tres_per_node="gres:gpu:lots"), "not read"),
        (dict(tres_per_node="gres:gpu:2", tres_req_str="node=1,gres/gpu=3"), "TRES asks 3"),
        (dict(tres_req_str="node=1,gres/gpu=2"), "no per-node, job or task request"),
        (dict(tres_per_job="gres:gpu:4", max_nodes=0), "or more node(s)"),
        (dict(tres_per_node="gres:gpu:1", max_nodes=2), "1-2 nodes"),
    ],
)
def test_requests_slurm_shapes_itself_are_flexible(fields: dict[str, Any], why: str) -> None:
    r = read_request(gpu_record(**fields))
    assert why in r.flexible and (r.nodes, r.gpus) == (0, 0), r
    assert widens(r, [1]) is not None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(max_nodes="two"), "max_nodes"),
        (dict(node_count=-1), "node_count"),
        (dict(tasks=[2]), "tasks"),
        (dict(max_nodes=1.5), "max_nodes"),
        (dict(num_tasks=num(-3), tasks=None), "num_tasks"),
        (dict(tres_req_str="cpu=1,node=x"), "tres_req_str"),
    ],
)
def test_a_bad_count_is_refused_naming_its_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        read_request(gpu_record(**fields))


def test_count_request_and_the_guard() -> None:
    even = count_request(2, 8)
    assert (even.nodes, even.gpus_per_node, even.flexible) == (2, 4, "")
    odd = count_request(2, 3)
    assert odd.flexible == "3 GPU(s) over 2 nodes: an uneven split" and odd.nodes == 0
    assert count_request(0, 2).nodes == 1
    with pytest.raises(ValueError, match="negative"):
        count_request(-1, 2)
    asked = read_request(records("22.05")["gres4-n1-c4"])
    assert widens(asked, [4]) is None
    # what the loop did: NumNodes=2 from the estimate (8 GPUs, 8 CPUs for a 4-GPU job)
    assert widens(asked, [4, 4]) == "2 node(s) x 4 GPU(s) is not its request (1 x 4)"
    assert "not its request" in str(widens(asked, [2]))
    assert "not its request" in str(widens(read_request(records("22.05")["N2-gpn2"]), [2, 1]))
    assert "Slurm's to choose" in str(widens(odd, [3]))
    assert flexible_gpus(odd) == 0  # built by hand: no request to keep
    assert isinstance(asked, Request)


@pytest.mark.parametrize("version", sorted(CAPTURES))
def test_the_loop_plans_determined_shapes_and_hands_back_the_rest(version: str) -> None:
    nodes = [ninfo(n) for n in NAMES]
    active = build_observation(list(queue(version).values()), nodes, TOPO, ["gpu"], 1e9,
                               mode="active")  # fmt: skip
    ids = {q.job_id: q.name for q in queue(version).values()}
    shapes = VERSION_SHAPES[version]
    planned = {ids[j]: s for j, s in active.shapes.items()}
    assert planned == {n: s for n, s in shapes.items() if s is not None and s.gpus_per_node}
    flexible = {n for n, s in shapes.items() if s is None}
    kinds = {ids[j]: k for j, k in active.kinds.items()}
    assert kinds == {n: "unmodelled" for n in flexible - set(PLACEABLE)}
    for j, why in active.refused.items():
        assert why.startswith("Slurm chooses its shape: ") and FLEXIBLE_WHY[ids[j]] in why
    assert {ids[q.job_id] for q in active.no_gpu} == set(kinds) | {"n8-c4"}
    # the policy sees the enforced node count, a shape every placement keeps, and a flexible
    # request it can place as flexible (no node count)
    seen = {ids[p.job.job_id]: (p.job.nodes, p.job.flexible) for p in active.state.pending}
    want = {n: (s.nodes, False) for n, s in planned.items()}
    want |= {n: (0, True) for n in flexible & set(PLACEABLE)}
    assert seen == want
    assert {ids[j] for j in active.managed} == set(want)
    # shadow (nothing held) plans the same shapes and flexible jobs
    shadow = build_observation(list(queue(version, for_loop=False).values()), nodes, TOPO,
                               ["gpu"], 1e9, mode="shadow")  # fmt: skip
    assert shadow.shapes == active.shapes and not shadow.refused
    assert set(shadow.managed) == set(active.managed)


class FakeRunner:
    def __init__(self) -> None:
        self.slurm_conf = self.bin_dir = None
        self.commands: list[list[str]] = []

    def run(self, args: list[str], **_: Any) -> str:
        self.commands.append(list(args))
        return ""


class FakeClient:
    def __init__(self, jobs: list[QueuedJob], nodes: list[NodeInfo]) -> None:
        self.jobs, self.node_list, self.runner = jobs, nodes, FakeRunner()

    def queue(self) -> list[QueuedJob]:
        return list(self.jobs)

    def nodes(self) -> list[NodeInfo]:
        return list(self.node_list)


def make_backend(tmp_path: Path, client: FakeClient) -> SlurmBackend:
    config = ServeConfig(
        mode="active", partitions=("gpu",), db=str(tmp_path / "s.duckdb"),
        state_dir=str(tmp_path / "state"), interval_s=0.01, lease_s=120.0, watchdog=False,
    )  # fmt: skip
    metrics = ServeMetrics()
    holder = PolicyHolder(
        PolicySpec.parse("fifo"), PolicySpec.parse("fifo"), metrics=metrics, logger=LOG
    )
    recorder = Recorder(config.db, config.spool_path, logger=LOG)
    return SlurmBackend(
        client, TOPO, config, GuardedPolicy(holder, metrics, LOG), recorder, metrics,  # type: ignore[arg-type]
        logger=LOG, sleep=lambda s: None, lease_dir=tmp_path / "leases",
    )  # fmt: skip


def updates(cmds: list[list[str]]) -> dict[int, list[str]]:
    return {int(c[2].split("=")[1]): c[3:] for c in cmds if c[:2] == ["scontrol", "update"]}


def released(cmds: list[list[str]]) -> set[int]:
    return {int(c[2]) for c in cmds if c[:2] == ["scontrol", "release"]}


def test_the_loop_sets_exactly_the_asked_node_count(tmp_path: Path) -> None:
    jobs = queue("22.05")
    client = FakeClient(list(jobs.values()), [ninfo(n) for n in NAMES])
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    ids = {n: q.job_id for n, q in jobs.items()}
    # the policy gives gres4-n1-c4 one node (not squeue's 2), N2-gpn2 two
    backend.apply(
        Decision(
            starts=(
                Start(ids["gres4-n1-c4"], Placement.of([(0, 4)])),
                Start(ids["n2-c2-gres1"], Placement.of([(1, 1)])),
                Start(ids["N2-gpn2"], Placement.of([(2, 2), (3, 2)])),
            )
        )
    )
    cmds = client.runner.commands
    got = updates(cmds)
    assert got[ids["gres4-n1-c4"]] == [f"ReqNodeList={NAMES[0]}", "NumNodes=1"]
    assert got[ids["n2-c2-gres1"]] == [f"ReqNodeList={NAMES[1]}", "NumNodes=1"]
    assert got[ids["N2-gpn2"]] == [f"ReqNodeList={NAMES[2]},{NAMES[3]}", "NumNodes=2"]
    # held, not started by this decision: neither handed back nor updated
    placeable = {ids[n] for n in ("gpus4", "gpus8-N2", "ntasks4-gpt1")}
    assert not placeable & released(cmds) and not placeable & set(got)
    assert ids["N1-3-gres1"] in released(cmds) and ids["N1-3-gres1"] not in got
    assert ids["n8-c4"] in released(cmds) and ids["n8-c4"] not in got
    text = backend.metrics.text()
    assert 'linkwise_serve_handed_back_total{reason="unmodelled"} 1.0' in text
    assert 'linkwise_serve_handed_back_total{reason="no_gpu"} 1.0' in text


def test_the_last_guard_refuses_a_start_that_widens_the_request(tmp_path: Path) -> None:
    jobs = queue("22.05")
    client = FakeClient([jobs["gres4-n1-c4"]], [ninfo(n) for n in NAMES])
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    job = jobs["gres4-n1-c4"].job_id
    assert job_request(jobs["gres4-n1-c4"]).nodes == 1
    # a shape read as the old loop read it (squeue's estimate: 2 nodes): the guard refuses
    obs = backend.obs
    assert obs is not None
    backend.obs = dataclasses.replace(obs, shapes={job: Shape(2, 4)})
    backend.apply(Decision(starts=(Start(job, Placement.of([(0, 4), (1, 4)])),)))
    cmds = client.runner.commands
    assert not updates(cmds) and job in released(cmds)
    text = backend.metrics.text()
    assert 'linkwise_serve_rejected_starts_total{reason="widen"} 1.0' in text
    assert 'linkwise_serve_handed_back_total{reason="widen"} 1.0' in text


def test_the_loop_places_flexible_requests_where_slurms_split_is_the_policys(
    tmp_path: Path,
) -> None:
    jobs = queue("22.05")
    names = ("gpus4", "gpus8-N2", "ntasks4-gpt1")
    client = FakeClient([jobs[n] for n in names], [ninfo(n) for n in NAMES])
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    ids = {n: jobs[n].job_id for n in names}
    assert {flexible_gpus(job_request(jobs[n])) for n in names} == {4, 8}
    backend.apply(
        Decision(
            starts=(
                Start(ids["gpus8-N2"], Placement.of([(0, 4), (1, 4)])),
                # Slurm splits 4 over gpu03 (4 free) and gpu04 as 3 + 1: the policy's
                Start(ids["ntasks4-gpt1"], Placement.of([(2, 3), (3, 1)])),
                # then gpu03 has 1 free: 1 + 3 is Slurm's split there
                Start(ids["gpus4"], Placement.of([(2, 1), (3, 3)])),
            )
        )
    )
    got = updates(client.runner.commands)
    assert got == {
        ids["gpus8-N2"]: [f"ReqNodeList={NAMES[0]},{NAMES[1]}", "NumNodes=2"],
        ids["ntasks4-gpt1"]: [f"ReqNodeList={NAMES[2]},{NAMES[3]}", "NumNodes=2"],
        ids["gpus4"]: [f"ReqNodeList={NAMES[2]},{NAMES[3]}", "NumNodes=2"],
    }
    assert set(ids.values()) <= released(client.runner.commands)
    # their GPUs count as taken until Slurm starts them, split as the policy placed them
    assert backend.inflight[ids["gpus4"]][0] == Placement.of([(2, 1), (3, 3)])
    backend.observe()
    assert backend.obs is not None and backend.obs.state.free_gpus == (0, 0, 0, 0)


def test_a_flexible_start_slurm_would_split_otherwise_goes_back_to_slurm(tmp_path: Path) -> None:
    jobs = queue("22.05")
    client = FakeClient([jobs["gpus4"], jobs["gpus8-N2"]], [ninfo(n) for n in NAMES])
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    gpus4, gpus8 = jobs["gpus4"].job_id, jobs["gpus8-N2"].job_id
    backend.apply(
        Decision(
            starts=(
                # 4 free on each: Slurm splits 4 over gpu01, gpu02 as 3 + 1, not 1 + 3
                Start(gpus4, Placement.of([(0, 1), (1, 3)])),
                # -N2: three nodes widen its node range
                Start(gpus8, Placement.of([(1, 4), (2, 2), (3, 2)])),
            )
        )
    )
    cmds = client.runner.commands
    assert not updates(cmds) and {gpus4, gpus8} <= released(cmds)
    text = backend.metrics.text()
    assert 'linkwise_serve_handed_back_total{reason="split"} 1.0' in text
    assert 'linkwise_serve_handed_back_total{reason="shape"} 1.0' in text
    assert "not its request (8 GPU(s) on 2-2 nodes)" in str(
        widens(job_request(jobs["gpus8-N2"]), [4, 2, 2])
    )
