"""Learned-policy simulation speed: a packaged policy on the Philly slice, one core.

Simulates ``model:PACKAGE`` on the shared Philly slice at philly-all's ``88x8,leaf=8`` in
one process with one torch thread, and reports the simulation's wall time, decision points,
network calls and time per decision point; ``--profile N`` prints cProfile's top ``N``
functions by own time (what dominates), ``--parts`` per-part CPU timers (``PARTS``).
``--max-jobs`` takes the first jobs of the trace.

Two kinds of package:

- a learned package (``--package tests/fixtures/packages/cql-rows``: the old shipped CQL);
- a residual package (``models.residual``, ``kind: residual``): the default. Without
  ``--package`` a throwaway one is built first (``--build``: counterfactual labels of the
  base on the embedded default's synthetic workload, BC or CQL with the masked MLP 128x128
  as ``pipelines.residual.train_on_labels`` fits it, ``write_residual_package``) whose
  trained topology is the benchmark's cluster and which has no feature range and no
  minimum support, so that it does not defer: the scoring path is what is measured.
  ``--defer topology`` measures the deferring path (the trained topology replaced by
  another), ``--defer labels`` the label set's own rule (range, support >= 3). For a
  residual the base alone is simulated too (``--no-base`` skips it) and the overhead is
  the difference; the base's own time inside the residual is reported beside it.

The jobs are annotated as ``benchmarks/simulator_speed.py`` annotates them (a predictor fit
on the slice's first two weeks), so the base's time is comparable with that benchmark's.

    .venv/bin/python benchmarks/learned_speed.py [--max-jobs N] [--package DIR] [--profile 25]
    .venv/bin/python benchmarks/learned_speed.py --train-speed 300 [--threads 1]

``--train-speed STEPS``: the residual's label training (BC and CQL, masked MLP 128x128,
batch 64, as ``train_on_labels`` is called) in steps/s against its FLOP bound
(``training_speed``).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import math
import os
import pstats
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
OLD_PACKAGE = REPO / "tests" / "fixtures" / "packages" / "cql-rows"  # the old shipped CQL
FOREIGN = "0000000000000000"  # a topology signature no cluster has


class _Timed:
    """A base policy timing its own ``decide`` (copies share the clock: the residual's
    deviation finishes on a fresh copy of its base): wall seconds, calls, CPU seconds."""

    def __init__(self, inner: Any, clock: list[float] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.clock = clock if clock is not None else [0.0, 0.0, 0.0]

    def decide(self, state: Any) -> Any:
        t, c = time.perf_counter(), time.process_time()
        try:
            return self.inner.decide(state)
        finally:
            self.clock[0] += time.perf_counter() - t
            self.clock[1] += 1
            self.clock[2] += time.process_time() - c

    def __deepcopy__(self, memo: dict[int, Any]) -> _Timed:
        return _Timed(copy.deepcopy(self.inner, memo), self.clock)


class _Counting:
    """A policy wrapper counting decision points and the network's calls and rows."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.decisions = 0
        self.calls = 0
        self.rows = 0
        # a learned package scores through ``action_values``, a residual through ``values``
        attr = "action_values" if hasattr(policy, "action_values") else "values"
        values = getattr(policy, attr)

        def counted(obs: Any) -> Any:
            self.calls += 1
            self.rows += 1 if obs.ndim == 1 else int(obs.shape[0])
            return values(obs)

        setattr(policy, attr, counted)

    def decide(self, state: Any) -> Any:
        self.decisions += 1
        return self.policy.decide(state)


# (label, module, class or "", attribute): the parts ``--parts`` times (CPU seconds, calls),
# each inclusive of what it calls (``candidates`` holds ``contention_of`` and ``predict``)
PARTS = (
    ("annotate_state", "linkwise.models.residual", "", "annotate_state"),
    ("more_than_wait", "linkwise.models.residual", "", "more_than_wait"),
    ("candidates", "linkwise.models.residual", "", "candidates"),
    ("  contention_of", "linkwise.cluster.mdp.placements", "", "contention_of"),
    ("    split_key", "linkwise.cluster.mdp.slowdown", "", "split_key"),
    ("  Contention.predict", "linkwise.cluster.mdp.slowdown", "Contention", "predict"),
    ("encode", "linkwise.models.residual", "", "encode"),
    ("encode_partial", "linkwise.models.residual", "", "encode_partial"),
    ("_score", "linkwise.models.residual", "ResidualPolicy", "_score"),
    ("  _deviate", "linkwise.models.residual", "ResidualPolicy", "_deviate"),
    ("    apply_decision", "linkwise.models.residual", "", "apply_decision"),
    ("    merge_moves", "linkwise.models.residual", "", "merge_moves"),
    ("sim observe", "linkwise.cluster.simulator.engine", "Simulator", "observe"),
    ("sim apply", "linkwise.cluster.simulator.engine", "Simulator", "apply"),
    ("sim advance", "linkwise.cluster.simulator.engine", "Simulator", "advance"),
    (
        "  _update_split_rates",
        "linkwise.cluster.simulator.engine",
        "Simulator",
        "_update_split_rates",
    ),
)


