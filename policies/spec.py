"""One policy specification: what ``--policy`` / ``--policies``, configs and the live loop name.

``PolicySpec.parse`` is the one place a policy string is read (the command line, a config
or a package's recorded base parse it once, at the edge, and carry the frozen value):

- ``NAME[:key=value,...]``: a heuristic of ``policies.heuristics.POLICIES`` (``is_oracle``:
  an oracle ceiling; ``needs_predictions``: ``qssf``, which orders by predicted run time,
  and learned policies). Each value is parsed by the parameter's declared type
  (``policies.compose.convert_value``): ``int``, ``float``, ``bool`` (``true``/``false``,
  ``yes``/``no``, ``1``/``0``), ``str``, ``none`` for an optional one, ``a;b`` for a tuple.
  An unknown parameter or an ill-typed value is refused.
- ``compose:order=...,placement=...[,preempt=...][,admission=...]``: a policy composed of
  parts (``policies.compose``: a part's own parameters follow it, ``part:key=value``, and a
  key that is a slot name opens the next part).
- ``lookahead:base=SPEC,...``: the search policy (``policies.lookahead``); its base and
  alternatives are parsed here too, once.
- ``model:...``: a learned policy from a ``policies.source.ModelSource`` (a registry alias,
  a ``models:/`` URI, or a local folder with an optional ``#sha256=`` digest).

``parse`` checks everything that needs no I/O. ``build`` makes the ``Policy``; a learned
one is loaded by ``models`` (``models.build.build_policy``), which this floor may not
import: ``build`` takes that loader as ``learned``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import Policy
from linkwise.cluster.profiles import load_calibration
from linkwise.policies.compose import ComposeSpec, convert_value, show_value
from linkwise.policies.heuristics import (
    ORACLE_POLICIES,
    PREDICTION_POLICIES,
    heuristic_parameters,
    make_policy,
    takes_model,
)
from linkwise.policies.lookahead import LookaheadSpec, is_lookahead
from linkwise.policies.source import ModelSource

__all__ = ["LearnedBuilder", "PolicySpec", "parse_specs", "split_specs"]

LearnedBuilder = Callable[[ModelSource, ContentionModel | None], Policy]
"""Loads a learned policy from its source, its encoder predicting contention with the model
(``models.build.load_learned``)."""


def split_specs(text: str) -> list[str]:
    """A comma-separated list of specs, where a heuristic's own ``key=value`` parameters
    also use commas: ``sjf_bco:kappa=4,lam=1.5,backfill`` is two specs. A piece that is a
    bare ``key=value`` (an ``=`` and no ``:`` before it) continues the spec before it."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head = piece.split("=", 1)[0]
        if specs and "=" in piece and ":" not in head and not specs[-1].startswith("model:"):
            specs[-1] = f"{specs[-1]},{piece}"
        else:
            specs.append(piece)
    return specs


