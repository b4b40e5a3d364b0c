"""The evaluation report: Markdown, plots and JSON in a folder, logged to MLflow.

``write_report`` writes into ``out_dir``:

- ``report.md``: the setup (cluster, workload, evaluation windows and the dataset windows
  they are held out from, seeds, the run-time predictor), a table per policy with the JCT's
  parts apart (avg / p99 JCT, queueing, run-time inflation from contention, mean contention
  slowdown overall and of multi-node jobs, ratios to both lower bounds, slowdowns, unfair
  share, utilisation, decision latency, masked actions), the paired avg / p99 JCT ratios to
  the baseline with bootstrap intervals, and the paired avg JCT ratios to the references:
  the baseline, the best same-information heuristic (the best non-oracle heuristic, what a
  learned policy must beat) and the oracle ceiling (the best oracle run), beside the ratios
  to both lower bounds. Oracle ceilings (``PolicySpec.is_oracle``: they read the true
  run time) are marked ``(oracle)`` in every table and are never a reference but the ceiling;
- ``jct_cdf.png`` (all jobs of all cases per policy), ``jct_ratios.png`` (avg and p99 ratios
  to the baseline with intervals), ``contention_slowdown.png`` (CDF of run time / isolated
  run time per policy);
- ``results.json`` (context, summary rows, ratios), ``runs.json`` and ``jobs.parquet``
  (``evaluation.benchmark.save_benchmark``: the raw runs, so gates can be re-checked).

``log_report`` records it as an MLflow run: context as parameters, per-policy metrics, the
folder as artifacts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.flexible import summary_text
from linkwise.cluster.metrics import duration_text
from linkwise.evaluation.benchmark import UNFAIR_SLOWDOWN, Benchmark, save_benchmark
from linkwise.evaluation.columns import columns_for, left_out, markdown_table
from linkwise.evaluation.stats import STATS, RatioCI, paired_ratio
from linkwise.models.registry import ensure_experiment, mlflow_env, registry_client

__all__ = [
    "EXPERIMENT",
    "EvaluationReport",
    "compute_ratios",
    "log_report",
    "reference_policies",
    "render_markdown",
    "write_report",
]

EXPERIMENT = "linkwise-evaluation"


@dataclass(frozen=True)
class EvaluationReport:
    """Where the report went and what it says."""

    out_dir: str
    files: dict[str, str]
    summary: list[dict[str, Any]]
    ratios: list[RatioCI]
    baseline: str
    context: dict[str, Any]
    # "baseline", "best_heuristic" (the best non-oracle heuristic), "oracle" (the best oracle
    # ceiling) -> policy label or None; and the paired ratios to the last two
    references: dict[str, str | None] = field(default_factory=dict)
    reference_ratios: list[RatioCI] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "files": self.files,
            "baseline": self.baseline,
            "context": self.context,
            "summary": self.summary,
            "ratios": [r.to_json() for r in self.ratios],
            "references": self.references,
            "reference_ratios": [r.to_json() for r in self.reference_ratios],
        }


def reference_policies(bench: Benchmark, baseline: str) -> dict[str, str | None]:
    """The references a table compares with: the ``baseline``, the best same-information
    heuristic (lowest mean avg JCT among the heuristics that are no oracle) and the oracle
    ceiling (lowest mean avg JCT among the oracles); None where there is none."""
    avg = {r["policy"]: float(r["avg_jct_s"]) for r in bench.summary()}

    # learned and search policies (``lookahead:``) are reported beside, never the reference
    heur = bench.heuristics()
    oracles = [p for p in bench.policies if p in bench.oracles]
    return {
        "baseline": baseline,
        "best_heuristic": min(heur, key=avg.__getitem__) if heur else None,
        "oracle": min(oracles, key=avg.__getitem__) if oracles else None,
    }


def _name(row: Mapping[str, Any]) -> str:
    return f"{row['policy']} (oracle)" if row.get("oracle") else str(row["policy"])


def compute_ratios(
    bench: Benchmark, baseline: str, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> list[RatioCI]:
    """avg and p99 JCT ratios of every other policy to ``baseline``, paired."""
    if baseline not in bench.policies:
        raise ValueError(f"baseline {baseline!r} is not among the policies {bench.policies}")
    return [
        paired_ratio(bench, p, baseline, stat, n_boot=n_boot, level=level, seed=seed)
        for p in bench.policies
        if p != baseline
        for stat in STATS
    ]


def _backlog_text(backlog: Mapping[str, Any] | None) -> str:
    if not backlog:
        return ""
    return (
        f"; warm start: {backlog['running']} jobs running on {backlog['running_gpus']} GPUs, "
        f"{backlog['pending']} pending ({backlog['pending_gpus']} GPUs)"
    )


def render_markdown(
    summary: Sequence[Mapping[str, Any]],
    ratios: Sequence[RatioCI],
    baseline: str,
    context: Mapping[str, Any],
    plots: Mapping[str, str],
    references: Mapping[str, str | None] | None = None,
    reference_ratios: Sequence[RatioCI] = (),
    wide: bool = False,
) -> str:
    """The Markdown report (the results table: the columns ``linkwise evaluate`` prints,
    ``evaluation.columns``; ``wide``: all of them)."""
    lines = ["# linkwise evaluation", "", "## Setup", "", *_setup_lines(context)]
    lines += [
        "",
        "## Results (mean over cases)",
        "",
        "Lower bound (LB): mean isolated best-placement run time (no queueing, no contention); "
        "the p99 LB is the p99 of isolated run times; queue LB: the larger of LB and preemptive "
        "SRPT of the jobs' GPU-seconds on the pooled GPUs (docs/LOWER_BOUNDS.md), which counts "
        "queueing. Slowdown = JCT / isolated run time "
        f"(bounded, 10 s floor); unfair = share of jobs with slowdown > {UNFAIR_SLOWDOWN:g}.",
        "",
        "The average JCT in parts: avg JCT = avg queue + LB x (1 + run-time inflation), "
        "the inflation being mean run time / mean isolated run time - 1 (contention's share "
        "of run time); contention x is the per-job mean of run time / isolated run time, "
        "multi-node x the same over jobs spanning more than one node. (oracle): reads the "
        "true run time, a ceiling, never a reference.",
        "",
        *_summary_table(summary, baseline, wide),
    ]
    if summary:
        lb = summary[0]
        lines += [
            "",
            f"Lower bound: avg {duration_text(lb['lower_bound_s'])}, "
            f"p99 {duration_text(lb['lower_bound_p99_s'])}; "
            f"queueing-aware avg {duration_text(lb.get('lower_bound_queue_s', math.nan))}.",
        ]
    lines += _ratio_lines(ratios, baseline, summary)
    if references and summary:
        lines += _reference_table(summary, ratios, baseline, references, reference_ratios)
    lines += _failed_lines(context)
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({path})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def _setup_lines(context: Mapping[str, Any]) -> list[str]:
    """The report's setup: the run's context, the evaluation windows, the training data they
    are held out from, and the run-time predictor."""
    lines: list[str] = []
    for key in (
        "cluster",
        "topology_source",
        "gpus",
        "contention",
        "calibration",
        "profiles",
        "workload",
        "workload_source",
        "window_s",
        "block_s",
        "warm_start",
        "seeds",
        "cases",
        "baseline",
        "executor",
        "history_note",
    ):
        if context.get(key) is not None:
            lines.append(f"- **{key}**: {context[key]}")
    restart = context.get("restart")
    if isinstance(restart, Mapping):  # cluster/restart.py's RestartModel.to_dict()
        lines.append(f"- **restart cost**: {restart.get('description', restart.get('name'))}")
    forms = context.get("flexible")
    if isinstance(forms, Mapping):  # cluster/flexible.py's draw_summary
        lines.append(f"- **flexible requests**: {summary_text(forms)}; rule: {forms['rule']}")
    ev = context.get("evaluation_windows", [])
    if ev:
        lines += ["", "Evaluation windows (held out):", ""]
        lines += [
            f"- {w['label']}: [{w['start']:.0f}, {w['end']:.0f}) s, {w.get('jobs', '?')} jobs"
            + _backlog_text(w.get("backlog"))
            for w in ev
        ]
    used = context.get("dataset_windows", [])
    if context.get("datasets"):
        lines += ["", "Training data it is held out from:", ""]
        lines += [f"- dataset {d}" for d in context["datasets"]]
        lines += [f"  - {u['label']}: [{u['start']:.0f}, {u['end']:.0f}) s" for u in used[:50]]
        if len(used) > 50:
            lines.append(f"  - ... and {len(used) - 50} more spans")
    elif "datasets" in context:
        lines += ["", "Training data: none named (no --holdout-from, no model manifest)."]
    pred = context.get("predictor")
    if pred:
        lines += [
            "",
            f"Run-time predictor: fit on {pred.get('history_jobs', '?')} jobs of "
            f"{pred.get('history', '?')} submitted before the first evaluation window "
            f"(fit until {pred.get('predictor_fit_until', math.nan):.0f} s on its clock)"
            + (f"; {pred['history_note']}" if pred.get("history_note") else "")
            + ". Policies see its predictions, never the true run times (oracles excepted).",
        ]
    return lines


def _ratio_lines(
    ratios: Sequence[RatioCI], baseline: str, summary: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The paired JCT ratios to the baseline with their bootstrap intervals (none: no lines)."""
    lines: list[str] = []
    if ratios:
        level = ratios[0].level
        lines += [
            "",
            f"## Paired JCT ratios to {baseline} ({level:.0%} bootstrap intervals)",
            "",
            "Ratio < 1: better than the baseline. Paired by case (window x seed) and job; "
            f"{ratios[0].n_boot} resamples, seed {ratios[0].seed}.",
            "",
            "| policy | avg ratio | avg CI | p99 ratio | p99 CI | cases won (avg) |",
            "|---|---|---|---|---|---|",
        ]
        by = {(r.policy, r.stat): r for r in ratios}
        for p in dict.fromkeys(r.policy for r in ratios):
            a, q = by[(p, "avg")], by[(p, "p99")]
            lines.append(
                f"| {_label(p, summary)} | {a.ratio:.3f} | [{a.low:.3f}, {a.high:.3f}] | "
                f"{q.ratio:.3f} | [{q.low:.3f}, {q.high:.3f}] | {a.wins:.0%} |"
            )
    return lines


