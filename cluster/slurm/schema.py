"""The generations of Slurm's JSON that linkwise reads, and the value shapes that differ.

Slurm names the schema of its JSON output in ``meta.plugin``: 22.05 prints
``type: "openapi/v0.0.38"`` (``openapi/dbv0.0.38`` for accounting); 23.02 and later print
``data_parser: "data_parser/v0.0.NN"`` (24.11: v0.0.42; 26.05: v0.0.45; slurmrestd serves
v0.0.40-v0.0.42 on 24.11 and v0.0.42-v0.0.45 on 26.05). What changed for the fields read
here, measured on Debian's 24.11.5 and 26.05.5 (``../shared/SLURM_LOCAL.md``):

- numbers became ``{"set": bool, "infinite": bool, "number": N}`` objects (``number``);
- a job's state became a list of its base state and flags (``job_state_text``);
- a node's state became a list, ``state_flags`` went away (``node_state_text``);
- exit codes became ``{status: [...], return_code: {...}, signal: {id: {...}, name}}``.

A document of a generation outside ``SUPPORTED`` is refused with ``SlurmSchemaError``
naming what it saw: its fields may have moved, and guessing would store wrong records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from linkwise.cluster.slurm.errors import SlurmError

LEGACY = "v0.0.38"  # Slurm 22.05 (openapi/v0.0.38 and openapi/dbv0.0.38)
# v0.0.39 was 23.02's only and was never stable; v0.0.40-v0.0.45 cover 23.11-26.05
SUPPORTED = (LEGACY, "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
_VERSION = re.compile(r"v\d+\.\d+\.\d+")

# Slurm's ``job_state_string``: the first flag of this list that a job carries names its
# state (``["PENDING", "REQUEUED"]`` prints REQUEUED, as ``sacct -P`` does); else the base
JOB_STATE_FLAGS = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


class SlurmSchemaError(SlurmError):
    """Slurm printed JSON of a generation (or a shape) this client does not read."""


def generation(doc: Mapping[str, Any], what: str) -> str:
    """The schema generation a document names in ``meta.plugin`` (``"v0.0.42"``).

    A document without ``meta`` (one assembled by a caller) is read as the legacy
    generation; a ``meta`` that names a generation outside ``SUPPORTED`` raises
    ``SlurmSchemaError``.
    """
    meta = doc.get("meta")
    if meta is None:
        return LEGACY
    plugin = meta.get("plugin") if isinstance(meta, Mapping) else None
    if not isinstance(plugin, Mapping):
        raise SlurmSchemaError(f"{what}: Slurm JSON has no meta.plugin (cannot tell its schema)")
    named = str(plugin.get("data_parser") or "") or str(plugin.get("type") or "")
    return check_generation(named, what)


def check_generation(named: str, what: str) -> str:
    """``"data_parser/v0.0.42"``, ``"openapi/dbv0.0.38"`` or ``"v0.0.45"`` -> the version,
    if supported; else ``SlurmSchemaError`` naming it and what is supported."""
    found = _VERSION.search(named)
    version = found.group(0) if found else ""
    if version not in SUPPORTED:
        raise SlurmSchemaError(
            f"{what}: Slurm JSON of schema {named or 'unnamed'!r} is not supported "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    return version


def version_key(version: str) -> tuple[int, ...]:
    """``"v0.0.42"`` -> ``(0, 0, 42)``, for picking the newest."""
    return tuple(int(p) for p in version.lstrip("v").split("."))


def number(value: Any) -> int | float | None:
    """A number as either generation prints it: a plain number, or ``{set, infinite,
    number}`` (unset: ``None``; infinite: ``math.inf``). ``None`` and ``""`` are unset.

    Raises ``ValueError`` for anything else (text that is no integer, a bool, a list).
    """
    if isinstance(value, Mapping):
        if value.get("infinite") is True:
            return math.inf
        if value.get("set") is False:
            return None
        value = value.get("number")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, str):
        return int(value)
    return value


def count(value: Any) -> int:
    """A finite count (unset is 0); ``ValueError`` for infinite or unreadable values."""
    v = number(value)
    if v is None:
        return 0
    if isinstance(v, float):
        if not v.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        v = int(v)
    return v


def job_state_text(value: Any) -> str:
    """A job's state as one word, as Slurm's ``job_state_string`` prints it: text stays as
    it is (its first word); a list ``[base, flags...]`` gives the first flag of
    ``JOB_STATE_FLAGS`` it carries, else its base state. Empty: ``""``.

    Raises ``ValueError`` for a value that is neither text nor a list of text.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value.split(" ")[0]
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError("state is neither text nor a list of text")
    names = [v.upper() for v in value]
    for flag in JOB_STATE_FLAGS:
        if flag in names:
            return flag
    base = [n for n in names if n in JOB_BASE_STATES]
    return base[0] if base else (names[0] if names else "")


def node_state_text(state: Any, flags: Any = None) -> str:
    """A node's state as ``BASE+FLAG+...`` (upper case): 22.05's text ``state`` with its
    ``state_flags``, or the newer list (``["IDLE", "DRAIN"]`` -> ``IDLE+DRAIN``)."""
    if isinstance(state, list):
        words = [str(s).upper() for s in state if str(s)]
    else:
        words = [str(state or "UNKNOWN").upper()]
    words += [str(f).upper() for f in flags or []]
    return "+".join(words) if words else "UNKNOWN"


def exit_status(raw: Any) -> tuple[str, int | None, int | None]:
    """``(status, return code, signal)`` of an ``exit_code`` object of either generation:
    22.05 ``{status: "SIGNALED", return_code: 0, signal: {signal_id: 9}}``, later
    ``{status: ["SIGNALED"], return_code: {...}, signal: {id: {...}, name}}``."""
    if not isinstance(raw, Mapping):
        raise ValueError("exit_code is not an object")
    status = raw.get("status")
    if isinstance(status, list):
        status = status[0] if status else ""
    signal = raw.get("signal")
    sig: int | None = None
    if isinstance(signal, Mapping):
        sig_value = signal.get("id") if "id" in signal else signal.get("signal_id")
        n = number(sig_value)
        sig = int(n) if n is not None and math.isfinite(n) and n else None
    code = number(raw.get("return_code"))
    return str(status or ""), (None if code is None else int(code)), sig


def text_list(value: Any) -> str:
    """A field that is text in 22.05 and a list of words later (``shared``): one text."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value or "")
