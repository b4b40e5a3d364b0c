"""Parallel leaf uplinks with ECMP path choice per flow (``Topology.ecmp_spines``, spec
``ecmp=1``): the stated hash, collisions of two jobs across the same ToRs at 1:1 where the
pooled uplink sees none, determinism, the simulator's incremental rates still exact, and the
pooled fabric unchanged when it is off."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from linkwise.cluster.contention import AnalyticModel, link_flows
from linkwise.cluster.domain import Job, LinkKind, Placement, Topology, ecmp_plane
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.heuristics import make_policy
from linkwise.tests.cluster.test_split_rates import Chaos, _jobs, _split

CAL = load_calibration(None)
MODEL = AnalyticModel(CAL)
HEAVY = max(CAL.profiles, key=lambda p: CAL.profiles[p].grad_gb / CAL.profiles[p].compute_s)


def test_the_plane_is_the_stated_hash() -> None:
    for job, flow, src, dst, planes in [(0, 0, 0, 1, 4), (123456, 3, 17, 40, 16), (-1, 1, 2, 3, 7)]:
        data = b"".join(x.to_bytes(8, "little", signed=True) for x in (job, flow, src, dst))
        want = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % planes
        assert ecmp_plane(job, flow, src, dst, planes) == want


def test_spec_option_and_links() -> None:
    pooled = from_spec("8x8,leaf=4")
    assert pooled.ecmp_spines == 0
    assert replace(from_spec("8x8,leaf=4,ecmp=0"), name=pooled.name) == pooled
    topo = from_spec("8x8,leaf=4,ecmp=1")
    assert topo.ecmp_spines == 4  # 4 nodes x 12.5 GB/s at 1:1 -> 4 uplinks of 12.5
    assert from_spec("8x8,leaf=4,oversub=2,ecmp=1").ecmp_spines == 2
    assert from_spec("8x8,leaf=4,ecmp=1,spines=8").ecmp_spines == 8
    ports = [link for link in topo.links if link.kind is LinkKind.LEAF_PORT]
    assert len(ports) == 2 * 4 * 2  # leaves x spines x (up, down)
    assert {p.gbps for p in ports} == {12.5}
    assert [link.link_id for link in topo.links] == list(range(len(topo.links)))
    # the pooled links keep their ids; only the ports are added after them
    assert topo.links[: len(pooled.links)] == pooled.links
    for bad in ("8x8,ecmp=2", "8x8,spines=4", "8x8,ecmp=1,spines=-1"):
        with pytest.raises(ValueError):
            from_spec(bad)


def test_a_ring_takes_one_up_and_one_down_port_per_leaf_it_crosses() -> None:
    topo = from_spec("12x8,leaf=4,ecmp=1")
    nodes = (0, 1, 4, 9)  # three leaves
    links = topo.ring_links(nodes, 7)
    ports = [topo.links[i] for i in links if topo.links[i].kind is LinkKind.LEAF_PORT]
    assert links[:4] == nodes
    ups = sorted(p.name.split(":")[0] for p in ports if ":up" in p.name)
    downs = sorted(p.name.split(":")[0] for p in ports if ":down" in p.name)
    assert ups == downs == ["leaf1", "leaf2", "leaf3"]
    # the hop leaving a leaf lands on the next leaf's down port of the same plane
    assert topo.ring_hops(nodes) == ((0, 1), (1, 4), (4, 9), (9, 0))
    s = ecmp_plane(7, 1, 1, 4, 4)
    assert {f"leaf1:up{s + 1}", f"leaf2:down{s + 1}"} <= {p.name for p in ports}
    assert topo.ring_links((3,), 7) == () and topo.ring_links((0, 1), 7) == (0, 1)  # one leaf


def test_paths_are_deterministic_across_builds() -> None:
    a, b = from_spec("32x8,leaf=8,ecmp=1"), from_spec("32x8,leaf=8,ecmp=1")
    for job in range(50):
        nodes = (job % 8, 8 + job % 8, 16 + (job * 3) % 8)
        assert a.ring_links(nodes, job) == b.ring_links(nodes, job)


def _ports(topo: Topology, links: tuple[int, ...]) -> set[int]:
    return {i for i in links if topo.links[i].kind is LinkKind.LEAF_PORT}


def _pair(collide: bool) -> tuple[Job, Job]:
    """Two 16-GPU jobs, each over one node of leaf 1 and one of leaf 2 (their own nodes),
    whose flows ECMP puts on a shared uplink (``collide``) or on disjoint ones."""
    topo = from_spec("8x8,leaf=4,ecmp=1")
    first = Job(1, 0.0, 16, 100.0, HEAVY)
    mine = _ports(topo, topo.ring_links((0, 4), 1))
    for jid in range(2, 400):
        shared = bool(mine & _ports(topo, topo.ring_links((1, 5), jid)))
        if shared == collide:
            return first, Job(jid, 0.0, 16, 100.0, HEAVY)
    raise AssertionError("no such pair")


@pytest.mark.parametrize("collide", [True, False])
def test_two_jobs_across_the_same_tors_collide_only_when_hashed_together(collide: bool) -> None:
    a, b = _pair(collide)
    placed = [(a, Placement(((0, 8), (4, 8)))), (b, Placement(((1, 8), (5, 8))))]
    pooled, ecmp = from_spec("8x8,leaf=4"), from_spec("8x8,leaf=4,ecmp=1")
    assert MODEL.rates(pooled, placed) == [1.0, 1.0]  # the pooled 50 GB/s uplink: no contention
    rates = MODEL.rates(ecmp, placed)
    if collide:
        assert rates[0] < 0.99 and rates[1] < 0.99
    else:
        assert rates == [1.0, 1.0]
    # each alone is as fast as on the pooled fabric (an uplink carries a NIC's traffic)
    assert MODEL.rates(ecmp, placed[:1]) == [1.0]
    assert MODEL._iteration_times_reference(ecmp, placed) == MODEL.iteration_times(ecmp, placed)


def test_link_flows_follow_the_jobs_paths() -> None:
    topo = from_spec("8x8,leaf=4,ecmp=1")
    a, b = _pair(True)
    placements = [Placement(((0, 8), (4, 8))), Placement(((1, 8), (5, 8)))]
    flows = link_flows(topo, placements, [a.job_id, b.job_id])
    ports = [i for i, link in enumerate(topo.links) if link.kind is LinkKind.LEAF_PORT]
    assert max(flows[i] for i in ports) == 2
    assert sum(flows[len(topo.nodes) : len(topo.nodes) + 2]) == 0  # pooled uplinks unused


def test_pooled_runs_are_unchanged_when_ecmp_is_off() -> None:
    jobs = _jobs(5, 60)
    base = from_spec("16x8,leaf=4,agg=2,oversub=2")
    off = from_spec("16x8,leaf=4,agg=2,oversub=2,ecmp=0")
    a = simulate(base, jobs, AnalyticModel(CAL), make_policy("fifo"))
    b = simulate(off, jobs, AnalyticModel(CAL), make_policy("fifo"))
    assert a.records == b.records
    c = simulate(replace(base, ecmp_spines=4), jobs, AnalyticModel(CAL), make_policy("fifo"))
    assert len(c.records) == len(a.records)


@pytest.mark.parametrize("spec", ["16x8,leaf=4,ecmp=1", "16x8,leaf=4,agg=2,oversub=2,ecmp=1"])
def test_incremental_rates_stay_exact_under_ecmp(spec: str) -> None:
    """Lockstep against the full recomputation, and every rate against ``model.rates``."""
    topo = from_spec(spec)
    config = SimConfig(tick_s=900.0)
    fast = Simulator(topo, _jobs(3), MODEL, config)
    full = Simulator(topo, _jobs(3), AnalyticModel(CAL), config, incremental=False)
    pf, pl = Chaos(3), Chaos(3)
    points = slowed = 0
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
            slowed += any(w < 1.0 for w in want)
        fast.apply(pf.decide(a))
        full.apply(pl.decide(b))
        points += 1
        more = fast.advance()
        assert more == full.advance()
        if not more:
            break
    assert fast.records == full.records and fast._split_rates is not None
    assert points > 100 and slowed > 10
