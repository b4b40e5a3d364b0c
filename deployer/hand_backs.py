"""What the live loop lets go of during a cycle, each release audited (``release.release_held``).

``HandBacks`` remembers which jobs the loop released itself (so a tagged job found no longer
held that it did not release is a bypass) and which held jobs changed partition, and hands
back: jobs the loop will not place (no GPUs, never fits, not modelled, a shape or split the
policy did not give, a start that would widen the request, held over ``max_hold_s``, a
partition change), each with its reason counted (``linkwise_serve_handed_back{reason}``);
released jobs Slurm cannot run on their node list (their node list cleared); tagged jobs no
longer held (untagged; bypasses counted); and, on a Slurm read fault, the jobs the last good
read showed held for the loop (``fault_hand_back``). Each method returns how many jobs it met,
which makes the cycle one worth a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from linkwise.cluster.hostlist import compress
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.deployer.events import log_event
from linkwise.deployer.holds import HOLD_TAG, held_for_loop
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import Observation
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.release import release_held
from linkwise.deployer.scontrol import clear_nodes_command, untag_command

__all__ = ["HandBacks", "fault_hand_back"]


def fault_hand_back(
    queue: Sequence[QueuedJob], partitions: Sequence[str], released: Collection[int]
) -> list[QueuedJob]:
    """The jobs a Slurm read fault hands back: held for the loop in the last good read,
    every partition of theirs one of the loop's, and not released by the loop already."""
    mine = set(partitions)
    return [
        q
        for q in queue
        if held_for_loop(q) and set(q.partition.split(",")) <= mine and q.job_id not in released
    ]


