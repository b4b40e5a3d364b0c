"""The fabric as it is (issue 33 item 2): ECMP on the aggregation->core tier
(``Topology.ecmp_cores``), ``ecmp=1`` on topologies read from files (the Lingjun CSV), and
rail-optimised fabrics (``Topology.rails``), with link loads worked out by hand."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from linkwise.cluster.contention import AnalyticModel, link_flows
from linkwise.cluster.domain import Job, LinkKind, Placement, ecmp_plane
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.load import describe, load_topology
from linkwise.cluster.topology.spec import from_spec
from linkwise.models.residual import topology_signature
from linkwise.tests.cluster.test_split_rates import Chaos, _jobs, _split

CAL = load_calibration(None)
MODEL = AnalyticModel(CAL)
HEAVY = max(CAL.profiles, key=lambda p: CAL.profiles[p].grad_gb / CAL.profiles[p].compute_s)


def _named(topo_links: object, flows: list[int]) -> dict[str, int]:
    """Link name -> flows, for the links that carry any."""
    return {link.name: f for link, f in zip(topo_links, flows, strict=True) if f}  # type: ignore[call-overload]


# --- ECMP on the aggregation tier -----------------------------------------------------------


def test_the_core_tier_hash_is_the_stated_one() -> None:
    data = b"".join(x.to_bytes(8, "little", signed=True) for x in (9, 1, 2, 3, 1))
    want = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % 5
    assert ecmp_plane(9, 1, 2, 3, 5, tier=1) == want
    assert ecmp_plane(9, 1, 2, 3, 5, tier=0) == ecmp_plane(9, 1, 2, 3, 5)


def test_ecmp_splits_the_aggregation_uplinks_too() -> None:
    topo = from_spec("16x8,leaf=4,agg=2,ecmp=1")
    assert (topo.ecmp_spines, topo.ecmp_cores) == (4, 8)  # 4 and 8 nodes at 1:1
    assert from_spec("16x8,leaf=4,agg=2,agg_oversub=2,ecmp=1").ecmp_cores == 4
    assert from_spec("16x8,leaf=4,agg=2,ecmp=1,cores=3").ecmp_cores == 3
    assert from_spec("16x8,leaf=4,ecmp=1").ecmp_cores == 0  # one spine: no core tier
    ports = [link for link in topo.links if link.kind is LinkKind.AGG_PORT]
    assert len(ports) == 2 * 8 * 2 and {p.gbps for p in ports} == {100.0 / 8}
    assert [link.link_id for link in topo.links] == list(range(len(topo.links)))
    with pytest.raises(ValueError):
        from_spec("16x8,leaf=4,agg=2,cores=2")  # cores needs ecmp=1
    # a ring between the two aggregation switches: hop (0 -> 8) and hop (8 -> 0), each on
    # the core plane its own tier-1 hash picks, leaving by one switch's up port and entering
    # the other's down port; the pooled aggregation uplinks are not used
    links = topo.ring_links((0, 8), 5)
    names = {topo.links[i].name for i in links if topo.links[i].kind is LinkKind.AGG_PORT}
    c0, c1 = ecmp_plane(5, 0, 0, 8, 8, tier=1), ecmp_plane(5, 1, 8, 0, 8, tier=1)
    assert names == {
        f"agg1:up{c0 + 1}",
        f"agg2:down{c0 + 1}",
        f"agg2:up{c1 + 1}",
        f"agg1:down{c1 + 1}",
    }
    assert not {i for i in links if topo.links[i].kind is LinkKind.AGG_UPLINK}
    # within one aggregation switch no core port is crossed
    inside = topo.ring_links((0, 4), 5)
    assert not [i for i in inside if topo.links[i].kind is LinkKind.AGG_PORT]


def _core_pair(collide: bool) -> tuple[Job, Job]:
    """Two 16-GPU jobs over the two aggregation switches (on their own nodes and ToRs of a
    ``16x8,leaf=4,agg=2`` fabric) whose flows share a core port (``collide``) or not."""
    topo = from_spec("16x8,leaf=4,agg=2,ecmp=1,cores=2")

    def cores(jid: int, nodes: tuple[int, int]) -> set[int]:
        kind = LinkKind.AGG_PORT
        return {i for i in topo.ring_links(nodes, jid) if topo.links[i].kind is kind}

    mine = cores(1, (0, 8))
    for jid in range(2, 400):
        if bool(mine & cores(jid, (4, 12))) == collide:
            return Job(1, 0.0, 16, 100.0, HEAVY), Job(jid, 0.0, 16, 100.0, HEAVY)
    raise AssertionError("no such pair")


@pytest.mark.parametrize("collide", [True, False])
def test_two_jobs_collide_on_the_core_only_when_hashed_together(collide: bool) -> None:
    """At 4:1 above the aggregation switches (8 nodes x 12.5 / 4 = 25 GB/s each, as two core
    uplinks of 12.5), two rings on their own nodes and ToRs meet only on the core."""
    spec = "16x8,leaf=4,agg=2,agg_oversub=4,ecmp=1,cores=2,spines=4"
    topo = from_spec(spec)
    a, b = _core_pair(collide)
    placed = [(a, Placement(((0, 8), (8, 8)))), (b, Placement(((4, 8), (12, 8))))]
    kind = LinkKind.AGG_PORT
    assert {
        topo.links[i].gbps for i in topo.ring_links((0, 8), 1) if topo.links[i].kind is kind
    } == {12.5}
    rates = MODEL.rates(topo, placed)
    alone = [MODEL.rates(topo, [p])[0] for p in placed]
    if collide:
        assert rates[0] < alone[0] and rates[1] < alone[1]
    else:
        assert rates == alone
    assert MODEL._iteration_times_reference(topo, placed) == MODEL.iteration_times(topo, placed)


# --- ecmp=1 where a topology is read from a file ----------------------------------------------


def _csv(tmp_path: Path) -> Path:
    """Two PSWs under one DSW, two ToRs under each (``S1`` under both), two hosts per ToR."""
    rows = ["ip,DSW,PSW,ASW"]
    k = 0
    for psw in ("P1", "P2"):
        for asw in ("S1", "S2"):
            for _ in range(2):
                k += 1
                rows.append(f"10.0.0.{k},D1,{psw},{asw}")
    path = tmp_path / "topo.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_lingjun_loader_takes_ecmp(tmp_path: Path) -> None:
    path = _csv(tmp_path)
    pooled = load_topology(str(path))
    assert (pooled.ecmp_spines, pooled.ecmp_cores) == (0, 0)
    assert load_topology(f"{path},ecmp=0") == pooled
    topo = load_topology(f"{path},ecmp=1")
    assert (topo.ecmp_spines, topo.ecmp_cores) == (2, 4)  # 2 hosts per ToR, 4 per PSW, 1:1
    assert (describe(topo)["ecmp_spines"], describe(topo)["ecmp_cores"]) == (2, 4)
    assert "ecmp_spines" not in describe(pooled)
    assert topo.links[: len(pooled.links)] == pooled.links
    two = load_topology(f"{path},ecmp=1,oversub=2,spines=3,cores=1")
    assert (two.ecmp_spines, two.ecmp_cores) == (3, 1)
    assert load_topology(f"{path},ecmp=1,oversub=2").ecmp_spines == 1
    for bad in (",spines=2", ",ecmp=2", ",cores=1", ",ecmp=x"):
        with pytest.raises(ValueError):
            load_topology(f"{path}{bad}")
    # hosts h1,h2 under P1/S1 and h5 under P2/S1: the ring crosses leaf and core ports
    kinds = [topo.links[i].kind for i in topo.ring_links((0, 1, 4), 3)]
    assert kinds.count(LinkKind.NIC) == 3
    assert kinds.count(LinkKind.LEAF_PORT) == 4 and kinds.count(LinkKind.AGG_PORT) == 4


def test_the_shipped_lingjun_topology_loads_with_ecmp() -> None:
    path = (
        Path(__file__).resolve().parents[3] / "shared/data/topology/alibaba_lingjun_2023_topo.csv"
    )
    if not path.is_file():
        pytest.skip("no ../shared/data")
    topo = load_topology(f"{path},ecmp=1")
    assert len(topo.nodes) == 847 and len(topo.agg_names) == 3
    assert topo.ecmp_spines == max(len(m) for m in topo.leaf_nodes)
    assert topo.ecmp_cores > 1


# --- rail-optimised fabrics -------------------------------------------------------------------


def test_rail_spec_and_links() -> None:
    topo = from_spec("4x2,leaf=2,rails=2")
    assert topo.rails == 2
    rail = {link.name: link.gbps for link in topo.links if link.kind.value.startswith("rail")}
    # 4 nodes x 2 NICs, 2 groups x 2 rail uplinks of 2 nodes x 12.5 each, 2 rails to the spine
    assert len(rail) == 8 + 4 + 2
    assert rail["gpu1:nic0"] == 12.5 and rail["leaf2/rail1:up"] == 25.0
    assert from_spec("4x2,leaf=2,oversub=2,rails=2").links[-3].gbps == 12.5
    assert from_spec("4x2,leaf=2,rails=1").rails == 0
    for bad in ("4x2,rails=3", "4x2,rails=2,ecmp=1", "4x2,rails=-1"):
        with pytest.raises(ValueError):
            from_spec(bad)


def test_rails_a_job_uses() -> None:
    topo = from_spec("2x8,rails=8")
    assert topo.job_rails(3, 8) == tuple(range(8)) == topo.job_rails(3, 0)
    assert topo.job_rails(3, 2) == (6, 7) and topo.job_rails(5, 4) == (4, 5, 6, 7)
    assert topo.job_rails(1, 3) == (3, 4, 5) and topo.job_rails(3, 3) == (
        1,
        2,
        3,
    )  # 3 x 3 = 9 = 1 mod 8
    assert from_spec("2x8").job_rails(3, 2) == ()


SAME_HOSTS = [Placement(((0, 1), (1, 1))), Placement(((0, 1), (1, 1)))]
ACROSS = [Placement(((0, 1), (2, 1))), Placement(((1, 1), (3, 1)))]


def test_two_jobs_on_the_same_two_hosts_share_no_link_on_rails() -> None:
    """Jobs 0 and 1 take one GPU on each of hosts 1 and 2 (one group): on a single-NIC leaf
    fabric both rings cross both NICs; on rails job 0's GPUs are rank 0 (rail 0), job 1's rank
    1 (rail 1), so each crosses its own NICs and no switch uplink."""
    single, rails = from_spec("4x2,leaf=2"), from_spec("4x2,leaf=2,rails=2")
    assert _named(single.links, link_flows(single, SAME_HOSTS, [0, 1])) == {
        "gpu1:nic": 2,
        "gpu2:nic": 2,
    }
    assert _named(rails.links, link_flows(rails, SAME_HOSTS, [0, 1])) == {
        "gpu1:nic0": 1,
        "gpu2:nic0": 1,
        "gpu1:nic1": 1,
        "gpu2:nic1": 1,
    }


def test_two_jobs_across_two_groups_share_the_uplinks_only_without_rails() -> None:
    """Job 0 on hosts 1 and 3, job 1 on hosts 2 and 4 (groups {1,2} and {3,4}): on a single-NIC
    fabric both cross both leaf uplinks; on rails each crosses its rail's uplinks only."""
    single, rails = from_spec("4x2,leaf=2"), from_spec("4x2,leaf=2,rails=2")
    assert _named(single.links, link_flows(single, ACROSS, [0, 1])) == {
        "gpu1:nic": 1,
        "gpu2:nic": 1,
        "gpu3:nic": 1,
        "gpu4:nic": 1,
        "leaf1:up": 2,
        "leaf2:up": 2,
    }
    assert _named(rails.links, link_flows(rails, ACROSS, [0, 1])) == {
        "gpu1:nic0": 1,
        "gpu3:nic0": 1,
        "leaf1/rail0:up": 1,
        "leaf2/rail0:up": 1,
        "gpu2:nic1": 1,
        "gpu4:nic1": 1,
        "leaf1/rail1:up": 1,
        "leaf2/rail1:up": 1,
    }


