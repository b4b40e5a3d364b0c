"""Off-policy evaluation: d3rlpy's DiscreteFQE on held-out logged transitions.

For each learned policy (a ``models.learned`` package: BC, CQL or the PPO baseline) Fitted Q
Evaluation learns ``Q^pi`` from the logged transitions alone and reads the policy's value at
the held-out episodes' initial states: ``estimate = mean_s0 Q^pi(s0, pi(s0))``. Beside it
stands what the behaviour policy actually got from the same initial states: its observed
discounted return ``sum_t gamma^t r_t`` (``behaviour_return``), and FQE's own estimate for
the behaviour policy (``behaviour_estimate``: the same machinery on the logged actions, so
FQE's bias can be read off). FQE is fitted once per seed; ``estimate`` is the median over
seeds (a seed whose fit diverged, as bootstrapping off the data's support can, does not
move it) and ``spread`` their sample standard deviation.

How the policy is queried. d3rlpy's FQE asks its ``algo`` for greedy actions at next
observations (``algo.impl.predict_best_action(tensor)``; ``algo.predict(array)`` for the
evaluators). d3rlpy has no masks, and the served policy is the *masked* greedy one, so
``MaskedGreedy`` stands in for the algorithm: it rebuilds each observation's action mask
from the observation itself (``mask_from_obs``: the mask is a pure function of the encoded
``feasible`` and ``redundant`` candidate features; checked against the logged masks) and
returns ``masked_argmax`` of the package's TorchScript values, i.e. exactly the action
``LearnedPolicy`` would take. The behaviour policy is a table from the logged observations
to the logged actions (exact for a deterministic behaviour; for a stochastic one, one of its
logged actions at that state).

Rewards are the MDP's (minus jobs-in-system x time over ``time_scale_s``); values are in the
same unit, so higher is better. ``ope_table`` gives the mapping gates read:
``{policy: {"estimate", "behaviour_return", "spread", "seeds", ...}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from linkwise.cluster.mdp import ObsSpec
from linkwise.datasets.export import read_dataset, to_mdp_dataset
from linkwise.datasets.transitions import list_column_array
from linkwise.models.build import build_policy
from linkwise.models.learned import LearnedPolicy, masked_argmax
from linkwise.models.training import quiet_d3rlpy
from linkwise.policies.spec import PolicySpec

__all__ = [
    "BEHAVIOUR",
    "FqeParams",
    "MaskedGreedy",
    "OpeResult",
    "ValueBounds",
    "behaviour_returns",
    "fqe_values",
    "initial_observations",
    "logged_policy",
    "mask_from_obs",
    "ope_table",
    "policy_chooser",
    "run_ope",
]

BEHAVIOUR = "behaviour"

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
Chooser = Callable[[FloatArray], IntArray]


@dataclass(frozen=True)
class FqeParams:
    """DiscreteFQE's hyperparameters (every one set: d3rlpy's defaults are generic)."""

    n_steps: int = 4000
    n_steps_per_epoch: int = 1000
    batch_size: int = 128
    learning_rate: float = 3e-4
    gamma: float = 0.99
    target_update_interval: int = 100
    hidden_units: tuple[int, ...] = (128, 128)

    def __post_init__(self) -> None:
        if min(self.n_steps, self.n_steps_per_epoch, self.batch_size) <= 0:
            raise ValueError("n_steps, n_steps_per_epoch and batch_size must be positive")
        if self.n_steps % self.n_steps_per_epoch:
            raise ValueError("n_steps must be a multiple of n_steps_per_epoch")
        if not 0 <= self.gamma < 1 or not 0 < self.learning_rate < 1:
            raise ValueError("gamma must be in [0, 1) and learning_rate in (0, 1)")
        if self.target_update_interval <= 0 or not self.hidden_units:
            raise ValueError("target_update_interval and hidden_units must be positive")


@dataclass(frozen=True)
class OpeResult:
    """One policy's off-policy evaluation (values in reward units; higher is better)."""

    policy: str
    estimate: float  # median over seeds of FQE's initial-state value
    behaviour_return: float  # observed discounted return from the same initial states
    spread: float  # sample standard deviation of the estimate over seeds (0 for one seed)
    seeds: tuple[int, ...]
    estimates: tuple[float, ...]  # one per seed
    behaviour_estimate: float  # FQE's value of the behaviour policy (same seeds)
    episodes: int
    transitions: int
    gamma: float

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["estimates"] = list(self.estimates)
        return d


# ------------------------------------------------------------------------ masks and data


