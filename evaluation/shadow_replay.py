"""The counterfactual shadow report: would the cluster have been better off under the policy
the live loop ran in shadow mode?

The shadow window is ``[since, until]`` of the loop's shadow decisions (or the times given):
of the version named, else of the latest version whose span has evidence (finished jobs
submitted in it, ``pick_shadow_window``); later spans without any (a short run, a fallback
run) are skipped and named in the report.
It is replayed in the simulator warm-started from the accounting at ``since``
(``datasets.backlog``: the runs then running hold their GPUs with the time they had left, the
runs then pending arrive at once), the jobs submitted in the window arriving as they did
(``evaluation.benchmark``'s case, replayed as it was: no resampling), under

- the shadow policy (``--policy SPEC``, default: the one the decisions name, pinned to the
  registry version they logged), and
- ``backfill``: Slurm's scheduling in the simulator, the simulator's check of itself against
- the accounting itself: the schedule Slurm actually ran (each job's JCT, queueing and run
  time as Slurm recorded them).

For average and p99 JCT, average queueing and average run-time inflation (run time over the
isolated time) it gives the paired ratio of each replay to the accounting and of the policy to
backfill replayed, with seeded paired bootstrap intervals over the jobs
(``evaluation.stats.bootstrap_ratio``; one window is one case). It counts the decisions where
the policy deviated from its base (the ``deviated`` column of the decision log) and what the
jobs those decisions concern cost or saved in the replay (their JCT under the policy minus
under backfill replayed, and minus what Slurm gave them).

What to read with it: the accounting gives only observed run times, which become the replay's
isolated times (real contention included, so the replay adds contention on top: the backfill
replay's ratio to the accounting shows how far the simulator is from what ran); jobs still
unfinished are left out; the run-time inflation of the accounting is 1 by that construction.

``evaluation.shadow_report`` writes the report as ``shadow_report.md``,
``shadow_report.json`` and plots (JCT CDFs, the ratios with their intervals) and logs them to
MLflow; ``evaluation.shadow_window`` picks the window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.backlog import backlog_from_store
from linkwise.datasets.comm_profiles import apply_history_windows, load_profile_book
from linkwise.datasets.log_jobs import load_log_jobs, resolve_cluster
from linkwise.datasets.rollouts import Window, runs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import JOB_COLUMNS, frame_jobs
from linkwise.evaluation.benchmark import BenchTask, EvalCase, PolicyRef, run_task
from linkwise.evaluation.shadow_window import ShadowWindow, pick_shadow_window, shadow_policy_spec
from linkwise.evaluation.stats import bootstrap_ratio
from linkwise.policies.spec import PolicySpec

EXPERIMENT = "linkwise-shadow-report"
POLICY, BACKFILL, ACCOUNTING = "policy", "backfill", "accounting"
METRICS = ("avg_jct", "p99_jct", "avg_queue", "avg_inflation")
_STAT = {"avg_jct": "avg", "p99_jct": "p99", "avg_queue": "avg", "avg_inflation": "avg"}


@dataclass(frozen=True)
class Interval:
    """A paired ratio ``subject / reference`` of one metric with its bootstrap interval
    (``ratio`` None where the reference's value is 0, e.g. no job queued; an end None where
    some draws had none: unbounded)."""

    metric: str
    subject: str
    reference: str
    ratio: float | None
    low: float | None
    high: float | None
    level: float
    jobs: int

    def words(self) -> str:
        if self.ratio is None:
            return "n/a"

        def end(x: float | None) -> str:
            return "unbounded" if x is None else f"{x:.3f}"

        return f"x{self.ratio:.3f} [{end(self.low)}, {end(self.high)}]"


@dataclass(frozen=True)
class ShadowReport:
    """Everything the report says (see the module docstring)."""

    window: ShadowWindow
    policy_spec: str
    jobs: int
    backlog: dict[str, Any]
    values: dict[str, dict[str, float]]  # schedule -> metric -> value (seconds or ratio)
    intervals: tuple[Interval, ...]
    deviations: dict[str, Any]
    jct_s: dict[str, list[float]] = field(repr=False)
    n_boot: int = 2000
    seed: int = 0
    skipped: tuple[str, ...] = ()  # later shadow spans left out for want of evidence
    # the calibration the replay used and how it was chosen (models.calibrations'
    # CalibrationChoice.to_dict(): kind, path, run_id, cluster, text)
    calibration: dict[str, Any] = field(default_factory=dict)
    # how many of the window's jobs had which profile (datasets.comm_profiles.ProfileCounts:
    # learned from earlier runs' telemetry by name or by user and GPUs, the default mix)
    profiles: dict[str, int] = field(default_factory=dict)

    def interval(self, metric: str, subject: str = POLICY, reference: str = ACCOUNTING) -> Interval:
        """The paired ratio of ``metric`` of ``subject`` to ``reference``."""
        for i in self.intervals:
            if (i.metric, i.subject, i.reference) == (metric, subject, reference):
                return i
        raise KeyError(f"no {metric} ratio of {subject} to {reference}")

    def headline(self) -> str:
        """The report in one line."""
        a = self.interval("avg_jct")
        p = self.interval("p99_jct")
        b = self.interval("avg_jct", BACKFILL, ACCOUNTING)
        d = self.deviations
        return (
            f"shadow report ({self.policy_spec}, {self.jobs} jobs): avg JCT {a.words()}, "
            f"p99 JCT {p.words()} of what Slurm ran (backfill replayed: {b.words()}); "
            f"deviated from its base in {d['deviated']} of {d['decisions']} decisions"
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("jct_s")
        out["headline"] = self.headline()
        return out


def _actual(con: Any, cluster: str, since: float, until: float) -> tuple[Any, dict[Any, Any]]:
    """The window's finished jobs (``runs_from_store``, ``until`` inclusive) and each Slurm
    job's first start (its queueing as Slurm recorded it)."""
    runs = runs_from_store(con, cluster=cluster, since=since, until=math.nextafter(until, math.inf))
    firsts = dict(
        con.execute(
            "SELECT job_id, min(start_time) FROM jobs WHERE cluster = ? AND start_time IS NOT "
            "NULL GROUP BY job_id",
            [cluster],
        ).fetchall()
    )
    return runs, firsts


