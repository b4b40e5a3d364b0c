"""The columns of the result tables, and the one place that decides which ones a table shows.

Every table (``linkwise demo``'s comparison, ``linkwise compare``/``simulate``, ``linkwise
evaluate``'s summary and the evaluation report's Markdown) is a list of column names from
``COLUMNS``. ``TABLES`` lists each table's columns in full (``--wide``); ``DEFAULT`` lists,
per table, the columns shown by default, chosen so the table fits 120 terminal columns.
``columns_for(table, wide)`` is what the renderers ask. A new column is one ``Column`` in
``COLUMNS`` and its name appended to ``TABLES[table]``: it appears with ``--wide`` only,
until its name is added to ``DEFAULT[table]`` (opt-in for the narrow view).

A cell is rendered from a row (a mapping of metric names to values; a missing or non-finite
value shows ``-``) and the table's baseline name (the ratio columns). Durations (JCTs, queueing,
makespan, restart time) read in the unit that suits each value (``cluster.metrics.
duration_text``: ``72 s``, ``14.3 min``, ``2.41 h``); the rows keep seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.metrics import duration_text

__all__ = [
    "COLUMNS",
    "DEFAULT",
    "MAX_WIDTH",
    "TABLES",
    "Column",
    "columns_for",
    "format_ratio",
    "left_out",
    "markdown_table",
    "text_table",
]

MAX_WIDTH = 120  # the default tables fit a terminal this wide

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    """One column: its header (``{baseline}`` is filled in) and how a row's cell reads."""

    name: str
    header: str
    cell: Callable[[Row, str], str]
    left: bool = False  # left-justified (the policy name); numbers are right-justified

    def head(self, baseline: str) -> str:
        """The header with the baseline's name filled in."""
        return self.header.format(baseline=baseline)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _fmt(key: str, fmt: str, none: str = "-") -> Callable[[Row, str], str]:
    def cell(row: Row, _baseline: str) -> str:
        v = row.get(key)
        if v is None:
            return none
        return "-" if _missing(v) else fmt.format(v)

    return cell


def _duration(key: str) -> Callable[[Row, str], str]:
    """A duration cell (``cluster.metrics.duration_text``: ``72 s``, ``14.3 min``, ``2.41 h``)."""

    def cell(row: Row, _baseline: str) -> str:
        v = row.get(key)
        return "-" if v is None or _missing(v) else duration_text(float(v))

    return cell


def _policy(row: Row, _baseline: str) -> str:
    return f"{row['policy']} (oracle)" if row.get("oracle") else str(row["policy"])


def format_ratio(row: Row, stat: str, baseline: str = "backfill") -> str:
    """``0.724 [0.544, 0.994]``; ``1 (baseline)`` for the baseline, ``-`` when missing."""
    r = row.get(f"{stat}_ratio")
    if r is None:
        return "1 (baseline)" if row.get("policy") == baseline else "-"
    return f"{r:.3f} [{row[f'{stat}_low']:.3f}, {row[f'{stat}_high']:.3f}]"


def _ratio(stat: str) -> Callable[[Row, str], str]:
    return lambda row, baseline: format_ratio(row, stat, baseline)


def _ref_ratio(key: str) -> Callable[[Row, str], str]:
    def cell(row: Row, _baseline: str) -> str:
        r = row.get(f"avg_ratio_to_{key}")
        if _missing(r):
            return "-"
        low, high = row.get(f"avg_ratio_to_{key}_low"), row.get(f"avg_ratio_to_{key}_high")
        return f"{r:.3f}" if low is None or high is None else f"{r:.3f} [{low:.3f}, {high:.3f}]"

    return cell


