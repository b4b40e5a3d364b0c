"""The shipped headline policies (``models/pretrained/``): residuals on the frontier policy
(``benchmarks/residual_headline.py``). They load with this code's encoder, record their base,
margin and deferral, and run beside the heuristics in ``linkwise compare`` on a user's trace
with its history; on a cluster they were not trained on they are at most 1.02x their base
(both with the package's predictor: ``linkwise compare --history`` fits another one for the
heuristics, so there the residual's base sees other predictions than the heuristic row)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.prediction import read_predictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.models.build import build_policy
from linkwise.models.learned import PREDICTOR, load_package
from linkwise.models.residual import ResidualPolicy, residual_from_learned, topology_signature
from linkwise.pipelines.residual import robustness
from linkwise.policies.catalog import policy_catalog
from linkwise.policies.spec import PolicySpec

PRETRAINED = Path(__file__).resolve().parents[2] / "models" / "pretrained"
SETTINGS = ("philly-all", "philly-multigpu")
OFF_CLUSTER = "16x8,leaf=4"  # neither package's cluster (88x8,leaf=8; 64x8,leaf=8,oversub=2)


def _trace(path: Path, t0: int, n: int, seed: int) -> Path:
    """A native trace of ``n`` multi-GPU-heavy jobs from ``t0``, users with typical run times."""
    rng = random.Random(seed)
    lines = ["job_id,submit_time,num_gpus,duration,user,name"]
    for i in range(n):
        user = rng.choice(["ann", "ben", "cat"])
        gpus = rng.choice([1, 2, 4, 8, 8, 16])
        base = {"ann": 900, "ben": 5400, "cat": 14000}[user]
        lines.append(f"{i},{t0 + i * 90},{gpus},{base * rng.uniform(0.5, 2):.0f},{user},m{gpus}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _residual(setting: str) -> dict[str, object]:
    meta: dict[str, object] = json.loads((PRETRAINED / setting / "policy.json").read_text())
    return meta


@pytest.mark.parametrize("setting", SETTINGS)
def test_shipped_package_is_a_current_residual_recording_its_base(setting: str) -> None:
    pkg = PRETRAINED / setting
    learned = load_package(pkg)  # checksums, ObsSpec against this encoder, network shape
    assert (pkg / PREDICTOR).is_file() and learned.predictor is not None
    meta = _residual(setting)
    assert meta["kind"] == "residual"
    data = meta["residual"]
    assert isinstance(data, dict)
    heuristics = {p.name for p in policy_catalog() if p.kind == "heuristic"}
    assert data["base"] in heuristics and not PolicySpec.parse(data["base"]).is_oracle
    assert "margin" in data and data["deferral"]["topologies"]
    policy = residual_from_learned(learned)
    assert isinstance(policy, ResidualPolicy) and policy.base_spec == data["base"]
    built = build_policy(PolicySpec.parse(f"model:{pkg}"))
    assert isinstance(built, ResidualPolicy)


@pytest.mark.parametrize("setting", SETTINGS)
def test_compare_runs_the_shipped_residual_beside_the_heuristics(
    setting: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _residual(setting)["residual"]
    assert isinstance(data, dict)
    base = str(data["base"])
    # the comparison's cluster is one the package was not trained on
    assert topology_signature(from_spec(OFF_CLUSTER)) not in data["deferral"]["topologies"]
    old = _trace(tmp_path / "old.csv", 1_000_000, 150, 1)
    new = _trace(tmp_path / "new.csv", 1_020_000, 60, 2)
    policies = f"sjf_bco,qssf,{base},model:{PRETRAINED / setting}"
    argv = ["compare", "--trace", str(new), "--history", str(old), "--policies", policies]
    assert main([*argv, "--cluster", OFF_CLUSTER, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows][:3] == ["sjf_bco", "qssf", base]
    model = rows[3]
    assert model["policy"].startswith("model:") and model["jobs"] == 60
    assert model["avg_jct_s"] >= model["lower_bound_isolated_s"] > 0


def test_shipped_residual_off_cluster_is_at_most_its_base() -> None:
    """One robustness case (``pipelines.residual.robustness``, as ``linkwise robust``): the
    multi-GPU package and its base on a cluster and fabric it was not trained on, both with
    the package's predictor, a small synthetic day."""
    pkg = PRETRAINED / "philly-multigpu"
    data = _residual("philly-multigpu")["residual"]
    assert isinstance(data, dict)
    trained = list(data["deferral"]["topologies"])
    topo = from_spec(OFF_CLUSTER)
    assert topology_signature(topo) not in trained
    jobs = synthetic.generate(400, seed=3, max_gpus=topo.total_gpus, load_scale=1.5)
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, min_jobs=20)[-1:]
    assert windows and len(windows[0].jobs) >= 20
    (case,) = robustness(
        str(pkg),
        PolicySpec.parse(str(data["base"])),
        {"off": OFF_CLUSTER},
        windows,
        (0,),
        predictor=read_predictor(pkg / PREDICTOR),
        trained=trained,
    )
    assert not case.trained_on and case.base_avg_jct_s > 0
    assert case.avg_jct_s <= 1.02 * case.base_avg_jct_s
