"""Slurm hostlist expressions: expansion, compression, order, errors, round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkwise.cluster.hostlist import compress, expand, host_sort_key, sort_hosts


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu[01-04,07],cpu1", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[1-010]", [f"n{i}" for i in range(1, 11)]),  # width comes from the low bound
        ("n[007-008]", ["n007", "n008"]),
        (
            "rack[1-2]-node[01-02]",
            ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
        ),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("[1-3]", ["1", "2", "3"]),
        ("b,a,b", ["b", "a", "b"]),  # order and duplicates kept, as scontrol does
        ("a b\tc\nd", ["a", "b", "c", "d"]),
        ("a,,b,", ["a", "b"]),
        ("x[3,1,2]", ["x3", "x1", "x2"]),
        ("", []),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("gpu[01-04", "unclosed"),
        ("gpu01]", "without"),
        ("gpu[[1-2]]", "nested"),
        ("gpu[]", "empty brackets"),
        ("gpu[a-b]", "bad range"),
        ("gpu[1-]", "bad range"),
        ("gpu[-1]", "bad range"),
        ("gpu[1,,2]", "bad range"),
        ("gpu[4-2]", "goes down"),
        ("gpu[1, 2]", "whitespace"),
        ("gpu[0-99999999]", "more than"),
        ("a[0-2000]b[0-2000]", "more than"),
    ],
)
def test_expand_rejects_malformed(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand(expr)


@pytest.mark.parametrize(
    ("hosts", "expr"),
    [
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"], "cpu1,gpu[01-04,07]"),
        (["n10", "n9", "n8", "n10"], "n[8-10]"),
        (["n09", "n10", "n11"], "n[09-11]"),
        (["gpu05"], "gpu05"),
        (["login", "gpu1"], "gpu1,login"),
        (["gpu", "gpu2", "gpu1"], "gpu,gpu[1-2]"),
        (["rack10-n1", "rack2-n1", "rack1-n1", "rack1-n2"], "rack1-n[1-2],rack2-n1,rack10-n1"),
        (["n1", "n2", "n01", "n10"], "n[1-2,01,10]"),
        (["node1-ib", "node2-ib"], "node1-ib,node2-ib"),
        ([], ""),
    ],
)
def test_compress(hosts: list[str], expr: str) -> None:
    assert compress(hosts) == expr


def test_compress_is_the_inverse_of_expand_on_sorted_lists() -> None:
    expr = "gpu[01-16],gpu[18-20],cpu[1-4],login"
    assert compress(expand(expr)) == "cpu[1-4],gpu[01-16,18-20],login"
    assert expand(compress(reversed(expand(expr)))) == sort_hosts(expand(expr))


@pytest.mark.parametrize("bad", ["", "a,b", "a b", "a[1]", "a]"])
def test_compress_rejects_non_host_names(bad: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        compress(["ok1", bad])


def test_slurm_order() -> None:
    # natural order of prefixes, bare name first, then the number; padded after unpadded
    hosts = ["n10", "n01", "n2", "n1", "n", "m3", "n1a", "rack10-x", "rack9-x"]
    assert sort_hosts(hosts) == ["m3", "n", "n1", "n2", "n01", "n10", "n1a", "rack9-x", "rack10-x"]
    assert host_sort_key("gpu09") < host_sort_key("gpu10")


_prefix = st.text(alphabet="ab-.0_", min_size=0, max_size=4).filter(
    lambda p: not p or not p[-1].isdigit()
)
_number = st.tuples(st.integers(0, 130), st.integers(0, 3)).map(lambda t: f"{t[0]:0{t[1]}d}")


@st.composite
def _host(draw: st.DrawFn) -> str:
    prefix = draw(_prefix)
    number = draw(st.one_of(st.just(""), _number))
    host = prefix + number
    return host if host else "h"


@settings(max_examples=300, deadline=None)
@given(st.lists(_host(), max_size=40))
def test_round_trip(hosts: list[str]) -> None:
    expr = compress(hosts)
    assert expand(expr) == sort_hosts(hosts)
    assert compress(expand(expr)) == expr
    assert set(expand(expr)) == set(hosts)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["gpu", "node-", "r1n", ""]),
    st.integers(0, 200),
    st.integers(0, 60),
    st.integers(1, 4),
)
def test_contiguous_padded_run_is_one_range(prefix: str, lo: int, span: int, width: int) -> None:
    hosts = [f"{prefix}{n:0{width}d}" for n in range(lo, lo + span + 1)]
    expr = compress(hosts)
    assert expr.count(",") == 0
    assert expand(expr) == hosts
