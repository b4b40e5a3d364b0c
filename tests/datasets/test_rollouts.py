"""Simulator rollouts: windows of the real Philly arrivals, block-bootstrap resampling, and
deterministic behaviour-policy rollouts in the transition schema."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from linkwise.cluster.domain import Job, Placement
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.slurm.records import JobRun
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.backlog import Backlog, backlog_from_store
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import (
    RolloutTask,
    Window,
    behaviour_name,
    check_behaviour,
    cut_windows,
    jobs_from_store,
    jobs_from_trace,
    make_tasks,
    policy_label,
    resample_window,
    rollout,
    run_rollouts,
    window_workload,
)
from linkwise.datasets.store import open_store
from linkwise.datasets.transitions import TRANSITION_SCHEMA, check_frame
from linkwise.datasets.windows import choose_windows
from linkwise.policies.spec import PolicySpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "8x8,leaf=2"
CONFIG = MdpConfig(k_slots=4)


@pytest.fixture(scope="module")
def philly() -> pl.DataFrame:
    return jobs_from_trace(PHILLY)


@pytest.fixture(scope="module")
def windows(philly: pl.DataFrame) -> list[Window]:
    return cut_windows(philly, 3600.0, max_gpus=64)


@pytest.fixture(scope="module")
def window(windows: list[Window]) -> Window:
    """A busy hour of the real trace (30 to 45 jobs)."""
    return next(w for w in windows if 30 <= len(w.jobs) <= 45)


def test_windows_partition_the_trace(philly: pl.DataFrame, windows: list[Window]) -> None:
    kept = philly.filter(pl.col("num_gpus") <= 64)
    assert sum(len(w.jobs) for w in windows) == kept.height
    ids = [w.window_id for w in windows]
    assert ids == sorted(set(ids))
    for w in windows:
        assert w.end - w.start == 3600.0
        assert all(w.start <= j.submit_time < w.end and j.num_gpus <= 64 for j in w.jobs)
    assert min(philly["submit_time"]) == windows[0].start


def _block_marks(jobs: tuple, start: float, block_s: float) -> Counter[tuple[float, int, float]]:
    return Counter(
        (round((j.submit_time - start) % block_s, 6), j.num_gpus, j.duration) for j in jobs
    )


def test_block_bootstrap_keeps_blocks_and_is_seeded(window: Window) -> None:
    block = 600.0
    a = resample_window(window, seed=1, block_s=block)
    assert a == resample_window(window, seed=1, block_s=block)
    b = resample_window(window, seed=2, block_s=block)
    assert a != b
    for jobs in (a, b):
        assert [j.job_id for j in jobs] == list(range(len(jobs)))
        assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
        assert all(0.0 <= j.submit_time < 3600.0 for j in jobs)
        # every resampled job is an original one at the same offset inside its block
        original = _block_marks(window.jobs, window.start, block)
        assert set(_block_marks(jobs, 0.0, block)) <= set(original)

    # whole blocks move together: each output block holds exactly the jobs of one source block
    def marks(jobs: list, origin: float) -> list[tuple[float, int, float]]:
        return sorted((round(j.submit_time - origin, 6), j.num_gpus, j.duration) for j in jobs)

    sources = [
        marks(
            [
                j
                for j in window.jobs
                if window.start + k * block <= j.submit_time < window.start + (k + 1) * block
            ],
            window.start + k * block,
        )
        for k in range(6)
    ]
    for slot in range(6):
        got = marks(
            [j for j in a if slot * block <= j.submit_time < (slot + 1) * block], slot * block
        )
        assert got in sources
    # block_s = 0 replays the window as it was, from t = 0
    same = resample_window(window, seed=5, block_s=0.0)
    assert [(j.submit_time, j.num_gpus, j.duration) for j in same] == [
        (j.submit_time - window.start, j.num_gpus, j.duration) for j in window.jobs
    ]


def test_bootstrap_arrival_counts_follow_the_blocks(window: Window) -> None:
    """Over many seeds the mean number of arrivals is the window's (unbiased), and a
    resample's count lies between 6 x the smallest and 6 x the largest block count."""
    block = 600.0
    counts = np.bincount(
        [int((j.submit_time - window.start) // block) for j in window.jobs], minlength=6
    )
    sizes = [len(resample_window(window, seed=s, block_s=block)) for s in range(200)]
    assert abs(np.mean(sizes) - len(window.jobs)) < 0.15 * len(window.jobs)
    assert all(6 * counts.min() <= n <= 6 * counts.max() for n in sizes)


def _specs(*texts: str) -> list[PolicySpec]:
    return [PolicySpec.parse(t) for t in texts]


def _task(
    window: Window,
    policy: str = "best_fit",
    eps: float = 0.0,
    seed: int = 0,
    max_steps: int | None = None,
) -> RolloutTask:
    return RolloutTask(
        policy=PolicySpec.parse(policy),
        epsilon=eps,
        seed=seed,
        window=window,
        topology=from_spec(TOPO),
        config=CONFIG,
        block_s=600.0,
        max_steps=max_steps,
    )


def test_rollout_is_deterministic_per_seed(window: Window) -> None:
    t = _task(window, eps=0.2, seed=3)
    a = rollout(t)
    assert a.equals(rollout(t))
    assert not a.equals(rollout(_task(window, eps=0.2, seed=4)))
    check_frame(a)
    assert dict(a.schema) == TRANSITION_SCHEMA
    spec = make_spec(CONFIG)
    obs = np.array(a["obs"].to_list(), dtype=np.float32)
    masks = np.array(a["mask"].to_list(), dtype=bool)
    assert obs.shape == (a.height, spec.dim) and np.isfinite(obs).all()
    assert masks.shape == (a.height, spec.n_actions)
    assert masks[np.arange(a.height), a["action"].to_numpy()].all()  # never a masked action
    assert a["episode"].unique().to_list() == [f"rollout/best_fit+eps0.2/w{window.window_id}/s3"]
    assert a["step"].to_list() == list(range(a.height))
    assert a["terminal"].to_list()[-1] and a["terminal"].sum() == 1 and not a["timeout"].any()
    assert set(a["source"]) == {"rollout"} and set(a["behaviour"]) == {"best_fit+eps0.2"}
    kinds = Counter(a["match"])
    assert kinds["policy"] > 0 and kinds["exact"] > 0
    starts = a.filter(pl.col("action") != CONFIG.wait_action)
    assert (starts["reward"] == 0.0).all()  # starts inside a decision point are free
    assert a["reward"].sum() < 0.0


def test_pure_heuristic_rollout_reproduces_the_heuristic(window: Window) -> None:
    df = rollout(_task(window, policy="fifo", seed=1))
    kinds = Counter(df["match"])
    assert "policy" not in kinds
    assert kinds["exact"] > 0.9 * (kinds["exact"] + kinds["nearest"] + kinds["unslotted"])


def test_max_steps_cuts_the_episode_as_a_timeout(window: Window) -> None:
    df = rollout(_task(window, max_steps=7))
    assert df.height == 7
    assert df["timeout"].to_list() == [False] * 6 + [True]
    assert not df["terminal"].any()


def test_task_grid_and_validation(windows: list[Window]) -> None:
    ws = windows[:2]
    tasks = make_tasks(ws, _specs("fifo", "sjf_bco"), [0, 1], from_spec(TOPO), epsilons=(0.0, 0.5))
    assert len(tasks) == 2 * 2 * 2 * 2
    assert len({t.episode for t in tasks}) == len(tasks)
    assert behaviour_name("fifo", 0.0) == "fifo" and behaviour_name("fifo", 0.5) == "fifo+eps0.5"
    with pytest.raises(ValueError, match="unknown or oracle behaviour policy"):
        _task(ws[0], policy="srtf_oracle")
    with pytest.raises(ValueError, match="unknown policy"):
        _task(ws[0], policy="nope")
    with pytest.raises(ValueError, match="epsilon"):
        _task(ws[0], eps=1.5)
    assert run_rollouts([]).height == 0


def test_serial_rollouts_concatenate_in_task_order(window: Window) -> None:
    tasks = [
        _task(window, policy=p, seed=s, max_steps=15) for p in ("fifo", "sjf_bco") for s in (0, 1)
    ]
    df = run_rollouts(tasks, "serial")
    check_frame(df)
    assert df["episode"].unique(maintain_order=True).to_list() == [t.episode for t in tasks]


def _run(
    job_id: int,
    run_index: int,
    submit: float,
    start: float | None,
    end: float | None,
    gpus: int,
    state: str = "COMPLETED",
) -> JobRun:
    return JobRun(
        cluster="c",
        job_id=job_id,
        run_index=run_index,
        name=f"j{job_id}",
        user="u",
        account="a",
        partition="gpu",
        state=state,
        exit_code=0,
        signal=None,
        submit_time=submit,
        start_time=start,
        end_time=end,
        time_limit_s=None,
        nodes=("n1",) if gpus else (),
        gpus=gpus,
        gpus_per_node=(gpus,) if gpus else (),
        allocation_nodes=1 if gpus else 0,
        settled=True,
    )


def test_jobs_from_store_aggregates_runs() -> None:
    con = open_store(":memory:")
    runs = [
        _run(1, 0, 100.0, 110.0, 200.0, 4, "REQUEUED"),
        _run(1, 1, 100.0, 300.0, 350.0, 4),  # requeued: one job, 90 + 50 s of run time
        _run(2, 0, 150.0, 160.0, 460.0, 2),
        _run(3, 0, 170.0, None, None, 0, "CANCELLED"),  # never ran: left out
        _run(4, 0, 900.0, 950.0, 1000.0, 8),
    ]
    assert ingest_job_runs(con, runs, source="test").rejected == 0
    df = jobs_from_store(con)
    assert df.select("job_id", "submit_time", "num_gpus", "duration").rows() == [
        (1, 100.0, 4, 140.0),
        (2, 150.0, 2, 300.0),
        (4, 900.0, 8, 50.0),
    ]
    assert jobs_from_store(con, since=120.0, until=500.0)["job_id"].to_list() == [2]
    w = cut_windows(df, 500.0)
    assert [(x.window_id, len(x.jobs)) for x in w] == [(0, 2), (1, 1)]


def test_tasks_share_one_predictor_and_annotate_every_job(windows: list[Window]) -> None:
    """``make_tasks`` gives every task one predictor (fit on the windows' jobs when none is
    given); a window's workload, backlog included, carries its predictions."""
    tasks = make_tasks(
        windows[:2], _specs("fifo", "best_fit"), [0, 1], from_spec(TOPO), config=CONFIG
    )
    first = tasks[0].predictor
    assert first is not None and all(t.predictor is first for t in tasks)
    assert first.fit_until == max(w.end for w in windows[:2])
    given = RuntimePredictor.fit([Job(1, 0.0, 1, 60.0)])
    one = make_tasks(windows[:1], _specs("fifo"), [0], from_spec(TOPO), predictor=given)
    assert all(t.predictor is given for t in one)
    backlog = Backlog(
        time=0.0,
        running=((Job(900, 0.0, 8, 5.0, pred_s=50.0, pred_hi_s=70.0), Placement.of([(0, 8)])),),
        pending=(Job(901, 0.0, 4, 5.0),),
    )
    jobs, running = window_workload(
        windows[0], 0, 600.0, load_calibration(None), 64, backlog, given
    )
    assert all(j.predicted for j in jobs)
    assert (running[0][0].pred_s, running[0][0].pred_hi_s) == (50.0, 70.0)  # kept
    assert jobs[0].pred_s == given.predict(jobs[0])[0]


def test_backlog_predictions_come_from_what_slurm_knew(tmp_path: Path) -> None:
    """A backlog built with a predictor: a pending job predicted from its name and whole time
    limit; a running job's predictions less the time it has run (it restarts at t)."""
    t0 = 1.7e9
    past = [Job(i, t0 - 1e5 + i, 8, 3000.0, user="u", name="train") for i in range(6)]
    predictor = RuntimePredictor.fit(past)
    runs = [
        JobRun("c", 1, 0, "train", "u", "a", "gpu", "COMPLETED", 0, None, t0, t0 + 100,
               t0 + 5000, None, ("gpu1",), 8, (8,), 1, True),
        JobRun("c", 2, 0, "train", "u", "a", "gpu", "COMPLETED", 0, None, t0 + 10, t0 + 2000,
               t0 + 3000, 7200.0, ("gpu2",), 8, (8,), 1, True),
    ]  # fmt: skip
    with open_store(tmp_path / "s.duckdb") as con:
        ingest_job_runs(con, runs, source="test")
        b = backlog_from_store(con, from_spec("2x8"), None, t0 + 1000.0, predictor)
        bare = backlog_from_store(con, from_spec("2x8"), None, t0 + 1000.0)
    (run, _), (pend,) = b.running[0], b.pending
    assert run.pred_s == pytest.approx(3000.0 - 900.0)  # 900 s run of a 3000 s prediction
    assert pend.pred_s == pytest.approx(3000.0) and pend.name == "2"  # "train" predicted it
    assert not bare.pending[0].predicted and not bare.running[0][0].predicted


def test_rollouts_take_qssf_and_refuse_oracles() -> None:
    wins = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64), n=1, min_jobs=20
    )
    tasks = make_tasks(wins, _specs("qssf"), [0], from_spec("8x8"), block_s=600.0)
    df = run_rollouts(tasks)
    assert df.height > 0 and set(df["behaviour"]) == {"qssf"}
    with pytest.raises(ValueError, match="oracle"):
        make_tasks(wins, _specs("srtf_oracle"), [0], from_spec("8x8"))


