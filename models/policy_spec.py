"""One policy specification: what ``--policy`` / ``--policies``, configs and the live loop name.

- ``NAME[:key=value,...]``: a heuristic of ``cluster.heuristics.POLICIES`` (``is_oracle``:
  an oracle ceiling; ``needs_predictions``: ``qssf``, which orders by predicted run time,
  and learned policies). Each value is
  parsed by the parameter's declared type: ``int``, ``float``, ``bool`` (``true``/``false``,
  ``yes``/``no``, ``1``/``0``), ``str``, ``none`` for an optional one, ``a;b`` for a tuple.
  An unknown parameter or an ill-typed value is refused.
- ``compose:order=...,placement=...[,preempt=...][,admission=...]``: a policy composed of
  parts (``cluster.compose.spec``: a part's own parameters follow it, ``part:key=value``,
  and a key that is a slot name opens the next part).
- ``model:...``: a learned policy from a ``models.registry.ModelSource`` (a registry alias,
  a ``models:/`` URI, or a local folder with an optional ``#sha256=`` digest).

``policy_catalog`` lists every policy ``linkwise policies`` shows: the heuristics (each a
named composition but ``random``) and the learned packages shipped in ``models/pretrained``.

``PolicySpec.parse`` checks everything that needs no I/O; ``build`` makes the ``Policy``;
``pinned`` turns a registry alias into the version it points at now, so that an alias moving
mid-run changes nothing; ``token`` changes whenever the model behind the spec changes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linkwise.cluster.compose.spec import ComposeSpec, convert_value
from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import Policy
from linkwise.cluster.heuristics import (
    ORACLE_POLICIES,
    POLICIES,
    PREDICTION_POLICIES,
    PolicyInfo,
    make_policy,
    policy_info,
)
from linkwise.cluster.heuristics.params import heuristic_parameters, parse_heuristic
from linkwise.cluster.lookahead import LookaheadSpec, is_lookahead
from linkwise.models.learned import CHECKSUMS
from linkwise.models.registry import (
    ModelSource,
    default_tracking_uri,
    load_source,
    parse_models_uri,
    resolve_version,
)

__all__ = ["PolicySpec", "heuristic_parameters", "policy_catalog", "split_specs"]

PRETRAINED = Path(__file__).with_name("pretrained")


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


_convert = convert_value  # one parser of typed values: ``cluster.compose.spec``


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy specification: a heuristic with typed parameters, or a model source."""

    heuristic: str | None = None  # a registered name, or "compose"
    params: tuple[tuple[str, Any], ...] = ()
    source: ModelSource | None = None
    composed: ComposeSpec | None = None
    search: LookaheadSpec | None = None  # ``lookahead:...`` (``cluster.lookahead``)

    @classmethod
    def parse(cls, text: str, cwd: str | Path | None = None) -> PolicySpec:
        """Parse and check a spec (ValueError naming what is wrong)."""
        text = text.strip()
        if not text:
            raise ValueError("empty policy specification")
        if text.startswith("model:"):
            return cls(source=ModelSource.parse(text, cwd=cwd))
        if text.partition(":")[0].strip() == "compose":
            return cls(heuristic="compose", composed=ComposeSpec.parse(text))
        if is_lookahead(text):
            search = LookaheadSpec.parse(text)
            for inner in (search.base, *search.alternatives):
                cls.parse(inner, cwd)  # ValueError for a bad base or alternative
            return cls(heuristic="lookahead", search=search)
        name, params = parse_heuristic(text)
        return cls(heuristic=name, params=params)

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
        """Whether its jobs must carry run-time predictions: ``qssf``, and learned policies
        (from their package's predictor, else from ``--history``)."""
        if self.composed is not None:
            return self.composed.needs_predictions
        if self.search is not None:
            return True
        return self.is_model or self.heuristic in PREDICTION_POLICIES

    def describe(self) -> str:
        """The spec as text (parameters in the order given, typed values normalised)."""
        if self.source is not None:
            return self.source.describe()
        if self.composed is not None:
            return self.composed.describe()
        if self.search is not None:
            return self.search.describe()
        items = ",".join(f"{k}={_show(v)}" for k, v in self.params)
        return f"{self.heuristic}:{items}" if items else str(self.heuristic)

    def build(
        self, model: ContentionModel | None = None, *, tracking_uri: str | None = None
    ) -> Policy:
        """The ``Policy``: a heuristic, or a learned package loaded and verified (its encoder
        predicts contention with ``model``; registry lookups at ``tracking_uri``)."""
        if self.source is not None:
            learned = load_source(self.source, model=model, tracking_uri=tracking_uri)
            if learned.meta.get("kind") == "residual":  # a residual package (models.residual)
                from linkwise.models.residual import residual_from_learned

                return residual_from_learned(learned, model)
            return learned
        if self.composed is not None:
            return self.composed.build(model)
        if self.search is not None:
            from linkwise.models.lookahead import build_lookahead

            return build_lookahead(self.search, model)
        params = dict(self.params)
        factory = POLICIES[str(self.heuristic)]
        # a heuristic that predicts contention (deepshare) takes the scenario's model
        if model is not None and "model" in getattr(factory, "__dataclass_fields__", {}):
            params["model"] = model
        return make_policy(str(self.heuristic), **params)

    def info(self) -> PolicyInfo:
        """What this policy is (``linkwise policies``): kind, preemptive, migrates, oracle,
        needs predictions."""
        if self.source is not None:
            return _learned_info(self.source.describe())
        if self.search is not None:
            from linkwise.models.lookahead import lookahead_info

            return lookahead_info(self.search)
        return policy_info(self.describe())

    def registry_version(self, tracking_uri: str | None = None) -> str | None:
        """The registry version this spec names now (None for heuristics and folders)."""
        uri = self.source.registry_uri if self.source is not None else None
        if uri is None:
            return None
        _name, alias, version = parse_models_uri(uri)
        if alias is None:
            return str(version)
        return str(resolve_version(uri, tracking_uri or default_tracking_uri())[0].version)

    def pinned(self, tracking_uri: str | None = None) -> PolicySpec:
        """This spec with a registry alias replaced by the version it points at now."""
        if self.source is None or self.source.registry_uri is None:
            return self
        name = parse_models_uri(self.source.registry_uri)[0]
        version = self.registry_version(tracking_uri)
        return PolicySpec(source=ModelSource("uri", f"models:/{name}/{version}"))

    def token(self, tracking_uri: str | None = None) -> str | None:
        """Changes when the model behind the spec changes (an alias moved, a package
        rewritten); None for heuristics. Raises when it cannot be read."""
        if self.source is None:
            return None
        version = self.registry_version(tracking_uri)
        if version is not None:
            return version
        folder = Path(self.source.target)
        sums = folder / CHECKSUMS
        if not sums.is_file():
            found = sorted(folder.rglob(CHECKSUMS))
            sums = found[0] if found else sums
        return hashlib.sha256(sums.read_bytes()).hexdigest() if sums.is_file() else "missing"


def _learned_info(name: str) -> PolicyInfo:
    return PolicyInfo(
        name=name,
        kind="learned",
        preemptive=False,
        migrates=False,
        oracle=False,
        needs_predictions=True,
        description="a learned policy package (its encoder reads run-time predictions)",
        composition=None,
    )


def policy_catalog(pretrained: Path = PRETRAINED) -> list[PolicyInfo]:
    """Every policy ``linkwise policies`` lists: the registered heuristics (registry order)
    and the learned packages shipped in ``pretrained`` (``model:PATH``)."""
    from linkwise.models.lookahead import DEFAULT_SPEC, lookahead_info

    out = [policy_info(name) for name in POLICIES]
    out.append(lookahead_info(LookaheadSpec.parse(DEFAULT_SPEC)))  # the search policy
    if pretrained.is_dir():
        for folder in sorted(p for p in pretrained.iterdir() if (p / CHECKSUMS).is_file()):
            try:
                shown = folder.resolve().relative_to(Path.cwd())
            except ValueError:
                shown = folder
            out.append(_learned_info(f"model:{shown}"))
    return out


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ";".join(_show(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)
