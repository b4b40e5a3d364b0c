"""The simulator's split-job rates kept incrementally (``contention.SplitRates``) are, bit for
bit, the rates ``AnalyticModel.rates`` gives all split jobs at once: at every event of seeded
simulations with preemption, migration and reserved restarts, in both sharing modes, and
over whole simulations; a stale load or a forgotten neighbour is caught."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from linkwise.cluster.contention import (
    AnalyticModel,
    NoContention,
    SplitRates,
    incremental_rates,
    link_flows,
)
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Start, Topology
from linkwise.cluster.fork import fork
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator import engine as simulator_module
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec

CAL = load_calibration(None)
PROFILES = sorted(CAL.profiles)
TOPO = from_spec("16x8,leaf=4,agg=2,oversub=2")  # NICs, leaf and aggregation uplinks
MODELS = {mode: AnalyticModel(CAL, sharing=mode) for mode in ("duty", "flows")}
CONFIGS = {
    "grace": SimConfig(tick_s=900.0),  # Sia's restore costs and a 30 s grace
    "free": SimConfig(tick_s=900.0, restart=RestartModel.free()),  # restarts at once
}


def _jobs(seed: int, n: int = 70) -> list[Job]:
    rnd = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rnd.expovariate(1 / 400.0)
        gpus = rnd.choice((1, 2, 2, 4, 4, 8, 12, 16, 24))
        jobs.append(Job(i, t, gpus, rnd.uniform(300.0, 9000.0), rnd.choice(PROFILES)))
    return jobs


def _take(rnd: random.Random, avail: list[int], gpus: int) -> Placement | None:
    """A random placement of ``gpus`` on ``avail`` (taken from it), spread or packed."""
    if gpus > sum(avail):
        return None
    nodes = [n for n, f in enumerate(avail) if f]
    rnd.shuffle(nodes)
    if rnd.random() < 0.3:
        nodes.sort(key=lambda n: -avail[n])
    per = rnd.choice((1, 2, 4, 8))
    alloc: dict[int, int] = {}
    need = gpus
    while need:
        for n in nodes:
            take = min(avail[n] - alloc.get(n, 0), need, per)
            if take > 0:
                alloc[n] = alloc.get(n, 0) + take
                need -= take
            if not need:
                break
    for n, g in alloc.items():
        avail[n] -= g
    return Placement.of(list(alloc.items()))


@dataclass
class Chaos:
    """A seeded policy that starts jobs on random spread placements, preempts and migrates
    at random, and starts on GPUs of the jobs it preempts (reserved restarts)."""

    seed: int
    p_preempt: float = 0.08
    p_migrate: float = 0.1
    name: str = "chaos"
    rnd: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rnd = random.Random(self.seed)

    def decide(self, state: ClusterState) -> Decision:
        rnd = self.rnd
        free = list(state.free_gpus)
        running = list(state.running)
        rnd.shuffle(running)
        preempt: list[int] = []
        migrate: list[Start] = []
        claimable = [0] * len(free)
        for r in running:
            u = rnd.random()
            if u < self.p_preempt:
                preempt.append(r.job.job_id)
                for n, g in r.placement.alloc:
                    claimable[n] += g
            elif u < self.p_preempt + self.p_migrate:
                avail = list(free)
                for n, g in r.placement.alloc:
                    avail[n] += g
                target = _take(rnd, avail, r.job.num_gpus)
                if target is not None and target != r.placement:
                    migrate.append(Start(r.job.job_id, target))
                    for n, g in target.alloc:  # free GPUs are taken first
                        free[n] -= min(free[n], g)
        avail = [f + c for f, c in zip(free, claimable, strict=True)]
        starts = []
        for p in state.pending:
            placement = _take(rnd, avail, p.job.num_gpus)
            if placement is not None:
                starts.append(Start(p.job.job_id, placement))
        return Decision(tuple(starts), tuple(preempt), migrate=tuple(migrate))


def _split(sim: Simulator) -> list[Any]:
    return [r for r in sim._running.values() if r.split]


def _mismatches(sim: Simulator) -> int:
    """Split runs whose rate is not what ``model.rates`` gives now for all of them, plus one
    if the link flows differ from ``link_flows``."""
    split = _split(sim)
    bad = int(sim._flows != tuple(link_flows(sim.topology, [r.placement for r in split])))
    if split:
        want = sim.model.rates(sim.topology, [(r.job, r.placement) for r in split])
        bad += sum(r.rate != w for r, w in zip(split, want, strict=True))
    return bad


def _run_checked(
    model: AnalyticModel,
    config: SimConfig,
    seed: int,
    *,
    incremental: bool = True,
    until_wrong: bool = False,
) -> tuple[Simulator, int, int]:
    """A whole simulation (``until_wrong``: up to the first mismatch), checked after every
    apply and advance: (the simulator, checks with split jobs running, mismatches)."""
    sim = Simulator(TOPO, _jobs(seed), model, config, incremental=incremental)
    policy = Chaos(seed)
    checks = bad = 0
    while not (until_wrong and bad) and sim.events < 20_000:
        sim.apply(policy.decide(sim.observe()))
        checks += bool(_split(sim))
        bad += _mismatches(sim)
        if not sim.advance():
            assert sim.done
            break
        checks += bool(_split(sim))
        bad += _mismatches(sim)
    return sim, checks, bad


@pytest.mark.parametrize("mode", sorted(MODELS))
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2])
def test_rates_equal_a_full_recomputation_at_every_event(mode: str, cfg: str, seed: int) -> None:
    sim, checks, bad = _run_checked(MODELS[mode], CONFIGS[cfg], seed)
    assert sim.done
    assert sim._split_rates is not None and sim._incremental  # the incremental path ran
    assert checks > 100 and bad == 0
    records = sim.records
    assert sum(r.preemptions for r in records) > 5 and sum(r.migrations for r in records) > 5
    assert sum(r.nodes > 1 for r in records) > len(records) // 3


@pytest.mark.parametrize("mode", sorted(MODELS))
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_whole_simulations_equal_the_full_path(mode: str, cfg: str) -> None:
    """Lockstep: the same states at every decision point and the same records."""
    model, config = MODELS[mode], CONFIGS[cfg]
    for seed in (3, 4):
        fast = Simulator(TOPO, _jobs(seed), model, config)
        full = Simulator(TOPO, _jobs(seed), model, config, incremental=False)
        pf, pl = Chaos(seed), Chaos(seed)
        points = 0
        while True:
            a, b = fast.observe(), full.observe()
            assert (a.time, a.running, a.pending) == (b.time, b.running, b.pending)
            assert (a.transit, a.free_gpus, a.link_flows) == (b.transit, b.free_gpus, b.link_flows)
            fast.apply(pf.decide(a))
            full.apply(pl.decide(b))
            points += 1
            more = fast.advance()
            assert more == full.advance()
            if not more:
                break
        assert fast.records == full.records and fast.events == full.events
        assert points > 100 and full._split_rates is None


class _StaleOnRemoval(SplitRates[Any]):
    """Broken: a link a ring leaves keeps its load."""

    def remove(self, mid: int) -> None:
        super().remove(mid)
        self._refold.clear()


class _OnlyNewcomers(SplitRates[Any]):
    """Broken: only the rings added are timed, never their neighbours."""

    def changed(self) -> list[tuple[Any, float]]:
        self._before = {}
        return super().changed()


class _NoBottleneckCheck(SplitRates[Any]):
    """Broken: a neighbour is timed again only where its share falls below its bottleneck
    (a bottleneck link that got lighter is missed)."""

    def changed(self) -> list[tuple[Any, float]]:
        for m in self._members.values():
            m.shares = {link: float("inf") for link in m.shares}
        return super().changed()


@pytest.mark.parametrize("broken", [_StaleOnRemoval, _OnlyNewcomers, _NoBottleneckCheck])
def test_a_broken_bookkeeping_is_caught(broken: type, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator_module, "SplitRates", broken)
    sim, _, bad = _run_checked(MODELS["duty"], CONFIGS["grace"], 1, until_wrong=True)
    assert isinstance(sim._split_rates, broken) and bad > 0


def test_the_full_path_passes_the_same_check() -> None:
    sim, checks, bad = _run_checked(MODELS["flows"], CONFIGS["free"], 1, incremental=False)
    assert checks > 100 and bad == 0 and sim._split_rates is None


def _random_ring(rnd: random.Random, topo: Topology) -> tuple[Job, Placement]:
    gpus = rnd.choice((1, 2, 4, 8, 16))
    job = Job(rnd.randrange(10**6), 0.0, gpus, 100.0, rnd.choice(PROFILES))
    if gpus == 1:  # a split job without a ring: one GPU and an empty node in its placement
        a, b = sorted(rnd.sample(range(len(topo.nodes)), 2))
        return job, Placement(((a, 1), (b, 0)) if rnd.random() < 0.5 else ((a, 0), (b, 1)))
    nodes = sorted(rnd.sample(range(len(topo.nodes)), rnd.choice((2, 2, 4, 8))))
    alloc = [[n, 0] for n in nodes]
    for i in range(gpus):
        alloc[i % len(alloc)][1] += 1
    return job, Placement(tuple((n, g) for n, g in alloc))


def _check_members(model: AnalyticModel, topo: Topology, seed: int, steps: int = 300) -> int:
    """Random additions and removals straight on a ``SplitRates``: after each batch, the
    rates known (the last given per member) equal ``model.rates`` over the members in the
    order added. Returns how many times a member's rate was kept rather than given."""
    rnd = random.Random(seed)
    rates: SplitRates[int] = SplitRates(model, topo)
    members: dict[int, tuple[int, Job, Placement]] = {}  # payload -> member id, job, placement
    known: dict[int, float] = {}
    serial = kept = 0
    for _ in range(steps):
        for _ in range(rnd.choice((1, 1, 2, 3))):
            if members and rnd.random() < 0.45:
                payload = rnd.choice(list(members))
                rates.remove(members.pop(payload)[0])
                known.pop(payload, None)
            else:
                job, placement = _random_ring(rnd, topo)
                serial += 1
                mid = rates.add(serial, job, placement)
                assert mid is not None
                members[serial] = (mid, job, placement)
        got = rates.changed()
        assert [p for p, _ in got] == [p for p in members if p in dict(got)]  # member order
        kept += len(members) - len(got)
        known.update(got)
        placed = [(job, placement) for _, job, placement in members.values()]
        want = model.rates(topo, placed) if placed else []
        assert [known[p] for p in members] == want
        assert rates.flows == tuple(link_flows(topo, [p for _, p in placed]))
        assert len(rates) == len(members)
    return kept


