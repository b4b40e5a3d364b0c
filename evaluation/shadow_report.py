"""The shadow report's files and MLflow run: the report
(``evaluation.shadow_replay.shadow_report``) as ``shadow_report.md``, ``shadow_report.json``
and plots (JCT CDFs, the ratios with their intervals), logged to MLflow."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from linkwise.cluster.metrics import duration_text
from linkwise.datasets.comm_profiles import ProfileCounts
from linkwise.evaluation.shadow_replay import (
    ACCOUNTING,
    BACKFILL,
    EXPERIMENT,
    METRICS,
    POLICY,
    ShadowReport,
)
from linkwise.models.registry import ensure_experiment, registry_client

__all__ = ["log_shadow_report", "write_shadow_report"]


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
        f"- calibration: {report.calibration.get('text', 'not recorded')}",
        *(
            [f"- window's jobs' {ProfileCounts.from_dict(report.profiles).line()}"]
            if report.profiles
            else []
        ),
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
    # matplotlib takes about half a second to import: only where a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): drawn to a file, no display

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
