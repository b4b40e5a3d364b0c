"""The live loop respects what Slurm knows about a job (issue 21), with a fake Slurm client
(the real one: tests/deployer/test_serve_constraints_live.py): the request fields read from squeue's
JSON, nodes a job's constraints refuse, requests handed back at once, stranded releases,
``--max-hold`` with the lease lapsed, and bad rows of the store."""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Decision, Placement, Start
from linkwise.cluster.slurm.nodes import parse_nodes
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.store import open_store
from linkwise.deployer.holds import HOLD_TAG, RELEASED_TAG
from linkwise.deployer.lease import Lease
from linkwise.deployer.link_load import read_link_load
from linkwise.deployer.loop import ServeConfig, SlurmBackend
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import build_observation
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.release import sweep
from linkwise.deployer.start_checks import check_start, place_within
from linkwise.policies.spec import PolicySpec

LOG = logging.getLogger("test.serve.constraints")
TOPO = from_spec("4x4")
NAMES = [n.name for n in TOPO.nodes]


def qjob(job_id: int, gpus: int, n_nodes: int = 1, *, held: bool = True, **kw: Any) -> QueuedJob:
    base: dict[str, Any] = dict(
        job_id=job_id, name=f"j{job_id}", user="u", partition="gpu", state="PENDING",
        reason="JobHeldUser" if held else "Priority", submit_time=100.0 + job_id,
        start_time=None, time_limit_s=600.0, num_nodes=n_nodes, gpus=gpus, nodes=(), held=held,
        admin_comment=HOLD_TAG if held else "", cpus_per_node=1,
    )  # fmt: skip
    base.update(kw)
    return QueuedJob(**base)


def ninfo(name: str, used: int = 0, state: str = "IDLE", **kw: Any) -> NodeInfo:
    base: dict[str, Any] = dict(
        name=name, state=state, partitions=("gpu",), cpus=8, gpus_total=4, gpus_used=used,
        memory_mb=16000,
    )  # fmt: skip
    base.update(kw)
    return NodeInfo(**base)


class FakeRunner:
    def __init__(self) -> None:
        self.slurm_conf = None
        self.bin_dir = None
        self.commands: list[list[str]] = []

    def run(self, args: list[str], **_: Any) -> str:
        self.commands.append(list(args))
        return ""


class FakeClient:
    def __init__(self, queue: list[QueuedJob], nodes: list[NodeInfo]) -> None:
        self._queue, self._nodes, self.runner = queue, nodes, FakeRunner()

    def queue(self) -> list[QueuedJob]:
        return list(self._queue)

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)


