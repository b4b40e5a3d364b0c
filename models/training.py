"""Offline training with d3rlpy: configurations from TOML, DiscreteBC and DiscreteCQL, an
MLflow logger adapter and the evaluators.

A configuration file (``models/experiments/*.toml``) names the algorithm, its
hyperparameters (every DiscreteCQL one set explicitly: d3rlpy's defaults are Atari's), the
dataset (an exported dataset file, or the rollouts to build it from) and the seed; see
``TrainConfig.from_toml``.

``MlflowAdapterFactory`` implements d3rlpy's ``LoggerAdapterFactory`` protocol: d3rlpy's
parameters and every metric it reports each epoch (losses, timings, evaluator scores) go to
one MLflow run; model saving through the adapter is a no-op (d3rlpy would pickle), so
d3rlpy writes nothing to the working directory.

Action masks (``AlgoConfig.masked``, the default): ``build_algo`` gives the masked variants
of ``models.masked`` and the dataset carries each step's mask in its observations
(``datasets.export.to_mdp_dataset(..., masks=True)``), so the Double-DQN target, CQL's
conservative term and BC's softmax range over allowed actions only; ``masked = false`` in
``[train]`` trains d3rlpy's stock algorithms on the observations alone.

Credit (``discount``, ``horizon_s``, ``n_step``, ``reward_baseline`` in ``[train]``,
``datasets.credit``): CQL's targets with ``gamma`` per ``horizon_s`` of simulated time
instead of per step, n-step returns and the episode-mean reward baseline; the defaults
("step", 1, "none") are d3rlpy's one-step target.

Evaluators (on held-out episodes): ``td_error`` and ``initial_state_value`` (Q-learning
only: d3rlpy's DiscreteBC has no value), ``action_match`` (d3rlpy's greedy action vs the
logged one: unmasked, or over allowed actions when trained with masks) and
``action_match_masked`` (this module's: the action the served policy would take, after
masking, vs the logged one).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
import tomllib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import structlog

from linkwise.cluster.mdp import MdpConfig, ObsSpec, obs_layout
from linkwise.datasets.credit import Credit
from linkwise.datasets.operator import parse_time
from linkwise.datasets.transitions import list_column_array
from linkwise.models.config import check_keys, config_digest, resolve_path
from linkwise.models.learned import masked_argmax
from linkwise.models.packaging import value_module

__all__ = [
    "ALGOS",
    "NETWORKS",
    "AlgoConfig",
    "DatasetConfig",
    "InitialStateValueEvaluator",
    "MaskedActionMatchEvaluator",
    "MlflowAdapter",
    "MlflowAdapterFactory",
    "TrainConfig",
    "action_values",
    "build_algo",
    "dataset_has_masks",
    "fit",
    "flatten_params",
    "frame_arrays",
    "is_masked",
    "make_evaluators",
    "pick_device",
    "quiet_d3rlpy",
    "split_episodes",
]

ALGOS = ("bc", "cql")
NETWORKS = ("mlp", "rows")  # AlgoConfig.network


# ------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class AlgoConfig:
    """Hyperparameters. BC uses ``beta``; CQL uses ``gamma``, ``alpha``, ``n_critics`` and
    ``target_update_interval``; both the rest.

    ``masked`` (default): train on the action masks (``models.masked``: the dataset's
    observations carry each step's mask, and CQL's targets and conservative term and BC's
    softmax range over allowed actions only); False trains d3rlpy's stock algorithms on
    the observations alone, for comparison.

    ``network``: ``"mlp"`` (d3rlpy's vector encoder, ``hidden_units``) or ``"rows"``
    (``models.rownet``: one scorer shared by every (slot, candidate) row, ``row_hidden`` for
    the row embedding and context, ``head_hidden`` for the score heads; needs ``masked``)."""

    n_steps: int = 2000
    n_steps_per_epoch: int = 500
    batch_size: int = 256
    learning_rate: float = 1e-3
    hidden_units: tuple[int, ...] = (256, 256)
    beta: float = 0.0  # BC: L2 penalty on the logits
    gamma: float = 0.99
    alpha: float = 1.0  # CQL: weight of the conservative loss
    n_critics: int = 2
    target_update_interval: int = 500
    masked: bool = True
    discount: str = "step"  # "step": gamma per step; "time": gamma per horizon_s simulated
    horizon_s: float = 3600.0
    n_step: int = 1
    reward_baseline: str = "none"  # "none" | "episode_mean" (datasets.credit)
    network: str = "mlp"
    row_hidden: tuple[int, ...] = (64, 64)
    head_hidden: tuple[int, ...] = (64,)

    def credit(self) -> Credit:
        """How CQL's targets credit rewards (``datasets.credit``; the defaults are d3rlpy's
        one-step target with ``gamma`` per step)."""
        return Credit(
            gamma=self.gamma,
            discount=self.discount,
            horizon_s=self.horizon_s,
            n_step=self.n_step,
            baseline=self.reward_baseline,
        )

    def __post_init__(self) -> None:
        if self.n_steps <= 0 or self.n_steps_per_epoch <= 0 or self.batch_size <= 0:
            raise ValueError("n_steps, n_steps_per_epoch and batch_size must be positive")
        if self.n_steps % self.n_steps_per_epoch:
            raise ValueError("n_steps must be a multiple of n_steps_per_epoch")
        if not 0 < self.learning_rate < 1 or not 0 <= self.gamma <= 1:
            raise ValueError("learning_rate must be in (0, 1) and gamma in [0, 1]")
        if not self.hidden_units or min(self.hidden_units) <= 0:
            raise ValueError("hidden_units must be positive")
        if self.n_critics <= 0 or self.target_update_interval <= 0 or self.alpha < 0:
            raise ValueError("n_critics and target_update_interval positive, alpha >= 0")
        if not isinstance(self.masked, bool):
            raise ValueError(f"masked must be true or false, got {self.masked!r}")
        self.credit()  # refuses invalid discount, horizon_s, n_step, reward_baseline
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {NETWORKS}, got {self.network!r}")
        if self.network == "rows" and not self.masked:
            raise ValueError("network = 'rows' trains with masks (masked = true)")
        if not self.row_hidden or min(self.row_hidden) <= 0 or min(self.head_hidden) <= 0:
            raise ValueError("row_hidden and head_hidden must be non-empty and positive")


@dataclass(frozen=True)
class DatasetConfig:
    """The training data: ``path`` (an exported dataset's Parquet or manifest), or built
    (``pipelines.build_dataset``) from ``db``, the cluster's own store (its accounting's
    decisions, and rollouts of ``policies`` on ``rollouts`` of its windows warm-started from
    the accounting, on the cluster its ``nodes`` table describes unless ``topology`` names
    one; jobs submitted in ``[since, until)``), or from rollouts on ``rollouts`` windows of
    ``trace`` (on ``topology``, default ``DEFAULT_TOPOLOGY``); the ``holdout`` share of
    episodes is kept for evaluation. ``holdout_last_s`` (a store without ``until``): the
    dataset ends that long before the store's last submitted job, so that the latest windows
    stay free for ``linkwise evaluate`` (its default: 4 windows of 6 h, 86400 s).

    ``mdp`` holds the ``[dataset.mdp]`` fields the experiment asks for (a partial
    ``MdpConfig``): a dataset is built with them; an existing dataset's manifest is the
    authority, and one that disagrees with any given field is refused. What training logs
    is the manifest's full configuration (``TrainConfig.with_mdp``)."""

    path: str | None = None
    db: str | None = None
    trace: str | None = None
    topology: str | None = None
    since: float | None = None
    until: float | None = None
    holdout_last_s: float = 0.0
    policies: tuple[str, ...] = ("best_fit",)
    epsilons: tuple[float, ...] = (0.0,)
    seeds: tuple[int, ...] = (0,)
    rollouts: int = 4
    windows: tuple[int, ...] = ()
    window_s: float = 3600.0
    block_s: float = 600.0
    min_jobs: int = 10
    max_steps: int | None = None
    calibration: str | None = None
    mdp: Mapping[str, Any] = field(default_factory=dict)
    holdout: float = 0.25

    def __post_init__(self) -> None:
        given = [k for k in ("path", "db", "trace") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "dataset: give exactly one of path (an exported dataset), db (the cluster's "
                f"store) or trace (rollouts of a trace); got {', '.join(given) or 'none'}"
            )
        if not 0 <= self.holdout < 1:
            raise ValueError("dataset.holdout must be in [0, 1)")
        MdpConfig.from_json(self.mdp)  # unknown or invalid fields are refused here

    def from_source(
        self,
        *,
        path: str | None = None,
        db: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> DatasetConfig:
        """This configuration with its source replaced by an exported dataset (``path``) or a
        store (``db``, with an optional span): ``linkwise train --dataset/--db/--since/--until``.
        ``since``/``until`` alone bound the configuration's own store."""
        if path is not None and (db is not None or since is not None or until is not None):
            raise ValueError("--dataset is a built dataset: --db, --since and --until do not apply")
        if path is not None:
            return replace(self, path=path, db=None, trace=None, since=None, until=None)
        if db is None and (since is not None or until is not None) and self.db is None:
            raise ValueError("--since/--until bound a store: give --db (or db in [dataset])")
        return replace(
            self,
            path=None if db is not None else self.path,
            trace=None if db is not None else self.trace,
            db=db if db is not None else self.db,
            since=since if since is not None else self.since,
            until=until if until is not None else self.until,
        )

    def mdp_config(self) -> MdpConfig:
        """The MDP configuration to build a dataset with (the given fields, defaults else)."""
        return MdpConfig.from_json(self.mdp)

    def check_manifest(self, used: MdpConfig, where: str) -> None:
        """Refuse a dataset whose MDP configuration ``used`` disagrees with a given field."""
        have = used.to_json()
        clash = {k: (have.get(k), v) for k, v in self.mdp.items() if _norm(have.get(k)) != _norm(v)}
        if clash:
            lines = ", ".join(
                f"{k}: dataset {a!r}, experiment {b!r}" for k, (a, b) in clash.items()
            )
            raise ValueError(
                f"{where} was built with another MDP configuration than [dataset.mdp] asks "
                f"({lines}): drop those fields (the dataset's manifest decides) or rebuild it"
            )


@dataclass(frozen=True)
class TrainConfig:
    """One experiment: algorithm, hyperparameters, dataset, seed, MLflow names."""

    name: str
    algo: str
    dataset: DatasetConfig
    params: AlgoConfig = AlgoConfig()
    seed: int = 0
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda", "cuda:N"
    experiment: str = "linkwise-train"
    model_name: str = "linkwise-policy"
    register: bool = True
    source: str | None = None  # the TOML file it came from

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")

    @staticmethod
    def from_toml(path: str | Path) -> TrainConfig:
        """Read a configuration file; relative dataset paths are resolved against the current
        directory, then the file's folder, then the repository root."""
        p = Path(path)
        data = tomllib.loads(p.read_text())
        return TrainConfig.from_mapping(data, base=p.resolve().parent, source=str(p))

    @staticmethod
    def from_mapping(
        data: Mapping[str, Any], *, base: Path | None = None, source: str | None = None
    ) -> TrainConfig:
        """Build from the TOML structure (top-level keys, ``[train]``, ``[dataset]``,
        ``[dataset.mdp]``, ``[mlflow]``); ValueError on unknown keys."""
        top = dict(data)
        train = dict(top.pop("train", {}))
        ds = dict(top.pop("dataset", {}))
        ml = dict(top.pop("mlflow", {}))
        mdp = dict(ds.pop("mdp", {}))
        check_keys(top, {"name", "algo", "seed", "device"}, "top level")
        check_keys(train, {f.name for f in fields(AlgoConfig)}, "[train]")
        check_keys(ds, {f.name for f in fields(DatasetConfig)} - {"mdp"}, "[dataset]")
        check_keys(ml, {"experiment", "model_name", "register"}, "[mlflow]")
        for key in ("hidden_units", "row_hidden", "head_hidden"):
            if key in train:
                train[key] = tuple(int(x) for x in train[key])
        for key, cast in (("policies", str), ("epsilons", float), ("seeds", int), ("windows", int)):
            if key in ds:
                ds[key] = tuple(cast(x) for x in ds[key])
        for key in ("since", "until"):
            if ds.get(key) is not None:
                ds[key] = parse_time(str(ds[key]), f"dataset.{key}")
        for key in ("path", "trace", "calibration"):
            if ds.get(key):
                ds[key] = resolve_path(str(ds[key]), base)
            elif key in ds:
                ds[key] = None
        if "algo" not in top:
            raise ValueError("the configuration needs algo = 'bc' or 'cql'")
        return TrainConfig(
            name=str(top.get("name", top["algo"])),
            algo=str(top["algo"]),
            dataset=DatasetConfig(**ds, mdp=mdp),
            params=AlgoConfig(**train),
            seed=int(top.get("seed", 0)),
            device=str(top.get("device", "auto")),
            source=source,
            **ml,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable description (what is logged as the run's parameters)."""
        d = asdict(self)
        d["dataset"]["mdp"] = dict(self.dataset.mdp)
        return d

    def with_mdp(self, used: MdpConfig) -> TrainConfig:
        """This configuration with the MDP configuration the dataset was built with (every
        field), after ``DatasetConfig.check_manifest``: what is logged is what was used."""
        return replace(self, dataset=replace(self.dataset, mdp=used.to_json()))

    def digest(self) -> str:
        """SHA-256 of the configuration's canonical JSON (without ``source``)."""
        return config_digest(self.to_json())


def flatten_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as dotted keys -> strings (MLflow parameters, 6000 chars max)."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_params(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


# ------------------------------------------------------------------------ data


def split_episodes(
    df: pl.DataFrame, holdout: float, seed: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Deterministic split of a transition frame by episode: (train, held-out). Episodes are
    ranked by a seeded hash of their name; the first ``ceil(holdout * n)`` are held out
    (at least one when ``holdout > 0`` and there are two or more episodes)."""
    episodes = sorted(str(e) for e in df["episode"].unique())
    if holdout <= 0 or len(episodes) < 2:
        return df, df.clear()
    ranked = sorted(episodes, key=lambda e: hashlib.sha256(f"{seed}/{e}".encode()).hexdigest())
    n_out = min(len(episodes) - 1, max(1, math.ceil(holdout * len(episodes))))
    held = ranked[:n_out]
    test = pl.col("episode").is_in(held)
    return df.filter(~test), df.filter(test)


def frame_arrays(
    df: pl.DataFrame, spec: ObsSpec
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Observations ``(N, dim)``, masks ``(N, n_actions)`` and actions ``(N,)`` of a frame."""
    obs = list_column_array(df, "obs", spec.dim, np.float32)
    masks = list_column_array(df, "mask", spec.n_actions, np.bool_)
    return obs, masks, df["action"].to_numpy().astype(np.int64)


# ------------------------------------------------------------------------ algorithms


def pick_device(device: str) -> str:
    """d3rlpy's device string: "auto" -> "cuda:0" when CUDA is present, else "cpu:0"."""
    if device == "auto":
        # torch takes seconds to import: only where a network is built, exported or read
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu:0"
    if device == "cpu":
        return "cpu:0"
    if device == "cuda":
        return "cuda:0"
    return device


def build_algo(
    algo: str, params: AlgoConfig, device: str = "cpu:0", spec: ObsSpec | None = None
) -> Any:
    """A DiscreteBC or DiscreteCQL with every hyperparameter set from ``params``; with
    ``params.masked``, the masked variants of ``models.masked`` (to fit on a dataset built
    with ``to_mdp_dataset(..., masks=True)``); with ``params.network == "rows"``, the row
    network of ``models.rownet``, laid out by the dataset's ``spec`` (required then)."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy  # type: ignore[import-untyped]
    from d3rlpy.models.encoders import VectorEncoderFactory  # type: ignore[import-untyped]
    from d3rlpy.models.q_functions import MeanQFunctionFactory  # type: ignore[import-untyped]
    from d3rlpy.optimizers import AdamFactory  # type: ignore[import-untyped]

    # masked and rownet subclass d3rlpy's classes: they import d3rlpy (torch) at their top
    from linkwise.models import masked as mk

    encoder: Any = VectorEncoderFactory(hidden_units=list(params.hidden_units), activation="relu")
    q_func: Any = MeanQFunctionFactory(share_encoder=False)
    bc_config: Any = d3rlpy.algos.DiscreteBCConfig
    if params.masked:
        encoder = mk.MaskedEncoderFactory(encoder=encoder)
        q_func = mk.MaskedMeanQFunctionFactory(share_encoder=False)
        bc_config = mk.MaskedDiscreteBCConfig
    if params.network == "rows":
        from linkwise.models import rownet  # imports d3rlpy (torch) at its top

        if spec is None:
            raise ValueError("network = 'rows' needs the dataset's ObsSpec: build_algo(spec=)")
        rows = rownet.RowEncoderFactory.from_layout(
            obs_layout(spec), params.row_hidden, params.head_hidden
        )
        encoder = mk.MaskedEncoderFactory(encoder=rows)
        q_func = rownet.RowQFunctionFactory(share_encoder=False)
        bc_config = rownet.RowDiscreteBCConfig
    optim = AdamFactory(weight_decay=0.0)
    if algo == "bc":
        return bc_config(
            batch_size=params.batch_size,
            learning_rate=params.learning_rate,
            beta=params.beta,
            encoder_factory=encoder,
            optim_factory=optim,
        ).create(device=device)
    if algo == "cql":
        return d3rlpy.algos.DiscreteCQLConfig(
            batch_size=params.batch_size,
            learning_rate=params.learning_rate,
            gamma=params.gamma,
            alpha=params.alpha,
            n_critics=params.n_critics,
            target_update_interval=params.target_update_interval,
            encoder_factory=encoder,
            optim_factory=optim,
            q_func_factory=q_func,
        ).create(device=device)
    raise ValueError(f"unknown algo {algo!r}; known: {', '.join(ALGOS)}")


def dataset_has_masks(dataset: Any) -> bool:
    """Whether a d3rlpy dataset's observations carry action masks (``(obs, mask)`` tuples,
    ``datasets.export.to_mdp_dataset(..., masks=True)``)."""
    episodes: Any = getattr(dataset, "episodes", None)
    return bool(episodes) and isinstance(episodes[0].observations, list | tuple)


def is_masked(algo: Any) -> bool:
    """Whether a d3rlpy algorithm was built to train on action masks (``models.masked``)."""
    from linkwise.models.masked import MaskedEncoderFactory  # imports d3rlpy (torch) at its top

    return isinstance(getattr(algo.config, "encoder_factory", None), MaskedEncoderFactory)


def action_values(
    algo: Any,
    obs: npt.NDArray[np.float32],
    masks: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]:
    """All action values of a fitted algorithm for a batch: mean Q over the critics (CQL) or
    log-probabilities (BC), computed by the same module that is exported for serving (which
    takes the observations alone and gives every action a value; serving masks them).

    With ``masks`` and a masked algorithm, the values the training saw: disallowed actions at
    ``models.masked.MASKED_VALUE`` (BC: log-probabilities over allowed actions). The masked
    argmax is the same either way."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    module, _ = value_module(algo)
    device = next(iter(module.parameters())).device
    mask_arr = masks if masks is not None and is_masked(algo) else None
    out: list[npt.NDArray[np.float32]] = []
    with torch.no_grad():
        for i in range(0, len(obs), 4096):
            x: Any = torch.from_numpy(np.ascontiguousarray(obs[i : i + 4096])).to(device)
            if mask_arr is not None:
                m = np.ascontiguousarray(mask_arr[i : i + 4096], dtype=np.float32)
                x = [x, torch.from_numpy(m).to(device)]
            out.append(module(x).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


class MaskedActionMatchEvaluator:
    """d3rlpy evaluator: share of steps where the masked best action equals the logged one."""

    def __init__(
        self,
        obs: npt.NDArray[np.float32],
        masks: npt.NDArray[np.bool_],
        actions: npt.NDArray[np.int64],
    ) -> None:
        self.obs, self.masks, self.actions = obs, masks, actions

    def __call__(self, algo: Any, dataset: Any) -> float:
        if len(self.actions) == 0:
            return float("nan")
        chosen = masked_argmax(action_values(algo, self.obs), self.masks)
        return float(np.mean(chosen == self.actions))


class InitialStateValueEvaluator:
    """d3rlpy's ``InitialStateValueEstimationEvaluator`` (the greedy value of the first state
    of every window of 1024 steps of each episode) for masked observations too: d3rlpy's
    takes the first *part* of a tuple observation instead of its first row."""

    def __init__(self, episodes: Sequence[Any] | None = None) -> None:
        self._episodes = episodes

    def __call__(self, algo: Any, dataset: Any) -> float:
        # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
        from d3rlpy.metrics.evaluators import (  # type: ignore[import-untyped]
            WINDOW_SIZE,
            make_batches,
        )

        values: list[float] = []
        for episode in self._episodes or dataset.episodes:
            for batch in make_batches(episode, WINDOW_SIZE, dataset.transition_picker):
                obs = batch.observations
                first = [o[:1] for o in obs] if isinstance(obs, list | tuple) else obs[:1]
                values.append(float(algo.predict_value(first, algo.predict(first))[0]))
        return float(np.mean(values))


def make_evaluators(algo: str, heldout: Any, arrays: tuple[Any, Any, Any] | None) -> dict[str, Any]:
    """The evaluators for an algorithm on held-out episodes (a d3rlpy dataset, or None to
    evaluate on the training data) and the held-out (obs, masks, actions) arrays. On a masked
    dataset d3rlpy's ``action_match`` and ``td_error`` see the masks (greedy actions and
    targets over allowed actions)."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    from d3rlpy.metrics import (  # type: ignore[import-untyped]
        DiscreteActionMatchEvaluator,
        TDErrorEvaluator,
    )

    episodes = heldout.episodes if heldout is not None else None
    out: dict[str, Any] = {"action_match": DiscreteActionMatchEvaluator(episodes=episodes)}
    if arrays is not None:
        out["action_match_masked"] = MaskedActionMatchEvaluator(*arrays)
    if algo != "bc":  # DiscreteBC implements no value function
        out["td_error"] = TDErrorEvaluator(episodes=episodes)
        out["initial_state_value"] = InitialStateValueEvaluator(episodes=episodes)
    return out


# ------------------------------------------------------------------------ MLflow adapter


class MlflowAdapter:
    """d3rlpy ``LoggerAdapter`` writing parameters and epoch metrics into one MLflow run.
    ``save_model`` is a no-op (d3rlpy's save pickles); the caller ends the run."""

    def __init__(self, client: Any, run_id: str, prefix: str = "d3rlpy.") -> None:
        self.client = client
        self.run_id = run_id
        self.prefix = prefix
        self._pending: list[Any] = []
        self.history: list[dict[str, float]] = []

    def write_params(self, params: dict[str, Any]) -> None:
        # MLflow takes about a second to import: only where a run or the registry is used
        from mlflow.entities import Param

        flat = flatten_params(params, self.prefix)
        items = [Param(k, v) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def before_write_metric(self, epoch: int, step: int) -> None:
        self._pending = []

    def write_metric(self, epoch: int, step: int, name: str, value: float) -> None:
        # MLflow takes about a second to import: only where a run or the registry is used
        from mlflow.entities import Metric

        self._pending.append(Metric(name, float(value), int(time.time() * 1000), int(step)))

    def after_write_metric(self, epoch: int, step: int) -> None:
        # MLflow takes about a second to import: only where a run or the registry is used
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [*self._pending, Metric("epoch", float(epoch), now, int(step))]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.history.append({m.key: m.value for m in metrics} | {"step": float(step)})
        self._pending = []

    def save_model(self, epoch: int, algo: Any) -> None:
        """Nothing: models are exported without pickle at the end of training."""

    def close(self) -> None:
        """Nothing: the run belongs to the caller."""

    def watch_model(self, epoch: int, step: int) -> None:
        """Nothing: parameter histograms are not tracked."""


class MlflowAdapterFactory:
    """d3rlpy ``LoggerAdapterFactory`` for ``MlflowAdapter`` on an existing run."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.adapters: list[MlflowAdapter] = []

    def create(self, algo: Any, experiment_name: str, n_steps_per_epoch: int) -> MlflowAdapter:
        adapter = MlflowAdapter(self.client, self.run_id)
        self.adapters.append(adapter)
        return adapter


@contextlib.contextmanager
def quiet_d3rlpy(level: int = logging.WARNING) -> Iterator[None]:
    """Filter d3rlpy's structlog output below ``level`` inside the block (restored after)."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    try:
        yield
    finally:
        structlog.configure(**old)


def fit(
    algo: Any,
    train: Any,
    params: AlgoConfig,
    *,
    evaluators: Mapping[str, Any],
    adapter: Any,
    callback: Any = None,
    experiment_name: str = "linkwise",
) -> list[tuple[int, dict[str, float]]]:
    """``algo.fit`` with the adapter, no progress bar and no files; (epoch, metrics) list.

    A masked algorithm (``params.masked``) on a dataset without masks trains as an unmasked
    one (a warning says so); an unmasked one on a dataset with masks is refused. The
    dataset is sampled with ``params.credit()`` (``datasets.credit_buffer.with_credit``).
    Trains on one torch thread (the caller's thread count is restored)."""
    has_masks = dataset_has_masks(train)
    if is_masked(algo) and not has_masks:
        warnings.warn(
            "masked training on a dataset without masks trains unmasked: build the dataset "
            "with to_mdp_dataset(..., masks=True)",
            stacklevel=2,
        )
    elif has_masks and not is_masked(algo):
        raise ValueError(
            "the dataset carries action masks but the algorithm is unmasked: build it with "
            "masked = true, or the dataset with to_mdp_dataset(..., masks=False)"
        )
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    threads = torch.get_num_threads()
    # one thread: on a shared 2-core machine torch's default threads spin against each other
    # (5x slower steps at load 6-7, benchmarks/learned_speed.md); restored afterwards
    torch.set_num_threads(1)
    try:
        return _fit(algo, train, params, evaluators, adapter, callback, experiment_name)
    finally:
        torch.set_num_threads(threads)


def _fit(
    algo: Any,
    train: Any,
    params: AlgoConfig,
    evaluators: Mapping[str, Any],
    adapter: Any,
    callback: Any,
    experiment_name: str,
) -> list[tuple[int, dict[str, float]]]:
    from linkwise.datasets.credit_buffer import with_credit  # imports d3rlpy (torch) at its top

    with quiet_d3rlpy():
        out: Sequence[tuple[int, dict[str, float]]] = algo.fit(
            with_credit(train, params.credit()),
            n_steps=params.n_steps,
            n_steps_per_epoch=params.n_steps_per_epoch,
            evaluators=dict(evaluators),
            logger_adapter=adapter,
            experiment_name=experiment_name,
            with_timestamp=False,
            show_progress=False,
            save_interval=10**9,
            callback=callback,
        )
    return list(out)


def _norm(value: Any) -> Any:
    """JSON-ish values compared as equal whether lists or tuples."""
    return tuple(value) if isinstance(value, list | tuple) else value
