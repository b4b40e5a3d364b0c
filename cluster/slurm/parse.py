"""Slurm's output (JSON of sacct/squeue/sinfo/scontrol/slurmrestd, ``-P`` text) -> records.

Pure functions, shared by both transports so that they produce identical records from every
supported generation of Slurm's JSON (``schema.SUPPORTED``: 22.05's v0.0.38 and 23.11-26.05's
v0.0.40-v0.0.45; ``schema`` reads the value shapes that differ). A document of another
generation raises ``SlurmSchemaError``. The defects handled here:

- 22.05's accounting JSON's ``exit_code`` is ``SUCCESS/0`` for every normal exit, even a job
  that exited 3 (state FAILED; fixed in later versions): a FAILED record takes its exit code
  from a second source
  (``sacct -P -o ExitCode`` or the controller's raw wait status), else it is ``None``;
- a multi-node job shows only its batch host for a few seconds around start/end: a record
  is ``settled`` only when ``allocation_nodes > 0`` or it never ran (``None assigned``);
- a requeued job has one record per run under the same id: ``run_index`` counts the runs
  before it that ended in a requeue (see ``run_indexes``); later versions print a requeued
  run's state as ``["PENDING", "REQUEUED"]``, which reads REQUEUED (``job_state_text``).

``parse_accounting_json`` is the fast path from ``sacct --json`` text (orjson, with Python's
cyclic garbage collector paused while the ~150 objects a record decodes to are alive: the
collector's passes over them, not the decoding, were most of the time).
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from linkwise.cluster.domain import MAX_JOB_GPUS
from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import (
    AccountingBatch,
    JobRun,
    NodeInfo,
    PartitionInfo,
    QueuedJob,
    RejectedRecord,
)
from linkwise.cluster.slurm.request import read_request
from linkwise.cluster.slurm.schema import (
    LEGACY,
    SlurmSchemaError,
    count,
    exit_status,
    generation,
    job_state_text,
    node_state_text,
    number,
    text_list,
)
from linkwise.cluster.slurm.topology_rules import topology_request

ExitStatus = tuple[int | None, int | None]  # (exit code, signal)
RunKey = tuple[int, int]  # (job id, submit time in epoch seconds): one run of a job

NO_NODES = "None assigned"
_NO_VAL = 0xFFFFFFFE  # 32-bit NO_VAL/INFINITE and above mean "no limit"
# states of a run that ended with the job going back to the queue
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "NODE_FAIL", "PREEMPTED"})
# queue states of jobs that are no longer pending or running
FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?=,|$)")
_MAX_ID = (1 << 63) - 1
_MAX_RAW = 64 * 1024  # characters of a rejected record kept in ``RejectedRecord.raw``


@dataclass(frozen=True, slots=True)
class AcctLine:
    """One line of ``sacct -D -X -P -n -o JobIDRaw,Submit,State,ExitCode`` (epoch times)."""

    job_id: int
    submit_time: int
    state: str
    exit_code: int | None
    signal: int | None


ACCT_LINE_FIELDS = "JobIDRaw,Submit,State,ExitCode"


def parse_acct_lines(text: str) -> list[AcctLine]:
    """Parse ``sacct -P`` lines of ``ACCT_LINE_FIELDS`` run with ``SLURM_TIME_FORMAT=%s``
    (a line whose time or exit code cannot be read is skipped)."""
    lines: list[AcctLine] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        parts = raw.split("|")
        if len(parts) != 4:
            raise SlurmError(f"sacct: unexpected line {raw!r}")
        job, submit, state, exit_pair = parts
        if not job.isdigit():  # a step (123.batch) if -X was not honoured
            continue
        try:
            code, signal = parse_exit_pair(exit_pair)
            submit_time = _int(submit)
        except ValueError:  # only corrects exit codes: the JSON record stands on its own
            continue
        lines.append(AcctLine(int(job), submit_time, state.split(" ")[0], code, signal))
    return lines


def parse_exit_pair(text: str) -> ExitStatus:
    """``"3:0"`` -> ``(3, None)``; ``"0:9"`` -> ``(0, 9)``; empty -> ``(None, None)``."""
    if not text.strip():
        return None, None
    code, _, signal = text.strip().partition(":")
    sig = int(signal) if signal.strip() else 0
    return int(code), (sig or None)


def decode_wait_status(status: int) -> ExitStatus:
    """A raw controller wait status: ``768`` -> ``(3, None)``, ``9`` -> ``(0, 9)``."""
    signal = status & 0x7F
    return (status >> 8) & 0xFF, (signal or None)


def run_indexes(lines: Iterable[tuple[int, int, str]]) -> dict[RunKey, int]:
    """Run index of each ``(job_id, submit_time, state)`` record of a job's history.

    Records of one id are ordered by submit time; a record's index is the number of records
    directly before it that ended in a requeue, so an id reused by an unrelated later job
    starts again at 0.
    """
    by_job: dict[int, list[tuple[int, str]]] = {}
    for job_id, submit, state in lines:
        by_job.setdefault(job_id, []).append((submit, state))
    out: dict[RunKey, int] = {}
    for job_id, records in by_job.items():
        index = 0
        for submit, state in sorted(records):
            out[(job_id, submit)] = index
            index = index + 1 if state in REQUEUE_STATES else 0
    return out


def ctld_exit_codes(doc: Mapping[str, Any]) -> dict[RunKey, ExitStatus]:
    """Exit status of the finished jobs the controller still holds (squeue/REST jobs JSON);
    a job whose id, submit time or status cannot be read is left out."""
    generation(doc, "queue")
    out: dict[RunKey, ExitStatus] = {}
    for job in _list(doc, "jobs"):
        try:  # only corrects exit codes: a job that cannot be read here is left out
            if job_state_text(job.get("job_state")) not in FINISHED_STATES:
                continue
            key = (_as_int(job.get("job_id"), "job_id"), count(job.get("submit_time")))
            raw = job.get("exit_code")
            if isinstance(raw, Mapping):
                status, code, signal = exit_status(raw)
                out[key] = (0, signal) if status == "SIGNALED" else (code, None)
            else:
                out[key] = decode_wait_status(_as_int(raw, "exit_code"))
        except (_BadField, AttributeError, ValueError, TypeError, OverflowError):
            continue
    return out


def parse_accounting_batch(
    doc: Mapping[str, Any],
    exit_codes: Mapping[RunKey, ExitStatus] | None = None,
    run_index: Mapping[RunKey, int] | None = None,
) -> AccountingBatch:
    """Job runs of a ``sacct --json`` / ``/slurmdb/v0.0.38/jobs`` document, record by record:
    a record that cannot become a ``JobRun`` (a field missing, of the wrong type, unparseable
    or impossible) is a ``RejectedRecord`` naming its job id, the field and the reason.

    ``exit_codes`` corrects the exit code of FAILED runs (the 22.05 defect); ``run_index``
    gives each run's index (default 0).
    """
    _raise_errors(doc, "accounting")
    legacy = generation(doc, "accounting") == LEGACY
    codes = exit_codes or {}
    indexes = run_index or {}
    placements: dict[tuple[str, int], tuple[tuple[str, ...], tuple[int, ...]]] = {}
    runs: list[JobRun] = []
    rejected: list[RejectedRecord] = []
    with gc_paused():
        for rec in _list(doc, "jobs"):
            try:
                runs.append(_job_run(rec, codes, indexes, placements, legacy))
            except _BadField as bad:
                rejected.append(_rejected(rec, bad))
    return AccountingBatch(tuple(runs), tuple(rejected))


def parse_accounting(
    doc: Mapping[str, Any],
    exit_codes: Mapping[RunKey, ExitStatus] | None = None,
    run_index: Mapping[RunKey, int] | None = None,
) -> list[JobRun]:
    """Job runs of an accounting document, every record valid: raises ``SlurmError`` naming
    the first bad record's job and field (``parse_accounting_batch`` keeps the rest)."""
    return list(_strict(parse_accounting_batch(doc, exit_codes, run_index)).runs)


