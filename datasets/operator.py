"""Where the operator's pipeline keeps its store by default (issue 32): every command that
reads the cluster's history (``build-dataset``, ``train --db``, ``evaluate``,
``shadow-report``, ``promote --stage champion``) defaults to the store that ``prefect.yaml``'s
collection and ``linkwise serve`` write, ``linkwise-out/linkwise.duckdb`` under the folder it
runs in, never to the demo's."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

__all__ = ["DEFAULT_STORE", "operator_store", "parse_time"]

DEFAULT_STORE = "linkwise-out/linkwise.duckdb"


def operator_store(db: str | Path | None, *others: object) -> Path | None:
    """The store a command reads: ``db`` when given; None when another workload is given
    (``others``, e.g. a trace); else the operator's store ``DEFAULT_STORE``, which must exist
    (FileNotFoundError saying how to make one)."""
    if db is not None:
        return Path(db)
    if any(o is not None for o in others):
        return None
    path = Path(DEFAULT_STORE)
    if not path.is_file():
        raise FileNotFoundError(
            f"no store at {path.resolve()} (the default): collect the cluster's accounting "
            f"into it first (`linkwise collect accounting --db {DEFAULT_STORE} --slurm-env "
            "ENV`), or name one with --db"
        )
    return path


def parse_time(text: str | None, flag: str) -> float | None:
    """A command's time argument (``--since``/``--until``): epoch seconds or ISO 8601 (local
    time unless it has an offset); None for None; ValueError naming ``flag`` otherwise."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is neither ISO 8601 nor epoch seconds") from None