def _failed_lines(context: Mapping[str, Any]) -> list[str]:
    """The policies that failed on some case, left out of the comparison."""
    lines: list[str] = []
    failed: Mapping[str, Mapping[str, Any]] = context.get("failed", {})
    if failed:
        lines += [
            "",
            "## Failed policies (left out of the comparison)",
            "",
            "| policy | failed cases | first failure |",
            "|---|---|---|",
        ]
        lines += [f"| {p} | {f['cases']} | {f['first']} |" for p, f in failed.items()]
    return lines


def _summary_table(summary: Sequence[Mapping[str, Any]], baseline: str, wide: bool) -> list[str]:
    """The results table, and which columns ``--wide`` adds (``evaluation.columns``)."""
    lines = markdown_table(summary, columns_for("evaluation", wide), baseline)
    left = left_out("evaluation", wide, baseline)
    if left:
        lines += ["", f"More columns with `--wide` (and in results.json): {', '.join(left)}."]
    return lines


def _fmt(value: Any, fmt: str) -> str:
    """A number in ``fmt``; ``-`` when missing or not finite (no multi-node job, say)."""
    if value is None or not math.isfinite(float(value)):
        return "-"
    return fmt.format(value)


def _label(policy: str, summary: Sequence[Mapping[str, Any]]) -> str:
    row = next((r for r in summary if r["policy"] == policy), {"policy": policy})
    return _name(row)


