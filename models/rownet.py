"""One network that shares across jobs: a permutation-equivariant Q-network (or BC policy)
over the observation layout ``[global | K x slot | K x P x cand]`` (``cluster.mdp.ObsLayout``).

Row ``(k, c)`` is ``[slot_k features, cand_(k, c) features]`` (action ``a = k * P + c``).
``RowScorer``:

- every row is embedded by one shared MLP (``row_hidden``; the embedding is its last width);
- a context ``MLP([global, mean of the embeddings of present rows])`` (``row_hidden``); a row
  is present when its ``feasible`` feature (candidate feature 0) is set, so the context is
  the same for a plain features tensor and for a masked observation (the mask is never
  read: the exported network scores as the trained one);
- each row's score is a shared head ``MLP([row embedding, context])`` (``head_hidden``, then
  one output) and the "wait" score a wait head ``MLP(context)``.

Output ``(B, K * P + 1)`` in action order. Permuting the slots (with their candidate blocks)
permutes the scores the same way, and leaves the wait score unchanged. The parameter count
does not grow with K or P.

Inside d3rlpy (DiscreteCQL and DiscreteBC drive training and logging as for the MLP):

- ``RowEncoderFactory`` (type ``linkwise_rows``; the layout ints and hidden sizes are its
  serialised fields): its encoder gives the ``(B, n_actions)`` scores, strips a mask as
  ``models.masked.ObservationOnly`` does (and ``build_algo`` also wraps it in
  ``MaskedEncoderFactory``, so ``is_masked`` holds);
- ``RowQFunctionFactory`` (type ``linkwise_rows_q``): the Q-values are the encoder's scores
  (no extra Linear), disallowed actions at ``masked.MASKED_VALUE``;
- ``RowDiscreteBCConfig`` / ``RowDiscreteBC`` (type ``linkwise_rows_discrete_bc``): the masked
  DiscreteBC whose categorical policy takes the scores as logits (no extra Linear).

Given a plain tensor every module gives the unmasked scores, as ``models.learned``'s export
expects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from d3rlpy.base import register_learnable  # type: ignore[import-untyped]
from d3rlpy.models.encoders import (  # type: ignore[import-untyped]
    EncoderFactory,
    register_encoder_factory,
)
from d3rlpy.models.q_functions import register_q_func_factory  # type: ignore[import-untyped]
from d3rlpy.models.torch import (  # type: ignore[import-untyped]
    DiscreteMeanQFunctionForwarder,
    Encoder,
)
from torch import nn

from linkwise.cluster.mdp import ObsLayout
from linkwise.models.masked import (
    MaskedCategoricalPolicy,
    MaskedDiscreteBC,
    MaskedDiscreteBCConfig,
    MaskedDiscreteMeanQFunction,
    MaskedMeanQFunctionFactory,
    _register,
    feature_shape,
    split_observation,
)

__all__ = [
    "RowCategoricalPolicy",
    "RowDiscreteBC",
    "RowDiscreteBCConfig",
    "RowDiscreteQFunction",
    "RowEncoder",
    "RowEncoderFactory",
    "RowQFunctionFactory",
    "RowScorer",
    "mlp",
]


def mlp(n_in: int, hidden: Sequence[int], n_out: int | None = None) -> nn.Sequential:
    """Linear + ReLU per hidden width, then a plain ``Linear(n_out)`` when given."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    if n_out is not None:
        layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