class _Parts:
    """Per-part CPU timers (``PARTS``): each function replaced by a wrapper adding its
    ``process_time`` and calls, restored on exit; ``jobs_per_node`` too (a cached property)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def _wrap(self, label: str, fn: Any) -> Any:
        cpu, calls = self.cpu, self.calls
        cpu[label], calls[label] = 0.0, 0

        def timed(*args: Any, **kwargs: Any) -> Any:
            c = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu[label] += time.process_time() - c
                calls[label] += 1

        return timed

    def __enter__(self) -> _Parts:
        import importlib
        from functools import cached_property

        from linkwise.cluster.domain import ClusterState

        for label, module, cls, attr in PARTS:
            owner: Any = importlib.import_module(module)
            if cls:
                owner = getattr(owner, cls)
            if not hasattr(owner, attr):
                continue
            fn = owner.__dict__[attr] if cls else getattr(owner, attr)
            self._undo.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(label, fn))
        prop = ClusterState.__dict__["jobs_per_node"]
        self._undo.append((ClusterState, "jobs_per_node", prop))
        wrapped = cached_property(self._wrap("jobs_per_node", prop.func))
        wrapped.__set_name__(ClusterState, "jobs_per_node")
        ClusterState.jobs_per_node = wrapped  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        self._undo.clear()

    def table(self) -> dict[str, dict[str, float]]:
        return {
            k: {"cpu_s": round(self.cpu[k], 3), "calls": self.calls[k]}
            for k in self.cpu
            if self.calls[k]
        }


# ------------------------------------------------------------------------ a throwaway package


def build_residual(
    out: Path,
    cluster: str,
    *,
    base: str = "qssf_preemptive",
    algo: str = "bc",
    steps: int = 300,
    margin: float = 0.5,
    running_slots: int = 0,
    windows: int = 2,
    points: int = 4,
) -> tuple[Path, dict[str, Any]]:
    """A residual package for the benchmark in ``out`` (module docstring): labels of ``base``
    on ``windows`` days of the embedded default (16x8,leaf=4), ``algo`` trained ``steps``
    steps (MLP 128x128, batch 64, as ``benchmarks/residual_default.py``), the deferral of the
    label set with ``cluster``'s signature and no feature range or minimum support. Returns
    the package and what it took (seconds, label rows, steps/s)."""
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.mdp import MdpConfig, make_spec
    from linkwise.cluster.profiles import load_calibration
    from linkwise.cluster.topology.load import load_topology
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets import synthetic
    from linkwise.datasets.labels import LabelTask, run_labels, write_labels
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.rollouts import cut_windows
    from linkwise.datasets.traces import jobs_frame
    from linkwise.models.residual import topology_signature, write_residual_package
    from linkwise.models.training import AlgoConfig
    from linkwise.pipelines.experiment import DEMO_FULL
    from linkwise.pipelines.residual import label_deferral, train_on_labels
    from linkwise.policies.spec import PolicySpec

    t0 = time.perf_counter()
    exp = DEMO_FULL
    topo = from_spec(exp.topology)
    cfg = MdpConfig(k_slots=8, slot_order="mixed", running_slots=running_slots,
                    generators=("bounded", "least_contention", "best_fit"))  # fmt: skip
    jobs = synthetic.generate(exp.workload.jobs, seed=0, load_scale=exp.workload.load_scale,
                              max_gpus=topo.total_gpus)  # fmt: skip
    cut = cut_windows(jobs_frame(jobs), exp.windows.window_s, max_gpus=topo.total_gpus,
                      min_jobs=exp.windows.min_jobs)  # fmt: skip
    chosen = cut[2 : 2 + windows]
    predictor = RuntimePredictor.fit(jobs, until=chosen[0].start)
    policy = PolicySpec.parse(base).build(AnalyticModel(load_calibration(None)))
    tasks = [
        LabelTask(
            base=policy,
            base_name=base,
            window=w,
            topology=topo,
            seed=0,
            config=cfg,
            predictor=predictor,
            block_s=exp.windows.block_s,
            horizon_s=3600.0,
            n=1,
            points=points,
            alternatives=4,
        )
        for w in chosen
    ]
    labels = run_labels(tasks, "serial")
    label_s = time.perf_counter() - t0
    manifest = write_labels(labels, cfg, {"base": base}, out / "labels")
    params = AlgoConfig(n_steps=steps, n_steps_per_epoch=steps, batch_size=64,
                        hidden_units=(128, 128), alpha=1.0, gamma=0.0,
                        target_update_interval=100)  # fmt: skip
    r = train_on_labels(labels, manifest, algo, params, out / "pkgs", predictor=predictor,
                        tracking_uri=f"sqlite:///{out / 'mlflow.db'}")  # fmt: skip
    full = label_deferral(labels, make_spec(cfg), [topology_signature(topo)], min_support=3)
    scoring = replace(full, topologies=(topology_signature(load_topology(cluster)),),
                      feature_lo=(), feature_hi=(), min_support=0)  # fmt: skip
    pkg = write_residual_package(r.package_dir, out / "residual", base=base, margin=margin,
                                 deferral=scoring,
                                 chosen={"labels_deferral": full.to_json(),
                                         "why": "benchmarks/learned_speed.py"})  # fmt: skip
    return pkg, {
        "build_s": time.perf_counter() - t0,
        "label_s": label_s,
        "label_rows": labels.height,
        "train_steps_per_s": r.steps_per_s,
        "algo": algo,
    }


# ------------------------------------------------------------------------ simulating


def load_jobs(trace: Path, cluster: str, max_jobs: int | None, seed: int) -> tuple[Any, Any]:
    """The slice's jobs on ``cluster``, annotated as ``simulator_speed`` annotates them."""
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.traces import load_trace

    topo = load_topology(cluster)
    jobs = assign_profiles(load_trace(trace, "philly", max_jobs=max_jobs).jobs,
                           load_calibration(), seed=seed)  # fmt: skip
    jobs = [j for j in jobs if j.num_gpus <= topo.total_gpus]
    first = min(j.submit_time for j in jobs)
    return topo, RuntimePredictor.fit(jobs, until=first + 14 * 86400.0).annotate(jobs)


