"""Backfill against a real Slurm: one workload run by Slurm and replayed in the simulator.

A workload of jobs with shapes (nodes x GPUs per node), time limits and sleeps is
submitted held to a Slurm cluster and released at once; its accounting is replayed in
the simulator under ``backfill`` on the same nodes (pure queueing: each job's work is
its measured run time, the scheduler sees only time limits), and the two schedules are
compared job by job: start order, nodes, start times. ``tests/evaluation/test_backfill_live.py``
runs it against ``scripts/local-slurm``; ``benchmarks/backfill_vs_slurm.py`` reports it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from linkwise.cluster.contention import NoContention
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Topology,
)
from linkwise.cluster.loop import drive
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.records import JobRun
from linkwise.policies.heuristics import backfill

# (nodes, GPUs per node) a workload draws from, on 4-GPU nodes
SHAPES: tuple[tuple[int, int], ...] = (
    (1, 1),
    (1, 1),
    (1, 2),
    (1, 3),
    (1, 4),
    (2, 2),
    (2, 4),
    (3, 1),
)


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job to submit: its shape, its time limit (minutes) and how long it sleeps."""

    nodes: int
    gpus_per_node: int
    limit_min: int
    sleep_s: int


def workload(n: int = 24, seed: int = 0) -> tuple[WorkloadJob, ...]:
    """``n`` jobs with shapes from ``SHAPES``, limits of 1-3 minutes and sleeps of 3-25 s."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        nodes, per = rng.choice(SHAPES)
        out.append(WorkloadJob(nodes, per, rng.randint(1, 3), rng.randint(3, 25)))
    return tuple(out)


def run_on_slurm(
    client: SlurmClient,
    jobs: Sequence[WorkloadJob],
    *,
    tag: str = "lw-bfcmp",
    timeout_s: float = 150.0,
) -> tuple[list[JobRun], float, bool]:
    """Submit the jobs held (``--cpus-per-gpu=2``: CPUs in proportion to GPUs, as
    ``placement.slurm_select`` assumes), release them at once, wait for them to finish.

    Returns Slurm's records of them, the release time, and whether other jobs were in the
    queue meanwhile (the comparison then does not hold). Cancels what is left of its own
    jobs on the way out, nothing else.
    """
    ids: list[int] = []
    t0 = time.time() - 2
    try:
        for k, w in enumerate(jobs):
            ids.append(
                client.submit(
                    f"sleep {w.sleep_s}",
                    name=f"{tag}-{k}",
                    nodes=w.nodes,
                    gpus_per_node=w.gpus_per_node,
                    time_limit_min=w.limit_min,
                    hold=True,
                    extra_args=["--cpus-per-gpu=2"],
                )
            )
        released = time.time()
        client.runner.run(["scontrol", "release", ",".join(map(str, ids))])
        foreign = False
        deadline = released + timeout_s
        while True:
            queue = client.queue()
            foreign |= any(q.job_id not in ids for q in queue)
            if not any(q.job_id in ids for q in queue):
                break
            if time.time() > deadline:
                raise TimeoutError(f"the workload did not finish within {timeout_s:.0f} s")
            time.sleep(1)
        runs: list[JobRun] = []
        while time.time() < deadline:
            runs = [r for r in client.jobs(t0) if r.job_id in ids]
            if len(runs) == len(ids) and all(r.settled and r.end_time for r in runs):
                break
            time.sleep(1)
        return runs, released, foreign
    finally:
        left = {q.job_id for q in client.queue()}
        for job_id in ids:  # only ours, and only what is left
            if job_id in left:
                client.cancel(job_id)


def replay_jobs(runs: Sequence[JobRun], released_at: float) -> tuple[Job, ...]:
    """The accounting as simulator jobs: all submitted at the release, each with its shape,
    its time limit and, as its work, the run time Slurm measured (at least 1 s)."""
    jobs = []
    for r in runs:
        if r.start_time is None or r.end_time is None:
            raise ValueError(f"job {r.job_id} has not run: {r.state}")
        jobs.append(
            Job(
                job_id=r.job_id,
                submit_time=released_at,
                num_gpus=r.gpus,
                duration=max(1.0, r.end_time - r.start_time),
                nodes=len(r.nodes),
                time_limit=r.time_limit_s or 0.0,
                name=r.name,
            )
        )
    return tuple(jobs)


def replay(topo: Topology, jobs: Sequence[Job]) -> dict[int, tuple[float, Placement]]:
    """The jobs under ``backfill`` in the simulator, pure queueing: each one's start and nodes."""
    starts: dict[int, tuple[float, Placement]] = {}

    def record(state: ClusterState, decision: Decision) -> None:
        for s in decision.starts:
            starts[s.job_id] = (state.time, s.placement)

    drive(Simulator(topo, jobs, NoContention()), backfill(), on_decision=record)
    return starts


@dataclass(frozen=True, slots=True)
class JobComparison:
    """One job in both schedules (start times in seconds after the release)."""

    job_id: int
    slurm_start: float
    sim_start: float
    slurm_nodes: tuple[str, ...]
    sim_nodes: tuple[str, ...]

    @property
    def delta_s(self) -> float:
        return self.slurm_start - self.sim_start


@dataclass(frozen=True)
class ReplayComparison:
    """Slurm's schedule beside the simulator's."""

    jobs: tuple[JobComparison, ...]  # in Slurm's start order

    @property
    def same_nodes(self) -> int:
        return sum(j.slurm_nodes == j.sim_nodes for j in self.jobs)

    def order_inversions(self, tolerance_s: float) -> list[tuple[int, int]]:
        """Pairs (a, b) Slurm started a before b, by more than the tolerance, and the
        simulator b before a, by more than the tolerance."""
        out = []
        for i, a in enumerate(self.jobs):
            for b in self.jobs[i + 1 :]:
                if (
                    b.slurm_start - a.slurm_start > tolerance_s
                    and a.sim_start - b.sim_start > tolerance_s
                ):
                    out.append((a.job_id, b.job_id))
        return out

    @property
    def max_abs_delta_s(self) -> float:
        return max((abs(j.delta_s) for j in self.jobs), default=0.0)


