"""A store holding the job telemetry of earlier runs of two job names (tests/_telemetry_truth.py
through the real ingest, summarized by ``build_job_telemetry``), for the profiles the live
loop learns from history (deployer/profiles.py, datasets/comm_profiles.py).

- ``bert``: 3 runs of user ``u`` on 4 GPUs of n1, activity 0.6, NVLink traffic;
- ``gpt``: 2 runs of user ``v`` on 8 GPUs of n2, activity 0.3, NVLink traffic;
each alone on its node for 600 s (2,400 GPU-seconds and more alone: enough for an estimate).
"""

from __future__ import annotations

from pathlib import Path

from linkwise.cluster.profiles import Calibration, CommProfile, load_calibration
from linkwise.datasets.comm_profiles import PROFILE_PREFIX
from linkwise.datasets.job_telemetry import build_job_telemetry
from linkwise.datasets.store import open_store
from linkwise.tests._telemetry_truth import INTERVAL_S, T0, TruthJob, fill_store

RUN_S, GAP_S = 600.0, 60.0
BERT = f"{PROFILE_PREFIX}name=bert"


def runs() -> list[TruthJob]:
    """The earlier runs (module docstring)."""
    out = []
    for k in range(3):
        start = T0 + 5.0 + k * (RUN_S + GAP_S)
        out.append(TruthJob(10 + k, start, start + RUN_S, {"n1": (0, 1, 2, 3)}, 0.6,
                            nvlink_tx=4e9, name="bert", user="u"))  # fmt: skip
        if k < 2:
            out.append(TruthJob(20 + k, start, start + RUN_S, {"n2": tuple(range(8))}, 0.3,
                                nvlink_tx=9e9, name="gpt", user="v"))  # fmt: skip
    return out


def fill_profile_store(path: Path) -> None:
    """The store at ``path`` with the runs' accounting, scrapes and job telemetry."""
    con = open_store(path)
    try:
        until = T0 + 3 * (RUN_S + GAP_S) + 4 * INTERVAL_S
        fill_store(con, runs(), nodes=["n1", "n2"], until=until)
        build_job_telemetry(con, interval_s=INTERVAL_S, now=0.0)
    finally:
        con.close()


def fitted() -> Calibration:
    """The shipped calibration with a fitted profile of ``bert`` (as a cluster fit names it),
    none of ``gpt``: a name the fit did not see."""
    shipped = load_calibration(None)
    profile = CommProfile(BERT, 0.5, 0.4, "test: fitted on the cluster's telemetry")
    return Calibration(
        {**shipped.profiles, BERT: profile}, shipped.alpha, shipped.overhead_s, shipped.mix
    )