def _feature_index(spec: ObsSpec, suffix: str) -> IntArray:
    cfg = spec.config
    index = {n: i for i, n in enumerate(spec.feature_names)}
    names = [f"s{k}.{g}.{suffix}" for k in range(cfg.k_slots) for g in cfg.generators]
    return np.asarray([index[n] for n in names], dtype=np.int64)


def mask_from_obs(obs: FloatArray, spec: ObsSpec) -> BoolArray:
    """The action masks of encoded observations ``(N, dim) -> (N, n_actions)``: a start is
    allowed where its candidate is ``feasible`` (and not ``redundant`` when duplicates are
    masked); wait always."""
    x = np.asarray(obs, dtype=np.float32).reshape(-1, spec.dim)
    allowed = x[:, _feature_index(spec, "feasible")] > 0.5
    if spec.config.mask_duplicates:
        allowed &= x[:, _feature_index(spec, "redundant")] < 0.5
    wait = np.ones((len(x), 1), dtype=bool)
    return np.concatenate([allowed, wait], axis=1)


def _canonical(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort("episode", "step")


def _obs(df: pl.DataFrame, spec: ObsSpec) -> FloatArray:
    return list_column_array(df, "obs", spec.dim, np.float32)


def initial_observations(df: pl.DataFrame, spec: ObsSpec) -> FloatArray:
    """The first observation of every episode (in episode order)."""
    first = _canonical(df).group_by("episode", maintain_order=True).first()
    return _obs(first, spec)


def behaviour_returns(df: pl.DataFrame, gamma: float) -> npt.NDArray[np.float64]:
    """Each episode's observed discounted return from its first step, ``sum_t gamma^t r_t``
    (in episode order)."""
    c = _canonical(df).with_columns(
        (
            pl.col("reward") * pl.lit(gamma).pow(pl.col("step").rank("ordinal").over("episode") - 1)
        ).alias("disc")
    )
    out = c.group_by("episode", maintain_order=True).agg(pl.col("disc").sum())
    return out["disc"].to_numpy().astype(np.float64)


# ------------------------------------------------------------------------ policies for FQE


def policy_chooser(policy: LearnedPolicy) -> Chooser:
    """``obs -> masked greedy action`` of a served policy (the mask rebuilt from the obs)."""
    spec = policy.spec

    def choose(obs: FloatArray) -> IntArray:
        x = np.array(obs, dtype=np.float32).reshape(-1, spec.dim)  # a writable copy for torch
        if len(x) == 0:
            return np.zeros(0, dtype=np.int64)
        return masked_argmax(policy.action_values(x), mask_from_obs(x, spec))

    return choose


def logged_policy(df: pl.DataFrame, spec: ObsSpec) -> Chooser:
    """The behaviour policy as a table: logged observation -> the logged action (the first
    one logged there); an observation never logged gets wait."""
    obs = _obs(df, spec)
    actions = df["action"].to_numpy().astype(np.int64)
    table: dict[bytes, int] = {}
    for row, a in zip(obs, actions, strict=True):
        table.setdefault(row.tobytes(), int(a))
    wait = spec.config.wait_action

    def choose(x: FloatArray) -> IntArray:
        rows = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1, spec.dim))
        return np.asarray([table.get(r.tobytes(), wait) for r in rows], dtype=np.int64)

    return choose


class _GreedyImpl:
    def __init__(self, choose: Chooser) -> None:
        self.choose = choose

    def predict_best_action(self, x: Any) -> Any:
        # torch takes seconds to import: only where a network is built, exported or read
        import torch

        actions = self.choose(x.detach().cpu().numpy())
        return torch.from_numpy(actions).to(x.device)


class MaskedGreedy:
    """Stands in for a d3rlpy algorithm inside ``DiscreteFQE``: greedy actions from a
    chooser (``impl.predict_best_action`` on tensors, ``predict`` on arrays)."""

    def __init__(self, choose: Chooser) -> None:
        self.choose = choose
        self.impl = _GreedyImpl(choose)

    def predict(self, x: Any) -> IntArray:
        return self.choose(np.asarray(x, dtype=np.float32))


# ------------------------------------------------------------------------ FQE


