"""Slurm's ``--switches=N@T`` on a real Slurm with ``topology/tree``, against ``backfill_switches``.

A case is a fragmented cluster and a job asking ``--switches=1@T``: blockers pinned with ``-w``
(``--gres=gpu:G --cpus-per-gpu=2``, a time limit and a sleep each) hold GPUs on their nodes;
once they run, the job (a fixed shape, ``-N n --gres=gpu:g --cpus-per-gpu=2``) is submitted,
then, in one case, a job behind it. Slurm's start (seconds after the job's submission, from
squeue's ``submit_time`` and ``start_time``: whole seconds) and nodes of each job are read
from squeue's JSON, with the pending reasons it showed while the job waited. The model is
the simulator under ``heuristics.backfill_switches(1, T)`` from the same state: the blockers
running on their nodes since Slurm started them, each for its sleep with its time limit,
the jobs submitted when Slurm says. A job agrees when both start it on the same nodes within
``TOLERANCE_S`` of each other, or neither starts it before Slurm's part of the case ended.

``CASES``: (a) one leaf switch holds the job now: it starts there at once; (b) none does,
but one will when a blocker ends before T: it waits for that; (c) none will before T: it
starts spread over both leaves T after its submission; (d) as (b), with a job behind it
that fits now only on a node the waiting job will need: Slurm's backfill reserves those
nodes for the waiting job, so the later job does not start. ``CASES`` run in about 90 s;
``benchmarks/switches_vs_slurm.py`` reports them, ``tests/evaluation/test_switches_live.py``
asserts them.
"""

from __future__ import annotations

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
from linkwise.cluster.hostlist import expand
from linkwise.cluster.loop import drive
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.evaluation.slurm_flexible import (
    job_state,
    sbatch,
    squeue_jobs,
    wait_running,
    wait_settled,
)
from linkwise.policies.heuristics import backfill_switches

# Slurm starts a job within a pass of its main scheduler or backfill (sched_interval=2,
# bf_interval=2 on scripts/local-slurm) of the model's instant, and both clocks are whole
# seconds
TOLERANCE_S = 4.0
JOB_SLEEP_S = 600  # the measured jobs never end during a case
JOB_LIMIT_MIN = 10


@dataclass(frozen=True, slots=True)
class Blocker:
    """A job pinned to one node: its GPUs there, how long it sleeps, its time limit."""

    node: str
    gpus: int
    sleep_s: int = JOB_SLEEP_S
    limit_min: int = JOB_LIMIT_MIN


@dataclass(frozen=True, slots=True)
class Ask:
    """A fixed-shape request: ``nodes`` x ``gpus_per_node``, a time limit in minutes."""

    nodes: int
    gpus_per_node: int
    limit_min: int = JOB_LIMIT_MIN

    def args(self) -> list[str]:
        return [
            f"--nodes={self.nodes}",
            f"--gres=gpu:{self.gpus_per_node}",
            "--cpus-per-gpu=2",
            f"--time={self.limit_min}",
        ]


@dataclass(frozen=True, slots=True)
class SwitchCase:
    """Blockers, the job asking ``--switches=1@wait_s`` and, optionally, a job behind it."""

    name: str
    what: str
    blockers: tuple[Blocker, ...]
    job: Ask
    wait_s: int
    later: Ask | None = None


