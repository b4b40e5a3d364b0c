"""Action masks in training (models/masked.py): on a tiny MDP where one action is never
allowed but carries a high spurious value, the masked DiscreteCQL's Double-DQN target and
conservative term and the masked DiscreteBC's loss ignore it, while the unmasked ones (the
flag off) do not; terminal next states (nothing allowed) give finite targets; the masked
algorithms train end to end through ``pipelines.train.train`` and export an obs-only network."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.datasets.export import export_dataset, to_mdp_dataset
from linkwise.models.learned import load_package, masked_argmax
from linkwise.models.training import (
    AlgoConfig,
    DatasetConfig,
    TrainConfig,
    action_values,
    build_algo,
    fit,
    frame_arrays,
)
from linkwise.tests._frames import random_frame

CONFIG = MdpConfig(k_slots=2)
SPEC = make_spec(CONFIG)
A = SPEC.n_actions
WAIT = CONFIG.wait_action
NEVER = 0  # a start action no state ever allows
SPURIOUS = 100.0  # the value the network gives it everywhere
TINY = AlgoConfig(
    n_steps=40,
    n_steps_per_epoch=20,
    batch_size=32,
    learning_rate=1e-3,
    hidden_units=(16,),
    n_critics=2,
    target_update_interval=10,
)


def tiny_frame(episodes: int = 6, steps: int = 15, seed: int = 0) -> pl.DataFrame:
    """``random_frame`` where no state ever allows ``NEVER``."""
    return random_frame(SPEC, episodes=episodes, steps=steps, seed=seed, never=(NEVER,))


FRAME = tiny_frame()


def _all_transitions(ds: Any) -> Any:
    """Every transition of a d3rlpy dataset as one torch mini-batch (in episode order)."""
    from d3rlpy.dataset import TransitionMiniBatch  # type: ignore[import-untyped]
    from d3rlpy.torch_utility import TorchMiniBatch  # type: ignore[import-untyped]

    picked = [ds.transition_picker(ep, i) for ep in ds.episodes for i in range(ep.transition_count)]
    return TorchMiniBatch.from_batch(
        TransitionMiniBatch.from_transitions(picked),
        gamma=0.99,
        compute_returns_to_go=False,
        device="cpu:0",
    )


def _spurious(heads: Any) -> None:
    """Hand-set output layers: every action's value 0, ``NEVER``'s ``SPURIOUS``."""
    with torch.no_grad():
        for fc in heads:
            fc.weight.zero_()
            fc.bias.zero_()
            fc.bias[NEVER] = SPURIOUS


def _cql(masked: bool) -> tuple[Any, Any, Any]:
    """A DiscreteCQL (masked or not) built on the tiny dataset, its Q-heads (online and
    target) hand-set, and all transitions as one batch."""
    params = dataclasses.replace(TINY, masked=masked)
    ds = to_mdp_dataset(FRAME, SPEC, masks=masked)
    algo = build_algo("cql", params, "cpu:0")
    algo.build_with_dataset(ds)
    mods = algo.impl.modules
    _spurious([q._fc for q in [*mods.q_funcs, *mods.targ_q_funcs]])
    return algo, ds, _all_transitions(ds)


def _n_allowed(batch: Any) -> torch.Tensor:
    return batch.observations[1].sum(dim=1, keepdim=True)


def test_the_impossible_action_does_not_leak_into_double_dqn_targets() -> None:
    algo, _, batch = _cql(masked=True)
    target = algo.impl.compute_target(batch)
    terminal = batch.terminals.bool()
    assert terminal.any() and (~terminal).any()
    # the next state's best allowed action is worth 0: the spurious 100 is not picked up
    assert torch.all(target[~terminal] == 0.0)
    # a terminal's next state allows nothing: a finite value, multiplied by 0 in the loss
    assert torch.isfinite(target).all()
    loss = algo.impl.compute_loss(batch, target)
    assert torch.isfinite(loss.loss) and torch.isfinite(loss.td_loss)
    # td: Q(s, a) = 0 against y = r (|r| < 1: Huber is r^2 / 2, summed over the critics):
    # no trace of the spurious value
    expected = TINY.n_critics * 0.5 * float((batch.rewards**2).mean())
    assert float(loss.td_loss.detach()) == pytest.approx(expected, rel=1e-5)

    # the flag off: the same network, the same data; the target takes the impossible action
    plain, _, pbatch = _cql(masked=False)
    ptarget = plain.impl.compute_target(pbatch)
    assert torch.all(ptarget == SPURIOUS)
    assert float(plain.impl.compute_loss(pbatch, ptarget).td_loss.detach()) > 10 * expected + 1


def test_cqls_conservative_term_ranges_over_allowed_actions_only() -> None:
    algo, _, batch = _cql(masked=True)
    acts = batch.actions.long()
    term = algo.impl._compute_conservative_loss(batch.observations, acts)
    # every allowed value is 0: logsumexp = log(number allowed), the data value 0
    log_k = float(torch.log(_n_allowed(batch)).mean())
    assert float(term.detach()) == pytest.approx(log_k, rel=1e-5)
    # and no gradient reaches the impossible action's head
    algo.impl.modules.optim.zero_grad()
    algo.impl.compute_loss(batch, algo.impl.compute_target(batch)).loss.backward()
    for q in algo.impl.modules.q_funcs:
        assert q._fc.bias.grad[NEVER] == 0.0
        assert q._fc.bias.grad.abs().sum() > 0

    plain, _, pbatch = _cql(masked=False)
    pterm = plain.impl._compute_conservative_loss(pbatch.observations, pbatch.actions.long())
    assert float(pterm.detach()) == pytest.approx(SPURIOUS, rel=1e-3)  # the leak, flag off
    plain.impl.modules.optim.zero_grad()
    plain.impl.compute_loss(pbatch, plain.impl.compute_target(pbatch)).loss.backward()
    assert plain.impl.modules.q_funcs[0]._fc.bias.grad[NEVER] != 0.0


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_bcs_loss_ignores_disallowed_actions(beta: float) -> None:
    losses = {}
    for masked in (True, False):
        params = dataclasses.replace(TINY, masked=masked, beta=beta)
        ds = to_mdp_dataset(FRAME, SPEC, masks=masked)
        algo = build_algo("bc", params, "cpu:0")
        algo.build_with_dataset(ds)
        _spurious([algo.impl.modules.imitator._fc])
        batch = _all_transitions(ds)
        losses[masked] = (algo.impl.compute_loss(batch.observations, batch.actions), batch)
        # greedy actions: never the impossible one with masks, always it without
        greedy = algo.predict(
            [o.numpy() for o in batch.observations] if masked else batch.observations.numpy()
        )
        assert (greedy != NEVER).all() if masked else (greedy == NEVER).all()
    (m, mbatch), (p, _) = losses[True], losses[False]
    # masked: uniform over the k allowed actions, NLL log(k); the penalty over them: log(k)^2
    k = _n_allowed(mbatch)
    assert float(m.imitation_loss.detach()) == pytest.approx(float(k.log().mean()), rel=1e-5)
    penalty = float((k * k.log() ** 2).sum() / k.sum())  # mean over allowed (row, action)
    assert float(m.regularization_loss.detach()) == pytest.approx(beta * penalty, rel=1e-4)
    # the flag off: the impossible action takes all the probability
    assert float(p.imitation_loss.detach()) == pytest.approx(SPURIOUS, rel=1e-3)
    lp = torch.log_softmax(torch.tensor([SPURIOUS] + [0.0] * (A - 1)), dim=0)
    assert float(p.regularization_loss.detach()) == pytest.approx(
        beta * float((lp**2).mean()), rel=1e-4
    )


def test_the_exported_module_takes_observations_alone() -> None:
    """Serving passes observations only and masks outside the network (``masked_argmax``):
    the module gives every action's unmasked value; with the masks, the training's values."""
    algo, _, _ = _cql(masked=True)
    obs, masks, _ = frame_arrays(FRAME, SPEC)
    plain = action_values(algo, obs)
    assert np.all(plain[:, NEVER] == SPURIOUS)
    with_masks = action_values(algo, obs, masks)
    assert np.all(with_masks[~masks] == -1e9) and np.all(with_masks[masks] == plain[masks])
    assert np.array_equal(masked_argmax(plain, masks), masked_argmax(with_masks, masks))


def test_fit_refuses_a_mismatch_of_data_and_algorithm() -> None:
    from d3rlpy.logging import NoopAdapterFactory  # type: ignore[import-untyped]

    short = dataclasses.replace(TINY, n_steps=20)
    plain = build_algo("bc", dataclasses.replace(short, masked=False), "cpu:0")
    with pytest.raises(ValueError, match="carries action masks"):
        fit(plain, to_mdp_dataset(FRAME, SPEC, masks=True), short, evaluators={},
            adapter=NoopAdapterFactory())  # fmt: skip
    masked = build_algo("bc", short, "cpu:0")
    with pytest.warns(UserWarning, match="trains unmasked"):
        fit(masked, to_mdp_dataset(FRAME, SPEC), short, evaluators={},
            adapter=NoopAdapterFactory())  # fmt: skip


def test_flag_in_toml_config() -> None:
    base = {"algo": "cql", "dataset": {"path": "x.parquet"}}
    assert TrainConfig.from_mapping(base).params.masked is True
    off = TrainConfig.from_mapping({**base, "train": {"masked": False}})
    assert off.params.masked is False and off.digest() != TrainConfig.from_mapping(base).digest()
    with pytest.raises(ValueError, match="masked"):
        TrainConfig.from_mapping({**base, "train": {"masked": "yes"}})


@pytest.mark.parametrize("algo", ["cql", "bc"])
def test_masked_training_end_to_end(algo: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from linkwise.pipelines.train import train

    manifest = export_dataset(FRAME, SPEC, {"tiny": True}, tmp_path / "data")
    cfg = TrainConfig(
        name=f"masked-{algo}",
        algo=algo,
        dataset=DatasetConfig(path=manifest["path"], holdout=0.34),
        params=TINY,
        device="cpu",
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*trains unmasked.*")  # no silent fallback
        r = train(cfg, tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", out_dir=tmp_path / "o",
                  register=False, progress=False)  # fmt: skip
    run = MlflowClient(tracking_uri=r.tracking_uri).get_run(r.run_id)
    p, metrics = run.data.params, run.data.metrics
    assert p["config.params.masked"] == "True"
    assert p["d3rlpy.config.params.encoder_factory.type"] == "linkwise_masked"
    if algo == "cql":
        assert p["d3rlpy.config.params.q_func_factory.type"] == "linkwise_masked_mean"
        keys: tuple[str, ...] = ("td_loss", "conservative_loss", "td_error", "initial_state_value")
    else:
        assert p["d3rlpy.config.type"] == "linkwise_masked_discrete_bc"
        keys = ("imitation_loss",)
    for key in (*keys, "loss", "action_match", "action_match_masked", "heldout_action_match"):
        assert key in metrics and np.isfinite(metrics[key]), key
    assert r.metrics["heldout_chose_masked"] == 0.0
    pkg = load_package(r.package_dir)
    obs, masks, _ = frame_arrays(FRAME, SPEC)
    chosen = masked_argmax(pkg.action_values(obs), masks)
    assert masks[np.arange(len(chosen)), chosen].all()
