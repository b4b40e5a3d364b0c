"""A numpy forward for the packaged MLP networks (issue 23 item 4): one row through numpy
costs tens of microseconds where the TorchScript interpreter costs a few hundred.

``extract`` recognises the two structures ``models.packaging.value_module`` traces with
d3rlpy's vector encoder (Linear/ReLU layers, then the ``_fc`` Linear), by the modules'
``original_name``, the parameter names and the top-level graph's ops:

- ``"logits"`` (DiscreteBC): ``log_softmax(imitator(x), -1)``;
- ``"q"`` (DiscreteCQL, DQN): ``mean(stack([q_funcs.0(x), ...]), 0)``.

Anything else (the row network of ``models.rownet``, PPO's actor, batch norm, other
activations, parameters left over) gives None. ``load`` accepts an extraction only when it
reproduces the TorchScript network on fixed probe rows (``verify``); callers keep torch
otherwise. ``evaluate`` is ``(B, dim) -> (B, n_actions)`` in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ATOL",
    "RTOL",
    "Dense",
    "Mlp",
    "NumpyNet",
    "evaluate",
    "extract",
    "load",
    "log_softmax",
    "mlp_forward",
    "probe_rows",
    "verify",
]

FloatArray = npt.NDArray[np.float32]

ATOL = 1e-4  # verify's tolerance: |numpy - torch| <= ATOL + RTOL * |torch|
RTOL = 1e-5
PROBE_ROWS = 64  # uniform rows in PROBE_RANGE, plus one row of zeros
PROBE_RANGE = (-1.0, 2.0)
PROBE_SEED = 0


@dataclass(frozen=True, eq=False)
class Dense:
    """``x @ weight_t + bias``, then ``max(0, .)`` when ``relu``; ``weight_t`` is the torch
    Linear's weight transposed, ``(n_in, n_out)``."""

    weight_t: FloatArray
    bias: FloatArray
    relu: bool


@dataclass(frozen=True, eq=False)
class Mlp:
    """Dense layers applied in order."""

    layers: tuple[Dense, ...]


@dataclass(frozen=True, eq=False)
class NumpyNet:
    """``kind`` ``"logits"``: the log-softmax of the one MLP's output; ``"q"``: the mean of
    the MLPs' outputs."""

    kind: str
    mlps: tuple[Mlp, ...]


def mlp_forward(mlp: Mlp, x: FloatArray) -> FloatArray:
    """The MLP's output for ``(B, n_in)`` rows."""
    h = x
    for layer in mlp.layers:
        h = h @ layer.weight_t + layer.bias
        if layer.relu:
            h = np.maximum(h, 0.0)
    return h


def log_softmax(z: FloatArray) -> FloatArray:
    """Row-wise log-softmax, shifted by the row's maximum (no overflow)."""
    s = z - z.max(axis=-1, keepdims=True)
    out: FloatArray = s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
    return out


def evaluate(net: NumpyNet, x: FloatArray) -> FloatArray:
    """The network's values of ``(B, dim)`` float32 rows, ``(B, n_actions)``."""
    if net.kind == "logits":
        return log_softmax(mlp_forward(net.mlps[0], x))
    total = mlp_forward(net.mlps[0], x)
    for mlp in net.mlps[1:]:
        total = total + mlp_forward(mlp, x)
    out: FloatArray = total / np.float32(len(net.mlps))
    return out


# ------------------------------------------------------------------------ extraction


def _top_ops(module: Any) -> set[str]:
    """The ``aten::`` ops of the module's own graph (submodule calls not inlined)."""
    return {n.kind() for n in module.graph.nodes() if n.kind().startswith("aten::")}


def _array(t: Any) -> FloatArray:
    return np.array(t.detach().cpu().numpy(), dtype=np.float32, order="C")


def _dense(linear: Any, relu: bool) -> Dense:
    return Dense(
        weight_t=np.ascontiguousarray(_array(linear.weight).T), bias=_array(linear.bias), relu=relu
    )