def shadow_report(
    con: Any,
    *,
    topology: Any,
    calibration: Any = None,
    calibration_used: Mapping[str, Any] | None = None,
    policy: PolicySpec | None = None,
    since: float | None = None,
    until: float | None = None,
    model_version: str | None = None,
    cluster: str | None = None,
    predictor: Any = None,
    tracking_uri: str | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
) -> ShadowReport:
    """The counterfactual report of the shadow window (module docstring). ``policy``: a spec
    (default: the one the decisions name, ``shadow_policy_spec``); ``cluster``: the store's
    Slurm cluster (None: the only one); ``predictor``: run-time predictions for the jobs (a
    learned policy's package brings its own); ``calibration_used``: how ``calibration`` was
    chosen, as the report states it (default: its own source line)."""
    cal = calibration if calibration is not None else load_calibration(None)
    name = resolve_cluster(con, "jobs", cluster)
    win, skipped = pick_shadow_window(
        con, since=since, until=until, model_version=model_version, cluster=name
    )
    spec = policy or PolicySpec.parse(shadow_policy_spec(win))
    runs, firsts = _actual(con, name, win.since, win.until)
    backlog = backlog_from_store(con, topology, name, win.since, predictor)
    window = Window(0, win.since, win.until, frame_jobs(runs.select(list(JOB_COLUMNS))))
    # the window's jobs get the profile learned from runs ended before it where one exists
    # (the backlog's jobs carry history ids for names: they draw from the default mix)
    book = load_profile_book(con, cluster=name, until=win.since)
    (window,), cal, profiles = apply_history_windows((window,), cal, book)
    if not window.jobs and not backlog.pending:
        raise ValueError(
            f"no finished job was submitted in the shadow window [{win.since:.0f}, "
            f"{win.until:.0f}] of version {win.model_version}, and none was pending at its "
            "start: nothing to replay (pick another span with --since/--until)"
        )
    case = EvalCase(
        window=window,
        seed=seed,
        topology=topology,
        calibration=cal,
        block_s=0.0,
        backlog=backlog,
        predictor=predictor,
    )
    results = {
        POLICY: run_task(BenchTask(PolicyRef(POLICY, spec), case, tracking_uri)),
        BACKFILL: run_task(
            BenchTask(PolicyRef(BACKFILL, PolicySpec.parse("backfill")), case, tracking_uri)
        ),
    }
    # what Slurm did, by the benchmark's ids: window jobs 0.. in (submit, id) order, then the
    # backlog's pending runs in (submit, id) order (datasets.backlog.warm_jobs)
    actual: dict[int, tuple[float, float, float]] = {}
    slurm_ids: dict[int, int] = {}
    ordered = runs.sort("submit_time", "job_id")
    for i, r in enumerate(ordered.iter_rows(named=True)):
        jct = float(r["last_end"]) - float(r["submit_time"])
        run = float(r["duration"])
        first = firsts.get(r["job_id"])
        queue = float(first) - float(r["submit_time"]) if first is not None else jct - run
        actual[i] = (queue, jct, run)
        slurm_ids[int(r["job_id"])] = i
    pend_runs, _ = load_log_jobs(con, topology, name, since=win.since, until=win.since)
    ends = {
        int(r["job_id"]): (float(r["start"]), float(r["end"]), int(r["slurm_job_id"]))
        for r in pend_runs.iter_rows(named=True)
    }
    first_id = len(window.jobs)
    pending = sorted(backlog.pending, key=lambda j: (j.submit_time, j.job_id))
    for k, job in enumerate(pending):
        start, end, sid = ends[job.job_id]
        actual[first_id + k] = (start - win.since, end - win.since, end - start)
        slurm_ids.setdefault(sid, first_id + k)
    ids = [j for j in results[POLICY].job_ids if j in actual]
    if not ids:
        raise ValueError(
            f"no finished job of the store's accounting in [{win.since:.0f}, {win.until:.0f}]"
        )
    arrays = {s: _arrays(res, ids) for s, res in results.items()}
    arrays[ACCOUNTING] = {
        "jct": np.array([actual[j][1] for j in ids]),
        "queue": np.array([actual[j][0] for j in ids]),
        "inflation": np.ones(len(ids)),
    }
    intervals = tuple(
        _interval(metric, subject, reference, arrays, n_boot=n_boot, level=level, seed=seed)
        for subject, reference in ((POLICY, ACCOUNTING), (BACKFILL, ACCOUNTING), (POLICY, BACKFILL))
        for metric in METRICS
    )
    values = {s: {m: _value(a, m) for m in METRICS} for s, a in arrays.items()}
    deviations = _deviations(con, win, ids, slurm_ids, arrays)
    return ShadowReport(
        window=win,
        policy_spec=spec.label,
        jobs=len(ids),
        backlog=backlog.to_json(),
        values=values,
        intervals=intervals,
        deviations=deviations,
        jct_s={s: [float(x) for x in a["jct"]] for s, a in arrays.items()},
        n_boot=n_boot,
        seed=seed,
        skipped=skipped,
        calibration=dict(calibration_used or {"text": cal.source or "shipped"}),
        profiles=profiles.to_dict(),
    )


