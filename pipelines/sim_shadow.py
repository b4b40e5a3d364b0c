"""The live loop's shadow mode over the simulator instead of Slurm: ``run_shadow`` runs the
loop's own ``DecisionLog`` (decision rows, joins, the ``decisions`` table through its
``Recorder``) with the simulator's clock, while a Slurm-like heuristic schedules the
simulated cluster. As the live loop annotates what squeue shows with the serving package's
run-time predictor, the simulated jobs carry the predictions of one predictor (the
experiment's, else the shadow policy's own)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Policy, Topology
from linkwise.cluster.hostlist import compress
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.store import open_store
from linkwise.deployer.decision_log import DecisionLog
from linkwise.deployer.loop import ServeConfig
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import Observation
from linkwise.deployer.policies import GuardedPolicy, LoadedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder, new_id
from linkwise.models.build import build_policy, pinned, registry_version
from linkwise.pipelines.history import PARTITION
from linkwise.policies.spec import PolicySpec

__all__ = ["SimShadowBackend", "run_shadow"]

LOG = logging.getLogger("linkwise.demo")


class SimShadowBackend:
    """The live loop's shadow mode over the simulator instead of Slurm (a ``Backend``).

    ``observe`` reads the simulator (pending jobs are the ones the shadow policy may start);
    ``apply`` records through the live loop's own ``DecisionLog`` (decision rows, joins with
    what "Slurm" did, the ``decisions`` table through the ``Recorder``), its clock the
    simulator's; ``advance`` lets ``scheduler`` (the Slurm-like heuristic) act on the
    simulator, then moves it to its next event. Nothing the shadow policy decides changes
    the simulation."""

    def __init__(
        self,
        sim: Simulator,
        scheduler: Policy,
        config: ServeConfig,
        policy: GuardedPolicy,
        recorder: Recorder,
        metrics: ServeMetrics,
        *,
        cluster: str,
        logger: logging.Logger = LOG,
    ) -> None:
        self.sim = sim
        self.scheduler = scheduler
        self.cfg = config
        self.policy = policy
        self.metrics = metrics
        self.run_id = new_id()
        self.decisions = DecisionLog(
            recorder,
            metrics,
            self.run_id,
            "shadow",
            cluster,
            config.partitions,
            logger,
            clock=lambda: sim.time,
            finished=self._finished,
        )
        self.cycle_id = 0
        self.cycles_ok = 0
        self.slurm_starts = 0
        self.obs: Observation | None = None

    def start(self) -> None:
        """Pick up unjoined decisions of earlier runs in the same store."""
        self.decisions.load_awaiting()

    def observe(self) -> ClusterState:
        """The simulator's state, and the loop's ``Observation`` of it."""
        self.cycle_id += 1
        state = self.sim.observe()
        topo = self.sim.topology
        managed = {
            p.job.job_id: QueuedJob(
                p.job.job_id, p.job.name, p.job.user, PARTITION, "PENDING", "Priority",
                p.job.submit_time, None, None, 0, p.job.num_gpus, (), False,
            )
            for p in state.pending
        }  # fmt: skip
        started = {
            r.job.job_id: (
                r.start_time,
                compress(topo.nodes[i].name for i in r.placement.nodes),
            )
            for r in state.running
        }
        self.obs = Observation(
            state=state,
            managed=managed,
            shapes={},
            no_gpu=(),
            refused={},
            running_ids=frozenset(started),
            started=started,
            held_total=0,
        )
        self.metrics.pending_jobs.set(len(state.pending))
        return state

    def apply(self, decision: Decision) -> None:
        """Record what the shadow policy would do (nothing is applied)."""
        if self.obs is None:
            raise RuntimeError("apply before observe")
        info = self.policy.last
        self.decisions.record(self.cycle_id, self.obs, decision, info, self.sim.topology, {})
        self.cycles_ok += 1

    def _finished(self, ids: Sequence[int]) -> list[tuple[int, float, str]]:
        """Jobs that started and ended between two observations (the simulator's records)."""
        want = set(ids)
        return [(r.job.job_id, r.first_start, "") for r in self.sim.records if r.job.job_id in want]

    def advance(self) -> bool:
        """Slurm (the scheduler) acts, then the simulator moves to its next event."""
        if self.cfg.max_cycles is not None and self.cycles_ok >= self.cfg.max_cycles:
            return False
        decision = self.scheduler.decide(self.sim.observe())
        self.slurm_starts += len(decision.starts)
        self.sim.apply(decision)
        return self.sim.advance()


def _shadow_loader(spec: PolicySpec, tracking_uri: str, model: AnalyticModel) -> LoadedPolicy:
    """The registry model behind ``model:ALIAS`` with its registry version as provenance
    (what ``deployer.promote.shadow_evidence`` selects the decision log by)."""
    fixed = pinned(spec, tracking_uri)
    version = registry_version(fixed, tracking_uri)
    policy = build_policy(fixed, model, tracking_uri=tracking_uri)
    obs = getattr(getattr(policy, "spec", None), "version", "")
    return LoadedPolicy(policy, spec.label, str(version), str(obs))


def run_shadow(
    db: str | Path,
    jobs: Sequence[Job],
    topology: Topology,
    *,
    spec: PolicySpec,
    tracking_uri: str,
    cluster: str,
    state_dir: str | Path,
    scheduler: PolicySpec | None = None,
    max_cycles: int = 200,
    calibration: str | None = None,
    seed: int = 0,
    predictor: RuntimePredictor | None = None,
) -> dict[str, Any]:
    """Run the shadow loop (``spec``: ``model:ALIAS``) against the simulator over ``jobs``
    scheduled by ``scheduler`` (None: ``backfill``); a summary (cycles, decision rows,
    joined starts). The jobs without run-time predictions are annotated by ``predictor``
    (None: the shadow policy's package predictor, as the live loop does)."""
    cal = load_calibration(calibration)
    model = AnalyticModel(cal)
    scheduler = scheduler or PolicySpec.parse("backfill")
    loaded: LoadedPolicy | None = None
    if predictor is None:
        try:
            loaded = _shadow_loader(spec, tracking_uri, model)
        except Exception:  # the holder falls back to the scheduler and says why
            loaded = None
        found = getattr(loaded.policy, "predictor", None) if loaded is not None else None
        predictor = found if isinstance(found, RuntimePredictor) else None
    profiled = ensure_predicted(assign_profiles(jobs, cal, seed=seed), predictor)
    sim = Simulator(topology, profiled, model)
    cfg = ServeConfig(
        mode="shadow",
        partitions=(PARTITION,),
        policy=spec,
        fallback=scheduler,
        db=str(db),
        state_dir=str(state_dir),
        max_cycles=max_cycles,
        watchdog=False,
    )
    metrics = ServeMetrics()
    holder = PolicyHolder(
        spec,
        scheduler,
        metrics=metrics,
        logger=LOG,
        loader=lambda s: (
            loaded if loaded is not None and s == spec else _shadow_loader(s, tracking_uri, model)
        ),
        probe=lambda _s: "fixed",
    )
    guarded = GuardedPolicy(holder, metrics, LOG)
    recorder = Recorder(str(db), cfg.spool_path, logger=LOG)
    backend = SimShadowBackend(
        sim, scheduler.build(), cfg, guarded, recorder, metrics, cluster=cluster
    )
    backend.start()
    t0 = time.perf_counter()
    drive(backend, guarded)
    seconds = time.perf_counter() - t0
    with closing(open_store(db)) as con:
        row = con.execute(
            "SELECT count(*), count(DISTINCT cycle_id), count(*) FILTER (action = 'start'), "
            "count(actual_start), min(ts), max(ts) FROM decisions WHERE run_id = ?",
            [backend.run_id],
        ).fetchone()
    assert row is not None
    return {
        "run_id": backend.run_id,
        "policy": spec,
        "model_version": holder.active.model_version,
        "fallback_reason": holder.fallback_reason,
        "cycles": backend.cycles_ok,
        "decisions": int(row[0]),
        "decision_cycles": int(row[1]),
        "shadow_starts": int(row[2]),
        "joined_starts": int(row[3]),
        "slurm_starts": backend.slurm_starts,
        "since": row[4],
        "until": row[5],
        "spooled": recorder.spooled(),
        "seconds": seconds,
    }
