"""Map a picklable function over tasks on an executor: the one place rollouts
(``datasets.rollouts``), counterfactual labels (``datasets.labels``) and the benchmark
(``evaluation.benchmark``) run in parallel (issue 32 item 8).

An executor is named by a string (``Executor.parse``): ``serial`` (in this process),
``local[:N]`` (a process pool of N workers, default the CPU count), ``threads[:N]``,
``dask`` (a temporary local Dask cluster) or ``dask://HOST:PORT`` (a running scheduler;
``tcp://`` is assumed when no scheme follows, and ``tcp://HOST:PORT`` is accepted as is).

Prefect is used only where it has somewhere to report to (``prefect_tracking``): a Prefect API
is configured (``PREFECT_API_URL``, in the environment or the active Prefect profile) or this
process runs inside a flow run (the deployments of ``pipelines.deployments``). There the tasks
run as task runs of a flow named after them, on the executor's Prefect task runner, and show
in the Prefect UI. Anywhere else they run on plain ``concurrent.futures`` or Dask: Prefect 3
has no server-less mode, and a flow with no API starts a temporary server, in the command and
again in every process-pool worker (15-21 s per ``build-dataset`` or ``evaluate`` at load 7-9,
``benchmarks/README.md``). ``serial`` never uses Prefect.

A process pool uses the spawn context (a forked child of a process whose Polars threads hold
locks hangs), and its workers die with the process that started them: the kernel kills each
one when that process ends, however it ends (``supervise.die_with_parent``), and an exception
or interrupt in the caller terminates them at once instead of waiting for their running
tasks. ``linkwise.supervise`` ends the whole tree of a command on SIGINT/SIGTERM as well.

Results come back in task order, whatever the executor; ``batch`` tasks travel together to a
worker (one Prefect task run each, labelled by its first task).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor as FuturesExecutor
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from linkwise.supervise import die_with_parent

__all__ = [
    "EPHEMERAL_STARTUP_S",
    "Executor",
    "map_tasks",
    "patient_prefect_server",
    "prefect_tracking",
    "task_runner",
]

T = TypeVar("T")
R = TypeVar("R")

Kind = Literal["serial", "local", "threads", "dask"]
USAGE = "serial, local[:N], threads[:N], dask or dask://HOST:PORT"


@dataclass(frozen=True, slots=True)
class Executor:
    """Where tasks run: ``kind``, its ``workers`` (None: the default) and, for Dask, the
    scheduler's ``address`` (None: a temporary local cluster)."""

    kind: Kind
    workers: int | None = None
    address: str | None = None

    @classmethod
    def parse(cls, text: str) -> Executor:
        """The executor a string names (module docstring); ValueError naming the forms."""
        name, _, arg = text.partition(":")
        if text == "serial":
            return cls("serial")
        if name in ("local", "threads"):
            if arg and not (arg.isdigit() and int(arg) > 0):
                raise ValueError(f"executor {text!r}: {name}:N takes a positive worker count")
            return cls("local" if name == "local" else "threads", int(arg) if arg else None)
        if text == "dask":
            return cls("dask")
        if name in ("dask", "tcp") and arg.startswith("//"):
            address = text.removeprefix("dask://")
            address = address if "://" in address else f"tcp://{address}"
            if not address.partition("://")[2]:
                raise ValueError(f"executor {text!r}: use dask://HOST:PORT")
            return cls("dask", address=address)
        raise ValueError(f"unknown executor {text!r}: {USAGE}")


def prefect_tracking() -> bool:
    """Whether task runs have a Prefect API to report to: one is configured (the setting
    ``PREFECT_API_URL``) or this process runs inside a flow run."""
    # imported here: building the command line loads no Prefect (tests/cli/test_cli.py), and a
    # serial run never needs it
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL

    return FlowRunContext.get() is not None or bool(PREFECT_API_URL.value())


def task_runner(executor: Executor) -> Any:
    """The Prefect task runner of a parallel executor."""
    # Prefect and prefect_dask are imported on use (see prefect_tracking)
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

    if executor.kind == "local":
        return ProcessPoolTaskRunner(max_workers=executor.workers)
    if executor.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=executor.workers)
    if executor.kind == "dask":
        # Prefect takes over a second to import: only where a flow or its runner is used
        from prefect_dask.task_runners import DaskTaskRunner

        if executor.address is None:
            return DaskTaskRunner(cluster_kwargs={"dashboard_address": None})
        return DaskTaskRunner(address=executor.address)
    raise ValueError(f"executor {executor.kind!r} has no Prefect task runner")


@dataclass(frozen=True, slots=True)
class _Batch(Generic[T, R]):
    """``fn`` over a batch of tasks, in order (pickles when ``fn`` does)."""

    fn: Callable[[T], R]

    def __call__(self, chunk: Sequence[T]) -> list[R]:
        return [self.fn(t) for t in chunk]


def _run_batch(fn: Callable[[T], R], chunk: Sequence[T], label: str) -> list[R]:
    """A Prefect task run's body (``label`` names the run in the UI)."""
    return _Batch(fn)(chunk)