class RowScorer(nn.Module):
    """Scores of every (slot, candidate) row and of "wait" from a features batch
    ``(B, layout.dim) -> (B, layout.n_rows + 1)`` (module docstring).

    The first layer of the row embedding and of the row head act on concatenations
    (``[slot, cand]`` and ``[row embedding, context]``); each is computed as a sum of one
    linear map per part, the slot's once per slot and the context's once per state rather
    than once per row (the same function, fewer operations)."""

    def __init__(self, layout: ObsLayout, row_hidden: Sequence[int], head_hidden: Sequence[int]):
        super().__init__()
        if not row_hidden or not head_hidden or min(*row_hidden, *head_hidden) <= 0:
            raise ValueError("row_hidden and head_hidden must be non-empty and positive")
        self.layout = layout
        first, width, head = int(row_hidden[0]), int(row_hidden[-1]), int(head_hidden[0])
        self.embed_slot = nn.Linear(layout.n_slot, first)
        self.embed_cand = nn.Linear(layout.n_cand, first, bias=False)
        self.embed = mlp(first, row_hidden[1:])
        self.context = mlp(layout.n_global + width, row_hidden)
        self.head_row = nn.Linear(width, head)
        self.head_context = nn.Linear(width, head, bias=False)
        self.head = mlp(head, head_hidden[1:], 1)
        self.wait = mlp(width, head_hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo = self.layout
        k, p, r = lo.k_slots, lo.n_candidates, lo.n_rows
        glob = x[:, : lo.n_global]
        slots = x[:, lo.slot_offset : lo.cand_offset].reshape(-1, k, 1, lo.n_slot)
        cands = x[:, lo.cand_offset : lo.dim].reshape(-1, k, p, lo.n_cand)
        first = torch.relu(self.embed_slot(slots) + self.embed_cand(cands))  # (B, K, P, H)
        h = self.embed(first.reshape(-1, r, first.shape[-1]))  # (B, R, E)
        present = (cands[..., 0] > 0.5).reshape(-1, r, 1).to(h.dtype)
        pooled = (h * present).sum(dim=1) / present.sum(dim=1).clamp(min=1.0)
        ctx = self.context(torch.cat([glob, pooled], dim=-1))  # (B, E)
        both = torch.relu(self.head_row(h) + self.head_context(ctx).unsqueeze(1))
        scores = self.head(both).squeeze(-1)  # (B, R)
        return torch.cat([scores, self.wait(ctx)], dim=-1)


class RowEncoder(Encoder):  # type: ignore[misc]
    """d3rlpy encoder giving ``RowScorer``'s scores; a masked observation's mask is dropped."""

    def __init__(self, scorer: RowScorer) -> None:
        super().__init__()
        self.scorer = scorer

    def forward(self, x: Any) -> torch.Tensor:
        features, _ = split_observation(x)
        out: torch.Tensor = self.scorer(features)
        return out


@dataclasses.dataclass()
class RowEncoderFactory(EncoderFactory):  # type: ignore[misc]
    """Encoder factory of ``RowEncoder`` for the layout given by its int fields."""

    n_global: int = 0
    k_slots: int = 0
    n_slot: int = 0
    n_candidates: int = 0
    n_cand: int = 0
    row_hidden: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    head_hidden: list[int] = dataclasses.field(default_factory=lambda: [64])

    @staticmethod
    def from_layout(
        layout: ObsLayout, row_hidden: Sequence[int], head_hidden: Sequence[int]
    ) -> RowEncoderFactory:
        return RowEncoderFactory(
            **layout.to_json(),
            row_hidden=[int(w) for w in row_hidden],
            head_hidden=[int(w) for w in head_hidden],
        )

    @property
    def layout(self) -> ObsLayout:
        return ObsLayout(self.n_global, self.k_slots, self.n_slot, self.n_candidates, self.n_cand)

    def create(self, observation_shape: Any) -> RowEncoder:
        dim = self.layout.dim
        if feature_shape(observation_shape) != (dim,):
            raise ValueError(
                f"the row network's layout has {dim} features, the observations "
                f"{feature_shape(observation_shape)}"
            )
        return RowEncoder(RowScorer(self.layout, self.row_hidden, self.head_hidden))

    def create_with_action(
        self, observation_shape: Any, action_size: int, discrete_action: bool = False
    ) -> Any:
        raise NotImplementedError("the row network scores discrete actions")

    @staticmethod
    def get_type() -> str:
        return "linkwise_rows"


def _check_scores(hidden_size: int, action_size: int) -> None:
    if hidden_size != action_size:
        raise ValueError(
            f"the encoder gives {hidden_size} values, not one per action ({action_size}): "
            "the row heads need RowEncoderFactory"
        )


class RowDiscreteQFunction(MaskedDiscreteMeanQFunction):
    """The masked mean Q-function whose values are the encoder's scores (no Linear)."""

    def __init__(self, encoder: Encoder, hidden_size: int, action_size: int) -> None:
        _check_scores(hidden_size, action_size)
        super().__init__(encoder, hidden_size, action_size)
        self._fc: Any = nn.Identity()


@dataclasses.dataclass()
class RowQFunctionFactory(MaskedMeanQFunctionFactory):
    """``MaskedMeanQFunctionFactory`` giving ``RowDiscreteQFunction``."""

    def create_discrete(
        self, encoder: Encoder, hidden_size: int, action_size: int
    ) -> tuple[RowDiscreteQFunction, DiscreteMeanQFunctionForwarder]:
        q_func = RowDiscreteQFunction(encoder, hidden_size, action_size)
        return q_func, DiscreteMeanQFunctionForwarder(q_func, action_size)

    @staticmethod
    def get_type() -> str:
        return "linkwise_rows_q"


class RowCategoricalPolicy(MaskedCategoricalPolicy):
    """The masked categorical policy whose logits are the encoder's scores (no Linear)."""

    def __init__(self, encoder: Encoder, hidden_size: int, action_size: int) -> None:
        _check_scores(hidden_size, action_size)
        super().__init__(encoder, hidden_size, action_size)
        self._fc: Any = nn.Identity()


@dataclasses.dataclass()
class RowDiscreteBCConfig(MaskedDiscreteBCConfig):
    """``MaskedDiscreteBCConfig`` whose policy is ``RowCategoricalPolicy`` (give it a
    ``RowEncoderFactory``)."""

    def create(self, device: Any = False, enable_ddp: bool = False) -> RowDiscreteBC:
        return RowDiscreteBC(self, device, enable_ddp)

    @staticmethod
    def get_type() -> str:
        return "linkwise_rows_discrete_bc"


class RowDiscreteBC(MaskedDiscreteBC):
    """Masked DiscreteBC with the row network's scores as logits."""

    policy_class = RowCategoricalPolicy


_register(register_encoder_factory, RowEncoderFactory)
_register(register_q_func_factory, RowQFunctionFactory)
_register(register_learnable, RowDiscreteBCConfig)
