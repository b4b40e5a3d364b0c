"""Parsing a heuristic's spec ``NAME[:key=value,...]``: its declared parameters (the
dataclass fields of ``POLICIES[NAME]``) and each value by its declared type
(``cluster.compose.spec.convert_value``). The one parser of heuristic parameters, below
``models.policy_spec`` (which adds compositions, search policies and learned packages) so
that ``datasets`` can parse behaviour specs without importing ``models``."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from linkwise.cluster.compose.spec import convert_value

__all__ = ["heuristic_parameters", "parse_heuristic"]


def heuristic_parameters(name: str) -> dict[str, Any]:
    """The declared parameters (name -> type hint) of the heuristic ``name``."""
    from linkwise.cluster.heuristics import POLICIES  # the registry imports this module's users

    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    if not isinstance(factory, type) or not dataclasses.is_dataclass(factory):
        raise TypeError(f"heuristic {name!r} is not a dataclass: its parameters are unknown")
    hints = typing.get_type_hints(factory)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(factory)
        if f.init and f.name not in ("name", "model") and not f.name.startswith("_")
    }


def parse_heuristic(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
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
