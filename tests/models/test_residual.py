"""The residual policy (``models.residual``): at worst its base, deviating only past its
margin, deferring off its training cluster and range; its package round trip; BC and CQL
on counterfactual labels with real d3rlpy (``pipelines.residual``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Policy
from linkwise.cluster.fork import fresh
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, run_labels, write_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.models.build import build_policy
from linkwise.models.learned import PackageError
from linkwise.models.residual import (
    Deferral,
    ResidualPolicy,
    topology_signature,
    write_residual_package,
)
from linkwise.models.training import AlgoConfig
from linkwise.pipelines.residual import (
    LabelTraining,
    best_actions,
    dagger_round,
    label_deferral,
    train_on_labels,
)
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec

TOPO = from_spec("2x8")
CFG = MdpConfig(k_slots=3)
SPEC = make_spec(CFG)
MODEL = AnalyticModel(load_calibration(None))
PREDICTOR = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=16))


def _jobs(seed: int = 3, n: int = 50) -> tuple[Any, ...]:
    drawn = synthetic.generate(n, seed=seed, max_gpus=16, load_scale=8.0)
    return PREDICTOR.annotate(assign_profiles(drawn, load_calibration(None), seed=seed))


@dataclass
class Recorder:
    """Records every decision a policy takes, with the state's time."""

    inner: Policy
    name: str = "rec"
    log: list[tuple[float, Decision]] = field(default_factory=list)

    def decide(self, state: ClusterState) -> Decision:
        d = self.inner.decide(state)
        self.log.append((state.time, d))
        return d


def _run(policy: Policy, jobs: tuple[Any, ...]) -> Recorder:
    rec = Recorder(policy)
    simulate(TOPO, jobs, MODEL, rec, SimConfig())
    return rec


def _residual(
    base: str, values: Callable[[Any], Any], margin: float, deferral: Deferral | None = None
) -> ResidualPolicy:
    return ResidualPolicy(
        base=make_policy(base),
        values=values,
        obs_spec=SPEC,
        belief=MODEL,
        margin=margin,
        deferral=deferral or Deferral(),
        base_spec=base,
    )


def _prefers_wait(obs: Any) -> Any:
    """A model that always rates waiting 1 above every start."""
    v = np.zeros((1, SPEC.n_actions), dtype=np.float32)
    v[0, CFG.wait_action] = 1.0
    return v


def _varied(obs: Any) -> Any:
    """Values that depend on the state: a different preference at every decision point."""
    x = float(np.asarray(obs).sum())
    return np.sin(np.arange(SPEC.n_actions, dtype=np.float32) * (1.0 + x))[None, :]


@pytest.mark.parametrize("base", ["sjf_bco", "qssf_preemptive", "tiresias_las"])
def test_margin_infinity_decides_exactly_as_the_base(base: str) -> None:
    jobs = _jobs()
    plain = _run(make_policy(base), jobs)
    res = _residual(base, _varied, math.inf)
    mine = _run(res, jobs)
    assert mine.log == plain.log  # decision by decision, the same times
    assert res.deviations == 0 and res.decisions > 0


def test_it_deviates_only_where_the_advantage_exceeds_the_margin() -> None:
    jobs = _jobs()
    base = _run(make_policy("sjf_bco"), jobs)
    res = _residual("sjf_bco", _varied, 0.5)
    out = _run(res, jobs)
    assert res.deviations > 0
    assert res.deviations == sum(a > 0.5 for a in res.advantages)
    assert out.log != base.log
    # above every advantage seen, nothing deviates: the base again, decision by decision
    high = _residual("sjf_bco", _varied, 2.01)  # |sin - sin| <= 2
    assert _run(high, jobs).log == base.log and high.deviations == 0
    # a model that rates waiting 1 above every start: deviates at margin 0.5, never at 1
    waits = _residual("sjf_bco", _prefers_wait, 0.5)
    _run(waits, jobs)
    assert waits.deviations > 0 and set(waits.advantages) <= {1.0, 0.0, -1.0}
    never = _residual("sjf_bco", _prefers_wait, 1.0)
    assert _run(never, jobs).log == base.log and never.deviations == 0


