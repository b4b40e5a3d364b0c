"""Slurm hostlist expressions: ``gpu[01-04,07],cpu1`` <-> a list of host names.

``expand`` follows ``scontrol show hostnames``: hosts come out in the order written,
duplicates kept; a range keeps the zero padding of its low bound (``[08-10]`` gives
``08 09 10``); several bracket groups in one host expand as a product, the first group
outermost (``r[1-2]n[1-2]`` gives ``r1n1 r1n2 r2n1 r2n2``); commas and whitespace
separate hosts outside brackets, commas separate ranges inside them.

``compress`` is the inverse in Slurm's host order (``sort_hosts``: prefixes in natural
order, then the numeric suffix, unique), like the node lists Slurm prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import product

MAX_HOSTS = 1 << 20  # refuse expressions that expand to more hosts than this

_SEPARATORS = frozenset(", \t\n\r")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)
_TRAILING_DIGITS = re.compile(r"\d+\Z", re.ASCII)
NatKey = tuple[tuple[int, int, str], ...]
_NAT_PARTS = re.compile(r"\d+|\D", re.ASCII | re.DOTALL)


def expand(expr: str) -> list[str]:
    """Host names of a hostlist expression, in Slurm's expansion order.

    Raises ``ValueError`` on malformed expressions (unbalanced or nested brackets,
    empty or non-numeric ranges, a low bound above the high bound, too many hosts).
    """
    hosts: list[str] = []
    for token in _split_hosts(expr):
        for host in _expand_token(token, expr):
            hosts.append(host)
            if len(hosts) > MAX_HOSTS:
                raise ValueError(f"hostlist {expr!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """Slurm-style ranged hostlist of these hosts, sorted and unique as ``sort_hosts``.

    Raises ``ValueError`` for a name that is empty or holds a separator or bracket.
    """
    ordered = sort_hosts(hosts)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        prefix, digits = _split_suffix(ordered[i])
        if digits is None:
            parts.append(ordered[i])
            i += 1
            continue
        group: list[str] = []
        while i < len(ordered):
            p, d = _split_suffix(ordered[i])
            if p != prefix or d is None:
                break
            group.append(d)
            i += 1
        ranges = _ranges(group)
        if len(ranges) == 1 and "-" not in ranges[0]:
            parts.append(prefix + ranges[0])
        else:
            parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def sort_hosts(hosts: Iterable[str]) -> list[str]:
    """Unique host names in Slurm's order (``hostlist_sort`` then ``hostlist_uniq``)."""
    unique = set()
    for host in hosts:
        _check_host(host)
        unique.add(host)
    return sorted(unique, key=host_sort_key)


def host_sort_key(host: str) -> tuple[NatKey, int, int, int, int, int]:
    """Sort key of one host name in Slurm's order.

    Prefixes compare naturally (digit runs as numbers); a name without a numeric
    suffix comes before the numbered ones of its prefix; numbers then compare by
    value, except that a zero-padded number sorts after the unpadded numbers with
    as many digits, as Slurm's width rules do (``n1 n2 n01 n10``).
    """
    prefix, digits = _split_suffix(host)
    nat = natural_key(prefix)
    if digits is None:
        return nat, 0, 0, 0, 0, 0
    value = int(digits)
    padded = int(len(digits) > 1 and digits[0] == "0")
    return nat, 1, len(str(value)), padded, value, len(digits)


def _split_hosts(expr: str) -> Iterator[str]:
    """Split at separators outside brackets, checking bracket balance."""
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise ValueError(f"hostlist {expr!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"hostlist {expr!r}: ']' without '[' at position {i}")
            depth = 0
        elif depth and ch in _SEPARATORS and ch != ",":
            raise ValueError(f"hostlist {expr!r}: whitespace inside brackets at position {i}")
        elif not depth and ch in _SEPARATORS:
            if i > start:
                yield expr[start:i]
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {expr!r}: unclosed '['")
    if len(expr) > start:
        yield expr[start:]


def _expand_token(token: str, expr: str) -> Iterator[str]:
    """Expand one host expression (no separators outside brackets) as a product."""
    pieces: list[list[str]] = []
    pos = 0
    while (open_at := token.find("[", pos)) >= 0:
        close_at = token.index("]", open_at)
        if open_at > pos:
            pieces.append([token[pos:open_at]])
        pieces.append(_expand_brackets(token[open_at + 1 : close_at], expr))
        pos = close_at + 1
    if pos < len(token):
        pieces.append([token[pos:]])
    count = 1
    for piece in pieces:
        count *= len(piece)
    if count > MAX_HOSTS:
        raise ValueError(f"hostlist {expr!r} expands to more than {MAX_HOSTS} hosts")
    for combo in product(*pieces):
        yield "".join(combo)


def _expand_brackets(body: str, expr: str) -> list[str]:
    """The numbers of one bracket body such as ``01-04,07``, as padded strings."""
    if not body:
        raise ValueError(f"hostlist {expr!r}: empty brackets")
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise ValueError(
                f"hostlist {expr!r}: bad range {item!r} (expected N or LO-HI, digits only)"
            )
        lo_str, hi_str = match.group(1), match.group(2)
        lo = int(lo_str)
        hi = lo if hi_str is None else int(hi_str)
        if hi < lo:
            raise ValueError(f"hostlist {expr!r}: range {item!r} goes down")
        if hi - lo + 1 > MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r}: range {item!r} has more than {MAX_HOSTS} hosts")
        width = len(lo_str)
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
        if len(out) > MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r} expands to more than {MAX_HOSTS} hosts")
    return out


def _ranges(group: list[str]) -> list[str]:
    """Slurm range strings for sorted numeric suffixes of one prefix."""
    out: list[str] = []
    i = 0
    while i < len(group):
        lo = group[i]
        width = len(lo)
        hi_value = int(lo)
        j = i + 1
        while j < len(group) and group[j] == f"{hi_value + 1:0{width}d}":
            hi_value += 1
            j += 1
        out.append(lo if j == i + 1 else f"{lo}-{hi_value:0{width}d}")
        i = j
    return out


def _split_suffix(host: str) -> tuple[str, str | None]:
    """``("gpu", "01")`` for ``gpu01``; ``(host, None)`` when it has no numeric suffix."""
    match = _TRAILING_DIGITS.search(host)
    if match is None:
        return host, None
    return host[: match.start()], match.group()


def natural_key(text: str) -> NatKey:
    """Natural order (``strnatcmp``): digit runs compare as numbers, other characters as such."""
    return tuple(
        (ord("0"), int(part), part) if "0" <= part[0] <= "9" else (ord(part), 0, "")
        for part in _NAT_PARTS.findall(text)
    )


def _check_host(host: str) -> None:
    if not host or any(ch in _SEPARATORS or ch in "[]" for ch in host):
        raise ValueError(f"not a host name: {host!r} (empty, or holds a separator or bracket)")
