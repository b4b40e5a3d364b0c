"""The run-time predictor: history before the span only, group fallback, limits, JSON."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from linkwise.cluster.domain import Job
from linkwise.datasets.predictor import RuntimePredictor, accuracy


def _history(n: int = 400, seed: int = 0) -> list[Job]:
    """Users with their own typical run times (lognormal around 10 min, 1 h, 10 h)."""
    rng = np.random.default_rng(seed)
    scale = {"a": 600.0, "b": 3600.0, "c": 36000.0}
    jobs = []
    for i in range(n):
        user = "abc"[i % 3]
        dur = float(scale[user] * rng.lognormal(0.0, 0.5))
        jobs.append(
            Job(i, float(i * 60), int(rng.choice([1, 2, 8])), dur, user=user, name=f"{user}-train")
        )
    return jobs


def test_it_learns_only_from_jobs_submitted_before_the_span() -> None:
    jobs = _history()
    until = jobs[200].submit_time
    p = RuntimePredictor.fit(jobs, until=until)
    assert p.n_jobs == 200 and p.fit_until == until
    # the future's true run times change nothing
    future_changed = jobs[:200] + [dataclasses.replace(j, duration=1.0) for j in jobs[200:]]
    assert RuntimePredictor.fit(future_changed, until=until) == p
    with pytest.raises(ValueError, match="no history"):
        RuntimePredictor.fit(jobs, until=-1.0)


def test_groups_fall_back_from_specific_to_general() -> None:
    p = RuntimePredictor.fit(_history(), min_count=5)
    a = p.predict(Job(9000, 0.0, 1, 1.0, user="a", name="a-train"))
    c = p.predict(Job(9001, 0.0, 1, 1.0, user="c", name="c-train"))
    assert a[0] < 1200 < 20000 < c[0]  # each user's own scale
    assert all(lo <= hi for lo, hi in (a, c))  # median <= p90
    stranger = p.predict(Job(9002, 0.0, 8, 1.0, user="zz", name="new"))
    eights = [j.duration for j in _history() if j.num_gpus == 8]
    assert stranger[0] == pytest.approx(float(np.exp(np.median(np.log(eights)))), rel=1e-9)
    nobody = p.predict(Job(9003, 0.0, 4, 1.0, user="zz"))  # no group but everything
    assert nobody[0] == pytest.approx(
        float(np.exp(np.median(np.log([j.duration for j in _history()]))))
    )


def test_a_time_limit_caps_the_prediction_and_json_round_trips() -> None:
    p = RuntimePredictor.fit(_history())
    limited = p.predict(Job(1, 0.0, 1, 1.0, user="c", name="c-train", time_limit=900.0))
    assert limited == (900.0, 900.0)
    again = RuntimePredictor.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p
    with pytest.raises(ValueError, match="format"):
        RuntimePredictor.from_json({**p.to_json(), "format": "other/9"})
    with pytest.raises(ValueError, match="ascending"):
        RuntimePredictor.fit(_history(), quantiles=(0.9, 0.5))


def test_accuracy_reports_error_rank_and_coverage() -> None:
    jobs = _history(900, seed=1)
    p = RuntimePredictor.fit(jobs, until=jobs[600].submit_time)
    acc = accuracy(p, jobs[600:])
    assert acc["jobs"] == 300 and acc["spearman"] > 0.7
    assert 0.35 < acc["coverage_q50"] < 0.65 and 0.8 < acc["coverage_q90"] < 0.97


def test_annotate_sets_median_and_upper_quantile_capped_at_the_limit() -> None:
    history = [Job(i, float(i), 1, 100.0 * (1 + i % 10), user="u") for i in range(50)]
    predictor = RuntimePredictor.fit(history)
    fresh = Job(99, 100.0, 1, 5.0, user="u")
    limited = Job(100, 100.0, 1, 5.0, user="u", time_limit=300.0)
    a, b = predictor.annotate([fresh, limited])
    assert (a.pred_s, a.pred_hi_s) == predictor.predict(fresh)
    assert a.duration == 5.0 and a.predicted
    assert b.pred_hi_s == 300.0 and b.pred_s <= 300.0
    assert not fresh.predicted