def map_tasks(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    executor: str | Executor = "serial",
    *,
    batch: int = 1,
    name: str = "tasks",
    label: Callable[[T], str] | None = None,
    on_result: Callable[[R], None] | None = None,
) -> list[R]:
    """``fn`` of every task, in task order, on ``executor`` (module docstring). ``fn`` and the
    tasks must pickle for a process pool or Dask; ``batch`` tasks go to a worker together;
    ``name`` names the Prefect flow and its task runs, ``label`` a task run by its first task;
    ``on_result`` sees each result in order as it is taken."""
    ex = executor if isinstance(executor, Executor) else Executor.parse(executor)
    if batch <= 0:
        raise ValueError("batch must be positive")
    chunks = [tuple(tasks[i : i + batch]) for i in range(0, len(tasks), batch)]
    if not chunks:
        return []
    if ex.kind == "serial":
        parts: Iterator[list[R]] = (_Batch(fn)(c) for c in chunks)
        return _collect(parts, on_result)
    if prefect_tracking():
        labels = [_label(c, i * batch, name, label) for i, c in enumerate(chunks)]
        return _collect(iter(_map_prefect(fn, chunks, labels, ex, name)), on_result)
    if ex.kind == "dask":
        return _map_dask(_Batch(fn), chunks, ex.address, on_result)
    with _pool(ex, len(chunks)) as pool:
        return _collect(pool.map(_Batch(fn), chunks), on_result)


def _label(chunk: Sequence[T], first: int, name: str, label: Callable[[T], str] | None) -> str:
    """A Prefect task run's name: its first task's label (else ``name`` and the task's index),
    and how many more tasks it holds."""
    head = label(chunk[0]) if label is not None else f"{name} {first}"
    return head + (f" (+{len(chunk) - 1})" if len(chunk) > 1 else "")


def _collect(parts: Iterator[list[R]], on_result: Callable[[R], None] | None) -> list[R]:
    out: list[R] = []
    for part in parts:
        for r in part:
            if on_result is not None:
                on_result(r)
            out.append(r)
    return out


@contextmanager
def _pool(ex: Executor, n_chunks: int) -> Iterator[FuturesExecutor]:
    """A thread or spawn process pool of at most ``n_chunks`` workers; on an exception (an
    interrupt included) its process workers are terminated, never waited for."""
    if ex.kind == "threads":
        with ThreadPoolExecutor(max_workers=min(ex.workers or os.cpu_count() or 1, n_chunks)) as t:
            yield t
        return
    pool = ProcessPoolExecutor(
        max_workers=min(ex.workers or os.cpu_count() or 1, n_chunks),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )
    try:
        yield pool
    except BaseException:
        # the workers' processes (Python 3.14's terminate_workers does the same): shutdown
        # alone waits for every running task, minutes for a long simulation
        for process in list((pool._processes or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _map_dask(
    fn: _Batch[T, R],
    chunks: Sequence[Sequence[T]],
    address: str | None,
    on_result: Callable[[R], None] | None,
) -> list[R]:
    # Dask is imported on use: only a Dask executor needs it
    from dask.distributed import Client, LocalCluster

    if address is None:
        with (
            LocalCluster(dashboard_address=None) as cluster,  # type: ignore[no-untyped-call]
            Client(cluster) as client,  # type: ignore[no-untyped-call]
        ):
            futures = client.map(fn, list(chunks), pure=False)
            return _collect((f.result() for f in futures), on_result)
    with Client(address) as client:  # type: ignore[no-untyped-call]
        futures = client.map(fn, list(chunks), pure=False)
        return _collect((f.result() for f in futures), on_result)


def _map_prefect(
    fn: Callable[[T], R],
    chunks: Sequence[Sequence[T]],
    labels: Sequence[str],
    ex: Executor,
    name: str,
) -> list[list[R]]:
    """The chunks as task runs of a flow ``name`` on the executor's task runner. The tasks are
    task-run inputs, not flow parameters: Prefect sends flow-run parameters to its API
    (limited to 512 KB) while task-run inputs only travel to the workers."""
    # Prefect is imported on use (see prefect_tracking)
    from prefect import flow, task, unmapped
    from prefect.cache_policies import NO_CACHE

    # Any: Prefect's Task is generic in _run_batch's own type variables, not in this call's
    run: Any = task(name=name, task_run_name="{label}", cache_policy=NO_CACHE)(_run_batch)

    def body() -> list[list[R]]:
        futures = run.map(fn=unmapped(fn), chunk=list(chunks), label=list(labels))
        return [f.result() for f in futures]

    fl = flow(name=name, task_runner=task_runner(ex), validate_parameters=False)(body)
    with patient_prefect_server():
        out: list[list[R]] = fl()
    return out


EPHEMERAL_STARTUP_S = 120
"""How long a flow waits for Prefect's ephemeral API server to start. Prefect's default, 20
s, is exceeded on a loaded 2-core machine, and a benchmark then fails after its labelling."""


@contextmanager
def patient_prefect_server() -> Iterator[None]:
    """Run flows inside this to give Prefect's ephemeral API server ``EPHEMERAL_STARTUP_S``
    to start, unless the operator set ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``,
    and to keep that temporary server's analytics off unless the operator set
    ``PREFECT_SERVER_ANALYTICS_ENABLED`` (from an offline host it logged ``ERROR ... Failed
    to send telemetry`` at every build-dataset and evaluate; the server takes its settings
    from these). A context, not an environment variable: Prefect reads its settings once,
    at import. Only an explicit flow call starts that server (``pipelines``'
    ``*_flow`` functions, ``linkwise train --prefect``): ``map_tasks`` uses Prefect only
    where an API exists."""
    # Prefect is imported on use (see prefect_tracking)
    from prefect.settings import (
        PREFECT_SERVER_ANALYTICS_ENABLED as ANALYTICS,
    )
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as STARTUP,
    )
    from prefect.settings import temporary_settings

    updates: dict[Any, Any] = {}
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") is None:
        updates[STARTUP] = max(int(STARTUP.value()), EPHEMERAL_STARTUP_S)
    if os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED") is None:
        updates[ANALYTICS] = False
    with temporary_settings(updates):
        yield
