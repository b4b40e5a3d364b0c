"""The comparison table of an evaluation: one row per policy, with the JCT's parts apart and
every reference, as data and as the table the demo prints.

Per row: avg and p99 JCT; queueing (``avg_queue_s``), run-time inflation from contention
(``avg_runtime_inflation``: mean run time / mean isolated run time - 1), the mean contention
slowdown (per job, and over multi-node jobs); fairness (``unfair_share``); the paired avg and
p99 ratios to the baseline with 95% intervals; the avg ratios to the best same-information
heuristic (the best heuristic that is no oracle) and to the oracle ceiling
(``EvaluationReport.references``); the ratios to both lower bounds (isolated and
queueing-aware); masked actions. Oracle ceilings (they read the true run time) carry
``oracle: True`` and are shown ``(oracle)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from linkwise.evaluation.columns import columns_for, format_ratio, left_out
from linkwise.evaluation.report import EvaluationReport

__all__ = ["comparison_table", "format_ratio", "rich_table"]


def comparison_table(report: EvaluationReport, names: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per policy (``names``: spec -> display name, else the spec), sorted by avg JCT."""
    ratios = {(r.policy, r.stat): r for r in report.ratios}
    refs = report.references
    to_ref = {(r.baseline, r.policy, r.stat): r for r in report.reference_ratios}
    rows: list[dict[str, Any]] = []
    for s in report.summary:
        p = s["policy"]
        row: dict[str, Any] = {
            "policy": names.get(p, p),
            "spec": p,
            "oracle": bool(s.get("oracle", False)),
            "cases": s["cases"],
            "avg_jct_s": s.get("avg_jct_s"),
            "p99_jct_s": s.get("p99_jct_s"),
            "avg_queue_s": s.get("avg_queue_s"),
            "avg_runtime_inflation": s.get("avg_runtime_inflation"),
            "avg_contention_slowdown": s.get("avg_contention_slowdown"),
            "avg_multinode_slowdown": s.get("avg_multinode_slowdown"),
            "unfair_share": s.get("unfair_share"),
            "avg_jct_over_lb": s.get("avg_jct_over_lb"),
            "avg_jct_over_queue_lb": s.get("avg_jct_over_queue_lb"),
            "masked_actions": s.get("masked_actions"),
            "guard_overrides": s.get("guard_overrides"),
            # a residual's replacements of its base's move (None: not a residual)
            "deviations_per_1000": s.get("deviations_per_1000"),
        }
        for stat in ("avg", "p99"):
            r = ratios.get((p, stat))
            row[f"{stat}_ratio"] = None if r is None else r.ratio
            row[f"{stat}_low"] = None if r is None else r.low
            row[f"{stat}_high"] = None if r is None else r.high
            row[f"{stat}_wins"] = None if r is None else r.wins
        for key in ("best_heuristic", "oracle"):
            ref = refs.get(key)
            if ref is None:
                r_, lo, hi = None, None, None
            elif ref == p:
                r_, lo, hi = 1.0, None, None
            elif ref == refs.get("baseline"):  # its ratios are the baseline's
                r_, lo, hi = row["avg_ratio"], row["avg_low"], row["avg_high"]
            else:
                found = to_ref.get((ref, p, "avg"))
                r_, lo, hi = (None, None, None) if found is None else (
                    found.ratio, found.low, found.high
                )  # fmt: skip
            row[f"avg_ratio_to_{key}"] = r_
            row[f"avg_ratio_to_{key}_low"] = lo
            row[f"avg_ratio_to_{key}_high"] = hi
        rows.append(row)
    rows.sort(key=lambda r: float(r["avg_jct_s"] or math.inf))
    return rows


def rich_table(
    rows: Sequence[Mapping[str, Any]],
    title: str,
    baseline: str = "backfill",
    *,
    wide: bool = False,
) -> Table:
    """The table as the demo prints it (hours; queueing and contention apart; ratios to
    ``baseline``, to the best same-information heuristic, to the oracle ceiling and to both
    lower bounds; oracles marked). By default the columns that fit 120 terminal columns
    (``evaluation.columns.DEFAULT["demo"]``); ``wide``: every column."""
    t = Table(title=title)
    columns = columns_for("demo", wide)
    for c in columns:
        t.add_column(c.head(baseline), justify="left" if c.left else "right")
    for r in rows:
        t.add_row(*(c.cell(r, baseline) for c in columns))
    left = left_out("demo", wide, baseline)
    if left:
        t.caption = f"--wide adds: {', '.join(left)}"
    return t
