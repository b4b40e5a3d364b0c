"""The ``Simulator``: a discrete-event cluster, one of the Backends a policy drives (the
package docstring says how it models time, contention and restarts)."""

from __future__ import annotations

import heapq
import math
import time as wallclock
from collections.abc import Iterable, Sequence

from linkwise.cluster.contention import (
    AnalyticModel,
    ContentionModel,
    SplitRates,
    incremental_rates,
    link_flows,
)
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Topology,
    TransitJob,
)
from linkwise.cluster.simulator.bookkeeping import Accrued, ResumedTransit, Run, Transit
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.errors import InvalidDecision, NoProgress, SimulationStalled
from linkwise.cluster.simulator.records import JobRecord
from linkwise.cluster.simulator.reservations import check_fits, reserve

_EPS = 1e-9


class Simulator:
    """Backend over a simulated cluster: ``observe``, ``apply``, ``advance``.

    ``running`` warm-starts it: jobs already running when the simulation begins, each on its
    placement, with ``Job.duration`` as the isolated work left. The clock starts at the
    earliest submit time among ``jobs`` and ``running``; the running jobs start then.

    Split jobs' rates come from ``SplitRates`` where the model allows it (the floats
    ``model.rates`` gives over all of them, recomputed only for rings whose bottleneck may
    have moved); ``incremental=False`` recomputes them all at every change (the reference,
    and the path for other models or a placement over a node twice). ``from_state`` resumes
    one in the middle of a run (``cluster.fork``).
    """

    def __init__(
        self,
        topology: Topology,
        jobs: Sequence[Job],
        model: ContentionModel,
        config: SimConfig | None = None,
        running: Sequence[tuple[Job, Placement]] = (),
        *,
        incremental: bool = True,
    ) -> None:
        self.topology = topology
        self.model = model
        self.config = config or SimConfig()
        too_big = [j.job_id for j in jobs if j.num_gpus > topology.total_gpus]
        if too_big:
            raise ValueError(
                f"{len(too_big)} jobs ask for more than the cluster's {topology.total_gpus} GPUs "
                f"(first: {too_big[:5]}); filter them before simulating"
            )
        ids = [j.job_id for j in jobs] + [j.job_id for j, _ in running]
        if len(set(ids)) != len(ids):
            raise ValueError("job ids must be unique")
        self._arrivals = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        self._next_arrival = 0
        starts = [j.submit_time for j, _ in running]
        if self._arrivals:
            starts.append(self._arrivals[0].submit_time)
        self.time = min(starts, default=0.0)
        self._free = [n.gpus for n in topology.nodes]
        self._pending: dict[int, PendingJob] = {}
        self._running: dict[int, Run] = {}
        self._heap: list[tuple[float, int, int]] = []  # (end, version, job_id)
        self._restart = self.config.restart
        self._transit: dict[int, Transit] = {}
        # (time, phase, seq, job_id): phase 0 a drain ends, phase 1 a reserved start
        self._transit_heap: list[tuple[float, int, int, int]] = []
        self._claimable = [0] * len(topology.nodes)  # draining GPUs not yet reserved
        self._transit_view: tuple[TransitJob, ...] = ()
        self._transit_dirty = False
        self._seq = 0
        self._acc: dict[int, Accrued] = {}
        self._records: list[JobRecord] = []
        self._next_tick = math.inf
        self._wake = math.inf  # the decision point a policy asked for (Decision.wake_at)
        self._events = 0
        self._quiet = 0  # events in a row, ticks aside, in which no job arrived or finished
        self._quiet_since = self.time
        self._state: ClusterState | None = None
        # the last state handed out with its running jobs' placements (``jobs_per_node`` is a
        # function of those and the topology alone: the next state on the same placement
        # objects shares it)
        self._busy_src: ClusterState | None = None
        self._pending_view: tuple[PendingJob, ...] = ()
        self._pending_dirty = False
        self._pending_unsorted = False
        self._running_view: tuple[RunningJob, ...] = ()
        self._running_dirty = False
        self._flows: tuple[int, ...] = tuple([0] * len(topology.links))
        # the split runs' rates, built at the first _update_split_rates (None until then, and
        # for good where ``_incremental`` is False)
        self._split_rates: SplitRates[Run] | None = None
        self._incremental = incremental and incremental_rates(model)
        self._wall_start = wallclock.perf_counter()
        self._admit_arrivals()
        if running:
            self._preload(running)

    @classmethod
    def from_state(
        cls,
        topology: Topology,
        model: ContentionModel,
        config: SimConfig | None = None,
        *,
        time: float,
        free_gpus: Sequence[int],
        pending: Sequence[PendingJob] = (),
        running: Sequence[RunningJob] = (),
        transit: Sequence[ResumedTransit] = (),
        arrivals: Sequence[Job] = (),
        incremental: bool = True,
    ) -> Simulator:
        """A simulator resumed at ``time`` in the middle of a run: ``free_gpus`` per node;
        ``pending`` jobs in that order; ``running`` jobs on their placements, progress as of
        their ``since``, brought up to ``time`` at their ``rate`` (``remaining_s`` without a
        restore charge; a single-node job keeps its ``rate``, split jobs' rates come from the
        model); ``transit`` jobs, added in
        that order; ``arrivals`` to come after ``time``. Nothing is checked: the values
        describe a cluster the caller has seen (``ClusterState``)."""
        sim = cls(topology, (), model, config, incremental=incremental)
        sim.time = time
        sim._quiet_since = time
        sim._arrivals = sorted(arrivals, key=lambda j: (j.submit_time, j.job_id))
        sim._free = list(free_gpus)
        for pj in pending:
            sim._pending[pj.job.job_id] = pj
            sim._acc[pj.job.job_id] = Accrued()
        sim._pending_dirty = True
        for run in running:
            sim._resume_running(run)
        for tr in transit:
            sim._resume_transit(tr)
        if sim._pending:
            sim._schedule_tick()
        sim._update_split_rates()
        sim._state = None
        return sim

    # -- Backend ---------------------------------------------------------------------

    def observe(self) -> ClusterState:
        """The cluster as a policy sees it now."""
        if self._state is None:
            if self._pending_unsorted:
                self._pending = dict(
                    sorted(self._pending.items(), key=lambda kv: (kv[1].job.submit_time, kv[0]))
                )
                self._pending_unsorted = False
            if self._pending_dirty:
                self._pending_view = tuple(self._pending.values())
                self._pending_dirty = False
            if self._running_dirty:
                self._running_view = tuple([r.view or r.snapshot() for r in self._running.values()])
                self._running_dirty = False
            if self._transit_dirty:
                self._transit_view = tuple([t.snapshot() for t in self._transit.values()])
                self._transit_dirty = False
            state = ClusterState(
                time=self.time,
                topology=self.topology,
                free_gpus=tuple(self._free),
                running=self._running_view,
                pending=self._pending_view,
                link_flows=self._flows,
                transit=self._transit_view,
            )
            src = self._busy_src
            known = src.__dict__.get("jobs_per_node") if src is not None else None
            if known is not None and src is not None and _same_placements(src, state):
                # the same placements: the cached property's value, not recounted
                object.__setattr__(state, "jobs_per_node", known)
            else:
                self._busy_src = state
            self._state = state
        return self._state

    def apply(self, decision: Decision) -> None:
        """Preempt, migrate, then start, as the decision says; raise InvalidDecision if
        impossible (nothing of an invalid preemption or migration is applied; starts are
        applied one by one)."""
        # each decision says when its policy wants the next one (inf: at the next event)
        self._wake = decision.wake_at if decision.wake_at > self.time else math.inf
        if decision.is_wait:
            return
        split_changed = False
        self._state = None
        for job_id in decision.preempt:
            split_changed |= self._preempt(job_id)
        for move in decision.migrate:
            split_changed |= self._migrate(move.job_id, move.placement)
        for start in decision.starts:
            split_changed |= self._start(start.job_id, start.placement)
        split_changed |= self._transit_due()
        if split_changed:
            self._update_split_rates()
        self._state = None

    def advance(self) -> bool:
        """Move to the next event time and process everything due then; False when done."""
        next_end = self._peek_completion()
        next_arrival = (
            self._arrivals[self._next_arrival].submit_time
            if self._next_arrival < len(self._arrivals)
            else math.inf
        )
        t = min(
            next_end,
            next_arrival,
            self._transit_heap[0][0] if self._transit_heap else math.inf,
            self._next_tick if self._pending else math.inf,
            self._wake if self._running or self._pending or self._transit else math.inf,
        )
        if t == math.inf:
            if self._pending:
                stuck = list(self._pending)[:5]
                raise SimulationStalled(
                    f"{len(self._pending)} jobs pending (first: {stuck}) on an idle cluster with "
                    "nothing left to arrive: the policy never starts them"
                )
            return False
        self.time = max(self.time, t)
        if self._wake <= self.time + _EPS:
            self._wake = math.inf
        self._events += 1
        seen = (len(self._records), self._next_arrival)
        split_changed = self._complete_due()
        if self._transit_heap:
            split_changed |= self._transit_due()
        self._admit_arrivals()
        ticked = self._next_tick <= self.time + _EPS
        if ticked:
            self._schedule_tick()
        if split_changed:
            self._update_split_rates()
        self._state = None
        self._count_quiet(seen != (len(self._records), self._next_arrival), ticked)
        return True

    def _count_quiet(self, progressed: bool, ticked: bool) -> None:
        """The step budget: raise ``NoProgress`` after ``quiet_events`` events in a row
        (ticks aside) in which no job arrived or finished."""
        if progressed:
            self._quiet = 0
            self._quiet_since = self.time
            return
        if ticked:
            return
        self._quiet += 1
        if self._quiet > self.config.quiet_events:
            raise NoProgress(
                f"no job arrived or finished in {self._quiet} events "
                f"(simulated t={self._quiet_since:.0f} s to t={self.time:.0f} s; "
                f"{len(self._pending)} pending, {len(self._running)} running, "
                f"{len(self._transit)} checkpointing or waiting for GPUs): the policy makes "
                "no progress (a livelock, e.g. jobs preempting each other back and forth)"
            )

    # -- results ---------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return (
            not self._pending
            and not self._running
            and not self._transit
            and self._next_arrival >= len(self._arrivals)
        )

    @property
    def events(self) -> int:
        return self._events

    @property
    def records(self) -> tuple[JobRecord, ...]:
        return tuple(self._records)

    @property
    def wall_s(self) -> float:
        return wallclock.perf_counter() - self._wall_start

    @property
    def arrived(self) -> list[Job]:
        """The jobs of ``arrivals`` (``from_state``) or ``jobs`` that have arrived so far."""
        return self._arrivals[: self._next_arrival]

    def work_left(self) -> list[tuple[Job, float]]:
        """Every job in the system now with its isolated seconds of work left: pending,
        running (as of now, a restore charge included) and in transit."""
        t = self.time
        left = [(pj.job, pj.remaining_s) for pj in self._pending.values()]
        for r in self._running.values():
            left.append((r.job, max(0.0, r.remaining - r.rate * max(0.0, t - r.since))))
        left.extend((tr.job, tr.remaining) for tr in self._transit.values())
        return left

    def wake_by(self, t: float) -> None:
        """Hold the next decision point no later than ``t`` (a fork that stops at its
        horizon): after ``apply``, which sets the one the decision asked for."""
        if self._wake > t:
            self._wake = t

    # -- internals -------------------------------------------------------------------

    def _preload(self, running: Sequence[tuple[Job, Placement]]) -> None:
        """Start the jobs that already run when the simulation begins (a warm start): each on
        its placement, with ``Job.duration`` as the isolated work it has left."""
        split_changed = False
        for job, placement in running:
            self._pending[job.job_id] = PendingJob(job=job, remaining_s=job.duration)
            self._acc[job.job_id] = Accrued()
            try:
                split_changed |= self._start(job.job_id, placement)
            except InvalidDecision as exc:
                raise ValueError(f"initial running jobs do not fit the cluster: {exc}") from exc
        if split_changed:
            self._update_split_rates()

    def _resume_running(self, run: RunningJob) -> None:
        """``from_state``: ``run`` on its placement, its progress brought up to now at its
        rate, which a split job gets again from the model."""
        split = run.placement.num_nodes > 1
        remaining = run.remaining_at(self.time)
        r = Run(
            job=run.job,
            placement=run.placement,
            start=run.start_time,
            since=self.time,
            remaining=remaining,
            rate=0.0,
            attained=run.attained_at(self.time),
            preemptions=run.preemptions,
            split=split,
            base=remaining,
        )
        self._running[run.job.job_id] = r
        self._running_dirty = True
        acc = Accrued()
        acc.first_start = run.start_time
        self._acc[run.job.job_id] = acc
        if not split:
            r.rate = run.rate
            self._push_completion(r)

    def _resume_transit(self, tr: ResumedTransit) -> None:
        """``from_state``: a job draining or waiting on reserved GPUs."""
        self._acc[tr.job.job_id] = Accrued()
        unclaimed = dict(tr.unclaimed)
        for node, gpus in unclaimed.items():
            self._claimable[node] += gpus
        self._add_transit(
            Transit(
                job=tr.job,
                remaining=tr.remaining_s,
                attained=tr.attained_gpu_s,
                preemptions=tr.preemptions,
                migrations=tr.migrations,
                held=tr.held,
                unclaimed=unclaimed,
                drain_end=tr.until if tr.held is not None else self.time,
                target=tr.target,
                start_at=tr.until if tr.target is not None else math.inf,
            )
        )

    def _admit_arrivals(self) -> None:
        arrivals = self._arrivals
        i = self._next_arrival
        while i < len(arrivals) and arrivals[i].submit_time <= self.time:
            job = arrivals[i]
            self._pending[job.job_id] = PendingJob(job=job, remaining_s=job.duration)
            self._acc[job.job_id] = Accrued()
            self._pending_dirty = True
            i += 1
        if i != self._next_arrival:
            self._next_arrival = i
            if self._next_tick == math.inf:
                self._schedule_tick()

    def _schedule_tick(self) -> None:
        tick = self.config.tick_s
        self._next_tick = self.time + tick if tick is not None else math.inf

    def _start(self, job_id: int, placement: Placement) -> bool:
        pending = self._pending.get(job_id)
        if pending is None:
            raise InvalidDecision(f"t={self.time:.1f}: job {job_id} is not pending")
        job = pending.job
        check_fits(self.topology, self._free, self._claimable, self.time, job, placement)
        del self._pending[job_id]
        self._pending_dirty = True
        ready = reserve(placement, self.time, self._free, self._claimable, self._transit.values())
        if ready > self.time:  # waits for GPUs being drained
            tr = Transit(
                job=job,
                remaining=pending.remaining_s,
                attained=pending.attained_gpu_s,
                preemptions=pending.preemptions,
                migrations=0,
                held=None,
                unclaimed={},
                drain_end=self.time,
                target=placement,
                start_at=ready,
            )
            self._add_transit(tr)
            return False
        return self._launch(
            job, placement, pending.remaining_s, pending.attained_gpu_s, pending.preemptions, 0
        )

    def _launch(
        self,
        job: Job,
        placement: Placement,
        work: float,
        attained: float,
        preemptions: int,
        migrations: int,
    ) -> bool:
        """Run ``job`` on ``placement`` (its GPUs already taken); a restart pays the restore."""
        restore = self._restart.restore_s(job.profile) if preemptions or migrations else 0.0
        run = Run(
            job=job,
            placement=placement,
            start=self.time,
            since=self.time,
            remaining=work + restore,
            rate=0.0,  # set below (single node) or by _update_split_rates (split)
            attained=attained,
            preemptions=preemptions,
            split=placement.num_nodes > 1,
            base=work,
            restore=restore,
            migrations=migrations,
        )
        self._running[job.job_id] = run
        self._running_dirty = True
        if run.split and self._split_rates is not None:
            self._add_split(self._split_rates, run)
        acc = self._acc[job.job_id]
        if math.isnan(acc.first_start):
            acc.first_start = self.time
        if not run.split:
            run.rate = self.model.rates(self.topology, [(job, placement)])[0]
            self._push_completion(run)
        return run.split

    def _signal(self, job_id: int, what: str) -> Run:
        """Stop a running job for a preemption or a migration: it drains from now on."""
        run = self._running.pop(job_id, None)
        if run is None:
            raise InvalidDecision(f"t={self.time:.1f}: cannot {what} job {job_id}: not running")
        self._remove_split(run)
        run.rebase(self.time)
        run.version = -1  # invalidates its completion events
        self._running_dirty = True
        return run

    def _drain(self, run: Run, preemptions: int, migrations: int) -> Transit:
        """The transit record of a signalled job: holds its GPUs for the grace."""
        grace = self._restart.grace_s
        real = run.real_remaining()
        lost = self._restart.lost_s(run.base - real, self.time - run.start, run.rate)
        acc = self._acc[run.job.job_id]
        held = self.time - run.start + grace
        acc.run_s += held
        acc.gpu_s += held * run.job.num_gpus
        acc.restart_s += run.restore_done() + grace + lost
        tr = Transit(
            job=run.job,
            remaining=real + lost,
            attained=run.attained,
            preemptions=preemptions,
            migrations=migrations,
            held=run.placement,
            unclaimed=dict(run.placement.alloc),
            drain_end=self.time + grace,
        )
        for node, gpus in run.placement.alloc:
            self._claimable[node] += gpus
        return tr

    def _preempt(self, job_id: int) -> bool:
        run = self._signal(job_id, "preempt")
        tr = self._drain(run, run.preemptions + 1, run.migrations)
        self._add_transit(tr)
        # without a grace its GPUs are free at once (and it is back in the queue)
        return self._transit_due() | run.split if tr.drain_end <= self.time else run.split

    def _migrate(self, job_id: int, placement: Placement) -> bool:
        run = self._running.get(job_id)
        if run is None:
            raise InvalidDecision(f"t={self.time:.1f}: cannot migrate job {job_id}: not running")
        own = dict(run.placement.alloc)
        check_fits(self.topology, self._free, self._claimable, self.time, run.job, placement, own)
        self._signal(job_id, "migrate")
        tr = self._drain(run, run.preemptions, run.migrations + 1)
        tr.target = placement
        ready = reserve(
            placement, self.time, self._free, self._claimable, self._transit.values(), tr
        )
        tr.start_at = max(tr.drain_end, ready)
        self._add_transit(tr)
        return self._transit_due() | run.split if tr.start_at <= self.time else run.split

    def _add_transit(self, tr: Transit) -> None:
        job_id = tr.job.job_id
        self._transit[job_id] = tr
        self._transit_dirty = True
        self._state = None
        if tr.held is not None:
            self._seq += 1
            heapq.heappush(self._transit_heap, (tr.drain_end, 0, self._seq, job_id))
        if tr.target is not None:
            self._seq += 1
            heapq.heappush(self._transit_heap, (tr.start_at, 1, self._seq, job_id))

    def _transit_due(self) -> bool:
        """Process the drains that end and the reserved starts due by now."""
        split_changed = False
        heap = self._transit_heap
        while heap and heap[0][0] <= self.time + _EPS:
            _, phase, _, job_id = heapq.heappop(heap)
            tr = self._transit[job_id]
            tr.view = None
            self._transit_dirty = True
            if phase == 0:  # its checkpoint is written: the GPUs not reserved become free
                assert tr.held is not None
                for node, gpus in tr.unclaimed.items():
                    self._free[node] += gpus
                    self._claimable[node] -= gpus
                tr.held = None
                tr.unclaimed = {}
                if tr.target is None:  # preempted: back to its place in the queue
                    del self._transit[job_id]
                    self._pending[job_id] = PendingJob(
                        job=tr.job,
                        remaining_s=tr.remaining,
                        attained_gpu_s=tr.attained,
                        preemptions=tr.preemptions,
                        restore_s=self._restart.restore_s(tr.job.profile),
                    )
                    self._pending_unsorted = True
                    self._pending_dirty = True
            else:  # its reserved GPUs are all let go: it (re)starts there
                del self._transit[job_id]
                assert tr.target is not None
                split_changed |= self._launch(
                    tr.job, tr.target, tr.remaining, tr.attained, tr.preemptions, tr.migrations
                )
        return split_changed

    def _release(self, run: Run) -> None:
        for node, gpus in run.placement.alloc:
            self._free[node] += gpus
        acc = self._acc[run.job.job_id]
        held = self.time - run.start
        acc.run_s += held
        acc.gpu_s += held * run.job.num_gpus
        acc.restart_s += run.restore_done()
        run.version = -1  # invalidates its completion events

    def _push_completion(self, run: Run) -> None:
        end = run.since + run.remaining / run.rate if run.rate > 0 else math.inf
        self._seq += 1
        run.version = self._seq  # unique across runs, so a restarted job never revives old events
        heapq.heappush(self._heap, (end, run.version, run.job.job_id))

    def _peek_completion(self) -> float:
        heap = self._heap
        while heap:
            end, version, job_id = heap[0]
            run = self._running.get(job_id)
            if run is not None and run.version == version:
                return end
            heapq.heappop(heap)
        return math.inf

    def _complete_due(self) -> bool:
        split_changed = False
        heap = self._heap
        while heap and heap[0][0] <= self.time + _EPS:
            _, version, job_id = heapq.heappop(heap)
            run = self._running.get(job_id)
            if run is None or run.version != version:
                continue
            del self._running[job_id]
            self._running_dirty = True
            self._remove_split(run)
            run.rebase(self.time)
            self._release(run)
            self._records.append(self._acc.pop(job_id).record(run, self.time))
            split_changed |= run.split
        return split_changed

    def _add_split(self, rates: SplitRates[Run], run: Run) -> bool:
        """Make ``run`` the newest member of ``rates``; False where it cannot be (every
        rate is recomputed from then on)."""
        member = rates.add(run, run.job, run.placement)
        if member is None:
            self._split_rates = None
            self._incremental = False
            return False
        run.member = member
        return True

    def _remove_split(self, run: Run) -> None:
        if run.member >= 0 and self._split_rates is not None:
            self._split_rates.remove(run.member)
        run.member = -1

    def _update_split_rates(self) -> None:
        """Rates of the split runs after a change to their set; those that changed are
        rebased first and get a new completion (in running order)."""
        if not self._incremental:
            self._update_split_rates_full()
            return
        rates = self._split_rates
        if rates is None:
            assert isinstance(self.model, AnalyticModel)
            rates = self._split_rates = SplitRates(self.model, self.topology)
            for run in self._running.values():
                if run.split and not self._add_split(rates, run):
                    self._update_split_rates_full()
                    return
        self._flows = rates.flows
        self._set_rates(rates.changed())

    def _update_split_rates_full(self) -> None:
        """``_update_split_rates`` recomputing every split run's rate (the reference)."""
        split = [r for r in self._running.values() if r.split]
        self._flows = tuple(
            link_flows(self.topology, (r.placement for r in split), (r.job.job_id for r in split))
        )
        if not split:
            return
        rates = self.model.rates(self.topology, [(r.job, r.placement) for r in split])
        self._set_rates(zip(split, rates, strict=True))

    def _set_rates(self, rates: Iterable[tuple[Run, float]]) -> None:
        """Each run's new rate, in order: a changed one is rebased first and gets a new
        completion."""
        for run, rate in rates:
            if rate != run.rate:
                run.rebase(self.time)
                run.rate = rate
                run.view = None
                self._running_dirty = True
                self._push_completion(run)


def _same_placements(a: ClusterState, b: ClusterState) -> bool:
    """Whether two states' running jobs hold the same placement objects, in the same order
    (a job whose rate changed keeps its placement; ``jobs_per_node`` reads nothing else)."""
    if a.running is b.running:
        return True
    if len(a.running) != len(b.running):
        return False
    return all(x.placement is y.placement for x, y in zip(a.running, b.running, strict=True))
