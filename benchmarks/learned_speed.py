"""Learned-policy simulation speed: a packaged policy on the Philly slice, one core.

Simulates ``model:PACKAGE`` on the shared Philly slice at philly-all's ``88x8,leaf=8`` in
one process with one torch thread, and reports the simulation's wall time, decision points,
network calls and time per decision point; ``--profile N`` prints cProfile's top ``N``
functions by own time (what dominates). ``--max-jobs`` takes the first jobs of the trace.

Two kinds of package:

- a learned package (``--package models/pretrained/philly-all``: the old shipped CQL);
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
OLD_PACKAGE = REPO / "models" / "pretrained" / "philly-all"
FOREIGN = "0000000000000000"  # a topology signature no cluster has


class _Timed:
    """A base policy timing its own ``decide`` (copies share the clock: the residual's
    deviation finishes on a fresh copy of its base)."""

    def __init__(self, inner: Any, clock: list[float] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.clock = clock if clock is not None else [0.0, 0.0]

    def decide(self, state: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.inner.decide(state)
        finally:
            self.clock[0] += time.perf_counter() - t
            self.clock[1] += 1

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
        if hasattr(policy, "network"):  # a learned package: count its network's calls
            net = policy.network

            def counted(x: Any) -> Any:
                self.calls += 1
                self.rows += int(x.shape[0])
                return net(x)

            policy.network = counted
        else:  # a residual: count its value calls
            values = policy.values

            def counted_values(obs: Any) -> Any:
                self.calls += 1
                self.rows += 1 if obs.ndim == 1 else int(obs.shape[0])
                return values(obs)

            policy.values = counted_values

    def decide(self, state: Any) -> Any:
        self.decisions += 1
        return self.policy.decide(state)


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
    from linkwise.cluster.topology import from_spec, load_topology
    from linkwise.datasets import synthetic
    from linkwise.datasets.labels import LabelTask, run_labels, write_labels
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.rollouts import cut_windows
    from linkwise.datasets.traces import jobs_frame
    from linkwise.models.policy_spec import PolicySpec
    from linkwise.models.residual import topology_signature, write_residual_package
    from linkwise.models.training import AlgoConfig
    from linkwise.pipelines.experiment import DEMO_FULL
    from linkwise.pipelines.residual import label_deferral, train_on_labels

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
    from linkwise.cluster.topology import load_topology
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.datasets.traces import load_trace

    topo = load_topology(cluster)
    jobs = assign_profiles(load_trace(trace, "philly", max_jobs=max_jobs).jobs,
                           load_calibration(), seed=seed)  # fmt: skip
    jobs = [j for j in jobs if j.num_gpus <= topo.total_gpus]
    first = min(j.submit_time for j in jobs)
    return topo, RuntimePredictor.fit(jobs, until=first + 14 * 86400.0).annotate(jobs)


def simulate_package(
    topo: Any, jobs: Any, package: Path, *, defer: str = "none", base_only: bool = False
) -> dict[str, Any]:
    """Simulate the package (or, ``base_only``, a residual's base alone) once, summarised."""
    import torch

    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.metrics import summarize
    from linkwise.cluster.profiles import load_calibration
    from linkwise.cluster.simulator import simulate
    from linkwise.models.learned import load_package
    from linkwise.models.residual import is_residual_meta, residual_from_learned

    torch.set_num_threads(1)
    model = AnalyticModel(load_calibration())
    learned = load_package(package, model=model)
    residual = is_residual_meta(learned.meta)
    inner: Any = learned
    clock = [0.0, 0.0]
    if residual:
        res = residual_from_learned(learned, model)
        if defer == "topology":
            res.deferral = replace(res.deferral, topologies=(FOREIGN,))
        elif defer == "labels":
            from linkwise.models.residual import Deferral

            res.deferral = Deferral.from_json(learned.meta["residual"]["chosen"]["labels_deferral"])
        res.base = _Timed(res.base, clock)
        inner = res.base.inner if base_only else res
    policy = _Counting(inner) if not base_only else inner
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(topo, jobs, model, policy)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
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
        row["ms_per_decision_point"] = 1000 * wall / max(1, policy.decisions)
    if residual and not base_only:
        row["defer"] = defer
        row["base_s"] = clock[0]
        row["base_calls"] = int(clock[1])
        row["overhead_s"] = wall - clock[0]
        row.update({f"residual_{k}": v for k, v in inner.stats().items()})
    elif not residual:
        row["wait_overrides"] = learned.wait_overrides
    return row


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
    p.add_argument("--margin", type=float, default=0.5)
    p.add_argument("--running-slots", type=int, default=0)
    p.add_argument("--defer", default="none", help="comma list of none, topology, labels")
    p.add_argument("--no-base", action="store_true", help="do not simulate the base alone")
    p.add_argument("--max-jobs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, help="print the top N functions (own time)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    defers = args.defer.split(",")
    if not set(defers) <= {"none", "topology", "labels"}:
        p.error(f"--defer: unknown {args.defer!r}")
    rows: list[dict[str, Any]] = []
    package = OLD_PACKAGE if args.old else args.package
    if package is None:
        where = args.build or Path(tempfile.mkdtemp(prefix="linkwise-learned-speed-"))
        package, built = build_residual(where, args.cluster, base=args.base, algo=args.algo,
                                        margin=args.margin,
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
        rows.append(simulate_package(topo, jobs, package, defer=defers[0]))
        prof.disable()
        print(json.dumps(rows))
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        return 0
    for d in defers if residual else ["none"]:
        rows.append(simulate_package(topo, jobs, package, defer=d))
    if residual and not args.no_base:
        rows.append(simulate_package(topo, jobs, package, base_only=True))
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
