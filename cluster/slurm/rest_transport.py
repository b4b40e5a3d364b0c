"""Slurm through slurmrestd, JWT auth, stdlib only.

The API version is the newest that both slurmrestd serves (its ``/openapi/v3`` paths) and
this client reads (``schema.SUPPORTED``: 22.05's v0.0.38, and v0.0.40-v0.0.45; 24.11 serves
v0.0.40-v0.0.42, 26.05 v0.0.42-v0.0.45), asked once per transport. The token is held
privately: it never appears in a repr, a log line or an error message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from linkwise.cluster.slurm.accounting import ctld_exit_codes, parse_accounting_batch, run_indexes
from linkwise.cluster.slurm.cli_transport import CommandRunner, slurm_time
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.nodes import parse_nodes
from linkwise.cluster.slurm.partitions import parse_partitions
from linkwise.cluster.slurm.queue import parse_queue
from linkwise.cluster.slurm.records import (
    AccountingBatch,
    JobRun,
    NodeInfo,
    PartitionInfo,
    QueuedJob,
)
from linkwise.cluster.slurm.schema import SUPPORTED, SlurmSchemaError, job_state_text, version_key

DEFAULT_TIMEOUT_S = 30.0
TOKEN_LIFESPAN_S = 3600


def scontrol_token_source(
    runner: CommandRunner, user: str, lifespan_s: int = TOKEN_LIFESPAN_S
) -> Callable[[], str]:
    """A token source that asks ``scontrol token`` (needs root or SlurmUser for others)."""

    def fetch() -> str:
        out = runner.run(
            ["scontrol", "token", f"username={user}", f"lifespan={lifespan_s}"], secret_output=True
        )
        for line in out.splitlines():
            key, _, value = line.strip().partition("=")
            if key == "SLURM_JWT" and value:
                return value
        raise SlurmError("scontrol token: no SLURM_JWT in its output")

    return fetch


class RestTransport:
    """Reads accounting, queue, nodes and partitions from slurmrestd."""

    name = "rest"

    def __init__(
        self,
        base_url: str,
        user: str,
        token_source: Callable[[], str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        token_ttl_s: float = TOKEN_LIFESPAN_S / 2,
        api: str | None = None,
    ) -> None:
        if api is not None and api not in SUPPORTED:
            raise ValueError(f"REST API {api!r} is not supported ({', '.join(SUPPORTED)})")
        self._api = api
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.timeout = timeout
        self._token_source = token_source
        self._token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._token_at = 0.0

    def __repr__(self) -> str:
        return f"RestTransport(base_url={self.base_url!r}, user={self.user!r}, token=<hidden>)"

    def _current_token(self) -> str:
        now = time.monotonic()
        if self._token is None or now - self._token_at > self._token_ttl_s:
            self._token = self._token_source()
            self._token_at = now
        return self._token

    def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET ``path`` (relative to the base URL) and decode the JSON answer."""
        query = ("?" + urllib.parse.urlencode(dict(params))) if params else ""
        url = f"{self.base_url}{path}{query}"
        what = f"GET {self.base_url}{path}"
        request = urllib.request.Request(
            url,
            headers={
                "X-SLURM-USER-NAME": self.user,
                "X-SLURM-USER-TOKEN": self._current_token(),
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            raise SlurmError(f"{what}: HTTP {exc.code}: {_error_text(exc.read())}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise SlurmTimeout(f"{what}: no answer within {self.timeout:g} s") from None
            raise SlurmUnavailable(f"{what}: {reason}") from None
        except TimeoutError:
            raise SlurmTimeout(f"{what}: no answer within {self.timeout:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise SlurmUnavailable(f"{what}: {exc}") from None
        try:
            doc = json.loads(body.decode("utf-8", "replace"))  # names are user-controlled
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{what}: answer is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise SlurmError(f"{what}: JSON answer is not an object")
        return doc

    def api(self) -> str:
        """The API version used: the newest one slurmrestd serves for both ``/slurm`` and
        ``/slurmdb`` that this client reads (asked once, from ``/openapi/v3``)."""
        if self._api is None:
            self._api = pick_api(self.get("/openapi/v3"), self.base_url)
        return self._api

    def job_ids(self, since: float, until: float | None) -> list[int]:
        """Ids of the jobs with an accounting record in the window, ascending."""
        params = {"start_time": slurm_time(since), "end_time": slurm_time(until or time.time())}
        doc = self.get(f"/slurmdb/{self.api()}/jobs", params)
        _check(doc, "accounting")
        ids = (j.get("job_id") for j in doc.get("jobs") or [] if isinstance(j, Mapping))
        return sorted({int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)})

    def jobs(self, since: float, until: float | None = None) -> list[JobRun]:
        """Every run of every job that has an accounting record in ``[since, until]``; a
        record that cannot be read raises ``SlurmError`` (``accounting`` keeps the others)."""
        return self.accounting(since, until).strict()

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        """The runs with an accounting record in ``[since, until]`` and the records rejected.

        The job list omits earlier runs of requeued jobs (v0.0.38 to v0.0.45 alike), so each
        job's full record set is read from ``/slurmdb/VERSION/job/{id}`` (one request per
        job). Exit codes of FAILED runs come from the controller's job list, which holds jobs
        for MinJobAge after they end; older FAILED runs keep ``exit_code=None``.
        """
        api = self.api()
        records: list[Mapping[str, Any]] = []
        meta: Any = None
        for job_id in self.job_ids(since, until):
            doc = self.get(f"/slurmdb/{api}/job/{job_id}")
            _check(doc, f"accounting job {job_id}")
            meta = doc.get("meta", meta)
            records.extend(doc.get("jobs") or [])
        codes = ctld_exit_codes(self.get(f"/slurm/{api}/jobs"))
        indexes = run_indexes(_run_keys(records))
        whole: dict[str, Any] = {"jobs": records, "errors": []}
        if meta is not None:
            whole["meta"] = meta
        return parse_accounting_batch(whole, codes, indexes)

    def queue(self) -> list[QueuedJob]:
        """Pending and running jobs."""
        return parse_queue(self.get(f"/slurm/{self.api()}/jobs"))

    def nodes(self) -> list[NodeInfo]:
        """Nodes."""
        return parse_nodes(self.get(f"/slurm/{self.api()}/nodes"))

    def partitions(self) -> list[PartitionInfo]:
        """Partitions."""
        return parse_partitions(self.get(f"/slurm/{self.api()}/partitions"))


def served_apis(openapi: Mapping[str, Any]) -> dict[str, set[str]]:
    """The versions an OpenAPI document serves per family: ``{"slurm": {"v0.0.42"}, ...}``
    (from its paths, ``/slurm/v0.0.42/jobs`` and ``/slurmdb/v0.0.42/jobs``)."""
    out: dict[str, set[str]] = {"slurm": set(), "slurmdb": set()}
    paths = openapi.get("paths")
    for path in paths if isinstance(paths, Mapping) else ():
        parts = str(path).split("/")
        if len(parts) > 2 and parts[1] in out and parts[2].startswith("v"):
            out[parts[1]].add(parts[2])
    return out


def pick_api(openapi: Mapping[str, Any], where: str = "slurmrestd") -> str:
    """The newest version served for both ``/slurm`` and ``/slurmdb`` that this client
    reads; ``SlurmSchemaError`` naming what is served and what is supported otherwise."""
    served = served_apis(openapi)
    both = served["slurm"] & served["slurmdb"] & set(SUPPORTED)
    if not both:
        shown = ", ".join(sorted(served["slurm"] | served["slurmdb"], key=_safe_key)) or "none"
        raise SlurmSchemaError(
            f"{where}: serves API versions {shown}; this client reads {', '.join(SUPPORTED)} "
            "(for both /slurm and /slurmdb)"
        )
    return max(both, key=version_key)


def _safe_key(version: str) -> tuple[int, ...]:
    try:
        return version_key(version)
    except ValueError:
        return (-1,)


def _check(doc: Mapping[str, Any], what: str) -> None:
    errors = doc.get("errors") or []
    if errors:
        texts = [str(e.get("error") or e.get("description") or e) for e in errors]
        raise SlurmError(f"{what}: slurmrestd reported errors: {'; '.join(texts)[:500]}")


def _error_text(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace").strip() or "no message"
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if errors:
        return "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)[:500]
    return "no message"


def _run_keys(records: list[Any]) -> list[tuple[int, int, str]]:
    """(job id, submit time, state) of the records whose id and time are integers (the
    others are rejected by the parse)."""
    out: list[tuple[int, int, str]] = []
    for r in records:
        if not isinstance(r, Mapping):
            continue
        t, state, job = r.get("time"), r.get("state"), r.get("job_id")
        submit = (t.get("submission") or 0) if isinstance(t, Mapping) else None
        if isinstance(job, int) and isinstance(submit, int) and isinstance(state, Mapping):
            try:
                out.append((job, submit, job_state_text(state.get("current"))))
            except ValueError:  # the parse rejects this record, naming its state
                continue
    return out
