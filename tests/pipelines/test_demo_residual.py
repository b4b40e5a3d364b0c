"""The demo's plain statement of what learning decided (issue 33 item 5): the teacher's
headroom over the base read from the label rows the residual stage built, then either what the
residual did with it on the held-out days or that there was nothing to learn."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from linkwise.datasets.labels import LABEL_SCHEMA
from linkwise.pipelines.demo_residual import residual_heldout, residual_summary
from linkwise.pipelines.residual import label_headroom

BASE = "qssf_wait_or_spread"
HOUR = 3600.0


def _labels(points: list[list[float]]) -> pl.DataFrame:
    """A label set: one decision point per entry, its scored moves' labels (the first is the
    base's own move, label 0; action i is the i-th move, ``start`` but the last, ``wait``)."""
    rows: list[dict[str, Any]] = []
    for p, moves in enumerate(points):
        for a, label in enumerate(moves):
            rows.append(
                {
                    "episode": f"labels/{BASE}/w1/s0",
                    "point": p,
                    "time": 60.0 * p,
                    "obs": [0.0, 1.0],
                    "mask": [True] * len(moves),
                    "action": a,
                    "kind": "wait" if a == len(moves) - 1 else "start",
                    "base_action": 0,
                    "label_s": label,
                    "cost_s": 1000.0 + label,
                    "horizon_s": 3 * HOUR,
                    "samples": 2,
                }
            )
    return pl.DataFrame(rows, schema=dict(LABEL_SCHEMA))


def _residual(labels: pl.DataFrame) -> dict[str, Any]:
    """The residual stage's summary as ``build_residuals`` leaves it (figures made up but
    for the headroom, which is read from ``labels``)."""
    learner = {
        "label": "residual-BC",
        "spec": "model:/tmp/residual-bc",
        "margin": 0.25,
        "validation_avg_jct_s": 8.06 * HOUR,
    }
    return {
        "base": {"base": BASE, "avg_jct_s": 8.104 * HOUR, "candidates": {BASE: 8.104 * HOUR}},
        "base_rule": "the lowest avg JCT on the validation windows",
        "headroom": label_headroom(labels),
        "learners": {"bc": learner},
        "promoted": "bc",
    }


def _table(ratio: float, deviations: float) -> list[dict[str, Any]]:
    """The held-out comparison table's rows of the base and the residual."""
    return [
        {"spec": BASE, "avg_jct_s": 8.0 * HOUR, "avg_ratio_to_best_heuristic": 1.0},
        {
            "spec": "model:/tmp/residual-bc",
            "avg_jct_s": ratio * 8.0 * HOUR,
            "avg_ratio_to_best_heuristic": ratio,
            "deviations_per_1000": deviations,
        },
    ]


def test_headroom_is_read_from_the_label_rows() -> None:
    # 4 points: the base's move best at one (a tie at 0 goes to the base), better moves of
    # 1 h, 2 h and 0.5 h at the others
    labels = _labels([[0.0, 0.0, 50.0], [0.0, -HOUR, 10.0], [0.0, 5.0, -2 * HOUR], [0.0, -1800.0]])
    h = label_headroom(labels)
    assert h["points"] == 4 and h["points_with_a_better_move"] == 3
    assert h["total_gain_s"] == pytest.approx(3.5 * HOUR)
    assert h["mean_gain_s"] == pytest.approx(3.5 * HOUR / 4)
    assert h["mean_gain_s_where_better"] == pytest.approx(3.5 * HOUR / 3)
    assert h["better_move_kinds"] == {"start": 1, "wait": 2}


def test_the_demo_says_the_residual_followed_the_teacher() -> None:
    labels = _labels([[0.0, 0.0, 50.0], [0.0, -HOUR, 10.0], [0.0, 5.0, -2 * HOUR], [0.0, -1800.0]])
    residual = residual_heldout(_residual(labels), _table(0.995, 124.0))
    text = residual_summary(residual, None)
    last = text.splitlines()[-1]
    assert last.startswith("learning: ")
    assert "found a better move than the base at 3 of 4 labelled decision points" in last
    assert "gain 0.88 h of jobs-in-system a point on average, 3.50 h in all" in last
    assert (
        "the residual (residual-BC, margin 0.25) followed it: 124.0 deviations per 1,000 "
        "decisions, avg JCT 0.995x its base on the held-out days"
    ) in last
    assert "nothing to learn" not in text
    assert residual["learning"] == last.removeprefix("learning: ")  # demo.json keeps it


def test_the_demo_says_when_a_residual_kept_to_its_base_despite_headroom() -> None:
    labels = _labels([[0.0, -HOUR], [0.0, -HOUR]])
    residual = residual_heldout(_residual(labels), _table(1.0, 0.0))
    assert residual["learning"].endswith(
        "did not follow it: 0.0 deviations per 1,000 decisions, avg JCT 1.000x its base on "
        "the held-out days"
    )


def test_the_demo_says_plainly_when_there_is_nothing_to_learn() -> None:
    # the demo's default on 2026-12-05: better moves at 2 of 17 points, of 1 s and 970 s
    points = [[0.0, 30.0, 600.0] for _ in range(15)] + [[0.0, -1.0], [0.0, 20.0, -970.0]]
    residual = residual_heldout(_residual(_labels(points)), _table(1.0, 0.0))
    last = residual_summary(residual, None).splitlines()[-1]
    assert "found a better move than the base at 2 of 17 labelled decision points" in last
    assert "0.02 h of jobs-in-system a point on average, 0.27 h in all" in last
    assert last.endswith(
        "nothing to learn here: the base already does what the teacher would at 15 of 17 points"
    )
    assert "deviations" not in last
    assert residual["learning"] == last.removeprefix("learning: ")


def test_a_few_large_gains_at_too_few_points_are_nothing_to_learn() -> None:
    # one point in 12 with a 3 h better move: gain enough, share too small
    points = [[0.0, 10.0] for _ in range(11)] + [[0.0, -3 * HOUR]]
    residual = residual_heldout(_residual(_labels(points)), _table(0.99, 40.0))
    assert "nothing to learn here" in residual["learning"]
    assert "at 11 of 12 points" in residual["learning"]
