"""The experiments written once (``pipelines.experiment``) and what the demo's entry point
does with them and with third-party chatter; fast, no pipeline run."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from linkwise.cli import build_parser
from linkwise.pipelines.console import quiet_libraries
from linkwise.pipelines.demo import run_demo
from linkwise.pipelines.demo_data import split_time, training_plan
from linkwise.pipelines.experiment import DAILY, EXPERIMENTS, HEADLINE, get_experiment
from linkwise.pipelines.tables import format_ratio


def test_experiments_by_name() -> None:
    assert all(get_experiment(name) is e for name, e in EXPERIMENTS.items())
    assert get_experiment(HEADLINE) is HEADLINE
    known = "known: ci, daily, full, full-multigpu, headline, philly-all, philly-multigpu"
    with pytest.raises(ValueError, match=known):
        get_experiment("nope")


def test_demo_cli_takes_an_experiment_and_the_old_budget_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--experiment", "ci"]).experiment == "ci"
    assert parser.parse_args(["demo", "--budget", "ci"]).experiment == "ci"
    assert parser.parse_args(["demo"]).experiment == "full"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--experiment", "daily"])  # no demo budget


def test_experiments_without_what_the_demo_needs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no training budget"):
        training_plan(DAILY)
    with pytest.raises(ValueError, match="no synthetic workload"):
        run_demo(str(tmp_path), experiment=HEADLINE, progress=False)  # a trace is needed
    with pytest.raises(ValueError, match="no training budget"):
        run_demo(str(tmp_path), experiment=replace(HEADLINE, training=None), trace="x.csv")


def test_split_leaves_the_last_windows_held_out() -> None:
    day = 86400.0
    assert split_time(0.0, 2.5 * day, day, 1) == 2 * day
    assert split_time(0.0, 2.5 * day, day, 5) == day  # at least one training window


def test_ratio_formatting() -> None:
    row = {"policy": "sjf_bco", "avg_ratio": 0.7241, "avg_low": 0.5443, "avg_high": 0.9941}
    assert format_ratio(row, "avg") == "0.724 [0.544, 0.994]"
    assert format_ratio({"policy": "backfill", "avg_ratio": None}, "avg") == "1 (baseline)"
    assert format_ratio({"policy": "fifo", "avg_ratio": None}, "avg") == "-"


def test_quiet_libraries_mutes_mlflow_messages_but_not_its_warnings(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from mlflow.utils.logging_utils import eprint

    mlflow_log = logging.getLogger("mlflow")
    before = (mlflow_log.level, mlflow_log.propagate)
    with quiet_libraries(), caplog.at_level(logging.INFO):
        eprint("Successfully registered model 'x'.")  # type: ignore[no-untyped-call]
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow tables")
        logging.getLogger("mlflow.tracking").warning("a real problem")
    assert "registered" not in capsys.readouterr().err
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("mlflow")]
    assert set(messages) == {"a real problem"}  # (twice where prefect's logging is set up)
    assert (mlflow_log.level, mlflow_log.propagate) == before


TRAIN_PROBE = """
import argparse
import linkwise.cli.train as t

def fake_train(config, **kwargs):  # what train does first that prints: d3rlpy imports gym
    import d3rlpy  # noqa: F401
    raise SystemExit(0)

t.train = fake_train
parser = argparse.ArgumentParser()
t.add_train_parser(parser.add_subparsers(dest="command"))
args = parser.parse_args(["train", "--config", "x.toml"])
t.cmd_train(args)
"""


def test_train_prints_no_gym_banner() -> None:
    """Issue 32 item 8: ``linkwise train`` printed gym's deprecation banner (d3rlpy imports
    gym, whose first import writes it to stderr); a fresh process, as the CLI runs."""
    plain = subprocess.run(
        [sys.executable, "-c", "import d3rlpy"], capture_output=True, text=True, timeout=300
    )
    assert "Gym has been unmaintained" in plain.stderr  # the banner this guards against
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_PROBE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "Gym has been unmaintained" not in out.stderr
