"""Start-up of ``linkwise serve``: seconds from launching the command to its first cycle.

Runs ``linkwise serve --mode shadow --policy backfill --max-cycles 1 --log-format json``
(the installed entry point, as an operator or systemd starts it) ``--runs`` times against a
running local Slurm (``scripts/local-slurm start``; its env file), each in a fresh temporary
store and state directory, and reads the first ``cycle`` event's time on stderr. Prints the
median, min and max, and the same to ``serve_start`` (the loop built, before the first
Slurm read).

    .venv/bin/python benchmarks/serve_startup.py [--slurm-env /tmp/linkwise-slurm/env]
        [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINKWISE = Path(sys.executable).with_name("linkwise")


def one_run(env_file: str) -> dict[str, float]:
    """Seconds from launch to ``serve_start`` and to the first ``cycle`` event."""
    with tempfile.TemporaryDirectory(prefix="lw-startup-") as tmp:
        cmd = [
            str(LINKWISE), "serve", "--mode", "shadow", "--partition", "gpu", "--policy",
            "backfill", "--slurm-env", env_file, "--db", f"{tmp}/store.duckdb", "--state-dir",
            f"{tmp}/state", "--lease-root", f"{tmp}/leases", "--max-cycles", "1",
            "--log-format", "json",
        ]  # fmt: skip
        launched = time.time()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    if run.returncode != 0:
        raise SystemExit(f"serve failed ({run.returncode}): {run.stderr[-2000:]}")
    found: dict[str, float] = {}
    for line in run.stderr.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        name = event.get("event")
        if name in ("serve_start", "cycle") and name not in found:
            found[name] = float(event["ts"]) - launched
    if "cycle" not in found:
        raise SystemExit(f"no cycle event in serve's log: {run.stderr[-2000:]}")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slurm-env", default="/tmp/linkwise-slurm/env")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = [one_run(args.slurm_env) for _ in range(args.runs)]
    out = {
        key: {
            "median_s": round(statistics.median(r[key] for r in runs), 2),
            "min_s": round(min(r[key] for r in runs), 2),
            "max_s": round(max(r[key] for r in runs), 2),
        }
        for key in ("serve_start", "cycle")
    }
    if args.json:
        print(json.dumps(out))
        return
    for key, s in out.items():
        print(
            f"to {key:11s}: median {s['median_s']:.2f} s (min {s['min_s']:.2f}, "
            f"max {s['max_s']:.2f}) over {args.runs} runs"
        )


if __name__ == "__main__":
    main()
