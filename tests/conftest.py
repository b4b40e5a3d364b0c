"""Fixtures shared by several test files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Every module with a test marked `services`: the shared local Slurm and Prometheus, or a
# Slurm cluster of the test's own. `make pytest` runs two pytest-xdist workers with
# `--dist loadscope`, and `pytest_xdist_make_scheduler` below makes these modules ONE scope,
# so no two of them ever run at the same time (ports, partitions, the shared queue); every
# other module is a scope of its own (its module fixtures are built once). Collection fails
# when a module with a `services` test is missing here. Each module is named by its path below
# tests/ (tests/project/test_tests_layout.py checks that every one exists).
SERVICES_MODULES = frozenset(
    {
        "cluster/test_slurm_live.py",
        "datasets/test_decisions_live.py",
        "datasets/test_hidden_truth_slurm.py",
        "deployer/test_explain_live.py",
        "deployer/test_job_submit_lua.py",
        "deployer/test_migration_live.py",
        "deployer/test_observation_live.py",
        "deployer/test_request_shape_live.py",
        "deployer/test_serve_constraints_live.py",
        "deployer/test_serve_live.py",
        "deployer/test_service_config.py",
        "deployer/test_topology_live.py",
        "evaluation/test_backfill_live.py",
        "evaluation/test_flexible_live.py",
        "evaluation/test_switches_live.py",
        "models/test_registry.py",
        "ops/test_prometheus_live.py",
        "pipelines/test_collect_flows.py",
        "pipelines/test_collect_live.py",
        "pipelines/test_operator_live.py",
        "pipelines/test_prefect_deploy.py",
    }
)
SERVICES_SCOPE = "services"
TESTS = Path(__file__).resolve().parent


def module_key(path: Path) -> str:
    """A test module as ``SERVICES_MODULES`` names it: its path below tests/."""
    return path.resolve().relative_to(TESTS).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a ``services`` test outside ``SERVICES_MODULES``; in an xdist worker, put the
    services modules first (with ``--no-loadscope-reorder`` their scope starts at once: it is
    the longest one)."""
    unlisted = sorted(
        {module_key(i.path) for i in items if i.get_closest_marker("services")} - SERVICES_MODULES
    )
    if unlisted:
        raise pytest.UsageError(
            f"tests/conftest.py: add {', '.join(unlisted)} to SERVICES_MODULES (they have "
            "`services` tests, which must never run beside another services module)"
        )
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: module_key(item.path) not in SERVICES_MODULES)  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope``: one scope per module, all of ``SERVICES_MODULES`` in one."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndServices(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]  # tests/cluster/test_slurm_live.py
            key = module.removeprefix("tests/")
            return SERVICES_SCOPE if key in SERVICES_MODULES else module

    return ModulesAndServices(config, log)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One temporary Prefect API for the session, hermetic (no ~/.prefect, no analytics)."""
    home = tmp_path_factory.mktemp("prefect-home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "DO_NOT_TRACK", "PREFECT_API_URL")}
    saved |= {k: os.environ.get(k) for k in ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_API_KEY")}
    os.environ.update(
        PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true"
    )
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("PREFECT_API_KEY", None)
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    try:
        # also as settings: prefect may have been imported (and its settings read) already
        with (
            temporary_settings({PREFECT_HOME: home, PREFECT_SERVER_ANALYTICS_ENABLED: False}),
            prefect_test_harness(server_startup_timeout=120),
        ):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
