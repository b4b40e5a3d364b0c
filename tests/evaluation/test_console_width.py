"""Output that fits (issue 24 item 4): ``linkwise demo``, ``compare`` and ``evaluate`` print
tables of at most 120 columns by default, ``--wide`` prints every column, ``--json`` is
unchanged; the evaluation report's Markdown results table has the same columns."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from rich.console import Console

from linkwise.cli import main
from linkwise.cluster.domain import Job
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.rollouts import Window
from linkwise.evaluation.columns import COLUMNS, DEFAULT, MAX_WIDTH, TABLES, columns_for
from linkwise.pipelines.console import print_table
from linkwise.pipelines.tables import rich_table
from linkwise.policies.spec import PolicySpec

POLICIES = "fifo,backfill,best_fit,sjf_bco,tiresias_las,srtf_oracle"


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def _headers(table: str, baseline: str = "backfill") -> list[str]:
    return [COLUMNS[n].head(baseline) for n in TABLES[table]]


def test_every_default_column_is_one_of_its_tables_columns() -> None:
    for table, names in DEFAULT.items():
        assert set(names) <= set(TABLES[table]), table
        assert [c.name for c in columns_for(table, wide=True)] == list(TABLES[table])
        assert len(columns_for(table)) < len(TABLES[table])


def _demo_rows(n: int, seed: int) -> list[dict[str, object]]:
    """Rows shaped like ``comparison_table``'s, with the widest values the demo prints: long
    names, two-digit hours, ratios with intervals, the oracle mark."""
    rng = random.Random(seed)
    names = ["tiresias_las", "qssf_oracle", "backfill", "CQL", "BC", "PPO", "sjf_bco"]
    rows: list[dict[str, object]] = []
    for i in range(n):
        name = names[i % len(names)]
        row: dict[str, object] = {
            "policy": name,
            "oracle": name.endswith("_oracle"),
            "avg_jct_s": rng.uniform(1, 99) * 3600,
            "p99_jct_s": rng.uniform(10, 999) * 3600,
            "avg_queue_s": rng.uniform(0, 99) * 3600,
            "avg_runtime_inflation": rng.uniform(0, 1.5),
            "avg_contention_slowdown": rng.uniform(1, 3),
            "unfair_share": rng.uniform(0, 1),
            "avg_jct_over_lb": rng.uniform(1, 99),
            "avg_jct_over_queue_lb": rng.uniform(1, 99),
        }
        for stat in ("avg", "p99"):
            r = rng.uniform(0.5, 9.9)
            row |= {f"{stat}_ratio": r, f"{stat}_low": r * 0.9, f"{stat}_high": r * 1.1}
        for key in ("best_heuristic", "oracle"):
            r = rng.uniform(0.5, 9.9)
            row |= {f"avg_ratio_to_{key}": r}
            row |= {f"avg_ratio_to_{key}_low": r * 0.9, f"avg_ratio_to_{key}_high": r * 1.1}
        rows.append(row)
    return rows


@pytest.mark.parametrize("console_width", [80, 200, 400])
def test_the_demo_table_fits_120_columns_and_wide_shows_every_column(console_width: int) -> None:
    rows = _demo_rows(10, seed=console_width)
    for wide in (False, True):
        buf = io.StringIO()
        console = Console(file=buf, width=console_width, color_system=None)
        print_table(console, rich_table(rows, "held-out windows", wide=wide), wide)
        text = buf.getvalue()
        if wide or console_width >= MAX_WIDTH:
            assert "qssf_oracle (oracle)" in text  # not folded, not cut
        if wide:
            assert all(h in text for h in _headers("demo")), text
            assert _widest(text) > MAX_WIDTH  # every column, at its natural width
        else:
            assert _widest(text) <= min(MAX_WIDTH, console_width), text  # folded if narrower
            if console_width >= MAX_WIDTH:  # the default columns fit without folding
                assert all(c.head("backfill") in text for c in columns_for("demo")), text
                assert all(f"{r['avg_ratio']:.3f} [" in text for r in rows)


def test_compare_fits_120_columns_and_wide_shows_every_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["compare", "--policies", POLICIES, "--jobs", "150", "--plot", str(tmp_path / "p.png")]
    assert main(argv) == 0
    narrow = capsys.readouterr().out
    assert _widest(narrow) <= MAX_WIDTH, narrow
    assert "srtf_oracle (oracle)" in narrow
    assert all(c.head("") in narrow for c in columns_for("compare"))
    assert "wall s" not in narrow and "makespan" not in narrow
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out
    assert all(h in wide for h in _headers("compare")), wide
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == POLICIES.split(",")
    assert {"wall_s", "makespan_s", "preemptions", "p50_jct_s"} <= rows[0].keys()


def test_simulate_fits_120_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "backfill", "--jobs", "100"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= MAX_WIDTH and "avg JCT" in out


def test_policies_fits_120_columns_and_wide_shows_names_and_descriptions_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from linkwise.policies.catalog import policy_catalog

    infos = policy_catalog()
    assert main(["policies"]) == 0
    narrow = capsys.readouterr().out
    assert _widest(narrow) <= MAX_WIDTH, narrow
    assert all(len(i.name) > 28 or i.name in narrow for i in infos)
    assert main(["policies", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert all(i.name in wide and i.description in wide for i in infos)


def test_evaluate_and_its_report_show_the_default_columns_and_wide_all(tmp_path: Path) -> None:
    from linkwise.evaluation import benchmark as bm
    from linkwise.evaluation.report import write_report
    from linkwise.pipelines.evaluate import format_evaluation

    topo = from_spec("2x8,leaf=2")
    t0 = 1.7e9
    jobs = tuple(Job(i, t0 + 30 * i, 1 + i % 8, 300.0 + 40 * i) for i in range(1, 25))
    cases = bm.make_cases([Window(0, t0, t0 + 3600, jobs)], [0, 1], topo, block_s=0.0)
    bench = bm.run_benchmark(
        [PolicySpec.parse("fifo"), PolicySpec.parse("best_fit"), PolicySpec.parse("srtf_oracle")],
        cases,
    )
    ctx = {"cases": 2, "evaluation_windows": [], "seeds": [0, 1], "cluster": "2x8"}
    for wide in (False, True):
        out = tmp_path / ("wide" if wide else "narrow")
        report = write_report(bench, out, baseline="fifo", context=ctx, n_boot=50, wide=wide)
        text = format_evaluation(report, None, wide)
        md = (out / "report.md").read_text()
        header = next(line for line in md.splitlines() if line.startswith("| policy | avg JCT"))
        shown = [c.strip() for c in header.strip("|").split("|")]
        assert "| srtf_oracle (oracle) |" in md
        expected = [c.head("fifo") for c in columns_for("evaluation", wide)]
        assert shown == expected  # the report's table: the same choice of columns
        assert all(h in text for h in expected)
        if wide:
            assert shown == _headers("evaluation", "fifo")
        else:
            lines = text.splitlines()  # the header lines, then the table's header and rows
            top = next(i for i, line in enumerate(lines) if line.split()[:1] == ["policy"])
            table = lines[top : top + 1 + len(report.summary)]
            assert table[0].split()[0] == "policy" and "srtf_oracle (oracle)" in table[-1]
            assert _widest("\n".join(table)) <= MAX_WIDTH, text
            assert "latency p99 ms" not in table[0]
            assert "--wide adds:" in text and "More columns with `--wide`" in md
