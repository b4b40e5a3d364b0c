"""Where a policy's run-time predictions come from (``evaluation.predictions``): a learned
package's own predictor first, else the history's; a policy that needs them and gets none is
refused before any simulation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from linkwise.cluster.domain import Job
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.history import History, fit_history
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.evaluation.compare import Scenario
from linkwise.evaluation.predictions import check_predictions
from linkwise.policies.heuristics import MissingPredictions, make_policy
from linkwise.policies.spec import PolicySpec

PAST = [Job(i, float(i), 1 + i % 2, 100.0 * (1 + i % 3), user=f"u{i % 2}") for i in range(30)]
NOW = tuple(Job(100 + i, 1000.0 + i, 1, 50.0, user="u0") for i in range(5))


def test_a_package_predictor_wins_over_the_history() -> None:
    history = RuntimePredictor.fit(PAST)
    own = RuntimePredictor.fit([Job(i, float(i), 1, 7.0) for i in range(10)])
    scenario = Scenario(from_spec("2x4"), NOW, load_calibration(), predictor=history)
    learned = SimpleNamespace(name="model:x", predictor=own)
    jobs, source = scenario.jobs_for(learned)
    assert source == "package" and [j.pred_s for j in jobs] == pytest.approx([7.0] * 5)
    jobs, source = scenario.jobs_for(make_policy("qssf"))
    assert source == "history" and all(j.predicted for j in jobs)
    bare = Scenario(from_spec("2x4"), NOW, load_calibration())
    assert bare.jobs_for(make_policy("qssf")) == (NOW, None)


def test_policies_that_need_predictions_are_refused_without_them() -> None:
    qssf, fifo = make_policy("qssf"), make_policy("fifo")
    old_package = SimpleNamespace(name="model:x", predictor=None)
    check_predictions(
        [PolicySpec.parse("fifo"), PolicySpec.parse("qssf")], [fifo, qssf], history=True
    )
    with pytest.raises(MissingPredictions, match=r"qssf.*--history"):
        check_predictions(
            [PolicySpec.parse("fifo"), PolicySpec.parse("qssf")], [fifo, qssf], history=False
        )
    with pytest.raises(MissingPredictions, match="package carries no run-time predictor"):
        check_predictions([PolicySpec.parse("model:./pkg")], [old_package], history=False)
    check_predictions(
        [PolicySpec.parse("model:./pkg")], [old_package], history=False, learned=False
    )
    own = SimpleNamespace(name="model:x", predictor=RuntimePredictor.fit(PAST))
    check_predictions([PolicySpec.parse("model:./pkg")], [own], history=False)


def test_an_undated_history_is_used_whole_and_says_so() -> None:
    predictor, info = fit_history(
        History(tuple(PAST), None, "old.csv"), first_submit=0.0, origin_epoch=None
    )
    assert predictor.n_jobs == 30 and "not dated" in info["history_note"]
    # dated: only what was submitted before the first evaluated job
    predictor, info = fit_history(
        History(tuple(PAST), 1000.0, "old.csv"), first_submit=0.0, origin_epoch=1010.0
    )
    assert info["history_jobs"] == 10 and info["predictor_fit_until"] == 10.0
