"""Counterfactual labels from the simulator (issue 23 item 2): what each move is worth
against following the base policy.

A ``LabelTask`` is one rollout of the base policy on a resampled training window
(``datasets.rollouts.window_workload``: the same block bootstrap, profiles and predictions
as the dataset rollouts), or of a roll-in policy (``rollin``: other policies visit other
states, e.g. the fragmented ones a backfill leaves; the base still continues every fork). At
``points`` decision points spread over the rollout (chosen among those where the mask allows
more than waiting), the state is encoded with the one
encoder (``cluster.mdp``) and the base's action (``StepPolicyAdapter``) and the top
alternatives are scored: wait, the other start rows (each slot's candidates in turn),
preempt and migrate rows when the MDP has running rows, up to ``alternatives`` distinct
moves. Each move is applied in ``n`` forks of the cluster as the policy knows it
(``cluster.fork``: run times drawn from the predictor, never read), the base finishes that
decision point and continues for ``horizon_s``; every move sees the same draws (common
random numbers). The label is the move's jobs-in-system seconds minus the base action's
(negative: better than the base; the base's own action is 0 by construction).

The task carries its base as a built ``Policy`` (resolved from a spec at the pipeline's
edge, ``pipelines.label``), so ``datasets/`` never imports ``models/``.

``run_labels`` maps ``label_task`` over tasks with ``linkwise.parallel.map_tasks``: here
(``"serial"``), in a local process pool (``"local"`` or ``"local:N"``, the default) or on a
Dask cluster (``"dask://HOST:PORT"``); rows come back in task order. ``write_labels`` writes
a content-hashed Parquet label set and its manifest.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Policy, Topology
from linkwise.cluster.fork import fresh, score_decisions
from linkwise.cluster.mdp import (
    Candidates,
    MdpConfig,
    StepPolicyAdapter,
    candidates,
    decode,
    encode,
    make_spec,
)
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.datasets.backlog import Backlog
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, window_workload
from linkwise.parallel import map_tasks
from linkwise.policies.lookahead import decision_key

__all__ = [
    "LABEL_SCHEMA",
    "LabelTask",
    "label_task",
    "read_labels",
    "run_labels",
    "write_labels",
]

FORMAT = "linkwise-labels"
VERSION = 1
LABEL_SCHEMA: Mapping[str, Any] = {
    "episode": pl.String,
    "point": pl.Int64,
    "time": pl.Float64,
    "obs": pl.List(pl.Float32),
    "mask": pl.List(pl.Boolean),
    "action": pl.Int64,
    "kind": pl.String,  # start, wait, preempt or migrate
    "base_action": pl.Int64,
    "label_s": pl.Float64,  # jobs-in-system seconds of the move less the base action's
    "cost_s": pl.Float64,  # the move's jobs-in-system seconds over the horizon (mean)
    "horizon_s": pl.Float64,
    "samples": pl.Int64,
}


@dataclass(frozen=True)
class LabelTask:
    """One labelled rollout of ``base`` on a resampled window (picklable: it travels to a
    process pool or a Dask worker). ``base_name`` names it in the episodes and the manifest."""

    base: Policy
    base_name: str
    window: Window
    topology: Topology
    seed: int = 0
    config: MdpConfig = field(default_factory=MdpConfig)
    calibration: Calibration = field(default_factory=load_calibration)
    restart: RestartModel = field(default_factory=RestartModel.sia)
    predictor: RuntimePredictor | None = None
    block_s: float = 1800.0
    horizon_s: float = 6 * 3600.0
    n: int = 4
    points: int = 8
    alternatives: int = 6
    backlog: Backlog | None = None  # the window starts from this state (warm start)
    terminal: bool = False  # add cluster.fork's terminal cost (the work left at the horizon)
    # the roll-in: the policy whose decisions are applied between labelled points (None: the
    # base); the labels still score moves against the base, which continues every fork
    rollin: Policy | None = None
    rollin_name: str = ""

    def __post_init__(self) -> None:
        if self.n < 1 or self.points < 1 or self.alternatives < 2:
            raise ValueError("a label task needs n >= 1, points >= 1 and alternatives >= 2")
        if not self.horizon_s > 0:
            raise ValueError("horizon_s must be positive")
        if self.rollin is not None and not self.rollin_name:
            raise ValueError("a roll-in policy needs a rollin_name")

    @property
    def episode(self) -> str:
        tail = f"/in-{self.rollin_name}" if self.rollin is not None else ""
        return f"labels/{self.base_name}/w{self.window.window_id}/s{self.seed}{tail}"


def _kind(cfg: MdpConfig, action: int) -> str:
    if action == cfg.wait_action:
        return "wait"
    if action < cfg.n_start_actions:
        return "start"
    return "preempt" if action < cfg.migrate_offset else "migrate"


def _alternatives(cands: Candidates, base_action: int, limit: int) -> list[int]:
    """The base's action, wait, then the other allowed rows: each slot's first candidate, its
    second, ... (slots in turn), then preempt rows, then migrate rows; distinct moves only,
    at most ``limit``."""
    cfg = cands.config
    allowed = set(np.flatnonzero(cands.mask).tolist())
    p = cfg.n_candidates
    starts = [
        k * p + c
        for c in range(p)
        for k in range(cfg.k_slots)
        if k * p + c < cfg.n_start_actions and k * p + c in allowed
    ]
    moves = sorted(a for a in allowed if cfg.n_start_actions <= a < cfg.wait_action)
    out: list[int] = []
    seen: set[tuple[Any, ...]] = set()
    for a in (base_action, cfg.wait_action, *starts, *moves):
        key = decision_key(decode(cands, a))
        if key in seen:
            continue
        seen.add(key)
        out.append(a)
        if len(out) >= limit:
            break
    return out


def _simulator(task: LabelTask) -> Simulator:
    jobs, running = window_workload(
        task.window,
        task.seed,
        task.block_s,
        task.calibration,
        task.topology.total_gpus,
        backlog=task.backlog,
        predictor=task.predictor,
    )
    model = AnalyticModel(task.calibration)
    return Simulator(task.topology, jobs, model, SimConfig(restart=task.restart), running=running)


def _step(base: Policy, rollin: Policy | None, state: ClusterState) -> Decision:
    """The decision applied at ``state``: the base's, or the roll-in's (the base still sees
    every state, so that a base with memory, such as Tiresias' queues, follows the run)."""
    d = base.decide(state)
    return d if rollin is None else rollin.decide(state)


def _choice_points(task: LabelTask, model: AnalyticModel) -> list[int]:
    """Indices of the decision points to label: ``points`` spread evenly over those of the
    roll-in's run where more than waiting is allowed (a first pass of the roll-in alone)."""
    sim, base = _simulator(task), fresh(task.base, model)
    rollin = None if task.rollin is None else fresh(task.rollin, model)
    eligible: list[int] = []
    i = 0
    while True:
        state = sim.observe()
        movable = bool(state.running) and task.config.running_slots > 0
        if (state.pending and state.total_free_gpus) or movable:
            eligible.append(i)
        sim.apply(_step(base, rollin, state))
        i += 1
        if not sim.advance():
            break
    if len(eligible) <= task.points:
        return eligible
    picks = np.linspace(0, len(eligible) - 1, task.points).round().astype(int)
    return sorted({eligible[j] for j in picks})


def label_task(task: LabelTask) -> pl.DataFrame:
    """The label rows of one task (see the module docstring), in decision-point order."""
    model = AnalyticModel(task.calibration)
    spec = make_spec(task.config)
    chosen = set(_choice_points(task, model))
    sim, base = _simulator(task), fresh(task.base, model)
    rollin = None if task.rollin is None else fresh(task.rollin, model)
    sim_cfg = SimConfig(restart=task.restart)
    rows: list[dict[str, Any]] = []
    i = 0
    while True:
        state: ClusterState = sim.observe()
        if i in chosen:
            rows += _label_point(task, state, base, model, spec, sim_cfg, i)
        sim.apply(_step(base, rollin, state))
        i += 1
        if not sim.advance():
            break
    return pl.DataFrame(rows, schema=dict(LABEL_SCHEMA))


def _label_point(
    task: LabelTask,
    state: ClusterState,
    base: Policy,
    model: AnalyticModel,
    spec: Any,
    sim_cfg: SimConfig,
    point: int,
) -> list[dict[str, Any]]:
    cfg = task.config
    cands = candidates(state, cfg, model)
    if not cands.mask[: cfg.wait_action].any():
        return []
    base_action = StepPolicyAdapter(fresh(base, model)).act(cands)
    actions = _alternatives(cands, base_action, task.alternatives)
    moves: list[Decision] = [decode(cands, a) for a in actions]
    costs = score_decisions(
        state,
        moves,
        base,
        model,
        sim_cfg,
        horizon_s=task.horizon_s,
        n=task.n,
        seed=zlib.crc32(f"{task.episode}/{point}".encode()),
        complete=True,
        terminal=task.terminal,
    )
    obs = encode(cands, spec).astype(np.float32).tolist()
    mask = cands.mask.tolist()
    return [
        {
            "episode": task.episode,
            "point": point,
            "time": state.time,
            "obs": obs,
            "mask": mask,
            "action": a,
            "kind": _kind(cfg, a),
            "base_action": base_action,
            "label_s": cost - costs[0],
            "cost_s": cost,
            "horizon_s": task.horizon_s,
            "samples": task.n,
        }
        for a, cost in zip(actions, costs, strict=True)
    ]


def _episode(task: LabelTask) -> str:
    return task.episode


def run_labels(tasks: Sequence[LabelTask], executor: str = "local") -> pl.DataFrame:
    """Every task's label rows, in task order, on ``executor``
    (``linkwise.parallel.map_tasks``: ``"serial"`` here, ``"local[:N]"`` a local process pool
    (default: the CPU count), ``"threads[:N]"``, ``"dask"`` or ``"dask://HOST:PORT"`` a
    running Dask scheduler; Prefect task runs named ``labels`` only where a Prefect API is
    configured or inside a flow run)."""
    frames = map_tasks(label_task, tasks, executor, name="labels", label=_episode)
    return pl.concat([pl.DataFrame(schema=dict(LABEL_SCHEMA)), *frames], how="vertical")


def _content_hash(df: pl.DataFrame, inputs: Mapping[str, Any]) -> str:
    """SHA-256 over the canonical rows (fixed byte layout per column) and the inputs' JSON."""
    h = hashlib.sha256(f"{FORMAT}/{VERSION}/{df.height}\n".encode())
    for name in LABEL_SCHEMA:
        col = df[name]
        h.update(name.encode() + b"\0")
        if isinstance(col.dtype, pl.List):
            h.update(col.list.len().to_numpy().astype("<i8").tobytes())
            flat = col.explode().to_numpy()
            h.update(flat.astype(np.uint8 if flat.dtype == np.bool_ else "<f4").tobytes())
        elif col.dtype == pl.String:
            h.update("\0".join(col.to_list()).encode())
        else:
            h.update(col.to_numpy().astype("<f8").tobytes())
    h.update(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def write_labels(
    df: pl.DataFrame, config: MdpConfig, sources: Mapping[str, Any], out_dir: str | Path
) -> dict[str, Any]:
    """Write the label rows as ``labels-<hash>.parquet`` plus its manifest (format, the MDP
    configuration and ObsSpec of the encoding, ``sources``: base, horizon, samples, windows,
    seeds, predictor; counts) into ``out_dir``; return the manifest with its paths."""
    if set(df.columns) != set(LABEL_SCHEMA):
        raise ValueError(f"label rows need exactly the columns {', '.join(LABEL_SCHEMA)}")
    canon = df.select(list(LABEL_SCHEMA)).sort("episode", "point", "action", maintain_order=True)
    spec = make_spec(config)
    inputs = {
        "format": FORMAT,
        "version": VERSION,
        "sources": json.loads(json.dumps(sources, sort_keys=True)),
        "obs_spec": spec.to_json(),
    }
    digest = _content_hash(canon, inputs)
    stem = f"labels-{digest[:16]}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points = canon.select("episode", "point").unique().height
    better = canon.filter(pl.col("label_s") < 0).select("episode", "point").unique().height
    manifest = {
        **inputs,
        "hash": digest,
        "file": f"{stem}.parquet",
        "obs_spec_version": spec.version,
        "counts": {
            "rows": canon.height,
            "points": points,
            "points_with_a_better_move": better,
            "by_kind": {
                str(k): int(v) for k, v in canon["kind"].value_counts().sort("kind").iter_rows()
            },
        },
    }
    tmp = out / f".{stem}.parquet.tmp"
    canon.write_parquet(tmp, compression="zstd", statistics=False)
    tmp.replace(out / f"{stem}.parquet")
    mtmp = out / f".{stem}.json.tmp"
    mtmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    mtmp.replace(out / f"{stem}.json")
    return {
        **manifest,
        "path": str(out / f"{stem}.parquet"),
        "manifest_path": str(out / f"{stem}.json"),
    }


def read_labels(path: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A label set ``write_labels`` wrote (its Parquet or manifest path); ValueError when the
    content no longer matches the manifest's hash."""
    p = Path(path)
    manifest: dict[str, Any] = json.loads((p.parent / f"{p.stem}.json").read_text())
    df = pl.read_parquet(p.parent / manifest["file"]).cast(pl.Schema(dict(LABEL_SCHEMA)))
    inputs = {k: manifest[k] for k in ("format", "version", "sources", "obs_spec")}
    if _content_hash(df, inputs) != manifest["hash"]:
        raise ValueError(f"{p}: content does not match the manifest's hash")
    return df, manifest


def timed(tasks: Sequence[LabelTask], executor: str) -> tuple[pl.DataFrame, float]:
    """The label rows and the wall seconds they took (for ``benchmarks/labels_speed.py``)."""
    t = time.perf_counter()
    df = run_labels(tasks, executor)
    return df, time.perf_counter() - t
