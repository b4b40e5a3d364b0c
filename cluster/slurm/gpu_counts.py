"""GPU counts in Slurm's TRES lists and strings and in node GRES strings, and a count split
over nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?=,|$)")


def tres_gpus(tres: Sequence[Mapping[str, Any]]) -> int:
    """GPUs in an accounting TRES list (entries with type ``gres`` and name ``gpu``)."""
    total = 0
    for item in tres:
        if item.get("type") == "gres" and item.get("name") == "gpu":
            count = item.get("count") or 0
            if isinstance(count, float) and count.is_integer():  # orjson: ints past 64 bits
                count = int(count)
            if isinstance(count, bool) or not isinstance(count, int):
                raise ValueError(f"GPU count {count!r} is not an integer")
            total += count
    return total


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split over ``parts`` as evenly as possible, the remainder on the first."""
    if parts <= 0:
        return ()
    base, rest = divmod(total, parts)
    return tuple(base + (1 if i < rest else 0) for i in range(parts))


def tres_str_gpus(text: str) -> int:
    """GPUs in a TRES string such as ``cpu=2,node=2,gres/gpu=4`` (0 if absent)."""
    m = _GPU_TRES.search(text or "")
    return int(m.group(1)) if m else 0


def gres_gpus(text: str) -> int:
    """GPUs in a node's gres string: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:2(IDX:0-1)``."""
    total = 0
    for item in _split_gres(text or ""):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def _split_gres(text: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [i.strip() for i in items if i.strip() and i.strip() != "(null)"]
