"""Issue 32 item 4: the service finds its registry, or says where it looked and stops.

Run from another directory, ``serve --config`` looked ``model:champion`` up in a registry
under that directory, created it empty, fell back to backfill and exited 0. Now the registry
is a setting (``[policy] tracking_uri``, ``serve --tracking-uri``), relative paths of the file
resolve against the file's folder, and a registry or model missing at start is exit 2 with
one line naming where it looked, with no registry created. ``serve --check-config`` checks a
file in one line (the documented ``python -c load_service_config`` printed a traceback), and
``serve --help`` shows the defaults (issue 32 item 8).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from linkwise.cli import build_parser, main
from linkwise.deployer.service_config import load_service_config, resolve_tracking_uri

CONFIG = """
mode = "shadow"
partitions = ["gpu"]

[policy]
source = "{source}"
{registry}

[slurm]
env_file = "slurm.env"

[store]
db = "state/store.duckdb"
state_dir = "state/serve"

[loop]
lease_root = "leases"
"""


def _config(folder: Path, source: str, registry: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slurm.env").write_text("SLURM_CONF=/etc/slurm/slurm.conf\n")
    path = folder / "serve.toml"
    path.write_text(CONFIG.format(source=source, registry=registry))
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory: not the configuration's; no registry in the environment."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return cwd


def test_relative_paths_resolve_against_the_files_folder(tmp_path: Path, elsewhere: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "pkg").mkdir(parents=True)
    path = _config(etc, "model:./pkg", 'tracking_uri = "registry/mlflow.db"')
    s = load_service_config(path).serve
    assert s.policy.label == f"model:{etc / 'pkg'}"
    assert s.tracking_uri == f"sqlite:///{etc / 'registry' / 'mlflow.db'}"
    assert (s.slurm_env, s.db, s.state_dir, s.lease_root) == (
        str(etc / "slurm.env"),
        str(etc / "state" / "store.duckdb"),
        str(etc / "state" / "serve"),
        str(etc / "leases"),
    )


def test_tracking_uris_resolve_only_relative_sqlite_paths(tmp_path: Path) -> None:
    assert resolve_tracking_uri("sqlite:///r.db", tmp_path) == f"sqlite:///{tmp_path / 'r.db'}"
    assert resolve_tracking_uri("sqlite:////abs/r.db", tmp_path) == "sqlite:////abs/r.db"
    assert resolve_tracking_uri("/abs/r.db", tmp_path) == "sqlite:////abs/r.db"
    assert resolve_tracking_uri("http://mlflow:5000", tmp_path) == "http://mlflow:5000"


def test_a_missing_registry_is_an_error_naming_it_and_none_is_created(
    tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    etc = tmp_path / "etc"
    path = _config(etc, "model:champion")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    where = etc / "linkwise-out" / "mlflow" / "mlflow.db"
    assert err == (
        f"linkwise serve: refusing to start: model:champion: no model registry at "
        f"sqlite:///{where} (no such file)"
    )
    assert not list(tmp_path.rglob("mlflow.db"))


def test_without_a_config_the_registry_is_the_option_or_the_current_folder(
    tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--partition", "gpu", "--policy", "model:shadow"]) == 2
    where = elsewhere / "linkwise-out" / "mlflow" / "mlflow.db"
    assert f"no model registry at sqlite:///{where}" in capsys.readouterr().err
    given = tmp_path / "reg" / "mlflow.db"
    code = main(
        ["serve", "--partition", "gpu", "--policy", "model:shadow", "--tracking-uri", str(given)]
    )
    assert code == 2
    assert f"no model registry at sqlite:///{given}" in capsys.readouterr().err
    assert not list(tmp_path.rglob("mlflow.db"))


def test_a_model_missing_from_the_registry_is_an_error(
    tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'reg.db'}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()  # an empty one
    capsys.readouterr()  # MLflow's lines creating it
    code = main(["serve", "--partition", "gpu", "--policy", "model:shadow", "--tracking-uri", uri])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"linkwise serve: refusing to start: models:/linkwise-policy@shadow: not found in the "
        f"registry at {uri}"
    )
    assert "\n" not in err


def test_a_missing_package_folder_is_an_error(
    tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path / "etc", "model:./absent")
    assert main(["serve", "--config", str(path)]) == 2
    assert f"no package folder at {tmp_path / 'etc' / 'absent'}" in capsys.readouterr().err


def test_check_config_answers_in_one_line(
    tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _config(tmp_path / "good", "backfill")
    assert main(["serve", "--config", str(good), "--check-config"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"linkwise serve: {good}: good: shadow on gpu, policy backfill"
    bad = _config(tmp_path / "bad", "backfill")
    bad.write_text(bad.read_text().replace('mode = "shadow"', 'mode = "live"'))
    assert main(["serve", "--config", str(bad), "--check-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"linkwise serve: {bad}: mode: must be one of") and "\n" not in err


def test_serve_help_shows_the_defaults() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["serve"].format_help()  # type: ignore[attr-defined]
    assert "(default: shadow)" in text and "(default: 2.0)" in text