@pytest.mark.parametrize("mode", sorted(MODELS))
def test_split_rates_equal_model_rates_after_every_change(mode: str) -> None:
    for seed in range(3):
        kept = _check_members(MODELS[mode], TOPO, seed)
        assert kept > 1000  # most neighbours' bottlenecks did not move


def test_without_alpha_nonnegative_every_neighbour_on_a_changed_link_is_timed() -> None:
    """The shortcut for lighter links needs alpha >= 0 (which ``Calibration`` demands);
    forced negative, the rates are still exact."""
    cal = replace(CAL)
    object.__setattr__(cal, "alpha", -0.4)
    for mode in ("duty", "flows"):
        _check_members(AnalyticModel(cal, sharing=mode), TOPO, 7, steps=150)


def test_a_placement_over_a_node_twice_falls_back_to_the_full_path() -> None:
    jobs = [Job(0, 0.0, 4, 1000.0, PROFILES[0]), Job(1, 0.0, 4, 800.0, PROFILES[1])]
    twice = Placement(((0, 2), (0, 2)))

    def run(incremental: bool) -> Simulator:
        sim = Simulator(TOPO, jobs, MODELS["duty"], CONFIGS["grace"], incremental=incremental)
        sim.apply(Decision((Start(0, Placement(((0, 2), (4, 2)))), Start(1, twice))))
        assert _mismatches(sim) == 0
        while sim.advance():
            assert _mismatches(sim) == 0
        return sim

    fast, full = run(True), run(False)
    assert not fast._incremental and fast._split_rates is None
    assert fast.records == full.records