COLUMNS: dict[str, Column] = {
    c.name: c
    for c in (
        Column("policy", "policy", _policy, left=True),
        Column("avg_jct", "avg JCT", _duration("avg_jct_s")),
        Column("p50_jct", "p50 JCT", _duration("p50_jct_s")),
        Column("p99_jct", "p99 JCT", _duration("p99_jct_s")),
        Column("avg_queue", "avg queue", _duration("avg_queue_s")),
        Column("runtime_inflation", "run-time infl.", _fmt("avg_runtime_inflation", "{:+.1%}")),
        Column("contention", "contention x", _fmt("avg_contention_slowdown", "{:.3f}")),
        Column("multinode", "multi-node x", _fmt("avg_multinode_slowdown", "{:.3f}")),
        Column("unfair", "unfair", _fmt("unfair_share", "{:.1%}")),
        Column("avg_ratio", "avg / {baseline}", _ratio("avg")),
        Column("p99_ratio", "p99 / {baseline}", _ratio("p99")),
        Column("avg_ratio_to_best", "avg / best heur.", _ref_ratio("best_heuristic")),
        Column("avg_ratio_to_oracle", "avg / oracle", _ref_ratio("oracle")),
        Column("avg_over_lb", "avg / LB", _fmt("avg_jct_over_lb", "{:.2f}")),
        Column("avg_over_queue_lb", "avg / queue LB", _fmt("avg_jct_over_queue_lb", "{:.2f}")),
        Column("p99_over_lb", "p99 / LB", _fmt("p99_jct_over_lb", "{:.2f}")),
        Column("avg_slowdown", "avg slowdown", _fmt("avg_slowdown", "{:.2f}")),
        Column("gpu_util", "GPU util", _fmt("gpu_utilization", "{:.1%}")),
        Column("makespan", "makespan", _duration("makespan_s")),
        Column("preemptions", "preempt", _fmt("preemptions", "{}")),
        Column("preempt_per_job", "preempt/job", _fmt("preemptions_per_job", "{:.2f}")),
        Column("restart_s", "restart/job", _duration("restart_s_per_job")),
        Column("latency_p99", "latency p99 ms", _fmt("latency_ms_p99", "{:.1f}")),
        Column("masked", "masked", _fmt("masked_actions", "{}", none="n/a")),
        Column("wall_s", "wall s", _fmt("wall_s", "{:.1f}")),
    )
}

# every column of each table, in order (what --wide shows)
TABLES: dict[str, tuple[str, ...]] = {
    # linkwise demo: rows of pipelines.tables.comparison_table
    "demo": (
        "policy",
        "avg_jct",
        "p99_jct",
        "avg_queue",
        "runtime_inflation",
        "contention",
        "unfair",
        "avg_ratio",
        "p99_ratio",
        "avg_ratio_to_best",
        "avg_ratio_to_oracle",
        "avg_over_lb",
        "avg_over_queue_lb",
    ),
    # linkwise simulate / compare: rows of PolicyRun.row()
    "compare": (
        "policy",
        "avg_jct",
        "p50_jct",
        "p99_jct",
        "avg_queue",
        "runtime_inflation",
        "contention",
        "avg_over_lb",
        "avg_over_queue_lb",
        "unfair",
        "gpu_util",
        "makespan",
        "preemptions",
        "preempt_per_job",
        "restart_s",
        "wall_s",
    ),
    # linkwise evaluate and the report's Markdown: rows of Benchmark.summary()
    "evaluation": (
        "policy",
        "avg_jct",
        "p99_jct",
        "avg_queue",
        "runtime_inflation",
        "contention",
        "multinode",
        "avg_over_lb",
        "avg_over_queue_lb",
        "p99_over_lb",
        "avg_slowdown",
        "unfair",
        "gpu_util",
        "preempt_per_job",
        "restart_s",
        "latency_p99",
        "masked",
    ),
}

# the columns each table shows by default (fits MAX_WIDTH; tests/evaluation/test_console_width.py)
DEFAULT: dict[str, tuple[str, ...]] = {
    "demo": ("policy", "avg_jct", "avg_queue", "runtime_inflation", "avg_ratio", "p99_ratio"),
    "compare": (
        "policy",
        "avg_jct",
        "p99_jct",
        "avg_queue",
        "runtime_inflation",
        "contention",
        "avg_over_queue_lb",
    ),
    "evaluation": (
        "policy",
        "avg_jct",
        "p99_jct",
        "avg_queue",
        "runtime_inflation",
        "contention",
        "avg_over_queue_lb",
    ),
}


def columns_for(table: str, wide: bool = False) -> list[Column]:
    """The columns ``table`` shows: all of them when ``wide``, else its default ones."""
    names = TABLES[table] if wide else [n for n in TABLES[table] if n in DEFAULT[table]]
    return [COLUMNS[n] for n in names]


def left_out(table: str, wide: bool = False, baseline: str = "") -> list[str]:
    """Headers of the columns the default view leaves out (for a note); none when ``wide``."""
    if wide:
        return []
    return [COLUMNS[n].head(baseline) for n in TABLES[table] if n not in DEFAULT[table]]


def markdown_table(rows: Sequence[Row], columns: Sequence[Column], baseline: str) -> list[str]:
    """A Markdown table (header, rule, one line per row)."""
    lines = [
        "| " + " | ".join(c.head(baseline) for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(c.cell(r, baseline) for c in columns) + " |" for r in rows]
    return lines


def text_table(
    rows: Sequence[Row], columns: Sequence[Column], baseline: str, indent: str = "  "
) -> list[str]:
    """A plain fixed-width table (columns two spaces apart), for plain-text summaries."""
    cells = [[c.head(baseline) for c in columns]]
    cells += [[c.cell(r, baseline) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        indent
        + "  ".join(
            v.ljust(w) if c.left else v.rjust(w)
            for v, w, c in zip(line, widths, columns, strict=True)
        ).rstrip()
        for line in cells
    ]
