"""The parts by name, and ``compose:`` specs (the text of a composition, read and written).

    compose:order=pred_remaining,placement=bounded,preempt=priority:margin=1.5,min_run_s=600

A spec is comma-separated ``slot=part`` items, the slots being ``order``, ``placement``,
``preempt`` and ``admission`` (``order`` and ``placement`` required; ``preempt=none`` and
``admission=greedy`` by default). A part takes parameters after a colon, ``part:key=value``,
and further ``key=value`` items after it belong to the part before them: a key that is a
slot name opens the next part, any other key is a parameter of the part last opened (no
part has a parameter named like a slot, so the reading is unambiguous). Values are parsed
by the parameter's declared type (``convert_value``). Unknown slots, parts and parameters
and ill-typed values are refused, naming what is known. ``ComposeSpec.of`` reads a built
``Composed`` back as its spec (what ``linkwise policies`` shows as a heuristic's
composition).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from linkwise.cluster.contention import ContentionModel
from linkwise.policies.composed import Composed
from linkwise.policies.parts.admission import ADMISSIONS
from linkwise.policies.parts.orders import ORDERS
from linkwise.policies.parts.placements import PLACEMENTS
from linkwise.policies.parts.preemption import PREEMPTIONS

__all__ = ["PARTS", "SLOTS", "ComposeSpec", "convert_value", "part_parameters", "show_value"]

PREFIX = "compose"
SLOTS: tuple[str, ...] = ("order", "placement", "preempt", "admission")
DEFAULTS: Mapping[str, str] = {"preempt": "none", "admission": "greedy"}
PARTS: Mapping[str, Mapping[str, type]] = {
    "order": ORDERS,
    "placement": PLACEMENTS,
    "preempt": PREEMPTIONS,
    "admission": ADMISSIONS,
}
_HIDDEN = frozenset({"model", "who"})  # fields set by the builder, not by a spec

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


def convert_value(hint: Any, raw: str) -> Any:
    """``raw`` as a value of the type ``hint`` (ValueError when it is not one): ``int``,
    ``float``, ``bool`` (``true``/``false``, ``yes``/``no``, ``1``/``0``), ``str``, ``none``
    for an optional one, ``a;b`` for a tuple."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and raw.lower() == "none":
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return convert_value(option, raw)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin is Literal:
        if raw not in [str(a) for a in args]:
            raise ValueError(f"expected one of {', '.join(map(str, args))}")
        return next(a for a in args if str(a) == raw)
    if origin is tuple:
        elem = args[0] if args else str
        return tuple(convert_value(elem, x.strip()) for x in raw.split(";") if x.strip())
    if hint is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ValueError("expected true or false")
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError("expected an integer") from None
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError("expected a number") from None
    if hint is str:
        return raw
    raise ValueError(f"parameters of type {hint} cannot be given on the command line")


