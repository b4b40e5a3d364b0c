"""The one place tasks run in parallel (``linkwise.parallel``, issue 32 item 8): executor
strings, results in task order, Prefect task runs only where a Prefect API is there to record
them, and process-pool workers that never outlive their caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linkwise.parallel import Executor, map_tasks, task_runner
from linkwise.supervise import descendants


def test_executor_strings() -> None:
    assert Executor.parse("serial") == Executor("serial")
    assert Executor.parse("local") == Executor("local")
    assert Executor.parse("local:2") == Executor("local", 2)
    assert Executor.parse("threads:3") == Executor("threads", 3)
    assert Executor.parse("dask") == Executor("dask")
    assert Executor.parse("dask://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    assert Executor.parse("dask://tls://h:1").address == "tls://h:1"
    assert Executor.parse("tcp://h:1").address == "tcp://h:1"
    for bad in ("pool", "mpi", "dask:x", "dask://", "local:0", "local:two", "threads:-1"):
        with pytest.raises(ValueError, match="executor"):
            Executor.parse(bad)
    with pytest.raises(ValueError, match="batch"):
        map_tasks(str, [1], "serial", batch=0)


def test_executors_select_task_runners() -> None:
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    local = task_runner(Executor.parse("local:2"))
    assert isinstance(local, ProcessPoolTaskRunner) and local._max_workers == 2
    assert isinstance(task_runner(Executor.parse("threads")), ThreadPoolTaskRunner)
    dask = task_runner(Executor.parse("dask://10.0.0.5:8786"))
    assert isinstance(dask, DaskTaskRunner) and dask.address == "tcp://10.0.0.5:8786"
    with pytest.raises(ValueError, match="serial"):
        task_runner(Executor.parse("serial"))


def test_results_come_back_in_task_order_batched_or_not() -> None:
    seen: list[int] = []
    out = map_tasks(abs, [-3, 1, -2, 5, -4], "threads:2", batch=2, on_result=seen.append)
    assert out == seen == [3, 1, 2, 5, 4]
    assert map_tasks(abs, [-1, -2], "serial") == [1, 2]
    assert map_tasks(abs, [], "local:2") == []


def _in_task_run(x: int) -> tuple[int, bool]:
    from prefect.context import TaskRunContext

    return x, TaskRunContext.get() is not None


def test_inside_a_flow_run_the_tasks_are_prefect_task_runs(prefect_harness: None) -> None:
    """The deployments' path: inside a flow run (here with the suite's Prefect API), the
    tasks run as task runs of their own flow, and show in the UI."""
    from prefect import flow

    @flow(name="outer")
    def outer() -> list[tuple[int, bool]]:
        return map_tasks(_in_task_run, [1, 2, 3], "threads:2", name="probe")

    assert outer() == [(1, True), (2, True), (3, True)]
    assert map_tasks(_in_task_run, [1, 2], "serial") == [(1, False), (2, False)]


# a caller that maps two 10-minute sleeps over a 2-worker process pool, with no Prefect API
SLEEPERS = """
import time
from linkwise.parallel import map_tasks
map_tasks(time.sleep, [600, 600], "local:2")
"""


def _plain_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {"PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "true"}


def _workers(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None
        found = [p for p in descendants(proc.pid) if "multiprocessing.spawn" in _cmdline(p)]
        if len(found) >= 2:
            return found
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the pool's two workers never started")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any("multiprocessing.spawn" in _cmdline(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _kill_left(workers: list[int]) -> None:
    """A failed test leaves no 10-minute sleeper behind (only pool workers, by command line)."""
    for pid in workers:
        if "multiprocessing.spawn" in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def test_pool_workers_die_with_a_caller_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves no handler to run: the kernel ends the workers (their parent-death
    signal), where before they slept on, orphans, for the length of their task."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPERS], env=_plain_env(tmp_path))
    workers = _workers(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    try:
        assert _gone(workers, 10.0), [(p, _cmdline(p)) for p in workers]
    finally:
        _kill_left(workers)


def test_an_interrupted_caller_ends_its_workers_at_once(tmp_path: Path) -> None:
    """SIGINT to the caller alone (no supervisor, no process group): KeyboardInterrupt
    terminates the workers instead of waiting for their running tasks."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPERS], env=_plain_env(tmp_path), stderr=subprocess.PIPE
    )
    workers = _workers(proc)
    os.kill(proc.pid, signal.SIGINT)
    try:
        # before: shutdown waited for both sleeps (10 minutes)
        assert _gone(workers, 20.0), [(p, _cmdline(p)) for p in workers]
        # the caller then exits (its interpreter's shutdown may be slow on a starved machine)
        _, err = proc.communicate(timeout=120)
        assert b"KeyboardInterrupt" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_left(workers)
