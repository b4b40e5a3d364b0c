"""Slurm's JSON documents (sacct/squeue/sinfo/scontrol/slurmrestd): decoding, the errors
Slurm reports in them, their record lists and the value readers every record kind
shares.

Pure functions, shared by both transports so that they produce identical records from
every supported generation of Slurm's JSON (``schema.SUPPORTED``: 22.05's v0.0.38 and
23.11-26.05's v0.0.40-v0.0.45; ``schema`` reads the value shapes that differ). A
document of another generation raises ``SlurmSchemaError``. One module per record
kind reads them: ``accounting``, ``queue``, ``nodes``, ``partitions``; ``gpu_counts``
counts GPUs in TRES and GRES strings.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson

from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.schema import SlurmSchemaError, count, number

_NO_VAL = 0xFFFFFFFE  # 32-bit NO_VAL/INFINITE and above mean "no limit"


def decode_json(text: str | bytes, what: str = "Slurm") -> Any:
    """Decode JSON text with orjson (the same values as ``json.loads`` for Slurm's output).

    Raises ``SlurmError`` (chained to the decode error) on malformed text.
    """
    try:
        return orjson.loads(text)
    except json.JSONDecodeError as exc:  # orjson.JSONDecodeError subclasses it
        try:  # what orjson refuses but Python reads (NaN, lone surrogates): records decide
            return json.loads(text)
        except ValueError:
            raise SlurmError(f"{what}: output is not JSON: {exc}") from exc


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (restored after; nestable).

    Decoded JSON is acyclic trees of fresh containers, which the collector would scan over
    and over while they are built.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# what reading one record of Slurm's JSON may raise when its shape is not the one expected
UNREADABLE = (KeyError, TypeError, ValueError, OverflowError)


def unreadable_record(what: str, record: Any, key: str, exc: Exception) -> SlurmSchemaError:
    """``SlurmSchemaError`` naming the record (by ``key``) and what could not be read."""
    name = record.get(key) if isinstance(record, Mapping) else None
    return SlurmSchemaError(
        f"{what} {str(name)[:40]}: unreadable record ({type(exc).__name__}: {str(exc)[:200]})"
    )


def raise_errors(doc: Mapping[str, Any], what: str) -> None:
    errors = doc.get("errors") or []
    if errors:
        texts = [str(e.get("error") or e.get("description") or e) for e in errors]
        raise SlurmError(f"{what}: Slurm reported errors: {'; '.join(texts)[:500]}")


def record_list(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise SlurmError(f"Slurm JSON has no {key!r} list")
    return value


def int_or_zero(value: Any) -> int:
    """A count of either generation (unset: 0)."""
    return count(value)


def epoch_or_none(value: Any) -> float | None:
    v = int_or_zero(value)
    return float(v) if v > 0 else None


def limit_seconds(value: Any) -> float | None:
    """A time limit in minutes -> seconds; unset, infinite, NO_VAL or INFINITE -> None."""
    if value is None or isinstance(value, bool):
        return None
    v = number(value)
    if v is None or v == math.inf:
        return None
    v = int(v)
    return None if v < 0 or v >= _NO_VAL else float(v * 60)
