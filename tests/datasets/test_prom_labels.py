"""Prometheus label values by the exposition format: escapes, raw TABs, malformed label sets,
and rows stored by earlier versions that are not valid JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from linkwise.datasets.store import open_store, scalar
from linkwise.datasets.telemetry.prometheus import parse_prometheus
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus

DCGM = "DCGM_FI_PROF_PCIE_TX_BYTES"


def test_escaped_label_values_are_unescaped_and_stored_as_valid_json() -> None:
    text = "\n".join(
        [
            f'{DCGM}{{gpu="0",Hostname="a\\"b",hpc_job="7"}} 100',
            f'{DCGM}{{gpu="1",Hostname="n1",path="C:\\\\data\\\\x",note="l1\\nl2"}} 200',
            f'{DCGM}{{gpu="2",Hostname="n1",tab="a\tb",odd="x\\dy"}} 300',
            f'{DCGM}{{gpu="3",Hostname="n1",brace="}} 1"}} 400',
        ]
    )
    p = parse_prometheus(text, ts=1.0)
    assert p.malformed.height == 0 and p.samples.height == 4
    labels = [json.loads(s) for s in p.samples["labels"].to_list()]
    assert labels[0] == {"gpu": "0", "Hostname": 'a"b', "hpc_job": "7"}
    assert p.samples["host"].to_list() == ['a"b', "n1", "n1", "n1"]
    assert p.samples["job"].to_list()[0] == "7"
    assert labels[1]["path"] == "C:\\data\\x" and labels[1]["note"] == "l1\nl2"
    assert labels[2]["tab"] == "a\tb" and labels[2]["odd"] == "x\\dy"  # unknown escape kept
    assert labels[3]["brace"] == "} 1"
    con = open_store(":memory:")
    rep = ingest_prometheus(con, text, source="dcgm", ts=1.0)
    assert rep.samples == 4 and rep.link_load_rows == 4
    assert scalar(con, "SELECT count(*) FROM telemetry_samples WHERE NOT json_valid(labels)") == 0
    got = con.execute(
        "SELECT labels->>'tab', labels->>'Hostname' FROM telemetry_samples ORDER BY value"
    ).fetchall()
    assert got[0][1] == 'a"b' and got[2][0] == "a\tb"
    assert scalar(con, "SELECT node FROM link_load WHERE device = 'gpu0'") == 'a"b'


def test_a_malformed_label_set_is_a_counted_rejection() -> None:
    text = "\n".join(
        [
            'node_x{a="unterminated} 1',
            'node_x{1bad="x"} 2',
            'node_x{a="x" b="y"} 3',
            'node_x{a="x",a="y"} 4',
            'node_x{a="fine",} 5',
            "node_x{} 6",
        ]
    )
    p = parse_prometheus(text, ts=1.0, host="h")
    assert p.samples["value"].to_list() == [5.0, 6.0]
    assert [json.loads(s) for s in p.samples["labels"]] == [{"a": "fine"}, {}]
    assert p.malformed["reason"].to_list() == ["malformed labels"] * 4
    con = open_store(":memory:")
    rep = ingest_prometheus(con, text, source="ne", ts=1.0, host="h")
    assert (rep.samples, rep.malformed) == (2, 4)
    rows = con.execute("SELECT raw, reason FROM rejected_rows ORDER BY raw").fetchall()
    assert len(rows) == 4 and rows[0][1] == "malformed labels"


def test_rows_poisoned_by_an_earlier_version_do_not_break_later_scrapes(tmp_path: Path) -> None:
    con = open_store(tmp_path / "p.duckdb")
    # what the earlier label conversion stored for a raw TAB and for an unknown escape
    for metric, labels in [
        ("node_infiniband_port_data_transmitted_bytes_total", '{"device":"m\tx","port":"1"}'),
        ("ib_sysfs_port_xmit_data", '{"device":"a\\d","port":"1"}'),
        (DCGM, '{"gpu":"0","Hostname":"a\\'),
    ]:
        con.execute(
            "INSERT INTO telemetry_samples VALUES (?, 'h', 'old', ?, ?, 1, NULL)",
            [5.0, metric, labels],
        ).fetchall()
    ne = "node_infiniband_port_data_transmitted_bytes_total"
    for ts, value in ((10.0, 1000.0), (20.0, 11000.0)):
        text = f'{ne}{{device="mlx5_0",port="1"}} {value}\n{DCGM}{{gpu="0",Hostname="n"}} 5'
        rep = ingest_prometheus(con, text, source="ne", ts=ts, host="n")
        assert rep.samples == 2
    added, _ = derive_ib_link_load(con, since=0.0, until=30.0, expected_interval_s=10.0)
    assert added == 1
    ib = con.execute("SELECT device, bytes_per_s FROM link_load WHERE link_class = 'ib'")
    assert ib.fetchall() == [("mlx5_0/1", 1000.0)]
    assert scalar(con, "SELECT count(*) FROM link_load WHERE link_class = 'pcie'") == 2


def test_the_vectorised_conversion_equals_the_exposition_parser_on_real_exporters() -> None:
    from linkwise.datasets.telemetry.prometheus import _label_table, parse_label_set

    data = Path(__file__).resolve().parents[3] / "shared" / "data" / "telemetry"
    sets = ['{a="1",b="x,y=",c="{}",d="ü 名"}', '{a="1",}', "{}", '{a="1",a="2"}']
    for name in ("dcgm_exporter_metrics_a100_mig.prom", "dcgm_exporter_render_format_test.txt",
                 "node_exporter_infiniband_e2e.prom"):  # fmt: skip
        for line in (data / name).read_text().splitlines():
            m = re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\}) ", line)
            if m:
                sets.append(m.group(1))
    table = _label_table(pl.DataFrame({"lbl": sorted(set(sets))}), "fb")
    assert table.height == len(set(sets)) > 12
    for lbl, labels, host in table.select("lbl", "labels", "host").rows():
        want = parse_label_set(lbl)
        if want is None:
            assert labels is None and lbl == '{a="1",a="2"}'
            continue
        assert labels == json.dumps(want, ensure_ascii=False, separators=(",", ":"))
        first = [v for k, v in want.items() if k in ("Hostname", "hostname")]
        assert host == (first[0] if first else "fb")


def test_blanks_before_a_sample_line_are_allowed() -> None:
    """The exposition format allows blanks before the metric name (expfmt skips them)."""
    p = parse_prometheus('  node_up 1\n\tnode_x{a="b"} 2\n', ts=1.0, host="h")
    assert p.malformed.height == 0
    assert p.samples.select("metric", "value").rows() == [("node_up", 1.0), ("node_x", 2.0)]
