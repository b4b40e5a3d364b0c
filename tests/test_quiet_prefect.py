"""Issue 32 item 8: the temporary Prefect server of build-dataset/evaluate sends no analytics
(from an offline host it logged ``ERROR ... Failed to send telemetry`` every run), unless the
operator says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


PROBE = """
from prefect.settings import get_current_settings
from linkwise.datasets.rollouts import patient_prefect_server
with patient_prefect_server():
    env = get_current_settings().to_environment_variables(exclude_unset=True)
    print(env.get("PREFECT_SERVER_ANALYTICS_ENABLED", "true").lower(),
          env.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"))
"""


def test_an_operators_own_setting_is_kept(tmp_path: Path) -> None:
    """With the operator's variables set, a fresh process (as the CLI runs) keeps both: the
    context changes neither (in a process of its own: the suite's Prefect harness holds
    settings of its own in this one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "7",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["true", "7"]
