"""A running pair of jobs whose telemetry is known, for the drift of the contention model
(deployer/drift.py), stored through the real ingest (tests/_telemetry_truth.py).

The cluster: nodes gpu1..gpu3 of 8 GPUs, scraped every 30 s from B.
- job 1: GPUs 0-3 of gpu1 and gpu2 from B+10, running: activity 0.5, 0.4 in the last 300 s;
  alone until job 2 starts;
- job 2: GPUs 4-7 of gpu2 and 0-3 of gpu3 from B+610, running: never alone;
- job 99: running in Slurm, not in the accounting yet.
"""

from __future__ import annotations

import duckdb

from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.comm_profiles import LearnedProfile, ProfileBook
from linkwise.tests._telemetry_truth import INTERVAL_S, TruthJob, fill_store

B = 1.75e9
NOW = B + 1500.0
TOPO = from_spec("3x8")
NODES = [n.name for n in TOPO.nodes]
ALONE, SLOWED = 0.5, 0.4


def truth_jobs(base: float = B, now: float = NOW) -> list[TruthJob]:
    """The scenario's running jobs (module docstring) from ``base``, slowed before ``now``."""
    recent = {(n, ts): SLOWED for n in NODES[:2] for ts in scrapes(base, now - 300.0, now)}
    return [
        TruthJob(1, base + 10, now + 1e4, {NODES[0]: (0, 1, 2, 3), NODES[1]: (0, 1, 2, 3)},
                 ALONE, name="j1", bad=recent),
        TruthJob(2, base + 610, now + 1e4, {NODES[1]: (4, 5, 6, 7), NODES[2]: (0, 1, 2, 3)},
                 0.8, name="j2"),
    ]  # fmt: skip


def scrapes(base: float, lo: float, hi: float) -> list[float]:
    """The scrape times (every ``INTERVAL_S`` from ``base``) in [lo, hi)."""
    times = (base + k * INTERVAL_S for k in range(int((hi - base) // INTERVAL_S) + 1))
    return [t for t in times if lo <= t < hi]


def fill(
    con: duckdb.DuckDBPyConnection, *, labelled: bool, base: float = B, now: float = NOW
) -> None:
    """The two running jobs' accounting and every scrape from ``base`` before ``now``."""
    fill_store(
        con, truth_jobs(base, now), nodes=NODES, until=now - 1.0, labelled=labelled,
        start=base, running={1, 2},
    )  # fmt: skip


def calibration() -> Calibration:
    profiles = {
        f"history:name={n}": CommProfile(f"history:name={n}", 0.1, 1.0, "test")
        for n in ("j1", "j2")
    }
    return Calibration(profiles, 0.3, 0.002, {k: 0.5 for k in profiles}, "test fit")


def book(names: tuple[str, ...] = ("j1", "j2")) -> ProfileBook:
    """A profile book that learned ``names`` from earlier runs (by name; the running jobs'
    own runs have not ended, so the store's book holds none of them)."""
    cal = calibration()
    by_name = {
        n: LearnedProfile(cal.profiles[f"history:name={n}"], "name", n, 3, 0.1, 10.0, 0.0, 0.0,
                          None, None)
        for n in names
    }  # fmt: skip
    return ProfileBook(by_name, {}, 3, 3, 3, 1.0, 1.0, 1)
