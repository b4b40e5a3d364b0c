"""Counterfactual labels with the lookahead's terminal cost (``LabelTask.terminal``): the
same decision points and moves as without it, the base's own action still 0, every move's
cost larger by the work its fork leaves at the horizon, if any."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, run_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.policies.heuristics import make_policy

TOPO = from_spec("2x8")


def test_labels_with_the_terminal_cost() -> None:
    jobs = synthetic.generate(60, seed=2, max_gpus=TOPO.total_gpus, load_scale=8.0)
    predictor = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=16))
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, max_gpus=TOPO.total_gpus, min_jobs=5)
    task = LabelTask(
        base=make_policy("sjf_bco"),
        base_name="sjf_bco",
        window=windows[0],
        topology=TOPO,
        config=MdpConfig(k_slots=3),
        predictor=predictor,
        horizon_s=1800.0,
        n=1,
        points=2,
        alternatives=3,
    )
    before = run_labels([task], "serial")
    after = run_labels([replace(task, terminal=True)], "serial")
    assert before.height > 0
    keys = ["episode", "point", "action"]
    assert before.select(keys).equals(after.select(keys))
    base = after.filter(pl.col("action") == pl.col("base_action"))
    assert (base["label_s"] == 0.0).all()
    # the work a fork leaves at a 30-minute horizon is counted (nothing left: the same cost)
    assert (after["cost_s"] >= before["cost_s"]).all()
    assert (after["cost_s"] > before["cost_s"]).sum() >= after.height // 2
