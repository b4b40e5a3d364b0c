"""Issue 32 item 3: SIGINT and SIGTERM end a long command and its workers, promptly.

``evaluate --executor local:2`` kept both pool workers computing for 15 minutes after
SIGINT, and after SIGTERM its main process kept retrying its dead Prefect server. Run as a
program, every command but ``serve`` now runs under a supervisor (``linkwise.supervise``)
that ends the whole process tree on either signal, says so in one line and exits 130/143.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linkwise.supervise import descendants, exit_code

LINKWISE = Path(sys.executable).parent / "linkwise"
PHILLY = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
PHILLY /= "philly_2017-09-04_2017-10-15.csv"


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def _wait_for(proc: subprocess.Popen[str], what: str, enough: int, timeout: float) -> list[int]:
    """The live processes below ``proc`` once ``enough`` of them run ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        tree = descendants(proc.pid)
        found = [p for p in tree if what in _cmdline(p)]
        if len(found) >= enough:
            return tree
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"no {enough} processes running {what!r} after {timeout} s")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_exit_codes_of_wait_statuses() -> None:
    assert exit_code(0) == 0
    assert exit_code(3 << 8) == 3
    assert exit_code(signal.SIGKILL) == 128 + signal.SIGKILL


SLEEPER = """
import subprocess, sys
from linkwise.supervise import supervise
code = supervise("sleeper")
if code is not None:
    sys.exit(code)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.run([sys.executable, "-c", "import time; time.sleep(600)"])
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_supervisor_ends_the_whole_tree_on_a_signal(signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    tree = _wait_for(proc, "time.sleep(600)", 2, 60.0)
    t0 = time.monotonic()
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10.0
    assert proc.returncode == 128 + signum
    name = signal.Signals(signum).name
    assert err.strip().splitlines()[-1] == f"linkwise sleeper: stopped by {name}; 3 processes ended"
    assert all(_gone(p) for p in tree), [(p, _cmdline(p)) for p in tree if not _gone(p)]


def test_a_command_that_ends_by_itself_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "left.pid"
    script = SLEEPER.replace(
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])\n',
        'left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])\n'
        f"open({str(pid_file)!r}, 'w').write(str(left.pid))\n",
    ).replace('subprocess.run([sys.executable, "-c", "import time; time.sleep(600)"])\n', "")
    proc = subprocess.Popen([sys.executable, "-c", script + "sys.exit(4)\n"])
    assert proc.wait(timeout=30) == 4
    assert _gone(int(pid_file.read_text()))


@pytest.mark.skipif(not PHILLY.exists(), reason="needs ../shared/data's Philly trace")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_evaluate_on_a_process_pool_stops_with_its_workers(signum: int, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true",
    }
    env.pop("PREFECT_API_URL", None)
    args = ["evaluate", "--trace", str(PHILLY), "--cluster", "4x8", "--window", "86400"]
    args += ["--n-windows", "6", "--seeds", "0,1,2", "--policies", "backfill,tiresias_las,fifo"]
    args += ["--executor", "local:2", "--no-log", "--out", str(tmp_path / "ev")]
    proc = subprocess.Popen(
        [str(LINKWISE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    tree = _wait_for(proc, "multiprocessing.spawn", 2, 240.0)  # both pool workers run
    t0 = time.monotonic()
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signum, err[-2000:]
    assert took < 15.0
    name = signal.Signals(signum).name
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"linkwise evaluate: stopped by {name}; \d+ processes ended", last), last
    assert all(_gone(p) for p in tree), [(p, _cmdline(p)) for p in tree if not _gone(p)]