def compare(
    runs: Sequence[JobRun],
    sim: dict[int, tuple[float, Placement]],
    topo: Topology,
    released_at: float,
) -> ReplayComparison:
    """Job by job: Slurm's start and nodes beside the simulator's."""
    names = [n.name for n in topo.nodes]
    rows = []
    for r in sorted(runs, key=lambda r: (r.start_time or 0.0, r.job_id)):
        start, placement = sim[r.job_id]
        rows.append(
            JobComparison(
                job_id=r.job_id,
                slurm_start=(r.start_time or 0.0) - released_at,
                sim_start=start - released_at,
                slurm_nodes=tuple(sorted(r.nodes)),
                sim_nodes=tuple(sorted(names[n] for n in placement.nodes)),
            )
        )
    return ReplayComparison(tuple(rows))


@dataclass(frozen=True, slots=True)
class InstantCheck:
    """At one instant Slurm started jobs: what it started and what ``backfill`` decides there,
    given the cluster exactly as Slurm had it (its running jobs on their nodes, its queue)."""

    time: float  # seconds after the release
    slurm: tuple[tuple[int, tuple[str, ...]], ...]  # (job, nodes) Slurm started at this instant
    decided: tuple[tuple[int, tuple[str, ...]], ...]  # (job, nodes) backfill starts
    later: tuple[int, ...]  # decided jobs Slurm started within the tolerance after the instant

    @property
    def agrees(self) -> bool:
        """Every job Slurm started here is decided on the same nodes, and every other decided
        job is one Slurm started on those nodes within the tolerance."""
        decided = dict(self.decided)
        return all(decided.get(j) == nodes for j, nodes in self.slurm) and set(decided) == {
            j for j, _ in self.slurm
        } | set(self.later)


def _state_at(
    done: Sequence[JobRun],
    jobs: dict[int, Job],
    topo: Topology,
    t: float,
    still_running: frozenset[int],
) -> ClusterState:
    """The cluster as Slurm had it at ``t``: jobs started before and not ended (or ending at
    ``t`` but listed in ``still_running``) on their nodes, the not yet started ones queued."""
    index = topo.node_index
    running, pending = [], []
    free = [n.gpus for n in topo.nodes]
    for r in done:
        assert r.start_time is not None and r.end_time is not None
        job = jobs[r.job_id]
        if r.start_time < t and (t < r.end_time or r.job_id in still_running):
            per = job.num_gpus // len(r.nodes)
            placement = Placement.of([(index[n], per) for n in r.nodes])
            for node, g in placement.alloc:
                free[node] -= g
            running.append(
                RunningJob(job, placement, r.start_time, job.duration, 1.0, since=r.start_time)
            )
        elif r.start_time >= t:
            pending.append(PendingJob(job, job.duration))
    pending.sort(key=lambda p: (p.job.submit_time, p.job.job_id))
    return ClusterState(t, topo, tuple(free), tuple(running), tuple(pending))


def check_instants(
    runs: Sequence[JobRun], topo: Topology, released_at: float, tolerance_s: float
) -> tuple[InstantCheck, ...]:
    """``backfill``'s decision at every instant Slurm started jobs, on Slurm's own state then.

    ``tolerance_s``: Slurm's backfill runs every ``bf_interval`` seconds, so a job it starts
    a little after the instant that made room for it counts as started there. Accounting
    times are whole seconds: a job that ended in the same second as the instant may have
    ended before or after Slurm's pass, so every such split is tried (jobs ending then seen
    ended or still running) and the one that agrees, if any, is reported.
    """
    jobs = {j.job_id: j for j in replay_jobs(runs, released_at)}
    names = [n.name for n in topo.nodes]
    done = [r for r in runs if r.start_time is not None and r.end_time is not None]
    out = []
    for t in sorted({r.start_time for r in done if r.start_time is not None}):
        slurm_at = {r.job_id: tuple(sorted(r.nodes)) for r in done if r.start_time == t}
        slurm_soon = {
            r.job_id: tuple(sorted(r.nodes))
            for r in done
            if r.start_time is not None and t < r.start_time <= t + tolerance_s
        }
        ending = frozenset(
            r.job_id
            for r in done
            if r.end_time == t and r.start_time is not None and r.start_time < t
        )
        check = None
        for still in _subsets(ending):
            decision = backfill().decide(_state_at(done, jobs, topo, t, still))
            decided = tuple(
                (s.job_id, tuple(sorted(names[n] for n in s.placement.nodes)))
                for s in decision.starts
            )
            later = tuple(j for j, nodes in decided if slurm_soon.get(j) == nodes)
            check = InstantCheck(t - released_at, tuple(sorted(slurm_at.items())), decided, later)
            if check.agrees:
                break
        assert check is not None
        out.append(check)
    return tuple(out)


def _subsets(items: frozenset[int], limit: int = 6) -> list[frozenset[int]]:
    """Every subset of ``items`` (the empty one first); only the empty one and ``items``
    itself when there are more than ``limit``."""
    ordered = sorted(items)
    if len(ordered) > limit:
        return [frozenset(), items]
    return [
        frozenset(x for k, x in enumerate(ordered) if mask >> k & 1)
        for mask in range(1 << len(ordered))
    ]
