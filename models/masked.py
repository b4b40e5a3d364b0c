"""Action masks inside d3rlpy: DiscreteCQL and DiscreteBC that never range over impossible
actions in training.

d3rlpy 2.8 has no action masks. Here the mask travels as part of the observation: a masked
dataset's observations are the tuple ``(features, mask)`` (``datasets.export.to_mdp_dataset``
with ``masks=True``; the mask as 0/1 float32, d3rlpy's tuple observations), so every sampled
transition carries its own mask, and its next observation the *next* state's mask (a terminal
next state is d3rlpy's all-zero observation: nothing allowed). The networks split it off:

- ``MaskedEncoderFactory`` wraps any encoder factory (d3rlpy's default one unless given):
  the wrapped encoder sees only the features (``ObservationOnly``), never the mask;
- ``MaskedMeanQFunctionFactory``: the mean Q-function whose values of disallowed actions are
  ``MASKED_VALUE`` (a large, finite negative number). Everything d3rlpy computes from the
  Q-values then ranges over allowed actions only: the Double-DQN target's argmax (online
  network) and the value it picks (target network, the critics' minimum), CQL's log-sum-exp
  conservative term, greedy actions and value estimates in the evaluators. A terminal next
  state (all disallowed) gives ``MASKED_VALUE``, finite, times ``1 - terminal = 0``: 0, not
  the NaN that ``-inf * 0`` would give;
- ``MaskedDiscreteBCConfig`` / ``MaskedDiscreteBC``: DiscreteBC with a categorical policy
  whose softmax ranges over allowed actions, and whose ``beta`` penalty (d3rlpy: the mean of
  all squared normalised logits) is the mean over allowed actions only.

The factories and the BC config are registered with d3rlpy's registries (types
``linkwise_masked``, ``linkwise_masked_mean``, ``linkwise_masked_discrete_bc``), so d3rlpy
serialises the configuration (the parameters logged to MLflow) as for its own.

Given a plain tensor (features only) instead of the tuple, every module here gives the
unmasked values: that is the exported network's input (``models.packaging.export_network``
traces it with features only), and serving masks outside the network
(``learned.masked_argmax``), as for unmasked models. Values of disallowed actions are never
trained (their gradient is zero), so serving must keep masking them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from d3rlpy.algos import DiscreteBC, DiscreteBCConfig  # type: ignore[import-untyped]
from d3rlpy.algos.qlearning.torch.bc_impl import (  # type: ignore[import-untyped]
    DiscreteBCImpl,
    DiscreteBCModules,
)
from d3rlpy.base import register_learnable  # type: ignore[import-untyped]
from d3rlpy.models.encoders import (  # type: ignore[import-untyped]
    EncoderFactory,
    make_encoder_field,
    register_encoder_factory,
)
from d3rlpy.models.q_functions import (  # type: ignore[import-untyped]
    MeanQFunctionFactory,
    register_q_func_factory,
)
from d3rlpy.models.torch import (  # type: ignore[import-untyped]
    CategoricalPolicy,
    DiscreteImitationLoss,
    DiscreteMeanQFunction,
    DiscreteMeanQFunctionForwarder,
    Encoder,
    QFunctionOutput,
    compute_output_size,
)
from d3rlpy.serializable_config import DynamicConfig  # type: ignore[import-untyped]
from d3rlpy.torch_utility import wrap_model_by_ddp  # type: ignore[import-untyped]
from torch import nn
from torch.distributions import Categorical

__all__ = [
    "MASKED_VALUE",
    "MaskedCategoricalPolicy",
    "MaskedDiscreteBC",
    "MaskedDiscreteBCConfig",
    "MaskedDiscreteBCImpl",
    "MaskedDiscreteMeanQFunction",
    "MaskedEncoderFactory",
    "MaskedMeanQFunctionFactory",
    "ObservationOnly",
    "apply_mask",
    "feature_shape",
    "is_masked_shape",
    "masked_imitation_loss",
    "split_observation",
]

# The value of a disallowed action: far below any return of this problem (rewards are
# about -1e4 per step at worst), finite so that a terminal target (all disallowed) times
# (1 - terminal) is 0, and its square (1e18) finite in float32.
MASKED_VALUE = -1e9


def split_observation(x: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(features, boolean mask or None) of a batch: a tensor is features only; a pair
    ``(features, mask)`` (d3rlpy's tuple observation) carries the 0/1 mask."""
    if isinstance(x, torch.Tensor):
        return x, None
    if len(x) != 2:
        raise ValueError(f"a masked observation is (features, mask), got {len(x)} parts")
    return x[0], x[1] > 0.5


