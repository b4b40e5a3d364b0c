"""The shadow window a report covers: the live loop's shadow decisions in the decision log,
per version (``shadow_spans``), the one to replay (``pick_shadow_window``: the latest span with
evidence, later spans without any named) and the policy spec that runs them again
(``shadow_policy_spec``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from linkwise.datasets.rollouts import runs_from_store
from linkwise.policies.source import MODEL_NAME


@dataclass(frozen=True)
class ShadowWindow:
    """The shadow decisions a report covers: their span, cycles, rows, policy and version."""

    since: float
    until: float
    cycles: int
    decisions: int
    policy: str
    model_version: str


def shadow_window(
    con: Any,
    *,
    since: float | None = None,
    until: float | None = None,
    model_version: str | None = None,
) -> ShadowWindow:
    """The shadow decisions in ``[since, until]`` (of ``model_version`` when given; else of the
    latest policy logged there). ValueError when there are none."""
    where = ["mode = 'shadow'"]
    params: list[Any] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(float(since))
    if until is not None:
        where.append("ts <= ?")
        params.append(float(until))
    if model_version is None:
        latest = con.execute(
            f"SELECT model_version FROM decisions WHERE {' AND '.join(where)} "
            "ORDER BY ts DESC LIMIT 1",
            params,
        ).fetchall()
        if not latest:
            raise ValueError("no shadow-mode decisions in the store for that window")
        model_version = str(latest[0][0])
    where.append("model_version = ?")
    params.append(str(model_version))
    (row,) = con.execute(
        "SELECT min(ts), max(ts), count(DISTINCT cycle_id), count(*), "
        "arg_max(policy, ts) FROM decisions WHERE " + " AND ".join(where),
        params,
    ).fetchall()
    if row[0] is None:
        raise ValueError(f"no shadow-mode decisions of version {model_version} in that window")
    return ShadowWindow(
        since=float(row[0]) if since is None else float(since),
        until=float(row[1]) if until is None else float(until),
        cycles=int(row[2]),
        decisions=int(row[3]),
        policy=str(row[4]),
        model_version=str(model_version),
    )


def shadow_spans(
    con: Any, *, since: float | None = None, until: float | None = None
) -> list[ShadowWindow]:
    """Every version's shadow window in ``[since, until]``, the latest first."""
    where = ["mode = 'shadow'"]
    params: list[Any] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(float(since))
    if until is not None:
        where.append("ts <= ?")
        params.append(float(until))
    rows = con.execute(
        "SELECT model_version, min(ts), max(ts), count(DISTINCT cycle_id), count(*), "
        f"arg_max(policy, ts) FROM decisions WHERE {' AND '.join(where)} "
        "GROUP BY model_version ORDER BY max(ts) DESC",
        params,
    ).fetchall()
    return [
        ShadowWindow(
            since=float(r[1]) if since is None else float(since),
            until=float(r[2]) if until is None else float(until),
            cycles=int(r[3]),
            decisions=int(r[4]),
            policy=str(r[5]),
            model_version=str(r[0]),
        )
        for r in rows
    ]


def _evidence(con: Any, cluster: str | None, since: float, until: float) -> int:
    """Finished jobs of the accounting submitted in ``[since, until]``: what a window replays."""
    end = math.nextafter(until, math.inf)
    return int(runs_from_store(con, cluster=cluster, since=since, until=end).height)


def pick_shadow_window(
    con: Any,
    *,
    since: float | None = None,
    until: float | None = None,
    model_version: str | None = None,
    cluster: str | None = None,
) -> tuple[ShadowWindow, tuple[str, ...]]:
    """The window a report covers and the later spans it skipped: ``model_version``'s when
    given (``shadow_window``); else the latest version's span with evidence (finished jobs
    submitted in it), each later span without any named with why. ValueError when no span
    has any."""
    if model_version is not None:
        return shadow_window(con, since=since, until=until, model_version=model_version), ()
    skipped: list[str] = []
    for win in shadow_spans(con, since=since, until=until):
        if _evidence(con, cluster, win.since, win.until):
            return win, tuple(skipped)
        skipped.append(
            f"version {win.model_version} ({win.policy}; {win.cycles} cycles in "
            f"[{win.since:.0f}, {win.until:.0f}]): no finished job was submitted in its span"
        )
    if not skipped:
        raise ValueError("no shadow-mode decisions in the store for that window")
    raise ValueError(
        "no shadow span with evidence to replay (every span's jobs unfinished or none "
        f"submitted): {'; '.join(skipped)}; wait for its jobs to finish and collect them, or "
        "pick a span with --since/--until"
    )


def shadow_policy_spec(window: ShadowWindow) -> str:
    """The policy the decisions name, as a spec that runs it again: a registry model pinned to
    the version the loop logged, a package by its folder, a heuristic by its name."""
    version = window.model_version
    if version.startswith("heuristic:"):
        return version.split(":", 1)[1]
    if window.policy.startswith("model:"):
        if version.isdigit():
            return f"model:models:/{MODEL_NAME}/{version}"
        if version:
            return f"model:{version}"
    return window.policy