def simulate_package(
    topo: Any,
    jobs: Any,
    package: Path,
    *,
    defer: str = "none",
    base_only: bool = False,
    plain: bool = False,
    margin: float | None = None,
    parts: bool = False,
) -> dict[str, Any]:
    """Simulate the package (or, ``base_only``, a residual's base alone; ``plain``: through
    ``ResidualPolicy.decide_plain``, the path before the fast one) once, summarised;
    ``parts``: with per-part CPU timers (``_Parts``; the network as ``values``)."""
    import torch

    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.metrics import summarize
    from linkwise.cluster.profiles import load_calibration
    from linkwise.cluster.simulator.run import simulate
    from linkwise.models.learned import load_package
    from linkwise.models.residual import is_residual_meta, residual_from_learned

    torch.set_num_threads(1)
    model = AnalyticModel(load_calibration())
    learned = load_package(package, model=model)
    residual = is_residual_meta(learned.meta)
    inner: Any = learned
    clock = [0.0, 0.0, 0.0]
    timers = _Parts()
    if residual:
        res = residual_from_learned(learned, model)
        if margin is not None:  # the package's margin replaced (how often it deviates)
            res.margin = margin
        if defer == "topology":
            res.deferral = replace(res.deferral, topologies=(FOREIGN,))
        elif defer == "labels":
            from linkwise.models.residual import Deferral

            res.deferral = Deferral.from_json(learned.meta["residual"]["chosen"]["labels_deferral"])
        res.base = _Timed(res.base, clock)
        if parts:
            res.values = timers._wrap("values (network)", res.values)
        if plain:
            res.decide = res.decide_plain  # type: ignore[method-assign]
        inner = res.base.inner if base_only else res
    policy = _Counting(inner) if not base_only else inner
    if parts:
        timers.__enter__()
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(topo, jobs, model, policy)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        if parts:
            timers.__exit__()
    m = summarize(result.records, total_gpus=topo.total_gpus, events=result.events, wall_s=wall)
    row: dict[str, Any] = {
        "jobs": len(jobs),
        "package": package.name,
        "policy": getattr(inner, "name", "?") if not base_only else f"base {inner.name}",
        "wall_s": wall,
        "cpu_s": cpu,  # this process's CPU time: on a shared machine, the closer to one core
        "avg_jct_h": m.avg_jct_s / 3600,
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    if not base_only:
        row["decision_points"] = policy.decisions
        row["network_calls"] = policy.calls
        row["network_rows"] = policy.rows
        row["forward"] = learned.forward  # small batches through numpy or torch
        row["ms_per_decision_point"] = 1000 * wall / max(1, policy.decisions)
    if residual and not base_only:
        row["defer"] = defer
        row["path"] = "plain" if plain else "fast"
        row["margin"] = inner.margin
        adv = sorted(inner.advantages)
        if adv:
            row["advantage_p50_p95_p99"] = [adv[int(q * (len(adv) - 1))] for q in (0.5, 0.95, 0.99)]
        row["base_s"] = clock[0]
        row["base_cpu_s"] = clock[2]
        row["base_calls"] = int(clock[1])
        row["overhead_s"] = wall - clock[0]
        row.update({f"residual_{k}": v for k, v in inner.stats().items()})
    elif not residual:
        row["wait_overrides"] = learned.wait_overrides
    if parts:
        row["parts"] = timers.table()
    return row


# ------------------------------------------------------------------------ training speed


def _label_like_dataset(spec: Any, n: int, seed: int = 0) -> Any:
    """A dataset shaped as ``pipelines.residual.label_datasets`` builds it (one-step terminal
    transitions, each state's mask in the observation), random content: speed only."""
    import d3rlpy  # type: ignore[import-untyped]
    import numpy as np

    rng = np.random.default_rng(seed)
    obs = rng.random((n, spec.dim), dtype=np.float32)
    masks = rng.random((n, spec.n_actions)) < 0.4
    masks[:, -1] = True
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks], dtype=np.int64)
    return d3rlpy.dataset.MDPDataset(
        observations=[obs, masks.astype(np.float32)],
        actions=actions,
        rewards=-rng.random(n).astype(np.float32),
        terminals=np.ones(n, dtype=np.float32),
        timeouts=np.zeros(n, dtype=np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=spec.n_actions,
    )


def training_speed(steps: int, threads: int) -> list[dict[str, Any]]:
    """Steps/s of the residual's label training (BC and CQL, masked MLP 128x128, batch 64,
    as ``benchmarks/residual_default.py`` calls ``train_on_labels``) against the compute
    bound: FLOPs per gradient step (``FlopCounterMode`` over one step) over the FLOP/s a
    ``(64, dim) @ (dim, 128)`` float32 matmul (the first layer's shape) achieves here with
    the same threads. Also the first ``fit``'s setup (d3rlpy builds the networks lazily)."""
    import d3rlpy
    import torch
    from d3rlpy.logging import NoopAdapterFactory  # type: ignore[import-untyped]
    from torch.utils.flop_counter import FlopCounterMode

    from linkwise.cluster.mdp import MdpConfig, make_spec
    from linkwise.models.training import AlgoConfig, build_algo, fit, quiet_d3rlpy

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gens = ("bounded", "least_contention", "best_fit")
        spec = make_spec(MdpConfig(k_slots=8, slot_order="mixed", generators=gens))
        with quiet_d3rlpy():
            ds = _label_like_dataset(spec, 2000)
        a, b = torch.rand(64, spec.dim), torch.rand(spec.dim, 128)
        for _ in range(20):
            a @ b
        reps = 2000
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        peak = 2.0 * 64 * spec.dim * 128 * reps / (time.perf_counter() - t0)
        rows = []
        for algo_name in ("bc", "cql"):
            p = AlgoConfig(n_steps=steps, n_steps_per_epoch=steps, batch_size=64,
                           hidden_units=(128, 128), alpha=1.0, gamma=0.0,
                           target_update_interval=100)  # fmt: skip
            d3rlpy.seed(0)
            algo = build_algo(algo_name, p, "cpu:0", spec=spec)
            few = AlgoConfig(**{**p.__dict__, "n_steps": 5, "n_steps_per_epoch": 5})
            t0 = time.perf_counter()
            fit(algo, ds, few, evaluators={}, adapter=NoopAdapterFactory())
            setup = time.perf_counter() - t0
            one = AlgoConfig(**{**p.__dict__, "n_steps": 1, "n_steps_per_epoch": 1})
            with FlopCounterMode(display=False) as counter:
                fit(algo, ds, one, evaluators={}, adapter=NoopAdapterFactory())
            flops = counter.get_total_flops()
            t0 = time.perf_counter()
            fit(algo, ds, p, evaluators={}, adapter=NoopAdapterFactory())
            dt = time.perf_counter() - t0
            bound = peak / flops
            rows.append({
                "algo": algo_name, "threads": threads, "dim": spec.dim,
                "actions": spec.n_actions, "steps": steps, "steps_per_s": steps / dt,
                "ms_per_step": 1000 * dt / steps, "first_fit_5_steps_s": setup,
                "mflop_per_step": flops / 1e6, "matmul_gflop_s": peak / 1e9,
                "bound_steps_per_s": bound, "share_of_bound": steps / dt / bound,
            })  # fmt: skip
        return rows
    finally:
        torch.set_num_threads(before)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--cluster", default="88x8,leaf=8")
    p.add_argument("--package", type=Path, help="default: a throwaway residual package")
    p.add_argument("--old", action="store_true", help=f"the old CQL package {OLD_PACKAGE}")
    p.add_argument("--build", type=Path, help="build the throwaway package here (kept)")
    p.add_argument("--base", default="qssf_preemptive", help="the throwaway package's base")
    p.add_argument("--algo", choices=("bc", "cql"), default="bc")
    p.add_argument(
        "--margin", type=float, help="the residual's margin (default: the package's; 0.5 built)"
    )
    p.add_argument("--running-slots", type=int, default=0)
    p.add_argument("--defer", default="none", help="comma list of none, topology, labels")
    p.add_argument("--no-base", action="store_true", help="do not simulate the base alone")
    p.add_argument("--plain", action="store_true", help="also the plain path (before)")
    p.add_argument("--max-jobs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, help="print the top N functions (own time)")
    p.add_argument("--parts", action="store_true", help="per-part CPU timers (PARTS) per run")
    p.add_argument(
        "--train-speed",
        type=int,
        default=0,
        metavar="STEPS",
        help="measure the label training's steps/s instead (module docstring)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads for --train-speed")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.train_speed:
        load = os.getloadavg()
        out = training_speed(args.train_speed, args.threads)
        for r in out:
            r["load_avg_before"] = [round(x, 2) for x in load]
            r["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            print(json.dumps(r) if args.json else ", ".join(f"{k}={_fmt(v)}" for k, v in r.items()))
        return 0
    defers = args.defer.split(",")
    if not set(defers) <= {"none", "topology", "labels"}:
        p.error(f"--defer: unknown {args.defer!r}")
    rows: list[dict[str, Any]] = []
    package = OLD_PACKAGE if args.old else args.package
    if package is None:
        where = args.build or Path(tempfile.mkdtemp(prefix="linkwise-learned-speed-"))
        package, built = build_residual(where, args.cluster, base=args.base, algo=args.algo,
                                        margin=0.5 if args.margin is None else args.margin,
                                        running_slots=args.running_slots)  # fmt: skip
        rows.append({"built": str(package), **built})
    if not (package / "policy.json").is_file():
        print(f"no package at {package}", file=sys.stderr)
        return 2
    residual = json.loads((package / "policy.json").read_text()).get("kind") == "residual"
    topo, jobs = load_jobs(args.trace, args.cluster, args.max_jobs, args.seed)
    load = os.getloadavg()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        rows.append(simulate_package(topo, jobs, package, defer=defers[0], margin=args.margin))
        prof.disable()
        print(json.dumps(rows))
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        return 0
    for d in defers if residual else ["none"]:
        if residual and args.plain:
            rows.append(
                simulate_package(topo, jobs, package, defer=d, plain=True, margin=args.margin)
            )
        rows.append(
            simulate_package(topo, jobs, package, defer=d, margin=args.margin, parts=args.parts)
        )
    if residual and not args.no_base:
        rows.append(simulate_package(topo, jobs, package, base_only=True, parts=args.parts))
    for r in rows:
        r["load_avg_before"] = [round(x, 2) for x in load]
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        print(", ".join(f"{k}={_fmt(v)}" for k, v in r.items()))
    return 0


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
