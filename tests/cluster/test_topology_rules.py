"""Slurm's topology as Slurm enforces it (issue 31 item 4): topology.conf (tree and block),
topology.yaml and ``scontrol show topology`` read into the ``Topology``; the rules of
``cluster.slurm.topology_rules`` (tree T1/T2, block B1-B3, ``--segment`` S1,
``--exclusive=topo`` X1); a job's requests from squeue's JSON (24.11, 26.05, 22.05); and
the live loop's checks (``never_fits``, ``check_start``, ``place_within``, hand-back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.domain import Placement, Shape, Topology
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob, TopologyRequest
from linkwise.cluster.slurm.topology_rules import (
    check_nodes,
    left_to_slurm,
    place,
    topology_request,
)
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.scontrol import parse_scontrol_topology, topology_differences
from linkwise.cluster.topology.slurm_conf import from_slurm_conf, slurm_topology_plugin
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.job_requests import never_fits
from linkwise.deployer.observation import build_observation
from linkwise.deployer.start_checks import check_start, place_within
from linkwise.tests._slurm import SHARED_SLURM_DATA

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NODES = "NodeName=gpu[01-08] CPUs=8 Gres=gpu:4\nPartitionName=gpu Nodes=ALL\n"
TREE = (
    "SwitchName=s1 Nodes=gpu[01-02]\nSwitchName=s2 Nodes=gpu[03-04]\n"
    "SwitchName=s0 Switches=s[1-2]\n"
)
# two trees without a common parent: (s1, s2 under t1) and s3 alone
TWO_TREES = TREE.replace("s0 Switches", "t1 Switches") + "SwitchName=s3 Nodes=gpu[05-08]\n"
BLOCKS = "".join(f"BlockName=b{k} Nodes=gpu[{2 * k - 1:02d}-{2 * k:02d}]\n" for k in range(1, 5))


def topo_of(plugin: str, conf: str, extra: str = "") -> Topology:
    return from_slurm_conf(f"{NODES}TopologyPlugin=topology/{plugin}\n{extra}", conf)


def idx(topo: Topology, *names: str) -> list[int]:
    return [topo.node_index[n] for n in names]


# ------------------------------------------------------------------ reading the topology


def test_plugin_from_slurm_conf() -> None:
    assert slurm_topology_plugin(NODES) == ("flat", frozenset())
    assert slurm_topology_plugin("TopologyPlugin=topology/none\n")[0] == "flat"
    conf = "TopologyPlugin=topology/tree\nTopologyParam=TopoOptional,Dragonfly\n"
    assert slurm_topology_plugin(conf) == ("tree", frozenset({"topooptional", "dragonfly"}))
    assert from_slurm_conf(NODES, TREE).plugin == "flat"  # the old tree reading, no rules


def test_block_topology_conf() -> None:
    topo = topo_of("block", BLOCKS + "BlockSizes=2,8\n")
    assert topo.plugin == "block" and topo.block_sizes == (2, 8)
    assert [(b.name, b.nodes) for b in topo.blocks][:2] == [("b1", (0, 1)), ("b2", (2, 3))]
    # no SwitchName lines: each base block is a leaf for the contention model
    assert topo.leaf_names == ("b1", "b2", "b3", "b4")
    mixed = topo_of("block", TREE + BLOCKS)
    assert mixed.leaf_names == ("s1", "s2", "implicit-leaf") and len(mixed.blocks) == 4


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (BLOCKS + "BlockSizes=2,6\n", "not 2 times a power of two"),
        (BLOCKS + "BlockName=b1 Nodes=gpu01\n", "defined twice"),
        ("BlockName=b9 Nodes=gpu[09-10]\n", "does not define"),
        ("BlockName=b1 Nodes=gpu01 Color=red\n", "unknown keys"),
    ],
)
def test_block_conf_errors(conf: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        topo_of("block", conf)


def test_tree_fabric_marks_disjoint_trees_and_unswitched_nodes() -> None:
    topo = topo_of("tree", TREE)
    assert topo.leaf_names == ("s1", "s2", "implicit-leaf") and topo.leaf_fabric == (0, 0, -1)
    two = topo_of("tree", TWO_TREES)
    assert two.leaf_fabric == (0, 0, 1)


YAML = """
- topology: topo-tree
  tree:
    switches:
      - switch: sw_root
        children: s[1-2]
      - switch: s1
        nodes: gpu[01-04]
      - switch: s2
        nodes: gpu[05-08]
