"""Self-rollout iterations (``pipelines.iterate``): on the ``ci`` experiment's sizes, a
package trained on heuristic rollouts rolls itself out on the training windows, the new
dataset holds the old transitions plus the policy's own under a new hash, and the retrained
run is tagged with its round and dataset hash."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from linkwise.cluster.mdp import make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import export_dataset, read_dataset
from linkwise.datasets.prediction import predictor_record
from linkwise.datasets.rollouts import cut_windows, make_tasks, run_rollouts
from linkwise.datasets.synthetic import generate
from linkwise.datasets.traces import jobs_frame
from linkwise.datasets.windows import choose_windows
from linkwise.models.training import AlgoConfig, DatasetConfig, TrainConfig
from linkwise.pipelines.experiment import DEMO_CI
from linkwise.pipelines.iterate import ROUND_TAG, IterationPlan, iterate
from linkwise.pipelines.train import train
from linkwise.policies.spec import PolicySpec

TOPO = from_spec(DEMO_CI.topology)
SPEC = make_spec(DEMO_CI.mdp)
TINY = AlgoConfig(
    n_steps=40, n_steps_per_epoch=20, batch_size=32, learning_rate=1e-3, hidden_units=(32, 32)
)


def test_one_round_adds_the_policys_own_transitions(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    jobs = jobs_frame(generate(DEMO_CI.workload.jobs if DEMO_CI.workload else 500, seed=0))
    cut = cut_windows(jobs, DEMO_CI.windows.window_s, max_gpus=TOPO.total_gpus)
    wins = choose_windows(cut, n=2, min_jobs=DEMO_CI.windows.min_jobs)
    tasks = make_tasks(
        wins,
        [PolicySpec.parse("best_fit")],
        [0],
        TOPO,
        config=DEMO_CI.mdp,
        block_s=1800.0,
        max_steps=120,
    )
    base = export_dataset(
        run_rollouts(tasks),
        SPEC,
        {"predictor": predictor_record(tasks[0].predictor, {"fit_on": "the windows"})},
        tmp_path / "data",
    )
    cfg = TrainConfig(
        name="iterate-test",
        algo="bc",
        dataset=DatasetConfig(path=base["path"], holdout=0.2),
        params=TINY,
        device="cpu",
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = train(cfg, tracking_uri=uri, out_dir=tmp_path / "r0", register=False, progress=False)
    plan = IterationPlan(rounds=1, epsilons=(0.2,), seeds=(0,), block_s=1800.0, max_steps=80)

    (r,) = iterate(
        cfg, base["path"], first.package_dir, wins, TOPO, plan=plan, tracking_uri=uri,
        out_dir=tmp_path / "it",
    )  # fmt: skip

    df, manifest = read_dataset(r.dataset_path)
    assert r.dataset_hash == manifest["hash"] != base["hash"]
    own = df.filter(df["behaviour"].str.starts_with("model:"))
    label = f"model:{Path(first.package_dir).name}+eps0.2"
    assert set(own["behaviour"]) == {label} and set(own["source"]) == {"rollout"}
    assert own.height == r.added_transitions > 0 and own["episode"].n_unique() == len(wins)
    assert df.height == base["counts"]["transitions"] + own.height
    # the policy's own steps are its actions (or exploration), never a heuristic's match
    assert set(own["match"]) == {"policy"}
    (record,) = manifest["sources"]["self_rollouts"]
    assert record["round"] == 1 and record["package"] == str(Path(first.package_dir).resolve())
    assert record["transitions"] == own.height and record["windows"] == [w.window_id for w in wins]
    # retrained on the new dataset with the same configuration, tagged with its round
    assert r.train.dataset_hash == r.dataset_hash and r.train.run_id != first.run_id
    assert r.train.steps == TINY.n_steps
    tags = MlflowClient(tracking_uri=uri).get_run(r.train.run_id).data.tags
    assert tags[ROUND_TAG] == "1" and tags["linkwise.dataset_hash"] == r.dataset_hash


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="rounds"):
        IterationPlan(rounds=0)
    with pytest.raises(ValueError, match="epsilon"):
        IterationPlan(epsilons=())
    assert dataclasses.replace(IterationPlan(), rounds=3).rounds == 3