def test_rails_remove_the_slowdown_of_a_shared_uplink() -> None:
    """At 2:1 a leaf uplink (single NIC: 2 x 12.5 / 2 = 12.5 GB/s) or a rail uplink (12.5 each)
    carries one NIC's traffic: alone each job runs at its NIC's speed on both; together they
    halve (or worse) each other on the single-NIC fabric and not at all on rails."""
    jobs = [Job(0, 0.0, 2, 1.0, HEAVY), Job(1, 0.0, 2, 1.0, HEAVY)]
    single = from_spec("4x2,leaf=2,oversub=2")
    rails = from_spec("4x2,leaf=2,oversub=2,rails=2")
    placed = list(zip(jobs, ACROSS, strict=True))
    assert MODEL.iteration_times(single, placed[:1]) == MODEL.iteration_times(rails, placed[:1])
    t_single = MODEL.iteration_times(single, placed)
    t_rails = MODEL.iteration_times(rails, placed)
    assert t_rails == [MODEL.iteration_times(rails, [p])[0] for p in placed]
    assert all(s > r for s, r in zip(t_single, t_rails, strict=True))
    for topo in (single, rails):
        assert MODEL._iteration_times_reference(topo, placed) == MODEL.iteration_times(topo, placed)


def test_a_whole_node_ring_runs_over_every_rail() -> None:
    """16 GPUs over 2 nodes of 8 with 8 rails of 12.5 GB/s: 8 parallel rings, so the ring runs
    at min(NVLink 150, 8 x 12.5) = 100 GB/s; on one NIC at 12.5."""
    job = Job(7, 0.0, 16, 1.0, HEAVY)
    prof = CAL.profiles[HEAVY]
    volume = (prof.grad_gb / 16) * 2.0 * 15
    place = Placement(((0, 8), (1, 8)))
    for spec, gbps in (("2x8,leaf=1,rails=8", 100.0), ("2x8,leaf=1", 12.5)):
        topo = from_spec(spec)
        (t,) = MODEL.iteration_times(topo, [(job, place)])
        assert t == pytest.approx(prof.compute_s + volume / gbps + 2 * CAL.overhead_s, rel=1e-12)
        assert MODEL.rates(topo, [(job, place)]) == [1.0]  # the best placement is this one
    # PCIe nodes cap it at the intra-node 12 GB/s however many rails
    (t,) = MODEL.iteration_times(from_spec("2x8,leaf=1,pcie,rails=8"), [(job, place)])
    assert t == pytest.approx(prof.compute_s + volume / 12.0 + 2 * CAL.overhead_s, rel=1e-12)


