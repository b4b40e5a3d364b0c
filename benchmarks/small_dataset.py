"""The small Philly dataset the training benchmarks share (``masked_training.py``,
``credit_ablation.py``): rollouts with ``models/experiments/cql.toml``'s dataset settings
on the real Philly slice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PHILLY = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"


def build(out: Path, rollouts: int, topology: str, window_s: float) -> dict[str, Any]:
    from linkwise.models.training import TrainConfig
    from linkwise.pipelines.build_dataset import build_dataset

    ds = TrainConfig.from_toml(REPO / "models" / "experiments" / "cql.toml").dataset
    return build_dataset(
        trace=str(PHILLY),
        out_dir=out / "datasets",
        rollouts=rollouts,
        policies=list(ds.policies),
        epsilons=list(ds.epsilons),
        seeds=list(ds.seeds),
        window_s=window_s,
        block_s=ds.block_s,
        min_jobs=ds.min_jobs,
        topology=topology,
        config=ds.mdp_config(),
        executor="serial",
        max_steps=ds.max_steps,
    )
