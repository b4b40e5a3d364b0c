"""The headline run (``benchmarks/headline.md``): the demo's pipeline on a real trace with the
``HEADLINE`` experiment (``pipelines.experiment``): the trace replayed under backfill on
104x8 as the cluster's history, daily windows, the last week held out, BC, CQL and
MaskablePPO against every heuristic, QSSF and the oracle ceilings. As in the demo, one
run-time predictor is fit on the training weeks alone and every policy that reads
predictions reads that one's (``docs/INFORMATION.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from linkwise.pipelines.demo import DemoResult, run_demo
from linkwise.pipelines.experiment import HEADLINE, Experiment

__all__ = ["run_headline"]


def run_headline(
    trace: str | Path,
    out_dir: str | Path = "linkwise-out/headline",
    *,
    cluster: str | None = None,
    trace_format: str = "philly",
    experiment: Experiment = HEADLINE,
    seeds: Sequence[int] | None = None,
    seed: int = 0,
    tracking_uri: str | None = None,
    progress: bool = True,
) -> DemoResult:
    """The headline run into ``out_dir``; ``cluster`` and ``seeds`` (evaluation seeds)
    override the experiment's; ``benchmarks/headline.md`` is written from its result.
    Variants pass ``experiment=dataclasses.replace(HEADLINE, ...)``."""
    if seeds is not None:
        experiment = replace(
            experiment, evaluation=replace(experiment.evaluation, seeds=tuple(seeds))
        )
    return run_demo(
        out_dir,
        trace=trace,
        trace_format=trace_format,
        cluster=cluster,
        experiment=experiment,
        seed=seed,
        tracking_uri=tracking_uri,
        progress=progress,
    )
