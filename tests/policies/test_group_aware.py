"""``group_aware`` (Arnold's alignment): a layout job's DP groups kept under one leaf each
where the bounded placement would split one; every other job placed as ``bounded``."""

from __future__ import annotations

from linkwise.cluster.domain import Job
from linkwise.cluster.layout import stage_leaves
from linkwise.cluster.placement.aligned import aligned_placement
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.compose import ComposeSpec
from linkwise.policies.heuristics import make_policy, policy_names
from linkwise.policies.parts.placements import Bounded, GroupAware

TOPO = from_spec("12x8,leaf=4,agg=1,oversub=2")  # three leaves of four nodes
BUSY = [0] * 12


def test_a_split_dp_group_is_moved_under_one_leaf() -> None:
    job = Job(1, 0.0, 64, 100.0, "MoE", pp=4, flexible=True)  # 4 stages of 2 nodes
    free = [8, 8, 8, 0, 8, 8, 8, 8, 8, 8, 8, 0]  # 3, 4 and 3 whole nodes free per leaf
    bounded = Bounded().place(TOPO, free, BUSY, [], job)
    assert bounded is not None and stage_leaves(TOPO, bounded, 4) == (1, 2, 1, 2)
    chosen = GroupAware().place(TOPO, free, BUSY, [], job)
    assert chosen is not None and chosen.num_gpus == 64
    assert stage_leaves(TOPO, chosen, 4) == (1, 1, 1, 1)
    assert chosen.nodes == (0, 1, 4, 5, 6, 7, 8, 9)  # the full leaf holds two stages


def test_the_fewest_leaves_and_the_tightest_nodes_are_taken() -> None:
    job = Job(1, 0.0, 32, 100.0, "MoE", pp=2, flexible=True)  # 2 stages of 2 nodes
    free = [8, 8, 8, 0, 8, 8, 8, 8, 8, 8, 8, 8]
    free[5] = 0
    got = aligned_placement(TOPO, free, job)
    # leaves 0 and 1 hold one stage each (three whole nodes), leaf 2 two: it takes both
    assert got is not None and got.nodes == (8, 9, 10, 11)


def test_no_aligned_set_falls_back_to_bounded_and_jobs_without_stages_are_bounded() -> None:
    free = [8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 8]  # one stage of two nodes fits, not two
    staged = Job(1, 0.0, 32, 100.0, "MoE", pp=2, flexible=True)
    assert aligned_placement(TOPO, free, staged) is None
    assert GroupAware().place(TOPO, free, BUSY, [], staged) == Bounded().place(
        TOPO, free, BUSY, [], staged
    )
    plain = Job(2, 0.0, 64, 100.0, "MoE", flexible=True)
    free = [8, 8, 8, 0, 8, 8, 8, 8, 8, 8, 8, 0]
    assert GroupAware().place(TOPO, free, BUSY, [], plain) == Bounded().place(
        TOPO, free, BUSY, [], plain
    )
    assert GroupAware().memo_key(plain) == Bounded().memo_key(plain)
    assert GroupAware().memo_key(staged) != Bounded().memo_key(staged)


def test_it_composes_and_names_a_heuristic() -> None:
    spec = ComposeSpec.parse("compose:order=pred_remaining,placement=group_aware:lam=2")
    assert spec.describe().startswith("compose:order=pred_remaining,placement=group_aware")
    assert "qssf_group_aware" not in policy_names(predictions=True)  # opt-in
    policy = make_policy("qssf_group_aware")
    assert ComposeSpec.of(policy).describe() == (  # type: ignore[arg-type]
        "compose:order=pred_remaining,placement=group_aware,preempt=priority:margin=1.5,"
        "min_run_s=600.0,admission=greedy"
    )
