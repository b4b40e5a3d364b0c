"""Checkpoint selection (issue 16 item 6): the pure choice, the validation windows, the
training plan's knobs, and the ci demo with an alpha sweep choosing on a validation window
that lies inside the training span and before the held-out windows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from linkwise.cluster.mdp import make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import export_dataset
from linkwise.datasets.prediction import predictor_record
from linkwise.datasets.rollouts import (
    Window,
    cut_windows,
    jobs_from_trace,
    make_tasks,
    run_rollouts,
)
from linkwise.datasets.windows import choose_windows
from linkwise.models.learned import verify_checksums
from linkwise.models.registry import resolve_version
from linkwise.pipelines.demo import DemoResult, run_demo
from linkwise.pipelines.experiment import DEMO_CI, TrainingPlan
from linkwise.pipelines.learners import candidate_configs, train_offline
from linkwise.pipelines.selection import Candidate, select, validation_windows
from linkwise.policies.spec import PolicySpec

PHILLY = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "traces"
    / ("philly_2017-09-04_2017-10-15.csv")
)


def _cand(alpha: float, seed: int, step: int) -> Candidate:
    return Candidate("cql", seed, step, f"/pkg/{alpha}/{seed}/{step}", f"run{alpha}{seed}", alpha)


def test_select_takes_the_lowest_finite_score_and_never_a_failed_one() -> None:
    cands = [_cand(a, s, t) for a in (0.5, 1.0) for s in (0, 1) for t in (50, 100)]
    scores: dict[str, float | None] = {c.label: 100.0 + i for i, c in enumerate(cands)}
    scores[cands[5].label] = 7.0
    assert select(cands, scores).chosen == cands[5]
    scores[cands[5].label] = None  # failed a case
    scores[cands[6].label] = math.nan
    sel = select(cands, scores)
    assert sel.chosen == cands[0]
    rows = sel.table()
    assert [r["chosen"] for r in rows].count(True) == 1 and rows[0]["chosen"]
    assert rows[5]["val_avg_jct_s"] is None and rows[6]["val_avg_jct_s"] is None
    tie = dict.fromkeys((c.label for c in cands), 5.0)
    assert select(cands, tie).chosen == cands[0]  # ties: the first given
    with pytest.raises(ValueError, match="no candidate"):
        select(cands, dict.fromkeys((c.label for c in cands), None))


def _windows(counts: list[int], w: float = 10.0) -> list[Window]:
    return [
        Window(window_id=i, start=i * w, end=(i + 1) * w, jobs=tuple(range(n)))  # type: ignore[arg-type]
        for i, n in enumerate(counts)
    ]


def test_validation_windows_are_the_last_busy_ones_before_the_held_out_part() -> None:
    wins = _windows([9, 9, 9, 1, 9, 9, 9])  # windows 5 and 6 are held out (until = 50)
    chosen = validation_windows(wins, 50.0, 2, min_jobs=5)
    assert [w.window_id for w in chosen] == [2, 4]  # window 3 is too small
    assert all(w.end <= 50.0 for w in chosen)
    assert validation_windows(wins, 50.0, 0, min_jobs=5) == []
    with pytest.raises(ValueError, match="do not fit"):
        validation_windows(wins, 50.0, 4, min_jobs=5)  # would leave no training window


def test_training_plan_refuses_a_sweep_without_validation_windows() -> None:
    plan = DEMO_CI.training
    assert plan is not None and plan.validation_windows == 0 and plan.train_seeds == (0,)
    with pytest.raises(ValueError, match="validation_windows"):
        replace(plan, cql_alphas=(0.1, 1.0))
    with pytest.raises(ValueError, match="validation_windows"):
        replace(plan, train_seeds=(0, 1))
    with pytest.raises(ValueError, match="distinct"):
        replace(plan, train_seeds=(0, 0), validation_windows=1)
    replace(plan, cql_alphas=(0.1, 1.0), train_seeds=(0, 1), validation_windows=1)


def test_candidate_configs_sweep_alphas_and_seeds_with_train_overrides() -> None:
    plan = TrainingPlan(
        bc_steps=40, cql_steps=100, steps_per_epoch=50, train={"learning_rate": 0.01},
        cql_alphas=(0.1, 2.0), train_seeds=(0, 1), validation_windows=1,
    )  # fmt: skip
    cql = candidate_configs("cql", "/x.parquet", plan, seed=3)
    assert [(c.params.alpha, c.seed) for c in cql] == [(0.1, 3), (0.1, 4), (2.0, 3), (2.0, 4)]
    assert {c.params.learning_rate for c in cql} == {0.01}
    assert {(c.params.n_steps, c.params.n_steps_per_epoch) for c in cql} == {(100, 50)}
    bc = candidate_configs("bc", "/x.parquet", plan, seed=3)
    assert [c.seed for c in bc] == [3, 4] and bc[0].params.learning_rate == 0.01
    default = candidate_configs("cql", "/x.parquet", replace(plan, cql_alphas=()), seed=0)
    assert [c.params.alpha for c in default] == [1.0, 1.0]  # demo_cql.toml's alpha
    with pytest.raises(ValueError, match="unknown"):
        candidate_configs("cql", "/x.parquet", replace(plan, train={"nope": 1}), seed=0)


SWEEP = replace(
    DEMO_CI,
    training=replace(
        DEMO_CI.training,  # type: ignore[arg-type]
        bc_steps=60,
        cql_steps=60,
        steps_per_epoch=30,
        cql_alphas=(0.5, 2.0),
        validation_windows=1,
        ppo_steps=0,
    ),
    evaluation=replace(DEMO_CI.evaluation, seeds=(0,), shadow_cycles=20, ope_steps=50),
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """The ci demo with two CQL alphas choosing their checkpoint on one validation window
    (about 60 s of CPU: marked slow like ``test_demo.py``)."""
    return run_demo(tmp_path_factory.mktemp("sel"), experiment=SWEEP, progress=False)


@pytest.mark.slow
def test_validation_window_lies_in_the_training_span_before_the_held_out_ones(
    demo: DemoResult,
) -> None:
    split = demo.split
    (val,) = split["validation_windows"]
    assert split["first_submit"] < val["start"] < val["end"] <= split["until"]
    assert split["dataset_until"] == val["start"]  # left out of the dataset
    for w in demo.evaluation["windows"]:
        assert w["start"] >= split["until"]
    for span in demo.evaluation["dataset_windows"]:
        assert span["end"] <= val["start"]


@pytest.mark.slow
def test_every_checkpoint_is_scored_and_the_lowest_is_promoted(demo: DemoResult) -> None:
    plan = SWEEP.training
    assert plan is not None
    for algo, alphas, steps in (("bc", [None], plan.bc_steps), ("cql", [0.5, 2.0], plan.cql_steps)):
        sel = demo.selection[algo]
        rows = sel["table"]
        epochs = list(range(plan.steps_per_epoch, steps + 1, plan.steps_per_epoch))
        assert [(r["alpha"], r["step"]) for r in rows] == [(a, s) for a in alphas for s in epochs]
        assert all(isinstance(r["val_avg_jct_s"], float) for r in rows)
        best = min(rows, key=lambda r: r["val_avg_jct_s"])
        assert [r for r in rows if r["chosen"]] == [best]
        model = demo.models[algo]
        assert model["package_dir"] == best["package_dir"] == sel["chosen"]["package_dir"]
        assert (model["steps"], model["alpha"]) == (best["step"], best["alpha"])
        assert Path(sel["files"]["plot"]).stat().st_size > 0
        assert json.loads(Path(sel["files"]["table"]).read_text())["table"] == rows
    # every checkpoint's score is in its MLflow run at its step
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=demo.tracking_uri)
    for row in demo.selection["cql"]["table"]:
        history = client.get_metric_history(row["run_id"], "validation_avg_jct_s")
        assert {(m.step, m.value) for m in history} >= {(row["step"], row["val_avg_jct_s"])}
    # @challenger is CQL's chosen checkpoint, byte for byte
    version, _ = resolve_version("models:/linkwise-policy@challenger", demo.tracking_uri)
    assert str(version.version) == demo.models["cql"]["version"]
    pkg = Path(demo.models["cql"]["package_dir"])
    assert (
        json.loads((pkg / "policy.json").read_text())["checkpoint_step"]
        == demo.models["cql"]["steps"]
    )
    verify_checksums(pkg)


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """best_fit rollouts on two busy hours of the Philly arrivals (``DEMO_CI``'s MDP)."""
    wins = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64), n=2, min_jobs=20
    )
    tasks = make_tasks(
        wins, [PolicySpec.parse("best_fit")], [0], from_spec("8x8,leaf=2"), config=DEMO_CI.mdp
    )
    sources = {"predictor": predictor_record(tasks[0].predictor, {"fit_on": "the windows"})}
    spec = make_spec(DEMO_CI.mdp)
    out = export_dataset(run_rollouts(tasks), spec, sources, tmp_path_factory.mktemp("data"))
    return str(out["path"])