@pytest.mark.parametrize(
    "spec", ["16x8,leaf=4,oversub=2,rails=8", "16x8,leaf=4,agg=2,agg_oversub=2,ecmp=1,cores=3"]
)
def test_incremental_rates_stay_exact(spec: str) -> None:
    """The simulator's incremental rates against the full recomputation, in lockstep."""
    topo = from_spec(spec)
    config = SimConfig(tick_s=900.0)
    fast = Simulator(topo, _jobs(3), MODEL, config)
    full = Simulator(topo, _jobs(3), AnalyticModel(CAL), config, incremental=False)
    pf, pl = Chaos(3), Chaos(3)
    points = 0
    while True:
        a, b = fast.observe(), full.observe()
        assert (a.time, a.running, a.pending, a.link_flows) == (
            b.time,
            b.running,
            b.pending,
            b.link_flows,
        )
        split = _split(fast)
        if split:
            want = MODEL.rates(topo, [(r.job, r.placement) for r in split])
            assert [r.rate for r in split] == want
        fast.apply(pf.decide(a))
        full.apply(pl.decide(b))
        points += 1
        more = fast.advance()
        assert more == full.advance()
        if not more:
            break
    assert fast.records == full.records and points > 100


def test_residual_signatures_tell_the_new_fabrics_apart() -> None:
    """A learned residual defers on a fabric it was not trained on: core-tier ECMP planes and
    rails are part of the topology's signature (pooled fabrics keep theirs)."""
    specs = ("16x8,leaf=4,agg=2,ecmp=1", "16x8,leaf=4,agg=2,ecmp=1,cores=3")
    assert len({topology_signature(from_spec(s)) for s in specs}) == 2
    single = from_spec("16x8,leaf=4")
    assert topology_signature(replace(single, rails=8)) != topology_signature(single)


def test_every_parallel_uplink_of_a_tier_is_as_fast() -> None:
    """A leaf with fewer nodes (the last of ``20x8,leaf=8``: 4 nodes) has the same switch:
    its 8 parallel uplinks carry 12.5 GB/s each, as the full leaves' do, not 4 x 12.5 / 8
    (which would make a ring through it slower than its NICs alone)."""
    topo = from_spec("20x8,leaf=8,agg=2,ecmp=1")  # aggregation switches over 16 and 4 nodes
    assert {link.gbps for link in topo.links if link.kind is LinkKind.LEAF_PORT} == {12.5}
    assert {link.gbps for link in topo.links if link.kind is LinkKind.AGG_PORT} == {12.5}
    job = Job(3, 0.0, 16, 1.0, HEAVY)
    assert MODEL.rates(topo, [(job, Placement(((0, 8), (16, 8))))]) == [1.0]
