"""Building and checking a residual policy (issue 23 items 1, 3, 5).

1. ``choose_base``: every same-information heuristic ``linkwise policies`` lists
   (``evaluation.gates.same_information_heuristics``) on the validation cases (the
   validation windows of ``pipelines.selection``, warm-started like the evaluation's); the
   lowest average JCT is the base, recorded with every candidate's figure.
2. ``label_datasets``: the counterfactual label set (``datasets.labels``) as d3rlpy
   datasets: for DiscreteBC one transition per labelled decision point, its action the
   labelled best move (the least jobs-in-system time; ties: the base's); for DiscreteCQL
   every scored move as a one-step terminal transition whose reward is minus its label in
   job-hours (its counterfactual return against following the base), so a Q difference
   estimates the hours a deviation saves. Both carry each state's action mask
   (``models.masked``).
3. ``train_on_labels``: BC or CQL on one of them (``models.training.build_algo``/``fit``),
   one MLflow run with the label set's hash (``linkwise.dataset_hash``) as ``pipelines.train``
   records a transition dataset's; the package is a ``models.learned`` package.
4. ``choose_margin``: the residual package written for every margin of a small sweep (``inf``
   always among them: the base itself) and run on the validation cases; the lowest average
   JCT wins (ties: the larger margin), so on the validation days the result is at worst the
   base. ``build_residual`` chains 3-4.
5. ``dagger_round``: labels on the states of the current residual's own rollouts (the
   residual as the labels' rollout and continuation policy), appended to the label set,
   BC retrained: one round of classification-based policy iteration.
6. ``robustness``: a package and its base on cluster sizes and fabrics it was not trained
   on (``robustness_topologies``: 0.5x/1x/2x the nodes, default and oversubscribed leaf
   uplinks); ``evaluation.gates.check_robustness`` refuses it above 1.02x its base on any.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.mdp import ObsSpec, make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, run_labels
from linkwise.datasets.prediction import read_predictor
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.datasets.transitions import list_column_array
from linkwise.evaluation.benchmark import EvalCase, PolicyRef, make_cases, run_benchmark
from linkwise.evaluation.gates import GateReport, check_robustness, same_information_heuristics
from linkwise.models.build import build_policy
from linkwise.models.learned import PREDICTOR, verify_checksums
from linkwise.models.packaging import save_package
from linkwise.models.registry import (
    default_tracking_uri,
    ensure_experiment,
    mlflow_env,
    registry_client,
)
from linkwise.models.residual import (
    Deferral,
    format_margin,
    topology_signature,
    write_residual_package,
)
from linkwise.models.training import (
    AlgoConfig,
    MlflowAdapterFactory,
    action_values,
    build_algo,
    fit,
    pick_device,
    quiet_d3rlpy,
)
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_MARGINS",
    "BaseChoice",
    "LabelTraining",
    "MarginChoice",
    "RobustCase",
    "best_actions",
    "choose_base",
    "choose_margin",
    "dagger_round",
    "label_datasets",
    "label_headroom",
    "robustness",
    "robustness_check",
    "robustness_topologies",
    "train_on_labels",
]

LABEL_SCALE_S = 3600.0  # CQL's reward: minus the label in job-hours
DEFAULT_MARGINS: tuple[float, ...] = (math.inf, 2.0, 1.0, 0.5, 0.25)


# ------------------------------------------------------------------------ the base


@dataclass(frozen=True)
class BaseChoice:
    """The chosen base and every candidate's validation average JCT (None: it failed)."""

    spec: PolicySpec
    avg_jct_s: float
    figures: dict[str, float | None]  # candidate label -> its average JCT

    def to_json(self) -> dict[str, Any]:
        return {"base": self.spec.label, "avg_jct_s": self.avg_jct_s, "candidates": self.figures}


def choose_base(
    cases: Sequence[EvalCase],
    candidates: Sequence[PolicySpec] | None = None,
    *,
    executor: str = "serial",
) -> BaseChoice:
    """The same-information heuristic with the lowest average JCT on ``cases`` (the
    validation windows); ``candidates`` default: ``same_information_heuristics`` (those
    needing predictions only when the cases carry a predictor). Ties: the earlier listed."""
    specs = list(
        candidates
        if candidates is not None
        else [
            PolicySpec.parse(n)
            for n in same_information_heuristics(predictions=cases[0].predictor is not None)
        ]
    )
    if not specs:
        raise ValueError("no candidate base policies")
    bench = run_benchmark(specs, cases, executor=executor)
    figures: dict[str, float | None] = dict.fromkeys(s.label for s in specs)
    for row in bench.summary():
        figures[row["policy"]] = float(row["avg_jct_s"])
    ranked = [(v, i) for i, (n, v) in enumerate(figures.items()) if v is not None]
    if not ranked:
        raise ValueError("no candidate base finished the validation cases")
    value, i = min(ranked)
    return BaseChoice(specs[i], value, figures)


