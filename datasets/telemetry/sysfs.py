"""InfiniBand counters read from ``/sys/class/infiniband`` as samples."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from linkwise.datasets.telemetry.samples import samples_frame
from linkwise.datasets.telemetry.scrape import ScrapeError


@dataclass(frozen=True, slots=True)
class SysfsReading:
    """Counters read from /sys/class/infiniband as samples, plus the unsupported ones."""

    samples: pl.DataFrame
    unsupported: int
    ports: int


_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def read_sysfs(root: str | Path, *, host: str, ts: float | None = None) -> SysfsReading:
    """Read every HCA port's counters under ``root`` (a sysfs mount such as ``/sys``, or the
    ``class/infiniband`` folder itself). "N/A (no PMA)" values are counted, not stored."""
    base = Path(root)
    if (base / "class" / "infiniband").is_dir():
        base = base / "class" / "infiniband"
    if not base.is_dir():
        raise ScrapeError(f"{root}: no InfiniBand sysfs tree")
    now = time.time() if ts is None else ts
    metrics: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    unsupported = 0
    ports = 0
    for port_dir in sorted(base.glob("*/ports/*")):
        if not port_dir.is_dir():
            continue
        ports += 1
        device, port = port_dir.parent.parent.name, port_dir.name
        link_layer = _read_text(port_dir / "link_layer") or "InfiniBand"
        lbl = json.dumps({"device": device, "port": port, "link_layer": link_layer})
        rate = _RATE_RE.match(_read_text(port_dir / "rate") or "")
        if rate:
            metrics.append("ib_sysfs_rate_bytes_per_second")
            labels.append(lbl)
            values.append(float(rate.group(1)) * 1e9 / 8)
        for group in ("counters", "counters_ext"):
            for f in sorted((port_dir / group).glob("*")):
                raw = _read_text(f)
                try:
                    value = float(int(raw or ""))
                except ValueError:
                    unsupported += 1
                    continue
                metrics.append(f"ib_sysfs_{f.name}")
                labels.append(lbl)
                values.append(value)
    samples = samples_frame(now, host, metrics, labels, values)
    return SysfsReading(samples=samples, unsupported=unsupported, ports=ports)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError as exc:
        raise ScrapeError(f"{path}: {exc}") from exc
