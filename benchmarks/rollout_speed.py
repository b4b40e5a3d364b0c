"""Transitions per second: simulator rollouts (serial, 2 processes, 2 Dask workers) and logs.

Rollouts: windows of the real Philly trace (6 h, 100 to 400 jobs each, block-bootstrapped),
on a 16x8 cluster (4 leaves), default ``MdpConfig`` (K=8, P=5, 459 features), behaviour
policies best_fit and sjf_bco, each pure and with epsilon 0.1: ``--windows`` x 4 rollouts.
Each executor runs the same tasks and must return the same frame.

- serial: ``run_rollouts(tasks, "serial")`` in this process;
- pool (no Prefect): ``concurrent.futures.ProcessPoolExecutor(2)`` mapping ``rollout``
  (the floor for two processes: spawn and imports included);
- prefect local:2: the rollouts flow with Prefect's ``ProcessPoolTaskRunner(2)`` (a
  temporary Prefect API server is started first and not timed);
- prefect dask: the flow with ``DaskTaskRunner`` on a ``LocalCluster`` of 2 worker processes
  (one thread each), started before timing.

Logs: a best_fit history of ``--log-jobs`` synthetic Philly-like jobs on the same cluster,
written to an in-memory store as accounting, rebuilt by ``decisions.build_log_transitions``.

    .venv/bin/python benchmarks/rollout_speed.py [--windows 8] [--log-jobs 1500] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from linkwise.policies.spec import PolicySpec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "16x8,leaf=4"


def _hermetic() -> None:
    home = tempfile.mkdtemp(prefix="prefect-home-")
    os.environ.update(
        PREFECT_HOME=home,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("PREFECT_API_KEY", None)


def _tasks(n_windows: int) -> list[Any]:
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks
    from linkwise.datasets.windows import choose_windows

    wins = [
        w
        for w in cut_windows(jobs_from_trace(PHILLY), 6 * 3600.0, max_gpus=128)
        if len(w.jobs) <= 400
    ]
    chosen = choose_windows(wins, n=n_windows, min_jobs=100)
    return make_tasks(
        chosen,
        [PolicySpec.parse("best_fit"), PolicySpec.parse("sjf_bco")],
        [0],
        from_spec(TOPO),
        epsilons=(0.0, 0.1),
    )


def _row(name: str, seconds: float, n: int, extra: str = "") -> dict[str, Any]:
    return {
        "executor": name,
        "seconds": seconds,
        "transitions": n,
        "per_s": n / seconds,
        "note": extra,
    }


def rollouts(n_windows: int) -> list[dict[str, Any]]:
    import polars as pl

    from linkwise.datasets.rollouts import rollout, run_rollouts

    tasks = _tasks(n_windows)
    rows = []
    t0 = time.perf_counter()
    serial = run_rollouts(tasks, "serial")
    rows.append(_row("serial", time.perf_counter() - t0, serial.height, f"{len(tasks)} rollouts"))

    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        frames = list(pool.map(rollout, tasks))
    dt = time.perf_counter() - t0
    assert pl.concat(frames).equals(serial)
    rows.append(_row("pool of 2 (no Prefect)", dt, serial.height, "spawn included"))

    _hermetic()
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        for batch in (1, 4):
            t0 = time.perf_counter()
            local = run_rollouts(tasks, "local:2", batch=batch)
            dt = time.perf_counter() - t0
            assert local.equals(serial)
            rows.append(
                _row(f"prefect local:2, batch {batch}", dt, serial.height, "spawn included")
            )

        from distributed import LocalCluster

        t0 = time.perf_counter()
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster:
            start = time.perf_counter() - t0
            address = cluster.scheduler_address.removeprefix("tcp://")
            for batch in (1, 4):
                t0 = time.perf_counter()
                dask = run_rollouts(tasks, f"dask://{address}", batch=batch)
                dt = time.perf_counter() - t0
                assert dask.equals(serial)
                note = f"cluster start {start:.1f} s not included"
                rows.append(_row(f"prefect dask (2 workers), batch {batch}", dt, dask.height, note))
    return rows


def logs(n_jobs: int) -> dict[str, Any]:
    from linkwise.cluster.mdp import make_spec
    from linkwise.datasets.decisions import build_log_transitions
    from linkwise.datasets.ingest import ingest_job_runs
    from linkwise.datasets.store import open_store
    from linkwise.testkit.history import simulated_history

    runs, topo, model = simulated_history(
        n_jobs, topology=TOPO, seed=1, max_gpus=64, load_scale=20.0, cluster="bench"
    )
    con = open_store(":memory:")
    ingest_job_runs(con, runs, source="bench")
    t = time.perf_counter()
    df, rep = build_log_transitions(con, topology=topo, spec=make_spec(), model=model)
    dt = time.perf_counter() - t
    return {
        "jobs": n_jobs,
        "transitions": df.height,
        "seconds": dt,
        "per_s": df.height / dt,
        "exact_match_share": rep.exact_match_share,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--log-jobs", type=int, default=1500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = rollouts(args.windows)
    log = logs(args.log_jobs)
    if args.json:
        print(json.dumps({"rollouts": rows, "logs": log}))
        return
    print("| executor | rollouts transitions | seconds | transitions/s | note |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['executor']} | {r['transitions']} | {r['seconds']:.1f} | "
            f"{r['per_s']:.0f} | {r['note']} |"
        )
    print(
        f"\nfrom logs: {log['transitions']} transitions of {log['jobs']} jobs in "
        f"{log['seconds']:.1f} s = {log['per_s']:.0f} transitions/s "
        f"(exact match {log['exact_match_share']:.1%})"
    )


if __name__ == "__main__":
    main()