# ------------------------------------------------------------------------ datasets


def best_actions(df: pl.DataFrame) -> pl.DataFrame:
    """One row per labelled decision point: its observation, mask and the labelled best
    move (least ``label_s``; ties: the base's action, whose label is 0)."""
    ranked = df.with_columns(
        (pl.col("action") != pl.col("base_action")).cast(pl.Int8).alias("_not_base")
    ).sort("episode", "point", "label_s", "_not_base", "action")
    return ranked.group_by("episode", "point", maintain_order=True).first().drop("_not_base")


def label_headroom(df: pl.DataFrame) -> dict[str, Any]:
    """The teacher's headroom over the base in a label set, from its rows as they are: the
    labelled decision points, those where the labelled best move is not the base's (a move
    with a negative label: the manifest's ``points_with_a_better_move``), the jobs-in-system
    seconds the best move saves (``mean_gain_s`` over every point, 0 where the base's move is
    best; ``mean_gain_s_where_better``; ``total_gain_s``) and the better moves' kinds."""
    best = best_actions(df)
    gain = np.clip(-best["label_s"].to_numpy(), 0.0, None)
    better = best.filter(pl.col("action") != pl.col("base_action"))
    where = -better["label_s"].to_numpy()
    kinds = better.group_by("kind").len().sort("kind")
    return {
        "points": best.height,
        "points_with_a_better_move": better.height,
        "mean_gain_s": float(gain.mean()) if gain.size else 0.0,
        "mean_gain_s_where_better": float(where.mean()) if where.size else 0.0,
        "total_gain_s": float(gain.sum()),
        "better_move_kinds": {str(k): int(n) for k, n in kinds.iter_rows()},
    }