def test_it_defers_on_an_unseen_topology_out_of_range_features_and_low_support() -> None:
    jobs = _jobs()
    base = _run(make_policy("sjf_bco"), jobs)
    other = topology_signature(from_spec("4x8"))
    assert other != topology_signature(TOPO)
    unseen = _residual("sjf_bco", _prefers_wait, 0.0, Deferral(topologies=(other,)))
    assert _run(unseen, jobs).log == base.log
    assert unseen.deviations == 0 and unseen.deferrals["topology"] == unseen.decisions > 0
    seen = _residual(
        "sjf_bco", _prefers_wait, 0.0, Deferral(topologies=(topology_signature(TOPO),))
    )
    _run(seen, jobs)
    assert seen.deviations > 0 and seen.deferrals["topology"] == 0
    narrow = Deferral(feature_lo=(0.0,) * SPEC.dim, feature_hi=(0.0,) * SPEC.dim, tolerance=0.0)
    out_of_range = _residual("sjf_bco", _prefers_wait, 0.0, narrow)
    assert _run(out_of_range, jobs).log == base.log
    assert out_of_range.deferrals["range"] == out_of_range.decisions > 0
    unsupported = Deferral(support=(0,) * SPEC.n_actions, min_support=1)
    rare = _residual("sjf_bco", _prefers_wait, 0.0, unsupported)
    assert _run(rare, jobs).log == base.log
    assert rare.deferrals["support"] == rare.decisions > 0


def test_the_range_rule_counts_the_features_outside_their_range() -> None:
    rule = Deferral(feature_lo=(0.0, 0.0, 0.0), feature_hi=(1.0, 1.0, 1.0), tolerance=0.1)
    inside = np.array([0.5, 1.05, -0.05], dtype=np.float32)
    one_out = np.array([0.5, 1.2, 0.0], dtype=np.float32)
    two_out = np.array([-0.5, 1.2, 0.0], dtype=np.float32)
    assert rule.obs_reason(inside) == ""
    assert rule.obs_reason(one_out) == "range"
    loose = replace(rule, max_out=1)
    assert loose.obs_reason(one_out) == "" and loose.obs_reason(two_out) == "range"
    assert Deferral.from_json(loose.to_json()) == loose
    assert Deferral.from_json({k: v for k, v in rule.to_json().items() if k != "max_out"}) == rule
    with pytest.raises(ValueError, match="max_out"):
        Deferral(max_out=-1)


def test_the_deviation_is_the_move_then_the_base_on_what_it_leaves() -> None:
    jobs = _jobs()
    res = _residual("sjf_bco", _varied, 0.5)
    seen: list[tuple[Decision, Decision]] = []

    @dataclass
    class Both:
        name: str = "both"

        def decide(self, state: ClusterState) -> Decision:
            ref = fresh(res.base, MODEL).decide(state)
            d = res.decide(state)
            seen.append((ref, d))
            return d

    simulate(TOPO, jobs, MODEL, Both(), SimConfig())
    differ = [(a, b) for a, b in seen if a != b]
    assert len(differ) == res.deviations > 0


# ------------------------------------------------------------------------ labels, d3rlpy


def _label_tasks() -> list[LabelTask]:
    jobs = synthetic.generate(60, seed=2, max_gpus=TOPO.total_gpus, load_scale=8.0)
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, max_gpus=TOPO.total_gpus, min_jobs=5)
    return [
        LabelTask(
            base=make_policy("sjf_bco"),
            base_name="sjf_bco",
            window=windows[0],
            topology=TOPO,
            seed=0,
            config=CFG,
            predictor=PREDICTOR,
            horizon_s=2 * 3600.0,
            n=2,
            points=3,
            alternatives=4,
        )
    ]


@pytest.fixture(scope="module")
def labels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    df = run_labels(_label_tasks(), "serial")
    manifest = write_labels(df, CFG, {"base": "sjf_bco"}, tmp_path_factory.mktemp("labels"))
    return df, manifest


TINY = AlgoConfig(n_steps=20, n_steps_per_epoch=10, batch_size=8, hidden_units=(16,))


@pytest.fixture(scope="module")
def trained(
    labels: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, LabelTraining]]:
    """BC and CQL fit once on the label set (real d3rlpy, a few steps), one MLflow store."""
    df, manifest = labels
    root = tmp_path_factory.mktemp("trained")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    runs = {
        algo: train_on_labels(
            df, manifest, algo, TINY, root / "pkgs", predictor=PREDICTOR, tracking_uri=uri
        )
        for algo in ("bc", "cql")
    }
    return uri, runs


def test_best_actions_take_the_least_label_and_the_base_on_ties(labels: Any) -> None:
    df, _ = labels
    best = best_actions(df)
    assert best.height == df.select("episode", "point").unique().height
    for row in best.iter_rows(named=True):
        part = df.filter((df["episode"] == row["episode"]) & (df["point"] == row["point"]))
        least = part["label_s"].min()
        assert row["label_s"] == least
        if least == 0.0:
            assert row["action"] == row["base_action"]