def test_behaviours_are_policy_specs(window: Window) -> None:
    """Heuristics with parameters go through the one spec parser (their label names the
    episodes); oracles, bad parameters and registry models are refused."""
    tasks = make_tasks([window], _specs("sjf_bco:lam=2", "tiresias_las"), [0], from_spec(TOPO),
        epsilons=(0.1,), config=CONFIG, block_s=600.0, max_steps=60,
    )  # fmt: skip
    df = run_rollouts(tasks)
    assert set(df["behaviour"]) == {"sjf_bco:lam=2+eps0.1", "tiresias_las+eps0.1"}
    assert f"rollout/sjf_bco:lam=2+eps0.1/w{window.window_id}/s0" in set(df["episode"])
    assert {"exact", "policy"} <= set(df["match"])
    for bad, why in (
        ("sjf_bco_oracle:lam=2", "oracle"),
        ("sjf_bco:lam=x", "lam"),
        ("sjf_bco:nope=1", "nope"),
        ("model:challenger", "package folder"),
        ("model:models:/linkwise-policy/3", "package folder"),
    ):
        with pytest.raises(ValueError, match=why):
            make_tasks([window], [PolicySpec.parse(bad)], [0], from_spec(TOPO))
    for refused in ("compose:order=gpus,placement=bounded", "lookahead:base=fifo"):
        with pytest.raises(ValueError, match="behaviour policy"):
            check_behaviour(PolicySpec.parse(refused))
    check_behaviour(PolicySpec.parse("model:/tmp/pkg"))  # a package folder is one
    assert policy_label(PolicySpec.parse("model:/tmp/runs/abc123")) == "model:abc123"
    assert policy_label(PolicySpec.parse(" sjf_bco:lam=2 ")) == "sjf_bco:lam=2"
