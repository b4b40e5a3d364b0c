"""What the command groups share: exit codes, the help formatter, the options several
commands define alike, and the small readers of option text.

A helper exists only for an option at least two commands define with the same help; an
option whose help differs from one command to the next stays in its command's module, so
every ``--help`` reads as before.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_REFUSED = 0, 1, 2, 3
TRACE_FORMATS = ("auto", "native", "philly", "helios", "alibaba", "swf")
MLFLOW_URI_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite in linkwise-out)"
SHIPPED_CALIBRATION_HELP = "calibration JSON (default: shipped)"
STORE_CALIBRATION_HELP = (
    "calibration JSON (default: the newest one `linkwise calibrate --db` logged in MLflow for "
    "the store's cluster, else the shipped one)"
)


def shown_default(action: argparse.Action) -> str | None:
    """An option's default as ``--help`` shows it, or None where there is nothing to show
    (no default, a flag, an empty value, a positional argument)."""
    value = action.default
    if not action.option_strings or value is None or value is argparse.SUPPRESS:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, tuple | list):
        value = ",".join(str(v) for v in value)
    text = str(value)
    return text or None


def states_default(help_text: str, shown: str) -> bool:
    """Whether an option's own help already says its default (``(default ...)``,
    ``... (4)``)."""
    return "default" in help_text.lower() or f"({shown})" in help_text


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default after its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = shown_default(action)
        if shown is None or states_default(text, shown):
            return action.help
        return f"{text} (default: {shown.replace('%', '%%')})"


def add_command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand's parser in ``sub`` (an ``add_subparsers()`` object), its defaults shown
    (``HelpFormatter``) unless ``formatter_class`` says otherwise."""
    kwargs.setdefault("formatter_class", HelpFormatter)
    parser: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    return parser


def add_json(p: argparse.ArgumentParser, help: str = "print machine-readable JSON only") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_wide(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wide", action="store_true", help="every column (default: those that fit 120 columns)"
    )


def add_history_format(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--history-format",
        default="auto",
        choices=list(TRACE_FORMATS),
        help="format of a --history trace (default: detect)",
    )


def add_restart_cost(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--restart-cost",
        default="sia",
        metavar="sia|0|SECONDS",
        help="what a preemption or migration costs: sia (default: Sia's measured checkpoint "
        "plus restore seconds per profile), 0 (free preemption) or seconds for every job",
    )


def add_executor(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--executor",
        default="local",
        help="serial, local[:N] (a process pool of N workers; no N: one per CPU), "
        "threads[:N], dask (a temporary local cluster) or dask://HOST:PORT; Prefect task "
        "runs only when PREFECT_API_URL names a Prefect server (none is started)",
    )


def add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=float, default=6 * 3600.0, help="window length, seconds")


def add_lock_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock-wait",
        type=float,
        default=10.0,
        metavar="S",
        help="wait up to S seconds for a store another process holds (default 10)",
    )


def add_calibration(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, help: str = SHIPPED_CALIBRATION_HELP
) -> None:
    p.add_argument("--calibration", type=Path, help=help)


def add_tracking_uri(p: argparse.ArgumentParser, help: str = MLFLOW_URI_HELP) -> None:
    p.add_argument("--tracking-uri", help=help)


def csv_list(text: str | None, cast: Any = str) -> list[Any] | None:
    """A comma-separated option as a list (``cast`` applied to each item), None when not
    given."""
    if text is None:
        return None
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def default_data_dir() -> Path | None:
    """``$LINKWISE_DATA``, else ``../shared/data`` from the working directory, if it exists."""
    env = os.environ.get("LINKWISE_DATA")
    candidates = [Path(env)] if env else [Path.cwd().parent / "shared" / "data"]
    return next((c for c in candidates if c.is_dir()), None)