@pytest.mark.parametrize("algo", ["bc", "cql"])
def test_bc_and_cql_train_on_labels_and_package_as_a_residual(
    labels: Any, trained: Any, algo: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    df, manifest = labels
    uri, runs = trained
    r = runs[algo]
    assert r.algo == algo
    run = MlflowClient(uri).get_run(r.run_id)
    assert run.data.tags["linkwise.dataset_hash"] == manifest["hash"]
    assert run.data.params["dataset.hash"] == manifest["hash"]
    assert 0.0 <= r.label_match <= 1.0
    expected = best_actions(df).height if algo == "bc" else df.height
    assert r.transitions == expected
    deferral = label_deferral(df, SPEC, [topology_signature(TOPO)], min_support=2)
    pkg = write_residual_package(r.package_dir, tmp_path / "res", base="sjf_bco", margin=0.25,
                                 deferral=deferral, chosen={"why": "test"})  # fmt: skip
    meta = json.loads((pkg / "policy.json").read_text())
    assert meta["kind"] == "residual" and meta["residual"]["base"] == "sjf_bco"
    assert meta["residual"]["advantage"] == ("q difference" if algo == "cql" else
                                             "log-probability difference")  # fmt: skip
    policy = build_policy(PolicySpec.parse(f"model:{pkg}"), MODEL)
    assert isinstance(policy, ResidualPolicy)
    assert policy.margin == 0.25 and policy.deferral == deferral and policy.base_spec == "sjf_bco"
    assert "base=sjf_bco" in policy.name and "margin=0.25" in policy.name
    assert policy.predictor is not None
    # infinity travels as "inf", and that residual is its base
    inf_pkg = write_residual_package(r.package_dir, tmp_path / "inf", base="sjf_bco",
                                     margin=math.inf, deferral=deferral)  # fmt: skip
    assert json.loads((inf_pkg / "policy.json").read_text())["residual"]["margin"] == "inf"
    inf = build_policy(PolicySpec.parse(f"model:{inf_pkg}"), MODEL)
    jobs = _jobs()
    assert _run(inf, jobs).log == _run(make_policy("sjf_bco"), jobs).log
    # a changed policy.json is refused by the checksums
    (pkg / "policy.json").write_text(json.dumps({**meta, "residual": {"base": "fifo"}}))
    with pytest.raises(PackageError, match="SHA-256"):
        build_policy(PolicySpec.parse(f"model:{pkg}"), MODEL)


def test_a_residual_base_must_be_a_heuristic(trained: Any, tmp_path: Path) -> None:
    r = trained[1]["bc"]
    pkg = write_residual_package(r.package_dir, tmp_path / "r", base="srtf_oracle",
                                 margin=1.0, deferral=Deferral())  # fmt: skip
    with pytest.raises(PackageError, match="heuristic"):
        build_policy(PolicySpec.parse(f"model:{pkg}"), MODEL)


def test_one_dagger_round_labels_the_residuals_own_states(
    labels: Any, trained: Any, tmp_path: Path
) -> None:
    df, manifest = labels
    uri, runs = trained
    r = runs["bc"]
    pkg = write_residual_package(r.package_dir, tmp_path / "r", base="sjf_bco", margin=0.0,
                                 deferral=Deferral())  # fmt: skip
    union, again = dagger_round(df, manifest, str(pkg), _label_tasks(), TINY, tmp_path / "p2",
                                tracking_uri=uri)  # fmt: skip
    own = union.filter(union["episode"].str.contains("residual-round"))
    assert own.height > 0 and union.height == df.height + own.height
    assert again.dataset_hash != manifest["hash"]
    assert again.transitions == best_actions(union).height


def test_a_dagger_round_can_retrain_cql_on_every_scored_move(
    labels: Any, trained: Any, tmp_path: Path
) -> None:
    df, manifest = labels
    uri, runs = trained
    pkg = write_residual_package(runs["cql"].package_dir, tmp_path / "r", base="sjf_bco",
                                 margin=0.0, deferral=Deferral())  # fmt: skip
    union, again = dagger_round(df, manifest, str(pkg), _label_tasks(), TINY, tmp_path / "p2",
                                tracking_uri=uri, algo="cql")  # fmt: skip
    assert again.algo == "cql"
    # CQL learns from every scored move of the union, BC from one best move per point
    assert again.transitions == union.height > best_actions(union).height
