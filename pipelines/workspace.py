"""Where a pipeline run writes (``Workspace``): its folder, the DuckDB store, MLflow's
tracking store, and its console (stderr)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from linkwise.evaluation.columns import MAX_WIDTH
from linkwise.models.registry import mlflow_env

__all__ = ["Workspace", "workspace"]


@dataclass(frozen=True)
class Workspace:
    """Where a run writes: its folder, the DuckDB store, MLflow, and its console (stderr)."""

    out: Path
    db: Path
    uri: str
    console: Console
    wide: bool = False  # every column of the tables (--wide)


def workspace(
    out_dir: str | Path, tracking_uri: str | None, progress: bool, wide: bool = False
) -> Workspace:
    """``out_dir`` (created) with ``linkwise.duckdb`` and, unless ``tracking_uri``, MLflow's
    sqlite store in ``out_dir/mlflow``; a console that is quiet without ``progress``."""
    mlflow_env()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri or f"sqlite:///{out / 'mlflow' / 'mlflow.db'}"
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    # a log file or a pipe gets 120 columns, not 80 (print_table widens it for --wide)
    width = None if sys.stderr.isatty() else MAX_WIDTH
    console = Console(stderr=True, quiet=not progress, width=width)
    return Workspace(out, out / "linkwise.duckdb", uri, console, wide)
