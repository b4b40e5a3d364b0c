"""Slurm through its commands: ``sacct/squeue/sinfo --json`` and ``scontrol``.

Every command runs from an argument list (never a shell string) with a timeout, in an
environment that carries ``SLURM_CONF`` when one is given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from linkwise.cluster.slurm.accounting import ACCT_LINE_FIELDS, parse_sacct_output
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.nodes import parse_nodes
from linkwise.cluster.slurm.partitions import parse_scontrol_partitions
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import (
    AccountingBatch,
    JobRun,
    NodeInfo,
    PartitionInfo,
    QueuedJob,
    RejectedRecord,
)

DEFAULT_TIMEOUT_S = 30.0
ID_CHUNK = 500  # job ids per ``sacct -j`` call
_UNAVAILABLE_HINTS = (
    "unable to contact slurm controller",
    "connection refused",
    "unable to connect",
    "slurmdbd: ",
    "communications connection failure",
    "socket timed out",
    "munge encode failed",
    "connection to slurmdbd",
)


class CommandRunner:
    """Runs Slurm commands with a timeout and ``SLURM_CONF``; raises ``SlurmError``s.

    ``bin_dir`` (the env file's ``LINKWISE_SLURM_BIN``) is a folder of Slurm's commands that
    comes before ``PATH``: ``scripts/local-slurm`` puts wrappers there that run a Slurm of
    another version in its chroot. Commands it does not hold are looked up on ``PATH``.
    """

    def __init__(
        self,
        slurm_conf: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        bin_dir: str | None = None,
    ) -> None:
        self.slurm_conf = slurm_conf
        self.timeout = timeout
        self.bin_dir = bin_dir or None
        self._last_stderr = ""

    def __repr__(self) -> str:
        return (
            f"CommandRunner(slurm_conf={self.slurm_conf!r}, timeout={self.timeout}, "
            f"bin_dir={self.bin_dir!r})"
        )

    def program(self, name: str) -> str:
        """The path a command runs from: ``bin_dir/name`` when that exists, else ``name``."""
        if self.bin_dir and "/" not in name:
            candidate = os.path.join(self.bin_dir, name)
            if os.access(candidate, os.X_OK):
                return candidate
        return name

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment commands run with."""
        env = dict(os.environ)
        env.pop("SLURM_TIME_FORMAT", None)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(extra or {})
        return env

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        secret_output: bool = False,
    ) -> str:
        """Run ``args`` and return its stdout (UTF-8, undecodable bytes as U+FFFD: names are
        user-controlled); raise on failure or timeout.

        ``secret_output`` keeps stdout out of error messages (``scontrol token``).
        """
        argv = [str(a) for a in args]
        name = _describe(argv)
        argv[0] = self.program(argv[0])
        limit = self.timeout if timeout is None else timeout
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                timeout=limit,
                env=self.env(extra_env),
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmTimeout(f"{name}: no answer within {limit:g} s") from exc
        except FileNotFoundError as exc:
            raise SlurmUnavailable(f"{name}: command {argv[0]!r} not found") from exc
        except OSError as exc:
            raise SlurmError(f"{name}: cannot run: {exc}") from exc
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        if proc.returncode != 0:
            detail = stderr or ("" if secret_output else proc.stdout.decode("utf-8", "replace"))
            detail = " | ".join(detail.strip().splitlines()[:5])[:600]
            lowered = detail.lower()
            cls = SlurmUnavailable if any(h in lowered for h in _UNAVAILABLE_HINTS) else SlurmError
            raise cls(f"{name}: exit status {proc.returncode}: {detail or 'no message'}")
        self._last_stderr = stderr
        return proc.stdout.decode("utf-8", "replace")

    def run_json(self, args: Sequence[str], *, timeout: float | None = None) -> dict[str, Any]:
        """Run a ``--json`` command and decode its output."""
        out = self.run(args, timeout=timeout)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{_describe(list(args))}: output is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise SlurmError(f"{_describe(list(args))}: JSON output is not an object")
        return self.check_json(args, doc)

    def check_json(self, args: Sequence[str], doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` (a command's decoded JSON) unless it reports errors: then raise."""
        errors = doc.get("errors") or []
        if errors:
            texts = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)
            detail = f"{texts} {self._last_stderr}".strip()[:600]
            cls = SlurmUnavailable if not self._controller_up() else SlurmError
            if any(h in detail.lower() for h in _UNAVAILABLE_HINTS):
                cls = SlurmUnavailable
            raise cls(f"{_describe(list(args))}: Slurm reported errors: {detail}")
        return doc

    def _controller_up(self) -> bool:
        try:
            return "is UP" in self.run(["scontrol", "ping"], timeout=min(self.timeout, 10))
        except SlurmError:
            return False


def _describe(argv: Sequence[str]) -> str:
    """A short, secret-free name of a command for messages (the program and its options)."""
    shown = [a if len(a) <= 60 else a[:57] + "..." for a in argv[:6]]
    return " ".join(shown) + (" ..." if len(argv) > 6 else "")


def slurm_time(epoch: float) -> str:
    """Epoch seconds as Slurm's local ``YYYY-MM-DDTHH:MM:SS``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    """``items`` in consecutive lists of at most ``size``."""
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


_RELEASE = re.compile(r"slurm[- ](?:wlm )?(\d+)\.(\d+)")
SCONTROL_JSON_SINCE = (23, 2)  # ``scontrol --json`` exists from Slurm 23.02


def parse_release(text: str) -> tuple[int, int]:
    """``"slurm 24.11.5"`` (``scontrol --version``) -> ``(24, 11)``."""
    m = _RELEASE.search(text.strip().lower())
    if not m:
        raise SlurmError(f"scontrol --version: unexpected output {text.strip()[:80]!r}")
    return int(m.group(1)), int(m.group(2))


class CliTransport:
    """Reads accounting, queue, nodes and partitions through the commands' JSON output.

    Per-node records come from ``sinfo --json`` on 22.05 and ``scontrol --json show nodes``
    from 23.02 (whose ``sinfo --json`` groups nodes): the release is asked once
    (``scontrol --version``) and kept.
    """

    name = "cli"

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner
        self._release: tuple[int, int] | None = None

    def release(self) -> tuple[int, int]:
        """Slurm's (major, minor) release, asked once."""
        if self._release is None:
            self._release = parse_release(self.runner.run(["scontrol", "--version"]))
        return self._release

    def __repr__(self) -> str:
        return f"CliTransport({self.runner!r})"

    def job_ids(self, since: float, until: float | None) -> list[int]:
        """Ids of the jobs with an accounting record in the window, ascending."""
        args = ["sacct", "-a", "-D", "-X", "-P", "-n", "-o", "JobIDRaw", "-S", slurm_time(since)]
        args += ["-E", slurm_time(until) if until is not None else "now"]
        out = self.runner.run(args)
        return sorted({int(x) for x in out.split() if x.isdigit()})

    def jobs(self, since: float, until: float | None = None) -> list[JobRun]:
        """Every run of every job that has an accounting record in ``[since, until]``; a
        record that cannot be read raises ``SlurmError`` (``accounting`` keeps the others)."""
        return self.accounting(since, until).strict()

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        """The runs with an accounting record in ``[since, until]`` and the records rejected."""
        runs: list[JobRun] = []
        rejected: list[RejectedRecord] = []
        for ids in chunks(self.job_ids(since, until), ID_CHUNK):
            id_arg = ",".join(str(i) for i in ids)
            json_args = ["sacct", "-a", "-D", "--json", "-j", id_arg]
            doc_text = self.runner.run(json_args)
            text = self.runner.run(
                ["sacct", "-a", "-D", "-X", "-P", "-n", "-o", ACCT_LINE_FIELDS, "-j", id_arg],
                extra_env={"SLURM_TIME_FORMAT": "%s"},
            )
            check = partial(self.runner.check_json, json_args)
            batch = parse_sacct_output(doc_text, text, check=check)
            runs.extend(batch.runs)
            rejected.extend(batch.rejected)
        return AccountingBatch(tuple(runs), tuple(rejected))

    def queue(self) -> list[QueuedJob]:
        """Pending and running jobs (``squeue --json``)."""
        return parse_queue(self.runner.run_json(["squeue", "-a", "--json"]))

    def nodes(self) -> list[NodeInfo]:
        """Nodes (``scontrol --json show nodes``; ``sinfo --json`` before 23.02)."""
        if self.release() >= SCONTROL_JSON_SINCE:
            return parse_nodes(self.runner.run_json(["scontrol", "--json", "show", "nodes"]))
        return parse_nodes(self.runner.run_json(["sinfo", "--json"]))

    def partitions(self) -> list[PartitionInfo]:
        """Partitions (``scontrol -o show partition``)."""
        return parse_scontrol_partitions(self.runner.run(["scontrol", "-o", "show", "partition"]))