def _reference_table(
    summary: Sequence[Mapping[str, Any]],
    ratios: Sequence[RatioCI],
    baseline: str,
    references: Mapping[str, str | None],
    reference_ratios: Sequence[RatioCI],
) -> list[str]:
    """avg JCT ratios to every reference and both lower bounds, one row per policy."""
    best, oracle = references.get("best_heuristic"), references.get("oracle")
    by = {(r.baseline, r.policy): r for r in [*ratios, *reference_ratios] if r.stat == "avg"}

    def cell(policy: str, ref: str | None) -> str:
        if ref is None:
            return "-"
        if policy == ref:
            return "1"
        r = by.get((ref, policy))
        return "-" if r is None else f"{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"

    lines = [
        "",
        "## avg JCT ratios to the references and the bounds",
        "",
        f"Baseline {baseline}; best same-information heuristic {best or '(none run)'} (the "
        f"best heuristic that is no oracle: what a learned policy must beat, and the gates' "
        f"reference); oracle ceiling {oracle or '(none run)'} (reads the true run time). "
        "Paired ratios with bootstrap intervals; LB and queue LB as above.",
        "",
        f"| policy | / {baseline} | / best heuristic | / oracle | / LB | / queue LB |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary:
        p = str(r["policy"])
        lines.append(
            f"| {_name(r)} | {cell(p, baseline)} | {cell(p, best)} | {cell(p, oracle)} | "
            f"{r['avg_jct_over_lb']:.2f} | {r.get('avg_jct_over_queue_lb', math.nan):.2f} |"
        )
    return lines


def _plt() -> Any:
    # matplotlib (heavy) only when a report draws its figures, with the Agg backend first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (the same reason) after the backend is chosen

    return plt


def _plot_cdf(
    bench: Benchmark, path: Path, values: str, xlabel: str, title: str, log: bool
) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in bench.policies:
        runs = bench.runs(p)
        if values == "jct":
            x = np.concatenate([np.asarray(r.jct_s) for r in runs]) / 3600.0
        else:
            x = np.concatenate([np.asarray(r.run_s) / np.asarray(r.isolated_s) for r in runs])
        x = np.sort(x)
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=p)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_ratios(ratios: Sequence[RatioCI], baseline: str, path: Path) -> Path:
    plt = _plt()
    policies = list(dict.fromkeys(r.policy for r in ratios))
    fig, ax = plt.subplots(figsize=(7, 0.5 * max(len(policies), 2) + 1.5))
    y = np.arange(len(policies))
    for off, stat, color in ((-0.15, "avg", "tab:blue"), (0.15, "p99", "tab:orange")):
        rs = [next(r for r in ratios if r.policy == p and r.stat == stat) for p in policies]
        mid = np.array([r.ratio for r in rs])
        err = np.array([[r.ratio - r.low for r in rs], [r.high - r.ratio for r in rs]])
        ax.errorbar(
            mid,
            y + off,
            xerr=np.maximum(err, 0),
            fmt="o",
            color=color,
            capsize=3,
            label=f"{stat} JCT",
        )
    ax.axvline(1.0, color="grey", lw=1, ls="--")
    ax.set_yticks(y, policies)
    ax.set_xlabel(f"JCT ratio to {baseline} (< 1 is better)")
    ax.set_title("Paired JCT ratios with bootstrap intervals")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    bench: Benchmark,
    out_dir: str | Path,
    *,
    baseline: str,
    context: Mapping[str, Any] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    wide: bool = False,
) -> EvaluationReport:
    """Write the report folder (see the module docstring; ``wide``: every column in the
    Markdown results table)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    failed = bench.failed()
    if baseline in failed:
        raise ValueError(f"the baseline {baseline!r} failed: {failed[baseline][0].error}")
    ctx = {**(context or {}), "baseline": baseline}
    if failed:
        ctx["failed"] = {
            p: {"cases": len(fs), "first": f"{fs[0].case_id}: {fs[0].error}"[:300]}
            for p, fs in failed.items()
        }
    summary = bench.summary()
    ratios = compute_ratios(bench, baseline, n_boot=n_boot, level=level, seed=seed)
    references = reference_policies(bench, baseline)
    reference_ratios = [
        paired_ratio(bench, p, ref, stat, n_boot=n_boot, level=level, seed=seed)
        for ref in dict.fromkeys(
            r for k, r in references.items() if k != "baseline" and r not in (None, baseline)
        )
        if ref is not None
        for p in bench.policies
        if p != ref
        for stat in STATS
    ]
    files = {k: str(v) for k, v in save_benchmark(bench, out).items()}
    plots = {
        "jct_cdf": _plot_cdf(
            bench,
            out / "jct_cdf.png",
            "jct",
            "job completion time (hours)",
            "JCT CDF (all evaluation cases)",
            True,
        ),
        "contention_slowdown": _plot_cdf(
            bench,
            out / "contention_slowdown.png",
            "contention",
            "run time / isolated run time",
            "Contention slowdown per job",
            False,
        ),
    }
    if ratios:
        plots["jct_ratios"] = _plot_ratios(ratios, baseline, out / "jct_ratios.png")
    md = render_markdown(
        summary,
        ratios,
        baseline,
        ctx,
        {k: p.name for k, p in plots.items()},
        references,
        reference_ratios,
        wide,
    )
    (out / "report.md").write_text(md)
    files.update({k: str(p) for k, p in plots.items()})
    files["report"] = str(out / "report.md")
    report = EvaluationReport(
        out_dir=str(out),
        files=files,
        summary=summary,
        ratios=ratios,
        baseline=baseline,
        context=ctx,
        references=references,
        reference_ratios=reference_ratios,
    )
    results = out / "results.json"
    results.write_text(json.dumps(report.to_json(), indent=1, default=str) + "\n")
    files["results"] = str(results)
    return report


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text[:500]


def log_report(
    report: EvaluationReport,
    *,
    tracking_uri: str,
    experiment: str = EXPERIMENT,
    run_name: str | None = None,
) -> str:
    """Log the report as an MLflow run (context as params, per-policy metrics as
    ``POLICY.METRIC``, ratios as ``POLICY.avg_ratio[_low|_high]``, the folder as
    artifacts); the run id."""

    mlflow_env()
    client = registry_client(tracking_uri)
    exp = ensure_experiment(client, experiment, tracking_uri=tracking_uri)
    run = client.create_run(exp, run_name=run_name or "evaluation")
    rid = run.info.run_id
    try:
        for k, v in report.context.items():
            client.log_param(rid, k, _param(v))
        keys = (
            "avg_jct_s",
            "p99_jct_s",
            "avg_jct_over_lb",
            "p99_jct_over_lb",
            "avg_slowdown",
            "unfair_share",
            "avg_contention_slowdown",
            "gpu_utilization",
            "latency_ms_p99",
            "lower_bound_s",
            "lower_bound_queue_s",
            "avg_jct_over_queue_lb",
            "avg_queue_s",
            "avg_runtime_inflation",
            "avg_multinode_slowdown",
            "preemptions_per_job",
            "restart_s_per_job",
        )
        for row in report.summary:
            name = _metric_name(str(row["policy"]))
            for k in keys:
                v = float(row.get(k, math.nan))
                if math.isfinite(v):
                    client.log_metric(rid, f"{name}.{k}", v)
        for r in report.reference_ratios:
            which = next(k for k, v in report.references.items() if v == r.baseline)
            name = _metric_name(r.policy)
            client.log_metric(rid, f"{name}.{r.stat}_ratio_to_{which}", r.ratio)
        for r in report.ratios:
            name = _metric_name(r.policy)
            client.log_metric(rid, f"{name}.{r.stat}_ratio", r.ratio)
            client.log_metric(rid, f"{name}.{r.stat}_ratio_low", r.low)
            client.log_metric(rid, f"{name}.{r.stat}_ratio_high", r.high)
        client.log_artifacts(rid, report.out_dir, artifact_path="evaluation")
    finally:
        client.set_terminated(rid)
    return str(rid)


def _metric_name(text: str) -> str:
    """MLflow metric names allow alphanumerics, _ - . space : /; anything else becomes _."""
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in text)
