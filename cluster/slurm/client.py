"""``SlurmClient``: one interface over the transports (CLI JSON, slurmrestd, pyslurm).

Reads go through the chosen transport; actions (hold, release, placing a job on nodes,
submitting) always go through ``scontrol``/``sbatch`` with argument lists.

Typical use against the local cluster of ``scripts/local-slurm``::

    client = SlurmClient.from_env_file("/tmp/linkwise-slurm/env", transport="rest")
    runs = client.jobs(since=time.time() - 3600)
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from linkwise.cluster.slurm.cli_transport import DEFAULT_TIMEOUT_S, CliTransport, CommandRunner
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.records import (
    AccountingBatch,
    JobRun,
    NodeInfo,
    PartitionInfo,
    QueuedJob,
)
from linkwise.cluster.slurm.rest_transport import RestTransport, scontrol_token_source

__all__ = [
    "PyslurmTransport",
    "SlurmClient",
    "SlurmError",
    "SlurmTimeout",
    "SlurmUnavailable",
    "Transport",
    "admin_comment_args",
    "parse_show_job",
    "read_env_file",
    "requeue_args",
    "set_nodes_args",
    "signal_args",
]

TransportName = Literal["cli", "rest"]
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class Transport(Protocol):
    """What a transport reads from Slurm."""

    name: str

    def jobs(self, since: float, until: float | None = None) -> list[JobRun]: ...
    def accounting(self, since: float, until: float | None = None) -> AccountingBatch: ...
    def queue(self) -> list[QueuedJob]: ...
    def nodes(self) -> list[NodeInfo]: ...
    def partitions(self) -> list[PartitionInfo]: ...


def read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file such as ``$LINKWISE_SLURM_DIR/env``."""
    out: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


class SlurmClient:
    """Typed reads through one transport, and actions through ``scontrol``/``sbatch``."""

    def __init__(self, transport: Transport, runner: CommandRunner) -> None:
        self.transport = transport
        self.runner = runner

    def __repr__(self) -> str:
        return f"SlurmClient(transport={self.transport!r}, runner={self.runner!r})"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        transport: TransportName = "cli",
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        user: str = "root",
    ) -> SlurmClient:
        """A client from env-file values (``SLURM_CONF``, ``LINKWISE_SLURM_REST_URL``)."""
        runner = CommandRunner(
            env.get("SLURM_CONF"), timeout=timeout, bin_dir=env.get("LINKWISE_SLURM_BIN")
        )
        if transport == "cli":
            return cls(CliTransport(runner), runner)
        if transport == "rest":
            url = env.get("LINKWISE_SLURM_REST_URL")
            if not url:
                raise SlurmError("REST transport: LINKWISE_SLURM_REST_URL is not set")
            source = scontrol_token_source(runner, user)
            return cls(RestTransport(url, user, source, timeout=timeout), runner)
        raise ValueError(f"unknown transport {transport!r} (cli or rest)")

    @classmethod
    def from_env_file(
        cls,
        path: str | os.PathLike[str],
        transport: TransportName = "cli",
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        user: str = "root",
    ) -> SlurmClient:
        """A client from an env file written by ``scripts/local-slurm start``."""
        return cls.from_env(read_env_file(path), transport, timeout=timeout, user=user)

    # ---------------------------------------------------------------- reads

    def jobs(self, since: float, until: float | None = None) -> list[JobRun]:
        """Every run of every job with an accounting record in ``[since, until]``."""
        return self.transport.jobs(since, until)

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        """The runs with an accounting record in ``[since, until]``, and the records that
        could not be read (each with its job id, field and reason)."""
        return self.transport.accounting(since, until)

    def queue(self) -> list[QueuedJob]:
        """Jobs pending or running now."""
        return self.transport.queue()

    def nodes(self) -> list[NodeInfo]:
        """Nodes with their GPUs total and in use."""
        return self.transport.nodes()

    def partitions(self) -> list[PartitionInfo]:
        """Partitions with their nodes."""
        return self.transport.partitions()

    def hostnames(self, expr: str) -> list[str]:
        """``scontrol show hostnames EXPR``: Slurm's own expansion of a hostlist."""
        return self.runner.run(["scontrol", "show", "hostnames", expr]).split()

    # ---------------------------------------------------------------- actions

    def hold(self, job_id: int) -> None:
        """Hold a pending job (``scontrol hold``)."""
        self.runner.run(["scontrol", "hold", str(int(job_id))])

    def release(self, job_id: int) -> None:
        """Release a held job (``scontrol release``)."""
        self.runner.run(["scontrol", "release", str(int(job_id))])

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        """Requeue a job (``scontrol requeue`` or ``requeuehold``)."""
        self.runner.run(requeue_args(job_id, hold=hold))

    def cancel(self, job_id: int) -> None:
        """Cancel a job (``scancel``)."""
        self.runner.run(["scancel", str(int(job_id))])

    def signal(self, job_id: int, signal: str = "USR1", *, batch: bool = True) -> None:
        """Send ``signal`` to a running job: its batch shell only (``scancel --batch
        --signal=USR1``, what ``--signal=B:USR1@GRACE`` jobs trap) or every step."""
        self.runner.run(signal_args(job_id, signal, batch=batch))

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Set a job's AdminComment (administrators only; users cannot change it)."""
        self.runner.run(admin_comment_args(job_id, text))

    def show_job(self, job_id: int) -> dict[str, str]:
        """``scontrol -o show job ID`` as its ``Key=Value`` fields (a value may hold spaces:
        ``Comment``); empty when Slurm no longer knows the job."""
        try:
            out = self.runner.run(["scontrol", "-o", "show", "job", str(int(job_id))])
        except SlurmError as exc:
            if "invalid job id" in str(exc).lower():
                return {}
            raise
        return parse_show_job(out)

    def set_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """Place a pending job on exactly ``nodes`` (ReqNodeList and NumNodes)."""
        self.runner.run(set_nodes_args(job_id, nodes))

    def submit(
        self,
        wrap: str,
        *,
        name: str = "linkwise",
        nodes: int = 1,
        gpus_per_node: int = 0,
        time_limit_min: int | None = None,
        partition: str | None = None,
        comment: str | None = None,
        hold: bool = False,
        output: str = "/dev/null",
        workdir: str = "/tmp",
        extra_args: Sequence[str] = (),
    ) -> int:
        """Submit a batch job running ``wrap`` (``sbatch --wrap``); returns its job id."""
        args = ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={nodes}"]
        args += [f"--output={output}", f"--chdir={workdir}"]
        if gpus_per_node:
            args.append(f"--gres=gpu:{gpus_per_node}")
        if time_limit_min is not None:
            args.append(f"--time={time_limit_min}")
        if partition:
            args.append(f"--partition={partition}")
        if comment is not None:
            args.append(f"--comment={comment}")
        if hold:
            args.append("--hold")
        args += list(extra_args)
        args.append(f"--wrap={wrap}")
        out = self.runner.run(args).strip()
        job = out.split(";")[0]
        if not job.isdigit():
            raise SlurmError(f"sbatch: unexpected output {out[:100]!r}")
        return int(job)


