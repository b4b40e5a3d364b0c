"""CQL gradient steps/s, network rows vs mlp, K=16, P=3, batch 256, masked, random data,
against the network's compute bound on this machine: FLOPs per gradient step (counted by
``torch.utils.flop_counter.FlopCounterMode`` over one step: critics, targets, backward) over
the FLOP/s a plain float32 matmul of the batch's shape achieves here with the same threads.
``bound`` is the steps/s the step's FLOPs alone would allow; ``share`` the measured share of
it (the rest is per-op overhead: d3rlpy's step, the optimiser, small kernels).

.venv/bin/python benchmarks/rows_speed.py STEPS [DEVICE] [THREADS]
"""

import sys
import time

import d3rlpy
import numpy as np
import torch
from d3rlpy.logging import NoopAdapterFactory
from torch.utils.flop_counter import FlopCounterMode

from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.datasets.export import to_mdp_dataset
from linkwise.datasets.transitions import TransitionBuffer
from linkwise.models.training import AlgoConfig, build_algo, fit, quiet_d3rlpy

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
device = sys.argv[2] if len(sys.argv) > 2 else "cpu:0"
spec = make_spec(MdpConfig(k_slots=16, generators=("best_fit", "same_leaf", "first_fit")))
rng = np.random.default_rng(0)
buf = TransitionBuffer(spec.version)
for e in range(20):
    for t in range(200):
        mask = rng.random(spec.n_actions) < 0.3
        mask[-1] = True
        obs = rng.random(spec.dim).astype(np.float32)
        buf.add(
            episode=f"rollout/x/w{e}",
            step=t,
            time=float(t),
            obs=obs,
            action=int(rng.choice(np.flatnonzero(mask))),
            reward=-float(rng.random()),
            mask=mask,
            source="rollout",
            behaviour="x",
            match="policy",
        )
    buf.end_episode(terminal=True)
with quiet_d3rlpy():
    ds = to_mdp_dataset(buf.to_frame(), spec, masks=True)
print(f"dim {spec.dim} actions {spec.n_actions} torch threads {torch.get_num_threads()} {device}")


def matmul_flops(n: int = 256, k: int = 741, m: int = 256, reps: int = 200) -> float:
    """Achieved float32 FLOP/s of ``(n, k) @ (k, m)`` (the first layer's shape) here."""
    a, b = torch.rand(n, k), torch.rand(k, m)
    for _ in range(10):
        a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2.0 * n * k * m * reps / (time.perf_counter() - t0)


peak = matmul_flops()
print(f"matmul 256x741 @ 741x256: {peak / 1e9:.1f} GFLOP/s")
for net, kw in (
    ("mlp", dict(hidden_units=(256, 256))),
    ("mlp", dict(hidden_units=(128, 128))),
    ("rows", dict(row_hidden=(64, 64), head_hidden=(64,))),
    ("rows", dict(row_hidden=(128, 128), head_hidden=(128,))),
):
    p = AlgoConfig(
        n_steps=steps,
        n_steps_per_epoch=steps,
        batch_size=256,
        n_critics=2,
        target_update_interval=250,
        network=net,
        **kw,
    )
    d3rlpy.seed(0)
    algo = build_algo("cql", p, device, spec=spec)
    w = AlgoConfig(**{**p.__dict__, "n_steps": 5, "n_steps_per_epoch": 5})
    fit(algo, ds, w, evaluators={}, adapter=NoopAdapterFactory())
    n_par = sum(x.numel() for x in algo.impl.modules.q_funcs[0].parameters())
    one = AlgoConfig(**{**p.__dict__, "n_steps": 1, "n_steps_per_epoch": 1})
    with FlopCounterMode(display=False) as counter:
        fit(algo, ds, one, evaluators={}, adapter=NoopAdapterFactory())
    flops = counter.get_total_flops()
    t0 = time.perf_counter()
    fit(algo, ds, p, evaluators={}, adapter=NoopAdapterFactory())
    dt = time.perf_counter() - t0
    bound = peak / flops
    print(
        f"{net:4} {kw}: {steps / dt:7.1f} steps/s, params/critic {n_par}, "
        f"{flops / 1e6:.0f} MFLOP/step, bound {bound:.0f} steps/s, share {steps / dt / bound:.1%}"
    )