def parse_accounting_batch_json(
    text: str | bytes,
    exit_codes: Mapping[RunKey, ExitStatus] | None = None,
    run_index: Mapping[RunKey, int] | None = None,
    check: Callable[[dict[str, Any]], object] | None = None,
) -> AccountingBatch:
    """``parse_accounting_batch`` of ``sacct --json`` output text in one pass.

    Bytes that are not UTF-8 (user-controlled names) become U+FFFD replacement characters.
    The decoded document lives only inside this call, with the garbage collector paused.
    ``check`` sees the decoded document first (to raise on Slurm's ``errors``). Raises
    ``SlurmError`` if the text is not a JSON object.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    with gc_paused():
        doc = decode_json(text, "accounting")
        if not isinstance(doc, dict):
            raise SlurmError("accounting: JSON output is not an object")
        if check is not None:
            check(doc)
        batch = parse_accounting_batch(doc, exit_codes, run_index)
        del doc
    return batch


def parse_accounting_json(
    text: str | bytes,
    exit_codes: Mapping[RunKey, ExitStatus] | None = None,
    run_index: Mapping[RunKey, int] | None = None,
    check: Callable[[dict[str, Any]], object] | None = None,
) -> list[JobRun]:
    """``parse_accounting_batch_json``, every record valid (else ``SlurmError``)."""
    return list(_strict(parse_accounting_batch_json(text, exit_codes, run_index, check)).runs)


def _strict(batch: AccountingBatch) -> AccountingBatch:
    if batch.rejected:
        bad = batch.rejected[0]
        more = f" (and {len(batch.rejected) - 1} more)" if len(batch.rejected) > 1 else ""
        raise SlurmError(f"accounting record of job {bad.job_id}: {bad.reason}{more}")
    return batch


class _BadField(ValueError):
    """A field of an accounting record that cannot be read."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _rejected(rec: object, bad: _BadField) -> RejectedRecord:
    job = rec.get("job_id") if isinstance(rec, Mapping) else None
    try:
        raw = orjson.dumps(rec, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        raw = repr(rec)
    return RejectedRecord(
        job_id=None if job is None else str(job)[:100],
        field=bad.field,
        reason=bad.reason,
        raw=raw[:_MAX_RAW],
    )


def _as_int(value: Any, field: str, *, lo: int = 0, hi: int = _MAX_ID) -> int:
    """An integer field: ints, integral floats and decimal strings; bools and other types
    are refused, as are values outside ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _BadField(field, f"{field} is not an integer")
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (ValueError, OverflowError):
        number = None
    if number is None:
        raise _BadField(field, f"{field} is not an integer")
    if number < lo:
        raise _BadField(field, f"{field} is negative" if lo == 0 else f"{field} is below {lo}")
    if number > hi:
        raise _BadField(field, f"{field} is out of range")
    return number


def _as_text(value: Any, field: str) -> str:
    """A text field; lone surrogates (JSON escapes that are no character) become U+FFFD."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _BadField(field, f"{field} is not text")
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    return value


def _as_map(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise _BadField(field, f"{field} is not an object")
    return value


def decode_json(text: str | bytes, what: str = "Slurm") -> Any:
    """Decode JSON text with orjson (the same values as ``json.loads`` for Slurm's output).

    Raises ``SlurmError`` (chained to the decode error) on malformed text.
    """
    try:
        return orjson.loads(text)
    except json.JSONDecodeError as exc:  # orjson.JSONDecodeError subclasses it
        try:  # what orjson refuses but Python reads (NaN, lone surrogates): records decide
            return json.loads(text)
        except ValueError:
            raise SlurmError(f"{what}: output is not JSON: {exc}") from exc


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (restored after; nestable).

    Decoded JSON is acyclic trees of fresh containers, which the collector would scan over
    and over while they are built.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _job_run(
    rec: Any,
    codes: Mapping[RunKey, ExitStatus],
    indexes: Mapping[RunKey, int],
    placements: dict[tuple[str, int], tuple[tuple[str, ...], tuple[int, ...]]],
    legacy: bool = True,
) -> JobRun:
    """One record as a ``JobRun``; raises ``_BadField`` naming the field that is unreadable.
    ``legacy``: a 22.05 record (its FAILED exit codes need a second source)."""
    if not isinstance(rec, Mapping):
        raise _BadField("record", "record is not an object")
    get = rec.get
    if get("job_id") is None:
        raise _BadField("job_id", "job_id is missing")
    job_id = _as_int(get("job_id"), "job_id", lo=1)
    t = _as_map(get("time"), "time")
    submit = _as_int(t.get("submission") or 0, "time.submission")
    key = (job_id, submit)
    try:
        state = job_state_text(_as_map(get("state"), "state").get("current")) or "UNKNOWN"
    except ValueError as exc:
        raise _BadField("state", "state is neither text nor a list of text") from exc
    node_expr = _as_text(get("nodes"), "nodes")
    gpus = _tres_gpus(_as_map(get("tres"), "tres").get("allocated") or ())
    placement = placements.get((node_expr, gpus))
    if placement is None:  # node lists repeat: expand each (list, gpus) once per batch
        try:
            nodes = tuple(expand(node_expr)) if node_expr and node_expr != NO_NODES else ()
        except ValueError as exc:
            raise _BadField("nodes", f"nodes is not a hostlist: {exc}"[:200]) from exc
        placement = placements[(node_expr, gpus)] = (nodes, even_split(gpus, len(nodes)))
    allocation_nodes = _as_int(get("allocation_nodes") or 0, "allocation_nodes")
    array = _as_map(get("array"), "array")
    array_job = _as_int(array.get("job_id") or 0, "array.job_id")
    try:
        task = number(array.get("task_id"))
    except ValueError as exc:
        raise _BadField("array.task_id", "array.task_id is not an integer") from exc
    try:
        code, signal = _accounting_exit(state, get("exit_code"), codes.get(key), legacy)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise _BadField("exit_code", "exit_code is not readable") from exc
    return JobRun(
        cluster=_as_text(get("cluster"), "cluster"),
        job_id=job_id,
        run_index=indexes.get(key, 0),
        name=_as_text(get("name"), "name"),
        user=_as_text(get("user"), "user"),
        account=_as_text(get("account"), "account"),
        partition=_as_text(get("partition"), "partition"),
        state=state,
        exit_code=code,
        signal=signal,
        submit_time=float(submit),
        start_time=_epoch_field(t.get("start"), "time.start"),
        end_time=_epoch_field(t.get("end"), "time.end"),
        time_limit_s=_limit_field(t.get("limit")),
        nodes=placement[0],
        gpus=gpus,
        gpus_per_node=placement[1],
        allocation_nodes=allocation_nodes,
        settled=allocation_nodes > 0 or node_expr in (NO_NODES, ""),
        array_job_id=array_job or None,
        array_task_id=_as_int(task, "array.task_id") if array_job and task is not None else None,
        comment=_as_text(_as_map(get("comment"), "comment").get("job"), "comment.job"),
    )


def _epoch_field(value: Any, field: str) -> float | None:
    """An accounting time: 0 or absent is unset, a negative one is refused."""
    v = _as_int(value or 0, field)
    return float(v) if v > 0 else None


def _limit_field(value: Any) -> float | None:
    try:
        return _limit_s(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _BadField("time.limit", "time.limit is not an integer") from exc


def _tres_gpus(tres: Any) -> int:
    """``tres_gpus`` of a record's allocated TRES, refusing unreadable or absurd counts."""
    field = "tres.allocated"
    if not isinstance(tres, (list, tuple)) or not all(isinstance(i, Mapping) for i in tres):
        raise _BadField(field, f"{field} is not a list of objects")
    try:
        gpus = tres_gpus(tres)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _BadField(field, f"{field}: GPU count is not an integer") from exc
    if gpus < 0 or gpus > MAX_JOB_GPUS:
        raise _BadField(field, f"{field}: absurd GPU count")
    return gpus


_NOT_ENDED = frozenset({"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING"})


def _accounting_exit(
    state: str, raw: Any, better: ExitStatus | None, legacy: bool = True
) -> ExitStatus:
    if state in _NOT_ENDED:
        return None, None
    code: int | None = None
    signal: int | None = None
    if isinstance(raw, Mapping):
        status, return_code, sig = exit_status(raw)
        if status == "SIGNALED":
            code, signal = 0, sig
        else:
            code = return_code
    if legacy and state == "FAILED" and code == 0 and signal is None:
        # the 22.05 defect: a failed run reported as exit 0
        return better if better is not None and better != (0, None) else (None, None)
    return code, signal


def tres_gpus(tres: Sequence[Mapping[str, Any]]) -> int:
    """GPUs in an accounting TRES list (entries with type ``gres`` and name ``gpu``)."""
    total = 0
    for item in tres:
        if item.get("type") == "gres" and item.get("name") == "gpu":
            count = item.get("count") or 0
            if isinstance(count, float) and count.is_integer():  # orjson: ints past 64 bits
                count = int(count)
            if isinstance(count, bool) or not isinstance(count, int):
                raise ValueError(f"GPU count {count!r} is not an integer")
            total += count
    return total


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split over ``parts`` as evenly as possible, the remainder on the first."""
    if parts <= 0:
        return ()
    base, rest = divmod(total, parts)
    return tuple(base + (1 if i < rest else 0) for i in range(parts))


def tres_str_gpus(text: str) -> int:
    """GPUs in a TRES string such as ``cpu=2,node=2,gres/gpu=4`` (0 if absent)."""
    m = _GPU_TRES.search(text or "")
    return int(m.group(1)) if m else 0


def gres_gpus(text: str) -> int:
    """GPUs in a node's gres string: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:2(IDX:0-1)``."""
    total = 0
    for item in _split_gres(text or ""):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def _split_gres(text: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [i.strip() for i in items if i.strip() and i.strip() != "(null)"]


def parse_queue(doc: Mapping[str, Any]) -> list[QueuedJob]:
    """Pending and running jobs of a ``squeue --json`` / ``/slurm/VERSION/jobs`` document of
    any supported generation. A job record that cannot be read raises ``SlurmSchemaError``
    naming the job and the fault (the live loop treats it as a Slurm-side fault)."""
    _raise_errors(doc, "queue")
    generation(doc, "queue")
    out: list[QueuedJob] = []
    for job in _list(doc, "jobs"):
        try:
            queued = _queued_job(job)
        except _UNREADABLE as exc:
            raise _unreadable("queue: job", job, "job_id", exc) from exc
        if queued is not None:
            out.append(queued)
    return out


# what reading one record of Slurm's JSON may raise when its shape is not the one expected
_UNREADABLE = (KeyError, TypeError, ValueError, OverflowError)


def _unreadable(what: str, record: Any, key: str, exc: Exception) -> SlurmSchemaError:
    """``SlurmSchemaError`` naming the record (by ``key``) and what could not be read."""
    name = record.get(key) if isinstance(record, Mapping) else None
    return SlurmSchemaError(
        f"{what} {str(name)[:40]}: unreadable record ({type(exc).__name__}: {str(exc)[:200]})"
    )


def _queued_job(job: Mapping[str, Any]) -> QueuedJob | None:
    """One queue record as a ``QueuedJob`` (``None`` for a job that has finished)."""
    state = job_state_text(job.get("job_state"))
    if state in FINISHED_STATES:
        return None
    reason = str(job.get("state_reason") or "")
    alloc = str(job.get("tres_alloc_str") or "")
    node_expr = str(job.get("nodes") or "")
    req = str(job.get("required_nodes") or "")
    held = job.get("hold") is True or number(job.get("priority")) == 0
    return QueuedJob(
        job_id=count(job["job_id"]),
        name=str(job.get("name") or ""),
        user=str(job.get("user_name") or ""),
        partition=str(job.get("partition") or ""),
        state=state,
        reason=reason,
        submit_time=float(_int(job.get("submit_time"))),
        start_time=_epoch(job.get("start_time")),
        time_limit_s=_limit_s(job.get("time_limit")),
        num_nodes=_int(job.get("node_count")),
        gpus=tres_str_gpus(alloc or str(job.get("tres_req_str") or "")),
        nodes=tuple(expand(node_expr)) if node_expr else (),
        held=state == "PENDING" and (held or reason.startswith("JobHeld")),
        req_nodes=tuple(expand(req)) if req else (),
        admin_comment=str(job.get("admin_comment") or ""),
        comment=str(job.get("comment") or ""),
        requeue=bool(job.get("requeue")),
        **_request_fields(job),
    )


# job fields whose requests the live loop does not model: a job with any of them set is
# left to Slurm (``QueuedJob.unmodelled``)
_UNMODELLED_FIELDS = (
    "licenses",
    "resv_name",
    "dependency",
    "tres_per_socket",
    "cpus_per_tres",
    "memory_per_tres",
    "cluster_features",
    "batch_features",
)


def _request_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """What else a queue record holds of the job's request (``QueuedJob``'s constraint
    fields): excluded nodes, features, exclusive, contiguous, CPUs and memory per node,
    heterogeneous and array membership, and the requests the loop cannot judge."""
    request = read_request(job)
    nodes = request.nodes or request.min_nodes
    cpus_total = _int(job.get("cpus"))
    cpus = max(_int(job.get("minimum_cpus_per_node")), -(-cpus_total // nodes))
    mem = _int(job.get("memory_per_node"))
    if not mem and _int(job.get("memory_per_cpu")):
        mem = _int(job.get("memory_per_cpu")) * max(1, cpus)
    excluded = str(job.get("excluded_nodes") or "")
    unmodelled = [f"{key}={str(job.get(key))[:60]}" for key in _UNMODELLED_FIELDS if job.get(key)]
    # TRES per node, job and task other than GPUs and a task's CPUs (24.11+ write ``-c 4``
    # as ``tres_per_task: cpu=4``): not modelled
    for key in ("tres_per_node", "tres_per_job", "tres_per_task"):
        text = str(job.get(key) or "")
        if any(not _modelled_tres(t) for t in text.split(",") if t):
            unmodelled.append(f"{key}={text[:60]}")
    if _int(job.get("minimum_tmp_disk_per_node")):
        unmodelled.append("tmp disk")
    task = number(job.get("array_task_id"))
    shared = text_list(job.get("shared")).lower()
    return dict(
        excluded_nodes=tuple(expand(excluded)) if excluded else (),
        features=str(job.get("features") or ""),
        exclusive=_exclusive(shared, job.get("exclusive")),
        contiguous=bool(job.get("contiguous")),
        cpus_per_node=cpus,
        mem_per_node_mb=mem,
        het_job_id=_int(job.get("het_job_id")),
        het_job_offset=_int(job.get("het_job_offset")),
        array_job_id=_int(job.get("array_job_id")),
        array_task_id=None if task is None else int(task),
        array_tasks=str(job.get("array_task_string") or ""),
        unmodelled=tuple(unmodelled),
        topology=topology_request(job),
        request=request,
    )


def _exclusive(shared: str, exclusive: Any) -> bool:
    """``--exclusive`` (whole nodes): ``shared`` is ``none``/``user``/``mcs`` (22.05 text,
    later a list), or a later ``exclusive`` list names ``true``/``user``/``mcs`` or is
    ``true``; ``exclusive: ["topo"]`` (``--exclusive=topo``) is a topology request, not this."""
    words = set(shared.split(","))
    if isinstance(exclusive, bool):
        return exclusive or bool(words & {"none", "user", "mcs"})
    words |= set(text_list(exclusive).lower().split(","))
    return bool(words & {"none", "user", "mcs", "true"})


def _modelled_tres(item: str) -> bool:
    """A TRES request item the loop models: GPUs (22.05 ``gres:gpu:2``, later
    ``gres/gpu:2``, typed or not) or CPUs (``cpu=4`` / ``cpu:4``)."""
    return item.startswith(("gres:gpu", "gres/gpu", "cpu=", "cpu:"))


def parse_nodes(doc: Mapping[str, Any]) -> list[NodeInfo]:
    """Nodes of a document with per-node records: 22.05's ``sinfo --json``, ``scontrol
    --json show nodes`` (23.02+) or ``/slurm/VERSION/nodes``. (From 23.02 ``sinfo --json``
    groups nodes by partition and state under ``sinfo`` instead: refused, naming the
    command to use.)"""
    _raise_errors(doc, "nodes")
    generation(doc, "nodes")
    if "nodes" not in doc and isinstance(doc.get("sinfo"), list):
        raise SlurmSchemaError(
            "nodes: this sinfo --json groups nodes by partition and state (Slurm 23.02+): "
            "read per-node records from `scontrol --json show nodes`"
        )
    out: list[NodeInfo] = []
    for node in _list(doc, "nodes"):
        try:
            out.append(_node_info(node))
        except _UNREADABLE as exc:
            raise _unreadable("nodes: node", node, "name", exc) from exc
    return out


def _node_info(node: Mapping[str, Any]) -> NodeInfo:
    return NodeInfo(
        name=str(node["name"]),
        state=node_state_text(node.get("state"), node.get("state_flags")),
        partitions=tuple(str(p) for p in node.get("partitions") or []),
        cpus=_int(node.get("cpus")),
        gpus_total=gres_gpus(str(node.get("gres") or "")),
        gpus_used=gres_gpus(str(node.get("gres_used") or "")),
        cpus_alloc=_int(node.get("alloc_cpus")),
        memory_mb=_int(node.get("real_memory")),
        memory_alloc_mb=_int(node.get("alloc_memory")),
        features=_features(node.get("active_features") or node.get("features")),
    )


def _features(value: Any) -> tuple[str, ...]:
    """A node's features: a comma-separated string (22.05) or a list (later versions)."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return tuple(str(f).strip() for f in items if str(f).strip())


def parse_partitions(doc: Mapping[str, Any]) -> list[PartitionInfo]:
    """Partitions of a ``/slurm/VERSION/partitions`` document: v0.0.38 writes ``nodes`` and
    ``state`` as text; v0.0.40+ ``nodes: {configured, ...}`` and ``partition: {state: [..]}``.
    """
    _raise_errors(doc, "partitions")
    generation(doc, "partitions")
    out: list[PartitionInfo] = []
    for p in _list(doc, "partitions"):
        try:
            out.append(_partition_info(p))
        except _UNREADABLE as exc:
            raise _unreadable("partitions: partition", p, "name", exc) from exc
    return out


def _partition_info(p: Mapping[str, Any]) -> PartitionInfo:
    nodes = p.get("nodes")
    if isinstance(nodes, Mapping):
        nodes = nodes.get("configured")
    if nodes is not None and not isinstance(nodes, str):
        raise TypeError("nodes is neither text nor {configured: text}")
    state = p.get("state")
    inner = p.get("partition")
    if state is None and isinstance(inner, Mapping):
        state = inner.get("state")
    words = state if isinstance(state, list) else [state or "UNKNOWN"]
    return PartitionInfo(
        name=str(p["name"]),
        nodes=tuple(expand(nodes)) if nodes else (),
        state="+".join(str(w).upper() for w in words) or "UNKNOWN",
    )


def parse_scontrol_partitions(text: str) -> list[PartitionInfo]:
    """Partitions of ``scontrol -o show partition`` (one ``Key=Value ...`` record a line)."""
    out: list[PartitionInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" not in fields:
            raise SlurmError(f"scontrol show partition: unexpected line {line[:80]!r}")
        nodes = fields.get("Nodes", "")
        out.append(
            PartitionInfo(
                name=fields["PartitionName"],
                nodes=tuple(expand(nodes)) if nodes and nodes != "(null)" else (),
                state=fields.get("State", "UNKNOWN").upper(),
            )
        )
    return out


def _raise_errors(doc: Mapping[str, Any], what: str) -> None:
    errors = doc.get("errors") or []
    if errors:
        texts = [str(e.get("error") or e.get("description") or e) for e in errors]
        raise SlurmError(f"{what}: Slurm reported errors: {'; '.join(texts)[:500]}")


def _list(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise SlurmError(f"Slurm JSON has no {key!r} list")
    return value


def _int(value: Any) -> int:
    """A count of either generation (unset: 0)."""
    return count(value)


def _epoch(value: Any) -> float | None:
    v = _int(value)
    return float(v) if v > 0 else None


def _limit_s(value: Any) -> float | None:
    """A time limit in minutes -> seconds; unset, infinite, NO_VAL or INFINITE -> None."""
    if value is None or isinstance(value, bool):
        return None
    v = number(value)
    if v is None or v == math.inf:
        return None
    v = int(v)
    return None if v < 0 or v >= _NO_VAL else float(v * 60)
