"""The communication profile of a live job, as the contention model needs it (``Job.profile``):
squeue knows no model names, yet the design treats a job's profile as known at submit.

Resolved in this order (``resolve_profiles``), always to a profile of the calibration in use,
so the contention model never meets an unknown one:

1. ``declared``: the user's ``--comment`` carries ``linkwise:profile=NAME`` (a calibration
   profile, matched without regard to case: ``cluster/data/calibration.json`` names them),
   beside other tags such as ``linkwise:migratable``;
2. ``learned``: the profile learned from the job telemetry of earlier runs of the same job
   name, else of the same user and GPU count (``datasets.comm_profiles``: its book, its
   confidence rule ``min_runs`` and its ``lookup``), where the calibration in use holds it: a
   cluster's fitted calibration holds ``history:name=NAME`` for the names it was fitted on,
   the shipped one none (so with it no job is ``learned``);
3. ``history``: the profile declared by the latest earlier run of the same job name and user
   in the store's accounting (``jobs.comment``, ``read_profile_history``);
4. ``default``: the operator's default profile if one is set, else one drawn from the
   calibration's mix by a hash of the job id, as the simulator gives a trace job without a
   model name a draw from the mix (``cluster.profiles.assign_profiles``): the same job
   always gets the same one.

A declared name the calibration does not know falls through to the next source (counted in
``ResolvedProfile.note``). ``source_counts`` counts the jobs by source: the live loop exports
them (``linkwise_serve_job_profiles{source}``)."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.profiles import Calibration
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.datasets.comm_profiles import (
    PROFILE_PREFIX,
    ProfileBook,
    load_profile_book,
    lookup,
)
from linkwise.deployer.recorder import Recorder

__all__ = [
    "PROFILE_TAG",
    "SOURCES",
    "LearnedBook",
    "ProfileHistory",
    "ResolvedProfile",
    "declared_profile",
    "default_profile",
    "read_profile_history",
    "resolve_profiles",
    "source_counts",
    "undeclared",
]

PROFILE_TAG = "linkwise:profile"
_TAG = re.compile(r"(?:^|[\s,;])linkwise:profile=([A-Za-z0-9_.+-]+)(?=$|[\s,;])")
Source = Literal["declared", "learned", "history", "default"]
SOURCES: tuple[Source, ...] = ("declared", "learned", "history", "default")
UserName = tuple[str, str]  # (user, job name)


@dataclass(frozen=True)
class ResolvedProfile:
    """A job's profile and where it came from; ``note``: a declared name not known."""

    profile: str
    source: Source
    note: str = ""


def declared_profile(comment: str) -> str | None:
    """The profile a comment declares (``linkwise:profile=NAME``, the last one wins), as
    written; None when it declares none."""
    found = _TAG.findall(comment or "")
    return found[-1] if found else None


def _known(name: str | None, calibration: Calibration) -> str | None:
    """The calibration's own spelling of ``name`` (case-insensitive), None if unknown."""
    if not name:
        return None
    if name in calibration.profiles:
        return name
    lower = {p.lower(): p for p in calibration.profiles}
    return lower.get(name.lower())


def default_profile(job_id: int, calibration: Calibration, default: str = "") -> str:
    """``default`` when given (a calibration profile), else a profile drawn from the
    calibration's mix by a hash of the job id (deterministic: the same job, the same one)."""
    if default:
        known = _known(default, calibration)
        if known is None:
            names = ", ".join(sorted(calibration.profiles))
            raise ValueError(f"unknown default profile {default!r} (known: {names})")
        return known
    weights = sorted((n, w) for n, w in calibration.mix.items() if w > 0)
    if not weights:
        return sorted(calibration.profiles)[0]
    total = sum(w for _, w in weights)
    u = zlib.crc32(str(job_id).encode()) / 2**32 * total
    for name, w in weights:
        u -= w
        if u < 0:
            return name
    return weights[-1][0]