_SIGNAL = re.compile(r"(SIG)?[A-Z0-9]{2,8}\Z")
_SHOW_KEY = re.compile(r"([A-Za-z][A-Za-z0-9:/_]*)=(.*)\Z", re.S)


def requeue_args(job_id: int, *, hold: bool = False) -> list[str]:
    """The argument list of ``SlurmClient.requeue``."""
    return ["scontrol", "requeuehold" if hold else "requeue", str(int(job_id))]


def set_nodes_args(job_id: int, nodes: Sequence[str]) -> list[str]:
    """The argument list of ``SlurmClient.set_nodes`` (ReqNodeList and a matching NumNodes)."""
    if not nodes:
        raise ValueError("set_nodes needs at least one node")
    for node in nodes:
        if not _NODE_NAME.match(node):
            raise ValueError(f"invalid node name {node!r}")
    return [
        "scontrol",
        "update",
        f"JobId={int(job_id)}",
        f"ReqNodeList={','.join(nodes)}",
        f"NumNodes={len(nodes)}",
    ]


def signal_args(job_id: int, signal: str = "USR1", *, batch: bool = True) -> list[str]:
    """The argument list of ``SlurmClient.signal``."""
    if not _SIGNAL.match(signal):
        raise ValueError(f"invalid signal name {signal!r}")
    return ["scancel", *(["--batch"] if batch else []), f"--signal={signal}", str(int(job_id))]


def admin_comment_args(job_id: int, text: str) -> list[str]:
    """The argument list of ``SlurmClient.set_admin_comment``."""
    if any(c in text for c in "\n\r\0"):
        raise ValueError("an admin comment is one line")
    return ["scontrol", "update", f"JobId={int(job_id)}", f"AdminComment={text}"]


def parse_show_job(text: str) -> dict[str, str]:
    """The fields of one ``scontrol -o show job`` line: ``Key=Value`` tokens (a key starts
    with a capital), other tokens continuing the value before them (``Comment=two words``).
    The first occurrence of a key wins: a user's comment cannot override a field."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    fields: dict[str, str] = {}
    key: str | None = None
    for token in line.split(" "):
        m = _SHOW_KEY.match(token)
        if m and m.group(1)[:1].isupper():
            key = None if m.group(1) in fields else m.group(1)
            if key is not None:
                fields[key] = m.group(2)
        elif key is not None:
            fields[key] += " " + token
    return {k: v.strip() for k, v in fields.items()}


class PyslurmTransport:
    """Reads through pyslurm (needs pyslurm matching the installed Slurm, e.g. 25.11).

    It cannot be exercised against Slurm 22.05 (pyslurm refuses other versions), so the
    constructor fails with ``SlurmUnavailable`` when pyslurm is not importable, and the
    reads are not implemented yet: they raise ``SlurmError`` naming the missing piece.
    """

    name = "pyslurm"

    def __init__(self) -> None:
        try:
            self._pyslurm: Any = importlib.import_module("pyslurm")
        except ImportError as exc:
            raise SlurmUnavailable(
                "pyslurm transport: pyslurm is not importable "
                f"({exc}); it needs a pyslurm built for the installed Slurm version "
                "(pyslurm 25.11 needs Slurm 25.11): use the cli or rest transport"
            ) from exc

    def _unsupported(self, what: str) -> SlurmError:
        return SlurmError(f"pyslurm transport: {what} is not implemented; use cli or rest")

    def jobs(self, since: float, until: float | None = None) -> list[JobRun]:
        """Not implemented (see the class docstring)."""
        raise self._unsupported("jobs")

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        """Not implemented (see the class docstring)."""
        raise self._unsupported("accounting")

    def queue(self) -> list[QueuedJob]:
        """Not implemented (see the class docstring)."""
        raise self._unsupported("queue")

    def nodes(self) -> list[NodeInfo]:
        """Not implemented (see the class docstring)."""
        raise self._unsupported("nodes")

    def partitions(self) -> list[PartitionInfo]:
        """Not implemented (see the class docstring)."""
        raise self._unsupported("partitions")
