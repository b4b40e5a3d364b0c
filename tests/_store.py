"""Reading a test's DuckDB store while a process it started may still write it."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb


def read_store(path: str | Path, timeout: float = 120.0) -> duckdb.DuckDBPyConnection:
    """A read-only connection to ``path``, retried while another process holds its lock
    (DuckDB refuses even a reader then: a loop or its watchdog writing a record)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return duckdb.connect(str(path), read_only=True)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
