"""The learned policy's fast decision path (issue 23 item 4) decides exactly as the plain
stepping loop: on a seeded, queueing workload every decision point of a simulation of each
shipped package is decided twice, by ``LearnedPolicy.decide`` and by a reference loop that
builds the candidates at every step and scores them with the network under ``no_grad`` and
torch's own thread count, and the decisions must be equal. Not a timed test (timings:
``benchmarks/learned_speed.py``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.mdp import (
    action_mask,
    apply_decision,
    candidates,
    decode,
    encode,
    local_grace,
    nothing_fits,
)
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.prediction import annotate_state
from linkwise.datasets.traces import load_trace
from linkwise.models.learned import LearnedPolicy, load_package

PRETRAINED = Path(__file__).resolve().parents[2] / "models" / "pretrained"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "packages" / "cql-rows"  # plain CQL


def _trace(path: Path, n: int, seed: int) -> Path:
    """A native trace of ``n`` jobs arriving faster than a 16x8 cluster serves them."""
    rng = random.Random(seed)
    lines = ["job_id,submit_time,num_gpus,duration,user,name"]
    for i in range(n):
        user = rng.choice(["ann", "ben", "cat"])
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        base = {"ann": 900, "ben": 5400, "cat": 14000}[user]
        lines.append(f"{i},{1_000_000 + i * 60},{gpus},{base * rng.uniform(0.5, 2):.0f},{user},m")
    path.write_text("\n".join(lines) + "\n")
    return path


def _reference(policy: LearnedPolicy, state: ClusterState) -> Decision:
    """The plain stepping loop: candidates at every step, the network under ``no_grad``."""
    state = annotate_state(state, policy.predictor)
    cfg = policy.spec.config
    starts: list[Start] = []
    preempt: list[int] = []
    migrate: list[Start] = []
    s = state
    while True:
        c = candidates(s, cfg, policy.model)
        if not c.mask[: cfg.wait_action].any():
            break
        obs = encode(c, policy.spec)
        with torch.no_grad():
            values = policy.network(torch.from_numpy(obs[None, :])).numpy()[0]
        a, _ = policy._choose(values, obs, action_mask(c))
        if a == cfg.wait_action:
            break
        d = decode(c, a)
        starts += d.starts
        preempt += d.preempt
        migrate += d.migrate
        s = apply_decision(s, d, policy.model, local_grace(cfg))
    return Decision(starts=tuple(starts), preempt=tuple(preempt), migrate=tuple(migrate))


class _Both:
    """Decides every decision point by both paths and records both."""

    def __init__(self, policy: LearnedPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.pairs: list[tuple[Decision, Decision]] = []
        self.skipped = 0

    def decide(self, state: ClusterState) -> Decision:
        reference = _reference(self.policy, state)
        fast = self.policy.decide(state)
        self.skipped += nothing_fits(state, self.policy.spec.config)
        self.pairs.append((fast, reference))
        return fast


@pytest.mark.parametrize("setting", ["philly-all", "philly-multigpu", "cql-rows"])
def test_fast_decisions_equal_the_plain_stepping_loop(setting: str, tmp_path: Path) -> None:
    topo = load_topology("16x8,leaf=4")
    cal = load_calibration()
    model = AnalyticModel(cal)
    package = FIXTURE if setting == "cql-rows" else PRETRAINED / setting
    policy = load_package(package, model=model)
    assert policy.predictor is not None
    jobs = assign_profiles(
        load_trace(_trace(tmp_path / "t.csv", 160, 3), "native").jobs, cal, seed=0
    )
    both = _Both(policy)
    simulate(topo, list(policy.predictor.annotate(jobs)), model, both)
    assert len(both.pairs) > 100
    assert sum(1 for fast, _ in both.pairs if fast.starts) > 50  # the policy really decides
    if not policy.spec.config.running_slots:  # with running rows it never skips
        assert both.skipped > 0  # the shortcut (nothing fits: no candidates built) was taken
    mismatched = [i for i, (fast, ref) in enumerate(both.pairs) if fast != ref]
    assert not mismatched, f"{len(mismatched)} decision points differ, first {mismatched[0]}"


def test_scoring_restores_torch_threads() -> None:
    policy = load_package(PRETRAINED / "philly-all")
    policy.numpy_net = None  # the torch path (tests/models/test_numpy_net.py: the numpy one)
    before = torch.get_num_threads()
    obs = np.zeros((1, policy.spec.dim), dtype=np.float32)
    expected: Any
    with torch.no_grad():
        expected = policy.network(torch.from_numpy(obs)).numpy()
    assert np.array_equal(policy.action_values(obs), expected)
    assert torch.get_num_threads() == before