def part_parameters(cls: type) -> dict[str, Any]:
    """The parameters (name -> type hint) a spec may give a part."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if f.init and f.name not in _HIDDEN and not f.name.startswith("_")
    }


def _given(part: Any) -> tuple[tuple[str, Any], ...]:
    """A built part's spec parameters that differ from their declared defaults."""
    out = []
    for f in dataclasses.fields(part):
        if not f.init or f.name in _HIDDEN or f.name.startswith("_"):
            continue
        value = getattr(part, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if value != default:
            out.append((f.name, value))
    return tuple(out)


def show_value(value: Any) -> str:
    if isinstance(value, tuple):
        return ";".join(show_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class ComposeSpec:
    """A parsed ``compose:`` spec: one part per slot, with typed parameters."""

    parts: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]  # (slot, part, params)

    @classmethod
    def parse(cls, text: str) -> ComposeSpec:
        """Parse and check (ValueError naming what is wrong and what is known)."""
        head, sep, rest = text.strip().partition(":")
        if head.strip() != PREFIX or not sep:
            raise ValueError(f"a composed policy is {PREFIX}:order=...,placement=..., got {text!r}")
        chosen: dict[str, tuple[str, dict[str, str]]] = {}
        slot: str | None = None
        for item in (p.strip() for p in rest.split(",")):
            if not item:
                continue
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                raise ValueError(f"{PREFIX}: bad item {item!r}: expected slot=part or key=value")
            if key in SLOTS:
                if key in chosen:
                    raise ValueError(f"{PREFIX}: {key}= given twice")
                name, colon, first = value.partition(":")
                chosen[key] = (name.strip(), {})
                slot = key
                if colon:
                    k, eq2, v = first.partition("=")
                    if not eq2:
                        raise ValueError(
                            f"{PREFIX}: bad parameter {first!r} of {key}={name.strip()}: "
                            "expected key=value"
                        )
                    chosen[key][1][k.strip()] = v.strip()
                continue
            if slot is None:
                raise ValueError(
                    f"{PREFIX}: {item!r} before any part: start with one of "
                    f"{', '.join(s + '=' for s in SLOTS)}"
                )
            params = chosen[slot][1]
            if key in params:
                raise ValueError(f"{PREFIX}: {slot}={chosen[slot][0]}: {key}= given twice")
            params[key] = value.strip()
        for required in ("order", "placement"):
            if required not in chosen:
                known = ", ".join(PARTS[required])
                raise ValueError(f"{PREFIX}: {required}= is required (known: {known})")
        parts = []
        for s in SLOTS:
            name, raw = chosen.get(s, (DEFAULTS.get(s, ""), {}))
            parts.append((s, name, _typed(s, name, raw)))
        return cls(tuple(parts))

    @classmethod
    def of(cls, policy: Composed) -> ComposeSpec:
        """The spec of a built composition: each slot's part and the parameters it was
        given that differ from the part's defaults (never parsed to build it)."""
        built: dict[str, Any] = {
            "order": policy.order,
            "placement": policy.placement,
            "preempt": policy.preemption,
            "admission": policy.admission,
        }
        return cls(tuple((s, built[s].name, _given(built[s])) for s in SLOTS))

    def part(self, slot: str) -> tuple[str, dict[str, Any]]:
        """The part in ``slot`` and its parameters."""
        for s, name, params in self.parts:
            if s == slot:
                return name, dict(params)
        raise KeyError(slot)  # pragma: no cover - every slot is filled by parse

    def describe(self) -> str:
        """Canonical text: every slot, parameters in the order given, values normalised."""
        items = []
        for s, name, params in self.parts:
            text = f"{s}={name}"
            for i, (k, v) in enumerate(params):
                text += f"{':' if i == 0 else ','}{k}={show_value(v)}"
            items.append(text)
        return f"{PREFIX}:{','.join(items)}"

    @property
    def oracle(self) -> bool:
        return bool(getattr(ORDERS[self.part("order")[0]], "oracle", False))

    @property
    def needs_predictions(self) -> bool:
        return bool(getattr(ORDERS[self.part("order")[0]], "needs_predictions", False))

    @property
    def preemptive(self) -> bool:
        return bool(getattr(PREEMPTIONS[self.part("preempt")[0]], "preemptive", False))

    @property
    def migrates(self) -> bool:
        return bool(getattr(PREEMPTIONS[self.part("preempt")[0]], "migrates", False))

    def build(
        self, model: ContentionModel | None = None, *, name: str = "", who: str = ""
    ) -> Composed:
        """The ``Composed`` policy (``model``: the contention model parts that predict
        contention use, e.g. ``preempt=migrate``; the shipped calibration when None)."""
        built: dict[str, Any] = {}
        for s, part, params in self.parts:
            cls = PARTS[s][part]
            kwargs = dict(params)
            fields = {f.name for f in dataclasses.fields(cls)}
            if "model" in fields and model is not None:
                kwargs["model"] = model
            if "who" in fields and who:
                kwargs["who"] = who
            try:
                built[s] = cls(**kwargs)
            except ValueError as exc:
                raise ValueError(f"{PREFIX}: {s}={part}: {exc}") from None
        return Composed(
            name=name or self.describe(),
            order=built["order"],
            placement=built["placement"],
            preemption=built["preempt"],
            admission=built["admission"],
        )


def _typed(slot: str, name: str, raw: Mapping[str, str]) -> tuple[tuple[str, Any], ...]:
    known = PARTS[slot]
    if name not in known:
        raise ValueError(f"{PREFIX}: unknown {slot} {name!r}; known: {', '.join(known)}")
    declared = part_parameters(known[name])
    out = []
    for key, value in raw.items():
        if key not in declared:
            names = ", ".join(declared) or "none"
            raise ValueError(
                f"{PREFIX}: {slot}={name} has no parameter {key!r} (its parameters: {names}; "
                f"a slot is one of {', '.join(SLOTS)})"
            )
        try:
            out.append((key, convert_value(declared[key], value)))
        except ValueError as exc:
            raise ValueError(f"{PREFIX}: {slot}={name}: {key}={value!r}: {exc}") from None
    return tuple(out)
