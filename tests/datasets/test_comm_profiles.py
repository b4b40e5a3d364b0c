"""Communication profiles learned from history (datasets/comm_profiles.py): runs of two job
names whose true profiles (compute seconds, gradient GB) drive what the exporters print,
under the analytic model's ring all-reduce, through the real ingest into a DuckDB store; the
learned profiles recover the gradient per compute second and the slowdown under sharing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pytest

from linkwise.cluster.contention import ring_iteration_time, sharing_penalty
from linkwise.cluster.domain import Job
from linkwise.cluster.profiles import CommProfile, assign_profiles, load_calibration
from linkwise.datasets.comm_profiles import (
    EMPTY_BOOK,
    PROFILE_PREFIX,
    apply_history,
    extend_calibration,
    load_profile_book,
    lookup,
)
from linkwise.datasets.job_telemetry import build_job_telemetry
from linkwise.datasets.store import open_store
from linkwise.tests._telemetry_truth import INTERVAL_S, T0, TruthJob, fill_store

INTRA, NIC = 150.0, 12.5  # GB/s
TRUTH = {
    "bert": CommProfile("bert", 0.6, 0.8),
    "gpt": CommProfile("gpt", 0.2, 3.7),
}
SHAPES = ((2, 1), (8, 1), (16, 2), (8, 1), (16, 2))  # (GPUs, nodes) of the 5 runs
RUN_S, GAP_S = 600.0, 60.0


def _run(
    job_id: int, name: str, k: int, nodes: tuple[str, ...], gpus: int, noise: float
) -> TruthJob:
    prof = TRUTH[name]
    n = len(nodes)
    bw = INTRA if n == 1 else min(INTRA, NIC)
    t = ring_iteration_time(prof, gpus, n, bw, 0.0)
    ring = 2.0 * (gpus - 1) / gpus * prof.grad_gb * 1e9 / t  # bytes/s each GPU sends
    per_node = gpus // n
    start = T0 + 5.0 + k * (RUN_S + GAP_S)
    return TruthJob(
        job_id,
        start,
        start + RUN_S,
        {node: tuple(range(per_node)) for node in nodes},
        activity=prof.compute_s / t * noise,
        nvlink_tx=ring if n == 1 else ring * (per_node - 1) / per_node,
        nic_tx=ring if n > 1 else 0.0,
        name=name,
    )


def _truth_jobs() -> list[TruthJob]:
    rng = np.random.default_rng(7)
    jobs = []
    for k, (gpus, n) in enumerate(SHAPES):
        for i, (name, nodes) in enumerate((("bert", ("n1", "n2")), ("gpt", ("n3", "n4")))):
            noise = float(rng.uniform(0.95, 1.0))  # activity stays a ratio
            jobs.append(_run(100 * (i + 1) + k, name, k, nodes[:n], gpus, noise))
    return jobs


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    con = open_store(tmp_path_factory.mktemp("profiles") / "store.duckdb")
    until = T0 + len(SHAPES) * (RUN_S + GAP_S) + 4 * INTERVAL_S
    fill_store(con, _truth_jobs(), nodes=["n1", "n2", "n3", "n4"], until=until)
    build_job_telemetry(con, interval_s=INTERVAL_S, now=0.0)
    yield con
    con.close()


def _slowdown(prof: CommProfile, gpus: int, nodes: int, k: int) -> float:
    """The analytic model's slowdown of a split ring sharing its NIC with k - 1 others."""
    alpha = load_calibration().alpha
    alone = ring_iteration_time(prof, gpus, nodes, min(INTRA, NIC), 0.0)
    shared = ring_iteration_time(prof, gpus, nodes, NIC / sharing_penalty(k, alpha), 0.0)
    return shared / alone


def test_profiles_recover_the_truth_within_tolerance(store: duckdb.DuckDBPyConnection) -> None:
    book = load_profile_book(store, min_runs=5)
    assert set(book.by_name) == {"bert", "gpt"}
    assert book.runs_used == 10 and book.runs_with_telemetry == 10
    for name, truth in TRUTH.items():
        learned = book.by_name[name]
        assert learned.runs == 5
        assert learned.profile.name == f"{PROFILE_PREFIX}name={name}"
        # the gradient per compute second does not depend on the placement: within 5%
        assert learned.rho_gb == pytest.approx(truth.grad_gb / truth.compute_s, rel=0.05)
        assert learned.rho_spread < 0.05 and learned.activity_spread < 0.5
        # what the simulator does with it: the slowdown under 2- and 4-way sharing, within 3%
        for k in (2, 4):
            assert _slowdown(learned.profile, 16, 2, k) == pytest.approx(
                _slowdown(truth, 16, 2, k), rel=0.03
            )
        assert 0.0 < learned.sensitivity < 1.0


