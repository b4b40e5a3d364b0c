"""The lookahead search policy (``policies.lookahead``): its spec, its listing as a search
policy, an obviously better move picked, the base kept on ties, and no true run time read."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from linkwise.cli import main
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.fork import RunTimeBelief
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies.catalog import policy_info
from linkwise.policies.heuristics import make_policy
from linkwise.policies.lookahead import (
    DEFAULT_ALTERNATIVES,
    DEFAULT_HOLD_S,
    Lookahead,
    LookaheadSpec,
    decision_key,
)
from linkwise.policies.spec import PolicySpec, split_specs

MODEL = AnalyticModel(load_calibration(None))


def _job(i: int, gpus: int, pred: float, dur: float = 50.0) -> Job:
    return Job(i, 0.0, gpus, dur, profile="bert", pred_s=pred, pred_hi_s=1.5 * pred)


def _queue(durations: tuple[float, ...] = (50.0,) * 5) -> ClusterState:
    """One 8-GPU node; the oldest job takes all of it for about 10 h, four 2-GPU jobs of
    about 30 min wait behind it."""
    jobs = [_job(1, 8, 36000.0, durations[0])]
    jobs += [_job(2 + i, 2, 1800.0, durations[1 + i]) for i in range(4)]
    return ClusterState(
        time=0.0,
        topology=from_spec("1x8"),
        free_gpus=(8,),
        running=(),
        pending=tuple(PendingJob(j, remaining_s=j.duration) for j in jobs),
    )


def _lookahead(text: str):  # type: ignore[no-untyped-def]
    return PolicySpec.parse(text).build(MODEL)


def test_spec_parses_describes_and_refuses() -> None:
    spec = LookaheadSpec.parse("lookahead:base=sjf_bco:lam=2,horizon=90m,n=3,alts=qssf;fifo")
    assert spec.base == "sjf_bco:lam=2"
    assert spec.horizon_s == 5400.0 and spec.n == 3
    assert spec.alternatives == ("qssf", "fifo")
    assert LookaheadSpec.parse(spec.describe()) == spec
    default = LookaheadSpec.parse("lookahead:base=qssf")
    assert default.horizon_s == 6 * 3600 and default.n == 6
    assert default.alternatives == DEFAULT_ALTERNATIVES
    composed = LookaheadSpec.parse(
        "lookahead:base=compose:order=pred_gpu_time,placement=bounded,n=2"
    )
    assert composed.base == "compose:order=pred_gpu_time,placement=bounded"
    for bad in (
        "lookahead:horizon=6h",
        "lookahead:base=qssf,n=0",
        "lookahead:base=qssf,horizon=-1h",
        "lookahead:base=nosuch",
        "lookahead:base=qssf,alts=qssf;nosuch",
        "lookahead:base=lookahead:base=qssf",
        "lookahead:base=qssf,oracle=maybe",
    ):
        with pytest.raises(ValueError):
            PolicySpec.parse(bad)
    assert split_specs("qssf,lookahead:base=qssf,horizon=2h,n=2,sjf_bco") == [
        "qssf",
        "lookahead:base=qssf,horizon=2h,n=2",
        "sjf_bco",
    ]


def test_listed_as_search_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    search = [r for r in rows if r["kind"] == "search"]
    assert len(search) == 1 and search[0]["name"].startswith("lookahead:")
    assert search[0]["needs_predictions"] and not search[0]["oracle"]
    spec = "lookahead:base=qssf,n=2,oracle=true"
    assert PolicySpec.parse(spec).is_oracle
    assert PolicySpec.parse("lookahead:base=sjf_bco").needs_predictions
    assert not PolicySpec.parse("lookahead:base=qssf").is_oracle
    info = policy_info(PolicySpec.parse("lookahead:base=fifo,alts=tiresias_las"))
    assert info.kind == "search" and info.preemptive


def test_picks_an_obviously_better_alternative() -> None:
    state = _queue()
    fifo = make_policy("fifo").decide(state)
    assert [s.job_id for s in fifo.starts] == [1]  # FIFO starts the long job
    la = _lookahead("lookahead:base=fifo,horizon=12h,n=2,alts=qssf")
    d = la.decide(state)
    assert sorted(s.job_id for s in d.starts) == [2, 3, 4, 5]  # QSSF's four short ones
    assert la.stats()["deviations_per_1000"] == 1000.0
    assert la.stats()["decision_ms"] > 0


def test_keeps_the_base_when_no_alternative_is_better() -> None:
    state = _queue()
    la = _lookahead("lookahead:base=qssf,horizon=12h,n=2,alts=fifo")
    d = la.decide(state)
    assert decision_key(d) == decision_key(make_policy("qssf").decide(state))
    assert la.deviations == 0 and la.searched == 1
    # identical proposals: no search at all
    same = _lookahead("lookahead:base=qssf,n=2,alts=qssf,wait=false")
    same.decide(state)
    assert same.searched == 0


def test_decisions_ignore_true_run_times() -> None:
    state = _queue()
    twin = _queue((1e6, 1.0, 2.0, 3e5, 4.0))
    twin = replace(
        twin, pending=tuple(replace(p, remaining_s=p.remaining_s * 3) for p in twin.pending)
    )
    a = _lookahead("lookahead:base=fifo,horizon=12h,n=3,alts=qssf;sjf_bco").decide(state)
    b = _lookahead("lookahead:base=fifo,horizon=12h,n=3,alts=qssf;sjf_bco").decide(twin)
    assert decision_key(a) == decision_key(b)


def test_runs_a_workload_and_is_no_worse_here() -> None:
    from linkwise.datasets import synthetic
    from linkwise.datasets.predictor import RuntimePredictor

    topo = from_spec("2x8")
    history = synthetic.generate(100, seed=1, max_gpus=topo.total_gpus)
    drawn = synthetic.generate(25, seed=0, max_gpus=topo.total_gpus, load_scale=6.0)
    jobs = tuple(replace(j, profile="bert") for j in RuntimePredictor.fit(history).annotate(drawn))
    la = _lookahead("lookahead:base=fifo,horizon=3h,n=2,alts=qssf")
    res = simulate(topo, jobs, MODEL, la)
    base = simulate(topo, jobs, MODEL, make_policy("fifo"))
    assert len(res.records) == len(jobs)
    avg = sum(r.jct for r in res.records) / len(jobs)
    avg_base = sum(r.jct for r in base.records) / len(jobs)
    assert la.searched > 0
    assert avg <= avg_base * 1.05


def _split_contention_state() -> ClusterState:
    """4x8 in two leaves, oversubscribed: a split 8-GPU job with 10 min of work left (as
    believed) crosses the spine; a 16-GPU job of 40 h is pending and fits now on the 24
    idle GPUs, its placement crossing the spine too (it slows the short job a little)."""
    short = Job(1, 0.0, 8, 99.0, profile="bert", pred_s=4200.0, pred_hi_s=4200.0)
    long = Job(2, 0.0, 16, 99.0, profile="bert", pred_s=40 * 3600.0, pred_hi_s=40 * 3600.0)
    run = RunningJob(
        job=short,
        placement=Placement.of([(0, 4), (2, 4)]),
        start_time=-3600.0,
        remaining_s=600.0,
        rate=1.0,
        attained_gpu_s=8 * 3600.0,
        preemptions=0,
        since=0.0,
    )
    return ClusterState(
        time=0.0,
        topology=from_spec("4x8,leaf=2,oversub=2"),
        free_gpus=(4, 8, 4, 8),
        running=(run,),
        pending=(PendingJob(long, remaining_s=99.0),),
    )


def _narrow(text: str) -> Lookahead:
    """The lookahead of ``text`` with run times believed exactly (a deterministic case)."""
    la = _lookahead(text)
    assert isinstance(la, Lookahead)
    return replace(la, belief=RunTimeBelief(min_sigma=1e-9))


def test_the_old_wait_pricing_idles_gpus_and_the_terminal_cost_does_not() -> None:
    state = _split_contention_state()
    start = make_policy("fifo").decide(state)
    assert [s.job_id for s in start.starts] == [2]
    # before: a 3-hour horizon sees only the short job slowed by the long one's start, so
    # the lookahead leaves 24 GPUs idle (the long job's progress lies past the horizon)
    old = _narrow("lookahead:base=fifo,alts=fifo,horizon=3h,n=1,terminal=false,hold=0")
    assert old.decide(state).is_wait and old.deviations == 1
    # the default prices the work left at the horizon: the base's start stands
    for spec in ("lookahead:base=fifo,alts=fifo,horizon=3h,n=1", "lookahead:base=fifo,n=1"):
        new = _narrow(spec)
        assert decision_key(new.decide(state)) == decision_key(start)
        assert new.deviations == 0


def test_a_chosen_wait_holds_as_long_as_it_was_priced() -> None:
    state = _split_contention_state()
    la = _narrow("lookahead:base=fifo,alts=fifo,horizon=3h,n=1,terminal=false,hold=30m")
    assert la.decide(state).wake_at == 1800.0
    assert la.holds == 1 and la.searched == 1
    # the short job ends at 10 min: still held, no search, nothing started
    later = replace(state, time=600.0, running=(), free_gpus=(8, 8, 8, 8))
    assert la.decide(later).is_wait and la.searched == 1
    # at the hold's end the lookahead decides again (here: the base's start)
    end = replace(later, time=1800.0)
    assert [s.job_id for s in la.decide(end).starts] == [2] and la.searched == 2
    assert la.stats()["holds"] == 1.0


def test_without_the_wait_move_no_alternative_waits() -> None:
    # FIFO starts the long job; an alternative that proposes nothing is a wait: left out
    state = _split_contention_state()
    la = _narrow("lookahead:base=fifo,alts=fifo,horizon=3h,n=1,terminal=false,wait=false")
    assert not la.decide(state).is_wait and la.searched == 0


def test_terminal_and_hold_parse_and_describe() -> None:
    spec = LookaheadSpec.parse("lookahead:base=qssf,terminal=false,hold=10m")
    assert not spec.terminal and spec.hold_s == 600.0
    assert LookaheadSpec.parse(spec.describe()) == spec
    default = LookaheadSpec.parse("lookahead:base=qssf")
    assert default.terminal and default.hold_s == DEFAULT_HOLD_S
    assert LookaheadSpec.parse(default.describe()) == default
    zero = LookaheadSpec.parse("lookahead:base=qssf,hold=0")
    assert zero.hold_s == 0.0 and LookaheadSpec.parse(zero.describe()) == zero
    for bad in ("lookahead:base=qssf,hold=-1m", "lookahead:base=qssf,terminal=maybe"):
        with pytest.raises(ValueError):
            LookaheadSpec.parse(bad)
