"""The numpy forward of the packaged MLPs (``models.numpy_net``, issue 23 item 4): every
shipped and fixture package takes the path its structure calls for (numpy for the BC and CQL
MLPs, torch for the row network), the numpy values equal TorchScript's within the load-time
tolerance with the same best actions, PPO's actor and other structures are not recognised,
a corrupted extraction is refused by the load-time check, and a residual decides every
decision point of a seeded simulation identically on either path. Not a timed test."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision
from linkwise.cluster.mdp import MdpConfig, candidates, encode, make_spec, nothing_fits
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.prediction import annotate_state
from linkwise.models import numpy_net
from linkwise.models.learned import (
    SMALL_BATCH,
    LearnedPolicy,
    _load_network,
    load_package,
    masked_argmax,
)
from linkwise.models.numpy_net import ATOL, RTOL, Mlp, NumpyNet
from linkwise.models.packaging import write_package
from linkwise.models.residual import Deferral, ResidualPolicy, residual_from_learned
from linkwise.policies.heuristics import make_policy
from linkwise.tests._frames import random_frame
from linkwise.tests._states import decision_states

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = (ROOT / "models" / "pretrained", ROOT / "tests" / "fixtures" / "packages")
# every package folder under PACKAGE_ROOTS, and the path its network must take
EXPECTED = {"philly-all": "numpy", "philly-multigpu": "numpy", "cql-rows": "torch"}
NUMPY = sorted(k for k, v in EXPECTED.items() if v == "numpy")
TOPO = from_spec("16x8,leaf=4")
CAL = load_calibration(None)
MODEL = AnalyticModel(CAL)


def _packages() -> dict[str, Path]:
    return {p.parent.name: p.parent for root in PACKAGE_ROOTS for p in root.glob("*/network.pt")}


def _load(name: str) -> LearnedPolicy:
    return load_package(_packages()[name], model=MODEL)


def _jobs(n: int = 200, seed: int = 5) -> tuple[Any, ...]:
    drawn = synthetic.generate(n, seed=seed, max_gpus=64, load_scale=3.0)
    return tuple(assign_profiles(drawn, CAL, seed=seed))


def _torch_values(policy: LearnedPolicy, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out: np.ndarray = policy.network(torch.from_numpy(x)).numpy()
    return out


def _rows(policy: LearnedPolicy) -> np.ndarray:
    """Observations of real decision points (a heuristic on a seeded workload), then random
    rows uniform in [0, 1] and normal with sd 2."""
    states = decision_states(TOPO, _jobs(120), MODEL, make_policy("sjf_bco"))
    cfg = policy.spec.config
    real = []
    for s in states[:300]:
        if not nothing_fits(s, cfg):
            c = candidates(annotate_state(s, policy.predictor), cfg, MODEL)
            real.append(encode(c, policy.spec))
    rng = np.random.default_rng(7)
    dim = policy.spec.dim
    rand = [rng.uniform(0, 1, (128, dim)), rng.normal(0, 2, (128, dim))]
    return np.concatenate([np.stack(real), *rand]).astype(np.float32)


def test_every_package_folder_is_known() -> None:
    assert sorted(_packages()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_package_takes_the_path_of_its_structure(name: str) -> None:
    policy = _load(name)
    assert policy.forward == EXPECTED[name]
    assert (numpy_net.extract(policy.network) is None) == (EXPECTED[name] == "torch")


@pytest.mark.parametrize("name", NUMPY)
def test_numpy_values_equal_torch_and_pick_the_same_actions(name: str) -> None:
    policy = _load(name)
    x = _rows(policy)
    assert len(x) > 256 + 200  # the random rows, and real ones
    expected = _torch_values(policy, x)
    got = np.concatenate(
        [policy.action_values(x[i : i + SMALL_BATCH]) for i in range(0, len(x), SMALL_BATCH)]
    )
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)
    assert np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    masks = np.random.default_rng(1).random(got.shape) < 0.3
    masks[:, policy.spec.config.wait_action] = True
    assert np.array_equal(masked_argmax(got, masks), masked_argmax(expected, masks))
    one = policy.action_values(x[0])  # one 1-D row (a batch's matmul may round otherwise)
    assert one.shape == (1, policy.spec.n_actions)
    np.testing.assert_allclose(one, expected[:1], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", NUMPY)
def test_small_batches_take_numpy_and_large_ones_torch(name: str) -> None:
    policy = _load(name)
    assert policy.numpy_net is not None
    x = np.random.default_rng(2).uniform(0, 1, (SMALL_BATCH + 1, policy.spec.dim))
    x = x.astype(np.float32)
    small = x[:SMALL_BATCH]
    assert np.array_equal(policy.action_values(small), numpy_net.evaluate(policy.numpy_net, small))
    assert np.array_equal(policy.action_values(x), _torch_values(policy, x))


@pytest.mark.parametrize("name", NUMPY)
def test_a_reloaded_pickle_rebuilds_the_numpy_forward(name: str) -> None:
    policy = _load(name)
    again = pickle.loads(pickle.dumps(policy))
    assert again.forward == "numpy"
    x = np.random.default_rng(3).uniform(0, 1, (4, policy.spec.dim)).astype(np.float32)
    assert np.array_equal(again.action_values(x), policy.action_values(x))


# ------------------------------------------------------------------------ corruption


def _map_layers(net: NumpyNet, change: Any) -> NumpyNet:
    """``net`` with ``change(i, n, layer)`` applied to layer ``i`` of ``n`` of every MLP."""
    mlps = tuple(
        Mlp(tuple(change(i, len(m.layers), layer) for i, layer in enumerate(m.layers)))
        for m in net.mlps
    )
    return NumpyNet(net.kind, mlps)


def _last_bias_shifted(i: int, n: int, layer: Any) -> Any:
    if i < n - 1:
        return layer
    bias = layer.bias.copy()
    bias[0] += 1e-3  # a value 5e-4 (CQL's mean of two) to 1e-3 off: past the tolerance
    return dataclasses.replace(layer, bias=bias)


def _last_weight_scaled(i: int, n: int, layer: Any) -> Any:
    if i < n - 1:
        return layer
    weight_t = layer.weight_t.copy()
    weight_t[:, 0] *= np.float32(1.01)
    return dataclasses.replace(layer, weight_t=weight_t)


def _relu_as_identity(i: int, n: int, layer: Any) -> Any:
    return dataclasses.replace(layer, relu=False)


CORRUPTIONS = {
    "last-bias-shifted": _last_bias_shifted,
    "last-weight-scaled": _last_weight_scaled,
    "relu-as-identity": _relu_as_identity,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
@pytest.mark.parametrize("name", NUMPY)
def test_the_load_time_check_refuses_a_corrupted_extraction(
    name: str, corruption: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _load(name)
    dim = policy.spec.dim
    net = numpy_net.extract(policy.network)
    assert net is not None and numpy_net.verify(net, policy.network, dim)
    broken = _map_layers(net, CORRUPTIONS[corruption])
    assert not numpy_net.verify(broken, policy.network, dim)
    monkeypatch.setattr(numpy_net, "extract", lambda module: broken)
    fallen = _load(name)
    assert fallen.forward == "torch" and fallen.numpy_net is None


# ------------------------------------------------------------------------ other structures


class VectorEncoder(nn.Module):
    """d3rlpy's vector encoder's shape (the class name is what ``extract`` reads)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self._layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._layers(x)
        return out


