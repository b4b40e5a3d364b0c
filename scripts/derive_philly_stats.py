"""Derive the embedded workload statistics from the real Philly trace slice.

Run from the repository root: ``.venv/bin/python scripts/derive_philly_stats.py``. Writes
``datasets/data/philly_stats.json`` (figures only, no rows); ``tests/datasets/test_synthetic.py``
checks that the shipped file is what this produces.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from linkwise.datasets.synthetic import derive_stats
from linkwise.datasets.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
OUT = ROOT / "datasets" / "data" / "philly_stats.json"


def main() -> None:
    """Read the trace, derive the statistics, write them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    stats = derive_stats(load_trace(args.trace, "philly"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