@dataclass(frozen=True)
class ValueBounds:
    """The range every value lies in: a discounted sum of rewards in ``[r_min, r_max]``
    (each step discounted by at least ``gamma``) is within ``[min(0, r_min), max(0, r_max)]
    / (1 - gamma)``. Rewards here are non-positive, so values lie in ``[r_min / (1-gamma), 0]``."""

    low: float
    high: float

    @classmethod
    def of_rewards(cls, rewards: npt.ArrayLike, gamma: float) -> ValueBounds:
        r = np.asarray(rewards, dtype=np.float64)
        if r.size == 0 or not np.isfinite(r).all():
            raise ValueError("value bounds need finite rewards")
        scale = 1.0 / (1.0 - gamma)
        return cls(min(0.0, float(r.min())) * scale, max(0.0, float(r.max())) * scale)


def _bounded_fqe(bounds: ValueBounds) -> Any:
    """``DiscreteFQE`` whose bootstrap target ``Q'(s', pi(s'))`` is clipped to ``bounds``:
    off the data's support nothing anchors ``Q'``, and an unclipped target can run away (an
    always-wait policy was once valued at +17 where every reward is <= 0)."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy  # type: ignore[import-untyped]
    from d3rlpy.ope.torch.fqe_impl import DiscreteFQEImpl  # type: ignore[import-untyped]

    class BoundedImpl(DiscreteFQEImpl):  # type: ignore[misc]
        def compute_target(self, batch: Any, next_actions: Any) -> Any:
            return super().compute_target(batch, next_actions).clamp(bounds.low, bounds.high)

    class BoundedFQE(d3rlpy.ope.DiscreteFQE):  # type: ignore[misc]
        def inner_create_impl(self, observation_shape: Any, action_size: int) -> None:
            super().inner_create_impl(observation_shape, action_size)
            base: Any = self.impl
            self._impl = BoundedImpl(
                observation_shape=observation_shape,
                action_size=action_size,
                algo=base._algo,
                modules=base._modules,
                q_func_forwarder=base._q_func_forwarder,
                targ_q_func_forwarder=base._targ_q_func_forwarder,
                gamma=base._gamma,
                target_update_interval=base._target_update_interval,
                device=self._device,
            )

    return BoundedFQE


def fqe_values(
    dataset: Any,
    choose: Chooser,
    initial_obs: FloatArray,
    params: FqeParams,
    seed: int,
    device: str = "cpu:0",
    bounds: ValueBounds | None = None,
) -> float:
    """Fit DiscreteFQE for the chooser's policy on a d3rlpy dataset (one seed); the mean of
    ``Q(s0, pi(s0))`` over the initial observations. With ``bounds`` (``run_ope`` passes the
    data's), the bootstrap targets and the values read are clipped to them."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory  # type: ignore[import-untyped]
    from d3rlpy.models.encoders import VectorEncoderFactory  # type: ignore[import-untyped]
    from d3rlpy.models.q_functions import MeanQFunctionFactory  # type: ignore[import-untyped]
    from d3rlpy.optimizers import AdamFactory  # type: ignore[import-untyped]

    config = d3rlpy.ope.FQEConfig(
        learning_rate=params.learning_rate,
        optim_factory=AdamFactory(weight_decay=0.0),
        encoder_factory=VectorEncoderFactory(
            hidden_units=list(params.hidden_units), activation="relu"
        ),
        q_func_factory=MeanQFunctionFactory(),
        batch_size=params.batch_size,
        gamma=params.gamma,
        n_critics=1,
        target_update_interval=params.target_update_interval,
    )
    with quiet_d3rlpy():
        d3rlpy.seed(seed)
        cls = d3rlpy.ope.DiscreteFQE if bounds is None else _bounded_fqe(bounds)
        fqe = cls(algo=MaskedGreedy(choose), config=config, device=device)
        fqe.fit(
            dataset,
            n_steps=params.n_steps,
            n_steps_per_epoch=params.n_steps_per_epoch,
            logger_adapter=NoopAdapterFactory(),
            show_progress=False,
            save_interval=10**9,
        )
    actions = choose(initial_obs)
    values = np.asarray(fqe.predict_value(initial_obs, actions), dtype=np.float64)
    if bounds is not None:
        values = np.clip(values, bounds.low, bounds.high)
    return float(values.mean())


def _frame(transitions: pl.DataFrame | str | Path) -> tuple[pl.DataFrame, ObsSpec | None]:
    if isinstance(transitions, pl.DataFrame):
        return transitions, None

    df, manifest = read_dataset(transitions)
    return df, ObsSpec.from_json(manifest["obs_spec"])


def _resolve(policy: PolicySpec | LearnedPolicy, spec: ObsSpec) -> LearnedPolicy:
    if isinstance(policy, LearnedPolicy):
        p = policy
    else:
        resolved = build_policy(policy)
        if not isinstance(resolved, LearnedPolicy):
            raise ValueError(f"{policy.label}: FQE needs a learned policy package")
        p = resolved
    if p.spec.version != spec.version:
        raise ValueError(f"{p.name}: ObsSpec {p.spec.version}, the transitions are {spec.version}")
    return p


def run_ope(
    transitions: pl.DataFrame | str | Path,
    policies: Mapping[str, PolicySpec | LearnedPolicy],
    *,
    spec: ObsSpec | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    params: FqeParams | None = None,
    device: str = "cpu:0",
    threads: int | None = 1,
) -> dict[str, OpeResult]:
    """FQE for every policy (name -> a ``LearnedPolicy`` or a parsed ``model:...`` spec)
    and for the behaviour policy itself (key ``"behaviour"``) on held-out transitions (a
    frame with ``spec``, or an exported dataset's path). Every policy gets the same seeds.

    ``threads``: torch CPU threads while fitting (restored after; None leaves torch's
    setting). One thread is about 5x faster than two for these small networks on a shared
    2-core machine, and with one thread and torch's deterministic algorithms (on while
    fitting) a seed gives the same estimate run after run.

    FQE's bootstrap targets and values are bounded by the range of discounted returns the
    data's rewards allow (``ValueBounds``: ``[min reward / (1 - gamma), 0]`` for these
    non-positive rewards). Off the data's support FQE still cannot tell a policy's long-run
    cost (an always-wait policy's actions are rarely logged), but it no longer reports a
    value no reward sequence could give."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    saved = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    if threads is not None:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _run_ope(transitions, policies, spec, seeds, params or FqeParams(), device)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(saved)


def _run_ope(
    transitions: pl.DataFrame | str | Path,
    policies: Mapping[str, PolicySpec | LearnedPolicy],
    spec: ObsSpec | None,
    seeds: Sequence[int],
    p: FqeParams,
    device: str,
) -> dict[str, OpeResult]:

    if not seeds:
        raise ValueError("at least one seed is needed")
    df, file_spec = _frame(transitions)
    spec = spec or file_spec
    if spec is None:
        raise ValueError("a transition frame needs its ObsSpec (spec=...)")
    if df.is_empty():
        raise ValueError("no transitions to evaluate on")
    df = _canonical(df)
    obs = _obs(df, spec)
    logged = np.asarray(df["mask"].explode().to_numpy(), dtype=bool).reshape(df.height, -1)
    rebuilt = mask_from_obs(obs, spec)
    if not np.array_equal(rebuilt, logged):
        bad = int((rebuilt != logged).any(axis=1).sum())
        raise ValueError(f"{bad} logged masks differ from the masks their observations encode")
    with quiet_d3rlpy():
        dataset = to_mdp_dataset(df, spec)
    s0 = initial_observations(df, spec)
    observed = float(behaviour_returns(df, p.gamma).mean())
    n_ep = len(s0)

    bounds = ValueBounds.of_rewards(df["reward"].to_numpy(), p.gamma)

    def estimates(choose: Chooser) -> list[float]:
        return [fqe_values(dataset, choose, s0, p, int(s), device, bounds) for s in seeds]

    # every policy resolved (a reserved name, a missing or mismatched package) before any fit
    choosers: dict[str, Chooser] = {BEHAVIOUR: logged_policy(df, spec)}
    for name, pol in policies.items():
        if name == BEHAVIOUR:
            raise ValueError(f"{BEHAVIOUR!r} is reserved for the logged policy")
        choosers[name] = policy_chooser(_resolve(pol, spec))
    behaviour = estimates(choosers[BEHAVIOUR])
    out: dict[str, OpeResult] = {}
    for name, choose in choosers.items():
        values = behaviour if name == BEHAVIOUR else estimates(choose)
        out[name] = OpeResult(
            policy=name,
            estimate=float(np.median(values)),
            behaviour_return=observed,
            spread=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            seeds=tuple(int(s) for s in seeds),
            estimates=tuple(values),
            behaviour_estimate=float(np.median(behaviour)),
            episodes=n_ep,
            transitions=df.height,
            gamma=p.gamma,
        )
    return out


def ope_table(results: Mapping[str, OpeResult]) -> dict[str, dict[str, Any]]:
    """The mapping gates read: policy -> ``{"estimate", "behaviour_return", "spread",
    "seeds", "estimates", "behaviour_estimate", "episodes", "transitions", "gamma"}``."""
    return {name: r.to_json() for name, r in results.items()}
