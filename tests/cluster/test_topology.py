"""Topology builders: compact specs, slurm.conf + topology.conf, the Alibaba Lingjun CSV."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from linkwise.cluster.domain import LinkKind, Topology
from linkwise.cluster.hostlist import compress
from linkwise.cluster.topology.lingjun import from_alibaba_csv, read_alibaba_hosts
from linkwise.cluster.topology.load import describe, load_topology
from linkwise.cluster.topology.slurm_conf import from_slurm_conf, gpus_from_gres
from linkwise.cluster.topology.spec import DEFAULT_NIC_GBPS, PCIE_GBPS, from_spec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ALIBABA = DATA / "topology" / "alibaba_lingjun_2023_topo.csv"


def _kinds(topo: Topology, nodes: list[int]) -> Counter[LinkKind]:
    return Counter(topo.links[i].kind for i in topo.ring_links(nodes))


# ---------------------------------------------------------------- specs


def test_spec_counts_leaf_sizes_and_oversubscription() -> None:
    topo = from_spec("40x8,leaf=16,oversub=2,nic=25")
    assert len(topo.nodes) == 40 and topo.total_gpus == 320
    assert [len(m) for m in topo.leaf_nodes] == [16, 16, 8]
    assert topo.leaf_uplink_gbps == (16 * 25 / 2, 16 * 25 / 2, 8 * 25 / 2)
    assert topo.agg_names == ("spine",) and topo.agg_uplink_gbps == (math.inf,)
    assert topo.nodes[0].name == "gpu01" and topo.nodes[-1].name == "gpu40"


def test_spec_aggregation_and_pcie() -> None:
    topo = from_spec("64x4,leaf=8,agg=3,agg_oversub=4,pcie")
    assert len(topo.leaf_names) == 8 and len(topo.agg_names) == 3
    assert topo.leaf_agg == (0, 0, 0, 1, 1, 1, 2, 2)
    assert topo.agg_uplink_gbps == (24 * DEFAULT_NIC_GBPS / 4,) * 2 + (16 * DEFAULT_NIC_GBPS / 4,)
    assert {(n.intra_kind, n.intra_gbps) for n in topo.nodes} == {("pcie", PCIE_GBPS)}


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "64",
        "64x",
        "64x8x2",
        "0x8",
        "64x0",
        "64x8,foo=1",
        "64x8,leaf=0",
        "64x8,leaf=a",
        "64x8,oversub=-1",
        "64x8,nic=nan",
        "64x8,intra=inf",
    ],
)
def test_bad_specs_raise(spec: str) -> None:
    with pytest.raises(ValueError, match="bad cluster spec"):
        from_spec(spec)


# ---------------------------------------------------------------- slurm.conf

SLURM_CONF = """\
# a small cluster
ClusterName=test
SlurmctldHost=head(10.0.0.1)
NodeName=DEFAULT CPUs=64 RealMemory=512000 Gres=gpu:a100:8 State=UNKNOWN
NodeName=gpu[01-04]
NodeName=gpu[05-06] Gres=gpu:4(S:0-1) \\
    Feature="big mem"
NodeName=DEFAULT Gres=gpu:v100:2,mps:200
NodeName=old[1-2]
NodeName=cpu1 Gres=mps:100
PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

TWO_LEVEL = """\
SwitchName=s0 Nodes=gpu[01-04] LinkSpeed=100
SwitchName=s1 Nodes=gpu[05-06],old[1-2]
SwitchName=top Switches=s[0-1]
"""

THREE_LEVEL = """\
SwitchName=leaf1 Nodes=gpu[01-02]
SwitchName=leaf2 Nodes=gpu[03-04]
SwitchName=leaf3 Nodes=gpu[05-06]
SwitchName=leaf4 Nodes=old[1-2],cpu1
SwitchName=aggA Switches=leaf2
SwitchName=aggB Switches=leaf[3-4]
SwitchName=core Switches=aggA,aggB
"""


