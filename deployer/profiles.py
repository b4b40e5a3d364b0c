"""The communication profile of a live job, as the contention model needs it (``Job.profile``):
squeue knows no model names, yet the design treats a job's profile as known at submit.

Resolved in this order (``resolve_profiles``), always to a profile of the calibration in use,
so the contention model never meets an unknown one:

1. ``declared``: the user's ``--comment`` carries ``linkwise:profile=NAME`` (a calibration
   profile, matched without regard to case: ``cluster/data/calibration.json`` names them),
   beside other tags such as ``linkwise:migratable``;
2. ``history``: the profile declared by the latest earlier run of the same job name and user
   in the store's accounting (``jobs.comment``, ``read_profile_history``);
3. ``default``: the operator's default profile if one is set, else one drawn from the
   calibration's mix by a hash of the job id, as the simulator gives a trace job without a
   model name a draw from the mix (``cluster.profiles.assign_profiles``): the same job
   always gets the same one.

A declared name the calibration does not know falls through to the next source (counted in
``ResolvedProfile.note``)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.profiles import Calibration
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.deployer.recorder import Recorder

__all__ = [
    "PROFILE_TAG",
    "ProfileHistory",
    "ResolvedProfile",
    "declared_profile",
    "default_profile",
    "read_profile_history",
    "resolve_profiles",
    "undeclared",
]

PROFILE_TAG = "linkwise:profile"
_TAG = re.compile(r"(?:^|[\s,;])linkwise:profile=([A-Za-z0-9_.+-]+)(?=$|[\s,;])")
Source = Literal["declared", "history", "default"]
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
) -> dict[int, ResolvedProfile]:
    """Every job's profile (module docstring): declared, else from ``history`` ((user, job
    name) -> profile of an earlier run), else the default; always one the calibration knows."""
    out: dict[int, ResolvedProfile] = {}
    for q in queue:
        said = declared_profile(q.comment)
        known = _known(said, calibration)
        note = "" if said is None or known else f"unknown declared profile {said!r}"
        if known is not None:
            out[q.job_id] = ResolvedProfile(known, "declared")
            continue
        earlier = _known((history or {}).get((q.user, q.name)), calibration)
        if earlier is not None:
            out[q.job_id] = ResolvedProfile(earlier, "history", note)
            continue
        out[q.job_id] = ResolvedProfile(
            default_profile(q.job_id, calibration, default), "default", note
        )
    return out


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