@dataclass
class HandBacks:
    """The loop's releases of held jobs and what it remembers between cycles for them."""

    client: SlurmClient
    recorder: Recorder
    metrics: ServeMetrics
    log: logging.Logger
    run_id: str
    max_hold_s: float
    released_ids: set[int] = field(default_factory=set)  # released by this loop (not bypasses)
    partition_of: dict[int, str] = field(default_factory=dict)  # held -> its partition seen
    moved: list[QueuedJob] = field(default_factory=list)  # held, partition changed (a cycle)
    moved_ids: set[int] = field(default_factory=set)  # counted already

    def unplaced(
        self,
        obs: Observation,
        over: set[int],
        reshaped: Sequence[tuple[QueuedJob, str]],
        version: str,
        cycle_id: int,
        widened: Sequence[tuple[QueuedJob, str]] = (),
    ) -> int:
        """Release unchanged (no node list) the held jobs the loop will not place, each with
        its reason logged and counted (``linkwise_serve_handed_back{reason}``)."""
        out: dict[int, tuple[QueuedJob, str, str]] = {}
        for q in obs.no_gpu:
            if q.job_id in obs.refused:
                kind = obs.kinds.get(q.job_id, "never_fits")
                label = "can never fit" if kind == "never_fits" else "left to Slurm"
                out[q.job_id] = (q, kind, f"{label}: {obs.refused[q.job_id]}")
            else:
                out[q.job_id] = (q, "no_gpu", "no GPUs requested")
        for q, why in reshaped:
            if why.startswith("split"):  # Slurm would split its GPUs otherwise on those nodes
                out[q.job_id] = (q, "split", f"Slurm would not give the policy's split ({why})")
            else:
                out[q.job_id] = (q, "shape", f"the policy did not give its shape ({why})")
        for q, why in widened:
            out[q.job_id] = (q, "widen", f"the start would change its request ({why})")
        for j in sorted(over):
            out.setdefault(j, (obs.managed[j], "max_hold", f"held over {self.max_hold_s:g} s"))
        for q in self.moved:
            if q.held and q.job_id not in out:
                out[q.job_id] = (q, "partition_changed", f"partition changed to {q.partition}")
        if not out:
            return 0
        for q, kind, reason in out.values():
            self.metrics.handed_back.labels(kind).inc()
            log_event(self.log, "handing_to_slurm", job_id=q.job_id, reason=reason, kind=kind)
        self.released_ids.update(out)
        release_held(
            self.client,
            [q for q, _, _ in out.values()],
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=cycle_id,
            actor="loop:unmanaged",
            model_version=version,
            logger=self.log,
        )
        return len(out)

    def unstrand(self, obs: Observation, version: str, cycle_id: int) -> int:
        """Clear the node list of jobs the loop released that Slurm reports it cannot run
        there (BadConstraints, ReqNodeNotAvail, ...): Slurm then places them itself."""
        if not obs.stranded:
            return 0
        for q in obs.stranded:
            self.metrics.unstranded.inc()
            log_event(
                self.log,
                "unstranding",
                logging.WARNING,
                job_id=q.job_id,
                reason=q.reason,
                nodes=compress(q.req_nodes),
            )
        release_held(
            self.client,
            obs.stranded,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=cycle_id,
            actor="loop:unstrand",
            model_version=version,
            logger=self.log,
            command=clear_nodes_command,
        )
        return len(obs.stranded)

    def untag(self, obs: Observation, model_version: str, cycle_id: int) -> int:
        """End the claim on tagged jobs no longer held; count those the loop did not release
        (bypasses: released by someone else, e.g. by their user while no live loop held)."""
        known = {q.job_id for q in obs.bypassed}
        # moved out of the managed partitions and released there: counted when seen moved
        gone = [*obs.bypassed, *(q for q in self.moved if not q.held and q.job_id not in known)]
        if not gone:
            return 0
        others = [
            q
            for q in obs.bypassed
            if q.job_id not in self.released_ids and q.job_id not in self.moved_ids
        ]
        for q in others:
            self.metrics.hold_bypasses.inc()
            log_event(self.log, "hold_bypassed", logging.WARNING, job_id=q.job_id, user=q.user)
        release_held(
            self.client,
            gone,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=cycle_id,
            actor="loop:untag",
            model_version=model_version,
            logger=self.log,
            command=untag_command,
        )
        return len(gone)

    def on_fault(self, jobs: Sequence[QueuedJob], kind: str, cycle_id: int) -> list[int]:
        """Release ``jobs`` unchanged after a Slurm read fault; each one released is counted
        once."""
        for q in jobs:
            log_event(
                self.log, "handing_to_slurm", job_id=q.job_id, reason=f"slurm {kind} fault",
                kind="slurm_fault",
            )  # fmt: skip
        released = release_held(
            self.client,
            jobs,
            recorder=self.recorder,
            run_id=self.run_id,
            cycle_id=cycle_id,
            actor="loop:slurm_fault",
            model_version="",
            logger=self.log,
        )
        self.metrics.handed_back.labels("slurm_fault").inc(len(released))
        self.released_ids.update(released)
        return released

    def partition_changes(self, queue: Sequence[QueuedJob], obs: Observation) -> int:
        """Note the jobs held for the loop whose partition someone changed since the loop saw
        them (a way out of the loop's hold that job_submit.lua refuses while a loop is live):
        counted as bypasses once, then handed back (still held) or untagged (``moved``)."""
        found = {q.job_id: q for q in obs.partition_moved}
        for q in queue:
            was = self.partition_of.get(q.job_id)
            if was is not None and q.partition != was and q.admin_comment == HOLD_TAG:
                found.setdefault(q.job_id, q)
        for q in found.values():
            self.partition_of.pop(q.job_id, None)
            if q.job_id in self.moved_ids:
                continue
            self.moved_ids.add(q.job_id)
            self.metrics.hold_bypasses.inc()
            self.metrics.partition_changes.inc()
            log_event(
                self.log,
                "hold_bypassed",
                logging.WARNING,
                job_id=q.job_id,
                user=q.user,
                how="partition changed",
                partition=q.partition,
            )
        for j, q in obs.managed.items():
            self.partition_of[j] = q.partition
        in_queue = {q.job_id for q in queue}
        for j in [j for j in self.partition_of if j not in in_queue]:
            del self.partition_of[j]
        self.moved_ids &= in_queue
        self.moved = [q for q in found.values() if q.state in ("PENDING", "RUNNING")]
        return len(found)
