"""Transitions from accounting logs: a simulated history written to the store as accounting,
then rebuilt by ``build_log_transitions``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import duckdb
import numpy as np
import polars as pl
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.mdp import MdpConfig, ObsSpec, make_spec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.records import JobRecord
from linkwise.cluster.slurm.records import JobRun, NodeInfo
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.decisions import build_log_transitions, store_predictor
from linkwise.datasets.ingest import ingest_job_runs, ingest_nodes
from linkwise.datasets.log_jobs import topology_from_store
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.store import open_store
from linkwise.datasets.synthetic import generate
from linkwise.datasets.transitions import check_frame
from linkwise.policies.heuristics import make_policy

CAL = load_calibration()
MODEL = AnalyticModel(CAL)
TOPO = from_spec("8x8,leaf=4")
SPEC = make_spec(MdpConfig(k_slots=16))
T0 = 1.7e9  # accounting times are epoch seconds
TS = SPEC.config.time_scale_s


def run(
    jobs: int,
    gpus: int,
    start: float,
    end: float,
    nodes: Sequence[tuple[str, int]],
    *,
    submit: float | None = None,
    run_index: int = 0,
    settled: bool = True,
    state: str = "COMPLETED",
    cluster: str = "sim",
) -> JobRun:
    return JobRun(
        cluster=cluster,
        job_id=jobs,
        run_index=run_index,
        name=f"j{jobs}",
        user="u",
        account="a",
        partition="gpu",
        state=state,
        exit_code=0,
        signal=None,
        submit_time=start if submit is None else submit,
        start_time=start,
        end_time=end,
        time_limit_s=None,
        nodes=tuple(n for n, _ in nodes),
        gpus=gpus,
        gpus_per_node=tuple(g for _, g in nodes),
        allocation_nodes=len(nodes),
        settled=settled,
    )


def simulate_history(
    jobs: Sequence[Job], policy: str, topo: Topology = TOPO
) -> tuple[list[JobRun], tuple[JobRecord, ...]]:
    """Run a heuristic in the simulator; its records as accounting (placements captured)."""
    sim = Simulator(topo, jobs, MODEL)
    placed: dict[int, Placement] = {}

    def capture(state: ClusterState, decision: Decision) -> None:
        for s in decision.starts:
            placed[s.job_id] = s.placement

    drive(sim, make_policy(policy), on_decision=capture)
    runs = []
    for r in sim.records:
        p = placed[r.job.job_id]
        runs.append(
            run(
                r.job.job_id + 1,  # Slurm ids are positive
                r.job.num_gpus,
                T0 + r.first_start,
                T0 + r.end,
                [(topo.nodes[n].name, g) for n, g in p.alloc],
                submit=T0 + r.job.submit_time,
            )
        )
    return runs, sim.records


def store_of(runs: Sequence[JobRun]) -> duckdb.DuckDBPyConnection:
    con = open_store(":memory:")
    rep = ingest_job_runs(con, runs, source="test")
    assert rep.rejected == 0
    return con


def workload(n: int, seed: int, load: float = 30.0) -> tuple[Job, ...]:
    return assign_profiles(generate(n, seed=seed, max_gpus=32, load_scale=load), CAL, seed=seed)


def total_jct(records: Sequence[JobRecord]) -> float:
    return sum(r.end - r.job.submit_time for r in records)


@pytest.fixture(scope="module")
def best_fit_history() -> tuple[list[JobRun], tuple[JobRecord, ...]]:
    burst = tuple(  # submitted together: several starts at one instant
        Job(job_id=5000 + i, submit_time=0.0, num_gpus=g, duration=600.0 + 60 * i, profile="FSDP")
        for i, g in enumerate((1, 2, 4, 8, 2, 16, 1, 4))
    )
    return simulate_history(workload(142, seed=3) + burst, "best_fit")


def test_best_fit_history_is_reproduced_exactly(
    best_fit_history: tuple[list[JobRun], tuple[JobRecord, ...]],
) -> None:
    runs, records = best_fit_history
    df, rep = build_log_transitions(store_of(runs), topology=TOPO, spec=SPEC, model=MODEL)
    check_frame(df)
    assert rep.jobs == rep.starts == len(records) == 150
    assert rep.exact_match_share == 1.0 and rep.nearest == rep.unslotted == 0
    assert rep.waits == 0  # a greedy scan never leaves a feasible start behind
    assert rep.episodes == 1 and rep.transitions == df.height
    assert sum(rep.actions.values()) == df.height
    assert rep.actions[SPEC.config.wait_action] == rep.decision_points
    assert rep.decision_points < rep.starts  # several starts at one instant happen
    assert math.isclose(df["reward"].sum(), -total_jct(records) / TS, rel_tol=1e-9)
    # every recorded action is allowed at its state; starts carry no reward
    for action, mask in zip(df["action"].to_list(), df["mask"].to_list(), strict=True):
        assert mask[action]
    starts = df.filter(pl.col("match") != "wait")
    assert (starts["reward"] == 0.0).all() and (starts["action"] != SPEC.config.wait_action).all()
    assert set(df["source"]) == {"log"} and set(df["behaviour"]) == {"slurm"}
    assert df["obs"].list.len().unique().to_list() == [SPEC.dim]
    assert df["terminal"].sum() == 1 and df["terminal"][-1]


def test_fifo_history_records_waits_while_gpus_were_free() -> None:
    runs, records = simulate_history(workload(150, seed=4), "fifo")
    df, rep = build_log_transitions(store_of(runs), topology=TOPO, spec=SPEC, model=MODEL)
    check_frame(df)
    assert rep.exact_match_share == 1.0  # fifo places with first fit, one of the generators
    assert rep.waits > 0  # the head blocked jobs that fitted
    waits = df.filter(pl.col("match") == "wait")
    feasible_waits = waits.filter(
        pl.col("mask").list.slice(0, SPEC.config.wait_action).list.any()
    ).height
    assert feasible_waits == rep.waits
    assert math.isclose(df["reward"].sum(), -total_jct(records) / TS, rel_tol=1e-9)


def test_episodes_split_at_idle_gaps_with_per_episode_jct() -> None:
    first = workload(40, seed=5)
    span = max(j.submit_time + 10 * j.duration for j in first) + 1e5  # long idle before
    second = tuple(
        replace(j, job_id=j.job_id + 1000, submit_time=j.submit_time + span)
        for j in workload(40, seed=6)
    )
    runs, records = simulate_history(first + second, "best_fit")
    con = store_of(runs)
    df, rep = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, episode_gap_s=3600)
    check_frame(df)
    assert rep.episodes == 2 == df["episode"].n_unique()
    ends = df.filter(pl.col("terminal") | pl.col("timeout"))
    assert ends["terminal"].all()  # idle splits end episodes for real
    per_episode = df.group_by("episode").agg(pl.col("reward").sum(), pl.col("time").min())
    per_episode = per_episode.sort("time")
    cut = T0 + span
    jct_first = sum(r.end - r.job.submit_time for r in records if r.job.job_id < 1000)
    jct_second = total_jct(records) - jct_first
    assert per_episode["time"][1] >= cut
    assert math.isclose(per_episode["reward"][0], -jct_first / TS, rel_tol=1e-9)
    assert math.isclose(per_episode["reward"][1], -jct_second / TS, rel_tol=1e-9)
    _, one = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, episode_gap_s=1e7)
    assert one.episodes == 1


def test_fixed_windows_cut_episodes_with_timeouts(
    best_fit_history: tuple[list[JobRun], tuple[JobRecord, ...]],
) -> None:
    runs, records = best_fit_history
    window = 3 * 3600.0
    df, rep = build_log_transitions(
        store_of(runs), topology=TOPO, spec=SPEC, model=MODEL, window_s=window
    )
    check_frame(df)
    lo = min(r.submit_time for r in runs)
    assert rep.episodes > 1
    ep = df.group_by("episode").agg(
        pl.col("time").min().alias("t0"),
        pl.col("time").max().alias("t1"),
        pl.col("timeout").any(),
        pl.col("terminal").any(),
    )
    k0 = ((ep["t0"] - lo) // window).to_list()
    k1 = ((ep["t1"] - lo) // window).to_list()
    assert k0 == k1  # no episode crosses a window boundary
    assert ep["timeout"].sum() >= 1 and ep["terminal"].sum() >= 1
    # the return over all windows is still minus the total JCT
    assert math.isclose(df["reward"].sum(), -total_jct(records) / TS, rel_tol=1e-9)


def test_since_until_replays_the_window_from_the_state_then(
    best_fit_history: tuple[list[JobRun], tuple[JobRecord, ...]],
) -> None:
    runs, _ = best_fit_history
    submits = sorted(r.submit_time for r in runs)
    lo, hi = submits[40], submits[110]
    df, rep = build_log_transitions(
        store_of(runs), topology=TOPO, spec=SPEC, model=MODEL, since=lo, until=hi
    )
    check_frame(df)
    times = df["time"].to_list()
    assert min(times) >= lo and max(times) < hi
    integral = sum(max(0.0, min(r.end_time or 0.0, hi) - max(r.submit_time, lo)) for r in runs)
    assert math.isclose(df["reward"].sum(), -integral / TS, rel_tol=1e-9)
    assert rep.exact_match_share == 1.0
    assert df["timeout"][-1]  # jobs were still in the system at ``until``


def test_nearest_match_skips_and_requeued_runs() -> None:
    topo = from_spec("2x8")
    runs = [
        # 2 GPUs split over two nodes on an empty cluster: no generator splits it
        run(1, 2, T0, T0 + 100, [("gpu1", 1), ("gpu2", 1)]),
        run(2, 4, T0 + 10, T0 + 50, [("gpu1", 4)], submit=T0 + 5),  # 5 s wait: GPUs were free
        run(3, 1, T0 + 20, T0 + 30, [("gpu9", 1)]),  # unknown node
        run(4, 1, T0 + 20, T0 + 30, [("gpu2", 1)], settled=False, state="RUNNING"),
        run(5, 0, T0 + 20, T0 + 30, []),  # a CPU job
        run(6, 1, T0 + 40, T0 + 40, [("gpu2", 1)]),  # zero duration
        run(7, 1, T0 + 30, T0 + 60, [("gpu2", 1)], state="REQUEUED"),
        run(7, 1, T0 + 70, T0 + 90, [("gpu1", 1)], submit=T0 + 60, run_index=1),
    ]
    df, rep = build_log_transitions(store_of(runs), topology=topo, spec=SPEC, model=MODEL)
    check_frame(df)
    assert rep.skipped == {
        "node not in the topology": 1,
        "unsettled": 1,
        "no GPUs": 1,
        "zero duration": 1,
    }
    assert rep.jobs == rep.starts == 4
    assert rep.nearest == 1 and rep.mean_nearest_overlap == 0.5 and rep.exact == 3
    assert rep.waits >= 1
    assert df.filter(pl.col("time") == T0 + 5)["match"].to_list() == ["wait"]
    jct = 100 + (50 - 5) + (60 - 30) + (90 - 60)
    assert math.isclose(df["reward"].sum(), -jct / TS, rel_tol=1e-12)


def test_overcommitted_start_is_dropped_not_fatal() -> None:
    topo = from_spec("1x8")
    runs = [
        run(1, 8, T0, T0 + 100, [("gpu1", 8)]),
        run(2, 4, T0 + 10, T0 + 50, [("gpu1", 4)]),  # the node is full: accounting disagrees
    ]
    df, rep = build_log_transitions(store_of(runs), topology=topo, spec=SPEC, model=MODEL)
    check_frame(df)
    assert rep.skipped == {"overcommitted": 1} and rep.starts == 1


def test_deterministic_and_empty() -> None:
    runs, _ = simulate_history(workload(40, seed=8), "sjf_bco")
    con = store_of(runs)
    a, ra = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, seed=1)
    b, _ = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, seed=1)
    assert a.equals(b)
    assert ra.to_json()["transitions"] == a.height
    empty, rep = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, since=T0 + 1e9)
    assert empty.is_empty() and rep.transitions == 0 and rep.exact_match_share == 1.0


def test_observations_read_the_predictor_given_default_the_store_before_until() -> None:
    """The jobs are annotated by the predictor given (by default one fit on the store's jobs
    before ``until``): another predictor changes the observations, never the actions."""
    runs, _ = simulate_history(workload(40, seed=8), "sjf_bco")
    con = store_of(runs)
    a, _ = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL)
    same, _ = build_log_transitions(
        con, topology=TOPO, spec=SPEC, model=MODEL, predictor=store_predictor(con, None, None)
    )
    assert a.equals(same)
    other = RuntimePredictor.fit([Job(1, 0.0, 1, 7.0)])
    b, _ = build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, predictor=other)
    assert a["action"].to_list() == b["action"].to_list()
    assert not np.array_equal(np.stack(a["obs"].to_list()), np.stack(b["obs"].to_list()))


def test_topology_from_store_is_flat_in_natural_order() -> None:
    con = open_store(":memory:")
    infos = [
        NodeInfo(name=n, state="IDLE", partitions=("gpu",), cpus=8, gpus_total=g, gpus_used=0)
        for n, g in (("gpu10", 4), ("gpu2", 8), ("gpu1", 4))
    ]
    ingest_nodes(con, "c1", infos)
    topo = topology_from_store(con, "c1")
    assert [n.name for n in topo.nodes] == ["gpu1", "gpu2", "gpu10"]
    assert [n.gpus for n in topo.nodes] == [4, 8, 4]
    assert len(topo.leaf_names) == 1 and topo.total_gpus == 16
    assert topology_from_store(con) == topo  # a single cluster needs no name
    ingest_nodes(con, "c2", infos[:1])
    with pytest.raises(ValueError, match="2 clusters"):
        topology_from_store(con)
    with pytest.raises(ValueError, match="no nodes"):
        topology_from_store(con, "nope")


def test_wrong_spec_or_arguments_are_refused(
    best_fit_history: tuple[list[JobRun], tuple[JobRecord, ...]],
) -> None:
    con = store_of(best_fit_history[0][:5])
    with pytest.raises(ValueError, match="window_s"):
        build_log_transitions(con, topology=TOPO, spec=SPEC, model=MODEL, window_s=0)
    spec: ObsSpec = make_spec(MdpConfig(k_slots=2))
    df, rep = build_log_transitions(con, topology=TOPO, spec=spec, model=MODEL)
    assert np.array(df["obs"].to_list()).shape == (df.height, spec.dim)
    assert rep.starts == 5


SPEC1 = make_spec(MdpConfig(k_slots=1))  # one slot: only the head of the queue is expressible


def test_unslotted_start_is_applied_and_counted_without_a_step() -> None:
    topo = from_spec("1x8")
    runs = [
        run(1, 4, T0, T0 + 100, [("gpu1", 4)]),
        # both submitted at T0 + 30 and both fit (4 GPUs free); the slot holds job 2 (the
        # head) but Slurm starts job 3, which leaves 1 GPU: no other start is feasible
        run(2, 2, T0 + 100, T0 + 300, [("gpu1", 2)], submit=T0 + 30),
        run(3, 3, T0 + 30, T0 + 200, [("gpu1", 3)], submit=T0 + 30),
    ]
    df, rep = build_log_transitions(store_of(runs), topology=topo, spec=SPEC1, model=MODEL)
    check_frame(df)
    wait = SPEC1.config.wait_action
    assert rep.starts == 3 and rep.exact == 2 and rep.unslotted == 1 and rep.nearest == 0
    assert (3, "unslotted", 0.0) in rep.start_matches
    assert "unslotted" not in set(df["match"])
    assert df["match"].to_list() == ["exact", "wait", "exact", "wait"]
    assert df["time"].to_list() == [T0, T0, T0 + 100, T0 + 100]  # no step at T0 + 30
    assert rep.actions == {0: 2, wait: 2} and rep.transitions == 4
    assert rep.waits == 0 and rep.decision_points == 2
    # job 3 held its GPUs: job 2 had to wait for job 1's end, and the reward accounts all jobs
    jct = 100 + (300 - 30) + (200 - 30)
    assert math.isclose(df["reward"].sum(), -jct / TS, rel_tol=1e-12)
    assert df["terminal"][-1] and rep.episodes == 1


def test_episode_opening_with_an_unslotted_start_still_has_a_first_step() -> None:
    topo = from_spec("1x8")
    runs = [
        run(1, 4, T0 + 50, T0 + 150, [("gpu1", 4)], submit=T0),
        run(2, 6, T0, T0 + 50, [("gpu1", 6)]),  # not the head: unslotted, the first event
    ]
    df, rep = build_log_transitions(store_of(runs), topology=topo, spec=SPEC1, model=MODEL)
    check_frame(df)
    assert rep.unslotted == 1 and rep.exact == 1 and rep.waits == 0
    # the first observation (only wait allowed: job 1 does not fit beside job 2)
    first = df.row(0, named=True)
    assert first["time"] == T0 and first["match"] == "wait"
    assert first["action"] == SPEC1.config.wait_action
    assert not any(first["mask"][: SPEC1.config.wait_action])
    assert df["match"].to_list() == ["wait", "exact", "wait"]
    assert math.isclose(first["reward"], -50 * 2 / TS, rel_tol=1e-12)  # 2 jobs for 50 s
    assert math.isclose(df["reward"].sum(), -(150 + 50) / TS, rel_tol=1e-12)


def test_busy_history_with_one_slot_keeps_the_jct_return(
    best_fit_history: tuple[list[JobRun], tuple[JobRecord, ...]],
) -> None:
    runs, records = best_fit_history
    df, rep = build_log_transitions(store_of(runs), topology=TOPO, spec=SPEC1, model=MODEL)
    check_frame(df)
    wait = SPEC1.config.wait_action
    assert rep.unslotted > 0 and rep.exact + rep.nearest + rep.unslotted == rep.starts
    assert "unslotted" not in set(df["match"])
    assert int((df["action"] != wait).sum()) == rep.exact + rep.nearest  # one step per start
    unslotted = sum(1 for _, kind, _ in rep.start_matches if kind == "unslotted")
    assert unslotted == rep.unslotted
    assert math.isclose(df["reward"].sum(), -total_jct(records) / TS, rel_tol=1e-9)
