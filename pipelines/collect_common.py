"""What the accounting and telemetry collections share: the logger they take, how long they
wait for a store another process holds, and the error that carries what was committed."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

__all__ = ["DEFAULT_LOCK_WAIT_S", "CollectError", "Log"]

DEFAULT_LOCK_WAIT_S = 10.0
"""How long a collection waits for a store another process holds before it gives up."""

R = TypeVar("R")


class Log(Protocol):
    """The part of a logger the collectors use (a ``logging.Logger`` or Prefect's)."""

    def info(self, msg: str, /, *args: Any) -> None: ...
    def warning(self, msg: str, /, *args: Any) -> None: ...


class CollectError(RuntimeError, Generic[R]):
    """A collection stopped part-way; ``report`` holds what was committed before it (an
    ``AccountingReport`` or a ``TelemetryCollectReport``)."""

    def __init__(self, message: str, report: R) -> None:
        super().__init__(message)
        self.report = report
