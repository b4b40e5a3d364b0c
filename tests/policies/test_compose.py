"""Schedulers composed of parts (``policies.parts``): the spec parser, each part's rule,
and the frontier policies on small hand-built states."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from linkwise.cli import main
from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Topology,
)
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies import heuristics as heur
from linkwise.policies.catalog import policy_info
from linkwise.policies.compose import ComposeSpec
from linkwise.policies.composed import Composed
from linkwise.policies.heuristics import POLICIES
from linkwise.policies.parts.orders import MissingPredictions, predicted_remaining_s
from linkwise.policies.spec import PolicySpec, split_specs

NOW = 100_000.0


def _job(i: int, gpus: int, pred: float = 0.0, *, submit: float = 0.0, profile: str = "") -> Job:
    return Job(i, submit, gpus, 1e5, profile=profile, pred_s=pred, pred_hi_s=pred * 2)


def _running(
    job: Job, alloc: Sequence[tuple[int, int]], *, ran_s: float, attained: float | None = None
) -> RunningJob:
    return RunningJob(
        job=job,
        placement=Placement.of(list(alloc)),
        start_time=NOW - ran_s,
        remaining_s=5e4,
        rate=1.0,
        attained_gpu_s=job.num_gpus * ran_s if attained is None else attained,
        since=NOW,
    )


def _state(topo: Topology, running: Sequence[RunningJob], pending: Sequence[Job]) -> ClusterState:
    free = [n.gpus for n in topo.nodes]
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    return ClusterState(
        time=NOW,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(PendingJob(j, remaining_s=j.duration) for j in pending),
    )


# ----------------------------------------------------------------------------- the spec


def test_the_issue_example_parses_builds_and_reads_back() -> None:
    text = "compose:order=pred_remaining,placement=bounded,preempt=priority:margin=1.5"
    spec = ComposeSpec.parse(text)
    assert spec.part("order") == ("pred_remaining", {})
    assert spec.part("preempt") == ("priority", {"margin": 1.5})
    assert spec.part("admission") == ("greedy", {})  # the default
    assert spec.preemptive and not spec.migrates and spec.needs_predictions and not spec.oracle
    policy = spec.build()
    assert isinstance(policy, Composed) and policy.preemption.margin == 1.5  # type: ignore[attr-defined]
    assert ComposeSpec.parse(spec.describe()) == spec
    assert PolicySpec.parse(text).describe() == spec.describe()


def test_a_part_takes_several_parameters_and_a_slot_name_opens_the_next_part() -> None:
    spec = ComposeSpec.parse(
        "compose:order=las:thresholds=100;1000,mode=submit,placement=bounded:kappa=4,lam=2,"
        "preempt=priority:min_run_s=60,refill=false"
    )
    assert spec.part("order") == ("las", {"thresholds": (100.0, 1000.0), "mode": "submit"})
    assert spec.part("placement") == ("bounded", {"kappa": 4, "lam": 2.0})
    assert spec.part("preempt") == ("priority", {"min_run_s": 60.0, "refill": False})
    # a compose spec in a list of specs stays one spec
    assert split_specs("compose:order=gpus,placement=bounded:lam=2,preempt=none,fifo") == [
        "compose:order=gpus,placement=bounded:lam=2,preempt=none",
        "fifo",
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("compose:order=nope,placement=bounded", r"unknown order 'nope'; known: submit, gpus"),
        ("compose:order=gpus,placement=far", r"unknown placement 'far'; known: first_fit"),
        ("compose:order=gpus,placement=bounded,preempt=kill", r"unknown preempt 'kill'; known"),
        ("compose:order=gpus,placement=bounded,admission=lottery", "unknown admission"),
        ("compose:order=gpus,placement=bounded:gamma=1", r"bounded has no parameter 'gamma'"),
        ("compose:order=gpus,placement=bounded:kappa=four", r"kappa='four': expected an integer"),
        ("compose:lam=2,order=gpus,placement=bounded", "before any part"),
        ("compose:placement=bounded", r"order= is required \(known: submit"),
        ("compose:order=gpus", "placement= is required"),
        ("compose:order=gpus,order=submit,placement=bounded", "order= given twice"),
        ("compose:order=gpus,placement=bounded:lam", "expected key=value"),
        ("compose:order=gpus,placement=bounded,margin", "expected slot=part or key=value"),
        ("compose:order=gpus,placement=bounded,preempt=priority:margin=0.5", "at least 1"),
        ("compose:order=las,placement=best_fit", "needs a preemption rule"),
        ("compose:order=las,placement=best_fit,preempt=priority:margin=2", "no margin"),
        ("compose:order=submit,placement=best_fit,admission=easy", "placement=select"),
        ("compose:order=gpus,placement=bounded,preempt=priority,admission=strict", "greedily"),
        ("compose:order=gpus,placement=bounded:lam=0.5", "lam must be at least 1"),
    ],
)
def test_bad_specs_are_refused_naming_what_is_known(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        policy = PolicySpec.parse(text).build()
        topo = from_spec("1x8")
        policy.decide(_state(topo, [_running(_job(1, 4), [(0, 4)], ran_s=1e4)], [_job(2, 8)]))


def test_every_named_heuristic_but_random_is_a_composition_that_parses() -> None:
    for name in POLICIES:
        named = PolicySpec.parse(name)
        info = policy_info(named)
        if name == "random":
            assert info.composition is None
            continue
        assert info.composition is not None
        spec = ComposeSpec.parse(info.composition)
        assert spec.oracle == named.is_oracle == info.oracle
        assert spec.needs_predictions == named.needs_predictions == info.needs_predictions
        assert spec.preemptive == info.preemptive and spec.migrates == info.migrates
    assert PolicySpec.parse(
        "compose:order=true_remaining,placement=bounded,preempt=priority"
    ).is_oracle
    assert PolicySpec.parse("compose:order=pred_gpu_time,placement=best_fit").needs_predictions
    assert not PolicySpec.parse("compose:order=pred_gpu_time,placement=best_fit").is_oracle


@pytest.mark.parametrize(
    "text",
    [
        "fifo",
        "backfill:max_job_test=7,window_s=3600",
        "sjf_bco:kappa=2,lam=1.5",
        "qssf:lam=inf",
        "tiresias_las:order=submit,thresholds=3600,starve_factor=10,running_first=false",
        "qssf_preemptive:margin=2,min_run_s=60",
        "tiresias_consolidated:kappa=4",
        "deepshare:ratio=0.5,mode=preempt",
        "srtf_oracle:lam=2",
    ],
)
def test_a_named_heuristic_reads_back_as_the_composition_it_is_built_of(text: str) -> None:
    """A named heuristic is built from its parts directly; ``ComposeSpec.of`` renders it, and
    the rendering builds the same parts (the order's ``who`` aside: the heuristic's name in
    its missing-prediction error)."""
    built = PolicySpec.parse(text).build()
    assert isinstance(built, Composed)
    spec = ComposeSpec.of(built)
    again = ComposeSpec.parse(spec.describe()).build()
    assert ComposeSpec.of(again) == spec
    assert (again.placement, again.preemption, again.admission) == (
        built.placement,
        built.preemption,
        built.admission,
    )
    assert type(again.order) is type(built.order)


# ----------------------------------------------------------------------------- the parts


def test_predicted_remaining_is_median_then_p90_then_as_long_again() -> None:
    job = Job(1, 0.0, 2, 1e5, pred_s=1000.0, pred_hi_s=3000.0)
    assert predicted_remaining_s(job, 2 * 400.0) == 600.0  # median less what it ran
    assert predicted_remaining_s(job, 2 * 2000.0) == 1000.0  # past the median: p90
    assert predicted_remaining_s(job, 2 * 5000.0) == 5000.0  # past p90: as long again


def test_least_contention_keeps_a_ring_off_links_other_rings_use() -> None:
    topo = from_spec("4x4,leaf=2")  # nodes 0,1 under leaf 0; 2,3 under leaf 1
    # a ring across the leaves holds 2 GPUs on nodes 0 and 2: their NICs and both uplinks
    running = [_running(_job(1, 4, profile="bert"), [(0, 2), (2, 2)], ran_s=10.0)]
    state = _state(topo, running, [_job(2, 4)])
    flows = [0] * len(topo.links)
    for link in topo.ring_links((0, 2)):
        flows[link] += 1
    from dataclasses import replace

    state = replace(state, link_flows=tuple(flows))
    policy = ComposeSpec.parse("compose:order=submit,placement=least_contention").build()
    start = policy.decide(state).starts[0]
    assert start.placement.nodes in ((1,), (3,))  # a whole free node: no link shared


# ----------------------------------------------------------------------------- qssf_preemptive


def test_qssf_preemptive_preempts_a_long_job_for_a_short_one() -> None:
    topo = from_spec("1x8")
    long_job = _running(_job(1, 8, pred=100_000.0), [(0, 8)], ran_s=1000.0)
    d = heur.qssf_preemptive().decide(_state(topo, [long_job], [_job(2, 8, pred=1000.0)]))
    assert d.preempt == (1,)
    assert [(s.job_id, s.placement.alloc) for s in d.starts] == [(2, ((0, 8),))]


def test_qssf_preemptive_never_preempts_within_the_minimum_run_time() -> None:
    topo = from_spec("1x8")
    for ran in (10.0, 599.0):
        recent = _running(_job(1, 8, pred=100_000.0), [(0, 8)], ran_s=ran)
        assert (
            heur.qssf_preemptive(min_run_s=600.0)
            .decide(_state(topo, [recent], [_job(2, 8, pred=1000.0)]))
            .is_wait
        )
    old = _running(_job(1, 8, pred=100_000.0), [(0, 8)], ran_s=601.0)
    assert heur.qssf_preemptive(min_run_s=600.0).decide(
        _state(topo, [old], [_job(2, 8, pred=1000.0)])
    ).preempt == (1,)


def test_qssf_preemptive_preempts_only_when_beaten_by_the_margin() -> None:
    topo = from_spec("1x8")
    # the running job is predicted to need 8 x 99000 GPU-s more; the pending one 8 x 70000
    running = _running(_job(1, 8, pred=100_000.0), [(0, 8)], ran_s=1000.0)
    state = _state(topo, [running], [_job(2, 8, pred=70_000.0)])
    assert heur.qssf_preemptive(margin=1.5).decide(state).is_wait  # 70000 x 1.5 > 99000
    assert heur.qssf_preemptive(margin=1.0).decide(state).preempt == (1,)
    state = _state(topo, [running], [_job(2, 8, pred=60_000.0)])
    assert heur.qssf_preemptive(margin=1.5).decide(state).preempt == (1,)  # 60000 x 1.5 < 99000


def test_qssf_preemptive_needs_predictions() -> None:
    topo = from_spec("1x8")
    with pytest.raises(MissingPredictions, match=r"qssf_preemptive.*--history"):
        heur.qssf_preemptive().decide(_state(topo, [], [_job(2, 8)]))


def test_qssf_preemptive_undoes_a_preemption_that_frees_nothing_used() -> None:
    # the short pending job needs a whole node (lam=1 never splits it); preempting the two
    # 4-GPU jobs on different nodes would free 8 GPUs but no whole node for it
    topo = from_spec("2x8")
    running = [
        _running(_job(1, 4, pred=1e6), [(0, 4)], ran_s=1000.0),
        _running(_job(3, 4, pred=1e6), [(1, 4)], ran_s=1000.0),
        _running(_job(4, 4, pred=1.0), [(0, 4)], ran_s=1000.0),
        _running(_job(5, 4, pred=1.0), [(1, 4)], ran_s=1000.0),
    ]
    d = heur.qssf_preemptive(margin=1.0).decide(_state(topo, running, [_job(2, 8, pred=10.0)]))
    assert d.is_wait


# ----------------------------------------------------------------------------- tiresias


def test_tiresias_consolidated_does_not_split_where_tiresias_las_does() -> None:
    topo = from_spec("2x8")
    running = [
        _running(_job(1, 4), [(0, 4)], ran_s=1e4),
        _running(_job(3, 4), [(1, 4)], ran_s=1e4),
    ]
    state = _state(topo, running, [_job(2, 8)])
    split = heur.tiresias_las().decide(state)
    assert [s.placement.num_nodes for s in split.starts] == [2]
    assert heur.tiresias_consolidated().decide(state).is_wait  # it waits for a whole node


def test_tiresias_consolidated_never_preempts_within_the_minimum_run_time() -> None:
    topo = from_spec("1x8")
    pending = [_job(2, 8)]  # queue 0 (no service yet)
    recent = _running(_job(1, 8), [(0, 8)], ran_s=100.0)  # 800 GPU-s... in queue 0 too
    heavy = _running(_job(1, 8), [(0, 8)], ran_s=100.0, attained=1e6)  # queue 2, recent
    assert heur.tiresias_las().decide(_state(topo, [heavy], pending)).preempt == (1,)
    assert (
        heur.tiresias_consolidated(min_run_s=600.0).decide(_state(topo, [heavy], pending)).is_wait
    )
    assert (
        heur.tiresias_consolidated(min_run_s=600.0).decide(_state(topo, [recent], pending)).is_wait
    )
    old = _running(_job(1, 8), [(0, 8)], ran_s=700.0, attained=1e6)
    d = heur.tiresias_consolidated(min_run_s=600.0).decide(_state(topo, [old], pending))
    assert d.preempt == (1,) and [s.job_id for s in d.starts] == [2]


# ----------------------------------------------------------------------------- deepshare


@dataclass(frozen=True)
class _Rates:
    """A fast stand-in contention model: a fixed rate per job id (1.0 otherwise). The real
    model's migrations are checked in ``test_deepshare_migrates_in_the_simulator``."""

    by_job: dict[int, float]
    name: str = "fixed"

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        return [self.by_job.get(j.job_id, 1.0) for j, _ in placed]

    def best_time(self, topo: Topology, job: Job) -> float:
        return 1.0