def test_models_other_than_the_analytic_one_keep_the_full_path() -> None:
    assert incremental_rates(MODELS["duty"]) and incremental_rates(MODELS["flows"])
    assert not incremental_rates(NoContention())

    class Tweaked(AnalyticModel):
        def rates(self, topo: Topology, placed: Any) -> list[float]:
            return [0.5 * r for r in super().rates(topo, placed)]

    assert not incremental_rates(Tweaked(CAL))
    assert not Simulator(TOPO, _jobs(0, 3), Tweaked(CAL))._incremental


def test_a_fork_registers_the_split_jobs_it_puts_in_place() -> None:
    """``cluster.fork`` fills ``_running`` itself, then asks for the rates: the forked
    simulator's rates are the full ones at every event to its end."""
    model, config = MODELS["duty"], CONFIGS["grace"]
    sim = Simulator(TOPO, _jobs(5), model, config)
    policy = Chaos(5)
    forks = 0
    while sim.advance():
        state = sim.observe()
        sim.apply(policy.decide(state))
        if sum(r.placement.num_nodes > 1 for r in state.running) >= 3 and forks < 3:
            forks += 1
            child = fork(state, model, config, seed=forks, oracle=True)
            assert child._split_rates is not None and _mismatches(child) == 0
            child_policy = Chaos(forks)
            while True:
                child.apply(child_policy.decide(child.observe()))
                assert _mismatches(child) == 0
                if not child.advance():
                    break
                assert _mismatches(child) == 0
    assert forks == 3