def test_train_offline_registers_the_checkpoint_validation_chose(
    tiny_dataset: str, tmp_path: Path
) -> None:
    plan = TrainingPlan(
        bc_steps=20, cql_steps=20, steps_per_epoch=10, cql_alphas=(0.5, 2.0),
        validation_windows=1, train={"batch_size": 32, "hidden_units": [16]},
    )  # fmt: skip
    want = {"bc": "bc-s0-step10", "cql": "cql-a2-s0-step10"}  # not the last of anything
    seen: list[dict[str, str]] = []

    def validate(packages: Mapping[str, str]) -> dict[str, float | None]:
        seen.append(dict(packages))
        return {k: 1.0 if k in want.values() else 5.0 for k in packages}

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    models = train_offline(
        tiny_dataset, plan, seed=0, uri=uri, out=tmp_path, console=Console(quiet=True),
        validate=validate,
    )  # fmt: skip
    assert [sorted(s) for s in seen] == [
        ["bc-s0-step10", "bc-s0-step20"],
        sorted(f"cql-a{a}-s0-step{t}" for a in ("0.5", "2") for t in (10, 20)),
    ]
    for algo, label in want.items():
        m = models[algo]
        assert m["selection"]["chosen"]["label"] == label
        assert m["package_dir"] == seen[0 if algo == "bc" else 1][label]
        assert m["steps"] == 10
    assert models["cql"]["alpha"] == 2.0
    version, _ = resolve_version("models:/linkwise-policy@challenger", uri)
    assert str(version.version) == models["cql"]["version"]
    assert (
        json.loads((Path(models["cql"]["package_dir"]) / "policy.json").read_text())["config"][
            "params"
        ]["alpha"]
        == 2.0
    )
