"""A simulated accounting history, shared by tests and benchmarks (as
``linkwise.testkit.history``): synthetic Philly-like jobs scheduled by a heuristic in the
simulator, written as the settled ``JobRun`` rows Slurm would report for them."""

from __future__ import annotations

from collections.abc import Mapping

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Placement, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.slurm.records import JobRun
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.synthetic import generate
from linkwise.policies.heuristics import make_policy

T0 = 1.7e9  # the history's epoch offset (simulated time 0)


def completed_run(
    job_id: int,
    submit: float,
    start: float,
    end: float,
    nodes: Mapping[str, int],
    *,
    cluster: str = "c",
    name: str | None = None,
) -> JobRun:
    """A settled, completed first run as accounting reports it: ``nodes`` maps node names
    to the GPUs it took there."""
    return JobRun(
        cluster=cluster,
        job_id=job_id,
        run_index=0,
        name=f"j{job_id}" if name is None else name,
        user="u",
        account="a",
        partition="gpu",
        state="COMPLETED",
        exit_code=0,
        signal=None,
        submit_time=submit,
        start_time=start,
        end_time=end,
        time_limit_s=None,
        nodes=tuple(nodes),
        gpus=sum(nodes.values()),
        gpus_per_node=tuple(nodes.values()),
        allocation_nodes=len(nodes),
        settled=True,
    )


def simulated_history(
    n_jobs: int,
    *,
    topology: str,
    seed: int,
    max_gpus: int,
    load_scale: float,
    policy: str = "best_fit",
    cluster: str = "sim",
) -> tuple[list[JobRun], Topology, AnalyticModel]:
    """``n_jobs`` generated jobs (profiles drawn with the same ``seed``) run under ``policy``
    on the ``topology`` spec with the default calibration: one completed ``JobRun`` per job
    (Slurm job id = simulated id + 1, times offset by ``T0``, its placement's nodes), the
    topology and the contention model."""
    cal = load_calibration()
    topo = from_spec(topology)
    model = AnalyticModel(cal)
    jobs = assign_profiles(
        generate(n_jobs, seed=seed, max_gpus=max_gpus, load_scale=load_scale), cal, seed=seed
    )
    sim = Simulator(topo, jobs, model)
    placed: dict[int, Placement] = {}

    def capture(state: ClusterState, decision: Decision) -> None:
        placed.update((s.job_id, s.placement) for s in decision.starts)

    drive(sim, make_policy(policy), on_decision=capture)
    runs = []
    for r in sim.records:
        pl = placed[r.job.job_id]
        nodes = {topo.nodes[n].name: g for n, g in pl.alloc}
        runs.append(
            completed_run(
                r.job.job_id + 1,
                T0 + r.job.submit_time,
                T0 + r.first_start,
                T0 + r.end,
                nodes,
                cluster=cluster,
                name=f"j{r.job.job_id}",
            )
        )
    return runs, topo, model
