"""Training speed (d3rlpy DiscreteBC / DiscreteCQL steps per second) and the learned policy's
decision latency.

Training: best_fit rollouts on busy hours of the real Philly arrivals (8x8 cluster, K=4
slots), fitted for ``--steps`` steps at each batch size, without and with action masks
(``[train] masked``), with the configurations' networks (two hidden layers of 128; CQL
with two critics), CPU, all cores torch takes.

Latency: a 128x8 cluster (16 nodes per leaf) with a deep queue, as in ``mdp_speed.py``
(4,000 synthetic Philly-like jobs arriving within one hour, a seeded random policy starting
some at each decision point). At each decision point with at least ``--min-pending`` jobs
pending, the learned policy (default ``MdpConfig``: 459 features, 41 actions; a CQL
network, 2 critics x 256-256) is timed for one step (candidates + mask + encode + network +
masked argmax) and for a whole ``decide`` (steps until the model waits).

    .venv/bin/python benchmarks/training_speed.py [--steps 300] [--points 300] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.policies.spec import PolicySpec

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"


def training_speed(steps: int, batches: list[int]) -> list[dict[str, Any]]:
    """Steps/s of DiscreteBC and DiscreteCQL at each batch size."""
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory

    from linkwise.cluster.mdp import MdpConfig, make_spec
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.export import to_mdp_dataset
    from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks, run_rollouts
    from linkwise.datasets.windows import choose_windows
    from linkwise.models.training import AlgoConfig, build_algo, fit, quiet_d3rlpy

    spec = make_spec(MdpConfig(k_slots=4))
    wins = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64), n=6, min_jobs=20
    )
    df = run_rollouts(
        make_tasks(
            wins,
            [PolicySpec.parse("best_fit")],
            [0, 1],
            from_spec("8x8,leaf=2"),
            config=spec.config,
        )
    )
    with quiet_d3rlpy():
        datasets = {m: to_mdp_dataset(df, spec, masks=m) for m in (False, True)}
    out = []
    for algo_name, masked, batch in itertools.product(("bc", "cql"), (False, True), batches):
        ds = datasets[masked]
        params = AlgoConfig(n_steps=steps, n_steps_per_epoch=steps, batch_size=batch,
                            hidden_units=(128, 128), n_critics=2,
                            target_update_interval=250, masked=masked)  # fmt: skip
        d3rlpy.seed(0)
        algo = build_algo(algo_name, params, "cpu:0")
        fit(
            algo,
            ds,
            replace(params, n_steps=10, n_steps_per_epoch=10),
            evaluators={},
            adapter=NoopAdapterFactory(),
        )  # fmt: skip  (warm-up, builds the networks)
        t0 = time.perf_counter()
        fit(algo, ds, params, evaluators={}, adapter=NoopAdapterFactory())
        dt = time.perf_counter() - t0
        out.append({"algo": algo_name, "masked": masked, "batch": batch,
                    "steps_per_s": steps / dt, "transitions": df.height})  # fmt: skip
    return out


def _latency_policy(tmp: Path) -> Any:
    """A CQL package for the default MdpConfig (weights from a short fit on random data:
    latency does not depend on them), loaded as a LearnedPolicy."""
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory

    from linkwise.cluster.mdp import make_spec
    from linkwise.models.learned import load_package
    from linkwise.models.packaging import save_package
    from linkwise.models.training import AlgoConfig, build_algo, fit, quiet_d3rlpy

    spec = make_spec()
    rng = np.random.default_rng(0)
    n = 2000
    with quiet_d3rlpy():
        ds = d3rlpy.dataset.MDPDataset(
            observations=rng.random((n, spec.dim), dtype=np.float32),
            actions=rng.integers(0, spec.n_actions, n),
            rewards=rng.normal(size=n).astype(np.float32),
            terminals=(np.arange(n) % 100 == 99).astype(np.float32),
            action_space=d3rlpy.ActionSpace.DISCRETE,
            action_size=spec.n_actions,
        )
    # no masks in random data (the served network is the same either way)
    params = AlgoConfig(
        n_steps=20, n_steps_per_epoch=20, hidden_units=(256, 256), n_critics=2, masked=False
    )
    algo = build_algo("cql", params, "cpu:0")
    fit(algo, ds, params, evaluators={}, adapter=NoopAdapterFactory())
    pkg = save_package(algo, spec, {"hash": "benchmark"}, tmp / "pkg")
    return load_package(pkg)


def latency(points: int, min_pending: int, seed: int, threads: int) -> dict[str, float]:
    """Per-step and per-decide latency of the learned policy on deep-queue states."""
    import tempfile

    import torch

    from linkwise.cluster import mdp
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator.engine import Simulator
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.synthetic import generate
    from linkwise.policies.heuristics import make_policy

    torch.set_num_threads(threads)
    cal = load_calibration()
    topo = from_spec("128x8,leaf=16")
    raw = generate(4000, seed=seed, max_gpus=topo.total_gpus)
    last = max(j.submit_time for j in raw) or 1.0
    jobs = assign_profiles(
        [replace(j, submit_time=j.submit_time / last * 3600.0) for j in raw], cal, seed=seed
    )
    with tempfile.TemporaryDirectory() as tmp:
        learned = _latency_policy(Path(tmp))
    spec = learned.spec
    behaviour = make_policy("random", seed=seed, start_prob=0.3)
    sim = Simulator(topo, jobs, AnalyticModel(cal))
    step_ms: list[float] = []
    net_ms: list[float] = []
    decide_ms: list[float] = []
    starts: list[int] = []
    pending: list[int] = []
    while len(step_ms) < points:
        state = sim.observe()
        if len(state.pending) >= min_pending:
            learned.model = AnalyticModel(cal)  # cold memo tables: a live loop's worst case
            learned.__post_init__()
            t0 = time.perf_counter()
            cands = mdp.candidates(state, spec.config, learned.model)
            mask = mdp.action_mask(cands)
            obs = mdp.encode(cands, spec)
            t1 = time.perf_counter()
            a = learned.act(obs, mask)
            t2 = time.perf_counter()
            assert mask[a]
            step_ms.append((t2 - t0) * 1e3)
            net_ms.append((t2 - t1) * 1e3)
            learned.model = AnalyticModel(cal)
            learned.__post_init__()
            t0 = time.perf_counter()
            decision = learned.decide(state)
            decide_ms.append((time.perf_counter() - t0) * 1e3)
            starts.append(len(decision.starts))
            pending.append(len(state.pending))
        sim.apply(behaviour.decide(state))
        if not sim.advance():
            break
    s, n, d = np.array(step_ms), np.array(net_ms), np.array(decide_ms)
    return {
        "states": float(len(s)),
        "pending_median": float(np.median(pending)),
        "torch_threads": float(threads),
        "step_p50_ms": float(np.percentile(s, 50)),
        "step_p99_ms": float(np.percentile(s, 99)),
        "network_p50_ms": float(np.percentile(n, 50)),
        "network_p99_ms": float(np.percentile(n, 99)),
        "decide_p50_ms": float(np.percentile(d, 50)),
        "decide_p99_ms": float(np.percentile(d, 99)),
        "starts_per_decide_mean": float(np.mean(starts)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--min-pending", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for inference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    if not args.skip_training:
        out["training"] = training_speed(args.steps, [int(b) for b in args.batches.split(",")])
    out["latency"] = latency(args.points, args.min_pending, args.seed, args.threads)
    if args.json:
        print(json.dumps(out))
        return
    for row in out.get("training", []):
        masks = "masked" if row["masked"] else "plain"
        print(f"{row['algo']:>3} {masks:>6} batch {row['batch']:>4}: "
              f"{row['steps_per_s']:7.1f} steps/s")  # fmt: skip
    for k, v in out["latency"].items():
        print(f"{k}: {v:.3f}")


if __name__ == "__main__":
    main()
