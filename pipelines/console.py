"""The demo's console: the stage log (headings and timings on stderr), the history replay's
progress bar, the third-party chatter kept out of it, and how result tables are printed
(``print_table``: 120 columns at most by default, everything with ``--wide``)."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from linkwise.evaluation.columns import MAX_WIDTH

__all__ = ["Stages", "history_progress", "print_table", "quiet_libraries"]


class Stages:
    """Stage headings (``3/7 Train ...``) and each stage's time in seconds."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self.n = 0
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()
        self._name = ""

    def begin(self, name: str, what: str) -> None:
        """End the current stage (its time is printed) and start ``name``."""
        self._close()
        self.n += 1
        self._name = name
        self._t = time.perf_counter()
        self.console.rule(f"[bold]{self.n}/{self.total} {what}")

    def _close(self) -> None:
        if self._name:
            self.seconds[self._name] = time.perf_counter() - self._t
            self.console.print(f"[dim]{self._name}: {self.seconds[self._name]:.1f} s[/dim]")
            self._name = ""

    def end(self) -> dict[str, float]:
        """End the last stage; every stage's seconds."""
        self._close()
        return dict(self.seconds)


def history_progress(console: Console, enabled: bool) -> Progress:
    """The progress bar of the history replay (jobs finished of all)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
    )


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Inside: no gym deprecation banner (d3rlpy imports gym, whose first import prints it to
    stderr), no MLflow INFO lines nor its "Registered model ..." messages; MLflow's warnings
    and errors still reach stderr. For an entry point's run (``linkwise demo``)."""
    try:
        with redirect_stderr(io.StringIO()):
            import gym  # noqa: F401  # the banner is printed once, at the first import
    except ImportError:  # pragma: no cover - gym comes with d3rlpy
        pass
    # mlflow is heavy (about 2 s to import): imported here, by the entry point that runs it.
    # MLflow writes its messages and its own log records to one stream; muting it through
    # MLflow's counted switch keeps it muted across MLflow's own nested uses of that switch
    from mlflow.utils.autologging_utils.logging_and_warnings import (
        MlflowEventsAndWarningsBehaviorGlobally,
    )

    mlflow_log = logging.getLogger("mlflow")
    level, propagate = mlflow_log.level, mlflow_log.propagate
    # its records at WARNING and above go to Python's handlers instead of the muted stream
    mlflow_log.setLevel(logging.WARNING)
    mlflow_log.propagate = True
    try:
        with MlflowEventsAndWarningsBehaviorGlobally(  # type: ignore[no-untyped-call]
            disable_event_logs=True, disable_warnings=False, reroute_warnings=False
        ):
            yield
    finally:
        mlflow_log.setLevel(level)
        mlflow_log.propagate = propagate


def print_table(console: Console, table: Any, wide: bool = False) -> None:
    """Print a result table: the default view within ``MAX_WIDTH`` columns (narrower on a
    narrower terminal); ``wide`` at its natural width, however wide the console."""
    if not wide:
        console.print(table, width=MAX_WIDTH)
        return
    natural = Measurement.get(console, console.options.update(width=10_000), table).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width
