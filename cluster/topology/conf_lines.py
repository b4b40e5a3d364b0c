"""Slurm-style configuration lines (slurm.conf, topology.conf, ``scontrol show topology``)
as ``Key=Value`` pairs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)')


def conf_lines(
    text: str, what: str, strict: frozenset[str] | None = None
) -> Iterable[tuple[int, list[tuple[str, str]]]]:
    """Slurm-style config lines as ``(line number, [(lower-case key, value), ...])``.

    Comments (``#``) and blank lines are skipped, ``\\`` at the end of a line joins the
    next one, ``Include`` lines are skipped (the caller passes texts, not paths). A line
    that does not parse raises, unless ``strict`` is given and its key is not in it.
    """
    pending = ""
    start = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line or line.lower().startswith("include "):
            continue
        pairs: list[tuple[str, str]] = []
        pos = 0
        for match in _PAIR.finditer(line):
            if line[pos : match.start()].strip():
                break
            pairs.append((match.group(1).lower(), match.group(2).strip('"')))
            pos = match.end()
        if not pairs or line[pos:].strip():
            first = line.split("=", 1)[0].strip().lower()
            if strict is not None and first not in strict:
                continue
            raise ValueError(f"{what} line {start}: cannot parse {line!r} (expected Key=Value ...)")
        yield start, pairs
