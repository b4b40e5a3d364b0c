"""The row network (models/rownet.py): scores permute with the slots and "wait" does not
move; disallowed actions get MASKED_VALUE from a masked observation; DiscreteCQL and
DiscreteBC with ``network = "rows"`` fit on a masked dataset, serialise their d3rlpy
configuration, and export a package that scores as the trained algorithm; the network is
far smaller than the MLP at K=16, P=3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from d3rlpy.logging import NoopAdapterFactory  # type: ignore[import-untyped]
from d3rlpy.models.encoders import VectorEncoderFactory  # type: ignore[import-untyped]

from linkwise.cluster.mdp import MdpConfig, make_spec, obs_layout
from linkwise.datasets.export import to_mdp_dataset
from linkwise.models.learned import load_package
from linkwise.models.masked import MASKED_VALUE
from linkwise.models.packaging import save_package
from linkwise.models.rownet import (
    RowCategoricalPolicy,
    RowDiscreteQFunction,
    RowEncoderFactory,
    RowScorer,
)
from linkwise.models.training import (
    AlgoConfig,
    TrainConfig,
    action_values,
    build_algo,
    fit,
    flatten_params,
    frame_arrays,
)
from linkwise.tests._frames import random_frame

SPEC = make_spec(MdpConfig(k_slots=2))
ROWS = AlgoConfig(
    n_steps=20,
    n_steps_per_epoch=20,
    batch_size=32,
    n_critics=2,
    target_update_interval=10,
    network="rows",
    row_hidden=(16, 16),
    head_hidden=(16,),
)
LAYOUT = obs_layout(make_spec(MdpConfig(k_slots=4, generators=("best_fit", "same_leaf"))))


def _random_obs(n: int, seed: int = 0) -> torch.Tensor:
    """Random features whose ``feasible`` flags are 0/1 (about half the rows present)."""
    lo = LAYOUT
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, lo.dim, generator=g)
    cands = x[:, lo.cand_offset :].reshape(n, lo.n_rows, lo.n_cand)
    cands[..., 0] = (cands[..., 0] > 0.5).float()
    return x


FRAME = random_frame(SPEC, episodes=4, steps=15)


def _permute_slots(x: torch.Tensor, perm: list[int]) -> torch.Tensor:
    """``x`` with slot ``perm[k]`` moved to slot ``k`` (its features and candidate block)."""
    lo = LAYOUT
    n = x.shape[0]
    slots = x[:, lo.slot_offset : lo.cand_offset].reshape(n, lo.k_slots, -1)[:, perm]
    cands = x[:, lo.cand_offset :].reshape(n, lo.k_slots, -1)[:, perm]
    return torch.cat([x[:, : lo.n_global], slots.reshape(n, -1), cands.reshape(n, -1)], dim=1)


def test_scores_permute_with_the_slots_and_wait_does_not_move() -> None:
    torch.manual_seed(0)
    net = RowScorer(LAYOUT, (16, 16), (16,)).eval()
    x = _random_obs(8)
    perm = [2, 0, 3, 1]
    with torch.no_grad():
        out, out_p = net(x), net(_permute_slots(x, perm))
    p = LAYOUT.n_candidates
    rows = out[:, :-1].reshape(8, LAYOUT.k_slots, p)
    rows_p = out_p[:, :-1].reshape(8, LAYOUT.k_slots, p)
    assert out.shape == (8, LAYOUT.n_rows + 1)
    assert rows.std() > 1e-4  # the rows are told apart: the check below is not vacuous
    torch.testing.assert_close(rows_p, rows[:, perm])
    torch.testing.assert_close(out_p[:, -1], out[:, -1])
    # the context sees present rows only: changing an absent row's features moves only its
    # own score
    lo = LAYOUT
    absent = int(torch.nonzero(x[0, lo.cand_offset :: lo.n_cand][: lo.n_rows] == 0)[0, 0])
    y = x.clone()
    y[0, lo.cand_offset + absent * lo.n_cand + 1 : lo.cand_offset + (absent + 1) * lo.n_cand] += 1
    with torch.no_grad():
        moved = (net(y)[0] - out[0]).abs() > 1e-6
    assert moved.nonzero().flatten().tolist() == [absent]


def _fitted(algo_name: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    ds = to_mdp_dataset(FRAME, SPEC, masks=True)
    algo = build_algo(algo_name, ROWS, "cpu:0", spec=SPEC)
    fit(algo, ds, ROWS, evaluators={}, adapter=NoopAdapterFactory())
    return algo, ds


@pytest.mark.parametrize("algo_name", ["cql", "bc"])
def test_rows_fit_mask_and_export_as_trained(algo_name: str, tmp_path: Path) -> None:
    algo, _ = _fitted(algo_name)
    mods = algo.impl.modules
    heads = list(mods.q_funcs) if algo_name == "cql" else [mods.imitator]
    kind = RowDiscreteQFunction if algo_name == "cql" else RowCategoricalPolicy
    assert all(isinstance(h, kind) and isinstance(h._fc, torch.nn.Identity) for h in heads)
    obs, masks, _ = frame_arrays(FRAME, SPEC)
    plain = action_values(algo, obs)
    masked = action_values(algo, obs, masks)
    assert np.all(masked[~masks] == MASKED_VALUE)
    if algo_name == "cql":  # Q-values of allowed actions are the unmasked ones
        np.testing.assert_allclose(masked[masks], plain[masks], rtol=1e-5)
    pkg = load_package(save_package(algo, SPEC, {"hash": "rows"}, tmp_path / "pkg"))
    with torch.no_grad():
        served = pkg.network(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(served, plain, rtol=1e-4, atol=1e-5)
    # d3rlpy serialises the configuration (what is logged) with the registered types
    text = algo.config.serialize()
    assert "linkwise_rows" in text
    again = type(algo.config).deserialize(text)
    assert again.encoder_factory.encoder == RowEncoderFactory.from_layout(
        obs_layout(SPEC), ROWS.row_hidden, ROWS.head_hidden
    )


def test_rows_is_far_smaller_than_the_mlp_at_16_slots() -> None:
    spec = make_spec(MdpConfig(k_slots=16, generators=("best_fit", "same_leaf", "first_fit")))
    params = AlgoConfig()
    rows = RowEncoderFactory.from_layout(obs_layout(spec), params.row_hidden, params.head_hidden)
    n_rows = sum(p.numel() for p in rows.create((spec.dim,)).parameters())
    encoder = VectorEncoderFactory(hidden_units=list(params.hidden_units)).create((spec.dim,))
    head = params.hidden_units[-1] * spec.n_actions + spec.n_actions
    n_mlp = sum(p.numel() for p in encoder.parameters()) + head
    assert n_rows * 5 < n_mlp


def test_rows_configuration_is_read_and_checked() -> None:
    cfg = TrainConfig.from_mapping(
        {
            "algo": "cql",
            "dataset": {"path": "x.parquet"},
            "train": {"network": "rows", "row_hidden": [32, 32], "head_hidden": [16]},
        }
    )
    assert (cfg.params.network, cfg.params.row_hidden, cfg.params.head_hidden) == (
        "rows",
        (32, 32),
        (16,),
    )
    assert flatten_params(cfg.to_json())["params.network"] == "rows"  # logged to MLflow
    with pytest.raises(ValueError, match="network"):
        AlgoConfig(network="cnn")
    with pytest.raises(ValueError, match="masked"):
        AlgoConfig(network="rows", masked=False)
    with pytest.raises(ValueError, match="ObsSpec"):
        build_algo("cql", ROWS, "cpu:0")
    other = make_spec(MdpConfig(k_slots=3))
    with pytest.raises(ValueError, match="layout"):
        build_algo("cql", ROWS, "cpu:0", spec=other).build_with_dataset(
            to_mdp_dataset(FRAME, SPEC, masks=True)
        )
