"""``linkwise serve --config FILE`` (issue 24 item 5): the TOML settings validated before the
loop starts (exit 2 naming the key), mutually exclusive with the other options; JSON-line
logs; the systemd unit checked by ``systemd-analyze verify``; a loop run from the shipped
example configuration against the real local Slurm (shadow mode)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.deployer.service_config import (
    ConfigError,
    JsonLineFormatter,
    load_service_config,
    parse_service_config,
)
from linkwise.deployer.systemd import SystemdNotify

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "ops" / "linkwise-serve.example.toml"
UNIT = ROOT / "ops" / "systemd" / "linkwise-serve.service"
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    path = tmp_path / "slurm.env"
    path.write_text("SLURM_CONF=/etc/slurm/slurm.conf\n")
    return path


def require_slurm(env_file: Path) -> None:
    """The shared local Slurm answers (other engineers' jobs may keep its nodes busy)."""
    try:
        SlurmClient.from_env(read_env_file(env_file), "cli").nodes()
    except (OSError, SlurmError) as exc:
        pytest.fail(
            f"local Slurm is not up in {SLURM_DIR} ({exc}): run `scripts/local-slurm start`"
        )


def _example(env_file: Path, **subs: str) -> str:
    """The shipped example, its Slurm env file replaced (and ``subs``: old -> new text)."""
    text = EXAMPLE.read_text().replace("/etc/linkwise/slurm.env", str(env_file))
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_the_shipped_example_is_a_valid_configuration(env_file: Path) -> None:
    cfg = parse_service_config(_example(env_file), "example.toml")
    s = cfg.serve
    assert (s.mode, s.partitions, s.policy.label, s.fallback.label) == (
        "shadow",
        ("gpu",),
        "model:shadow",
        "backfill",
    )
    assert (s.metrics_addr, s.metrics_port) == ("127.0.0.1", 9464)
    assert (s.lease_root, s.max_hold_s, s.interval_s, s.lease_s) == (
        "/var/lib/linkwise/leases",
        900.0,
        2.0,
        30.0,
    )
    assert s.db == "/var/lib/linkwise/linkwise.duckdb" and s.watchdog
    assert (s.migration.budget, s.migration.min_run_s) == (3, 600.0)
    assert cfg.log_format == "json"


def test_a_digest_pins_a_local_package(env_file: Path, tmp_path: Path) -> None:
    digest = "ab" * 32
    text = _example(
        env_file,
        **{
            'source = "model:shadow"': f'source = "model:{tmp_path}/pkg"',
            '# digest = "<64 hex>"': f'digest = "{digest.upper()}"',
        },
    )
    policy = parse_service_config(text).serve.policy
    assert policy.label == f"model:{tmp_path}/pkg#sha256={digest}"
    assert policy.source is not None and policy.source.digest == digest


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("interval_s = 2.0", "intervall_s = 2.0", "loop.intervall_s: unknown key"),
        ("[store]", "[stores]", "stores: unknown key"),
        ("interval_s = 2.0", 'interval_s = "2"', "loop.interval_s: expected a number"),
        ("watchdog = true", "watchdog = 1", "loop.watchdog: expected true or false"),
        ('partitions = ["gpu"]', 'partitions = "gpu"', "partitions: expected a list"),
        ('partitions = ["gpu"]', "partitions = []", "partitions: name at least one"),
        ('partitions = ["gpu"]', 'partitions = ["gpu;rm"]', "partitions: invalid partition"),
        ('mode = "shadow"', 'mode = "live"', "mode: must be one of 'shadow', 'active'"),
        ('mode = "shadow"', "", "mode: missing (required)"),
        ("max_hold_s = 900.0", "max_hold_s = -1", "loop.max_hold_s: must be positive"),
        ("budget = 3", "budget = 2.5", "migration.budget: expected an integer"),
        ("budget = 3", "budget = -1", "migration.budget: must not be negative"),
        ('"127.0.0.1:9464"', '"127.0.0.1:99999"', "metrics.address: must be"),
        ('"127.0.0.1:9464"', '"9464"', "metrics.address: must be"),
        ('format = "json"', 'format = "xml"', "log.format: must be one of"),
        ('transport = "cli"', 'transport = "ssh"', "slurm.transport: must be one of"),
        ('"model:shadow"', '"model:"', "policy.source:"),
        ('"model:shadow"', '"no_such_heuristic"', "policy.source:"),
        ('fallback = "backfill"', 'fallback = "model:champion"', "policy.fallback: must be"),
        ('# digest = "<64 hex>"', 'digest = "abc"', "policy.digest: must be 64 hex digits"),
        ('# digest = "<64 hex>"', f'digest = "{"0" * 64}"', "policy.digest: pins a local"),
        ('mode = "shadow"', 'mode = "active"\n[loop2]', "loop2: unknown key"),
        ("lease_s = 30.0", "lease_s = 3.0", None),  # fine in shadow mode
    ],
)
def test_bad_settings_are_refused_naming_the_key(
    env_file: Path, old: str, new: str, message: str | None
) -> None:
    text = _example(env_file, **{old: new})
    if message is None:
        parse_service_config(text, "serve.toml")
        return
    with pytest.raises(ConfigError) as err:
        parse_service_config(text, "serve.toml")
    assert str(err.value).startswith("serve.toml: ") and message in str(err.value)


