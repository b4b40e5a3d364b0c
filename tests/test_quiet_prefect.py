"""Issue 32 item 8: the temporary Prefect server of build-dataset/evaluate sends no analytics
(from an offline host it logged ``ERROR ... Failed to send telemetry`` every run), unless the
operator says otherwise."""

from __future__ import annotations

import pytest
from prefect.settings import get_current_settings

from linkwise.datasets.rollouts import EPHEMERAL_STARTUP_S, patient_prefect_server


def test_the_temporary_server_is_started_without_analytics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    with patient_prefect_server():
        settings = get_current_settings()
        # what the server subprocess is started with (prefect.server.api.server)
        env = settings.to_environment_variables(exclude_unset=True)
        assert settings.server.analytics_enabled is False
        assert env["PREFECT_SERVER_ANALYTICS_ENABLED"].lower() == "false"
        assert settings.server.ephemeral.startup_timeout_seconds >= EPHEMERAL_STARTUP_S


def test_an_operators_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "7")
    with patient_prefect_server():
        env = get_current_settings().to_environment_variables(exclude_unset=True)
        assert env.get("PREFECT_SERVER_ANALYTICS_ENABLED", "true").lower() == "true"
        assert env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "7"