- topology: topo-block
  cluster_default: true
  block:
    block_sizes: [2, 4]
    blocks:
      - block: b1
        nodes: gpu[01-02]
      - block: b2
        nodes: gpu[03-04]
"""


def test_topology_yaml_cluster_default_and_precedence(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(NODES)
    (tmp_path / "topology.conf").write_text(TREE)
    (tmp_path / "topology.yaml").write_text(YAML)
    topo = load_topology(str(tmp_path))  # topology.yaml wins over topology.conf (Slurm's rule)
    assert topo.plugin == "block" and topo.block_sizes == (2, 4)
    assert [b.name for b in topo.blocks] == ["b1", "b2"]
    first = from_slurm_conf(NODES, topology_yaml=YAML.replace("  cluster_default: true\n", ""))
    assert first.plugin == "tree" and first.leaf_names == ("s1", "s2")
    assert first.leaf_fabric == (0, 0)
    with pytest.raises(ValueError, match="exactly one of"):
        from_slurm_conf(NODES, topology_yaml="- topology: x\n  tree: {}\n  block: {}\n")
    with pytest.raises(ValueError, match="list of topologies"):
        from_slurm_conf(NODES, topology_yaml="topology: x\n")


SCONTROL_BLOCK = """BlockName=b1 BlockIndex=0 Nodes=gpu[01-02] BlockSize=2
BlockName=b2 BlockIndex=1 Nodes=gpu[03-04] BlockSize=2
AggregatedBlock=b1,b2 BlockIndex=2 Nodes=gpu[01-04] BlockSize=4
"""
SCONTROL_TREE = """SwitchName=s1 Level=0 LinkSpeed=1 Nodes=gpu[01-02]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=gpu[03-04]
SwitchName=s0 Level=1 LinkSpeed=1 Switches=s[1-2]
"""


def test_scontrol_show_topology_as_source_and_cross_check() -> None:
    kind, conf = parse_scontrol_topology(SCONTROL_BLOCK)
    assert kind == "block" and "BlockSizes=2,4" in conf
    topo = topo_of("block", conf)
    assert [b.name for b in topo.blocks] == ["b1", "b2"] and topo.block_sizes == (2, 4)
    four = "".join(BLOCKS.splitlines(keepends=True)[:2]) + "BlockSizes=2,4\n"
    assert topology_differences(topo_of("block", four), SCONTROL_BLOCK) == []
    moved = topo_of("block", four.replace("gpu[03-04]", "gpu[03-05]"))
    assert any(d.startswith("blocks") for d in topology_differences(moved, SCONTROL_BLOCK))
    # BlockSizes=2,4 == Slurm's default 1,2,4,8 base blocks on two blocks
    default = topo_of("block", four.replace("BlockSizes=2,4\n", ""))
    assert topology_differences(default, SCONTROL_BLOCK) == []
    tree = topo_of("tree", TREE)
    assert topology_differences(tree, SCONTROL_TREE) == []
    assert topology_differences(tree, SCONTROL_BLOCK)[0].startswith("plugin")
    assert topology_differences(topo_of("tree", TWO_TREES), SCONTROL_TREE)


# ------------------------------------------------------------------ a job's requests


def _doc(version: str) -> dict[str, Any]:
    path = SHARED_SLURM_DATA / version / "running" / "squeue.json"
    return dict(json.loads(path.read_text()))


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_request_fields_of_modern_records(version: str) -> None:
    doc = _doc(version)
    rec = dict(doc["jobs"][0])
    assert topology_request(rec) == TopologyRequest()  # none asked (and 0, not None)
    rec.update(
        required_switches=1,
        maximum_switch_wait_time=300,
        segment_size={"set": True, "infinite": False, "number": 2},
        shared=["topo"],
        flags=[*rec["flags"], "CONSOLIDATE_SEGMENTS"],
    )
    asked = topology_request(rec)
    assert asked == TopologyRequest(1, 300.0, 2, True, False, True)
    assert parse_queue({**doc, "jobs": [rec]})[0].topology == asked
    assert topology_request({"exclusive": ["topo"]}).exclusive_topo  # the later field name


def test_request_fields_of_22_05_records() -> None:
    doc = json.loads((FIXTURES / "slurm" / "squeue.json").read_text())
    assert {q.topology.switches for q in parse_queue(doc)} == {None}  # 22.05 does not say
    assert topology_request({"required_switches": 4294967294}).switches == 0  # NO_VAL


# ------------------------------------------------------------------ the rules


def test_tree_one_fabric_and_switches() -> None:
    topo = topo_of("tree", TWO_TREES)
    none = TopologyRequest()
    assert check_nodes(topo, none, idx(topo, "gpu01", "gpu03")).ok  # under t1
    v = check_nodes(topo, none, idx(topo, "gpu01", "gpu05"))
    assert not v.ok and v.reason.startswith("T1")
    one = TopologyRequest(switches=1, switch_wait_s=300)
    v = check_nodes(topo, one, idx(topo, "gpu01", "gpu03"))
    assert not v.ok and v.reason.startswith("T2") and v.wait_s == 300
    assert check_nodes(topo, one, idx(topo, "gpu01", "gpu02")).ok
    assert check_nodes(topo, TopologyRequest(switches=2), idx(topo, "gpu01", "gpu03")).ok
    unswitched = topo_of("tree", TREE)
    v = check_nodes(unswitched, none, idx(unswitched, "gpu05"))
    assert not v.ok and "no leaf switch" in v.reason
    optional = topo_of("tree", TWO_TREES, "TopologyParam=TopoOptional\n")
    assert check_nodes(optional, none, idx(optional, "gpu01", "gpu05")).ok
    assert not check_nodes(optional, one, idx(optional, "gpu01", "gpu05")).ok


def test_block_levels_default_and_configured() -> None:
    local = topo_of("block", BLOCKS[: BLOCKS.index("BlockName=b3")] + "BlockSizes=2,4\n")
    none = TopologyRequest()
    v = check_nodes(local, none, idx(local, "gpu02", "gpu03"))  # 2 nodes: one base block
    assert not v.ok and v.reason.startswith("B2")
    assert check_nodes(local, none, idx(local, "gpu03", "gpu04")).ok
    assert check_nodes(local, none, idx(local, "gpu01", "gpu02", "gpu03")).ok  # level 1
    v = check_nodes(local, none, idx(local, "gpu05"))
    assert not v.ok and v.reason.startswith("B1")
    # BlockSizes=2,8: levels 0 and 2; 3 nodes use a 4-block aggregate, on at most 2 base blocks
    wide = topo_of("block", BLOCKS + "BlockSizes=2,8\n")
    assert check_nodes(wide, none, idx(wide, "gpu01", "gpu02", "gpu07")).ok
    v = check_nodes(wide, none, idx(wide, "gpu01", "gpu03", "gpu05"))
    assert not v.ok and v.reason.startswith("B3")
    # the default levels (1, 2, 4, 8 base blocks): 3 nodes lie in b1+b2 or b3+b4
    default = topo_of("block", BLOCKS)
    assert check_nodes(default, none, idx(default, "gpu01", "gpu03", "gpu04")).ok
    v = check_nodes(default, none, idx(default, "gpu03", "gpu04", "gpu05"))
    assert not v.ok and v.reason.startswith("B2")
    # more nodes than any level: anywhere in the blocks
    small = topo_of("block", BLOCKS + "BlockSizes=2\n")
    assert check_nodes(small, none, idx(small, "gpu01", "gpu03", "gpu05")).ok


def test_segments() -> None:
    topo = topo_of("block", BLOCKS + "BlockSizes=2\n")
    seg = TopologyRequest(segment=2)
    assert check_nodes(topo, seg, idx(topo, "gpu01", "gpu02", "gpu07", "gpu08")).ok
    v = check_nodes(topo, seg, idx(topo, "gpu01", "gpu03", "gpu05", "gpu06"))
    assert not v.ok and v.reason.startswith("S1")
    v = check_nodes(topo, TopologyRequest(segment=3), idx(topo, "gpu01", "gpu02", "gpu03", "gpu04"))
    assert not v.ok and "multiple" in v.reason
    # a segment as large as the job: no effect (B2 decides)
    assert not check_nodes(topo, TopologyRequest(segment=4), idx(topo, "gpu01", "gpu03")).ok
    tiered = topo_of("block", BLOCKS + "BlockSizes=2,4\n")
    both = idx(tiered, "gpu01", "gpu02", "gpu07", "gpu08")
    assert check_nodes(tiered, seg, both).ok
    consolidated = TopologyRequest(segment=2, consolidate_segments=True)
    assert not check_nodes(tiered, consolidated, both).ok  # not within one 4-node block
    assert check_nodes(tiered, consolidated, idx(tiered, "gpu01", "gpu02", "gpu03", "gpu04")).ok


def test_exclusive_topo() -> None:
    topo = topo_of("block", BLOCKS)
    pair = idx(topo, "gpu03", "gpu04")
    excl = TopologyRequest(exclusive_topo=True)
    v = check_nodes(topo, excl, pair, busy=idx(topo, "gpu04"))
    assert not v.ok and v.reason.startswith("X1")
    assert check_nodes(topo, excl, pair, busy=idx(topo, "gpu01")).ok
    v = check_nodes(topo, TopologyRequest(), pair, topo_held=idx(topo, "gpu03"))
    assert not v.ok and "hold an --exclusive=topo job" in v.reason
    # the tree plugin does not support it: ignored, as Slurm does
    tree = topo_of("tree", TREE)
    assert check_nodes(tree, excl, idx(tree, "gpu01", "gpu02"), busy=idx(tree, "gpu02")).ok


def test_place_finds_what_the_rules_accept() -> None:
    tree = topo_of("tree", TWO_TREES)
    one = TopologyRequest(switches=1)
    order = idx(tree, "gpu01", "gpu03", "gpu04", "gpu05")
    assert place(tree, one, 2, order) == tuple(idx(tree, "gpu03", "gpu04"))
    assert place(tree, one, 3, order) is None
    assert place(tree, TopologyRequest(), 3, order) == tuple(idx(tree, "gpu03", "gpu04", "gpu01"))
    block = topo_of("block", BLOCKS + "BlockSizes=2,4\n")
    free = idx(block, "gpu02", "gpu03", "gpu05", "gpu06", "gpu07")
    assert place(block, TopologyRequest(), 2, free) == tuple(idx(block, "gpu05", "gpu06"))
    assert place(block, TopologyRequest(), 4, free) is None
    seg = TopologyRequest(segment=2)
    got = place(block, seg, 4, idx(block, "gpu01", "gpu03", "gpu04", "gpu07", "gpu08"))
    assert got is not None and check_nodes(block, seg, got).ok
    excl = TopologyRequest(exclusive_topo=True)
    free = idx(block, "gpu01", "gpu02", "gpu03", "gpu04")
    busy = idx(block, "gpu02")
    assert place(block, excl, 2, free, busy=busy) == tuple(idx(block, "gpu03", "gpu04"))
    flat = from_slurm_conf(NODES)
    assert place(flat, one, 2, [5, 0, 3]) == (5, 0)


def test_left_to_slurm() -> None:
    assert left_to_slurm(topo_of("ring", ""), TopologyRequest(), 2) is not None
    dragonfly = topo_of("tree", TREE, "TopologyParam=dragonfly\n")
    assert "dragonfly" in (left_to_slurm(dragonfly, TopologyRequest(), 2) or "")
    tree = topo_of("tree", TREE)
    unknown = TopologyRequest(switches=None)
    assert "--switches" in (left_to_slurm(tree, unknown, 2) or "")
    assert left_to_slurm(tree, unknown, 1) is None
    block = topo_of("block", BLOCKS)
    spread = TopologyRequest(segment=2, spread_segments=True)
    assert left_to_slurm(block, spread, 4) is not None
    assert left_to_slurm(block, spread, 2) is None  # one segment: no effect
    assert left_to_slurm(from_slurm_conf(NODES), unknown, 4) is None


# ------------------------------------------------------------------ the live loop's checks


def qjob(job_id: int, n_nodes: int, **kw: Any) -> QueuedJob:
    base: dict[str, Any] = dict(
        job_id=job_id, name=f"j{job_id}", user="u", partition="gpu", state="PENDING",
        reason="JobHeldUser", submit_time=100.0 + job_id, start_time=None, time_limit_s=600.0,
        num_nodes=n_nodes, gpus=4 * n_nodes, nodes=(), held=True, admin_comment=HOLD_TAG,
        cpus_per_node=1,
    )  # fmt: skip
    base.update(kw)
    return QueuedJob(**base)


def ninfo(name: str, used: int = 0) -> NodeInfo:
    return NodeInfo(name, "IDLE", ("gpu",), 8, 4, used, cpus_alloc=used, memory_mb=16000)


def test_loop_checks_follow_the_block_rules() -> None:
    topo = topo_of("block", BLOCKS + "BlockSizes=2,4\n")
    running = qjob(1, 1, state="RUNNING", nodes=("gpu01",), held=False, admin_comment="")
    exclusive = qjob(2, 2, topology=TopologyRequest(exclusive_topo=True))
    pair = qjob(3, 2)
    nodes = [ninfo(n.name, used=4 if n.name == "gpu01" else 0) for n in topo.nodes]
    obs = build_observation([running, exclusive, pair], nodes, topo, ["gpu"], 1000.0, mode="active")
    assert set(obs.managed) == {2, 3}
    shape = Shape(2, 4)
    free, rooms = obs.state.free_gpus, obs.rooms
    across = Placement.of([(i, 4) for i in idx(topo, "gpu02", "gpu03")])
    why = check_start(across, shape, free, topo, pair, rooms) or ""
    assert why.startswith("constraint: topology B2")
    moved = place_within(pair, shape, free, topo, rooms, across.nodes)
    assert moved is not None and check_nodes(topo, pair.topology, moved.nodes).ok
    # --exclusive=topo: not b1 (gpu01 runs a job), whatever the policy prefers
    b1 = idx(topo, "gpu01", "gpu02")
    got = place_within(exclusive, shape, free, topo, rooms, b1)
    assert got is not None and not set(got.nodes) & set(b1)


def test_never_fits_and_hand_back_for_topology() -> None:
    tree = topo_of("tree", TREE)  # gpu[05-08] hang off no switch
    nodes = [ninfo(n.name) for n in tree.nodes]
    part = list(range(len(tree.nodes)))
    three = qjob(5, 3, topology=TopologyRequest(switches=1, switch_wait_s=60))
    assert (never_fits(Shape(3, 4), tree, part, three) or "").startswith("topology")
    assert never_fits(Shape(2, 4), tree, part, qjob(6, 2, topology=TopologyRequest(1))) is None
    unknown = qjob(7, 2, topology=TopologyRequest(switches=None))
    ring = topo_of("ring", "")
    obs = build_observation([three, unknown], nodes, tree, ["gpu"], 1000.0, mode="active")
    assert obs.kinds == {5: "never_fits", 7: "topology"}
    assert {q.job_id for q in obs.no_gpu} == {5, 7}
    obs = build_observation([qjob(8, 1)], nodes, ring, ["gpu"], 1000.0, mode="active")
    assert obs.kinds == {8: "topology"} and "ring" in obs.refused[8]
