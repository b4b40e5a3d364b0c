"""The loop's structured log lines (``log_event``) and how an error reads in them
(``error_text``: a full disk named as such)."""

from __future__ import annotations

import errno
import json
import logging
import time
from typing import Any


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured log line: a JSON object with ``event``, ``ts`` and ``fields``."""
    if logger.isEnabledFor(level):
        line = {"ts": round(time.time(), 3), "event": event, **fields}
        logger.log(level, json.dumps(line, default=str, sort_keys=False))


def error_text(exc: BaseException, limit: int = 300) -> str:
    """An error's message for the logs, naming ENOSPC where a full disk is the cause (DuckDB
    reports it as an I/O error; an ``OSError`` carries its errno)."""
    text = " ".join([str(exc), *getattr(exc, "__notes__", ())])
    full = getattr(exc, "errno", None) == errno.ENOSPC or "no space left" in text.lower()
    if full and "ENOSPC" not in text:
        text = f"ENOSPC (disk full): {text}"
    return text[:limit]
