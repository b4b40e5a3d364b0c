"""``linkwise calibrate``: fit the contention model to the measurements in shared/data, write
it anywhere and print its diagnostics; and ``python -m linkwise.cli.calibrate`` (``main``),
which refits and writes, by default over the calibration shipped in ``cluster/data``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from linkwise.cli.common import EXIT_OK, add_command, add_json, default_data_dir


def cmd_calibrate(args: argparse.Namespace) -> int:
    # cluster.calibration imports scipy (about 1 s): only when the command runs
    from linkwise.cluster.calibration import fit_calibration, write_calibration

    data_dir = args.data or default_data_dir()
    if data_dir is None:
        raise ValueError("no data folder: pass --data PATH/TO/shared/data")
    cal = fit_calibration(data_dir)
    write_calibration(cal, args.out)
    summary = {
        "out": str(args.out),
        "profiles": sorted(cal.profiles),
        "alpha": cal.alpha,
        "fit": cal.fit,
    }
    print(json.dumps(summary, indent=None if args.json else 2, default=str))
    return EXIT_OK


def add_calibrate_parser(sub: Any) -> None:
    p = add_command(
        sub, "calibrate", help="fit the contention model to the measurements in shared/data"
    )
    p.add_argument("--data", type=Path, help="the shared/data folder (default: ../shared/data)")
    p.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    add_json(p, "compact JSON")
    p.set_defaults(func=cmd_calibrate)


def main(argv: Sequence[str] | None = None, *, printer: Callable[[str], None] = print) -> int:
    """Refit and write the calibration (default: the one shipped in cluster/data)."""
    # cluster.calibration imports scipy (about 1 s): only when the program runs
    from linkwise.cluster.calibration import (
        SHIPPED_CALIBRATION,
        fit_calibration,
        write_calibration,
    )

    parser = argparse.ArgumentParser(prog="python -m linkwise.cli.calibrate")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="shared/data")
    parser.add_argument(
        "--out",
        type=Path,
        default=SHIPPED_CALIBRATION,
        help="JSON to write (default: the shipped calibration)",
    )
    args = parser.parse_args(argv)
    cal = fit_calibration(args.data)
    write_calibration(cal, args.out)
    printer(f"wrote {args.out}: alpha={cal.alpha:.4g} overhead_s={cal.overhead_s:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
