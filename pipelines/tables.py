"""The comparison table of an evaluation: one row per policy (avg and p99 JCT, their paired
ratios to the baseline with 95% intervals, queueing, masked actions), as data and as the
table the demo prints."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from linkwise.evaluation.report import EvaluationReport

__all__ = ["comparison_table", "rich_table"]


def comparison_table(report: EvaluationReport, names: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per policy (``names``: spec -> display name, else the spec), sorted by avg JCT."""
    ratios = {(r.policy, r.stat): r for r in report.ratios}
    rows: list[dict[str, Any]] = []
    for s in report.summary:
        p = s["policy"]
        row: dict[str, Any] = {
            "policy": names.get(p, p),
            "spec": p,
            "cases": s["cases"],
            "avg_jct_s": s.get("avg_jct_s"),
            "p99_jct_s": s.get("p99_jct_s"),
            "avg_queue_s": s.get("avg_queue_s"),
            "masked_actions": s.get("masked_actions"),
        }
        for stat in ("avg", "p99"):
            r = ratios.get((p, stat))
            row[f"{stat}_ratio"] = None if r is None else r.ratio
            row[f"{stat}_low"] = None if r is None else r.low
            row[f"{stat}_high"] = None if r is None else r.high
            row[f"{stat}_wins"] = None if r is None else r.wins
        rows.append(row)
    rows.sort(key=lambda r: float(r["avg_jct_s"] or math.inf))
    return rows


def format_ratio(row: Mapping[str, Any], stat: str, baseline: str = "backfill") -> str:
    """``0.724 [0.544, 0.994]``; ``1 (baseline)`` for the baseline, ``-`` when missing."""
    r = row.get(f"{stat}_ratio")
    if r is None:
        return "1 (baseline)" if row.get("policy") == baseline else "-"
    return f"{r:.3f} [{row[f'{stat}_low']:.3f}, {row[f'{stat}_high']:.3f}]"


def rich_table(rows: Sequence[Mapping[str, Any]], title: str, baseline: str = "backfill") -> Table:
    """The table as the demo prints it (hours, ratios to ``baseline``)."""
    t = Table(title=title)
    for col in (
        "policy",
        "avg JCT h",
        "p99 JCT h",
        "avg queue h",
        f"avg / {baseline}",
        f"p99 / {baseline}",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        t.add_row(
            str(r["policy"]),
            f"{float(r['avg_jct_s']) / 3600:.2f}",
            f"{float(r['p99_jct_s']) / 3600:.2f}",
            f"{float(r['avg_queue_s'] or 0) / 3600:.2f}",
            format_ratio(r, "avg", baseline),
            format_ratio(r, "p99", baseline),
        )
    return t