def _mdp_dataset(df: pl.DataFrame, spec: ObsSpec, rewards: np.ndarray) -> Any:
    """One-step terminal transitions with each state's mask in the observation."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy  # type: ignore[import-untyped]

    obs = list_column_array(df, "obs", spec.dim, np.float32)
    masks = list_column_array(df, "mask", spec.n_actions, np.bool_)
    actions = df["action"].to_numpy().astype(np.int64)
    if not masks[np.arange(len(actions)), actions].all():
        raise ValueError("a labelled action is not allowed by its own mask")
    n = len(actions)
    return d3rlpy.dataset.MDPDataset(
        observations=[obs, masks.astype(np.float32)],
        actions=actions,
        rewards=rewards.astype(np.float32),
        terminals=np.ones(n, dtype=np.float32),
        timeouts=np.zeros(n, dtype=np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=spec.n_actions,
    )


def label_datasets(df: pl.DataFrame, spec: ObsSpec) -> tuple[Any, Any]:
    """The BC dataset (the labelled best move per point) and the CQL dataset (every scored
    move, reward ``-label_s / 3600``), both one-step terminal transitions with masks."""
    if df.is_empty():
        raise ValueError("an empty label set")
    best = best_actions(df)
    bc = _mdp_dataset(best, spec, np.zeros(best.height))
    cql = _mdp_dataset(df, spec, -df["label_s"].to_numpy() / LABEL_SCALE_S)
    return bc, cql


# ------------------------------------------------------------------------ training


@dataclass(frozen=True)
class LabelTraining:
    """A BC or CQL run on a label set: the MLflow run, the package, what it fit."""

    algo: str
    run_id: str
    package_dir: str
    dataset_hash: str
    transitions: int
    steps: int
    steps_per_s: float
    label_match: float  # share of points whose greedy allowed action is the labelled best


def train_on_labels(
    df: pl.DataFrame,
    manifest: Mapping[str, Any],
    algo: str,
    params: AlgoConfig,
    out_dir: str | Path,
    *,
    predictor: RuntimePredictor | None = None,
    tracking_uri: str | None = None,
    experiment: str = "linkwise-residual",
    seed: int = 0,
    device: str = "cpu",
) -> LabelTraining:
    """Fit ``algo`` ("bc" or "cql") on the label set (``label_datasets``), tracked in one
    MLflow run (parameters, the label set's hash as ``dataset.hash`` and the
    ``linkwise.dataset_hash`` tag, d3rlpy's metrics), and write its package into
    ``out_dir/RUN_ID``."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy
    import mlflow

    if not params.masked or params.network != "mlp":
        raise ValueError("label training uses the masked MLP")
    spec = ObsSpec.from_json(manifest["obs_spec"])
    with quiet_d3rlpy():
        bc_ds, cql_ds = label_datasets(df, spec)
    train = bc_ds if algo == "bc" else cql_ds
    best = best_actions(df)
    mlflow_env()
    uri = tracking_uri or default_tracking_uri()
    client = registry_client(uri)
    mlflow.set_tracking_uri(uri)
    exp_id = ensure_experiment(client, experiment, tracking_uri=uri)
    data_hash = str(manifest["hash"])
    with mlflow.start_run(experiment_id=exp_id, run_name=f"labels-{algo}") as run:
        run_id = run.info.run_id
        mlflow.log_params(
            {
                "algo": algo,
                "dataset.hash": data_hash,
                "dataset.kind": "counterfactual-labels",
                "dataset.rows": str(df.height),
                "dataset.points": str(best.height),
                "seed": str(seed),
                **{f"train.{k}": str(v) for k, v in params.__dict__.items()},
            }
        )
        mlflow.set_tags({"linkwise.algo": algo, "linkwise.dataset_hash": data_hash})
        d3rlpy.seed(seed)
        model = build_algo(algo, params, pick_device(device), spec=spec)
        t = time.perf_counter()
        fit(model, train, params, evaluators={}, adapter=MlflowAdapterFactory(client, run_id))
        fit_s = time.perf_counter() - t
        obs = list_column_array(best, "obs", spec.dim, np.float32)
        masks = list_column_array(best, "mask", spec.n_actions, np.bool_)
        values = np.where(masks, action_values(model, obs), -np.inf)
        match = float(np.mean(values.argmax(axis=1) == best["action"].to_numpy()))
        sps = params.n_steps / fit_s if fit_s > 0 else math.nan
        mlflow.log_metrics({"label_match": match, "steps_per_s": sps}, step=params.n_steps)
        pkg = save_package(
            model,
            spec,
            {**manifest, "hash": data_hash},
            Path(out_dir) / run_id,
            meta={"mlflow_run_id": run_id, "trained_on": "counterfactual-labels"},
            predictor=predictor,
        )
    return LabelTraining(
        algo, run_id, str(pkg), data_hash, train.transition_count, params.n_steps, sps, match
    )


def label_deferral(
    df: pl.DataFrame,
    spec: ObsSpec,
    topologies: Sequence[str],
    *,
    tolerance: float = 0.05,
    min_support: int = 3,
) -> Deferral:
    """The deferral rule of a label set (``models.residual.Deferral.from_labels``)."""
    obs = list_column_array(df, "obs", spec.dim, np.float32)
    return Deferral.from_labels(
        obs,
        df["action"].to_numpy(),
        spec.n_actions,
        topologies,
        tolerance=tolerance,
        min_support=min_support,
    )


# ------------------------------------------------------------------------ the margin


@dataclass(frozen=True)
class MarginChoice:
    """Every margin's validation figures (avg JCT, deviations per 1,000) and the choice."""

    margin: float
    package_dir: str
    figures: dict[str, dict[str, float | None]]

    def to_json(self) -> dict[str, Any]:
        return {
            "margin": format_margin(self.margin),
            "package": self.package_dir,
            "candidates": self.figures,
        }


def choose_margin(
    learned_dir: str | Path,
    base: BaseChoice,
    deferral: Deferral,
    cases: Sequence[EvalCase],
    out_dir: str | Path,
    margins: Sequence[float] = DEFAULT_MARGINS,
    *,
    executor: str = "serial",
) -> MarginChoice:
    """A residual package per margin (``out_dir/margin-M``), each run on ``cases``; the
    lowest average JCT wins, ties to the larger margin (``inf`` is always a candidate)."""
    out = Path(out_dir)
    sweep = sorted({math.inf, *(float(m) for m in margins)}, reverse=True)
    pkgs: dict[str, Path] = {}
    for m in sweep:
        label = f"margin-{format_margin(m)}"
        pkgs[label] = write_residual_package(
            learned_dir,
            out / label,
            base=base.spec.label,
            margin=m,
            deferral=deferral,
            chosen={"base": base.to_json()},
        )
    refs = [PolicyRef(label, PolicySpec.parse(f"model:{p}")) for label, p in pkgs.items()]
    bench = run_benchmark(refs, cases, executor=executor)
    figures: dict[str, dict[str, float | None]] = {
        label: {"avg_jct_s": None, "deviations_per_1000": None} for label in pkgs
    }
    for row in bench.summary():
        figures[row["policy"]] = {
            "avg_jct_s": float(row["avg_jct_s"]),
            "deviations_per_1000": _opt(row.get("deviations_per_1000")),
        }
    ranked = [
        (f["avg_jct_s"], i)
        for i, f in enumerate(figures.values())
        if f["avg_jct_s"] is not None and math.isfinite(f["avg_jct_s"])
    ]
    if not ranked:
        raise ValueError("no margin finished the validation cases")
    i = min(ranked)[1]
    label = list(pkgs)[i]
    return MarginChoice(sweep[i], str(pkgs[label]), figures)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


# ------------------------------------------------------------------------ DAgger


def dagger_round(
    labels: pl.DataFrame,
    manifest: Mapping[str, Any],
    residual_spec: str,
    tasks: Sequence[LabelTask],
    params: AlgoConfig,
    out_dir: str | Path,
    *,
    predictor: RuntimePredictor | None = None,
    tracking_uri: str | None = None,
    executor: str = "serial",
    algo: str = "bc",
) -> tuple[pl.DataFrame, LabelTraining]:
    """One round: label the states of the residual's own rollouts (``tasks`` with the
    residual, built from ``residual_spec``, as their roll-in; each move still scored against
    the tasks' base, which continues every fork, as in the first labels), append them to
    ``labels``, retrain ``algo`` (BC or CQL) on the union (a new content hash: the old one
    plus the round's rows)."""
    policy = build_policy(PolicySpec.parse(f"model:{residual_spec}"))
    own = [replace(t, rollin=policy, rollin_name="residual-round") for t in tasks]
    fresh_rows = run_labels(own, executor)
    union = pl.concat([labels, fresh_rows], how="vertical")
    digest = hashlib.sha256(
        f"{manifest['hash']}+{fresh_rows.height}+{fresh_rows['label_s'].sum()}".encode()
    ).hexdigest()
    result = train_on_labels(
        union,
        {**manifest, "hash": digest, "parent_hash": manifest["hash"]},
        algo,
        params,
        out_dir,
        predictor=predictor,
        tracking_uri=tracking_uri,
    )
    return union, result


# ------------------------------------------------------------------------ robustness


def robustness_topologies(spec: str, oversub: float = 4.0) -> dict[str, str]:
    """Cluster sizes and fabrics around a compact topology spec (``NxG,key=value``): the
    nodes scaled 0.5x, 1x and 2x, each with the spec's fabric and with leaf uplinks
    oversubscribed ``oversub`` times; name -> spec."""
    head, _, rest = spec.partition(",")
    n, _, g = head.partition("x")
    nodes = int(n)
    opts = [o for o in rest.split(",") if o and not o.startswith("oversub=")]
    out: dict[str, str] = {}
    for scale in (0.5, 1.0, 2.0):
        size = max(1, round(nodes * scale))
        base = ",".join([f"{size}x{g}", *opts])
        out[f"{scale:g}x"] = base
        out[f"{scale:g}x-oversub{oversub:g}"] = f"{base},oversub={oversub:g}"
    return out


@dataclass(frozen=True)
class RobustCase:
    """A package against its base on one cluster: average JCTs, their ratio, deviations."""

    name: str
    topology: str
    trained_on: bool
    avg_jct_s: float
    base_avg_jct_s: float
    deviations_per_1000: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.avg_jct_s / self.base_avg_jct_s if self.base_avg_jct_s > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topology": self.topology,
            "trained_on": self.trained_on,
            "avg_jct_s": self.avg_jct_s,
            "base_avg_jct_s": self.base_avg_jct_s,
            "ratio": self.ratio,
            "deviations_per_1000": self.deviations_per_1000,
        }


