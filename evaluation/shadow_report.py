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

``write_shadow_report`` writes ``shadow_report.md``, ``shadow_report.json`` and plots (JCT
CDFs, the ratios with their intervals); ``log_shadow_report`` logs them to MLflow.
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

from linkwise.cluster.metrics import duration_text

__all__ = [
    "EXPERIMENT",
    "METRICS",
    "Interval",
    "ShadowReport",
    "ShadowWindow",
    "log_shadow_report",
    "pick_shadow_window",
    "shadow_headline",
    "shadow_policy_spec",
    "shadow_report",
    "shadow_spans",
    "shadow_window",
    "write_shadow_report",
]

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
class ShadowWindow:
    """The shadow decisions a report covers: their span, cycles, rows, policy and version."""

    since: float
    until: float
    cycles: int
    decisions: int
    policy: str
    model_version: str


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


# ------------------------------------------------------------------------ the window


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
    from linkwise.datasets.rollouts import runs_from_store

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
    from linkwise.models.registry import MODEL_NAME

    version = window.model_version
    if version.startswith("heuristic:"):
        return version.split(":", 1)[1]
    if window.policy.startswith("model:"):
        if version.isdigit():
            return f"model:models:/{MODEL_NAME}/{version}"
        if version:
            return f"model:{version}"
    return window.policy


# ------------------------------------------------------------------------ the replay


def _actual(con: Any, cluster: str, since: float, until: float) -> tuple[Any, dict[Any, Any]]:
    """The window's finished jobs (``runs_from_store``, ``until`` inclusive) and each Slurm
    job's first start (its queueing as Slurm recorded it)."""
    from linkwise.datasets.rollouts import runs_from_store

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
    policy: str | None = None,
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
    learned policy's package brings its own)."""
    from linkwise.cluster.profiles import load_calibration
    from linkwise.datasets.backlog import backlog_from_store
    from linkwise.datasets.decisions import _resolve_cluster, load_log_jobs
    from linkwise.datasets.rollouts import Window
    from linkwise.datasets.traces import JOB_COLUMNS, frame_jobs
    from linkwise.evaluation.benchmark import BenchTask, EvalCase, PolicyRef, run_task

    cal = calibration if calibration is not None else load_calibration(None)
    name = _resolve_cluster(con, "jobs", cluster)
    win, skipped = pick_shadow_window(
        con, since=since, until=until, model_version=model_version, cluster=name
    )
    spec = policy or shadow_policy_spec(win)
    runs, firsts = _actual(con, name, win.since, win.until)
    backlog = backlog_from_store(con, topology, name, win.since, predictor)
    window = Window(0, win.since, win.until, frame_jobs(runs.select(list(JOB_COLUMNS))))
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
        BACKFILL: run_task(BenchTask(PolicyRef(BACKFILL, "backfill"), case, tracking_uri)),
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
        policy_spec=spec,
        jobs=len(ids),
        backlog=backlog.to_json(),
        values=values,
        intervals=intervals,
        deviations=deviations,
        jct_s={s: [float(x) for x in a["jct"]] for s, a in arrays.items()},
        n_boot=n_boot,
        seed=seed,
        skipped=skipped,
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
    from linkwise.evaluation.stats import bootstrap_ratio

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


# ------------------------------------------------------------------------ output


def _signed(seconds: float) -> str:
    """A difference of durations with its sign: ``+72 s``, ``-14.3 min``."""
    return duration_text(seconds) if seconds < 0 else "+" + duration_text(seconds)