class Head(nn.Module):
    def __init__(self, layers: list[nn.Module], n_out: int) -> None:
        super().__init__()
        self._encoder = VectorEncoder(layers)
        self._fc = nn.Linear(8, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._fc(self._encoder(x))
        return out


class Logits(nn.Module):
    def __init__(self, head: Head, top: str = "log_softmax", extra: bool = False) -> None:
        super().__init__()
        self.imitator = head
        self.top = top
        if extra:
            self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.imitator(x)
        return torch.softmax(z, -1) if self.top == "softmax" else torch.log_softmax(z, -1)


class QValues(nn.Module):
    def __init__(self, heads: list[Head], top: str = "mean") -> None:
        super().__init__()
        self.q_funcs = nn.ModuleList(heads)
        self.top = top

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = torch.stack([q(x) for q in self.q_funcs], dim=0)
        return values.mean(dim=0) if self.top == "mean" else values.min(dim=0).values


DIM, N_OUT = 6, 5


def _layers(act: type[nn.Module] = nn.ReLU, norm: bool = False) -> list[nn.Module]:
    out: list[nn.Module] = [nn.Linear(DIM, 8), act()]
    if norm:
        out.append(nn.BatchNorm1d(8))
    return [*out, nn.Linear(8, 8), act()]


STRUCTURES = {
    "bc": lambda: Logits(Head(_layers(), N_OUT)),
    "cql": lambda: QValues([Head(_layers(), N_OUT), Head(_layers(), N_OUT)]),
    "tanh": lambda: Logits(Head(_layers(nn.Tanh), N_OUT)),
    "batch-norm": lambda: QValues([Head(_layers(norm=True), N_OUT)]),
    "softmax": lambda: Logits(Head(_layers(), N_OUT), top="softmax"),
    "extra-parameter": lambda: Logits(Head(_layers(), N_OUT), extra=True),
    "min-of-q": lambda: QValues([Head(_layers(), N_OUT), Head(_layers(), N_OUT)], top="min"),
}


def _save_traced(module: nn.Module, dim: int, path: Path) -> None:
    with torch.no_grad():
        traced = torch.jit.trace(module.eval(), torch.zeros(2, dim))  # type: ignore[no-untyped-call]
    traced.save(str(path))


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_only_the_two_mlp_structures_are_recognised(structure: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _save_traced(STRUCTURES[structure](), DIM, tmp_path / "n.pt")
    network = _load_network(tmp_path / "n.pt")
    net = numpy_net.extract(network)
    if structure in ("bc", "cql"):  # the look-alikes are right: the refusals mean something
        assert net is not None and numpy_net.verify(net, network, DIM)
        assert numpy_net.load(network, DIM) is not None
    else:
        assert net is None and numpy_net.load(network, DIM) is None


SPEC = make_spec(MdpConfig(k_slots=2))


def _sb3_like(activation: type[nn.Module]) -> Any:
    """What ``models.ppo.ppo_logits_module`` reads of a MaskablePPO: its actor's parts."""
    hidden = 16
    return SimpleNamespace(
        policy=SimpleNamespace(
            pi_features_extractor=nn.Flatten(),
            mlp_extractor=SimpleNamespace(
                policy_net=nn.Sequential(
                    nn.Linear(SPEC.dim, hidden),
                    activation(),
                    nn.Linear(hidden, hidden),
                    activation(),
                )
            ),
            action_net=nn.Linear(hidden, SPEC.n_actions),
        )
    )


@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
def test_a_ppo_package_keeps_torch(activation: type[nn.Module], tmp_path: Path) -> None:
    from linkwise.models.ppo import ppo_logits_module

    torch.manual_seed(0)
    module = ppo_logits_module(_sb3_like(activation))

    def export(path: Path) -> str:
        _save_traced(module, SPEC.dim, path)
        return "logits"

    pkg = write_package(
        tmp_path / "ppo", SPEC, {"hash": "h"}, export=export, algo="MaskablePPO", versions={}
    )
    policy = load_package(pkg)
    assert policy.forward == "torch" and numpy_net.extract(policy.network) is None


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("algo", ["bc", "cql"])
def test_d3rlpy_packages_and_their_residuals_take_numpy(
    algo: str, masked: bool, tmp_path: Path
) -> None:
    """The networks ``save_package`` exports (d3rlpy's, and the masked ones of
    ``models.masked`` that the residual packages copy), untrained, three hidden layers."""
    from linkwise.datasets.export import to_mdp_dataset
    from linkwise.models.packaging import save_package
    from linkwise.models.residual import write_residual_package
    from linkwise.models.training import AlgoConfig, build_algo

    fitted = build_algo(algo, AlgoConfig(hidden_units=(16, 8, 8), masked=masked), "cpu:0")
    frame = random_frame(SPEC, episodes=2, steps=10, allowed=0.5)
    fitted.build_with_dataset(to_mdp_dataset(frame, SPEC, masks=masked))
    pkg = save_package(fitted, SPEC, {"hash": "h"}, tmp_path / "pkg")
    res = write_residual_package(
        pkg, tmp_path / "res", base="sjf_bco", margin=0.0, deferral=Deferral()
    )
    for folder in (pkg, res):
        policy = load_package(folder)
        assert policy.forward == "numpy"
        assert policy.numpy_net is not None
        assert policy.numpy_net.kind == ("logits" if algo == "bc" else "q")
        assert [len(m.layers) for m in policy.numpy_net.mlps] == [4] * (1 if algo == "bc" else 2)
        x = np.random.default_rng(4).normal(0, 1, (SMALL_BATCH, SPEC.dim)).astype(np.float32)
        np.testing.assert_allclose(
            policy.action_values(x), _torch_values(policy, x), atol=ATOL, rtol=RTOL
        )


# ------------------------------------------------------------------------ residual decisions


@dataclasses.dataclass
class _Twin:
    """Decides every decision point by two residuals (numpy, torch) and records both."""

    numpy: ResidualPolicy
    torch: ResidualPolicy
    name: str = "twin"
    pairs: list[tuple[Decision, Decision]] = dataclasses.field(default_factory=list)

    def decide(self, state: ClusterState) -> Decision:
        d = self.numpy.decide(state)
        self.pairs.append((d, self.torch.decide(state)))
        return d


def _scoring_residual(policy: LearnedPolicy) -> ResidualPolicy:
    """The package's residual made to score everywhere and deviate often: margin 0, no
    deferral, backfill as the base (the shipped BC agrees with its own base everywhere here)."""
    res = residual_from_learned(policy)
    res.base = make_policy("backfill")
    res.margin = 0.0
    res.deferral = Deferral()
    return res


@pytest.mark.parametrize("name", NUMPY)
def test_a_residual_decides_identically_on_either_path(name: str) -> None:
    on_numpy = _load(name)
    on_torch = _load(name)
    on_torch.numpy_net = None
    assert (on_numpy.forward, on_torch.forward) == ("numpy", "torch")
    twin = _Twin(_scoring_residual(on_numpy), _scoring_residual(on_torch))
    simulate(TOPO, _jobs(), MODEL, twin, SimConfig())
    a, b = twin.numpy, twin.torch
    assert len(twin.pairs) > 300
    assert a.deviations > 0 and a.decisions > a.deviations  # the network really decides
    mismatched = [i for i, (x, y) in enumerate(twin.pairs) if x != y]
    assert not mismatched, f"{len(mismatched)} decision points differ, first {mismatched[0]}"
    assert a.stats() == b.stats()
    np.testing.assert_allclose(a.advantages, b.advantages, atol=1e-3)
