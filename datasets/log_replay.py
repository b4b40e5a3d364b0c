"""The mutable replay of one cluster's accounting log (``LogReplay``), what
``datasets.decisions.build_log_transitions`` drives event by event: the state (pending,
running on their real placements, free GPUs), the steps and rewards into a
``TransitionBuffer``, episodes cut at idle periods and window boundaries, and its counts;
the events of a log in replay order (``log_events``) and the window cuts (``window_cuts``)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
    Topology,
)
from linkwise.cluster.mdp import (
    Candidates,
    ObsSpec,
    StepMatch,
    apply_start,
    candidates,
    contention_term,
    encode,
    match_start,
    step_reward,
)
from linkwise.datasets.transitions import TransitionBuffer

__all__ = ["END", "START", "SUBMIT", "LogReplay", "ReplayCounts", "log_events", "window_cuts"]

END, SUBMIT, START = 0, 1, 2  # event order at one instant


def log_events(jobs: pl.DataFrame) -> pl.DataFrame:
    """(t, kind, i) rows in replay order: time, then end < submit < start, then canonical."""
    idx = pl.int_range(pl.len(), dtype=pl.Int64).alias("i")
    base = jobs.select(idx, "submit", "job_id", "start", "end")
    parts = [
        base.select(
            pl.col(col).alias("t"),
            pl.lit(kind, dtype=pl.Int8).alias("kind"),
            "i",
            "submit",
            "job_id",
        )
        for col, kind in (("end", END), ("submit", SUBMIT), ("start", START))
    ]
    return pl.concat(parts).sort("t", "kind", "submit", "job_id").select("t", "kind", "i")


def window_cuts(lo: float, hi: float, window_s: float | None) -> list[float]:
    """The window boundaries strictly inside ``(lo, hi)`` every ``window_s`` from ``lo``."""
    if window_s is None or not math.isfinite(lo) or not math.isfinite(hi):
        return []
    n = math.ceil((hi - lo) / window_s)
    return [lo + k * window_s for k in range(1, n) if lo + k * window_s < hi]


@dataclass
class ReplayCounts:
    """What a replay counted: starts by match, waits, decision points, dropped starts."""

    starts: int = 0
    exact: int = 0
    nearest: int = 0
    unslotted: int = 0
    waits: int = 0
    decision_points: int = 0
    overlap: float = 0.0
    dropped: int = 0
    matches: list[tuple[int, str, float]] = field(default_factory=list)
    actions: Counter[int] = field(default_factory=Counter)


class LogReplay:
    """The mutable replay of one cluster's log: state, episodes and the buffer."""

    def __init__(
        self,
        topology: Topology,
        spec: ObsSpec,
        model: ContentionModel,
        cluster: str,
        episode_gap_s: float,
    ) -> None:
        self.topo = topology
        self.spec = spec
        self.cfg = spec.config
        self.model = model
        self.cluster = cluster
        self.gap = episode_gap_s
        self.buf = TransitionBuffer(obs_spec_version=spec.version)
        self.free = [n.gpus for n in topology.nodes]
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.now = -math.inf
        self.idle_since = -math.inf
        self.episode = ""
        self.episode_steps = 0
        self.episodes = 0
        self.names: Counter[str] = Counter()
        self.counts = ReplayCounts()

    # -- state

    @property
    def in_system(self) -> int:
        return len(self.pending) + len(self.running)

    def state(self, t: float) -> ClusterState:
        return ClusterState(
            time=t,
            topology=self.topo,
            free_gpus=tuple(self.free),
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
        )

    def end(self, job_id: int) -> None:
        run = self.running.pop(job_id, None)
        if run is None:  # dropped as overcommitted
            return
        for node, g in run.placement.alloc:
            self.free[node] += g
        if not self.in_system:
            self.idle_since = self.now

    def submit(self, job: Job) -> None:
        self.pending[job.job_id] = PendingJob(job=job, remaining_s=job.duration)

    def feasible(self, placement: Placement) -> bool:
        return all(self.free[n] >= g for n, g in placement.alloc)

    def occupy(self, run: RunningJob) -> None:
        del self.pending[run.job.job_id]
        for node, g in run.placement.alloc:
            self.free[node] -= g
        self.running[run.job.job_id] = run

    def drop(self, job_id: int) -> None:
        """A start the state cannot hold (GPUs over-committed): the job leaves the replay."""
        del self.pending[job_id]
        self.counts.dropped += 1
        if not self.in_system:
            self.idle_since = self.now

    def silent_start(self, start: Start) -> None:
        """A start before the window: no step, same bookkeeping as ``apply_start``."""
        if not self.feasible(start.placement):
            self.drop(start.job_id)
            return
        pj = self.pending[start.job_id]
        rate = self.model.rates(self.topo, [(pj.job, start.placement)])[0]
        self.occupy(
            RunningJob(
                job=pj.job,
                placement=start.placement,
                start_time=self.now,
                remaining_s=pj.remaining_s,
                rate=rate,
                attained_gpu_s=pj.attained_gpu_s,
                since=self.now,
            )
        )

    # -- time, rewards and episodes

    def advance(self, t: float) -> None:
        """Let time pass to ``t``, crediting the jobs-in-system integral to the last step."""
        if t <= self.now:
            return
        n = self.in_system
        if n and self.episode_steps:
            contention = 0.0
            if self.cfg.contention_weight > 0:
                contention = contention_term(self.state(self.now), t - self.now, self.cfg)
            self.buf.add_reward(step_reward(self.now, t, n, contention, self.cfg))
        self.now = t

    def close(self) -> None:
        """End the current episode: terminal if nothing is left in the system, else a cut."""
        if self.episode_steps:
            self.buf.end_episode(terminal=self.in_system == 0)
        self.episode_steps = 0
        self.episode = ""

    def cut(self, t: float, *, observe: bool) -> None:
        """A window boundary: credit time up to ``t``, end the episode (timeout if jobs are
        in the system), and observe the state at ``t`` to open the next one."""
        self.advance(t)
        self.close()
        if observe:
            self.observe_wait()

    def idle_for(self, t: float) -> float:
        """How long the system has been empty at ``t`` (-inf when jobs are in it or no episode
        is open)."""
        if self.in_system or not self.episode_steps:
            return -math.inf
        return t - self.idle_since

    def _episode_name(self, t: float) -> str:
        base = f"log/{self.cluster}/{math.floor(t)}"
        self.names[base] += 1
        k = self.names[base]
        return base if k == 1 else f"{base}.{k - 1}"

    def add_step(self, cands: Candidates, m: StepMatch) -> None:
        if not self.episode_steps:
            self.episode = self._episode_name(self.now)
            self.episodes += 1
        self.buf.add(
            episode=self.episode,
            step=self.episode_steps,
            time=self.now,
            obs=encode(cands, self.spec),
            action=m.action,
            reward=0.0,
            mask=cands.mask,
            source="log",
            behaviour="slurm",
            match=m.kind,
        )
        self.episode_steps += 1
        self.counts.actions[m.action] += 1

    def _wait_match(self, cands: Candidates) -> StepMatch:
        if cands.mask[: self.cfg.wait_action].any():
            self.counts.waits += 1
        return StepMatch(self.cfg.wait_action, None, "wait", 1.0)

    def decide(self, starts: list[Start]) -> None:
        """One decision point: the starts at this instant as steps, then wait. Unslotted
        starts are applied and counted without a step; if no start made a step, the instant
        ends like an event without starts (``observe_wait``)."""
        c = self.counts
        state = self.state(self.now)
        stepped = False
        for start in starts:
            if not self.feasible(start.placement):
                self.drop(start.job_id)
                state = self.state(self.now)
                continue
            cands = candidates(state, self.cfg, self.model)
            m = match_start(cands, start)
            c.starts += 1
            if m is None:
                c.unslotted += 1
                c.matches.append((start.job_id, "unslotted", 0.0))
            else:
                c.matches.append((start.job_id, m.kind, m.overlap))
                if m.kind == "exact":
                    c.exact += 1
                else:
                    c.nearest += 1
                    c.overlap += m.overlap
                self.add_step(cands, m)
                stepped = True
            state = apply_start(state, start, self.model)
            self.occupy(state.running[-1])
        if stepped:
            c.decision_points += 1
            cands = candidates(state, self.cfg, self.model)
            self.add_step(cands, self._wait_match(cands))
        else:
            self.observe_wait()

    def observe_wait(self) -> None:
        """An event without starts: a wait step if a start was feasible (or the episode needs a
        first observation)."""
        if not self.in_system:
            return
        must = self.episode_steps == 0
        total_free = sum(self.free)
        slots = list(self.pending.values())[: self.cfg.k_slots]
        if self.cfg.slot_order != "head":
            slots = list(self.pending.values())
        if not must and not any(p.job.num_gpus <= total_free for p in slots):
            return
        cands = candidates(self.state(self.now), self.cfg, self.model)
        if must or cands.mask[: self.cfg.wait_action].any():
            self.add_step(cands, self._wait_match(cands))