def apply_mask(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``values`` with disallowed actions set to ``MASKED_VALUE`` (no gradient flows to them);
    unchanged without a mask."""
    if mask is None:
        return values
    return values.masked_fill(~mask, MASKED_VALUE)


def is_masked_shape(observation_shape: Any) -> bool:
    """Whether d3rlpy's observation shape is a tuple's, ``[(dim,), (n_actions,)]``."""
    return isinstance(observation_shape[0], list | tuple)


def feature_shape(observation_shape: Sequence[Any]) -> tuple[int, ...]:
    """The features' shape of a d3rlpy observation shape, masked or not."""
    shape = observation_shape[0] if is_masked_shape(observation_shape) else observation_shape
    return tuple(int(s) for s in shape)


class ObservationOnly(Encoder):  # type: ignore[misc]
    """An encoder that drops the mask part of a masked observation and encodes the features
    with ``encoder``; a plain features tensor goes straight through."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: Any) -> torch.Tensor:
        features, _ = split_observation(x)
        out: torch.Tensor = self.encoder(features)
        return out


@dataclasses.dataclass()
class MaskedEncoderFactory(EncoderFactory):  # type: ignore[misc]
    """Encoder factory for masked observations: ``encoder`` (any registered factory) is built
    on the features' shape and never sees the mask. On unmasked observations it is
    ``encoder`` itself (behind a pass-through)."""

    encoder: EncoderFactory = make_encoder_field()  # noqa: RUF009 (d3rlpy's field())

    def create(self, observation_shape: Any) -> ObservationOnly:
        return ObservationOnly(self.encoder.create(feature_shape(observation_shape)))

    def create_with_action(
        self, observation_shape: Any, action_size: int, discrete_action: bool = False
    ) -> Any:
        raise NotImplementedError("masked encoders are for discrete Q-functions and policies")

    @staticmethod
    def get_type() -> str:
        return "linkwise_masked"


class MaskedDiscreteMeanQFunction(DiscreteMeanQFunction):  # type: ignore[misc]
    """d3rlpy's mean Q-function with disallowed actions' values at ``MASKED_VALUE``."""

    def forward(self, x: Any) -> QFunctionOutput:
        _, mask = split_observation(x)
        q = self._fc(self._encoder(x))
        return QFunctionOutput(q_value=apply_mask(q, mask), quantiles=None, taus=None)


@dataclasses.dataclass()
class MaskedMeanQFunctionFactory(MeanQFunctionFactory):  # type: ignore[misc]
    """``MeanQFunctionFactory`` giving ``MaskedDiscreteMeanQFunction`` (discrete only)."""

    def create_discrete(
        self, encoder: Encoder, hidden_size: int, action_size: int
    ) -> tuple[MaskedDiscreteMeanQFunction, DiscreteMeanQFunctionForwarder]:
        q_func = MaskedDiscreteMeanQFunction(encoder, hidden_size, action_size)
        return q_func, DiscreteMeanQFunctionForwarder(q_func, action_size)

    def create_continuous(self, encoder: Any, hidden_size: int) -> Any:
        raise NotImplementedError("action masks are for discrete actions")

    @staticmethod
    def get_type() -> str:
        return "linkwise_masked_mean"


# ------------------------------------------------------------------------ behaviour cloning


class MaskedCategoricalPolicy(CategoricalPolicy):  # type: ignore[misc]
    """d3rlpy's categorical policy whose logits of disallowed actions are ``MASKED_VALUE``
    (so its softmax and greedy action range over allowed actions only)."""

    def raw_logits(self, x: Any) -> torch.Tensor:
        """The logits before masking."""
        out: torch.Tensor = self._fc(self._encoder(x))
        return out

    def forward(self, x: Any) -> Categorical:
        _, mask = split_observation(x)
        return Categorical(logits=apply_mask(self.raw_logits(x), mask))


def masked_imitation_loss(
    policy: MaskedCategoricalPolicy, x: Any, action: torch.Tensor, beta: float
) -> DiscreteImitationLoss:
    """d3rlpy's discrete imitation loss (negative log-likelihood of the logged action plus
    ``beta`` times the mean squared normalised logit, i.e. log-probability) with the softmax
    over allowed actions and the penalty's mean over allowed actions only."""
    _, mask = split_observation(x)
    log_probs = F.log_softmax(apply_mask(policy.raw_logits(x), mask), dim=1)
    imitation_loss = F.nll_loss(log_probs, action.view(-1))
    if mask is None:
        penalty = (log_probs**2).mean()
    else:
        m = mask.to(log_probs.dtype)
        penalty = (log_probs**2 * m).sum() / m.sum().clamp(min=1.0)
    regularization_loss = beta * penalty
    return DiscreteImitationLoss(
        loss=imitation_loss + regularization_loss,
        imitation_loss=imitation_loss,
        regularization_loss=regularization_loss,
    )


