"""Communication profiles learned from a cluster's own history (``job_telemetry``).

What a run's telemetry says, under the analytic model's ring all-reduce
(``cluster.contention.ring_iteration_time``: an iteration computes, then all-reduces, the GPU
idle while it communicates): while a run with g > 1 GPUs is alone on its nodes

- its GPU activity ``a`` (``activity_alone``) is the compute share of an iteration;
- each GPU sends, per iteration, the ring volume ``V = 2 (g - 1) / g x G`` (G: the gradient
  all-reduced), and receives as much: over the NIC of each node for a multi-node run (one
  ring edge leaves each node), over NVLink for a one-node run; so ``V / t`` is half the
  per-node NIC bytes per second (InfiniBand, else Ethernet) or half the NVLink bytes per
  GPU-second.

An iteration's length is not in the telemetry, only these ratios, and the contention model
needs only them (its rates are ratios of iteration times; the shipped overhead is 0): the
gradient per compute second ``rho = (V / t) / a x g / (2 (g - 1))`` does not depend on the
placement, and a profile is written per second of the runs' isolated running:
``compute_s`` = the median activity, ``grad_gb`` = the median rho x compute_s / 1e9.
``sensitivity`` = 1 - compute_s, the communication share (a k-way shared ring slows by about
1 + sensitivity x (f(k) - 1)).

A job's profile comes from earlier runs of the same job name (``basis`` "name"), else of the
same user and GPU count ("shape"), with its confidence: the number of runs and the spread
(median absolute deviation over the median) of activity and rho; none with fewer than
``min_runs`` runs. ``apply_history`` gives jobs without a profile the learned one where it
exists (named ``history:...`` in a calibration extended with them), leaving the others to
the default mix (``cluster.profiles.assign_profiles``), and counts which got which.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import duckdb
import polars as pl

from linkwise.cluster.domain import Job
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.datasets.job_telemetry import read_job_telemetry

if TYPE_CHECKING:  # a type only: the rollouts module is heavy, and this one is read live
    from linkwise.datasets.rollouts import Window

__all__ = [
    "EMPTY_BOOK",
    "PROFILE_PREFIX",
    "LearnedProfile",
    "ProfileBook",
    "ProfileCounts",
    "apply_history",
    "apply_history_frame",
    "apply_history_windows",
    "extend_calibration",
    "learn_profiles",
    "load_profile_book",
    "lookup",
    "run_estimates",
]

PROFILE_PREFIX = "history:"
"""Learned profiles' names in a calibration start with this."""
Basis = Literal["name", "shape"]


@dataclass(frozen=True, slots=True)
class LearnedProfile:
    """A profile learned from ``runs`` earlier runs of one job name or (user, GPUs)."""

    profile: CommProfile
    basis: Basis
    key: str
    runs: int
    activity: float  # median GPU activity alone (= compute_s)
    rho_gb: float  # median gradient per compute second, GB
    activity_spread: float  # median absolute deviation / median
    rho_spread: float
    nic_bytes_per_gpu_s: float | None  # median over the multi-node runs, tx + rx
    nvlink_bytes_per_gpu_s: float | None

    @property
    def sensitivity(self) -> float:
        """The communication share of an isolated iteration, 1 - compute share."""
        return 1.0 - self.activity


@dataclass(frozen=True, slots=True)
class ProfileBook:
    """The learned profiles by job name and by (user, GPUs), and what they came from."""

    by_name: Mapping[str, LearnedProfile]
    by_shape: Mapping[tuple[str, int], LearnedProfile]
    runs_summarized: int  # job_telemetry rows read
    runs_with_telemetry: int  # of them, with any attributed sample
    runs_used: int  # of them, with activity alone and ring traffic (the estimates)
    job_hours: float  # run time of the runs with telemetry, summed, hours
    span_hours: float  # from the first start to the last end of those runs, hours
    min_runs: int

    @property
    def profiles(self) -> tuple[LearnedProfile, ...]:
        return (*self.by_name.values(), *self.by_shape.values())

    def to_dict(self) -> dict[str, Any]:
        def entry(p: LearnedProfile) -> dict[str, Any]:
            d = asdict(p)
            d["profile"] = {
                "name": p.profile.name,
                "compute_s": p.profile.compute_s,
                "grad_gb": p.profile.grad_gb,
            }
            d["sensitivity"] = p.sensitivity
            return d

        return {
            "runs_summarized": self.runs_summarized,
            "runs_with_telemetry": self.runs_with_telemetry,
            "runs_used": self.runs_used,
            "job_hours": self.job_hours,
            "span_hours": self.span_hours,
            "min_runs": self.min_runs,
            "by_name": {k: entry(v) for k, v in sorted(self.by_name.items())},
            "by_shape": {f"{u}/{g}": entry(v) for (u, g), v in sorted(self.by_shape.items())},
        }


EMPTY_BOOK = ProfileBook({}, {}, 0, 0, 0, 0.0, 0.0, 1)


