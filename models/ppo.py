"""DeepShare-style online baseline: MaskablePPO (sb3-contrib) in the calibrated simulator.

DeepShare trains its scheduler online with PPO in a simulator. This module does the same on
*our* decision problem: ``cluster.env.ClusterEnv`` (the ``cluster.mdp`` observation, action
space and reward, the same as the offline learners see), with the action mask
(``ClusterEnv.action_masks``), on workloads drawn from the real arrival process: windows of
a trace (``datasets.rollouts.cut_windows``), each episode a seeded block bootstrap of one
window (``resample_window``) with profiles assigned as in the rollouts. ``train_days``
keeps the training windows inside the first days of the trace, so a benchmark on later
weeks stays held out. Jobs carry run-time predictions from one ``RuntimePredictor``
(``predictor``, a JSON file, e.g. the dataset's; else one fit on the trace's jobs submitted
in those first days), recorded in the workload manifest and carried by the package.

Periodic decision points (``tick_s``, default 300 s) are on while training. Without them an
online learner finds an exploit offline learners never see: "wait" on an idle cluster with
nothing left to arrive stalls the simulator, which ends the episode early and so *raises*
the return (the unfinished jobs' time is never charged). With ticks, waiting just costs
time like any other wait, and the return stays minus the total JCT.

The trained policy is packaged exactly like the offline learners (``models.learned``): the
actor's log-probabilities over all actions as TorchScript (``values = "logits"``), the
``ObsSpec``, a ``dataset.json`` describing the training workload (trace SHA-256, windows,
topology, bootstrap) and SHA-256 checksums. ``models.learned.load_package`` and
``LearnedPolicy`` serve it unchanged (masked argmax of the logits = the masked
deterministic action of MaskablePPO), so ``model:PATH`` works wherever a policy string is
accepted. Nothing is pickled.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
import tomllib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Topology
from linkwise.cluster.env import ClusterEnv, Workload
from linkwise.cluster.mdp import MdpConfig, ObsSpec, StepPolicyAdapter
from linkwise.cluster.profiles import Calibration, assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.export import file_sha256
from linkwise.datasets.prediction import ensure_predicted, predictor_record, read_predictor
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import (
    Window,
    cut_windows,
    jobs_from_trace,
    resample_window,
    windows_predictor,
)
from linkwise.datasets.traces import frame_jobs
from linkwise.datasets.windows import choose_windows
from linkwise.models.config import check_keys, config_digest, resolve_path
from linkwise.models.learned import masked_argmax
from linkwise.models.packaging import write_package
from linkwise.policies.heuristics import make_policy

__all__ = [
    "PpoConfig",
    "PpoEnvConfig",
    "PpoParams",
    "WindowWorkloads",
    "build_ppo",
    "compare_returns",
    "env_predictor",
    "episode_return",
    "export_ppo_network",
    "make_vec_env",
    "ppo_logits_module",
    "save_ppo_package",
    "select_windows",
    "workload_manifest",
    "workloads",
]

ALGO_NAME = "MaskablePPO"
VEC_ENVS = ("dummy", "subproc")


# ------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class PpoParams:
    """MaskablePPO hyperparameters and the training budget (environment steps)."""

    total_timesteps: int = 20_000
    n_steps: int = 512  # steps per environment between updates
    batch_size: int = 64
    n_epochs: int = 4
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden_units: tuple[int, ...] = (128, 128)
    normalize_reward: bool = True  # VecNormalize on rewards only (observations are normalised)
    n_envs: int = 1
    vec_env: str = "dummy"  # "dummy" (in process) or "subproc" (one process per env)
    torch_threads: int = 1  # 2 threads ran ~20x slower than 1 on the shared 2-core machine

    def __post_init__(self) -> None:
        if min(self.total_timesteps, self.n_steps, self.batch_size, self.n_epochs) <= 0:
            raise ValueError("total_timesteps, n_steps, batch_size and n_epochs must be positive")
        if self.n_envs <= 0 or self.vec_env not in VEC_ENVS:
            raise ValueError(f"n_envs must be positive and vec_env one of {VEC_ENVS}")
        if not 0 < self.learning_rate < 1 or not 0 <= self.gamma <= 1:
            raise ValueError("learning_rate must be in (0, 1) and gamma in [0, 1]")
        if not 0 <= self.gae_lambda <= 1 or self.clip_range <= 0:
            raise ValueError("gae_lambda must be in [0, 1] and clip_range positive")
        if not self.hidden_units or min(self.hidden_units) <= 0:
            raise ValueError("hidden_units must be positive")


@dataclass(frozen=True)
class PpoEnvConfig:
    """The simulated workloads: windows of ``trace`` (``window_s`` long, at least ``min_jobs``
    jobs, inside the first ``train_days`` days when set), ``n_windows`` of them spread evenly
    (or the ids in ``windows``), each episode block-bootstrapped with ``block_s``."""

    trace: str
    topology: str = DEFAULT_TOPOLOGY
    window_s: float = 3600.0
    block_s: float = 600.0
    min_jobs: int = 20
    max_jobs: int | None = None  # windows with more jobs are skipped (episode length)
    n_windows: int = 8
    windows: tuple[int, ...] = ()
    train_days: float | None = None
    calibration: str | None = None
    max_steps: int | None = 5000  # an episode cut (timeout)
    tick_s: float | None = 300.0  # periodic decision points (see the module docstring)
    eval_episodes: int = 4  # after training: PPO vs best_fit vs random on fresh seeds
    # a run-time predictor JSON (``datasets.prediction.write_predictor``); None: fit on the
    # trace's jobs submitted in the first ``train_days`` (all of them without)
    predictor: str | None = None
    mdp: MdpConfig = field(default_factory=MdpConfig)

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.n_windows <= 0 or self.min_jobs < 1:
            raise ValueError("window_s, n_windows and min_jobs must be positive")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ValueError("max_steps must be positive")
        if self.eval_episodes < 0:
            raise ValueError("eval_episodes must be >= 0")
        if self.tick_s is not None and not self.tick_s > 0:
            raise ValueError("tick_s must be positive (or None)")


@dataclass(frozen=True)
class PpoConfig:
    """One PPO experiment (``models/experiments/ppo.toml``)."""

    name: str
    env: PpoEnvConfig
    params: PpoParams = PpoParams()
    seed: int = 0
    device: str = "cpu"  # MLP policies train faster on CPU; "auto" uses CUDA when present
    experiment: str = "linkwise-train"
    model_name: str = "linkwise-ppo"
    register: bool = True
    source: str | None = None

    @staticmethod
    def from_toml(path: str | Path) -> PpoConfig:
        """Read a configuration file (top level ``name``, ``seed``, ``device``; ``[train]``;
        ``[env]`` with ``[env.mdp]``; ``[mlflow]``); relative paths are resolved against the
        current directory, the file's folder, then the repository root."""
        p = Path(path)
        data = tomllib.loads(p.read_text())
        return PpoConfig.from_mapping(data, base=p.resolve().parent, source=str(p))

    @staticmethod
    def from_mapping(
        data: Mapping[str, Any], *, base: Path | None = None, source: str | None = None
    ) -> PpoConfig:
        """Build from the TOML structure; ValueError on unknown keys."""
        top = dict(data)
        train = dict(top.pop("train", {}))
        env = dict(top.pop("env", {}))
        ml = dict(top.pop("mlflow", {}))
        mdp = MdpConfig.from_json(env.pop("mdp", {}))
        check_keys(top, {"name", "seed", "device", "algo"}, "top level")
        check_keys(train, {f.name for f in fields(PpoParams)}, "[train]")
        check_keys(env, {f.name for f in fields(PpoEnvConfig)} - {"mdp"}, "[env]")
        check_keys(ml, {"experiment", "model_name", "register"}, "[mlflow]")
        if top.get("algo", "ppo") != "ppo":
            raise ValueError("a PPO configuration has algo = 'ppo' (or no algo)")
        if "hidden_units" in train:
            train["hidden_units"] = tuple(int(x) for x in train["hidden_units"])
        if "windows" in env:
            env["windows"] = tuple(int(x) for x in env["windows"])
        if "trace" not in env:
            raise ValueError("[env] needs a trace")
        for key in ("trace", "calibration", "predictor"):
            if env.get(key):
                env[key] = resolve_path(str(env[key]), base)
            elif key in env:
                env[key] = None
        return PpoConfig(
            name=str(top.get("name", "ppo")),
            env=PpoEnvConfig(**env, mdp=mdp),
            params=PpoParams(**train),
            seed=int(top.get("seed", 0)),
            device=str(top.get("device", "cpu")),
            source=source,
            **ml,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable description (logged as the run's parameters)."""
        d = asdict(self)
        d["env"]["mdp"] = self.env.mdp.to_json()
        d["algo"] = "ppo"
        return d

    def digest(self) -> str:
        """SHA-256 of the configuration's canonical JSON (without ``source``)."""
        return config_digest(self.to_json())


# ------------------------------------------------------------------------ workloads


def select_windows(env: PpoEnvConfig, topology: Topology) -> tuple[Window, ...]:
    """The training windows of the configuration on ``topology`` (deterministic): those
    within ``train_days`` of the trace's first submit and at most ``max_jobs`` jobs, by id or
    spread evenly (``datasets.windows.choose_windows``)."""
    jobs = jobs_from_trace(env.trace)
    wins = cut_windows(jobs, env.window_s, max_gpus=topology.total_gpus, min_jobs=env.min_jobs)
    if env.train_days is not None and wins:
        # days from the trace's first submit (window 0's start), whichever windows are kept
        t0 = min(w.start - w.window_id * env.window_s for w in wins)
        wins = [w for w in wins if w.end <= t0 + env.train_days * 86400.0 + 1e-6]
    if env.max_jobs is not None:
        wins = [w for w in wins if len(w.jobs) <= env.max_jobs]
    chosen = choose_windows(wins, ids=env.windows, n=env.n_windows)
    if not chosen:
        raise ValueError(f"{env.trace}: no window matches the configuration")
    return tuple(chosen)


@dataclass(frozen=True)
class WindowWorkloads:
    """Episode seed -> workload: one of ``windows`` drawn by the seed, block-bootstrapped with
    the seed, profiles assigned with the seed (picklable, for subprocess environments)."""

    windows: tuple[Window, ...]
    topology: Topology
    calibration: Calibration
    block_s: float = 600.0
    sim_config: SimConfig | None = None
    predictor: RuntimePredictor | None = None  # None: fit on the windows' jobs

    def __post_init__(self) -> None:
        if self.predictor is None:
            object.__setattr__(self, "predictor", windows_predictor(self.windows))

    def __call__(self, seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        window = self.windows[int(rng.integers(len(self.windows)))]
        jobs = resample_window(window, seed, self.block_s)
        jobs = ensure_predicted(assign_profiles(jobs, self.calibration, seed=seed), self.predictor)
        fitting = tuple(j for j in jobs if j.num_gpus <= self.topology.total_gpus)
        return Workload(self.topology, fitting, AnalyticModel(self.calibration), self.sim_config)


def env_predictor(env: PpoEnvConfig) -> RuntimePredictor:
    """The run-time predictor of the configuration: its ``predictor`` file, else one fit on
    the trace's jobs submitted within ``train_days`` of its first submit (all without)."""
    if env.predictor:
        return read_predictor(env.predictor)
    jobs = frame_jobs(jobs_from_trace(env.trace))
    if not jobs:
        raise ValueError(f"{env.trace}: no jobs to fit a run-time predictor on")
    until = None
    if env.train_days is not None:
        until = min(j.submit_time for j in jobs) + env.train_days * 86400.0
    return RuntimePredictor.fit(jobs, until=until)


def workloads(env: PpoEnvConfig) -> WindowWorkloads:
    """The configuration's workload factory."""
    topo = load_topology(env.topology)
    return WindowWorkloads(
        windows=select_windows(env, topo),
        topology=topo,
        calibration=load_calibration(env.calibration),
        block_s=env.block_s,
        sim_config=SimConfig(tick_s=env.tick_s),
        predictor=env_predictor(env),
    )


def workload_manifest(env: PpoEnvConfig, factory: WindowWorkloads) -> dict[str, Any]:
    """What the policy was trained on (the package's ``dataset.json``), with a hash."""
    body: dict[str, Any] = {
        "format": "linkwise-ppo-workload/1",
        "trace": env.trace,
        "trace_sha256": file_sha256(env.trace) if Path(env.trace).is_file() else None,
        "topology": env.topology,
        "calibration": env.calibration,
        "window_s": env.window_s,
        "block_s": env.block_s,
        "tick_s": env.tick_s,
        "train_days": env.train_days,
        "windows": [
            {"id": w.window_id, "start": w.start, "end": w.end, "jobs": len(w.jobs)}
            for w in factory.windows
        ],
    }
    if factory.predictor is not None:
        body["predictor"] = predictor_record(
            factory.predictor, {"file": env.predictor} if env.predictor else {"trace": env.trace}
        )
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "hash": digest, "source": "simulator"}


# ------------------------------------------------------------------------ training


def _make_env(factory: WindowWorkloads, spec: ObsSpec, max_steps: int | None) -> Any:
    # Stable-Baselines3 (torch) takes seconds to import: only where PPO trains
    from stable_baselines3.common.monitor import Monitor

    return Monitor(ClusterEnv(factory, spec, invalid_action="raise", max_steps=max_steps))


def make_vec_env(
    factory: WindowWorkloads, spec: ObsSpec, params: PpoParams, seed: int, max_steps: int | None
) -> Any:
    """The vectorised training environments (masked actions raise), seeded."""
    # Stable-Baselines3 (torch) takes seconds to import: only where PPO trains
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    fns: list[Callable[[], Any]] = [
        partial(_make_env, factory, spec, max_steps) for _ in range(params.n_envs)
    ]
    vec: Any
    if params.vec_env == "subproc" and params.n_envs > 1:
        vec = SubprocVecEnv(fns, start_method="spawn")
    else:
        vec = DummyVecEnv(fns)
    vec.seed(seed)
    if params.normalize_reward:
        vec = VecNormalize(vec, norm_obs=False, norm_reward=True, gamma=params.gamma)
    return vec


def build_ppo(vec_env: Any, params: PpoParams, seed: int, device: str = "cpu") -> Any:
    """A MaskablePPO with every hyperparameter set from ``params`` (tanh MLP, separate actor
    and critic). Its logger keeps metrics in memory and writes nowhere (SB3's default logger
    creates a ``SB3-<date>`` folder in the temp directory at every ``learn``)."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import Logger

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    arch = list(params.hidden_units)
    model = MaskablePPO(
        "MlpPolicy",
        vec_env,
        learning_rate=params.learning_rate,
        n_steps=params.n_steps,
        batch_size=params.batch_size,
        n_epochs=params.n_epochs,
        gamma=params.gamma,
        gae_lambda=params.gae_lambda,
        clip_range=params.clip_range,
        ent_coef=params.ent_coef,
        vf_coef=params.vf_coef,
        max_grad_norm=params.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": arch, "vf": arch}},
        seed=seed,
        device=device,
        verbose=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


# ------------------------------------------------------------------------ export


def ppo_logits_module(model: Any) -> Any:
    """A CPU torch module ``(B, dim) -> (B, n_actions)``: the actor's log-probabilities
    (unmasked; masking happens at serving time, as for BC)."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    policy = model.policy  # copied part by part: the optimiser state cannot be deep-copied

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = copy.deepcopy(policy.pi_features_extractor).to("cpu")
            self.mlp = copy.deepcopy(policy.mlp_extractor.policy_net).to("cpu")
            self.action_net = copy.deepcopy(policy.action_net).to("cpu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            latent = self.mlp(self.features(x))
            return torch.log_softmax(self.action_net(latent), dim=-1)

    module = Logits().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def export_ppo_network(model: Any, spec: ObsSpec, path: str | Path) -> None:
    """Trace the actor to TorchScript at ``path``; checked to reproduce MaskablePPO's masked
    deterministic actions on random observations and random masks."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    module = ppo_logits_module(model)
    example = torch.zeros(2, spec.dim, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
        traced = torch.jit.trace(module, example)  # type: ignore[no-untyped-call]
        probe = torch.rand(32, spec.dim, generator=gen)
        values = traced(probe).numpy()
    if values.shape != (32, spec.n_actions):
        raise ValueError(f"network gives shape {values.shape}, expected (32, {spec.n_actions})")
    masks = torch.rand(32, spec.n_actions, generator=gen).numpy() < 0.5
    masks[:, spec.config.wait_action] = True
    expected, _ = model.predict(probe.numpy(), action_masks=masks, deterministic=True)
    if not np.array_equal(masked_argmax(values, masks), np.asarray(expected)):
        raise ValueError("the exported network disagrees with MaskablePPO's masked actions")
    traced.save(str(path))


def save_ppo_package(
    model: Any,
    spec: ObsSpec,
    manifest: Mapping[str, Any],
    out_dir: str | Path,
    *,
    meta: Mapping[str, Any] | None = None,
    predictor: RuntimePredictor | None = None,
) -> Path:
    """Write a policy package (``models.learned`` format, ``values = "logits"``) for a
    trained MaskablePPO into ``out_dir`` (created; must be empty or absent), with
    ``predictor`` (else the one the workload manifest records)."""
    # Stable-Baselines3 (torch) takes seconds to import: only where PPO trains
    import sb3_contrib
    import stable_baselines3

    def export(path: Path) -> str:
        export_ppo_network(model, spec, path)
        return "logits"

    return write_package(
        out_dir,
        spec,
        manifest,
        export=export,
        algo=ALGO_NAME,
        versions={
            "stable_baselines3": stable_baselines3.__version__,
            "sb3_contrib": sb3_contrib.__version__,
        },
        meta=meta,
        predictor=predictor,
    )


# ------------------------------------------------------------------------ evaluation


ActFn = Callable[[npt.NDArray[np.float32], npt.NDArray[np.bool_]], int]


def episode_return(
    factory: WindowWorkloads,
    spec: ObsSpec,
    act: str | ActFn,
    seed: int,
    max_steps: int | None = None,
) -> dict[str, float]:
    """One episode on the workload of ``seed``: undiscounted return (minus total JCT in
    hours with the default time scale), steps, mean JCT (s) and whether it ended.

    ``act`` is ``(obs, mask) -> action`` or a heuristic name (driven step by step through
    ``StepPolicyAdapter``, as in the rollouts; ``"random"`` is seeded)."""

    env = ClusterEnv(factory, spec, invalid_action="raise", max_steps=max_steps)
    adapter: StepPolicyAdapter | None = None
    if isinstance(act, str):
        adapter = StepPolicyAdapter(make_policy(act, **({"seed": seed} if act == "random" else {})))
    obs, info = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while True:
        if adapter is not None:
            a = adapter.act(env.candidates)
        else:
            assert callable(act)
            a = int(act(obs, info["action_mask"]))
        obs, reward, terminated, truncated, info = env.step(a)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            done = bool(terminated)
            break
    jcts = [float(r.jct) for r in env.simulator.records]
    return {
        "return": total,
        "steps": float(steps),
        "mean_jct_s": float(np.mean(jcts)) if jcts else math.nan,
        "finished": float(done),
    }


def compare_returns(
    factory: WindowWorkloads,
    spec: ObsSpec,
    acts: Mapping[str, str | ActFn],
    seeds: Sequence[int],
    max_steps: int | None = None,
) -> dict[str, dict[str, float]]:
    """Mean episode statistics of several policies on the same seeded workloads."""
    out: dict[str, dict[str, float]] = {}
    for name, act in acts.items():
        runs = [episode_return(factory, spec, act, s, max_steps) for s in seeds]
        out[name] = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]} if runs else {}
    return out


# ------------------------------------------------------------------------ learning


RolloutHook = Callable[[int, dict[str, float]], None]


def learn(
    model: Any, total_timesteps: int, on_rollout: RolloutHook | None = None
) -> list[dict[str, float]]:
    """``model.learn`` with a callback reporting, after every rollout, the environment steps so
    far and the metrics (mean episode return and length over the last 100 episodes, env
    steps/s, the previous update's losses); returns that history."""
    # Stable-Baselines3 (torch) takes seconds to import: only where PPO trains
    from stable_baselines3.common.callbacks import BaseCallback

    history: list[dict[str, float]] = []

    class Report(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            steps = int(self.model.num_timesteps)
            seconds = time.perf_counter() - self.t0
            m: dict[str, float] = {
                "timesteps": float(steps),
                "env_steps_per_s": steps / seconds if seconds > 0 else math.nan,
            }
            infos = list(self.model.ep_info_buffer or [])
            if infos:
                m["ep_return_mean"] = float(np.mean([e["r"] for e in infos]))
                m["ep_len_mean"] = float(np.mean([e["l"] for e in infos]))
                m["episodes"] = float(len(infos))
            for key, value in self.model.logger.name_to_value.items():
                if key.startswith("train/"):
                    m[key.replace("/", ".")] = float(value)
            history.append(m)
            if on_rollout is not None:
                on_rollout(steps, m)

    model.learn(total_timesteps=total_timesteps, callback=Report(), progress_bar=False)
    return history