def resolve_profiles(
    queue: Iterable[QueuedJob],
    calibration: Calibration,
    history: Mapping[UserName, str] | None = None,
    default: str = "",
    book: ProfileBook | None = None,
) -> dict[int, ResolvedProfile]:
    """Every job's profile (module docstring): declared, else learned (``book``, a profile
    the calibration holds), else from ``history`` ((user, job name) -> profile declared by an
    earlier run), else the default; always one the calibration knows."""
    out: dict[int, ResolvedProfile] = {}
    for q in queue:
        said = declared_profile(q.comment)
        known = _known(said, calibration)
        note = "" if said is None or known else f"unknown declared profile {said!r}"
        if known is not None:
            out[q.job_id] = ResolvedProfile(known, "declared")
            continue
        learned = lookup(book, q.name, q.user, q.gpus, calibration.profiles) if book else None
        if learned is not None:
            out[q.job_id] = ResolvedProfile(learned.profile.name, "learned", note)
            continue
        earlier = _known((history or {}).get((q.user, q.name)), calibration)
        if earlier is not None:
            out[q.job_id] = ResolvedProfile(earlier, "history", note)
            continue
        out[q.job_id] = ResolvedProfile(
            default_profile(q.job_id, calibration, default), "default", note
        )
    return out


def source_counts(resolved: Mapping[int, ResolvedProfile]) -> dict[str, int]:
    """How many jobs got their profile from each source (every source, zeros included)."""
    counts: dict[str, int] = dict.fromkeys(SOURCES, 0)
    for r in resolved.values():
        counts[r.source] += 1
    return counts


def undeclared(queue: Iterable[QueuedJob]) -> list[UserName]:
    """The (user, job name) of jobs whose comment declares no profile (the history to read)."""
    return sorted({(q.user, q.name) for q in queue if declared_profile(q.comment) is None})


def read_profile_history(recorder: Recorder, keys: Sequence[UserName]) -> dict[UserName, str]:
    """The profile declared by the latest earlier run of each (user, job name) in the store's
    accounting (``jobs.comment``); keys without one are absent (also when the store cannot
    be read: the default applies then)."""
    if not keys or not recorder.db:
        return {}
    names = sorted({name for _, name in keys})
    rows = recorder.query(
        "SELECT user_name, name, comment FROM jobs WHERE name IN ("
        + ", ".join("?" * len(names))
        + ") AND comment LIKE '%linkwise:profile=%' ORDER BY submit_time, job_id",
        names,
    )
    wanted = set(keys)
    out: dict[UserName, str] = {}
    for user, name, comment in rows or []:
        key = (str(user), str(name))
        said = declared_profile(str(comment or ""))
        if key in wanted and said is not None:
            out[key] = said  # the latest run wins (rows in submit order)
    return out


class ProfileHistory:
    """``read_profile_history`` for the live loop, each (user, job name) read again only after
    ``ttl_s`` (an earlier run's profile changes rarely; the store is read once a cycle at
    most, for the names not read lately)."""

    def __init__(self, recorder: Recorder, ttl_s: float = 300.0) -> None:
        self.recorder = recorder
        self.ttl_s = ttl_s
        self._seen: dict[UserName, tuple[str | None, float]] = {}

    def get(self, keys: Sequence[UserName], now: float) -> dict[UserName, str]:
        """The known earlier profile of each key (absent: none)."""
        stale = [k for k in keys if k not in self._seen or now - self._seen[k][1] >= self.ttl_s]
        if stale:
            found = read_profile_history(self.recorder, stale)
            for k in stale:
                self._seen[k] = (found.get(k), now)
        return {k: p for k in keys if (p := self._seen[k][0]) is not None}


class LearnedBook:
    """The profile book (``datasets.comm_profiles.load_profile_book`` over the store's job
    telemetry, its default confidence rule) for the live loop, learned again only after
    ``ttl_s`` (the book changes as runs end, slowly; learning it reads every run's summary).
    A store that cannot be read keeps the last book (none at first: no job is learned)."""

    def __init__(self, recorder: Recorder, cluster: str | None, ttl_s: float = 600.0) -> None:
        self.recorder = recorder
        self.cluster = cluster
        self.ttl_s = ttl_s
        self.book: ProfileBook | None = None
        self.read_at = -math.inf

    def get(self, now: float, calibration: Calibration) -> ProfileBook | None:
        """The book, learned again when older than ``ttl_s``; None (nothing read) while
        ``calibration`` holds no learned profile (the shipped one: none could be used)."""
        if not any(p.startswith(PROFILE_PREFIX) for p in calibration.profiles):
            return None
        if self.recorder.db and now - self.read_at >= self.ttl_s:
            self.read_at = now
            found = self.recorder.read(lambda con: load_profile_book(con, cluster=self.cluster))
            if found is not None:
                self.book = found
        return self.book