@dataclass(frozen=True, slots=True)
class ProfileCounts:
    """How many jobs got which profile: their own (declared), learned by name, learned by
    user and shape, or left to the default mix."""

    declared: int = 0
    history_name: int = 0
    history_shape: int = 0
    default: int = 0

    @property
    def history(self) -> int:
        return self.history_name + self.history_shape

    def line(self) -> str:
        """The report line."""
        return (
            f"profiles: {self.history} jobs from history ({self.history_name} by name, "
            f"{self.history_shape} by user and GPUs), {self.default} from the default mix, "
            f"{self.declared} their own"
        )

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "history": self.history}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileCounts:
        """The counts ``to_dict`` wrote (its derived ``history`` left out)."""
        return cls(*(int(d[k]) for k in ("declared", "history_name", "history_shape", "default")))


def run_estimates(summary: pl.DataFrame, *, min_gpu_s: float = 600.0) -> pl.DataFrame:
    """Per run with g > 1 GPUs, at least ``min_gpu_s`` GPU-seconds of activity alone and
    ring traffic alone: its activity and rho (GB of gradient per compute second); the
    module docstring says how."""
    g = pl.col("gpus").cast(pl.Float64)
    nic_bytes = (
        pl.when(pl.col("ib_node_s") > 0).then(pl.col("ib_bytes")).otherwise(pl.col("eth_bytes"))
    )
    nic_s = (
        pl.when(pl.col("ib_node_s") > 0).then(pl.col("ib_node_s")).otherwise(pl.col("eth_node_s"))
    )
    ring_rate = (
        pl.when(pl.col("nodes") > 1)
        .then(pl.when(nic_s > 0).then(nic_bytes / nic_s / 2.0))
        .otherwise(pl.col("nvlink_bytes_per_gpu_s") / 2.0)
    )
    nic_per_gpu = pl.when((pl.col("nodes") > 1) & (nic_s > 0)).then(
        nic_bytes / (nic_s * g / pl.col("nodes"))
    )
    nvlink = pl.when(pl.col("nodes") == 1).then(pl.col("nvlink_bytes_per_gpu_s"))
    out = summary.with_columns(
        ring_rate.alias("ring_rate"),
        nic_per_gpu.alias("nic_bytes_per_gpu_s"),
        nvlink.alias("nvlink_one_node_bytes_per_gpu_s"),
    ).filter(
        (pl.col("gpus") > 1)
        & (pl.col("activity_alone_gpu_s") >= min_gpu_s)
        & (pl.col("activity_alone") > 0)
        & pl.col("ring_rate").is_not_null()
    )
    rho = pl.col("ring_rate") / pl.col("activity_alone") * g / (2.0 * (g - 1.0)) / 1e9
    return out.with_columns(rho.alias("rho_gb"))


def _spread(values: pl.Series) -> float:
    med = float(values.median())  # type: ignore[arg-type]
    if med == 0:
        return math.inf
    mad = float((values - med).abs().median())  # type: ignore[arg-type]
    return mad / abs(med)


def _median_or_none(values: pl.Series) -> float | None:
    kept = values.drop_nulls()
    return float(kept.median()) if kept.len() else None  # type: ignore[arg-type]


def _learned(name: str, basis: Basis, key: str, runs: pl.DataFrame) -> LearnedProfile:
    act = float(runs["activity_alone"].median())  # type: ignore[arg-type]
    rho = float(runs["rho_gb"].median())  # type: ignore[arg-type]
    return LearnedProfile(
        profile=CommProfile(name, act, rho * act, f"history ({basis} {key}, {runs.height} runs)"),
        basis=basis,
        key=key,
        runs=runs.height,
        activity=act,
        rho_gb=rho,
        activity_spread=_spread(runs["activity_alone"]),
        rho_spread=_spread(runs["rho_gb"]),
        nic_bytes_per_gpu_s=_median_or_none(runs["nic_bytes_per_gpu_s"]),
        nvlink_bytes_per_gpu_s=_median_or_none(runs["nvlink_one_node_bytes_per_gpu_s"]),
    )


def learn_profiles(
    summary: pl.DataFrame, *, min_runs: int = 1, min_gpu_s: float = 600.0
) -> ProfileBook:
    """Profiles by job name and by (user, GPUs) from ``job_telemetry`` rows (every row is
    history: select the rows before the jobs they serve), each from at least ``min_runs``
    runs."""
    if min_runs < 1:
        raise ValueError(f"min_runs must be at least 1, got {min_runs}")
    est = run_estimates(summary, min_gpu_s=min_gpu_s)
    by_name: dict[str, LearnedProfile] = {}
    for (name,), runs in est.group_by("name", maintain_order=True):
        if runs.height >= min_runs and str(name):
            by_name[str(name)] = _learned(f"{PROFILE_PREFIX}name={name}", "name", str(name), runs)
    by_shape: dict[tuple[str, int], LearnedProfile] = {}
    for (user, gpus), runs in est.group_by("user_name", "gpus", maintain_order=True):
        if runs.height >= min_runs:
            key = f"user={user},gpus={gpus}"
            by_shape[(str(user), int(str(gpus)))] = _learned(
                f"{PROFILE_PREFIX}{key}", "shape", key, runs
            )
    seen = summary.filter((pl.col("link_used") + pl.col("activity_used")) > 0)
    job_hours = float((seen["end_time"] - seen["start_time"]).sum()) / 3600.0
    span = (
        (float(seen["end_time"].max()) - float(seen["start_time"].min())) / 3600.0  # type: ignore[arg-type]
        if seen.height
        else 0.0
    )
    return ProfileBook(
        by_name=by_name,
        by_shape=by_shape,
        runs_summarized=summary.height,
        runs_with_telemetry=seen.height,
        runs_used=est.height,
        job_hours=job_hours,
        span_hours=span,
        min_runs=min_runs,
    )