def test_too_few_runs_give_no_profile_and_until_keeps_to_earlier_runs(
    store: duckdb.DuckDBPyConnection,
) -> None:
    assert load_profile_book(store, min_runs=6).profiles == ()
    # runs ended before the third round: two of each name
    until = T0 + 2 * (RUN_S + GAP_S) + RUN_S
    early = load_profile_book(store, until=until, min_runs=1)
    assert early.by_name["bert"].runs == 2


def test_history_profiles_where_they_exist_the_default_mix_elsewhere(
    store: duckdb.DuckDBPyConnection,
) -> None:
    book = load_profile_book(store, min_runs=3)
    cal = load_calibration()
    jobs = [
        Job(1, 0.0, 8, 100.0, name="bert", user="v"),
        Job(2, 0.0, 8, 100.0, name="other", user="u"),  # user u's 16-GPU shape has runs
        Job(3, 0.0, 16, 100.0, name="other", user="u"),
        Job(4, 0.0, 4, 100.0, name="new", user="w"),
        Job(5, 0.0, 4, 100.0, profile="bert", name="gpt"),
    ]
    out, extended, counts = apply_history(jobs, cal, book)
    assert (counts.history_name, counts.history_shape, counts.default, counts.declared) == (
        1,
        2,
        1,
        1,
    )
    assert out[0].profile == f"{PROFILE_PREFIX}name=bert"
    assert out[1].profile == f"{PROFILE_PREFIX}user=u,gpus=8"
    assert out[3].profile == "" and out[4].profile == "bert"
    assert "jobs from history" in counts.line()
    # the simulator's assignment keeps them and draws the rest as before
    drawn = assign_profiles(out, extended, seed=3)
    plain = assign_profiles(jobs, cal, seed=3)
    assert drawn[3].profile == plain[3].profile
    assert all(extended.profiles[j.profile] for j in drawn)
    assert lookup(book, "", "nobody", 8) is None


def test_a_fitted_calibrations_own_profiles_stay_beside_the_book(
    store: duckdb.DuckDBPyConnection,
) -> None:
    # a fitted calibration names its profiles as the book does, but in its own time unit
    # (paired with its overhead): the book adds what it lacks and replaces nothing
    book = load_profile_book(store, min_runs=3)
    name = f"{PROFILE_PREFIX}name=bert"
    assert book.by_name["bert"].profile.name == name
    fitted = CommProfile(name, 7.5, 40.0, "fitted (test)")
    shipped = load_calibration()
    cal = replace(shipped, profiles={**shipped.profiles, name: fitted}, overhead_s=0.3)
    extended = extend_calibration(cal, book)
    assert extended.profiles[name] == fitted
    assert f"{PROFILE_PREFIX}name=gpt" in extended.profiles
    assert extended.overhead_s == 0.3 and extended.mix == cal.mix


def test_an_empty_book_changes_nothing() -> None:
    cal = load_calibration()
    jobs = [Job(1, 0.0, 8, 100.0, name="bert")]
    out, same, counts = apply_history(jobs, cal, EMPTY_BOOK)
    assert out == tuple(jobs) and same is cal and counts.default == 1


def test_no_telemetry_learns_nothing(tmp_path: Path) -> None:
    con = open_store(tmp_path / "empty.duckdb")
    book = load_profile_book(con)
    assert book.profiles == () and book.runs_summarized == 0 and book.job_hours == 0.0
    con.close()


def test_a_lookup_limited_to_a_calibrations_names_never_gives_an_unknown_profile(
    store: duckdb.DuckDBPyConnection,
) -> None:
    """With ``known`` (a calibration's profile names: the live loop cannot extend its
    policy's calibration), a learned name the calibration lacks falls to the user-and-GPUs
    profile where the calibration holds it, else to none."""
    book = load_profile_book(store, min_runs=3)
    shipped = load_calibration()
    name = f"{PROFILE_PREFIX}name=bert"
    cal = replace(shipped, profiles={**shipped.profiles, name: CommProfile(name, 0.1, 4.5)})
    assert lookup(book, "bert", "u", 16, cal.profiles) is book.by_name["bert"]
    assert lookup(book, "gpt", "u", 16, cal.profiles) is None
    shape = book.by_shape[("u", 16)]
    with_shape = {*cal.profiles, shape.profile.name}
    assert lookup(book, "gpt", "u", 16, with_shape) is shape
    assert lookup(book, "gpt", "u", 16) is book.by_name["gpt"]  # unlimited: by name
