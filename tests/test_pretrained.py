"""The shipped headline policies (``models/pretrained/``) load with this code's encoder and
run beside the heuristics in ``linkwise compare`` on a user's trace with its history."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.models.learned import PREDICTOR, load_package

PRETRAINED = Path(__file__).resolve().parents[1] / "models" / "pretrained"
SETTINGS = ("philly-all", "philly-multigpu")


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


@pytest.mark.parametrize("setting", SETTINGS)
def test_shipped_package_is_current_and_carries_its_predictor(setting: str) -> None:
    pkg = PRETRAINED / setting
    policy = load_package(pkg)  # checksums, ObsSpec against this encoder, network shape
    assert (pkg / PREDICTOR).is_file() and policy.predictor is not None
    meta = json.loads((pkg / "policy.json").read_text())
    assert meta["algo"] == "DiscreteCQL" and meta["config"]["params"]["network"] == "rows"


@pytest.mark.parametrize("setting", SETTINGS)
def test_compare_runs_the_shipped_policy_beside_the_heuristics(
    setting: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _trace(tmp_path / "old.csv", 1_000_000, 150, 1)
    new = _trace(tmp_path / "new.csv", 1_020_000, 60, 2)
    policies = f"sjf_bco,qssf,model:{PRETRAINED / setting}"
    argv = ["compare", "--trace", str(new), "--history", str(old), "--policies", policies]
    assert main([*argv, "--cluster", "16x8,leaf=4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows][:2] == ["sjf_bco", "qssf"]
    model = rows[2]
    assert model["policy"].startswith("model:") and model["jobs"] == 60
    assert model["avg_jct_s"] >= model["lower_bound_isolated_s"] > 0