def test_active_mode_needs_a_lease_of_two_cycles(env_file: Path) -> None:
    text = _example(env_file, **{'mode = "shadow"': 'mode = "active"', "lease_s = 30.0": ""})
    assert parse_service_config(text).serve.mode == "active"
    short = _example(env_file, **{'mode = "shadow"': 'mode = "active"', "30.0": "3.0"})
    with pytest.raises(ConfigError, match=r"loop\.lease_s: the lease must last at least two"):
        parse_service_config(short)


def test_a_missing_env_file_or_bad_toml_is_refused(env_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"slurm.env_file: no such file"):
        parse_service_config(EXAMPLE.read_text(), "x")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_service_config('mode = "shadow', "x")
    with pytest.raises(ConfigError, match="cannot read"):
        load_service_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=r"x: log: expected a table \[log\], got an integer"):
        parse_service_config('mode = "shadow"\npartitions = ["gpu"]\nlog = 3\n', "x")


def test_serve_exits_2_before_the_loop_on_a_bad_file(
    env_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(_example(env_file, **{"max_hold_s = 900.0": "max_hold = 900.0"}))
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: loop.max_hold: unknown key" in err and "max_hold_s" in err


def test_config_and_other_options_are_mutually_exclusive(
    env_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(_example(env_file))
    assert main(["serve", "--config", str(path), "--mode", "active", "--interval", "5"]) == 2
    err = capsys.readouterr().err
    assert "--mode, --interval" in err and "mutually exclusive" in err
    assert main(["serve", "--mode", "shadow"]) == 2  # no --partition and no --config
    assert "partition" in capsys.readouterr().err


def test_json_log_lines_are_one_object_each() -> None:
    fmt = JsonLineFormatter()
    event = logging.LogRecord("linkwise.serve", logging.WARNING, "", 0, '{"event": "x"}', (), None)
    assert json.loads(fmt.format(event)) == {
        "event": "x",
        "level": "warning",
        "logger": "linkwise.serve",
    }
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        exc = sys.exc_info()
    plain = logging.LogRecord("mlflow", logging.ERROR, "", 0, "a\nb %s", ("c",), exc)
    line = fmt.format(plain)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "a\nb c" and "RuntimeError: boom" in out["exc"]
    assert out["level"] == "error" and out["logger"] == "mlflow"


def test_notifications_reach_an_abstract_socket_and_are_no_ops_outside_systemd() -> None:
    name = f"linkwise-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notify = SystemdNotify.from_env({"NOTIFY_SOCKET": "@" + name})
        assert notify.ready("shadow") and notify.alive()
        assert sock.recv(100) == b"READY=1\nSTATUS=shadow" and sock.recv(100) == b"WATCHDOG=1"
    off = SystemdNotify.from_env({})
    assert not off.enabled and not off.alive()
    assert not SystemdNotify("/nonexistent/notify.sock").alive()  # never raises


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    text = UNIT.read_text()
    prefix = "/opt/linkwise/.venv/bin/linkwise"
    assert f"ExecStart={prefix} serve --config /etc/linkwise/serve.toml" in text
    linkwise = Path(sys.executable).with_name("linkwise")
    assert linkwise.exists()
    # verify checks that ExecStart's program exists: this checkout's, for the install prefix
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(prefix, str(linkwise)))
    run = subprocess.run(
        [str(ROOT / "scripts" / "systemd-verify"), str(unit)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    # and it fails on a unit that is wrong (the check is not vacuous)
    bad = tmp_path / "bad.service"
    bad.write_text(unit.read_text().replace("RestartSec=10", "RestartSec=ten"))
    run = subprocess.run(
        [str(ROOT / "scripts" / "systemd-verify"), str(bad)], capture_output=True, text=True
    )
    assert run.returncode != 0 and "Failed to parse sec value, ignoring: ten" in run.stderr
    keys = ("Restart=on-failure", "RestartPreventExitStatus=2", "KillMode=process", "Type=notify")
    for key in (*keys, "WatchdogSec=120"):
        assert key in text


@pytest.mark.services
def test_serve_runs_from_the_example_file_and_logs_json_lines(tmp_path: Path) -> None:
    env = SLURM_DIR / "env"
    require_slurm(env)
    text = _example(
        env,
        **{
            'source = "model:shadow"': 'source = "backfill"',
            "/var/lib/linkwise/leases": str(tmp_path / "leases"),
            "/var/lib/linkwise/linkwise.duckdb": str(tmp_path / "store.duckdb"),
            "/var/lib/linkwise/serve": str(tmp_path / "state"),
            '"127.0.0.1:9464"': '""',
            "# max_cycles = 10": "max_cycles = 2",
            "interval_s = 2.0": "interval_s = 0.5",
        },
    )
    path = tmp_path / "serve.toml"
    path.write_text(text)
    # systemd's notification socket, as systemd would pass it (Type=notify, WatchdogSec=)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    run = subprocess.run(
        [sys.executable, "-m", "linkwise.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")},
    )
    assert run.returncode == 0, run.stderr
    sock.setblocking(False)
    states = []
    with contextlib.suppress(BlockingIOError):
        while True:
            states.append(sock.recv(4096).decode())
    sock.close()
    assert states[0].startswith("READY=1\nSTATUS=shadow on gpu, run ")
    assert states[-1] == "STOPPING=1"
    assert set(states[1:-1]) == {"WATCHDOG=1"} and len(states) - 2 >= 2  # at least once a cycle
    assert json.loads(run.stdout.strip().splitlines()[-1])["cycles"] == 2
    lines = [json.loads(line) for line in run.stderr.splitlines() if line.strip()]
    assert lines and all(isinstance(x, dict) and "level" in x for x in lines)
    events = [x.get("event") for x in lines]
    # two cycles (the summary counts them): the first one logged, the second only if it saw
    # a change (other work on the shared cluster), an idle one is silent
    logged = [x["cycle"] for x in lines if x.get("event") == "cycle"]
    assert logged in ([1], [1, 2]) and "serve_start" in events and "serve_stop" in events
    start = next(x for x in lines if x.get("event") == "serve_start")
    assert start["mode"] == "shadow" and start["partitions"] == ["gpu"]


def test_text_logging_shows_info_events_whatever_handler_came_first() -> None:
    """A library that configured the root logger first (Prefect does on import: a console
    handler at WARNING) does not swallow serve's INFO events in the text format."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='OTHER %(message)s')\n"
        "from linkwise.deployer.service_config import configure_logging\n"
        "from linkwise.deployer.events import log_event\n"
        "configure_logging('text')\n"
        "log_event(logging.getLogger('linkwise.serve'), 'serve_start', mode='shadow')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["event"] == "serve_start", res.stderr
