"""The contention model fitted on the cluster's own data (issue 34 item 3).

What is observed: per finished run, its GPU activity while alone on a node and while beside
other runs (``job_telemetry``: ``activity_alone``, ``activity_beside``, GPU-weighted means
over the scrape instants of each kind, bad and missing samples counted and left out). What
is known: the topology (link speeds), the accounting (which run held which nodes when, GPUs
per node corrected by dcgm-exporter's ``hpc_job`` labels where present: sacct splits a
total evenly) and, per job name, the gradient all-reduced per second of compute
(``comm_profiles``: from the bytes the run moved while alone).

What is fitted (``scipy.optimize.least_squares``): the analytic model's ``alpha`` and
``overhead_s``, and per job name its ``compute_s`` (and its gradient per compute second
where ``comm_profiles`` has none). A ring all-reduce job's activity is its compute share of
an iteration (its GPUs idle while the ring runs): at rate r it shows r x its compute share
at its best placement (``cluster.contention.AnalyticModel``'s rates). The accounting cuts
time into segments in which the same runs hold the same nodes; in each, the model gives
every run's rate next to the split rings running then (``ContentionTerms``, checked against
``AnalyticModel.rates`` by the tests); a run's predicted activity alone and beside others
is the mean over its segments, weighted as ``job_telemetry`` weights its instants (the GPUs
it holds on each node that is alone, or not, times the node's activity samples in the
segment, read from the store). Residuals: log observed over predicted activity, alone and beside,
per run (their difference is the drop in activity beside others against the predicted
slowdown; the level anchors the overhead, which a ratio alone cannot see).

Telemetry holds ratios only (activities, bytes per second), never an iteration's length:
scaling every compute time, gradient and the overhead by one factor changes no prediction.
The time unit is therefore one convention: the job name with the most runs keeps the
compute time ``comm_profiles`` gives it (its median activity alone: its isolated iteration
at its usual placement is one unit) and everything else is fitted relative to it. A compute
time is only seen through the overhead it is compared with (multi-node runs of that name,
an overhead above 0); otherwise it does not move the predictions and is reported so.

Identifiability is reported as ``cluster.calibration`` reports it (``fit["parameters"]``,
``parameter_entry``): from the Jacobian at the solution, the standard error of each
parameter (the residuals' variance times the inverse normal matrix): ``determined`` within
``DETERMINED_REL``, else ``weakly determined``; ``constrained`` when no data moves it (held
at its start, with the reason) or it sits at a bound. Validation is on later runs
(``train_fraction`` of the observed runs by end time fit, the rest scored: mean absolute
error and Spearman rank correlation of the activity drop beside others and of the activity
levels, beside the shipped calibration's contention parameters with the same profiles and a
constant predictor).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
from scipy.optimize import least_squares

from linkwise.cluster.calibration.bounds import ALPHA_BOUNDS, OVERHEAD_BOUNDS, PROFILE_BOUNDS
from linkwise.cluster.calibration.report import parameter_entry
from linkwise.cluster.calibration.validation import PairScore, score
from linkwise.cluster.contention import min_nodes
from linkwise.cluster.domain import Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile, load_calibration
from linkwise.datasets.comm_profiles import PROFILE_PREFIX, ProfileBook, learn_profiles
from linkwise.datasets.job_telemetry import KEY, read_job_telemetry

__all__ = [
    "DETERMINED_REL",
    "MIN_ACTIVITY_GPU_S",
    "ClusterFit",
    "ContentionTerms",
    "FitData",
    "Validation",
    "contention_terms",
    "fit_cluster_calibration",
    "load_fit_data",
    "render_fit_text",
    "standard_errors",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DETERMINED_REL = 0.03
"""A parameter whose standard error is within this share of its value is determined (three
standard errors inside the issue's 10%: the residuals of one run are not independent, and
on the hidden truth two standard errors were exceeded)."""
MIN_ACTIVITY_GPU_S = 300.0
"""GPU-seconds of activity of one kind (alone, beside) a run needs for its mean to count."""
BOOTSTRAP = 20
"""Refits on runs drawn with replacement behind each standard error (``_solve``)."""
WEAK_REL = 0.5
"""Beyond this relative standard error a parameter is held by its start, not the data."""
PRIOR_WEIGHT = 0.003
"""Weight of the log-space prior holding each fitted compute time and gradient per compute
second to its start (``comm_profiles``' value): negligible beside any data that see it
(well under 1% of the curvature of a determined one), it keeps a parameter the data do not
see where it started instead of letting it drift to a bound."""
RHO_BOUNDS = (1e-6, 1e4)
"""Bounds of a fitted gradient per compute second, GB/s."""
OVERHEAD_STARTS = (0.0, 0.003, 0.03)
"""Starting overheads of the multi-start fit, as shares of the reference compute time."""


# ------------------------------------------------------------------------ the data


@dataclass(frozen=True)
class FitData:
    """Every run that held nodes in the window, with its placement on the topology, and the
    observations of the runs ``job_telemetry`` summarized."""

    runs: pl.DataFrame  # KEY, name, user_name, gpus, t0, t1, observed columns
    telemetry: pl.DataFrame  # the job_telemetry rows of the runs inside the window
    placements: tuple[Placement, ...]  # aligned with ``runs``
    instants: Mapping[int, FloatArray]  # per node index, its activity sample times
    since: float
    until: float
    unknown_nodes: int  # runs on a node the topology does not have (left out)
    label_corrected: int  # runs whose GPUs per node came from hpc_job labels


_RUNS_SQL = """
    SELECT j.cluster, j.job_id, j.submit_time, j.run_index, j.name, j.user_name, j.gpus,
           j.start_time AS t0, coalesce(j.end_time, CAST('inf' AS DOUBLE)) AS t1,
           list(n.node ORDER BY n.node) AS nodes, list(n.gpus ORDER BY n.node) AS node_gpus
    FROM jobs AS j JOIN job_nodes AS n USING (cluster, job_id, submit_time, run_index)
    WHERE j.start_time IS NOT NULL
      AND coalesce(j.end_time, CAST('inf' AS DOUBLE)) > j.start_time
      AND j.start_time < $until AND coalesce(j.end_time, CAST('inf' AS DOUBLE)) > $since
      AND (CAST($cluster AS VARCHAR) IS NULL OR j.cluster = $cluster)
    GROUP BY ALL
    ORDER BY t0, j.cluster, j.job_id, j.run_index
"""
"""Every run holding nodes in [$since, $until), with its nodes and GPUs on each."""


def _labelled_gpus(
    con: duckdb.DuckDBPyConnection, since: float, until: float
) -> dict[tuple[str, str], int]:
    """(job label, node) -> GPUs dcgm-exporter labelled with that job there."""
    rows = con.sql(
        """
        SELECT job, host, count(DISTINCT labels->>'gpu') AS gpus FROM telemetry_samples
        WHERE metric IN ('DCGM_FI_PROF_SM_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL')
          AND job IS NOT NULL AND job <> '' AND host IS NOT NULL AND ts >= $since AND ts < $until
        GROUP BY job, host
        """,
        params={"since": since, "until": until},
    ).fetchall()
    return {(str(job), str(host)): int(g) for job, host, g in rows}


def load_fit_data(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    *,
    since: float | None = None,
    until: float | None = None,
    cluster: str | None = None,
) -> FitData:
    """The runs holding nodes in [since, until) (None: the store's whole span), their
    placements, and the ``job_telemetry`` rows of those that ran entirely inside it."""
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    runs = con.sql(_RUNS_SQL, params={"since": lo, "until": hi, "cluster": cluster}).pl()
    if since is None:
        lo = float(runs["t0"].min()) if runs.height else 0.0
    if until is None:
        finite = runs["t1"].filter(runs["t1"].is_finite())
        hi = float(finite.max()) if finite.len() else lo
    labels = _labelled_gpus(con, lo, hi)
    index = topology.node_index
    placements: list[Placement] = []
    keep: list[bool] = []
    unknown = corrected = 0
    for job_id, nodes, gpus in zip(runs["job_id"], runs["nodes"], runs["node_gpus"], strict=True):
        if any(n not in index for n in nodes):
            unknown += 1
            keep.append(False)
            continue
        seen = [labels.get((str(job_id), n)) for n in nodes]
        if all(s is not None for s in seen) and sum(s or 0 for s in seen) == sum(gpus):
            corrected += list(seen) != list(gpus)
            gpus = seen
        placements.append(
            Placement.of([(index[n], int(g)) for n, g in zip(nodes, gpus, strict=True)])
        )
        keep.append(True)
    runs = runs.filter(pl.Series(keep, dtype=pl.Boolean)) if runs.height else runs
    observed = read_job_telemetry(con, cluster=cluster)
    cols = [
        "activity_alone",
        "activity_alone_gpu_s",
        "activity_beside",
        "activity_beside_gpu_s",
        "activity_used",
        "activity_shared",
        "activity_bad",
        "activity_missing",
    ]
    runs = runs.join(observed.select(*KEY, *cols), on=list(KEY), how="left")
    inside = (pl.col("t0") >= lo) & (pl.col("t1") <= hi)
    runs = runs.with_columns(
        (inside & pl.col("activity_used").is_not_null()).alias("summarized"),
    )
    inner = observed.filter((pl.col("start_time") >= lo) & (pl.col("end_time") <= hi))
    times = con.sql(
        """
        SELECT DISTINCT host, ts FROM telemetry_samples
        WHERE metric IN ('DCGM_FI_PROF_SM_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL')
          AND host IS NOT NULL AND ts >= $since AND ts < $until ORDER BY host, ts
        """,
        params={"since": lo, "until": hi},
    ).pl()
    instants = {
        index[str(host)]: group["ts"].to_numpy().astype(np.float64)
        for (host,), group in times.group_by("host", maintain_order=True)
        if str(host) in index
    }
    return FitData(runs, inner, tuple(placements), instants, lo, hi, unknown, corrected)


# ------------------------------------------------------------------------ the model terms


@dataclass(frozen=True)
class ContentionTerms:
    """The analytic model over a fixed history of placements, as arrays: per (segment,
    run) pair the run's activity for any alpha, overhead and profiles (``activity``), and
    the weights that turn pairs into a run's mean activity alone and beside others."""

    seg_len: FloatArray  # (segments,)
    pair_seg: IntArray  # (pairs,)
    pair_run: IntArray
    w_alone: FloatArray  # GPU-seconds of the pair on nodes the run has alone
    w_beside: FloatArray
    run_profile: IntArray  # (runs,) profile index
    run_gpus: FloatArray
    run_nodes: FloatArray
    split: npt.NDArray[np.bool_]  # a ring over several nodes
    intra: FloatArray  # its slowest intra-node link
    bw_alone: FloatArray  # its ring's bottleneck alone
    best_nodes: FloatArray  # nodes of its best placement
    bw_best: FloatArray
    ent_pair: IntArray  # (entries,) one per (split pair, link of its ring)
    ent_key: IntArray  # (segment, link) index of the entry
    ent_gbps: FloatArray
    n_keys: int

    def _alone(
        self, overhead_s: float, compute_s: FloatArray, grad_gb: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """Per run: compute time, ring volume term, overhead, its time alone at its
        placement, its duty cycle there (0 unless split) and its best time."""
        p = self.run_profile
        g = self.run_gpus
        c = compute_s[p]
        comm = (grad_gb[p] / g) * 2.0 * (g - 1.0)
        over = np.where(self.run_nodes > 1, overhead_s * self.run_nodes, 0.0)
        alone_comm = comm / self.bw_alone
        t_alone = c + alone_comm + over
        duty = np.where(self.split, alone_comm / t_alone, 0.0)
        best_over = np.where(self.best_nodes > 1, overhead_s * self.best_nodes, 0.0)
        best = c + comm / self.bw_best + best_over
        return c, comm, over, t_alone, duty, best

    def isolated(self, overhead_s: float, compute_s: FloatArray, grad_gb: FloatArray) -> FloatArray:
        """Per run, its activity alone at its own placement (nobody else on the network)."""
        c, _, _, t_alone, _, best = self._alone(overhead_s, compute_s, grad_gb)
        out: FloatArray = c / np.maximum(t_alone, best)
        return out

    def activity(
        self, alpha: float, overhead_s: float, compute_s: FloatArray, grad_gb: FloatArray
    ) -> FloatArray:
        """Per pair, the run's SM activity: rate x compute_s / best time = compute_s /
        max(time now, best time), the time now ``AnalyticModel.iteration_times``' (duty
        sharing), ``compute_s`` and ``grad_gb`` per profile."""
        c, comm, over, _, duty, best = self._alone(overhead_s, compute_s, grad_gb)
        ent_run = self.pair_run[self.ent_pair]
        own = duty[ent_run]
        load = np.bincount(self.ent_key, weights=own, minlength=self.n_keys)
        k = 1.0 + np.maximum(0.0, load[self.ent_key] - own)
        f = np.where(k > 1.0, k + alpha * (k - 1.0), 1.0)
        bw = self.intra[self.pair_run].copy()
        np.minimum.at(bw, self.ent_pair, self.ent_gbps / f)
        r = self.pair_run
        t_now = c[r] + comm[r] / bw + over[r]
        out: FloatArray = c[r] / np.maximum(t_now, best[r])
        return out

    def means(self, activity: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per run, the predicted mean activity alone and beside others (nan without any)."""
        n = len(self.run_profile)
        wa = np.bincount(self.pair_run, weights=self.w_alone, minlength=n)
        wb = np.bincount(self.pair_run, weights=self.w_beside, minlength=n)
        sa = np.bincount(self.pair_run, weights=self.w_alone * activity, minlength=n)
        sb = np.bincount(self.pair_run, weights=self.w_beside * activity, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(wa > 0, sa / wa, np.nan), np.where(wb > 0, sb / wb, np.nan)


def contention_terms(
    topology: Topology,
    job_ids: Sequence[int],
    placements: Sequence[Placement],
    t0: Sequence[float],
    t1: Sequence[float],
    run_profile: Sequence[int],
    *,
    since: float,
    until: float,
    instants: Mapping[int, FloatArray] | None = None,
) -> ContentionTerms:
    """``ContentionTerms`` of runs holding ``placements`` over [t0, t1), cut at every start
    and end inside [since, until). ``instants``: per node index, the sorted times its
    activity was sampled at (a pair then weighs the GPUs times the instants of each node in
    its segment, as ``job_telemetry`` averages them); None weighs by time."""
    n = len(placements)
    lo = np.clip(np.asarray(t0, dtype=np.float64), since, until)
    hi = np.clip(np.asarray(t1, dtype=np.float64), since, until)
    bounds = np.unique(np.concatenate([lo, hi, [since, until]]))
    seg_len = np.diff(bounds)
    gbps = topology.link_gbps
    n_links = len(gbps)
    # the runs active in each segment, by sweeping starts and ends
    first = np.searchsorted(bounds, lo)
    last = np.searchsorted(bounds, hi)  # exclusive
    pair_seg: list[int] = []
    pair_run: list[int] = []
    for j in range(n):
        for s in range(int(first[j]), int(last[j])):
            pair_seg.append(s)
            pair_run.append(j)
    ps = np.asarray(pair_seg, dtype=np.int64)
    pr = np.asarray(pair_run, dtype=np.int64)
    order = np.lexsort((pr, ps))
    ps, pr = ps[order], pr[order]
    # node occupancy per segment
    occ: dict[tuple[int, int], int] = {}
    for s, j in zip(ps.tolist(), pr.tolist(), strict=True):
        for node in placements[j].nodes:
            occ[(s, node)] = occ.get((s, node), 0) + 1
    w_alone = np.zeros(len(ps))
    w_beside = np.zeros(len(ps))
    ent_pair: list[int] = []
    ent_link: list[int] = []
    ent_seg: list[int] = []
    split = np.array([len(p.alloc) > 1 for p in placements], dtype=bool)
    gpus = np.array([p.num_gpus for p in placements], dtype=np.float64)
    split &= gpus > 1
    rings = [topology.ring_links(p.nodes, int(job_ids[j])) for j, p in enumerate(placements)]
    counts: dict[int, npt.NDArray[np.int64]] = {}
    if instants is not None:  # instants of each node in each segment [b_s, b_s+1)
        for node, times in instants.items():
            counts[node] = np.diff(np.searchsorted(np.asarray(times), bounds, side="left"))
    for i, (s, j) in enumerate(zip(ps.tolist(), pr.tolist(), strict=True)):
        for node, g in placements[j].alloc:
            if instants is None:
                weight = g * float(seg_len[s])
            else:
                seen = counts.get(node)
                weight = g * float(seen[s]) if seen is not None else 0.0
            if occ[(s, node)] == 1:
                w_alone[i] += weight
            else:
                w_beside[i] += weight
        if split[j]:
            for link in rings[j]:
                ent_pair.append(i)
                ent_link.append(link)
                ent_seg.append(s)
    links = np.asarray(ent_link, dtype=np.int64)
    key = np.asarray(ent_seg, dtype=np.int64) * n_links + links
    uniq, ent_key = np.unique(key, return_inverse=True)
    link_arr = np.asarray(gbps, dtype=np.float64)
    intra = np.array(
        [min(topology.nodes[k].intra_gbps for k in p.nodes) for p in placements], dtype=np.float64
    )
    bw_alone = np.array(
        [
            min(intra[j], *(gbps[link] for link in rings[j])) if split[j] else intra[j]
            for j in range(n)
        ],
        dtype=np.float64,
    )
    max_intra = max(node.intra_gbps for node in topology.nodes)
    max_nic = max(node.nic_gbps for node in topology.nodes)
    best_nodes = np.array([min_nodes(topology, p.num_gpus) for p in placements], dtype=np.float64)
    bw_best = np.where(best_nodes == 1, max_intra, min(max_intra, max_nic))
    return ContentionTerms(
        seg_len=seg_len,
        pair_seg=ps,
        pair_run=pr,
        w_alone=w_alone,
        w_beside=w_beside,
        run_profile=np.asarray(run_profile, dtype=np.int64),
        run_gpus=gpus,
        run_nodes=np.array([len(p.alloc) for p in placements], dtype=np.float64),
        split=split,
        intra=intra,
        bw_alone=bw_alone,
        best_nodes=best_nodes,
        bw_best=bw_best.astype(np.float64),
        ent_pair=np.asarray(ent_pair, dtype=np.int64),
        ent_key=ent_key.astype(np.int64),
        ent_gbps=link_arr[links] if len(links) else np.zeros(0),
        n_keys=len(uniq),
    )


# ------------------------------------------------------------------------ the fit


@dataclass(frozen=True)
class Validation:
    """Scores on the later runs (ended after ``split_time``), for the fitted model, for the
    shipped calibration's alpha and overhead with the same starting profiles, and for a
    constant (the training mean): of every activity mean (alone and beside others), and of
    the drop beside others (each mean beside others over the model's own activity for the
    run alone at its placement, against the model's predicted rate there: how well the
    slowdown is predicted once the isolated level is the model's)."""

    split_time: float
    runs: int  # later runs with a profile and some activity
    without_profile: int  # later runs whose name had no run in the training part
    activity_fit: PairScore
    activity_shipped: PairScore
    activity_constant_mae: float
    drop_fit: PairScore
    drop_shipped: PairScore
    drop_constant_mae: float

    def to_dict(self) -> dict[str, Any]:
        def sc(s: PairScore) -> dict[str, Any]:
            return {
                "mae": None if math.isnan(s.mae) else s.mae,
                "spearman": None if math.isnan(s.spearman) else s.spearman,
                "n": s.n,
            }

        def num(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {
            "split_time": self.split_time,
            "runs": self.runs,
            "without_profile": self.without_profile,
            "activity": {
                "fit": sc(self.activity_fit),
                "shipped": sc(self.activity_shipped),
                "constant_mae": num(self.activity_constant_mae),
            },
            "drop": {
                "fit": sc(self.drop_fit),
                "shipped": sc(self.drop_shipped),
                "constant_mae": num(self.drop_constant_mae),
            },
        }


@dataclass(frozen=True)
class ClusterFit:
    """The fitted calibration (its ``fit`` holds ``parameters``, ``data``, ``validation``)
    and how long it took."""

    calibration: Calibration
    reference: str  # the job name whose compute time is the time unit
    seconds: float

    @property
    def parameters(self) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
        params: Mapping[str, Mapping[str, Mapping[str, Any]]] = self.calibration.fit["parameters"]
        return params

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "seconds": self.seconds,
            "calibration": self.calibration.to_json(),
        }


@dataclass
class _Profiles:
    """Per job name: the profile index, the start values, what is fitted."""

    names: list[str]
    compute0: FloatArray
    rho0: FloatArray
    rho_known: npt.NDArray[np.bool_]
    runs: list[int]
    fallback: int  # index of the profile of runs without a learned one
    book: ProfileBook


def _profiles(train: pl.DataFrame, telemetry: pl.DataFrame, min_gpu_s: float) -> _Profiles:
    """One profile per job name with an observed run in ``train`` (compute time and gradient
    per compute second from ``comm_profiles`` over ``telemetry`` where it learned one, else
    from the runs' activity and the median gradient), and one fixed fallback (the medians)
    for the rest. The first is the reference: among the names ``comm_profiles`` learned,
    the one with the most multi-node runs (its compute time against the overhead sets the
    overhead in the time unit), else the one with the most runs."""
    book = learn_profiles(telemetry, min_runs=1, min_gpu_s=min_gpu_s)
    observed = train.filter(
        (pl.col("activity_alone_gpu_s") >= min_gpu_s)
        | (pl.col("activity_beside_gpu_s") >= min_gpu_s)
    )
    counts = (
        observed.group_by("name")
        .agg(pl.len().alias("runs"), (pl.col("nodes").list.len() > 1).sum().alias("multi"))
        .sort(["runs", "name"], descending=[True, False])
    )
    names = [str(n) for n in counts["name"] if str(n)]
    multi = dict(zip(counts["name"].cast(pl.String), counts["multi"], strict=True))
    learned_names = sorted((n for n in names if n in book.by_name), key=lambda n: -int(multi[n]))
    if learned_names:
        names.remove(learned_names[0])
        names.insert(0, learned_names[0])
    rhos = [p.rho_gb for p in book.by_name.values()]
    rho_med = float(np.median(rhos)) if rhos else 1.0
    compute, rho, known, runs = [], [], [], []
    for name in names:
        learned = book.by_name.get(name)
        mine = observed.filter(pl.col("name") == name)
        act = pl.concat([mine["activity_alone"].drop_nulls(), mine["activity_beside"].drop_nulls()])
        if learned is not None:
            compute.append(learned.profile.compute_s)
            rho.append(learned.rho_gb)
            known.append(True)
        else:
            compute.append(float(act.median()) if act.len() else 0.5)  # type: ignore[arg-type]
            rho.append(rho_med)
            known.append(False)
        runs.append(mine.height)
    compute.append(float(np.median(compute)) if compute else 0.5)
    rho.append(rho_med)
    known.append(True)
    runs.append(0)
    return _Profiles(
        names=names,
        compute0=np.asarray(compute, dtype=np.float64),
        rho0=np.asarray(rho, dtype=np.float64),
        rho_known=np.asarray(known, dtype=bool),
        runs=runs,
        fallback=len(names),
        book=book,
    )


@dataclass(frozen=True)
class _Layout:
    """Where each parameter sits in the fit's vector."""

    ref: int  # profile whose compute time is fixed
    compute: tuple[int, ...]  # profiles with a fitted compute time (log)
    rho: tuple[int, ...]  # profiles with a fitted gradient per compute second (log)

    @property
    def size(self) -> int:
        return 2 + len(self.compute) + len(self.rho)

    def unpack(self, x: FloatArray, prof: _Profiles) -> tuple[float, float, FloatArray, FloatArray]:
        c = prof.compute0.copy()
        rho = prof.rho0.copy()
        c[list(self.compute)] = np.exp(x[2 : 2 + len(self.compute)])
        rho[list(self.rho)] = np.exp(x[2 + len(self.compute) :])
        return float(x[0]), float(x[1]), c, rho * c


def _observations(
    runs: pl.DataFrame, mask: pl.Expr, min_gpu_s: float
) -> tuple[IntArray, FloatArray, IntArray, FloatArray]:
    """Indices and observed means of the runs under ``mask`` with enough activity alone, and
    likewise beside others."""
    idx = runs.with_row_index("_i").filter(mask & pl.col("summarized"))
    alone = idx.filter(pl.col("activity_alone_gpu_s") >= min_gpu_s)
    beside = idx.filter(pl.col("activity_beside_gpu_s") >= min_gpu_s)
    return (
        alone["_i"].to_numpy().astype(np.int64),
        alone["activity_alone"].to_numpy().astype(np.float64),
        beside["_i"].to_numpy().astype(np.int64),
        beside["activity_beside"].to_numpy().astype(np.float64),
    )


def covariance(
    jac: FloatArray, s2: float, scale: FloatArray, *, rcond: float = 1e-9
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """The parameters' covariance in units of their ``scale`` (what a relative change means
    for each), from the Jacobian of the residuals at the solution: ``s2`` (the residuals'
    variance) times the inverse normal matrix, by the SVD of the Jacobian in those units;
    and which parameters lie in a direction the data do not see (singular value below
    ``rcond`` of the largest): their error is infinite (a pseudo-inverse would give them
    none)."""
    _, sv, vt = np.linalg.svd(jac * scale, full_matrices=False)
    blind = sv <= rcond * (sv.max() if sv.size else 0.0)
    inv = np.where(blind, 0.0, 1.0 / np.where(blind, 1.0, sv) ** 2)
    cov: FloatArray = s2 * (vt.T * inv) @ vt
    unseen: npt.NDArray[np.bool_] = np.asarray(((vt**2 > 1e-6) & blind[:, None]).any(axis=0))
    return cov, unseen


def standard_errors(
    jac: FloatArray, s2: float, scale: FloatArray, *, rcond: float = 1e-9
) -> FloatArray:
    """Each parameter's standard error relative to its ``scale`` (``covariance``; infinite
    for one the data do not see)."""
    cov, unseen = covariance(jac, s2, scale, rcond=rcond)
    out: FloatArray = np.where(unseen, np.inf, np.sqrt(np.clip(np.diag(cov), 0.0, None)))
    return out


def _status(rel: float, held: str, runs_note: str) -> tuple[str, str]:
    """Status and reason of a parameter from its relative standard error: determined,
    weakly determined, or (beyond ``WEAK_REL``) constrained by what ``held`` says holds
    it."""
    err = "no" if math.isinf(rel) else f"{rel:.1%}"
    if rel <= DETERMINED_REL:
        return "determined", f"by {runs_note} (standard error {err})"
    if rel <= WEAK_REL:
        return "weakly determined", f"{runs_note} leave it loose (standard error {err})"
    return "constrained", f"{held}: the data do not determine it (standard error {err})"


@dataclass(frozen=True)
class _Solution:
    """One least-squares solution with ``layout.ref`` as the time unit."""

    layout: _Layout
    x: FloatArray
    cov: FloatArray  # in the units of ``scale``
    se: FloatArray  # relative standard errors (inf: unseen)
    rms: float  # of the data residuals


def _solve(
    terms: ContentionTerms,
    prof: _Profiles,
    ref: int,
    obs: tuple[IntArray, FloatArray, IntArray, FloatArray],
    shipped: Calibration,
    start: _Solution | None,
    bootstrap: int = 0,
) -> _Solution:
    """Least squares of the log activity means with profile ``ref``'s compute time fixed;
    from a few overheads, or from ``start`` rescaled to this time unit. Standard errors:
    from the Jacobian, and with ``bootstrap`` > 0 the larger of that and the spread of as
    many refits on runs drawn with replacement (a run's residuals are not independent, and
    a curved valley is wider than its tangent says)."""
    a_idx, a_obs, b_idx, b_obs = obs
    n_obs = len(a_idx) + len(b_idx)
    layout = _Layout(
        ref=ref,
        compute=tuple(i for i in range(len(prof.names)) if i != ref),
        rho=tuple(i for i in range(len(prof.names)) if not prof.rho_known[i]),
    )
    nc = len(layout.compute)
    x_base = np.concatenate(
        [
            [shipped.alpha, shipped.overhead_s],
            np.log(prof.compute0[list(layout.compute)]),
            np.log(prof.rho0[list(layout.rho)]),
        ]
    )
    lo = np.concatenate(
        [
            [ALPHA_BOUNDS[0], OVERHEAD_BOUNDS[0]],
            np.full(nc, math.log(PROFILE_BOUNDS[0])),
            np.full(len(layout.rho), math.log(RHO_BOUNDS[0])),
        ]
    )
    hi = np.concatenate(
        [
            [ALPHA_BOUNDS[1], OVERHEAD_BOUNDS[1]],
            np.full(nc, math.log(PROFILE_BOUNDS[1])),
            np.full(len(layout.rho), math.log(RHO_BOUNDS[1])),
        ]
    )

    weights = np.ones(n_obs)

    def residuals(x: FloatArray) -> FloatArray:
        alpha, over, c, g = layout.unpack(x, prof)
        pa, pb = terms.means(terms.activity(alpha, over, c, g))
        prior = PRIOR_WEIGHT * (x[2:] - x_base[2:])
        data = np.concatenate([np.log(a_obs / pa[a_idx]), np.log(b_obs / pb[b_idx])])
        return np.concatenate([data * weights, prior])

    c_ref = float(prof.compute0[ref])
    starts = []
    if start is None:
        for share in OVERHEAD_STARTS:
            x0 = x_base.copy()
            x0[1] = share * c_ref
            starts.append(np.clip(x0, lo, hi))
    else:  # the same solution in this time unit: every time x c_ref / its fitted value
        alpha, over, c, g = start.layout.unpack(start.x, prof)
        lam = c_ref / c[ref]
        x0 = np.concatenate(
            [
                [alpha, over * lam],
                np.log(c[list(layout.compute)] * lam),
                np.log((g / c)[list(layout.rho)]),
            ]
        )
        starts.append(np.clip(x0, lo, hi))
    sols = [
        least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", xtol=1e-10, ftol=1e-10)
        for x0 in starts
    ]
    sol = min(sols, key=lambda r: float(r.cost))
    res = np.asarray(sol.fun, dtype=np.float64)[:n_obs]
    s2 = float(res @ res) / max(1, n_obs - layout.size)
    alpha, over, _, _ = layout.unpack(sol.x, prof)
    scale = np.ones(layout.size)
    scale[0], scale[1] = max(alpha, 0.05), max(over, 1e-3 * c_ref)
    jac = np.asarray(sol.jac, dtype=np.float64)[:n_obs]
    cov, unseen = covariance(jac, s2, scale)
    se = np.where(unseen, np.inf, np.sqrt(np.clip(np.diag(cov), 0.0, None)))
    if bootstrap > 0:
        owner = np.concatenate([a_idx, b_idx])
        members = np.unique(owner)
        rng = np.random.default_rng(0)
        draws = []
        for _ in range(bootstrap):
            picked = np.bincount(
                np.searchsorted(members, rng.choice(members, size=members.size)),
                minlength=members.size,
            )
            weights = np.sqrt(picked[np.searchsorted(members, owner)].astype(np.float64))
            again = least_squares(
                residuals, sol.x, bounds=(lo, hi), x_scale="jac", xtol=1e-8, ftol=1e-8
            )
            draws.append((np.asarray(again.x) - sol.x) / scale)
        weights = np.ones(n_obs)
        spread = np.std(np.asarray(draws), axis=0)
        se = np.maximum(se, spread)
    rms = math.sqrt(float(res @ res) / max(1, n_obs))
    return _Solution(layout, np.asarray(sol.x, dtype=np.float64), cov, se, rms)


def _best_reference(sol: _Solution, prof: _Profiles, multi_of: Sequence[bool]) -> int:
    """The time unit that pins the overhead best: among the names ``comm_profiles`` learned
    with multi-node runs, the one whose overhead over compute time (``log o - log c``, what
    its runs see) has the smallest variance; the first name when none has one."""
    layout, cov, se = sol.layout, sol.cov, sol.se
    best, best_var = layout.ref, math.inf
    for i in range(len(prof.names)):
        if not (multi_of[i] and prof.rho_known[i]):
            continue
        if i == layout.ref:
            var = float(cov[1, 1]) if math.isfinite(se[1]) else math.inf
        else:
            k = 2 + layout.compute.index(i)
            finite = math.isfinite(se[1]) and math.isfinite(se[k])
            var = float(cov[1, 1] + cov[k, k] - 2.0 * cov[1, k]) if finite else math.inf
        if var < best_var:
            best, best_var = i, var
    return best


def fit_cluster_calibration(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    since: float | None = None,
    until: float | None = None,
    *,
    cluster: str | None = None,
    shipped: Calibration | None = None,
    train_fraction: float = 0.6,
    min_gpu_s: float = MIN_ACTIVITY_GPU_S,
) -> ClusterFit:
    """Fit ``alpha``, ``overhead_s`` and the job names' profiles on the store's telemetry of
    [since, until) (the module docstring says how; ``job_telemetry`` must be built first:
    ``build_job_telemetry``), validated on the later runs. ``shipped``: the calibration
    whose alpha and overhead start the fit and are scored beside it (default: the shipped
    one). Raises ``ValueError`` when no run has enough activity to fit on."""
    from_t = time.perf_counter()
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    if shipped is None:
        shipped = load_calibration()
    data = load_fit_data(con, topology, since=since, until=until, cluster=cluster)
    runs = data.runs
    usable = runs.filter(
        pl.col("summarized")
        & (
            (pl.col("activity_alone_gpu_s") >= min_gpu_s)
            | (pl.col("activity_beside_gpu_s") >= min_gpu_s)
        )
    )
    if usable.is_empty():
        raise ValueError(
            "no run in the window has enough activity alone or beside others to fit on"
        )
    ends = usable["t1"].sort()
    cut = max(1, math.ceil(train_fraction * usable.height))
    split_time = float(ends[cut - 1]) if cut < usable.height else math.inf
    is_train = pl.col("t1") <= split_time
    train_rows = runs.filter(is_train & pl.col("summarized"))
    prof = _profiles(train_rows, data.telemetry.filter(pl.col("end_time") <= split_time), min_gpu_s)
    index = {n: i for i, n in enumerate(prof.names)}
    run_profile = [index.get(str(n), prof.fallback) for n in runs["name"]]
    terms = contention_terms(
        topology,
        runs["job_id"].to_list(),
        data.placements,
        runs["t0"].to_list(),
        runs["t1"].to_list(),
        run_profile,
        since=data.since,
        until=data.until,
        instants=data.instants,
    )
    has_profile = pl.Series([p != prof.fallback for p in run_profile], dtype=pl.Boolean)
    runs_p = runs.with_columns(has_profile.alias("_profiled"))
    a_idx, a_obs, b_idx, b_obs = _observations(runs_p, is_train & pl.col("_profiled"), min_gpu_s)
    multi_of = [False] * len(prof.names)
    for placement, i in zip(data.placements, run_profile, strict=True):
        if i < len(prof.names) and len(placement.alloc) > 1:
            multi_of[i] = True
    obs = (a_idx, a_obs, b_idx, b_obs)
    first = _solve(terms, prof, 0, obs, shipped, None)
    ref = _best_reference(first, prof, multi_of)
    sol = _solve(terms, prof, ref, obs, shipped, first, BOOTSTRAP)
    layout, x, se = sol.layout, sol.x, sol.se
    n_obs = len(a_idx) + len(b_idx)
    c_ref = float(prof.compute0[ref])
    alpha, over, comp, grad = layout.unpack(x, prof)
    rho_fit = grad / comp

    # --- the report
    fitted_runs = runs_p.filter(is_train & pl.col("_profiled") & pl.col("summarized"))
    note_all = f"{n_obs} activity means of {fitted_runs.height} runs"
    params: dict[str, dict[str, dict[str, Any]]] = {}
    st, basis = _status(
        float(se[0]),
        f"held at its start, the shipped calibration's {shipped.alpha:.4g} (no split rings "
        "sharing a link that the data see)",
        note_all,
    )
    unit = f"in units of {prof.names[ref]}'s isolated iteration (compute_s {c_ref:.4g})"
    so, basis_o = _status(
        float(se[1]),
        "the reference job's multi-node runs alone set it, and they do not",
        note_all,
    )
    params["shared"] = {
        "alpha": parameter_entry(alpha, ALPHA_BOUNDS, st, basis),
        "overhead_s": parameter_entry(over, OVERHEAD_BOUNDS, so, f"{basis_o}; {unit}"),
    }
    prior = f"held near its start by a weak prior (weight {PRIOR_WEIGHT:g})"
    for i, name in enumerate(prof.names):
        runs_note = f"{prof.runs[i]} training runs of {name}"
        c_se = r_se = 0.0
        if i == ref:
            cs, cb = (
                "constrained",
                (
                    "the time unit: telemetry holds ratios only, so the reference job name keeps "
                    f"its comm_profiles compute time (its median activity alone); {unit}"
                ),
            )
        else:
            c_se = float(se[2 + layout.compute.index(i)])
            why = (
                "no run of it spanned several nodes, and only against the overhead of those "
                "is a compute time seen"
                if not multi_of[i]
                else "a compute time is only seen against the overhead"
            )
            cs, cb = _status(c_se, f"{prior}; {why}", runs_note)
            cb = f"{cb}; {unit}"
        if prof.rho_known[i]:
            learned = prof.book.by_name[name]
            rs, rb = (
                "determined",
                (
                    f"by the bytes of {learned.runs} runs alone (comm_profiles; spread "
                    f"{learned.rho_spread:.1%})"
                ),
            )
        else:
            r_se = float(se[2 + len(layout.compute) + layout.rho.index(i)])
            rs, rb = _status(
                r_se, prior, f"the activity of {runs_note} (comm_profiles had no bytes alone)"
            )
        g_se = math.hypot(c_se, r_se)
        if i == ref:
            gs, gb = rs, f"its gradient per compute second in the time unit ({rb})"
        else:
            gs, gb = _status(
                g_se,
                "its compute time is (gradient = compute time x gradient per compute second)",
                runs_note,
            )
        params[f"{PROFILE_PREFIX}name={name}"] = {
            "compute_s": parameter_entry(float(comp[i]), PROFILE_BOUNDS, cs, cb),
            "grad_gb": parameter_entry(float(grad[i]), PROFILE_BOUNDS, gs, gb),
            "gb_per_compute_s": parameter_entry(float(rho_fit[i]), RHO_BOUNDS, rs, rb),
            "runs": {"value": prof.runs[i], "multi_node": multi_of[i]},
        }

    validation = _validate(
        runs_p, terms, layout, prof, x, shipped, split_time, min_gpu_s, (a_idx, a_obs, b_idx, b_obs)
    )
    counts = {
        c: int(runs.filter(pl.col("summarized"))[c].sum())
        for c in ("activity_used", "activity_shared", "activity_bad", "activity_missing")
    }
    summarized = runs.filter(pl.col("summarized"))
    data_info = {
        "since": data.since,
        "until": data.until,
        "hours": (data.until - data.since) / 3600.0,
        "runs_in_window": runs.height,
        "runs_summarized": summarized.height,
        "runs_without_activity": summarized.filter(
            (pl.col("activity_alone_gpu_s").fill_null(0) < min_gpu_s)
            & (pl.col("activity_beside_gpu_s").fill_null(0) < min_gpu_s)
        ).height,
        "runs_fitted": fitted_runs.height,
        "observations": n_obs,
        "job_hours": float(
            (summarized["t1"] - summarized["t0"]).sum() / 3600.0  # type: ignore[operator]
        ),
        "runs_split": int(np.count_nonzero(terms.split)),
        "runs_unknown_nodes": data.unknown_nodes,
        "runs_label_corrected": data.label_corrected,
        "runs_fallback_profile": int(sum(p == prof.fallback for p in run_profile)),
        "samples": counts,
        "min_gpu_s": min_gpu_s,
        "rms_log_residual": sol.rms,
    }
    profiles = {
        f"{PROFILE_PREFIX}name={name}": CommProfile(
            f"{PROFILE_PREFIX}name={name}",
            float(comp[i]),
            float(grad[i]),
            f"fitted on the cluster's telemetry ({prof.runs[i]} runs)",
        )
        for i, name in enumerate(prof.names)
    }
    total = sum(prof.runs[: len(prof.names)])
    mix = {f"{PROFILE_PREFIX}name={n}": prof.runs[i] / total for i, n in enumerate(prof.names)}
    cal = Calibration(
        profiles=profiles,
        alpha=alpha,
        overhead_s=over,
        mix=mix,
        source=f"fitted on the cluster's own telemetry ({summarized.height} runs, "
        f"{data_info['hours']:.1f} h)",
        fit={
            "sharing": "duty",
            "reference": prof.names[ref],
            "parameters": params,
            "data": data_info,
            "validation": validation.to_dict(),
            "shipped": {
                "alpha": shipped.alpha,
                "overhead_s": shipped.overhead_s,
                "source": shipped.source,
            },
        },
    )
    return ClusterFit(cal, prof.names[ref], time.perf_counter() - from_t)


def _validate(
    runs: pl.DataFrame,
    terms: ContentionTerms,
    layout: _Layout,
    prof: _Profiles,
    x: FloatArray,
    shipped: Calibration,
    split_time: float,
    min_gpu_s: float,
    train: tuple[IntArray, FloatArray, IntArray, FloatArray],
) -> Validation:
    later = pl.col("t1") > split_time
    va_idx, va_obs, vb_idx, vb_obs = _observations(runs, later & pl.col("_profiled"), min_gpu_s)
    without = runs.filter(later & pl.col("summarized") & ~pl.col("_profiled")).height
    x_ship = x.copy()
    x_ship[0], x_ship[1] = shipped.alpha, shipped.overhead_s
    x_ship[2 : 2 + len(layout.compute)] = np.log(prof.compute0[list(layout.compute)])
    x_ship[2 + len(layout.compute) :] = np.log(prof.rho0[list(layout.rho)])

    def predict(xv: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        alpha, over, c, g = layout.unpack(xv, prof)
        pa, pb = terms.means(terms.activity(alpha, over, c, g))
        return pa, pb, terms.isolated(over, c, g)

    obs = np.concatenate([va_obs, vb_obs])
    _, ta_obs, tb_idx, tb_obs = train
    fa, fb, fiso = predict(x)
    const_act = float(np.mean(np.concatenate([ta_obs, tb_obs])))
    const_drop = float(np.mean(tb_obs / fiso[tb_idx])) if tb_idx.size else 1.0

    def scores(pa: FloatArray, pb: FloatArray, iso: FloatArray) -> tuple[PairScore, PairScore]:
        act = _score(np.concatenate([pa[va_idx], pb[vb_idx]]), obs)
        drop = _score(pb[vb_idx] / iso[vb_idx], vb_obs / iso[vb_idx])
        return act, drop

    act_fit, drop_fit = scores(fa, fb, fiso)
    act_ship, drop_ship = scores(*predict(x_ship))
    return Validation(
        split_time=split_time,
        runs=len(np.union1d(va_idx, vb_idx)),
        without_profile=without,
        activity_fit=act_fit,
        activity_shipped=act_ship,
        activity_constant_mae=float(np.mean(np.abs(obs - const_act))) if obs.size else math.nan,
        drop_fit=drop_fit,
        drop_shipped=drop_ship,
        drop_constant_mae=(
            float(np.mean(np.abs(vb_obs / fiso[vb_idx] - const_drop))) if vb_idx.size else math.nan
        ),
    )


def _score(pred: FloatArray, obs: FloatArray) -> PairScore:
    if pred.size == 0:
        return PairScore(mae=math.nan, spearman=math.nan, n=0)
    if pred.size == 1:
        return PairScore(mae=float(abs(pred[0] - obs[0])), spearman=math.nan, n=1)
    return score(pred, obs)


# ------------------------------------------------------------------------ the report


def render_fit_text(fit: ClusterFit) -> str:
    """What ``linkwise calibrate --db`` prints: the data, every parameter with its status,
    the validation."""
    cal = fit.calibration
    d = cal.fit["data"]
    v = cal.fit["validation"]
    lines = [
        f"fitted on {d['runs_summarized']} runs ({d['job_hours']:.1f} job-hours over "
        f"{d['hours']:.1f} h; {d['runs_fitted']} in the training part, {d['observations']} "
        f"activity means), rms log residual {d['rms_log_residual']:.3f}",
        f"samples: {d['samples']['activity_used']} used, {d['samples']['activity_shared']} "
        f"shared, {d['samples']['activity_bad']} bad, {d['samples']['activity_missing']} "
        f"missing (bad and missing left out); {d['runs_without_activity']} runs without "
        f"enough activity, {d['runs_unknown_nodes']} on unknown nodes, "
        f"{d['runs_fallback_profile']} with the fallback profile",
        f"time unit: {fit.reference}'s isolated iteration",
        "",
        f"{'parameter':44s} {'value':>11s}  status",
    ]
    for group, entries in fit.parameters.items():
        for name, e in entries.items():
            if "status" not in e:
                continue
            lines.append(
                f"{group + '.' + name:44s} {e['value']:11.4g}  {e['status']}: {e['basis']}"
            )
    drop, act = v["drop"], v["activity"]

    def fmt(s: Mapping[str, Any]) -> str:
        mae = "n/a" if s["mae"] is None else f"{s['mae']:.4f}"
        rho = "n/a" if s["spearman"] is None else f"{s['spearman']:.3f}"
        return f"MAE {mae}, Spearman {rho} (n={s['n']})"

    def const(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    lines += [
        "",
        f"validation on {v['runs']} later runs ({v['without_profile']} without a profile "
        "from the training part, left out):",
        f"  activity means: fitted {fmt(act['fit'])}; shipped alpha/overhead "
        f"{fmt(act['shipped'])}; constant MAE {const(act['constant_mae'])}",
        f"  drop beside others: fitted {fmt(drop['fit'])}; shipped {fmt(drop['shipped'])}; "
        f"constant MAE {const(drop['constant_mae'])}",
    ]
    return "\n".join(lines) + "\n"