def _split_state(*, ran_s: float = 1e4, node2_used: int = 0) -> ClusterState:
    topo = from_spec("3x8")
    running = [
        _running(_job(1, 8), [(0, 4), (1, 4)], ran_s=ran_s),  # split over nodes 0 and 1
        _running(_job(3, 4), [(0, 4)], ran_s=1e4),
        _running(_job(4, 4), [(1, 4)], ran_s=1e4),
    ]
    if node2_used:
        running.append(_running(_job(5, node2_used), [(2, node2_used)], ran_s=1e4))
    return _state(topo, running, [])


def test_deepshare_migrates_a_slow_split_job_to_a_free_whole_node() -> None:
    d = heur.deepshare(model=_Rates({1: 0.5})).decide(_split_state())
    assert [(m.job_id, m.placement.alloc) for m in d.migrate] == [(1, ((2, 8),))]
    assert not d.preempt and not d.starts
    assert heur.deepshare(model=_Rates({1: 0.6})).decide(_split_state()).migrate  # ratio <= 0.6


def test_deepshare_leaves_a_job_that_is_fast_enough_recent_or_without_a_free_node() -> None:
    assert heur.deepshare(model=_Rates({1: 0.7})).decide(_split_state()).is_wait
    assert heur.deepshare(model=_Rates({1: 0.5})).decide(_split_state(node2_used=1)).is_wait
    recent = _split_state(ran_s=100.0)
    assert heur.deepshare(model=_Rates({1: 0.5}), min_run_s=600.0).decide(recent).is_wait
    # an unsplit job is never moved, however slow
    assert heur.deepshare(model=_Rates({3: 0.1, 4: 0.1})).decide(_split_state()).is_wait


