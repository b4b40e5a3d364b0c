"""Fixtures shared by several test files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


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