class MaskedDiscreteBCImpl(DiscreteBCImpl):  # type: ignore[misc]
    """DiscreteBC's implementation with ``masked_imitation_loss``."""

    def compute_loss(self, obs_t: Any, act_t: torch.Tensor) -> DiscreteImitationLoss:
        return masked_imitation_loss(self._modules.imitator, obs_t, act_t.long(), self._beta)


@dataclasses.dataclass()
class MaskedDiscreteBCConfig(DiscreteBCConfig):  # type: ignore[misc]
    """``DiscreteBCConfig`` for masked observations: the encoder factory is wrapped in
    ``MaskedEncoderFactory`` when it is not one already."""

    def create(self, device: Any = False, enable_ddp: bool = False) -> MaskedDiscreteBC:
        return MaskedDiscreteBC(self, device, enable_ddp)

    @staticmethod
    def get_type() -> str:
        return "linkwise_masked_discrete_bc"


class MaskedDiscreteBC(DiscreteBC):  # type: ignore[misc]
    """DiscreteBC whose policy and loss range over allowed actions only (``policy_class``:
    the imitator's class, built as ``policy_class(encoder, hidden_size, action_size)``)."""

    policy_class: type[MaskedCategoricalPolicy] = MaskedCategoricalPolicy

    def inner_create_impl(self, observation_shape: Any, action_size: int) -> None:
        factory = self._config.encoder_factory
        if not isinstance(factory, MaskedEncoderFactory):
            factory = MaskedEncoderFactory(encoder=factory)
        encoder = factory.create(observation_shape)
        hidden_size = compute_output_size([observation_shape], encoder)
        imitator: Any = self.policy_class(
            encoder=encoder, hidden_size=hidden_size, action_size=action_size
        )
        imitator.to(self._device)
        if self._enable_ddp:
            imitator = wrap_model_by_ddp(imitator)
        optim = self._config.optim_factory.create(
            imitator.named_modules(), lr=self._config.learning_rate, compiled=self.compiled
        )
        self._impl = MaskedDiscreteBCImpl(
            observation_shape=observation_shape,
            action_size=action_size,
            modules=DiscreteBCModules(optim=optim, imitator=imitator),
            beta=self._config.beta,
            compiled=self.compiled,
            device=self._device,
        )


def _register(register: Any, cls: type[DynamicConfig]) -> None:
    """Register once (d3rlpy asserts a type name is registered only once per process)."""
    with contextlib.suppress(AssertionError):
        register(cls)


_register(register_encoder_factory, MaskedEncoderFactory)
_register(register_q_func_factory, MaskedMeanQFunctionFactory)
_register(register_learnable, MaskedDiscreteBCConfig)