def parse_specs(text: str, cwd: str | Path | None = None) -> tuple[PolicySpec, ...]:
    """Every spec of a comma-separated list (``split_specs``), parsed."""
    return tuple(PolicySpec.parse(s, cwd) for s in split_specs(text))


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy specification: a heuristic with typed parameters, a composition, a
    lookahead search, or a model source. ``text``: the spec as written (labels show it;
    equality ignores it)."""

    heuristic: str | None = None  # a registered name, "compose" or "lookahead"
    params: tuple[tuple[str, Any], ...] = ()
    source: ModelSource | None = None
    composed: ComposeSpec | None = None
    search: LookaheadSpec | None = None  # ``lookahead:...``
    inner: tuple[PolicySpec, ...] = ()  # a search's base then its alternatives, parsed
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str, cwd: str | Path | None = None) -> PolicySpec:
        """Parse and check a spec (ValueError naming what is wrong)."""
        text = text.strip()
        if not text:
            raise ValueError("empty policy specification")
        if text.startswith("model:"):
            return cls(source=ModelSource.parse(text, cwd=cwd), text=text)
        if text.partition(":")[0].strip() == "compose":
            return cls(heuristic="compose", composed=ComposeSpec.parse(text), text=text)
        if is_lookahead(text):
            search = LookaheadSpec.parse(text)
            inner = tuple(cls.parse(s, cwd) for s in (search.base, *search.alternatives))
            return cls(heuristic="lookahead", search=search, inner=inner, text=text)
        name, params = _parse_heuristic(text)
        return cls(heuristic=name, params=params, text=text)

    @property
    def is_model(self) -> bool:
        """Whether this names a learned policy."""
        return self.source is not None

    @property
    def is_oracle(self) -> bool:
        """Whether this names an oracle ceiling (a heuristic that reads the true run time:
        reported, marked ``oracle``, never a baseline or a gate's reference)."""
        if self.composed is not None:
            return self.composed.oracle
        if self.search is not None:
            return self.search.oracle
        return self.heuristic in ORACLE_POLICIES

    @property
    def needs_predictions(self) -> bool:
        """Whether its jobs must carry run-time predictions: ``qssf``, a composition ordered
        by predictions, the lookahead (its forks draw run times from them) and learned
        policies (from their package's predictor, else from ``--history``)."""
        if self.composed is not None:
            return self.composed.needs_predictions
        if self.search is not None:
            return True
        return self.is_model or self.heuristic in PREDICTION_POLICIES

    @property
    def kind(self) -> str:
        """``learned`` (a model source), ``search`` (the lookahead) or ``heuristic`` (a named
        heuristic or a composition)."""
        if self.source is not None:
            return "learned"
        return "search" if self.search is not None else "heuristic"

    @property
    def label(self) -> str:
        """How tables name it: the spec as written, else as ``describe`` writes it."""
        return self.text or self.describe()

    def describe(self) -> str:
        """The spec as text (parameters in the order given, typed values normalised)."""
        if self.source is not None:
            return self.source.describe()
        if self.composed is not None:
            return self.composed.describe()
        if self.search is not None:
            return self.search.describe()
        items = ",".join(f"{k}={show_value(v)}" for k, v in self.params)
        return f"{self.heuristic}:{items}" if items else str(self.heuristic)

    def build(
        self, model: ContentionModel | None = None, *, learned: LearnedBuilder | None = None
    ) -> Policy:
        """The ``Policy``: a heuristic (one that predicts contention, e.g. ``deepshare``,
        with ``model``), a composition, a lookahead (its forks predict with ``model``,
        default the shipped calibration's analytic model: what a scheduler knows, not the
        scenario's true contention), or a learned package loaded by ``learned`` (ValueError
        without it: ``models.build.build_policy`` gives it)."""
        if self.source is not None:
            if learned is None:
                raise ValueError(
                    f"{self.describe()}: a learned policy is loaded by models.build.build_policy"
                )
            return learned(self.source, model)
        if self.composed is not None:
            return self.composed.build(model)
        if self.search is not None:
            belief = model or AnalyticModel(load_calibration(None))
            base, *alternatives = (s.build(belief, learned=learned) for s in self.inner)
            return self.search.make(base, tuple(alternatives), belief)
        name = str(self.heuristic)
        params = dict(self.params)
        if model is not None and takes_model(name):
            params["model"] = model
        return make_policy(name, **params)


def _parse_heuristic(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``NAME[:key=value,...]`` as (name, typed parameters in the order given); ValueError
    for an unknown heuristic or parameter, a malformed item or an ill-typed value."""
    name, _, rest = text.partition(":")
    name = name.strip()
    declared = heuristic_parameters(name)
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"bad policy parameter {item!r} in {text!r}: expected key=value")
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise ValueError(f"{name} has no parameter {key!r} (its parameters: {known})")
        try:
            params[key] = convert_value(declared[key], value.strip())
        except ValueError as exc:
            raise ValueError(f"{name}: {key}={value.strip()!r}: {exc}") from None
    return name, tuple(params.items())