CASES: tuple[SwitchCase, ...] = (
    SwitchCase(
        "a_fits",
        "one leaf switch holds it now: it starts there at once",
        (Blocker("gpu01", 3), Blocker("gpu03", 2), Blocker("gpu04", 2)),
        Ask(2, 2),
        30,
    ),
    SwitchCase(
        "b_waits",
        "only both leaves hold it now; one will when gpu03's blocker ends (10 s) before T",
        (Blocker("gpu01", 3), Blocker("gpu03", 3, sleep_s=10, limit_min=1)),
        Ask(2, 2),
        40,
    ),
    SwitchCase(
        "c_spreads",
        "only both leaves hold it until after T: it starts spread T after its submission",
        (Blocker("gpu01", 3), Blocker("gpu03", 3)),
        Ask(2, 2),
        30,
    ),
    SwitchCase(
        "d_reserves",
        "as b (gpu03's blocker ends at 15 s); a 1 x 4 job behind it fits now only on gpu04",
        (Blocker("gpu01", 3), Blocker("gpu02", 1), Blocker("gpu03", 3, sleep_s=15, limit_min=1)),
        Ask(2, 2),
        40,
        later=Ask(1, 4, limit_min=5),
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One job's start: seconds after the case's job was submitted (None: not started while
    Slurm's part of the case ran), its nodes (names, sorted), the pending reasons seen."""

    start_s: float | None
    nodes: tuple[str, ...]
    reasons: tuple[str, ...] = ()

    def agrees(self, other: Outcome) -> bool:
        if self.start_s is None or other.start_s is None:
            return self.start_s is None and other.start_s is None
        return self.nodes == other.nodes and abs(self.start_s - other.start_s) <= TOLERANCE_S


@dataclass(frozen=True, slots=True)
class SwitchResult:
    """One case: Slurm's outcome and the model's for the job (and the later job, if any)."""

    case: SwitchCase
    free: tuple[int, ...]  # GPUs free per node once the blockers ran
    horizon_s: float  # how long after the job's submission Slurm's part was watched
    slurm: tuple[Outcome, ...]
    model: tuple[Outcome, ...]

    @property
    def agrees(self) -> bool:
        return all(s.agrees(m) for s, m in zip(self.slurm, self.model, strict=True))


def switches_arg(count: int, wait_s: int) -> str:
    """``--switches=count@M:SS``."""
    return f"--switches={count}@{wait_s // 60}:{wait_s % 60:02d}"


def run_cases(
    client: SlurmClient,
    topo: Topology,
    todo: Sequence[SwitchCase] = CASES,
    *,
    tag: str = "lw-switches",
    settle_s: float = 5.0,
) -> list[SwitchResult]:
    """Run every case on Slurm, then the model on the state Slurm had."""
    return [_run_case(client, topo, case, tag, settle_s) for case in todo]


def _run_case(
    client: SlurmClient, topo: Topology, case: SwitchCase, tag: str, settle_s: float
) -> SwitchResult:
    wait_settled(client)
    ids: list[int] = []
    try:
        for b in case.blockers:
            pin = ["-w", b.node, "--nodes=1", f"--gres=gpu:{b.gpus}", "--cpus-per-gpu=2"]
            pin.append(f"--time={b.limit_min}")
            ids.append(sbatch(client, f"{tag}-block", pin, b.sleep_s))
        wait_running(client, ids, 30.0)
        began = {
            int(str(r.get("job_id"))): _number(r.get("start_time")) for r in squeue_jobs(client)
        }
        job = sbatch(client, f"{tag}-job", [*case.job.args(), switches_arg(1, case.wait_s)])
        watched = [job]
        if case.later is not None:
            watched.append(sbatch(client, f"{tag}-later", case.later.args()))
        ids.extend(watched)
        recs, reasons, end = _watch(client, watched, case.wait_s + 15.0, settle_s)
        t0 = _number(recs[job].get("submit_time"))
        starts = [began[i] - t0 for i in ids[: len(case.blockers)]]
        slurm = tuple(_outcome(recs[j], t0, reasons[j]) for j in watched)
        submits = [_number(recs[j].get("submit_time")) - t0 for j in watched]
    finally:
        left = {q.job_id for q in client.queue()}
        for i in ids:
            if i in left:
                client.cancel(i)
    blockers = list(zip(case.blockers, starts, strict=True))
    model = model_outcomes(topo, case, blockers, submits, end - t0)
    return SwitchResult(case, _free(topo, case), end - t0, slurm, model)


def _watch(
    client: SlurmClient, jobs: Sequence[int], timeout_s: float, settle_s: float
) -> tuple[dict[int, dict[str, object]], dict[int, tuple[str, ...]], float]:
    """Poll squeue until every job runs, or the first has run ``settle_s`` (a job behind it
    would have started by then), or ``timeout_s`` passed: the last records by job id, each
    job's pending reasons seen (in order) and when the watch ended (Slurm's clock is the
    host's)."""
    deadline = time.time() + timeout_s
    reasons: dict[int, list[str]] = {j: [] for j in jobs}
    first_ran: float | None = None
    while True:
        now = time.time()
        by_id = {int(str(r.get("job_id"))): r for r in squeue_jobs(client)}
        for j in jobs:
            rec = by_id.get(j)
            if rec is None:
                raise RuntimeError(f"job {j} left the queue")
            reason = str(rec.get("state_reason") or "")
            if job_state(rec) == "PENDING" and reason not in reasons[j]:
                reasons[j].append(reason)
        running = [job_state(by_id[j]) == "RUNNING" for j in jobs]
        if running[0] and first_ran is None:
            first_ran = now
        done = all(running) or (first_ran is not None and now - first_ran >= settle_s)
        if done or now > deadline:
            return by_id, {j: tuple(r) for j, r in reasons.items()}, now
        time.sleep(0.3)


def _number(value: object) -> float:
    """A squeue JSON time (``{"set": .., "number": ..}`` or a plain number)."""
    if isinstance(value, dict):
        value = value.get("number")
    return float(str(value))


def _outcome(rec: dict[str, object], t0: float, reasons: tuple[str, ...]) -> Outcome:
    if job_state(rec) != "RUNNING":
        return Outcome(None, (), reasons)
    nodes = tuple(sorted(expand(str(rec.get("nodes") or ""))))
    return Outcome(_number(rec.get("start_time")) - t0, nodes, reasons)


def _free(topo: Topology, case: SwitchCase) -> tuple[int, ...]:
    free = {n.name: n.gpus for n in topo.nodes}
    for b in case.blockers:
        free[b.node] -= b.gpus
    return tuple(free[n.name] for n in topo.nodes)


def model_outcomes(
    topo: Topology,
    case: SwitchCase,
    blockers: Sequence[tuple[Blocker, float]],
    submits: Sequence[float],
    horizon_s: float,
) -> tuple[Outcome, ...]:
    """The simulator under ``backfill_switches(1, wait_s)`` from the case's state at the job's
    submission (time 0): each blocker running on its node since its start (seconds, relative)
    for its sleep, the job (and the later one) submitted at ``submits``; starts after
    ``horizon_s`` count as not started."""
    index = topo.node_index
    running = []
    for k, (b, start) in enumerate(blockers):
        job = Job(k + 1, start, b.gpus, float(b.sleep_s), nodes=1, time_limit=60.0 * b.limit_min)
        placement = Placement.of([(index[b.node], b.gpus)])
        running.append(RunningJob(job, placement, start, float(b.sleep_s), 1.0, since=start))
    asks = [case.job] if case.later is None else [case.job, case.later]
    jobs = [
        Job(
            100 + k,
            submit,
            ask.nodes * ask.gpus_per_node,
            float(JOB_SLEEP_S),
            nodes=ask.nodes,
            time_limit=60.0 * ask.limit_min,
        )
        for k, (ask, submit) in enumerate(zip(asks, submits, strict=True))
    ]
    sim = Simulator.from_state(
        topo,
        NoContention(),
        time=0.0,
        free_gpus=_free(topo, case),
        pending=[PendingJob(j, j.duration) for j in jobs if j.submit_time <= 0.0],
        running=running,
        arrivals=[j for j in jobs if j.submit_time > 0.0],
    )
    starts: dict[int, tuple[float, Placement]] = {}

    def record(state: ClusterState, decision: Decision) -> None:
        for s in decision.starts:
            starts.setdefault(s.job_id, (state.time, s.placement))

    drive(sim, backfill_switches(1, float(case.wait_s)), on_decision=record)
    names = [n.name for n in topo.nodes]
    out = []
    for j in jobs:
        at = starts.get(j.job_id)
        if at is None or at[0] > horizon_s:
            out.append(Outcome(None, ()))
        else:
            out.append(Outcome(at[0], tuple(sorted(names[n] for n in at[1].nodes))))
    return tuple(out)
