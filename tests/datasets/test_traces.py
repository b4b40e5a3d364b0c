"""Trace loaders: the real Philly slice, one fixture per format with malformed rows, detection."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from linkwise.cluster.domain import Job
from linkwise.datasets.trace_formats.tables import TraceFormatError
from linkwise.datasets.traces import RejectedRow, Trace, detect_format, load_trace, write_native

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"


def _epoch(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _rejections(trace: Trace) -> dict[int, str]:
    return {r.line: r.reason for r in trace.rejected}


# --------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def philly() -> Trace:
    return load_trace(PHILLY)


def test_real_philly_slice_loads_every_job(philly: Trace) -> None:
    assert philly.format == "philly"
    assert len(philly.jobs) == 30_065
    assert sum(j.num_gpus > 1 for j in philly.jobs) == 1_392
    assert philly.rejected == ()
    assert philly.jobs[0].submit_time == 0.0
    assert philly.origin_epoch == _epoch("2017-09-04 10:30:41")
    first = philly.jobs[0]
    assert (first.job_id, first.num_gpus, first.duration, first.user) == (
        0,
        8,
        2240194.0,
        "vc:7f04ca",
    )
    times = [(j.submit_time, j.job_id) for j in philly.jobs]
    assert times == sorted(times)
    assert len({j.job_id for j in philly.jobs}) == len(philly.jobs)
    summary = philly.summary()
    assert summary["jobs"] == 30_065 and summary["multi_gpu_jobs"] == 1_392
    assert summary["rejected"] == 0 and summary["rejected_by_reason"] == {}


def test_real_philly_gpu_time_is_consistent(philly: Trace) -> None:
    raw = pl.read_csv(PHILLY)
    by_id = {j.job_id: j for j in philly.jobs}
    sample = raw.with_row_index("i").gather_every(997)
    for i, duration, gpus, gpu_time in sample.select(
        "i", "duration", "num_gpus", "gpu_time"
    ).iter_rows():
        job = by_id[i]
        assert (job.duration, job.num_gpus) == (duration, gpus)
        assert job.duration * job.num_gpus == pytest.approx(gpu_time)


def test_max_jobs_keeps_the_earliest_and_counts_the_rest(philly: Trace) -> None:
    head = load_trace(PHILLY, "philly", max_jobs=100)
    assert head.jobs == philly.jobs[:100]
    assert head.summary()["notes"] == {"beyond_max_jobs": 29_965}
    with pytest.raises(ValueError, match="max_jobs"):
        load_trace(PHILLY, max_jobs=0)


# --------------------------------------------------------------------------- native


NATIVE_LINES = [
    "job_id,submit_time,num_gpus,duration,model,user,name",
    "1,100,2,50,resnet50,alice,a",  # 2 ok
    "2,90,1,30,,bob,b",  # 3 ok, earliest
    "3,abc,1,30,,,",  # 4 non-numeric submit_time
    "",  # 5 blank: not a row
    "4,110,0,30,,,",  # 6 no GPUs
    "5,120,1,-3,,,",  # 7 duration <= 0
    "1,130,1,10,,,",  # 8 duplicate job_id
    "6,140,1.5,10,,,",  # 9 non-integer GPU count
    "7,-5,1,10,,,",  # 10 negative time
    "8,150,1",  # 11 too few fields
    "9,160,4,20,,,",  # 12 ok
    ",170,1,20,,,",  # 13 missing job_id
    "10,180,1,nan,,,",  # 14 not a finite duration
]


def test_native_csv_rejects_each_bad_row_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobs.csv", NATIVE_LINES)
    trace = load_trace(path)
    assert trace.format == "native"
    assert trace.jobs == (
        Job(2, 0.0, 1, 30.0, profile="", user="bob", name="b"),
        Job(1, 10.0, 2, 50.0, profile="resnet50", user="alice", name="a"),
        Job(9, 70.0, 4, 20.0),
    )
    assert trace.origin_epoch == 90.0
    assert _rejections(trace) == {
        4: "non-numeric submit_time",
        6: "no GPUs",
        7: "duration <= 0",
        8: "duplicate job_id",
        9: "non-integer GPU count",
        10: "negative time",
        11: "wrong number of fields",
        13: "missing job_id",
        14: "non-numeric duration",
    }
    bad = next(r for r in trace.rejected if r.line == 8)
    assert bad == RejectedRow(str(path), 8, "duplicate job_id", "1,130,1,10,,,")
    summary = trace.summary()
    assert summary["rejected"] == 9
    assert summary["rejected_by_reason"] == {reason: 1 for reason in _rejections(trace).values()}


def test_native_round_trip_csv_and_parquet(tmp_path: Path) -> None:
    jobs = (
        Job(0, 0.0, 1, 0.1 + 0.2, profile="bert", user="a,b", name='say "hi"'),
        Job(7, 12.5, 8, 3600.0),
        Job(3, 12.5, 16, 1e6, profile="moe", user="u", name="n"),
    )
    for name in ("out.csv", "out.parquet"):
        path = tmp_path / name
        write_native(jobs, path)
        trace = load_trace(path)
        assert trace.format == "native"
        assert trace.jobs == (jobs[0], jobs[2], jobs[1])  # sorted by (submit, job_id)
        assert trace.rejected == ()
    with pytest.raises(ValueError, match=r"\.csv"):
        write_native(jobs, tmp_path / "out.json")


def test_native_parquet_rejects_with_row_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pl.DataFrame(
        {
            "job_id": [1, 2, 3],
            "submit_time": [5.0, 6.0, None],
            "num_gpus": [1, -2, 1],
            "duration": [10.0, 10.0, 10.0],
        }
    ).write_parquet(path)
    trace = load_trace(path)
    assert [j.job_id for j in trace.jobs] == [1]
    assert _rejections(trace) == {2: "negative GPU count", 3: "missing submit_time"}
    assert trace.rejected[0].raw == "2,6.0,-2,10.0"


# --------------------------------------------------------------------------- philly


def test_philly_fixture(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "philly.csv",
        [
            "timestamp,duration,num_gpus,gpu_time,cluster",
            "2017-09-04 10:30:41,100.0,8,800.0,7f04ca",  # 2 ok, id 0
            "2017-09-04 10:31:00,abc,1,1,6214e9",  # 3 non-numeric duration
            "not-a-date,10,1,10,6214e9",  # 4 bad timestamp
            "2017-09-04 10:32:00,10,0,0,6214e9",  # 5 no GPUs
            "2017-09-04 10:29:41,50,2,100,6214e9",  # 6 ok, id 4, earliest
            ",50,2,100,6214e9",  # 7 missing timestamp
        ],
    )
    trace = load_trace(path)
    assert trace.format == "philly"
    assert trace.jobs == (
        Job(4, 0.0, 2, 50.0, user="vc:6214e9"),
        Job(0, 60.0, 8, 100.0, user="vc:7f04ca"),
    )
    assert trace.origin_epoch == _epoch("2017-09-04 10:29:41")
    assert _rejections(trace) == {
        3: "non-numeric duration",
        4: "bad timestamp",
        5: "no GPUs",
        7: "missing timestamp",
    }


# --------------------------------------------------------------------------- helios

HELIOS_HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue"
)


def test_helios_fixture(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "cluster_log.csv",
        [
            HELIOS_HEADER,
            "10,u1,vcA,8,64,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:00:05,"
            "2020-04-01 01:00:05,3600,5",  # 2 ok
            "11,u2,vcA,0,4,1,COMPLETED,2020-04-01 00:01:00,,,100,0",  # 3 CPU job
            "12,u2,vcB,1,4,1,CANCELLED,2020-04-01 00:02:00,,,0,0",  # 4 duration 0
            "13,u3,vcB,2,8,1,COMPLETED,garbage,,,50,0",  # 5 bad submit time
            "14,u3,vcB,2,8,1,COMPLETED,1585699320,,,50,0",  # 6 ok, epoch seconds
            "15,u3,vcB,,8,1,COMPLETED,2020-04-01 00:03:00,,,50,0",  # 7 missing gpu_num
            "16,u4,vcB,4,8,1,COMPLETED,2020-04-01 00:04:00,,,50",  # 8 too few fields
        ],
    )
    trace = load_trace(path)
    assert trace.format == "helios"
    assert trace.jobs == (Job(10, 0.0, 8, 3600.0, user="u1"), Job(14, 120.0, 2, 50.0, user="u3"))
    assert trace.origin_epoch == _epoch("2020-04-01 00:00:00")
    assert _rejections(trace) == {
        3: "no GPUs",
        4: "duration <= 0",
        5: "bad submit_time",
        7: "missing gpu_num",
        8: "wrong number of fields",
    }
    assert trace.summary()["rejected_by_reason"]["no GPUs"] == 1


def test_helios_string_ids_become_row_order(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "acme.csv",
        [
            HELIOS_HEADER,
            "dlc-a,u1,vc,1,4,1,COMPLETED,2023-05-01 00:00:10,,,30,0",
            "dlc-b,u1,vc,2,4,1,COMPLETED,2023-05-01 00:00:00,,,40,0",
        ],
    )
    trace = load_trace(path, "helios")
    assert trace.jobs == (
        Job(1, 0.0, 2, 40.0, user="u1", name="dlc-b"),
        Job(0, 10.0, 1, 30.0, user="u1", name="dlc-a"),
    )


# --------------------------------------------------------------------------- alibaba


def test_alibaba_fixture(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "openb_pod_list_default.csv",
        [
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time",
            "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0",  # 2 ok
            "openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061",  # 3 shared GPU
            "openb-pod-0002,8000,30517,1,320,,BE,Pending,10020010,10020025,",  # 4 never scheduled
            "openb-pod-0003,4000,1000,0,0,,BE,Succeeded,100,200,110",  # 5 CPU pod
            "openb-pod-0004,4000,1000,8,1000,,LS,Succeeded,500,400,600",  # 6 deleted first
            "openb-pod-0005,88000,327680,8,1000,,LS,Succeeded,50,1050,60",  # 7 ok
            "openb-pod-0006,88000,327680,2,1000,,LS,Succeeded,x,1050,60",  # 8 bad creation
        ],
    )
    trace = load_trace(path)
    assert trace.format == "alibaba"
    assert trace.jobs == (
        Job(0, 0.0, 1, 12537496.0, name="openb-pod-0000"),
        Job(5, 50.0, 8, 990.0, name="openb-pod-0005"),
        Job(1, 427061.0, 1, 12902960.0 - 427061.0, name="openb-pod-0001"),
    )
    assert trace.origin_epoch is None
    assert _rejections(trace) == {
        4: "never scheduled",
        5: "no GPUs",
        6: "duration <= 0",
        8: "non-numeric creation_time",
    }
    assert trace.summary()["notes"] == {"fractional_gpu": 1}


# --------------------------------------------------------------------------- swf


def test_swf_fixture(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "cluster.swf",
        [
            "; Version: 2.2",
            "; UnixStartTime: 1000000000",
            ";",
            "1 0 5 100 4 -1 -1 4 200 -1 1 1 1 -1 1 -1 -1 -1",  # 4 ok
            "2 10 5 -1 4 -1 -1 4 200 -1 1 1 1 -1 1 -1 -1 -1",  # 5 unknown run time
            "  3   20 5 50 -1 -1 -1 2 200 -1 1 2 1 -1 1 -1 -1 -1",  # 6 ok, requested procs
            "4 30 5 50 -1 -1 -1 -1 200 -1 1 2 1 -1 1 -1 -1 -1",  # 7 unknown processors
            "5 40 5 50 2",  # 8 too few fields
            "6 x 5 50 2 -1 -1 2 200 -1 1 2 1 -1 1 -1 -1 -1",  # 9 bad submit time
            "7 -1 5 50 2 -1 -1 2 200 -1 1 2 1 -1 1 -1 -1 -1",  # 10 unknown submit time
            "8 50 5 0 2 -1 -1 2 200 -1 1 2 1 -1 1 -1 -1 -1",  # 11 zero run time
        ],
    )
    trace = load_trace(path)
    assert trace.format == "swf"
    assert trace.jobs == (Job(1, 0.0, 4, 100.0, user="u1"), Job(3, 20.0, 2, 50.0, user="u2"))
    assert trace.origin_epoch == 1_000_000_000.0
    assert _rejections(trace) == {
        5: "unknown run time",
        7: "unknown processor count",
        8: "wrong number of fields",
        9: "non-numeric submit time",
        10: "unknown submit time",
        11: "duration <= 0",
    }
    assert trace.rejected[0].raw == "2 10 5 -1 4 -1 -1 4 200 -1 1 1 1 -1 1 -1 -1 -1"


# --------------------------------------------------------------------------- detection


def test_detection_by_header_and_extension(tmp_path: Path) -> None:
    assert detect_format(PHILLY) == "philly"
    assert detect_format(_write(tmp_path, "a.csv", NATIVE_LINES)) == "native"
    assert detect_format(_write(tmp_path, "h.csv", [HELIOS_HEADER])) == "helios"
    headless = _write(tmp_path, "trace.txt", ["1 0 5 100 4 -1 -1 4 200 -1 1 1 1 -1 1 -1 -1 -1"])
    assert detect_format(headless) == "swf"
    assert load_trace(headless).jobs == (Job(1, 0.0, 4, 100.0, user="u1"),)


def test_wrong_format_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"not a helios trace: missing columns \['job_id'"):
        load_trace(PHILLY, "helios")
    with pytest.raises(TraceFormatError, match="not an SWF trace"):
        load_trace(_write(tmp_path, "native.swf", NATIVE_LINES[1:3]), "swf")
    unknown = _write(tmp_path, "other.csv", ["a,b,c", "1,2,3"])
    with pytest.raises(TraceFormatError, match="match none of"):
        load_trace(unknown)
    with pytest.raises(TraceFormatError, match="cannot detect"):
        load_trace(_write(tmp_path, "prose.txt", ["hello world"]))
    with pytest.raises(TraceFormatError, match="empty"):
        load_trace(_write(tmp_path, "empty.csv", [""]))
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(PHILLY, "slurm")


def test_a_file_without_valid_jobs_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "none.csv", [NATIVE_LINES[0], "1,0,0,10,,,", "2,0,1,-1,,,"])
    with pytest.raises(TraceFormatError, match="no valid jobs"):
        load_trace(path)
    header_only = _write(tmp_path, "header.csv", [NATIVE_LINES[0]])
    with pytest.raises(TraceFormatError, match="no valid jobs"):
        load_trace(header_only)


# --------------------------------------------------------------------------- hostile files


def test_a_huge_header_line_is_refused_without_reading_the_file_whole(tmp_path: Path) -> None:
    import resource

    from linkwise.datasets.trace_formats.tables import MAX_LINE_BYTES

    path = tmp_path / "huge.csv"
    with path.open("wb") as f:
        f.write(b"job_id,submit_time,num_gpus,duration,")
        chunk = b"x" * (1 << 20)
        for _ in range(64):  # a 64 MiB header line
            f.write(chunk)
        f.write(b"\n1,0,1,10\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TraceFormatError, match=r"line 1 is longer than"):
        load_trace(path)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 32 * 1024  # far less than the file
    long_row = tmp_path / "row.csv"
    long_row.write_text(
        "job_id,submit_time,num_gpus,duration\n1,0,1,10\n2,0,1," + "9" * (MAX_LINE_BYTES + 5) + "\n"
    )
    with pytest.raises(TraceFormatError, match=r"line 3 is longer than"):
        load_trace(long_row, "native")


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"is a directory, not a trace file"):
        load_trace(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_trace(tmp_path / "missing.csv")


def test_non_utf8_text_is_refused_with_its_line_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"job_id,submit_time,num_gpus,duration\n1,0,1,10\n2,0,1,10 caf\xe9\n")
    with pytest.raises(TraceFormatError, match=r"not UTF-8 text .* line 3, byte 58"):
        load_trace(path, "native")


def test_helios_duplicate_ids_are_caught_when_ids_are_not_integers(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "acme.csv",
        [
            HELIOS_HEADER,
            "dlc-a,u1,vc,1,4,1,COMPLETED,2023-05-01 00:00:10,,,30,0",
            "17,u1,vc,2,4,1,COMPLETED,2023-05-01 00:00:00,,,40,0",
            "dlc-a,u2,vc,1,4,1,COMPLETED,2023-05-01 00:00:20,,,30,0",
        ],
    )
    trace = load_trace(path, "helios")
    assert _rejections(trace) == {4: "duplicate job_id"}
    assert [j.name for j in trace.jobs] == ["17", "dlc-a"]


def test_absurd_gpu_counts_are_rejected(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "n.csv",
        [
            "job_id,submit_time,num_gpus,duration",
            "1,0,1,10",
            "2,0,99999999999999999999,10",
            "3,0,2000000,10",
            "4,0,1e300,10",
        ],
    )
    trace = load_trace(path, "native")
    assert [j.job_id for j in trace.jobs] == [1]
    assert _rejections(trace) == {
        3: "absurd GPU count",
        4: "absurd GPU count",
        5: "absurd GPU count",
    }


def test_native_traces_carry_requested_nodes_and_time_limits(tmp_path: Path) -> None:
    from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, resample_window

    jobs = [
        Job(0, 0.0, 16, 600.0, nodes=2, time_limit=3600.0),
        Job(1, 10.0, 4, 60.0),  # no shape, no limit: derived later, none
    ]
    path = tmp_path / "shaped.csv"
    write_native(jobs, path)
    assert load_trace(path, "native").jobs == tuple(jobs)
    # the windows rollouts and evaluation cut keep them
    (window,) = cut_windows(jobs_from_trace(path), 3600.0)
    assert [(j.nodes, j.time_limit) for j in resample_window(window, 0, 0.0)] == [
        (2, 3600.0),
        (0, 0.0),
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,submit_time,num_gpus,duration,nodes,time_limit\n"
        "0,0,16,60,3,0\n1,0,4,60,1,-5\n2,0,4,60,x,0\n3,0,4,60,,\n"
    )
    trace = load_trace(bad, "native")
    assert [j.job_id for j in trace.jobs] == [3]
    assert [r.reason for r in trace.rejected] == [
        "GPUs do not split evenly over nodes",
        "negative time_limit",
        "non-numeric nodes",
    ]