def test_deepshare_preempt_mode_preempts_instead() -> None:
    d = heur.deepshare(model=_Rates({1: 0.5}), mode="preempt").decide(_split_state())
    assert d.preempt == (1,) and not d.migrate


def test_deepshare_starts_pending_jobs_on_what_the_move_leaves() -> None:
    state = _split_state()
    from dataclasses import replace

    state = replace(state, pending=(PendingJob(_job(9, 8), remaining_s=1e5),))
    d = heur.deepshare(model=_Rates({1: 0.5})).decide(state)
    assert [m.job_id for m in d.migrate] == [1] and not d.starts  # node 2 went to the move


# ----------------------------------------------------------------------------- linkwise policies


def test_policies_json_lists_every_policy_with_its_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert set(POLICIES) <= set(by_name)
    for r in rows:
        assert {"name", "kind", "preemptive", "migrates", "oracle", "needs_predictions"} <= set(r)
        assert r["kind"] in ("heuristic", "search", "learned")
    assert (
        by_name["qssf_preemptive"]["preemptive"] and by_name["qssf_preemptive"]["needs_predictions"]
    )
    assert by_name["deepshare"]["migrates"] and not by_name["deepshare"]["oracle"]
    assert by_name["srtf_oracle"]["oracle"] and not by_name["qssf"]["preemptive"]
    assert any(r["kind"] == "learned" for r in rows)
    assert main(["policies"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["name", "kind", "preemptive"]
    assert main(["policies", "compose:order=nope,placement=bounded"]) == 2
    assert "known: submit" in capsys.readouterr().err


def test_deepshare_predicts_the_ratio_with_the_real_contention_model() -> None:
    # an FSDP ring split over two nodes next to two more FSDP rings: the shipped calibration
    # predicts it well under 0.6 of its isolated throughput; a whole node is free
    topo = from_spec("4x8")
    running = [
        _running(_job(1, 8, profile="FSDP"), [(0, 4), (1, 4)], ran_s=1e4),
        _running(_job(3, 8, profile="FSDP"), [(0, 4), (2, 4)], ran_s=1e4),
        _running(_job(4, 8, profile="FSDP"), [(1, 4), (2, 4)], ran_s=1e4),
    ]
    d = heur.deepshare(min_run_s=0.0).decide(_state(topo, running, []))
    assert [m.placement.alloc for m in d.migrate] == [((3, 8),)]
    # a light ring (MobileNetV3) loses little: left where it is
    light = [
        _running(_job(i, 8, profile="MobileNetV3"), r.placement.alloc, ran_s=1e4)
        for i, r in zip((1, 3, 4), running, strict=True)
    ]
    assert heur.deepshare(min_run_s=0.0).decide(_state(topo, light, [])).is_wait