def test_slurm_conf_nodes_defaults_and_gres() -> None:
    topo = from_slurm_conf(SLURM_CONF, None, nic_gbps=25.0)
    names = [n.name for n in topo.nodes]
    assert names == [f"gpu0{i}" for i in range(1, 7)] + ["old1", "old2", "cpu1"]
    assert [n.gpus for n in topo.nodes] == [8, 8, 8, 8, 4, 4, 2, 2, 0]
    assert topo.leaf_names == ("implicit-leaf",) and topo.leaf_uplink_gbps == (9 * 25.0,)
    assert topo.ring_links([0, 5]) == (0, 5)  # one leaf: only the two NICs


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", 8),
        ("gpu:a100:8", 8),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("gpu:tesla:2(S:0,1),mps:400", 2),
        ("gpu", 1),
        ("gpu:a100", 1),
        ("mps:100", 0),
        ("", 0),
    ],
)
def test_gpus_from_gres(gres: str, gpus: int) -> None:
    assert gpus_from_gres(gres) == gpus


def test_two_level_tree() -> None:
    topo = from_slurm_conf(SLURM_CONF, TWO_LEVEL, nic_gbps=10.0, oversub=2.0)
    assert topo.leaf_names == ("s0", "s1", "implicit-leaf")
    assert [len(m) for m in topo.leaf_nodes] == [4, 4, 1]
    assert topo.leaf_uplink_gbps == (20.0, 20.0, 5.0)
    # cpu1 is in no switch: its implicit leaf hangs off an implicit spine beside "top"
    assert topo.agg_names == ("top", "spine") and topo.leaf_agg == (0, 0, 1)
    assert topo.agg_uplink_gbps == (80.0, 10.0)
    idx = topo.node_index
    assert topo.nodes[idx["cpu1"]].leaf == 2


def test_single_root_has_an_infinite_agg_uplink() -> None:
    conf = "NodeName=n[1-4] Gres=gpu:8\n"
    topo = from_slurm_conf(conf, "SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\n")
    assert topo.agg_names == ("spine",) and topo.agg_uplink_gbps == (math.inf,)
    topo = from_slurm_conf(
        conf, "SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\nSwitchName=r Switches=a,b\n"
    )
    assert topo.agg_names == ("r",) and topo.agg_uplink_gbps == (math.inf,)


def test_three_level_tree_and_ring_links() -> None:
    topo = from_slurm_conf(SLURM_CONF, THREE_LEVEL, nic_gbps=10.0)
    assert topo.leaf_names == ("leaf1", "leaf2", "leaf3", "leaf4")
    # leaf1 has no parent: it goes under an implicit spine; core is folded away
    assert topo.agg_names == ("spine", "aggA", "aggB")
    assert topo.leaf_agg == (0, 1, 2, 2)
    assert topo.agg_uplink_gbps == (20.0, 20.0, 50.0)
    idx = topo.node_index
    n_nodes, n_leaves = len(topo.nodes), len(topo.leaf_names)
    assert topo.ring_links([idx["gpu05"]]) == ()
    same_leaf = [idx["old1"], idx["cpu1"]]
    assert topo.ring_links(same_leaf) == tuple(same_leaf)
    across_leaves = [idx["gpu05"], idx["old2"]]  # leaf3 and leaf4, both under aggB
    assert topo.ring_links(across_leaves) == (
        *across_leaves,
        n_nodes + 2,
        n_nodes + 3,
    )
    across_aggs = [idx["gpu03"], idx["gpu06"]]  # leaf2/aggA and leaf3/aggB
    assert topo.ring_links(across_aggs) == (
        *across_aggs,
        n_nodes + 1,
        n_nodes + 2,
        n_nodes + n_leaves + 1,
        n_nodes + n_leaves + 2,
    )


