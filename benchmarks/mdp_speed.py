"""Speed of the decision problem: candidates + mask + encode latency, and env steps per second.

Latency: a 128x8 cluster (16 nodes per leaf) with a deep queue. Synthetic Philly-like jobs
(calibrated profiles) arrive within the first hour; a seeded random policy (random
generator placements, so many jobs are split across nodes and contend) starts some of
them at every decision point. At each decision point with at least ``--min-pending``
jobs pending the script times ``candidates`` + ``action_mask`` + ``encode`` (one
state, cold memo tables).

Env: ``ClusterEnv`` episodes on a 64x8 cluster with random allowed actions (steps/s,
including the simulator).

    .venv/bin/python benchmarks/mdp_speed.py [--points 400] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from linkwise.cluster.domain import Job

WORKLOADS = ("philly", "wide")


def _predicted(jobs: Sequence[Job], seed: int) -> tuple[Job, ...]:
    """``jobs`` annotated by a run-time predictor fit on another synthetic trace (the encoder
    reads predictions, never the true run time)."""
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.synthetic import generate

    return RuntimePredictor.fit(generate(2000, seed=seed + 10_000)).annotate(jobs)


def latency(
    points: int,
    min_pending: int,
    seed: int,
    wide: bool,
    slot_order: str = "head",
    k_slots: int = 8,
) -> dict[str, float]:
    """Time candidates + mask + encode on deep-queue states of a 128x8 cluster.

    ``wide``: GPU counts drawn uniformly from 1..32 (powers of two) instead of Philly's
    (mostly single-GPU) mix, so many running jobs are split and contend."""
    from linkwise.cluster import mdp
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator.engine import Simulator
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.synthetic import generate
    from linkwise.policies.heuristics import make_policy

    cal = load_calibration()
    topo = from_spec("128x8,leaf=16")
    raw = generate(4000, seed=seed, max_gpus=topo.total_gpus)
    if wide:
        sizes = np.random.default_rng(seed).choice([1, 2, 4, 8, 16, 32], size=len(raw))
        raw = tuple(
            replace(j, num_gpus=int(g), duration=j.duration / g)
            for j, g in zip(raw, sizes, strict=True)
        )
    # compress arrivals into the first hour so the queue builds up behind a full cluster
    last = max(j.submit_time for j in raw) or 1.0
    jobs = _predicted(
        assign_profiles(
            [replace(j, submit_time=j.submit_time / last * 3600.0) for j in raw], cal, seed=seed
        ),
        seed,
    )
    spec = mdp.make_spec(mdp.MdpConfig(k_slots=k_slots, slot_order=slot_order))
    policy = make_policy("random", seed=seed, start_prob=0.3)
    sim = Simulator(topo, jobs, AnalyticModel(cal))
    times: list[float] = []
    pending: list[int] = []
    running: list[int] = []
    split: list[int] = []
    while len(times) < points:
        state = sim.observe()
        if len(state.pending) >= min_pending:
            model = AnalyticModel(cal)  # cold memo tables: the worst case of a live loop
            t0 = time.perf_counter()
            cands = mdp.candidates(state, spec.config, model)
            mask = mdp.action_mask(cands)
            obs = mdp.encode(cands, spec)
            times.append(time.perf_counter() - t0)
            assert obs.shape == (spec.dim,) and mask.any()
            pending.append(len(state.pending))
            running.append(len(state.running))
            split.append(sum(1 for r in state.running if r.placement.num_nodes > 1))
        sim.apply(policy.decide(state))
        if not sim.advance():
            break
    ms = np.array(times) * 1e3
    return {
        "states": float(len(times)),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "pending_median": float(np.median(pending)),
        "running_median": float(np.median(running)),
        "split_running_median": float(np.median(split)),
        "obs_dim": float(spec.dim),
    }


def env_speed(
    episodes: int, seed: int, slot_order: str = "head", k_slots: int = 8
) -> dict[str, float]:
    """Steps per second of ClusterEnv with random allowed actions on a 64x8 cluster."""
    from linkwise.cluster import mdp
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.env import ClusterEnv, Workload
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.synthetic import generate

    cal = load_calibration()
    topo = from_spec("64x8,leaf=16")
    model = AnalyticModel(cal)

    def factory(s: int) -> Workload:
        jobs = generate(500, seed=s, max_gpus=topo.total_gpus, load_scale=2.0)
        return Workload(topo, _predicted(assign_profiles(jobs, cal, seed=s), s), model)

    env = ClusterEnv(
        factory, spec=mdp.make_spec(mdp.MdpConfig(k_slots=k_slots, slot_order=slot_order))
    )
    rng = np.random.default_rng(seed)
    steps = 0
    t0 = time.perf_counter()
    for ep in range(episodes):
        _, info = env.reset(seed=seed + ep)
        done = False
        while not done:
            mask = info["action_mask"]
            starts = np.flatnonzero(mask[:-1])
            go = len(starts) > 0 and (info["running"] == 0 or rng.random() < 0.7)
            a = int(rng.choice(starts)) if go else len(mask) - 1
            _, _, term, trunc, info = env.step(a)
            steps += 1
            done = term or trunc
    wall = time.perf_counter() - t0
    return {"episodes": float(episodes), "steps": float(steps), "steps_per_s": steps / wall}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--points", type=int, default=400)
    p.add_argument("--min-pending", type=int, default=1000)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slot-order", default="head")
    p.add_argument("--k-slots", type=int, default=8)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    lats = {
        w: latency(
            args.points, args.min_pending, args.seed, w == "wide", args.slot_order, args.k_slots
        )
        for w in WORKLOADS
    }
    env = env_speed(args.episodes, args.seed, args.slot_order, args.k_slots)
    if args.json:
        print(json.dumps({"latency": lats, "env": env}, indent=2))
        return 0
    print(
        "| GPU mix | states | pending (median) | running (median) | split running "
        "| p50 ms | p99 ms | max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w, lat in lats.items():
        print(
            f"| {w} | {lat['states']:.0f} | {lat['pending_median']:.0f} "
            f"| {lat['running_median']:.0f} | {lat['split_running_median']:.0f} "
            f"| {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | {lat['max_ms']:.2f} |"
        )
    print()
    print(
        f"env: {env['steps']:.0f} steps in {env['episodes']:.0f} episodes, "
        f"{env['steps_per_s']:.0f} steps/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
