"""Slurm's accounting (``sacct --json`` / ``/slurmdb/VERSION/jobs``, ``sacct -P`` lines) -> job
runs, one record at a time: a record that cannot become a ``JobRun`` is a ``RejectedRecord``.

The defects handled here:

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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from linkwise.cluster.domain import MAX_JOB_GPUS
from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.document import (
    decode_json,
    gc_paused,
    int_or_zero,
    limit_seconds,
    raise_errors,
    record_list,
)
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.gpu_counts import even_split, tres_gpus
from linkwise.cluster.slurm.queue import FINISHED_STATES
from linkwise.cluster.slurm.records import AccountingBatch, JobRun, RejectedRecord
from linkwise.cluster.slurm.schema import (
    LEGACY,
    count,
    exit_status,
    generation,
    job_state_text,
    number,
)

ExitStatus = tuple[int | None, int | None]  # (exit code, signal)
RunKey = tuple[int, int]  # (job id, submit time in epoch seconds): one run of a job

NO_NODES = "None assigned"
# states of a run that ended with the job going back to the queue
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "NODE_FAIL", "PREEMPTED"})
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
            submit_time = int_or_zero(submit)
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
    for job in record_list(doc, "jobs"):
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
    raise_errors(doc, "accounting")
    legacy = generation(doc, "accounting") == LEGACY
    codes = exit_codes or {}
    indexes = run_index or {}
    placements: dict[tuple[str, int], tuple[tuple[str, ...], tuple[int, ...]]] = {}
    runs: list[JobRun] = []
    rejected: list[RejectedRecord] = []
    with gc_paused():
        for rec in record_list(doc, "jobs"):
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


def parse_sacct_output(
    doc_text: str | bytes,
    lines_text: str,
    check: Callable[[dict[str, Any]], object] | None = None,
) -> AccountingBatch:
    """The runs of one ``sacct -a -D --json`` call and the records it rejected, exit codes
    and run indexes taken from the ``sacct -a -D -X -P -n -o ACCT_LINE_FIELDS`` lines of
    the same jobs (epoch times): what the collector makes of sacct's output."""
    lines = parse_acct_lines(lines_text)
    codes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    indexes = run_indexes((x.job_id, x.submit_time, x.state) for x in lines)
    return parse_accounting_batch_json(doc_text, codes, indexes, check=check)


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
        return limit_seconds(value)
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
