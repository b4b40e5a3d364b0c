"""The live loop's decision log: one ``decisions`` row per start the policy chose (or one
``wait`` row per cycle, and one per request that can never fit), joined later with what
Slurm did (the job's actual start and nodes), each with its explanation when the policy gave
one (``info["explanation"]``, built by ``deployer.explain``: why, recorded at decision time;
``deviated`` whether the policy departed from its base), written through the ``Recorder``
(DuckDB, or its spool while the store is unavailable), counted in the loop's metrics. The
cycle's queue (``explanation["queue"]``) is stored only when it differs from the last one
stored (``explain.queue_key``); an unchanged one is stored as ``null`` and ``explain``
reads the run's latest snapshot instead: a loop idling over a long queue does not store the
queue every cycle.

It takes a clock: the live loop stamps rows with wall time, the shadow demo over the
simulator (``pipelines.sim_shadow``) with simulated time; both run this code. Where a job
went between two observations (started and finished unseen) is asked of ``finished``:
``sacct`` for Slurm, the simulator's records for the demo.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from linkwise.cluster.domain import Decision, Topology
from linkwise.cluster.hostlist import compress
from linkwise.deployer.events import log_event
from linkwise.deployer.explain import queue_key
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import Observation
from linkwise.deployer.recorder import Recorder, new_id

__all__ = ["DecisionLog", "Join"]

Join = tuple[int, float, str]  # job, actual start, actual nodes
JOIN_EVERY = 3  # cycles between lookups of jobs that left unseen
AWAIT_S = 86400.0  # start decisions older than this are no longer joined


def _no_lookup(_ids: Sequence[int]) -> list[Join]:
    return []


def _explained(row: dict[str, Any], why: Mapping[str, Any] | None) -> dict[str, Any]:
    """The row with its explanation (``deployer.explain``) as JSON text and its deviation."""
    if why is None:
        return row
    dev = why.get("deviated")
    return {
        **row,
        "deviated": None if dev is None else bool(dev),
        "explanation": json.dumps(why, sort_keys=True, default=str),
    }


@dataclass
class DecisionLog:
    """Decision rows of one run of the loop, their joins with Slurm, and their metrics."""

    recorder: Recorder
    metrics: ServeMetrics
    run_id: str
    mode: Literal["shadow", "active"]
    cluster: str
    partitions: tuple[str, ...]
    logger: logging.Logger
    clock: Callable[[], float] = time.time
    finished: Callable[[Sequence[int]], list[Join]] = _no_lookup
    awaiting: dict[int, float] = field(default_factory=dict)  # start decisions not yet joined
    reported: set[int] = field(default_factory=set)  # never-fit requests already reported
    stored_queue: tuple[Any, ...] | None = None  # the key of the last queue snapshot stored

    def load_awaiting(self) -> None:
        """Start decisions of earlier runs (the last day) that Slurm has not been seen acting
        on: they are joined when it does."""
        rows = self.recorder.query(
            "SELECT DISTINCT job_id, min(ts) FROM decisions WHERE action = 'start' AND "
            "actual_start IS NULL AND job_id IS NOT NULL AND ts > ? GROUP BY job_id",
            [self.clock() - AWAIT_S],
        )
        for job, ts in rows or []:
            self.awaiting.setdefault(int(job), float(ts))

    def record(
        self,
        cycle_id: int,
        obs: Observation,
        decision: Decision,
        info: Mapping[str, Any],
        topology: Topology,
        results: Mapping[int, str],
    ) -> str:
        """Write this cycle's rows (``results``: what became of each start in active mode)
        and the joins Slurm's state allows; where they went (store or spool)."""
        now = self.clock()
        n_pending = len(obs.state.pending)

        def row(
            job_id: int | None, action: str, nodes: str, gpus: int, note: str
        ) -> dict[str, Any]:
            return self._row(cycle_id, now, job_id, action, nodes, gpus, note, info, n_pending)

        explained, queue = self._snapshot(info.get("explanation") or {})
        rows: list[dict[str, Any]] = []
        for j, why in obs.refused.items():
            if j not in self.reported:
                self._report_infeasible(j, why)
                rows.append(row(j, "wait", "", 0, f"infeasible: {why}"))
        for start in decision.starts:
            names = compress(topology.nodes[n].name for n in start.placement.nodes)
            note = results.get(start.job_id, "shadow")
            r = row(start.job_id, "start", names, start.placement.num_gpus, note)
            rows.append(_explained(r, explained.get(start.job_id)))
            self.awaiting.setdefault(start.job_id, now)
        if not decision.starts:
            r = row(None, "wait", "", 0, str(info.get("note", "")))
            rows.append(_explained(r, explained.get(None)))
        for r in rows:
            self.metrics.decisions.labels(r["action"]).inc()
            if r.get("deviated"):
                self.metrics.deviations.inc()
        joins = self._joins(cycle_id, obs, now)
        where = self.recorder.write(decisions=rows, joins=joins)
        if where != "lost":  # in the store, or the spool the store replays
            self.stored_queue = queue if queue is not None else self.stored_queue
        if where == "store":  # joins go through the store only: kept for a later cycle
            for job, _, _ in joins:
                self.awaiting.pop(job, None)
        return where

    def _snapshot(
        self, explained: Mapping[int | None, Mapping[str, Any]]
    ) -> tuple[Mapping[int | None, Mapping[str, Any]], tuple[Any, ...] | None]:
        """The cycle's explanations, the queue left out (``null``) where it is the last one
        stored; and the key of the cycle's queue (None: the cycle has none)."""
        for k, why in explained.items():
            if why.get("queue") is not None:  # the cycle's first row holds it
                key = queue_key(why["queue"])
                if key == self.stored_queue:
                    return {**explained, k: {**why, "queue": None}}, key
                return explained, key
        return explained, None

    def _row(
        self,
        cycle_id: int,
        now: float,
        job_id: int | None,
        action: str,
        nodes: str,
        gpus: int,
        note: str,
        info: Mapping[str, Any],
        n_pending: int,
    ) -> dict[str, Any]:
        return {
            "decision_id": new_id(),
            "run_id": self.run_id,
            "cycle_id": cycle_id,
            "ts": now,
            "mode": self.mode,
            "cluster": self.cluster,
            "partition": ",".join(self.partitions),
            "policy": str(info.get("policy", "")),
            "model_version": str(info.get("model_version", "")),
            "obs_spec_version": str(info.get("obs_spec_version", "")),
            "job_id": job_id,
            "action": action,
            "nodes": nodes,
            "gpus": gpus,
            "latency_ms": float(info.get("latency_ms", 0.0)),
            "n_pending": n_pending,
            "note": note,
        }

    def _report_infeasible(self, job_id: int, why: str) -> None:
        self.reported.add(job_id)
        log_event(
            self.logger,
            "infeasible_request",
            logging.WARNING,
            job_id=job_id,
            reason=why,
            action="released unchanged to Slurm, not started",
        )

    def _joins(self, cycle_id: int, obs: Observation, now: float) -> list[Join]:
        """(job, actual start, actual nodes) for start decisions Slurm has acted on."""
        joins = [(j, *obs.started[j]) for j in self.awaiting if j in obs.started]
        gone = [j for j in self.awaiting if j not in obs.started and j not in obs.managed]
        pending = {p.job.job_id for p in obs.state.pending}
        gone = [j for j in gone if j not in pending][:500]
        if gone and cycle_id % JOIN_EVERY == 0:
            joins += self.finished(gone)
        for j in [j for j, t in self.awaiting.items() if t < now - AWAIT_S]:
            del self.awaiting[j]
        return joins