def robustness(
    package: str,
    base: PolicySpec,
    topologies: Mapping[str, str],
    windows: Sequence[Window],
    seeds: Sequence[int],
    *,
    predictor: RuntimePredictor | None = None,
    trained: Sequence[str] = (),
    executor: str = "serial",
) -> list[RobustCase]:
    """``package`` (a folder) and ``base`` (a heuristic spec) on each topology (name ->
    spec) over ``windows`` x ``seeds``; ``trained`` the topology signatures the package was
    trained on (marked ``trained_on``)."""
    out: list[RobustCase] = []
    for name, tspec in topologies.items():
        topo = from_spec(tspec)
        ws = [
            Window(
                w.window_id,
                w.start,
                w.end,
                tuple(j for j in w.jobs if j.num_gpus <= topo.total_gpus),
            )
            for w in windows
        ]
        cases = make_cases(ws, seeds, topo, predictor=predictor)
        bench = run_benchmark(
            [
                PolicyRef("package", PolicySpec.parse(f"model:{package}")),
                PolicyRef("base", base),
            ],
            cases,
            executor=executor,
        )
        rows = {r["policy"]: r for r in bench.summary()}
        if "package" not in rows or "base" not in rows:
            failed = sorted(bench.failed())
            raise ValueError(f"{name}: {', '.join(failed)} failed a case")
        out.append(
            RobustCase(
                name=name,
                topology=tspec,
                trained_on=topology_signature(topo) in set(trained),
                avg_jct_s=float(rows["package"]["avg_jct_s"]),
                base_avg_jct_s=float(rows["base"]["avg_jct_s"]),
                deviations_per_1000=_opt(rows["package"].get("deviations_per_1000")),
            )
        )
    return out


