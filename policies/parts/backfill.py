"""The planner of ``admission=easy``: Slurm's main scheduler then sched/backfill over
select/cons_tres, jobs in their requested shape (``heuristics.backfill`` has the rule).

Every job asks for a shape (``domain.requested_shape``: nodes x GPUs per node) and
starts only in it, on the nodes ``placement.slurm_select`` picks (cons_tres best fit,
fewest leaf switches). Run times are estimated from time limits, else the run-time
predictor's upper quantile (``runtime_estimate``), never from the true run time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from linkwise.cluster.domain import (
    ClusterState,
    Job,
    Placement,
    Shape,
    Start,
    Topology,
    requested_shape,
)
from linkwise.cluster.placement.generators import apply_placement
from linkwise.cluster.placement.slurm_select import (
    slurm_select,
    slurm_select_flexible,
    slurm_select_usable,
)
from linkwise.policies.parts.placements import can_ever_run

# A job without a time limit gets its partition's limit; traces without limits (Philly)
# get this one: 7 days, a common MaxTime of GPU partitions. Slurm's bf_window should be
# at least the longest limit (its documentation), so the window defaults to it too.
DEFAULT_LIMIT_S = 7 * 86400.0


class Switches(Protocol):
    """A rule's ``--switches`` (``placements.Select``): ``waiting`` whether they still hold
    the job to its N leaf switches, ``held`` whether they keep it off a placement now
    (``placements.Select.held``)."""

    def waiting(self, job: Job, now: float) -> bool: ...

    def held(self, topo: Topology, placement: Placement | None, job: Job, now: float) -> bool: ...


OVERDUE_S = 1.0  # a running job past its estimate is expected to end this much later


def runtime_estimate(job: Job, default_limit_s: float = DEFAULT_LIMIT_S) -> float:
    """What the scheduler believes the job runs for: its time limit; without one, the
    predictor's upper quantile (as a user's limit would be set), else the default limit."""
    if job.time_limit > 0:
        return job.time_limit
    return job.pred_hi_s if job.pred_hi_s > 0 else default_limit_s


@dataclass(slots=True)
class _Plan:
    """The node-space of one backfill pass: GPUs free now, releases, whole-node reservations.

    ``earliest`` is asked for up to ``max_job_test`` jobs per pass, each over several
    candidate times, so the node-space is kept in forms that make one candidate time cheap
    (``tests/policies/test_heuristics.py`` checks every answer of whole seeded runs against the
    plain search, every candidate time recomputed from the releases and reservations):

    - sets of nodes are bitmasks (bit i = node i);
    - the GPUs available at a time are a step function of the releases; the nodes with at
      least ``per`` GPUs available are a bitmask per step, built for all steps at once per
      ``per`` by applying each release's nodes in time order (a release only adds GPUs), and
      rebuilt only after a start changes the node-space;
    - the nodes reservations block during a run ``[t, t + est]`` are a bitmask cached per
      (t, t + est), brought up to date with the reservations added since (reservations
      only add nodes);
    so a candidate time costs a few lookups and a popcount. The per-node free counts are
    built only at the time that fits, to hand ``slurm_select`` exactly what the plain search
    gives it.
    """

    topo: Topology
    now: float
    free: list[int]
    releases: list[tuple[float, Placement]]  # expected end, sorted
    reserved: list[tuple[float, float, frozenset[int]]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # candidate start times, sorted
    _starts: list[float] = field(default_factory=list)  # the reservations, column by column
    _ends: list[float] = field(default_factory=list)
    _masks: list[int] = field(default_factory=list)  # their nodes as bitmasks
    _bits: list[int] = field(default_factory=list)  # 1 << node
    _one_leaf: bool = False
    # the node-space's step function (rebuilt after a start): step times (now, then each
    # distinct release end), the releases' (node, GPUs) at each step, masks per ``per``
    _step_times: list[float] = field(default_factory=list)
    _step_delta: list[list[tuple[int, int]]] = field(default_factory=list)
    _usable: dict[int, list[int]] = field(default_factory=dict)  # per -> mask at each step
    _free_mask: int = -1  # nodes with free GPUs now (-1: not built)
    _blocked: dict[tuple[float, float], tuple[int, int]] = field(default_factory=dict)
    _soon: dict[float, tuple[int, int]] = field(default_factory=dict)  # by -> (seen, mask)
    # on a tree topology, the nodes slurm_select picks per (usable mask, node count): a pure
    # function of the two, shared by every pass on the same topology (``_tree_picks``)
    _picks: dict[tuple[int, int], tuple[int, ...] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.times = sorted({self.now, *(end for end, _ in self.releases)})
        self._bits = [1 << i for i in range(len(self.free))]
        self._one_leaf = len(self.topo.leaf_names) == 1
        if not self._one_leaf:
            self._picks = _tree_picks(self.topo)

    def start_now(self, placement: Placement, end: float) -> None:
        apply_placement(self.free, placement)
        _insort(self.releases, (end, placement))
        self._add_time(end)
        self._step_times.clear()  # the node-space changed: rebuilt when next asked
        self._usable.clear()
        self._free_mask = -1

    def reserve(self, start: float, end: float, nodes: frozenset[int]) -> None:
        self.reserved.append((start, end, nodes))
        self._starts.append(start)
        self._ends.append(end)
        self._masks.append(sum(self._bits[n] for n in nodes))
        self._add_time(end)

    def room_now(self, est: float) -> list[int]:
        """The GPUs free now per node, none on nodes a reservation holds during a run of
        ``est`` from now (where a flexible request may start now without delaying one)."""
        end, now = self.now + est, self.now
        blocked = 0
        for rs, re, m in zip(self._starts, self._ends, self._masks, strict=True):
            if rs <= end and re > now:
                blocked |= m
        return [0 if blocked & b else f for b, f in zip(self._bits, self.free, strict=True)]

    def all_free_nodes_reserved(self, by: float) -> bool:
        """Whether every node with free GPUs now is reserved from ``by`` or earlier."""
        seen, soon = self._soon.get(by, (0, 0))
        masks = self._masks
        if seen < len(masks):
            for start, m in zip(self._starts[seen:], masks[seen:], strict=True):
                if start <= by:
                    soon |= m
            self._soon[by] = (len(masks), soon)
        if self._free_mask < 0:
            self._free_mask = sum(b for b, f in zip(self._bits, self.free, strict=True) if f)
        return not self._free_mask & ~soon

    def _add_time(self, t: float) -> None:
        k = bisect.bisect_left(self.times, t)
        if k == len(self.times) or self.times[k] != t:
            self.times.insert(k, t)

    def _build_steps(self) -> None:
        """Step times (now, then each distinct release end) and the GPUs each releases."""
        step_times: list[float] = [self.now]
        deltas: list[list[tuple[int, int]]] = [[]]
        for end, placement in self.releases:
            if end > step_times[-1]:
                step_times.append(end)
                deltas.append([])
            deltas[-1].extend(placement.alloc)
        self._step_times, self._step_delta = step_times, deltas

    def _usable_masks(self, per: int) -> list[int]:
        """Per step, the nodes with at least ``per`` GPUs available then."""
        masks = self._usable.get(per)
        if masks is None:
            bits = self._bits
            avail = list(self.free)
            mask = sum(b for b, f in zip(bits, avail, strict=True) if f >= per)
            masks = []
            for delta in self._step_delta:
                for node, g in delta:
                    avail[node] += g
                    if avail[node] >= per:
                        mask |= bits[node]
                masks.append(mask)
            self._usable[per] = masks
        return masks

    def _avail_at(self, step: int) -> list[int]:
        """The GPUs available per node at a step."""
        avail = list(self.free)
        for delta in self._step_delta[: step + 1]:
            for node, g in delta:
                avail[node] += g
        return avail

    def earliest(
        self,
        shape: Shape,
        est: float,
        after: float,
        horizon: float,
        accept: Callable[[Placement], bool] | None = None,
    ) -> tuple[float, Placement] | None:
        """The earliest start at or after ``after`` (itself at or after now) and before
        ``horizon`` where the shape fits on nodes no reservation holds during the run (and,
        with ``accept``, where select's placement is one it accepts)."""
        if not self._step_times:
            self._build_steps()
        per, need = shape.gpus_per_node, shape.nodes
        step_times, usable = self._step_times, self._usable_masks(per)
        starts, ends, masks, cache = self._starts, self._ends, self._masks, self._blocked
        n_res = len(masks)
        times = self.times
        k = bisect.bisect_left(times, after)
        step = bisect.bisect_right(step_times, times[k] if k < len(times) else after) - 1
        last_step = len(step_times) - 1
        for j in range(k, len(times)):  # by index: a slice would copy the times per call
            t = times[j]
            if t > horizon:
                return None
            while step < last_step and step_times[step + 1] <= t:
                step += 1
            if usable[step].bit_count() < need:  # too few even without reservations
                continue
            end = t + est
            # the nodes a reservation holds during [t, end] (``s <= end and e > t``): cached
            # per window, brought up to date with the reservations added since
            seen, blocked = cache.get((t, end), (0, 0))
            if seen < n_res:
                for rs, re, m in zip(starts[seen:], ends[seen:], masks[seen:], strict=True):
                    if rs <= end and re > t:
                        blocked |= m
                cache[(t, end)] = (n_res, blocked)
            fits = usable[step] & ~blocked
            if fits.bit_count() < need:
                continue
            if self._one_leaf:  # best fit reads the free counts (reserved nodes count 0)
                bits = self._bits
                avail = [
                    0 if blocked & b else f for b, f in zip(bits, self._avail_at(step), strict=True)
                ]
                placement = slurm_select_usable(
                    self.topo, avail, shape, [i for i, f in enumerate(avail) if f >= per]
                )
            else:  # fewest leaf switches reads only which nodes are usable: memoised
                picks = self._picks
                key = (fits, need)
                nodes = picks.get(key, _MISSING)
                if nodes is _MISSING:
                    found = slurm_select_usable(self.topo, (), shape, _nodes_of(fits))
                    nodes = None if found is None else found.nodes
                    if len(picks) >= _PICKS_MAX:
                        picks.clear()
                    picks[key] = nodes
                placement = None if nodes is None else Placement(tuple((n, per) for n in nodes))
            if placement is not None and (accept is None or accept(placement)):
                return t, placement
        return None


_MISSING: tuple[int, ...] = (-1,)
_PICKS_MAX = 200_000  # memoised picks per topology before the memo starts over
_PICKS: dict[int, tuple[Topology, dict[tuple[int, int], tuple[int, ...] | None]]] = {}


def _tree_picks(topo: Topology) -> dict[tuple[int, int], tuple[int, ...] | None]:
    """The memo of ``slurm_select``'s picks on this topology (the same object: the entry
    holds it, so its id is not reused while the entry lives)."""
    entry = _PICKS.get(id(topo))
    if entry is None or entry[0] is not topo:
        if len(_PICKS) >= 8:
            _PICKS.clear()
        entry = (topo, {})
        _PICKS[id(topo)] = entry
    return entry[1]


# the nodes (bit positions) of every byte value, to list a bitmask's nodes a byte at a time
_BYTE_NODES: tuple[tuple[int, ...], ...] = tuple(
    tuple(i for i in range(8) if v >> i & 1) for v in range(256)
)


def _nodes_of(mask: int) -> list[int]:
    """The nodes of a bitmask, in index order."""
    out: list[int] = []
    base = 0
    while mask:
        byte = mask & 0xFF
        if byte:
            out.extend(base + i for i in _BYTE_NODES[byte])
        mask >>= 8
        base += 8
    return out


def plan_backfill(
    state: ClusterState,
    *,
    max_job_test: int = 100,
    default_limit_s: float = DEFAULT_LIMIT_S,
    window_s: float = DEFAULT_LIMIT_S,
    resolution_s: float = 60.0,
    switches: Switches | None = None,
) -> tuple[Start, ...]:
    """One pass of Slurm's main scheduler then sched/backfill over ``state.pending`` in its
    order (``heuristics.backfill``'s docstring): the jobs that start now, where.

    ``switches``: the jobs' ``--switches``. A job they keep from the nodes select picks now
    stops the main scheduler, as a job that does not fit; backfill plans a job still
    waiting at its earliest start within its N leaf switches and reserves those nodes, as
    Slurm's backfill does (a job behind it may not take them; checked against a real Slurm,
    ``evaluation.slurm_switches``)."""
    topo = state.topology
    now = state.time
    node_gpus = topo.max_gpus_per_node
    free = list(state.free_gpus)
    starts: list[Start] = []
    releases = [
        (
            _expected_end(now, r.start_time, runtime_estimate(r.job, default_limit_s)),
            r.placement,
        )
        for r in state.running
    ]
    pending = state.pending
    i = 0
    while i < len(pending):  # the main scheduler: strict queue order
        job = pending[i].job
        if not can_ever_run(state, pending[i]):
            i += 1
            continue
        if job.flexible:
            placement = slurm_select_flexible(topo, free, job.num_gpus)
        else:
            placement = slurm_select(topo, free, requested_shape(job, node_gpus))
        if placement is None or (switches is not None and switches.held(topo, placement, job, now)):
            break
        i += 1
        apply_placement(free, placement)
        starts.append(Start(job.job_id, placement))
        releases.append((now + runtime_estimate(job, default_limit_s), placement))
    if i >= len(pending) or not any(free):
        return tuple(starts)

    releases.sort(key=lambda r: r[0])
    plan = _Plan(topo, now, free, releases)
    horizon = now + window_s
    res = resolution_s
    # within one pass a request's earliest start never moves earlier (reservations and
    # starts only take room), so the search for the same shape and estimate resumes there
    resume: dict[tuple[Shape, float, bool], float] = {}
    # no job left to test runs shorter than this: once every node with free GPUs is
    # reserved before now + shortest, nothing more can start now and the pass may stop
    shortest = min(
        (runtime_estimate(p.job, default_limit_s) for p in pending[i : i + max_job_test]),
        default=math.inf,
    )
    tested = 0
    while i < len(pending) and tested < max_job_test and any(free):
        p = pending[i]
        i += 1
        if not can_ever_run(state, p):
            continue
        tested += 1
        est = runtime_estimate(p.job, default_limit_s)
        if p.job.flexible and p.job.num_gpus <= sum(free):
            # a flexible request starts now on any GPUs no reservation needs during its run;
            # else it is planned (and reserves nodes) in the shape it would have packed
            now_at = slurm_select_flexible(topo, plan.room_now(est), p.job.num_gpus)
            if now_at is not None and (
                switches is None or not switches.held(topo, now_at, p.job, now)
            ):
                plan.start_now(now_at, now + est)
                starts.append(Start(p.job.job_id, now_at))
                continue
        shape = requested_shape(p.job, node_gpus)
        waiting = switches is not None and switches.waiting(p.job, now)
        key = (shape, est, waiting)
        after = resume.get(key, now)
        if after > horizon:
            continue
        accept = _within_switches(switches, topo, p.job, now) if waiting else None
        found = plan.earliest(shape, est, after, horizon, accept)
        if found is None:
            resume[key] = math.inf
            continue
        t, placement = found
        resume[key] = t
        if t <= now:
            plan.start_now(placement, now + est)
            starts.append(Start(p.job.job_id, placement))
        else:
            span = (t // res * res, (t + est) // res * res) if res > 0 else (t, t + est)
            plan.reserve(*span, frozenset(placement.nodes))
            if plan.all_free_nodes_reserved(now + shortest):
                break
    return tuple(starts)


def _within_switches(
    switches: Switches | None, topo: Topology, job: Job, now: float
) -> Callable[[Placement], bool]:
    """Whether a placement is one the job's ``--switches`` let it start on (at ``now``)."""
    return lambda placement: switches is None or not switches.held(topo, placement, job, now)


def _insort(releases: list[tuple[float, Placement]], item: tuple[float, Placement]) -> None:
    """Insert ``item`` into ``releases``, kept sorted by end time."""
    lo, hi = 0, len(releases)
    while lo < hi:
        mid = (lo + hi) // 2
        if releases[mid][0] <= item[0]:
            lo = mid + 1
        else:
            hi = mid
    releases.insert(lo, item)


def _expected_end(now: float, start: float, estimate: float) -> float:
    """When a running job is expected to end: start + estimate, or just after now if overdue."""
    return max(now + OVERDUE_S, start + estimate)