def _head(head: Any, prefix: str, used: set[str]) -> Mlp | None:
    """The MLP of a q-function or imitator: its ``_encoder`` (d3rlpy's ``VectorEncoder``,
    or linkwise's ``ObservationOnly`` around one) of Linear/ReLU layers, then ``_fc``
    (Linear). The names of the parameters read are added to ``used``."""
    children = dict(head.named_children())
    if set(children) != {"_encoder", "_fc"} or children["_fc"].original_name != "Linear":
        return None
    encoder, path = children["_encoder"], f"{prefix}._encoder"
    if encoder.original_name == "ObservationOnly":
        inner = dict(encoder.named_children())
        if set(inner) != {"encoder"}:
            return None
        encoder, path = inner["encoder"], f"{path}.encoder"
    if encoder.original_name != "VectorEncoder":
        return None
    parts = dict(encoder.named_children())
    if set(parts) != {"_layers"} or parts["_layers"].original_name != "Sequential":
        return None
    seq = list(parts["_layers"].named_children())
    if [name for name, _ in seq] != [str(i) for i in range(len(seq))]:
        return None
    kinds = [m.original_name for _, m in seq]
    layers: list[Dense] = []
    for i, (name, m) in enumerate(seq):
        if kinds[i] == "ReLU":
            if i == 0 or kinds[i - 1] != "Linear":
                return None
            continue
        if kinds[i] != "Linear":
            return None
        relu = i + 1 < len(seq) and kinds[i + 1] == "ReLU"
        layers.append(_dense(m, relu))
        used.update({f"{path}._layers.{name}.weight", f"{path}._layers.{name}.bias"})
    if not layers:
        return None
    layers.append(_dense(children["_fc"], relu=False))
    used.update({f"{prefix}._fc.weight", f"{prefix}._fc.bias"})
    return Mlp(tuple(layers))


def extract(module: Any) -> NumpyNet | None:
    """The numpy form of a loaded TorchScript value network of a known structure (module
    docstring), else None. Every parameter must be read and the module hold no buffers."""
    try:
        params = {name for name, _ in module.named_parameters()}
        if any(True for _ in module.named_buffers()):
            return None
        top = dict(module.named_children())
        ops = _top_ops(module)
        used: set[str] = set()
        if set(top) == {"imitator"} and ops == {"aten::log_softmax"}:
            mlp = _head(top["imitator"], "imitator", used)
            net = None if mlp is None else NumpyNet("logits", (mlp,))
        elif set(top) == {"q_funcs"} and ops == {"aten::stack", "aten::mean"}:
            q_funcs = list(top["q_funcs"].named_children())
            if top["q_funcs"].original_name != "ModuleList" or not q_funcs:
                return None
            mlps = [_head(q, f"q_funcs.{name}", used) for name, q in q_funcs]
            ok = [m for m in mlps if m is not None]
            net = NumpyNet("q", tuple(ok)) if len(ok) == len(mlps) else None
        else:
            return None
    except (AttributeError, RuntimeError):  # not a TorchScript module of this shape
        return None
    if net is None or used != params:
        return None
    return net


# ------------------------------------------------------------------------ verification


def probe_rows(dim: int) -> FloatArray:
    """The fixed rows ``verify`` compares on: ``PROBE_ROWS`` seeded uniform rows in
    ``PROBE_RANGE`` and one row of zeros."""
    rng = np.random.default_rng(PROBE_SEED)
    rows = rng.uniform(*PROBE_RANGE, size=(PROBE_ROWS, dim)).astype(np.float32)
    return np.concatenate([rows, np.zeros((1, dim), dtype=np.float32)])


def verify(net: NumpyNet, module: Any, dim: int) -> bool:
    """Whether ``net`` gives the TorchScript ``module``'s values on ``probe_rows(dim)``
    within ``ATOL + RTOL * |torch|``, every value finite."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    x = probe_rows(dim)
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    try:
        got = evaluate(net, x)
    except ValueError:  # shapes that do not chain
        return False
    if got.shape != expected.shape or not np.isfinite(expected).all():
        return False
    return bool(np.all(np.abs(got - expected) <= ATOL + RTOL * np.abs(expected)))


def load(module: Any, dim: int) -> NumpyNet | None:
    """``extract`` accepted by ``verify``, else None (the caller keeps torch)."""
    net = extract(module)
    if net is None or not verify(net, module, dim):
        return None
    return net
