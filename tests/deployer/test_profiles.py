"""A live job's communication profile learned from the telemetry of earlier runs
(deployer/profiles.py over datasets/comm_profiles.py), on a real DuckDB store
(tests/_profile_runs.py): declared, else learned where the calibration in use holds the
learned profile, else declared by an earlier run, else the default; never a profile the
calibration does not know."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.datasets.comm_profiles import ProfileBook, load_profile_book
from linkwise.datasets.store import open_store
from linkwise.deployer.profiles import (
    LearnedBook,
    default_profile,
    resolve_profiles,
    source_counts,
)
from linkwise.deployer.recorder import Recorder
from linkwise.tests._profile_runs import BERT, fill_profile_store, fitted

LOG = logging.getLogger("test.profiles")


def qjob(job_id: int, name: str, user: str, gpus: int, comment: str = "") -> QueuedJob:
    return QueuedJob(
        job_id=job_id, name=name, user=user, partition="gpu", state="PENDING",
        reason="Priority", submit_time=1.0, start_time=None, time_limit_s=3600.0,
        num_nodes=1, gpus=gpus, nodes=(), held=False, comment=comment,
    )  # fmt: skip


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("learned") / "store.duckdb"
    fill_profile_store(path)
    return path


@pytest.fixture(scope="module")
def book(db: Path) -> ProfileBook:
    con = open_store(db)
    try:
        return load_profile_book(con)
    finally:
        con.close()


def test_declared_then_learned_then_history_then_default(book: ProfileBook) -> None:
    cal = fitted()
    queue = [
        qjob(1, "bert", "u", 4, "linkwise:profile=ncf"),  # declared wins
        qjob(2, "bert", "u", 4),  # learned by name, before the earlier run's declaration
        qjob(3, "gpt", "v", 8),  # learned, but the calibration holds no gpt: history
        qjob(4, "new", "w", 2),  # nothing: the default
        qjob(5, "bert", "x", 2, "linkwise:profile=nosuch"),  # unknown declared: learned
        qjob(6, "new", "v", 8),  # user v's 8-GPU shape is learned, not in the calibration
    ]
    history = {("u", "bert"): "ncf", ("v", "gpt"): "yolov3"}
    got = resolve_profiles(queue, cal, history, book=book)
    assert {j: (r.profile, r.source) for j, r in got.items()} == {
        1: ("ncf", "declared"),
        2: (BERT, "learned"),
        3: ("yolov3", "history"),
        4: (default_profile(4, cal), "default"),
        5: (BERT, "learned"),
        6: (default_profile(6, cal), "default"),
    }
    assert got[5].note == "unknown declared profile 'nosuch'"
    assert all(r.profile in cal.profiles for r in got.values())  # never unknown
    assert source_counts(got) == {"declared": 1, "learned": 2, "history": 1, "default": 2}
    # the shipped calibration holds no learned profile: the book changes nothing
    shipped = load_calibration(None)
    plain = resolve_profiles(queue, shipped, history, book=book)
    assert plain == resolve_profiles(queue, shipped, history)
    assert source_counts(plain)["learned"] == 0
    # a calibration that holds the user-and-GPUs profile gets it for job 6
    extended = fitted()
    shape = book.by_shape[("v", 8)].profile
    extended = type(extended)(
        {**extended.profiles, shape.name: shape}, extended.alpha, extended.overhead_s,
        extended.mix,
    )  # fmt: skip
    assert resolve_profiles([queue[5]], extended, book=book)[6].profile == shape.name


def test_the_loop_learns_the_book_from_the_store_only_for_a_calibration_that_can_use_it(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Any] = []
    recorder = Recorder(str(db), tmp_path / "spool.jsonl", logger=LOG)
    real = recorder.read
    monkeypatch.setattr(recorder, "read", lambda fn: reads.append(fn) or real(fn))
    learned = LearnedBook(recorder, "c", ttl_s=600.0)
    assert learned.get(0.0, load_calibration(None)) is None and not reads  # nothing read
    book = learned.get(1.0, fitted())
    assert book is not None and set(book.by_name) == {"bert", "gpt"} and len(reads) == 1
    assert learned.get(500.0, fitted()) is book and len(reads) == 1  # within the ttl
    assert learned.get(601.0, fitted()) is not None and len(reads) == 2
    # another cluster's store: an empty book, no profile learned
    other = LearnedBook(recorder, "elsewhere").get(0.0, fitted())
    assert other is not None and other.profiles == ()
    # a store that cannot be read keeps the last book (none yet: nothing learned)
    (tmp_path / "a-file").write_text("")
    unreadable = Recorder(str(tmp_path / "a-file" / "s.duckdb"), tmp_path / "s2", logger=LOG)
    broken = LearnedBook(unreadable, "c")
    assert broken.get(0.0, fitted()) is None
