"""The small Philly setting the training benchmarks share (``masked_training.py``,
``credit_ablation.py``): its dataset (rollouts with ``models/experiments/cql.toml``'s
dataset settings on the real Philly slice) and the evaluation of trained packages on its
held-out windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linkwise.policies.spec import PolicySpec

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
        policies=[PolicySpec.parse(s) for s in ds.policies],
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


def evaluate_on_heldout(
    policies: list[str],
    manifest: dict[str, Any],
    out: Path,
    *,
    cluster: str,
    window_s: float,
    n_windows: int,
    seeds: list[int],
) -> Any:
    """``policies`` (heuristics and ``model:PATH``) on held-out windows of the slice, out of the
    dataset's spans, best fit the baseline; the evaluation report."""
    from linkwise.pipelines.evaluate import evaluate

    report, _ = evaluate(
        [PolicySpec.parse(p) for p in policies],
        trace=PHILLY,
        history=PHILLY,  # run-time predictor: only jobs before the first evaluation window
        holdout_from=[manifest["manifest_path"]],
        n_windows=n_windows,
        seeds=seeds,
        cluster=cluster,
        window_s=window_s,
        block_s=600.0,
        min_jobs=20,
        out_dir=out / "evaluation",
        tracking_uri=f"sqlite:///{out / 'mlflow.db'}",
        log=False,
        n_boot=500,
        baseline="best_fit",
    )
    return report
