"""Simulator rollouts of behaviour policies: transitions that widen what the logs cover.

Behaviour policies are parsed policy specs (``policies.spec.PolicySpec``, parsed once where
the run starts; ``check_behaviour``): a same-information heuristic of
``linkwise.policies.heuristics`` with its parameters (``sjf_bco:lam=2``; never an oracle)
driven step by step through ``cluster.mdp.StepPolicyAdapter`` (the same candidates, mask and
encoder as the log builder, the trainer and the live loop; a preemptive heuristic's
preemptions and migrations are matched actions, ``match`` "preempt", "migrate" or
"migrate_nearest", when the task's ``MdpConfig`` has running rows, ``running_slots > 0``;
without them, or when the job's row is masked, they are ignored, counted by the adapter),
or a learned
package ``model:PATH`` acting on the observation itself (its own greedy action with its
work-conserving guard; jobs annotated by the task's predictor, else the package's). A learned
behaviour is resolved to its policy object at the pipeline's edge (``make_tasks(learned=...)``,
``pipelines.build_dataset.resolve_learned``): ``datasets`` never imports ``models``
(``tests/project/test_layering.py``). Either
is optionally mixed with random exploration: with
probability ``epsilon`` a step takes a uniformly random allowed action instead of the
heuristic's (on an idle cluster "wait" is left out of the random draw, so exploration never
stalls a simulation that nothing else would wake up).

Workloads come from the real arrival process: the jobs of a trace file (``load_trace``) or
of the DuckDB store's ``jobs`` table, cut into fixed time windows by submit time. Each
rollout resamples its window with a seeded **block bootstrap** of the arrival process: the
window is split into blocks of ``block_s`` seconds; as many blocks are drawn with
replacement as the window holds, and the i-th drawn block contributes its jobs (arrival
offsets inside the block, GPU counts, durations and users kept together) at the i-th block
position. Burstiness and the arrival/size/duration correlations below the block length are
kept exactly, the number of arrivals per block follows the window's empirical distribution,
and windows never borrow jobs from each other (so daily and weekly differences between
windows stay). ``block_s <= 0`` replays the window as it was.

Every job a behaviour policy or the encoder sees carries run-time predictions (``Job.pred_s``,
``pred_hi_s``) from the task's ``RuntimePredictor`` (``datasets.predictor``): the same
predictor for every task of a dataset (``make_tasks`` fits one on the windows' jobs when it
is given none), never the true run time.

``rollout(task)`` is deterministic for a task (seeded RNGs only; the simulator has no
randomness of its own). ``run_rollouts`` maps it over many tasks with
``linkwise.parallel.map_tasks``: in this process (``"serial"``), in a local process pool
(``"local"`` or ``"local:N"``), on threads, or on a Dask cluster (``"dask"`` for a temporary
local cluster, ``"dask://HOST:PORT"`` for a running scheduler); through a Prefect task runner
only where a Prefect API is configured or inside a flow run. The frames come back in task
order, whatever the executor.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb
import numpy as np
import polars as pl

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.env import ClusterEnv, Workload
from linkwise.cluster.mdp import (
    BoolArray,
    FloatArray,
    MdpConfig,
    ObsSpec,
    StepPolicyAdapter,
    make_spec,
)
from linkwise.cluster.profiles import Calibration, assign_profiles, load_calibration
from linkwise.datasets.backlog import Backlog, warm_jobs
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.traces import JOB_COLUMNS, frame_jobs, jobs_frame, load_trace
from linkwise.datasets.transitions import TransitionBuffer, empty_frame
from linkwise.parallel import map_tasks
from linkwise.policies.heuristics import make_policy, policy_names
from linkwise.policies.spec import PolicySpec

__all__ = [
    "Chooser",
    "RolloutTask",
    "StepBehaviour",
    "Window",
    "behaviour_chooser",
    "behaviour_name",
    "check_behaviour",
    "cut_windows",
    "jobs_from_store",
    "jobs_from_trace",
    "make_tasks",
    "policy_label",
    "resample_window",
    "rollout",
    "run_rollouts",
    "runs_from_store",
    "window_workload",
    "windows_predictor",
]


class StepBehaviour(Protocol):
    """A learned behaviour resolved at the pipeline's edge (``models.learned.LearnedPolicy``
    satisfies it): its observation spec, its package's run-time predictor, and its action on an
    observation. It must pickle to travel to a process pool or a Dask worker."""

    @property
    def spec(self) -> ObsSpec: ...

    @property
    def predictor(self) -> RuntimePredictor | None: ...

    def act(self, obs: FloatArray, mask: BoolArray) -> int: ...


@dataclass(frozen=True)
class Window:
    """The jobs submitted in ``[start, end)`` of a workload (times as in the source)."""

    window_id: int
    start: float
    end: float
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class RolloutTask:
    """One rollout: a behaviour policy on a resampled window, with everything it needs
    (picklable, so it can travel to a process pool or a Dask worker).

    ``topology`` and ``calibration`` are resolved once where the run starts (the task carries
    the values, never a string to parse again); ``max_steps`` cuts the episode (a timeout);
    ``backlog`` warm-starts the window from the history's state at its start
    (``window_workload``); ``predictor`` annotates the jobs with run-time predictions (None:
    one fit on the window's own jobs, ``windows_predictor``; ``make_tasks`` gives every task
    of a dataset the same one). ``learned``: the resolved policy of a ``model:PATH`` behaviour
    (required for one, refused for a heuristic).
    """

    policy: PolicySpec
    epsilon: float
    seed: int
    window: Window
    topology: Topology
    config: MdpConfig = field(default_factory=MdpConfig)
    calibration: Calibration = field(default_factory=load_calibration)
    block_s: float = 1800.0
    max_steps: int | None = None
    backlog: Backlog | None = None
    predictor: RuntimePredictor | None = None
    learned: StepBehaviour | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_behaviour(self.policy)  # ValueError: an oracle, a search, a registry model
        label = self.policy.label
        if self.policy.is_model and self.learned is None:
            raise ValueError(
                f"behaviour policy {label!r}: a learned behaviour is resolved to its policy "
                "at the pipeline's edge (make_tasks(learned=...), "
                "pipelines.build_dataset.resolve_learned)"
            )
        if not self.policy.is_model and self.learned is not None:
            raise ValueError(f"behaviour policy {label!r} is a heuristic, not learned")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ValueError("max_steps must be positive")

    @property
    def behaviour(self) -> str:
        return behaviour_name(policy_label(self.policy), self.epsilon)

    @property
    def episode(self) -> str:
        return f"rollout/{self.behaviour}/w{self.window.window_id}/s{self.seed}"


def behaviour_name(policy: str, epsilon: float) -> str:
    """``"best_fit"``, or ``"best_fit+eps0.1"`` for an epsilon-mixture."""
    return policy if epsilon == 0 else f"{policy}+eps{epsilon:g}"


def check_behaviour(spec: PolicySpec) -> None:
    """Refuse (ValueError) a spec no behaviour policy may be: behaviour policies see what the
    learner will, so every same-information heuristic with its parameters (``qssf``
    included: the tasks' jobs carry predictions) or a learned package folder
    (``model:PATH``); never an oracle ceiling, a composition or a search, nor a registry
    alias or URI (rollouts must not depend on where an alias points)."""
    if spec.source is not None:
        if spec.source.kind != "path":
            raise ValueError(
                f"behaviour policy {spec.label!r}: a learned one must be a package folder"
            )
        return
    known = policy_names(predictions=True, oracles=False)
    if spec.heuristic not in known:
        raise ValueError(
            f"unknown or oracle behaviour policy {spec.label!r}; "
            f"known: {', '.join(known)}, model:PATH"
        )


def policy_label(spec: PolicySpec) -> str:
    """A behaviour as it names episodes: the heuristic spec as given (``sjf_bco:lam=2``),
    ``model:FOLDER`` (the package folder's name, e.g. the training run id) for a learned one."""
    if spec.source is not None:
        return f"model:{Path(spec.source.target).name}"
    return spec.label


# ------------------------------------------------------------------------ workloads


def jobs_from_trace(
    path: str | Path, fmt: str = "auto", *, max_jobs: int | None = None
) -> pl.DataFrame:
    """The valid jobs of a trace file as a frame with ``JOB_COLUMNS``."""
    return jobs_frame(load_trace(path, fmt, max_jobs=max_jobs).jobs)


def runs_from_store(
    con: duckdb.DuckDBPyConnection,
    *,
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> pl.DataFrame:
    """Finished jobs of the store's ``jobs`` table, one row per Slurm job (``JOB_COLUMNS``
    plus ``last_end``, when its last run ended): submitted at its first submit time, asking
    its largest GPU count and time limit, lasting the sum of its runs (``end - start`` of
    every requeued run); the node count is left to ``domain.requested_shape``. Jobs without
    GPUs or run time are left out; ``since`` / ``until`` bound the first submit time
    (``[since, until)``). The one query of finished jobs in the store."""
    # a job is a chain of runs under one id from run 0 on; an id Slurm reused (its state
    # cleared) starts a new chain, a later generation, which gets an id of its own
    q = """
        WITH runs AS (
            SELECT *, sum(CASE WHEN run_index = 0 THEN 1 ELSE 0 END) OVER (
                PARTITION BY cluster, job_id ORDER BY submit_time, run_index
            ) - 1 AS generation
            FROM jobs
        )
        SELECT CASE WHEN generation <= 0 THEN job_id
                    ELSE -(job_id * 1000 + generation * 100) END AS job_id,
               min(submit_time) AS submit_time,
               max(gpus) AS num_gpus,
               sum(end_time - start_time) AS duration,
               '' AS profile,
               any_value(user_name) AS user,
               any_value(name) AS name,
               0 AS nodes,
               coalesce(max(time_limit_s), 0) AS time_limit,
               CAST(NULL AS BOOLEAN) AS flexible,
               max(end_time) AS last_end
        FROM runs
        WHERE start_time IS NOT NULL AND end_time IS NOT NULL AND end_time > start_time
          AND gpus > 0
          AND (CAST(? AS VARCHAR) IS NULL OR cluster = ?)
        GROUP BY cluster, runs.job_id, generation
        HAVING (CAST(? AS DOUBLE) IS NULL OR min(submit_time) >= ?)
           AND (CAST(? AS DOUBLE) IS NULL OR min(submit_time) < ?)
        ORDER BY submit_time, job_id
    """
    df: pl.DataFrame = con.sql(q, params=[cluster, cluster, since, since, until, until]).pl()
    return df.cast(pl.Schema({**JOB_COLUMNS, "last_end": pl.Float64}))


def jobs_from_store(
    con: duckdb.DuckDBPyConnection,
    *,
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> pl.DataFrame:
    """``runs_from_store`` as a jobs frame (``JOB_COLUMNS``)."""
    runs = runs_from_store(con, cluster=cluster, since=since, until=until)
    return runs.select(list(JOB_COLUMNS))


def cut_windows(
    jobs: pl.DataFrame, window_s: float, *, max_gpus: int | None = None, min_jobs: int = 1
) -> list[Window]:
    """Cut a jobs frame into windows of ``window_s`` seconds from its first submit (window id
    = index from there); jobs asking more than ``max_gpus`` are dropped, windows with fewer
    than ``min_jobs`` jobs skipped."""
    if not window_s > 0:
        raise ValueError("window_s must be positive")
    df = jobs.select(list(JOB_COLUMNS))
    if max_gpus is not None:
        df = df.filter(pl.col("num_gpus") <= max_gpus)
    if df.is_empty():
        return []
    t0 = float(df["submit_time"].min())  # type: ignore[arg-type]
    df = df.with_columns(
        ((pl.col("submit_time") - t0) / window_s).floor().cast(pl.Int64).alias("window")
    ).sort("window", "submit_time", "job_id")
    out: list[Window] = []
    for (wid,), part in df.group_by("window", maintain_order=True):
        if part.height < min_jobs:
            continue
        w = int(str(wid))
        out.append(
            Window(
                window_id=w,
                start=t0 + w * window_s,
                end=t0 + (w + 1) * window_s,
                jobs=frame_jobs(part.drop("window")),
            )
        )
    return out


def resample_window(window: Window, seed: int, block_s: float) -> tuple[Job, ...]:
    """The window's jobs resampled by a seeded block bootstrap (see the module docstring);
    job ids renumbered 0.. in submit order, the original id kept in ``name`` when it had
    none. ``block_s <= 0``: the window as it was, times shifted to start at 0."""
    df = jobs_frame(window.jobs).with_columns(
        pl.when(pl.col("name") == "")
        .then(pl.col("job_id").cast(pl.String))
        .otherwise(pl.col("name"))
        .alias("name")
    )
    if block_s <= 0 or df.is_empty():
        out = df.with_columns(pl.col("submit_time") - window.start)
    else:
        n_blocks = max(1, math.ceil((window.end - window.start) / block_s - 1e-9))
        rng = np.random.default_rng([seed, window.window_id, n_blocks])
        draws = pl.DataFrame(
            {
                "slot": np.arange(n_blocks, dtype=np.int64),
                "block": rng.integers(0, n_blocks, size=n_blocks).astype(np.int64),
            }
        )
        rel = pl.col("submit_time") - window.start
        blocks = df.with_columns(
            (rel / block_s).floor().cast(pl.Int64).clip(0, n_blocks - 1).alias("block")
        ).with_columns((rel - pl.col("block") * block_s).alias("offset"))
        out = (
            draws.join(blocks, on="block", how="inner")
            .with_columns((pl.col("slot") * block_s + pl.col("offset")).alias("submit_time"))
            .drop("slot", "block", "offset")
        )
    out = (
        out.sort("submit_time", "job_id")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("job_id"))
        .select(list(JOB_COLUMNS))
    )
    return frame_jobs(out)


def window_workload(
    window: Window,
    seed: int,
    block_s: float,
    calibration: Calibration,
    max_gpus: int,
    backlog: Backlog | None = None,
    predictor: RuntimePredictor | None = None,
) -> tuple[tuple[Job, ...], tuple[tuple[Job, Placement], ...]]:
    """A window's simulator inputs for a seed: the resampled jobs plus the backlog's pending
    jobs (arriving at the window's start, ids after the window's), profiles drawn with the
    seed, jobs larger than ``max_gpus`` left out; and the backlog's running jobs on their
    placements (``datasets.backlog``; empty without a backlog). ``predictor`` annotates the
    jobs without predictions (a backlog built with the same predictor has its own)."""
    resampled = resample_window(window, seed, block_s)
    running: tuple[tuple[Job, Placement], ...] = ()
    pending: tuple[Job, ...] = ()
    if backlog is not None:
        running, pending = warm_jobs(backlog, first_id=len(resampled))
    jobs = ensure_predicted(
        assign_profiles([*resampled, *pending], calibration, seed=seed), predictor
    )
    held = ensure_predicted(
        assign_profiles([j for j, _ in running], calibration, seed=seed), predictor
    )
    return (
        tuple(j for j in jobs if j.num_gpus <= max_gpus),
        tuple((j, p) for j, (_, p) in zip(held, running, strict=True)),
    )


# ------------------------------------------------------------------------ one rollout


def _rng(task: RolloutTask) -> np.random.Generator:
    return np.random.default_rng(
        [task.seed, task.window.window_id, zlib.crc32(task.behaviour.encode())]
    )


def rollout(task: RolloutTask) -> pl.DataFrame:
    """Simulate one behaviour policy on one resampled window; the steps as a transition frame
    (``datasets.transitions`` schema; source "rollout"). Deterministic for a task.

    ``match`` records how each heuristic step maps to the action space (exact, nearest,
    unslotted, wait, and with running rows preempt, migrate, migrate_nearest, from
    ``StepPolicyAdapter``); random exploration steps and a learned
    behaviour's own actions are "policy".
    The last step is ``terminal`` when every job finished, a ``timeout`` when ``max_steps``
    cut the episode or the behaviour waited on an idle cluster with nothing left to arrive.
    """
    topo, cal = task.topology, task.calibration
    own = task.learned.predictor if task.learned is not None else None
    predictor = task.predictor or own or windows_predictor((task.window,))
    jobs, running = window_workload(
        task.window, task.seed, task.block_s, cal, topo.total_gpus, task.backlog, predictor
    )
    spec = make_spec(task.config)
    buf = TransitionBuffer(obs_spec_version=spec.version)
    if not jobs:
        return empty_frame()
    model = AnalyticModel(cal)
    workload = Workload(topo, jobs, model, running=running)
    env = ClusterEnv(lambda _seed: workload, spec, max_steps=task.max_steps)
    choose = behaviour_chooser(task, spec, model)
    rng = _rng(task)
    wait = task.config.wait_action
    obs, info = env.reset(seed=task.seed)
    step = 0
    while True:
        mask = info["action_mask"]
        t = float(info["time"])
        if task.epsilon > 0 and rng.random() < task.epsilon:
            allowed = np.flatnonzero(mask)
            if info["running"] == 0 and len(allowed) > 1:
                allowed = allowed[allowed != wait]
            action = int(rng.choice(allowed))
            match = "policy"
        else:
            action, match = choose(env, obs, mask)
        next_obs, reward, terminated, truncated, info = env.step(action)
        buf.add(
            episode=task.episode,
            step=step,
            time=t,
            obs=obs,
            action=action,
            reward=reward,
            mask=mask,
            source="rollout",
            behaviour=task.behaviour,
            match=match,
        )
        step += 1
        obs = next_obs
        if terminated or truncated:
            buf.end_episode(terminal=terminated)
            break
    return buf.to_frame()


Chooser = Callable[[ClusterEnv, FloatArray, BoolArray], tuple[int, str]]


def behaviour_chooser(task: RolloutTask, spec: ObsSpec, model: AnalyticModel) -> Chooser:
    """The task's behaviour as ``(env, obs, mask) -> (action, match)``: a heuristic through
    ``StepPolicyAdapter`` (match: exact, nearest, unslotted or wait), a learned package by
    its own action on the observation (match "policy"; ValueError when its ObsSpec is not the
    task's)."""
    learned = task.learned
    if learned is not None:
        if learned.spec.version != spec.version:
            raise ValueError(
                f"behaviour policy {task.policy.label!r}: the model's ObsSpec is "
                f"{learned.spec.version}, the rollouts' {spec.version}: refusing a model built "
                "for other observations"
            )

        def act_learned(_env: ClusterEnv, obs: FloatArray, mask: BoolArray) -> tuple[int, str]:
            return learned.act(obs, mask), "policy"

        return act_learned
    params = dict(task.policy.params)
    if task.policy.heuristic == "random":
        params.setdefault("seed", task.seed)
    adapter = StepPolicyAdapter(make_policy(str(task.policy.heuristic), **params))

    def act_heuristic(env: ClusterEnv, _obs: FloatArray, _mask: BoolArray) -> tuple[int, str]:
        action = adapter.act(env.candidates)
        return action, adapter.matches[-1].kind

    return act_heuristic


def make_tasks(
    windows: Sequence[Window],
    policies: Sequence[PolicySpec],
    seeds: Sequence[int],
    topology: Topology,
    *,
    epsilons: Sequence[float] = (0.0,),
    config: MdpConfig | None = None,
    calibration: Calibration | None = None,
    block_s: float = 1800.0,
    max_steps: int | None = None,
    backlogs: Mapping[int, Backlog] | None = None,
    predictor: RuntimePredictor | None = None,
    learned: Mapping[PolicySpec, StepBehaviour] | None = None,
) -> list[RolloutTask]:
    """The grid (policy, epsilon) x window x seed, in that nesting order; ``backlogs``
    (window id -> the history's state at its start) warm-starts the windows it names;
    ``calibration`` None is the shipped one. Every task shares ``predictor``; None fits one
    on the windows' jobs (the span the rollouts cover, ``windows_predictor``). ``learned``
    maps each ``model:PATH`` behaviour of ``policies`` to its resolved policy."""
    cfg = config or MdpConfig()
    cal = calibration if calibration is not None else load_calibration()
    if predictor is None and windows:
        predictor = windows_predictor(windows)
    return [
        RolloutTask(
            policy=p,
            epsilon=float(e),
            seed=int(s),
            window=w,
            topology=topology,
            config=cfg,
            calibration=cal,
            block_s=block_s,
            max_steps=max_steps,
            backlog=(backlogs or {}).get(w.window_id),
            predictor=predictor,
            learned=(learned or {}).get(p),
        )
        for p in policies
        for e in epsilons
        for w in windows
        for s in seeds
    ]


def windows_predictor(windows: Sequence[Window]) -> RuntimePredictor:
    """A run-time predictor fit on the jobs of ``windows`` (submitted before the last one's
    end): what rollouts over those windows use when no history predictor is given."""
    jobs = [j for w in windows for j in w.jobs]
    return RuntimePredictor.fit(jobs, until=max(w.end for w in windows))


# ------------------------------------------------------------------------ in parallel


def _episode(task: RolloutTask) -> str:
    return task.episode


def run_rollouts(
    tasks: Sequence[RolloutTask], executor: str = "serial", *, batch: int = 1
) -> pl.DataFrame:
    """All tasks' transitions, concatenated in task order, on ``executor``
    (``linkwise.parallel.map_tasks``: ``"serial"`` here, a process pool, threads or Dask;
    Prefect task runs named ``rollouts`` only where a Prefect API is configured or inside a
    flow run), ``batch`` rollouts to a worker at a time."""
    frames = map_tasks(rollout, tasks, executor, batch=batch, name="rollouts", label=_episode)
    return pl.concat([empty_frame(), *frames], how="vertical")