def _markdown(report: ShadowReport) -> str:
    w = report.window
    d = report.deviations
    lines = [
        "# Shadow report",
        "",
        report.headline(),
        "",
        f"- window: [{w.since:.0f}, {w.until:.0f}] ({duration_text(w.until - w.since)}), "
        f"{w.cycles} shadow cycles, {w.decisions} decision rows of {w.policy} "
        f"(version {w.model_version})",
        f"- replayed: {report.policy_spec} and backfill, warm-started from the accounting at "
        f"the window's start ({report.backlog['running']} running, "
        f"{report.backlog['pending']} pending jobs); {report.jobs} jobs measured",
        f"- intervals: paired bootstrap over the jobs, {report.n_boot} draws, seed {report.seed}",
        *(f"- skipped a later shadow span: {s}" for s in report.skipped),
        "",
        "| schedule | avg JCT | p99 JCT | avg queue | avg run-time inflation |",
        "|---|---|---|---|---|",
    ]
    for s, v in report.values.items():
        lines.append(
            f"| {s} | {duration_text(v['avg_jct'])} | {duration_text(v['p99_jct'])} | "
            f"{duration_text(v['avg_queue'])} | "
            f"{v['avg_inflation']:.3f} |"
        )
    lines += ["", "| ratio | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    pairs = ((POLICY, ACCOUNTING), (BACKFILL, ACCOUNTING), (POLICY, BACKFILL))
    for subject, reference in pairs:
        cells = [report.interval(m, subject, reference).words() for m in METRICS]
        lines.append(f"| {subject} / {reference} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Deviations from the base: {d['deviated']} of {d['decisions']} decision rows "
        f"({d['deviated_starts']} starts, {d['deviated_waits']} waits; {d['explained']} rows "
        f"explained); they concern {d['jobs_concerned']} jobs, {d['jobs_replayed']} of them "
        f"replayed: their JCTs under the policy minus backfill replayed "
        f"{_signed(d['jct_vs_backfill_s'])} in all, minus what Slurm gave them "
        f"{_signed(d['jct_vs_accounting_s'])} (negative: saved).",
        "",
        "Read with it: the accounting's run times are the replay's isolated times (real "
        "contention included, the replay adds its own on top: backfill / accounting shows the "
        "simulator's distance from what ran); unfinished jobs are left out; the accounting's "
        "run-time inflation is 1 by construction.",
        "",
    ]
    return "\n".join(lines)


def _plots(report: ShadowReport, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, jct in report.jct_s.items():
        x = np.sort(np.asarray(jct)) / 3600.0
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=s)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("JCT (h)")
    ax.set_ylabel("share of jobs")
    ax.set_title("Shadow window: JCT by schedule")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "shadow_jct_cdf.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (subject, reference) in enumerate(((POLICY, ACCOUNTING), (POLICY, BACKFILL))):
        for m, metric in enumerate(METRICS):
            i = report.interval(metric, subject, reference)
            if i.ratio is not None and i.low is not None and i.high is not None:
                yerr = [[i.ratio - i.low], [i.high - i.ratio]]
                label = f"{subject} / {reference}" if m == 0 else None
                ax.errorbar(m + 0.2 * k, i.ratio, yerr=yerr, fmt="o", color=f"C{k}",
                            capsize=3, label=label)  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(METRICS)), METRICS)
    ax.set_ylabel("ratio (95% interval)")
    ax.set_title("Shadow policy vs what ran and vs backfill replayed")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "shadow_ratios.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def write_shadow_report(report: ShadowReport, out_dir: str | Path) -> dict[str, Path]:
    """``shadow_report.md``, ``shadow_report.json`` and the plots in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "shadow_report.md"
    md.write_text(_markdown(report))
    js = out / "shadow_report.json"
    js.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    cdf, ratios = _plots(report, out)
    return {"markdown": md, "json": js, "cdf": cdf, "ratios": ratios}


def log_shadow_report(
    report: ShadowReport, out_dir: str | Path, *, tracking_uri: str, experiment: str = EXPERIMENT
) -> str:
    """Log the report as an MLflow run (the window and policy as params, every ratio and its
    interval as metrics, the folder as artifacts); the run id."""
    from linkwise.models.registry import ensure_experiment, registry_client

    client = registry_client(tracking_uri)
    exp = ensure_experiment(client, experiment, tracking_uri=tracking_uri)
    run = client.create_run(exp, run_name="shadow-report")
    rid = run.info.run_id
    try:
        w = report.window
        for k, v in {**asdict(w), "policy_spec": report.policy_spec, "jobs": report.jobs}.items():
            client.log_param(rid, k, str(v)[:500])
        for i in report.intervals:
            if i.ratio is None or i.low is None or i.high is None:
                continue
            key = f"{i.subject}_over_{i.reference}.{i.metric}"
            client.log_metric(rid, key, i.ratio)
            client.log_metric(rid, f"{key}_low", i.low)
            client.log_metric(rid, f"{key}_high", i.high)
        for k, v in report.deviations.items():
            client.log_metric(rid, f"deviations.{k}", float(v))
        client.log_artifacts(rid, str(out_dir), artifact_path="shadow_report")
    finally:
        client.set_terminated(rid)
    return str(rid)


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
    from linkwise.datasets.store import open_store

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