def label_topology(tasks: Sequence[LabelTask]) -> list[str]:
    """The topology signatures a label set's tasks ran on."""
    return sorted({topology_signature(t.topology) for t in tasks})


def spec_of(manifest: Mapping[str, Any]) -> ObsSpec:
    """The ObsSpec a label manifest records (refused when this encoder differs)."""
    spec = ObsSpec.from_json(manifest["obs_spec"])
    if spec.version != make_spec(spec.config).version:
        raise ValueError("the label set was encoded by another encoder")
    return spec


# ------------------------------------------------------------------------ command line


def package_base(package: str | Path) -> str | None:
    """The base a residual package records (None for another package)."""
    meta = json.loads((Path(package) / "policy.json").read_text())
    data = meta.get("residual")
    return str(data["base"]) if meta.get("kind") == "residual" and data else None


def robustness_check(
    package: str | Path,
    *,
    base: PolicySpec | None,
    cluster: str,
    oversub: float,
    jobs: int,
    load_scale: float,
    window_h: float,
    windows: int,
    seeds: Sequence[int],
    seed: int,
    max_ratio: float,
) -> tuple[str, list[RobustCase], GateReport]:
    """A package and its base (``base``, else the residual's own) on 0.5x/1x/2x ``cluster``'s
    nodes, default and ``oversub`` times oversubscribed fabrics, on the last ``windows``
    windows of the embedded synthetic workload: the base, every case and the robustness
    gate's verdict (``linkwise robust``)."""
    pkg = Path(package)
    if not pkg.is_dir():
        raise ValueError(f"{pkg}: not a package folder")
    verify_checksums(pkg)
    recorded = None if base is not None else package_base(pkg)
    if base is None and recorded is None:
        raise ValueError(f"{pkg} is not a residual package: name its reference with --base")
    base = base or PolicySpec.parse(str(recorded))
    if jobs < 10 or windows < 1 or window_h <= 0:
        raise ValueError("--jobs must be at least 10, --windows and --window-h positive")
    topos = robustness_topologies(cluster, oversub)
    largest = max(from_spec(t).total_gpus for t in topos.values())
    workload = synthetic.generate(jobs, seed=seed, max_gpus=largest, load_scale=load_scale)
    cut = cut_windows(jobs_frame(workload), window_h * 3600.0, min_jobs=5)
    chosen = cut[-windows:]
    if not chosen:
        raise ValueError("the workload has no window of 5 or more jobs")
    predictor = read_predictor(pkg / PREDICTOR) if (pkg / PREDICTOR).is_file() else None
    if predictor is None:
        predictor = RuntimePredictor.fit(workload, until=chosen[0].start)
    meta = json.loads((pkg / "policy.json").read_text())
    trained = meta.get("residual", {}).get("deferral", {}).get("topologies", [])
    rows = robustness(
        str(pkg), base, topos, chosen, list(seeds), predictor=predictor, trained=trained
    )
    off = {r.name: (r.avg_jct_s, r.base_avg_jct_s) for r in rows if not r.trained_on}
    report = check_robustness(str(pkg), off, max_ratio, min_cases=min(5, len(off)) or 1)
    return base.label, rows, report