def _arrays(res: Any, ids: Sequence[int]) -> dict[str, np.ndarray]:
    at = {j: i for i, j in enumerate(res.job_ids)}
    jct = np.array([res.jct_s[at[j]] for j in ids])
    run = np.array([res.run_s[at[j]] for j in ids])
    iso = np.array([max(res.isolated_s[at[j]], 1e-9) for j in ids])
    return {"jct": jct, "queue": np.maximum(jct - run, 0.0), "inflation": run / iso}


def _series(metric: str) -> str:
    return metric.split("_", 1)[1]


def _value(a: Mapping[str, np.ndarray], metric: str) -> float:
    x = a[_series(metric)]
    return float(np.percentile(x, 99)) if _STAT[metric] == "p99" else float(x.mean())


def _interval(
    metric: str,
    subject: str,
    reference: str,
    arrays: Mapping[str, Mapping[str, np.ndarray]],
    *,
    n_boot: int,
    level: float,
    seed: int,
) -> Interval:
    a, b = arrays[subject][_series(metric)], arrays[reference][_series(metric)]
    if _value(arrays[reference], metric) <= 0:
        return Interval(metric, subject, reference, None, None, None, level, len(a))
    with np.errstate(divide="ignore", invalid="ignore"):  # draws where no job queued
        ratio, low, high = bootstrap_ratio(
            [a], [b], _STAT[metric], n_boot=n_boot, level=level, seed=seed
        )
    return Interval(metric, subject, reference, ratio, _finite(low), _finite(high), level, len(a))


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _deviations(
    con: Any,
    win: ShadowWindow,
    ids: Sequence[int],
    slurm_ids: Mapping[int, int],
    arrays: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, Any]:
    """The decisions where the policy deviated from its base, the jobs they concern (the row's
    job, the base's starts of that cycle), and what those jobs' JCTs were in the replay minus
    backfill replayed and minus what Slurm gave them (negative: saved)."""
    rows = con.execute(
        "SELECT job_id, action, deviated, explanation FROM decisions WHERE mode = 'shadow' "
        "AND model_version = ? AND ts >= ? AND ts <= ?",
        [win.model_version, win.since, win.until],
    ).fetchall()
    explained = [r for r in rows if r[2] is not None]
    deviated = [r for r in explained if r[2]]
    touched: set[int] = set()
    for job_id, _, _, raw in deviated:
        if job_id is not None:
            touched.add(int(job_id))
        if raw:
            e = json.loads(raw)
            touched.update(int(s["job_id"]) for s in (e.get("base") or {}).get("starts", []))
    pos = {j: i for i, j in enumerate(ids)}
    idx = [pos[slurm_ids[j]] for j in touched if j in slurm_ids and slurm_ids[j] in pos]
    jct = {s: a["jct"][idx] for s, a in arrays.items()}
    return {
        "decisions": len(rows),
        "explained": len(explained),
        "deviated": len(deviated),
        "deviated_starts": sum(1 for r in deviated if r[1] == "start"),
        "deviated_waits": sum(1 for r in deviated if r[1] == "wait"),
        "jobs_concerned": len(touched),
        "jobs_replayed": len(idx),
        "jct_vs_backfill_s": float((jct[POLICY] - jct[BACKFILL]).sum()) if idx else 0.0,
        "jct_vs_accounting_s": float((jct[POLICY] - jct[ACCOUNTING]).sum()) if idx else 0.0,
    }


def shadow_headline(
    db: str | Path,
    *,
    topology: Any,
    tracking_uri: str | None = None,
    model_version: str | None = None,
    cluster: str | None = None,
    seed: int = 0,
    n_boot: int = 1000,
) -> str:
    """The report's headline for the store's shadow window of ``model_version`` (the demo's
    line), or why there is none."""
    try:
        with closing(open_store(db)) as con:
            report = shadow_report(
                con,
                topology=topology,
                model_version=model_version,
                cluster=cluster,
                tracking_uri=tracking_uri,
                seed=seed,
                n_boot=n_boot,
            )
    except ValueError as exc:
        return f"shadow report: none ({exc})"
    return report.headline()
