"""``simulate``: a policy over a trace on a simulated cluster, to the end."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Policy, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.records import SimResult


def simulate(
    topology: Topology,
    jobs: Sequence[Job],
    model: ContentionModel,
    policy: Policy,
    config: SimConfig | None = None,
    *,
    running: Sequence[tuple[Job, Placement]] = (),
    on_progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run ``policy`` over ``jobs`` on a simulated cluster to the end.

    ``running``: jobs already running at the start (a warm start; see ``Simulator``); their
    records are in the result like the others'. ``on_progress(finished, total)`` is called
    every few hundred decision points.
    """
    sim = Simulator(topology, jobs, model, config, running=running)
    total = len(jobs) + len(running)

    def tick(state: ClusterState, decision: Decision) -> None:
        if on_progress is not None and sim.events % 500 == 0:
            on_progress(len(sim.records), total)

    drive(sim, policy, on_decision=tick if on_progress else None)
    if on_progress is not None:
        on_progress(len(sim.records), total)
    return SimResult(
        records=sim.records,
        topology=topology,
        events=sim.events,
        wall_s=sim.wall_s,
        policy=policy.name,
    )