@pytest.mark.parametrize(
    ("topology_conf", "message"),
    [
        ("SwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Switches=s[0-2]\n", "unknown switch 's2'"),
        (
            "SwitchName=a Nodes=gpu01\nSwitchName=b Switches=a,c\nSwitchName=c Switches=b\n",
            "cycle",
        ),
        ("SwitchName=a Switches=a\n", "cycle"),
        ("SwitchName=s0 Nodes=gpu[01-03]\nSwitchName=s1 Nodes=gpu[03-04]\n", "two leaf switches"),
        ("SwitchName=s0 Nodes=gpu[01-09]\n", "does not define"),
        ("SwitchName=s0 Nodes=gpu01\nSwitchName=s0 Nodes=gpu02\n", "defined twice"),
        (
            "SwitchName=a Nodes=gpu01\nSwitchName=p Switches=a\nSwitchName=q Switches=a\n",
            "two parents",
        ),
        ("SwitchName=a Nodes=gpu01 Switches=b\nSwitchName=b Nodes=gpu02\n", "both Nodes"),
        ("SwitchName=a Nodes=gpu[01\n", "unclosed"),
        ("BlockName=b1 Nodes=gpu[01-04]\n", "tree topology"),
        ("SwitchName=a Nodes=gpu01 Color=red\n", "unknown keys"),
        ("SwitchName=a Nodes=gpu01 garbage\n", "cannot parse"),
    ],
)
def test_topology_conf_errors(topology_conf: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_slurm_conf(SLURM_CONF, topology_conf)


@pytest.mark.parametrize(
    ("slurm_conf", "message"),
    [
        ("ClusterName=x\n", "no nodes"),
        ("NodeName=n[1-2]\nNodeName=n2\n", "defined twice"),
        ("NodeName=n[2-1]\n", "line 1: hostlist"),
        ("NodeName=n1 junk\n", "cannot parse"),
    ],
)
def test_slurm_conf_errors(slurm_conf: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_slurm_conf(slurm_conf)


def test_slurm_conf_rejects_bad_rates() -> None:
    with pytest.raises(ValueError, match="oversub"):
        from_slurm_conf("NodeName=n1\n", oversub=0.0)


# ---------------------------------------------------------------- Alibaba Lingjun


def test_alibaba_counts() -> None:
    hosts = read_alibaba_hosts(ALIBABA)
    assert len(hosts) == 847 and len({h.host_id for h in hosts}) == 847
    assert len({h.tor for h in hosts}) == 48  # ToR labels ...
    assert len({h.agg for h in hosts}) == 3 and {h.core for h in hosts} == {"G6"}
    # ... but a label names a different switch under each PSW: S14 hangs off all three
    assert {h.agg for h in hosts if h.tor == "S14"} == {"P8", "P10", "P12"}

    topo = from_alibaba_csv(ALIBABA, nic_gbps=25.0, oversub=2.0)
    assert len(topo.nodes) == 847 and topo.total_gpus == 847 * 8
    assert topo.agg_names == ("P8", "P10", "P12")
    assert len(topo.leaf_names) == 119 and max(len(m) for m in topo.leaf_nodes) == 8
    per_agg = Counter(topo.agg_names[a] for a in topo.node_agg)
    assert per_agg == {"P10": 362, "P12": 306, "P8": 179}
    assert topo.agg_uplink_gbps == (179 * 25.0, 362 * 25.0, 306 * 25.0)
    for leaf, members in enumerate(topo.leaf_nodes):
        assert topo.leaf_uplink_gbps[leaf] == len(members) * 25.0 / 2.0
        # names follow the tree: one ToR's hosts are one hostlist range
        assert "," not in compress(topo.nodes[i].name for i in members)


def test_alibaba_ring_links() -> None:
    topo = from_alibaba_csv(ALIBABA)
    leaf_a, leaf_b = topo.leaf_nodes[0], topo.leaf_nodes[1]
    assert topo.leaf_agg[0] == topo.leaf_agg[1]
    other_agg = next(
        m for i, m in enumerate(topo.leaf_nodes) if topo.leaf_agg[i] != topo.leaf_agg[0]
    )
    assert _kinds(topo, [leaf_a[0]]) == {}
    assert _kinds(topo, [leaf_a[0], leaf_a[1]]) == {LinkKind.NIC: 2}
    assert _kinds(topo, [leaf_a[0], leaf_b[0]]) == {LinkKind.NIC: 2, LinkKind.LEAF_UPLINK: 2}
    assert _kinds(topo, [leaf_a[0], leaf_a[1], other_agg[0]]) == {
        LinkKind.NIC: 3,
        LinkKind.LEAF_UPLINK: 2,
        LinkKind.AGG_UPLINK: 2,
    }


def test_alibaba_rejects_other_csv(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("host,rack\na,b\n")
    with pytest.raises(ValueError, match="missing columns"):
        from_alibaba_csv(bad)
    dup = tmp_path / "dup.csv"
    dup.write_text("ip,DSW,PSW,ASW\na,G,P1,S1\na,G,P1,S2\n")
    with pytest.raises(ValueError, match="twice"):
        from_alibaba_csv(dup)


# ---------------------------------------------------------------- dispatch and describe


def test_load_topology_dispatch(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(SLURM_CONF)
    (tmp_path / "topology.conf").write_text(TWO_LEVEL)
    by_dir = load_topology(str(tmp_path))
    assert by_dir.leaf_names == ("s0", "s1", "implicit-leaf")
    by_file = load_topology(f"{tmp_path / 'slurm.conf'},nic=10,oversub=2")
    assert by_file.leaf_uplink_gbps == (20.0, 20.0, 5.0)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "my.conf").write_text(SLURM_CONF)
    assert load_topology(str(alone / "my.conf")).leaf_names == ("implicit-leaf",)

    csv_topo = load_topology(f"{ALIBABA},gpus=4,pcie")
    assert csv_topo.total_gpus == 847 * 4
    assert {(n.intra_kind, n.intra_gbps) for n in csv_topo.nodes} == {("pcie", PCIE_GBPS)}

    assert len(load_topology("8x8,leaf=4").leaf_names) == 2


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("no/such/dir", "accepted forms"),
        ("eight-by-eight", "accepted forms"),
        ("8x8,bogus=1", "bad cluster spec"),
    ],
)
def test_load_topology_errors(arg: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_topology(arg)


def test_load_topology_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no slurm\.conf"):
        load_topology(str(tmp_path))
    (tmp_path / "slurm.conf").write_text(SLURM_CONF)
    (tmp_path / "topology.conf").write_text(TWO_LEVEL)
    with pytest.raises(ValueError, match=r"give slurm\.conf"):
        load_topology(str(tmp_path / "topology.conf"))
    with pytest.raises(ValueError, match=r"only applies to a \.csv"):
        load_topology(f"{tmp_path},gpus=8")
    with pytest.raises(ValueError, match="unknown option"):
        load_topology(f"{tmp_path},leaf=4")
    with pytest.raises(ValueError, match="bad option value"):
        load_topology(f"{tmp_path},nic=fast")


def test_describe() -> None:
    info = describe(from_slurm_conf(SLURM_CONF, TWO_LEVEL, nic_gbps=10.0))
    assert info["nodes"] == 9 and info["gpus"] == 8 * 4 + 4 * 2 + 2 * 2
    assert info["leaves"] == 3 and info["aggs"] == 2
    assert info["gpus_per_node"] == {0: 1, 2: 2, 4: 2, 8: 4}
    assert info["leaf_uplink_gbps_min"] == 10.0 and info["leaf_uplink_gbps_max"] == 40.0
    assert info["agg_uplink_gbps_max"] == 80.0
    assert describe(from_spec("4x8"))["agg_uplink_gbps_min"] is None
