"""Which policies need run-time predictions, and where each gets them from.

A policy may know what a real Slurm knows at a decision (``datasets.predictor``): never the
true run time, but the run times of jobs submitted before. The predictor of an evaluation
is fit on its ``--history`` (``datasets.history.fit_history``: only jobs submitted
before the first evaluated one, clocks aligned), or carried by a learned package.

``prediction_source`` says where a policy's predictions come from: a learned package's own
predictor (the one it was trained with) wins; otherwise the history's, which a policy that
needs predictions (``qssf``, a learned package without one) must have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linkwise.datasets.predictor import RuntimePredictor
from linkwise.policies.heuristics import MissingPredictions
from linkwise.policies.spec import PolicySpec

__all__ = [
    "check_predictions",
    "package_predictor",
    "prediction_source",
]


def package_predictor(policy: Any) -> RuntimePredictor | None:
    """The run-time predictor a learned package carries (``policy.predictor``), if any."""
    found = getattr(policy, "predictor", None)
    return found if isinstance(found, RuntimePredictor) else None


def prediction_source(policy: Any, history: bool) -> str | None:
    """Where the predictions a policy sees come from: ``"package"`` (a learned package's own
    predictor), ``"history"`` (``--history``) or None (no predictions)."""
    if package_predictor(policy) is not None:
        return "package"
    return "history" if history else None


def check_predictions(
    specs: Sequence[PolicySpec], policies: Sequence[Any], history: bool, *, learned: bool = True
) -> None:
    """Refuse (``MissingPredictions``, a ValueError) before any simulation a policy that
    needs run-time predictions and would get none: ``qssf`` without ``--history``, or (with
    ``learned``, what the commands check) a learned package without its own predictor and
    without ``--history``."""
    for spec, policy in zip(specs, policies, strict=True):
        if history or package_predictor(policy) is not None:
            continue
        if (spec.needs_predictions and not spec.is_model) or (learned and spec.is_model):
            learned_text = "its package carries no run-time predictor, so it"
            what = learned_text if spec.is_model else "it"
            raise MissingPredictions(
                f"{spec.label} orders jobs by predicted run time and {what} needs --history PATH: "
                "a trace file or DuckDB store of jobs submitted before the evaluated ones, "
                "to fit the run-time predictor on (never on the evaluated jobs)"
            )