def make_backend(tmp_path: Path, client: FakeClient, **cfg: Any) -> SlurmBackend:
    config = ServeConfig(
        mode="active", partitions=("gpu",), db=str(tmp_path / "s.duckdb"),
        state_dir=str(tmp_path / "state"), interval_s=0.01, lease_s=120.0, watchdog=False, **cfg,
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


# squeue --json records of Slurm 22.05.8 (the fields that matter, as it printed them)
SQUEUE = {
    "jobs": [
        {"job_id": 2, "job_state": "PENDING", "state_reason": "JobHeldUser", "priority": 0,
         "partition": "gpu", "node_count": 1, "cpus": 2, "minimum_cpus_per_node": 2,
         "tres_req_str": "cpu=2,mem=1000M,node=1,billing=2,gres/gpu=1",
         "tres_per_node": "gres:gpu:1", "excluded_nodes": "gpu[01-02]", "features": "fast",
         "shared": "none", "contiguous": True, "memory_per_node": 1000, "memory_per_cpu": None,
         "het_job_id": 0, "het_job_offset": 0, "array_job_id": 0, "array_task_id": None,
         "array_task_string": "", "licenses": "", "dependency": "", "resv_name": ""},
        {"job_id": 4, "job_state": "PENDING", "state_reason": "JobHeldUser", "priority": 0,
         "partition": "gpu", "node_count": 1, "cpus": 1, "minimum_cpus_per_node": 1,
         "tres_req_str": "cpu=1,mem=16000M,node=1,billing=1,gres/gpu=1", "shared": None,
         "tres_per_node": "gres:gpu:1", "array_job_id": 4, "array_task_id": None,
         "array_task_string": "0-3", "memory_per_node": None, "memory_per_cpu": 500},
        {"job_id": 6, "job_state": "PENDING", "state_reason": "JobHeldUser", "priority": 0,
         "partition": "gpu", "node_count": 1, "cpus": 1, "het_job_id": 5, "het_job_offset": 1,
         "tres_req_str": "cpu=1,node=1,gres/gpu=2", "licenses": "matlab:1",
         "dependency": "afterok:3"},
        {"job_id": 8, "job_state": "PENDING", "state_reason": "JobHeldUser", "priority": 0,
         "partition": "gpu", "node_count": 2, "cpus": 4, "minimum_cpus_per_node": 2,
         "tasks_per_node": 2, "tres_req_str": "cpu=4,node=2,gres/gpu=2",
         "tres_per_node": "gres:gpu:1"},
    ]
}  # fmt: skip


def test_the_queue_carries_what_slurm_holds_of_each_request() -> None:
    q = {j.job_id: j for j in parse_queue(SQUEUE)}
    a = q[2]
    assert a.excluded_nodes == ("gpu01", "gpu02") and a.features == "fast"
    assert a.exclusive and a.contiguous and a.cpus_per_node == 2 and a.mem_per_node_mb == 1000
    assert a.het_job_id == 0 and a.array_job_id == 0 and a.unmodelled == ()
    arr = q[4]
    assert (arr.array_job_id, arr.array_task_id, arr.array_tasks) == (4, None, "0-3")
    assert not arr.exclusive and arr.mem_per_node_mb == 500  # --mem-per-cpu x CPUs
    het = q[6]
    assert (het.het_job_id, het.het_job_offset) == (5, 1)
    assert {u.split("=")[0] for u in het.unmodelled} == {"licenses", "dependency"}
    assert q[8].cpus_per_node == 2
    nodes = parse_nodes(
        {"nodes": [{"name": "gpu01", "state": "idle", "state_flags": ["RESERVED"], "cpus": 8,
                    "alloc_cpus": 3, "real_memory": 16000, "alloc_memory": 100,
                    "active_features": "fast,ib", "gres": "gpu:4", "gres_used": "gpu:0"}]}
    )  # fmt: skip
    assert nodes[0].cpus_alloc == 3 and nodes[0].features == ("fast", "ib")
    assert (nodes[0].memory_mb, nodes[0].memory_alloc_mb) == (16000, 100)


def test_only_nodes_the_job_accepts_count_and_what_is_not_modelled_goes_back() -> None:
    queue = [
        qjob(1, 1, excluded_nodes=tuple(NAMES)),  # every node excluded: never fits
        qjob(2, 1, features="fast"),  # only NAMES[2] has it
        qjob(3, 1, features="fast|slow"),  # an expression: left to Slurm
        qjob(4, 1, het_job_id=4),
        qjob(5, 1, array_job_id=5, array_tasks="0-9"),
        qjob(6, 3, 2),  # --gpus=3 -N2: no even split
        qjob(7, 1, unmodelled=("licenses=matlab:1",)),
        qjob(8, 1, mem_per_node_mb=20000),  # more than any node has
        qjob(9, 1, features="fast&ib"),
    ]
    nodes = [
        ninfo(NAMES[0], cpus_alloc=8),  # all its CPUs taken: no room for a job
        ninfo(NAMES[1], state="IDLE+RESERVED"),
        ninfo(NAMES[2], features=("fast",)),
        ninfo(NAMES[3]),
    ]
    obs = build_observation(queue, nodes, TOPO, ["gpu"], 200.0, mode="active")
    assert sorted(obs.managed) == [2]
    assert obs.kinds == {
        1: "never_fits", 3: "constraint", 4: "heterogeneous", 5: "array", 6: "shape",
        7: "unmodelled", 8: "never_fits", 9: "never_fits",
    }  # fmt: skip
    assert {q.job_id for q in obs.no_gpu} == set(obs.kinds)  # all handed back at once
    assert obs.state.free_gpus == (0, 0, 4, 4)  # no free CPU; reserved
    job = obs.managed[2]
    shape = obs.shapes[2]
    free = list(obs.state.free_gpus)
    why = check_start(Placement.of([(3, 1)]), shape, free, TOPO, job, obs.rooms)
    assert why is not None and why.startswith("constraint") and "lacks feature fast" in why
    assert place_within(job, shape, free, TOPO, obs.rooms, (3,)) == Placement.of([(2, 1)])


def test_exclusive_and_contiguous_placements() -> None:
    nodes = [ninfo(NAMES[0]), ninfo(NAMES[1], used=1, cpus_alloc=1), ninfo(NAMES[2]),
             ninfo(NAMES[3])]  # fmt: skip
    queue = [qjob(1, 1, exclusive=True), qjob(2, 2, 2, contiguous=True)]
    obs = build_observation(queue, nodes, TOPO, ["gpu"], 200.0, mode="active")
    free = list(obs.state.free_gpus)
    excl, contig = obs.managed[1], obs.managed[2]
    assert "not idle" in str(
        check_start(Placement.of([(1, 1)]), obs.shapes[1], free, TOPO, excl, obs.rooms)
    )
    gap = Placement.of([(0, 1), (2, 1)])
    assert "contiguous" in str(check_start(gap, obs.shapes[2], free, TOPO, contig, obs.rooms))
    got = place_within(contig, obs.shapes[2], free, TOPO, obs.rooms, (0, 2))
    assert got is not None and sorted(got.nodes) in ([0, 1], [1, 2], [2, 3])


def test_the_loop_moves_a_start_off_refused_nodes_and_hands_back_odd_shapes(
    tmp_path: Path,
) -> None:
    queue = [qjob(1, 1, excluded_nodes=(NAMES[0],)), qjob(2, 2, 2), qjob(3, 8, 2)]
    nodes = [ninfo(n) for n in NAMES[:3]] + [ninfo(NAMES[3], used=4)]
    client = FakeClient(queue, nodes)
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    # the policy puts job 1 on a node it excludes, and jobs 2 and 3 (-N2) on one node
    backend.apply(
        Decision(
            starts=(
                Start(1, Placement.of([(0, 1)])),
                Start(2, Placement.of([(1, 2)])),
                Start(3, Placement.of([(2, 4)])),
            )
        )
    )
    cmds = client.runner.commands
    assert ["scontrol", "update", "JobId=1", f"ReqNodeList={NAMES[1]}", "NumNodes=1"] in cmds
    # job 2 offered the shape it asked (2 nodes x 1), the policy's node first
    two = next(c for c in cmds if c[:3] == ["scontrol", "update", "JobId=2"])
    assert set(two[3].removeprefix("ReqNodeList=").split(",")) == {NAMES[0], NAMES[1]}
    assert two[4] == "NumNodes=2"
    # job 3 (2 x 4) has no room in its shape now: handed back unchanged, not held
    assert ["scontrol", "release", "3"] in cmds
    assert not any(c[:3] == ["scontrol", "update", "JobId=3"] for c in cmds)
    text = backend.metrics.text()
    assert 'linkwise_serve_handed_back_total{reason="shape"} 1.0' in text
    assert "linkwise_serve_moved_starts_total 2.0" in text


def test_stranded_releases_are_cleared_and_max_hold_holds_with_the_lease_lapsed(
    tmp_path: Path,
) -> None:
    stranded = qjob(  # Slurm 22.05 gives such a job priority 0: it shows as held
        1, 1, held=True, admin_comment=RELEASED_TAG, reason="BadConstraints",
        req_nodes=(NAMES[0],), excluded_nodes=(NAMES[0],),
    )  # fmt: skip
    waiting = qjob(2, 1, held=False, admin_comment=RELEASED_TAG, reason="Resources",
                   req_nodes=(NAMES[1],))  # fmt: skip
    client = FakeClient([stranded, waiting, qjob(3, 4)], [ninfo(n, 4) for n in NAMES])
    backend = make_backend(tmp_path, client, max_hold_s=1.0)
    backend.start()
    backend.observe()
    backend.first_seen[3] = time.time() - 5
    backend.keeper.ok = lambda margin=0.5: False  # type: ignore[method-assign]
    backend.apply(Decision())
    cmds = client.runner.commands
    assert ["scontrol", "update", "JobId=1", "ReqNodeList="] in cmds
    assert not any("JobId=2" in c for c in cmds)  # waiting for resources is not stranded
    assert ["scontrol", "release", "3"] in cmds  # over max-hold, the lease lapsed or not


def test_bad_link_load_rows_are_ignored_and_counted(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    con = open_store(str(db))
    rows = [
        (100.0, "n0", 5e9), (101.0, "n0", math.inf), (100.0, "n1", math.nan),
        (100.0, "n2", 1e9),
    ]  # fmt: skip
    for ts, node, rate in rows:
        con.execute(
            "INSERT INTO link_load VALUES (?, 10, '', ?, 'mlx5_0', 'ib', 'tx', ?, 'test')",
            [ts, node, rate],
        )
    con.close()
    recorder = Recorder(str(db), tmp_path / "spool", logger=LOG)
    bad: list[int] = []
    load = read_link_load(recorder, "c", 0.0, on_bad=bad.append)
    assert load == {"n0": 5e9, "n2": 1e9} and bad == [2]
    # an infinite load handed to the observation directly does not crash it
    odd = {NAMES[0]: math.inf, NAMES[1]: -1.0}
    nodes = [ninfo(n) for n in NAMES]
    obs = build_observation([], nodes, TOPO, ["gpu"], 200.0, mode="active", link_load=odd)
    assert obs.state.link_flows[0] == 0 and obs.state.link_flows[1] == 0


def test_the_watchdogs_sweep_clears_stranded_node_lists_too(tmp_path: Path) -> None:
    """With the loop gone, the hand-back (the watchdog's, the shutdown's) also frees a job
    released where Slurm cannot run it; a released job waiting for resources is left."""
    lease = Lease(os.getpid(), None, time.time() + 60, ("gpu",), None, None, "r")
    queue = [
        qjob(1, 1, held=True, admin_comment=RELEASED_TAG, reason="ReqNodeNotAvail",
             req_nodes=(NAMES[0],)),
        qjob(2, 1, held=False, admin_comment=RELEASED_TAG, reason="Resources",
             req_nodes=(NAMES[1],)),
        qjob(3, 1),
    ]  # fmt: skip
    client = FakeClient(queue, [])
    recorder = Recorder(None, tmp_path / "spool.jsonl", logger=LOG)
    released = sweep(client, lease, recorder, actor="watchdog", logger=LOG)  # type: ignore[arg-type]
    assert released == [3]
    assert client.runner.commands == [
        ["scontrol", "update", "JobId=1", "ReqNodeList="],
        ["scontrol", "release", "3"],
    ]