def load_profile_book(
    con: duckdb.DuckDBPyConnection,
    *,
    cluster: str | None = None,
    until: float | None = None,
    min_runs: int = 1,
    min_gpu_s: float = 600.0,
) -> ProfileBook:
    """``learn_profiles`` over the store's ``job_telemetry`` of runs ended before ``until``."""
    return learn_profiles(
        read_job_telemetry(con, cluster=cluster, until=until),
        min_runs=min_runs,
        min_gpu_s=min_gpu_s,
    )


def lookup(
    book: ProfileBook, name: str, user: str, gpus: int, known: Container[str] | None = None
) -> LearnedProfile | None:
    """The job's learned profile: by its name, else by its user and GPU count, else None.
    With ``known`` (a calibration's profile names), only one the calibration holds: where
    the calibration cannot be extended (the live loop's policy predicts with its own), the
    contention model never meets an unknown profile."""
    by_name = book.by_name.get(name) if name else None
    for found in (by_name, book.by_shape.get((user, gpus))):
        if found is not None and (known is None or found.profile.name in known):
            return found
    return None


def extend_calibration(calibration: Calibration, book: ProfileBook) -> Calibration:
    """``calibration`` with the book's profiles added (its mix unchanged: the default mix
    never draws a learned profile). A profile the calibration already holds under the same
    name stays: a fitted calibration's ``history:`` profiles were fitted with its alpha and
    overhead, in its time unit (``datasets.contention_fit``), while the book's are per second
    of isolated running, so replacing them would pair the fitted overhead with another unit."""
    if not book.profiles:
        return calibration
    profiles = {**{p.profile.name: p.profile for p in book.profiles}, **calibration.profiles}
    return replace(calibration, profiles=profiles)


def apply_history(
    jobs: Sequence[Job], calibration: Calibration, book: ProfileBook
) -> tuple[tuple[Job, ...], Calibration, ProfileCounts]:
    """Jobs without a profile get their learned one where the book has it; the calibration
    extended with the learned profiles; the counts (the rest go to the default mix, as
    ``assign_profiles`` draws them). A book without profiles changes nothing."""
    out: list[Job] = []
    declared = by_name = by_shape = 0
    for job in jobs:
        found = None if job.profile else lookup(book, job.name, job.user, job.num_gpus)
        if job.profile:
            declared += 1
        elif found is not None:
            by_name += found.basis == "name"
            by_shape += found.basis == "shape"
            job = replace(job, profile=found.profile.name)
        out.append(job)
    counts = ProfileCounts(declared, by_name, by_shape, len(out) - declared - by_name - by_shape)
    return tuple(out), extend_calibration(calibration, book), counts


def apply_history_windows(
    windows: Sequence[Window], calibration: Calibration, book: ProfileBook
) -> tuple[tuple[Window, ...], Calibration, ProfileCounts]:
    """``apply_history`` on the jobs of ``windows`` (a replay's held-out windows)."""
    jobs, extended, counts = apply_history([j for w in windows for j in w.jobs], calibration, book)
    out: list[Window] = []
    at = 0
    for w in windows:
        out.append(replace(w, jobs=jobs[at : at + len(w.jobs)]))
        at += len(w.jobs)
    return tuple(out), extended, counts


def apply_history_frame(
    jobs: pl.DataFrame, calibration: Calibration, book: ProfileBook
) -> tuple[pl.DataFrame, Calibration, ProfileCounts]:
    """``apply_history`` on a jobs frame (columns ``profile``, ``name``, ``user``,
    ``num_gpus``): the ``profile`` column filled where a learned profile exists."""
    names: list[str] = []
    declared = by_name = by_shape = 0
    for own, name, user, gpus in zip(
        jobs["profile"].to_list(),
        jobs["name"].to_list(),
        jobs["user"].to_list(),
        jobs["num_gpus"].to_list(),
        strict=True,
    ):
        found = None if own else lookup(book, name or "", user or "", int(gpus))
        declared += bool(own)
        if found is not None:
            by_name += found.basis == "name"
            by_shape += found.basis == "shape"
        names.append(own or (found.profile.name if found is not None else ""))
    counts = ProfileCounts(declared, by_name, by_shape, jobs.height - declared - by_name - by_shape)
    if not counts.history:
        return jobs, calibration, counts
    out = jobs.with_columns(pl.Series("profile", names, dtype=jobs.schema["profile"]))
    return out, extend_calibration(calibration, book), counts
