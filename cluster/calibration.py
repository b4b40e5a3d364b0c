"""Fit the analytic contention model to real measurements, and check how well it predicts.

Everything here is derived from the third-party measurements in ``shared/data/calibration``
(see its README): DeepShare's isolated and pairwise-shared throughputs (4 nodes x 8 TITAN Xp,
PCIe Gen3, 40 Gb/s InfiniBand) and Pollux's per-placement step and all-reduce times (AWS
g4dn.12xlarge: 4 T4 per node, PCIe, 50 Gb/s Ethernet). Three least-squares fits
(``scipy.optimize.least_squares``):

1. ``fit_deepshare_profiles``: per DeepShare model, ``compute_s`` and ``grad_gb`` of a
   ``CommProfile`` and a scale (samples per iteration per GPU), plus the shared
   ``overhead_s``, from the 6 isolated throughputs per model, in log space.
2. ``fit_alpha``: the sharing penalty ``alpha`` from the 36 x 36 shared/isolated matrix,
   each pair predicted by ``AnalyticModel.rates`` on the two jobs placed on the same nodes.
3. ``fit_pollux_profiles``: per Pollux model, ``grad_gb`` from the all-reduce times across
   placements (one node vs several) and ``compute_s`` at a typical local batch.

``fit_calibration`` runs all three and returns a ``Calibration`` whose ``fit`` holds the
diagnostics (residuals, errors, held-out errors) and ``fit["parameters"]``: per profile, every
fitted parameter with its bounds, whether it sits at one, and whether the measurements
determine it, leave it weakly determined, or a tie, prior or bound constrains it
(``parameter_report``; MoE's compute_s is tied to FSDP's, ``COMPUTE_TIES``).
``write_calibration`` writes the JSON the package ships, ``SHIPPED_CALIBRATION``
(``linkwise calibrate --data ../shared/data --out cluster/data/calibration.json``, or
``python -m linkwise.cli.calibrate``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from scipy.optimize import least_squares
from scipy.stats import spearmanr

from linkwise.cluster.contention import (
    AnalyticModel,
    PairwiseTable,
    ring_iteration_time,
)
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.topology import from_spec

JobType = tuple[str, int, int]  # (model, total GPUs, nodes), e.g. ("MoE", 8, 4)
FloatArray = npt.NDArray[np.float64]

SHIPPED_CALIBRATION = Path(__file__).resolve().parent / "data" / "calibration.json"
DEEPSHARE_MODELS = ("MobileNetV3", "GraphSage", "FSDP", "Transformer-XL", "DLRM", "MoE")
POLLUX_MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

# Per-GPU batch size of each DeepShare job, from its launch script
# (github.com/gajagajago/deepshare, slurm_examples/job_launch_scripts/isolated/*.sh, and the
# argparse defaults of slurm_examples/fsdp.py and moe.py for the two that pass none). Its
# profiler counts ``batch_size * world_size`` samples per step, so this is the scale that turns
# iterations into the samples/s of isolated_thp.csv.
DEEPSHARE_BATCH: Mapping[str, float] = {
    "MobileNetV3": 16.0,
    "GraphSage": 1024.0,
    "FSDP": 8.0,
    "Transformer-XL": 16.0,
    "DLRM": 48.0,
    "MoE": 8.0,
}

# DeepShare testbed: 40 Gb/s InfiniBand = 5 GB/s per node, PCIe Gen3 (topology.PCIE_GBPS, 12
# GB/s) inside a node. Its jobs run NCCL over sockets (NCCL_IB_DISABLE=1), which reach less
# than the nominal 5 GB/s; with no single-node measurement the two cannot be told apart, so the
# fitted grad_gb is the effective volume at the nominal 5 GB/s.
DEEPSHARE_NIC_GBPS = 5.0
DEEPSHARE_SPEC = "4x8,pcie,nic=5,leaf=4"
# The "<model>,8,8" types span 8 nodes although the testbed has 4: their throughputs differ from
# the 8,4 types by up to 1.7x in both directions (MobileNetV3 +9%, Transformer-XL -40%), so
# they are not 8 processes packed onto the same 4 nodes (that is the 8,4 job). We read them as
# 8 nodes x 1 GPU (DeepShare's four nodes, elsa-10, -11, -13 and -15, belong to a larger
# cluster) and place them on 8 nodes of the same kind.
DEEPSHARE_SPEC_8 = "8x8,pcie,nic=5,leaf=8"

# Pollux testbed (OSDI'21): 16 AWS g4dn.12xlarge nodes, 4 NVIDIA T4 each on PCIe Gen3, 50 Gb/s
# network (6.25 GB/s nominal). The effective network bandwidth is fitted (see
# fit_pollux_profiles); the intra-node one is taken as PCIe Gen3's 12 GB/s.
POLLUX_NIC_GBPS = 6.25
POLLUX_INTRA_GBPS = 12.0

# DeepShare models whose compute_s is one parameter with another model's. DeepShare's isolated
# throughputs do not determine MoE's compute_s (its own error is 0.289 to 0.299 whether compute
# is 0% or 50% of its iteration, ``compute_share_scan``); fitted free it runs to the lower
# bound 1e-9, a purely communication-bound job. MoE and FSDP are the same model body in
# DeepShare's launch scripts: fairscale's benchmark TransformerLM (``golden_configs.lm_wikitext2``)
# on WikiText-2 with a per-GPU batch of 8 on the same TITAN Xp GPUs (slurm_examples/moe.py,
# fsdp.py); MoE swaps the feed-forward blocks for experts and trains under DDP, so its gradient
# is larger (which the fit keeps free) while the compute per iteration stays that of the same
# network and batch. FSDP's compute_s is determined by its own throughputs (20% of its
# 2-GPU iteration), so MoE shares it: MoE's compute share becomes 15% of its 2-GPU iteration,
# inside the flat valley (its error 0.291 against 0.289 free).
COMPUTE_TIES: Mapping[str, str] = {"MoE": "FSDP"}

# Weight of the log-space prior that ties each DeepShare scale to DEEPSHARE_BATCH.
DEFAULT_SCALE_PRIOR_WEIGHT = 1.0
# Bounds of the fits: compute_s, grad_gb and scale of stage 1 (log space), overhead_s (s),
# alpha (stage 2), and the floor of a Pollux compute_s (stage 3). The parameter report
# (``parameter_report``) says which fitted values sit at one, and why.
PROFILE_BOUNDS = (1e-9, 1e6)
OVERHEAD_BOUNDS = (0.0, 10.0)
ALPHA_BOUNDS = (0.0, 100.0)
POLLUX_COMPUTE_FLOOR = 1e-6
# Starting values of overhead_s (seconds) for the multi-start fit of stage 1.
OVERHEAD_STARTS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)


# ----------------------------------------------------------------------------- loading


def calibration_dir(data_dir: str | Path) -> Path:
    """``data_dir/calibration`` for the shared/data root (or ``data_dir`` if it is that folder)."""
    root = Path(data_dir)
    for candidate in (root / "calibration", root):
        if (candidate / "deepshare").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no calibration/deepshare under {root} (expected the shared/data folder)"
    )


def _parse_type(key: str) -> JobType:
    model, gpus, nodes = (part.strip() for part in key.split(","))
    return model, int(gpus), int(nodes)


def load_deepshare(data_dir: str | Path) -> PairwiseTable:
    """DeepShare's isolated throughputs and 36 x 36 shared/isolated ratios.

    Keys like ``"MobileNetV3,2,2"`` become ``("MobileNetV3", 2, 2)``; in the ratio matrix the
    row is the job measured and the column its neighbour. Types keep the files' order.
    """
    folder = calibration_dir(data_dir) / "deepshare"
    iso = pl.read_csv(folder / "isolated_thp.csv")
    key_col = iso.columns[0]
    isolated = {
        _parse_type(k): float(v)
        for k, v in zip(iso[key_col].to_list(), iso["isol_thp"].to_list(), strict=True)
    }
    mat = pl.read_csv(folder / "shared_thp_ratio.csv")
    row_col = mat.columns[0]
    cols = [_parse_type(c) for c in mat.columns[1:]]
    ratio: dict[tuple[JobType, JobType], float] = {}
    for row in mat.iter_rows():
        a = _parse_type(str(row[0]))
        for b, value in zip(cols, row[1:], strict=True):
            ratio[(a, b)] = float(value)
    rows = {_parse_type(str(r)) for r in mat[row_col].to_list()}
    if rows != set(isolated) or set(cols) != set(isolated):
        raise ValueError(f"{folder}: the ratio matrix and the isolated table name different types")
    return PairwiseTable(isolated=isolated, ratio=ratio)


def load_pollux(data_dir: str | Path) -> dict[str, pl.DataFrame]:
    """Pollux's per-placement measurements, one frame per model.

    Columns: ``placement`` (GPUs per node, e.g. ``"1111"`` = 4 nodes x 1 GPU, ``"4"`` = one
    node x 4), ``local_bsz``, ``step_time``, ``sync_time`` (seconds), and derived ``gpus`` and
    ``nodes``.
    """
    folder = calibration_dir(data_dir) / "pollux_placements"
    out: dict[str, pl.DataFrame] = {}
    for path in sorted(folder.glob("*/placements.csv")):
        df = pl.read_csv(path, schema_overrides={"placement": pl.Utf8})
        digits = df["placement"].str.split("")
        out[path.parent.name] = df.with_columns(
            gpus=digits.list.eval(pl.element().cast(pl.Int64)).list.sum(),
            nodes=df["placement"].str.len_chars().cast(pl.Int64),
        )
    if not out:
        raise FileNotFoundError(f"no */placements.csv under {folder}")
    return out


def table_types(table: PairwiseTable) -> tuple[JobType, ...]:
    """The table's job types in file order."""
    return tuple(table.isolated)


def ratio_matrix(table: PairwiseTable) -> FloatArray:
    """The measured shared/isolated ratios as a matrix (row: job measured, column: neighbour)."""
    types = table_types(table)
    return np.array([[table.ratio[(a, b)] for b in types] for a in types], dtype=np.float64)


# ----------------------------------------------------------------------------- stage 1


@dataclass(frozen=True)
class IsolatedFit:
    """Stage 1's result: DeepShare profiles, scales and the overhead, with their fit."""

    profiles: Mapping[str, CommProfile]
    scale: Mapping[str, float]  # samples per iteration per GPU
    overhead_s: float
    predicted: Mapping[JobType, float]  # samples/s
    measured: Mapping[JobType, float]

    def rel_errors(self) -> dict[JobType, float]:
        """Predicted / measured - 1 per job type."""
        return {t: self.predicted[t] / self.measured[t] - 1.0 for t in self.measured}

    def rms_log_error(self) -> float:
        """Root mean square of log(predicted / measured)."""
        logs = [math.log(self.predicted[t] / self.measured[t]) for t in self.measured]
        return math.sqrt(sum(x * x for x in logs) / len(logs))


def isolated_throughput(
    profile: CommProfile, scale: float, gpus: int, nodes: int, nic_gbps: float, overhead_s: float
) -> float:
    """Samples/s of a DeepShare job alone: ``scale * gpus / tau(gpus, nodes)``.

    Every DeepShare type spans two or more nodes, so its ring is bottlenecked by the NIC.
    """
    tau = ring_iteration_time(profile, gpus, nodes, nic_gbps, overhead_s)
    return scale * gpus / tau


def fit_deepshare_profiles(
    table: PairwiseTable,
    *,
    nic_gbps: float = DEEPSHARE_NIC_GBPS,
    scale_prior: Mapping[str, float] = DEEPSHARE_BATCH,
    prior_weight: float = DEFAULT_SCALE_PRIOR_WEIGHT,
    fixed_compute: Mapping[str, float] | None = None,
    compute_ties: Mapping[str, str] = COMPUTE_TIES,
) -> IsolatedFit:
    """Fit compute_s, grad_gb and scale per DeepShare model and one overhead_s.

    ``fixed_compute``: models whose compute_s is held at a given value (identifiability
    checks, ``compute_share_scan``). ``compute_ties``: model -> model whose compute_s it
    shares: the fit is run without it, then again with the model's compute_s held at its
    sibling's fitted value (``COMPUTE_TIES``; the sibling's fit is not pulled by the tied
    model's data); a model in ``fixed_compute`` is not tied.

    Model: ``thp(w, n) = scale * w / tau(w, n)``, ``tau`` SJF-BCO's ring iteration time
    (``ring_iteration_time``) at the nominal NIC bandwidth. Least squares on
    ``log(predicted / measured)`` over the 36 types, plus ``prior_weight * log(scale /
    scale_prior)`` per model.

    The prior is needed, not decoration: multiplying every compute_s, grad_gb, scale and
    overhead_s by one factor leaves every throughput unchanged, and a model whose throughput
    does not fall with the number of nodes (MobileNetV3, GraphSage, FSDP) leaves its own scale
    free. The prior sets these free directions to the per-GPU batch sizes of DeepShare's launch
    scripts. With a weak prior the scales drift to unphysical values (Transformer-XL loses its
    gradient and becomes compute plus per-node overhead) that fit the isolated throughputs
    better but predict the measured contention worse than a constant (see
    benchmarks/contention_validation.md).
    """
    types = table_types(table)
    present = {t[0] for t in types}
    models = [m for m in DEEPSHARE_MODELS if m in present] + sorted(present - set(DEEPSHARE_MODELS))
    measured = np.array([table.isolated[t] for t in types])
    index = {m: i for i, m in enumerate(models)}
    nm = len(models)
    prior = np.log(np.array([scale_prior.get(m, 1.0) for m in models]))
    has_prior = np.array([m in scale_prior for m in models], dtype=np.float64)

    ties = {
        m: to
        for m, to in compute_ties.items()
        if m in index and to in index and m not in (fixed_compute or {})
    }
    if ties:  # fit without the tied models' compute, then hold it at their siblings' fitted one
        untied = fit_deepshare_profiles(
            table,
            nic_gbps=nic_gbps,
            scale_prior=scale_prior,
            prior_weight=prior_weight,
            fixed_compute=fixed_compute,
            compute_ties={},
        )
        held = {m: untied.profiles[to].compute_s for m, to in ties.items()}
        return fit_deepshare_profiles(
            table,
            nic_gbps=nic_gbps,
            scale_prior=scale_prior,
            prior_weight=prior_weight,
            fixed_compute={**(fixed_compute or {}), **held},
            compute_ties={},
        )

    def unpack(x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, float]:
        return np.exp(x[:nm]), np.exp(x[nm : 2 * nm]), np.exp(x[2 * nm : 3 * nm]), float(x[-1])

    mi = np.array([index[m] for m, _, _ in types])
    w = np.array([t[1] for t in types], dtype=np.float64)
    n = np.array([t[2] for t in types], dtype=np.float64)

    def predict_fast(x: FloatArray) -> FloatArray:
        # ring_iteration_time, vectorised (every type is split, so the overhead always counts);
        # the final throughputs below go through the model function itself.
        c, g, s, o = unpack(x)
        tau = c[mi] + (g[mi] / w) * 2.0 * (w - 1.0) / nic_gbps + o * n
        return np.asarray(s[mi] * w / tau, dtype=np.float64)

    def predict(x: FloatArray) -> FloatArray:
        c, g, s, o = unpack(x)
        out = np.empty(len(types))
        for k, (m, gpus, nodes) in enumerate(types):
            i = index[m]
            out[k] = isolated_throughput(CommProfile(m, c[i], g[i]), s[i], gpus, nodes, nic_gbps, o)
        return out

    def residuals(x: FloatArray) -> FloatArray:
        fit = np.log(predict_fast(x) / measured)
        pri = prior_weight * has_prior * (x[2 * nm : 3 * nm] - prior)
        return np.concatenate([fit, pri])

    # Start: half compute, half network at the smallest measured type, scale at the prior.
    s0 = np.exp(prior)
    tau0 = np.array([s0[index[m]] * w / table.isolated[(m, w, n)] for m, w, n in types])
    first = {m: k for k, (m, _, _) in reversed(list(enumerate(types)))}
    c0 = np.array([0.5 * tau0[first[m]] for m in models])
    w_first = np.array([types[first[m]][1] for m in models])
    g0 = c0 * nic_gbps * w_first / (2.0 * (w_first - 1))
    lo = np.concatenate([np.full(3 * nm, math.log(PROFILE_BOUNDS[0])), [OVERHEAD_BOUNDS[0]]])
    hi = np.concatenate([np.full(3 * nm, math.log(PROFILE_BOUNDS[1])), [OVERHEAD_BOUNDS[1]]])
    for m, value in (fixed_compute or {}).items():
        c0[index[m]] = value
        lo[index[m]], hi[index[m]] = math.log(value) - 1e-12, math.log(value) + 1e-12
    # The objective has several local minima: start from a few overheads, keep the best.
    starts = [np.concatenate([np.log(c0), np.log(g0), prior, [o0]]) for o0 in OVERHEAD_STARTS]
    sols = [
        least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", xtol=1e-12, ftol=1e-12)
        for x0 in starts
    ]
    sol = min(sols, key=lambda r: float(r.cost))
    c, g, s, o = unpack(sol.x)
    o = _snap(o)
    src = (
        "DeepShare isolated throughput, 4x8 TITAN Xp, 40 Gb/s IB (github.com/gajagajago/deepshare)"
    )
    profiles = {m: CommProfile(m, float(c[i]), float(g[i]), src) for m, i in index.items()}
    pred = predict(sol.x)
    return IsolatedFit(
        profiles=profiles,
        scale={m: float(s[i]) for m, i in index.items()},
        overhead_s=o,
        predicted={t: float(v) for t, v in zip(types, pred, strict=True)},
        measured={t: table.isolated[t] for t in types},
    )


# ----------------------------------------------------------------------------- stage 2


def pair_placement(a: JobType, b: JobType) -> tuple[Topology, Placement, Placement]:
    """DeepShare's pair experiment on a topology: both jobs on the same (first) nodes.

    Each job takes ``gpus / nodes`` GPUs on nodes ``0..nodes-1``; the smaller one's nodes are
    all shared. A 4x8 topology, or 8x8 when either job spans 8 nodes (see DEEPSHARE_SPEC_8).
    """
    topo = from_spec(DEEPSHARE_SPEC_8 if max(a[2], b[2]) > 4 else DEEPSHARE_SPEC)
    return topo, _spread(a), _spread(b)


def _spread(t: JobType) -> Placement:
    _, gpus, nodes = t
    if gpus % nodes:
        raise ValueError(f"job type {t}: {gpus} GPUs do not divide over {nodes} nodes")
    return Placement.of([(i, gpus // nodes) for i in range(nodes)])


def _job(t: JobType, job_id: int) -> Job:
    return Job(job_id=job_id, submit_time=0.0, num_gpus=t[1], duration=1.0, profile=t[0])


def predict_pair_ratios(model: AnalyticModel, types: Sequence[JobType]) -> FloatArray:
    """The model's shared/isolated ratio for every (measured, neighbour) pair, via ``rates``.

    ``ratio[a, b] = rate of a next to b / rate of a alone``, both on DeepShare's placement.
    """
    out = np.empty((len(types), len(types)))
    for i, a in enumerate(types):
        for j, b in enumerate(types):
            topo, pa, pb = pair_placement(a, b)
            ja, jb = _job(a, 0), _job(b, 1)
            shared = model.rates(topo, [(ja, pa), (jb, pb)])[0]
            alone = model.rates(topo, [(ja, pa)])[0]
            out[i, j] = shared / alone
    return out


@dataclass(frozen=True)
class PairTerms:
    """Per-pair quantities of the analytic model that do not depend on alpha.

    For DeepShare's placements every ring shares its bottleneck NIC with its neighbour, so
    ``ratio = t / (t + comm * (f - 1))`` with ``f = 1 + (1 + alpha) * k`` and ``k`` the
    neighbour's weight (its duty cycle, or 1 for whole-flow counting). ``ratios`` evaluates
    this; ``tests/test_calibration.py`` checks it equals ``predict_pair_ratios``.
    """

    t_alone: FloatArray  # (types,) isolated iteration time at the pair placement
    comm: FloatArray  # (types,) its ring all-reduce time
    weight: FloatArray  # (types, types) the neighbour's weight on the shared link

    def ratios(self, alpha: float) -> FloatArray:
        f = 1.0 + (1.0 + alpha) * self.weight
        t = self.t_alone[:, None]
        return np.asarray(t / (t + self.comm[:, None] * (f - 1.0)), dtype=np.float64)


def pair_terms(
    profiles: Mapping[str, CommProfile], overhead_s: float, types: Sequence[JobType], sharing: str
) -> PairTerms:
    """Compute ``PairTerms`` with the analytic model's own functions."""
    cal = Calibration(profiles=profiles, alpha=0.0, overhead_s=overhead_s, mix={})
    model = AnalyticModel(cal, sharing=sharing)
    t_alone = np.empty(len(types))
    comm = np.empty(len(types))
    duty = np.empty(len(types))
    for i, t in enumerate(types):
        topo, p, _ = pair_placement(t, t)
        job = _job(t, 0)
        t_alone[i] = model.iteration_times(topo, [(job, p)])[0]
        duty[i] = model.duty_cycle(topo, job, p)
        comm[i] = duty[i] * t_alone[i]
    if sharing == "flows":
        weight = np.ones((len(types), len(types)))
    else:
        weight = np.tile(duty[None, :], (len(types), 1))
    return PairTerms(t_alone=t_alone, comm=comm, weight=weight)


def fit_alpha(
    terms: PairTerms, measured: FloatArray, mask: npt.NDArray[np.bool_] | None = None
) -> float:
    """Least-squares alpha (>= 0) over the pairs in ``mask`` (default all)."""
    sel = np.ones(measured.shape, dtype=bool) if mask is None else mask

    def residuals(x: FloatArray) -> FloatArray:
        return np.asarray((terms.ratios(float(x[0])) - measured)[sel], dtype=np.float64)

    sol = least_squares(
        residuals, np.array([0.2]), bounds=([ALPHA_BOUNDS[0]], [ALPHA_BOUNDS[1]]), xtol=1e-12
    )
    return _snap(float(sol.x[0]))


def _snap(x: float) -> float:
    """A parameter the optimiser pinned to its lower bound of 0 is exactly 0."""
    return 0.0 if x < 1e-9 else x


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class PairScore:
    """A predictor's error on a set of pairs."""

    mae: float
    spearman: float  # nan for a constant predictor
    n: int


def score(pred: FloatArray, measured: FloatArray) -> PairScore:
    """Mean absolute error and Spearman rank correlation of predicted vs measured ratios."""
    p, m = np.ravel(pred), np.ravel(measured)
    mae = float(np.mean(np.abs(p - m)))
    rho = float(spearmanr(p, m).statistic) if np.ptp(p) > 0 else math.nan
    return PairScore(mae=mae, spearman=rho, n=int(p.size))


@dataclass(frozen=True)
class HeldOut:
    """Held-out scores of the fitted model and of the training-mean predictor."""

    model_mae: tuple[float, ...]
    model_spearman: tuple[float, ...]
    trivial_mae: tuple[float, ...]

    def summary(self) -> dict[str, float]:
        def mean(xs: tuple[float, ...]) -> float:
            return float(np.mean(xs))

        def sd(xs: tuple[float, ...]) -> float:
            return float(np.std(xs))

        return {
            "model_mae": mean(self.model_mae),
            "model_mae_sd": sd(self.model_mae),
            "model_spearman": mean(self.model_spearman),
            "model_spearman_sd": sd(self.model_spearman),
            "trivial_mae": mean(self.trivial_mae),
            "trivial_mae_sd": sd(self.trivial_mae),
            "folds": float(len(self.model_mae)),
        }


def _held_out(
    terms: PairTerms, measured: FloatArray, folds: Sequence[npt.NDArray[np.bool_]]
) -> HeldOut:
    mae: list[float] = []
    rho: list[float] = []
    triv: list[float] = []
    for test in folds:
        train = ~test
        alpha = fit_alpha(terms, measured, train)
        s = score(terms.ratios(alpha)[test], measured[test])
        mae.append(s.mae)
        rho.append(s.spearman)
        triv.append(float(np.mean(np.abs(measured[test] - measured[train].mean()))))
    return HeldOut(tuple(mae), tuple(rho), tuple(triv))


def random_half_folds(
    shape: tuple[int, int], repeats: int, seed: int
) -> list[npt.NDArray[np.bool_]]:
    """``repeats`` random halves of the pairs (the test half of each split)."""
    rng = np.random.default_rng(seed)
    n = shape[0] * shape[1]
    out = []
    for _ in range(repeats):
        test = np.zeros(n, dtype=bool)
        test[rng.permutation(n)[: n // 2]] = True
        out.append(test.reshape(shape))
    return out


def leave_one_model_out_folds(types: Sequence[JobType]) -> dict[str, npt.NDArray[np.bool_]]:
    """Per model, the pairs that involve it (as the job measured or as the neighbour)."""
    models = sorted({t[0] for t in types})
    out = {}
    for m in models:
        hit = np.array([t[0] == m for t in types])
        out[m] = hit[:, None] | hit[None, :]
    return out


def cross_validate(
    terms: PairTerms,
    measured: FloatArray,
    types: Sequence[JobType],
    *,
    repeats: int = 50,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Alpha refitted on part of the pairs, scored on the rest.

    ``random_half``: 50 random halves. ``leave_one_model_out``: every pair that involves one
    model held out in turn (pooled over the 6 folds). The profiles come from the isolated
    throughputs (another measurement) in both; only alpha sees the matrix.
    """
    halves = _held_out(terms, measured, random_half_folds(measured.shape, repeats, seed))
    lomo_folds = leave_one_model_out_folds(types)
    lomo = _held_out(terms, measured, list(lomo_folds.values()))
    out = {"random_half": halves.summary(), "leave_one_model_out": lomo.summary()}
    out["leave_one_model_out"].update(
        {f"mae[{m}]": v for m, v in zip(lomo_folds, lomo.model_mae, strict=True)}
    )
    return out


# ----------------------------------------------------------------------------- stage 3


@dataclass(frozen=True)
class PolluxFit:
    """Stage 3's result: Pollux profiles and the testbed's effective network bandwidth."""

    profiles: Mapping[str, CommProfile]
    nic_effective_gbps: float
    typical_local_bsz: Mapping[str, float]
    rms_log_error: Mapping[str, float]  # per model, over its placements of 2+ GPUs


def _pollux_sync_table(frames: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
    parts = [
        df.filter(pl.col("gpus") > 1)
        .group_by("placement", "gpus", "nodes")
        .agg(pl.col("sync_time").median())
        .with_columns(model=pl.lit(name))
        for name, df in sorted(frames.items())
    ]
    return pl.concat(parts).sort("model", "placement")


def fit_pollux_profiles(
    frames: Mapping[str, pl.DataFrame],
    overhead_s: float,
    *,
    intra_gbps: float = POLLUX_INTRA_GBPS,
) -> PolluxFit:
    """Fit grad_gb per Pollux model and one effective network bandwidth; compute_s directly.

    sync_time is Pollux's measured all-reduce. Per placement of 2+ GPUs its median over local
    batches is predicted as ``ring_iteration_time`` of a profile with zero compute: the ring on
    one node at ``intra_gbps`` (PCIe Gen3), across nodes at the fitted effective network
    bandwidth, plus ``overhead_s`` per node. Least squares in log space; the parameters are
    log grad_gb per model and one log bandwidth shared by all models. The nominal 6.25 GB/s
    cannot fit one-node and multi-node sync times together: a ring across nodes is 5 to 10
    times slower than on one node, not 2 (AWS caps a single TCP flow well below the NIC rate).

    compute_s: a line fitted to ``step_time - sync_time`` against ``local_bsz`` over all rows
    (compute does not depend on placement), evaluated at the median local batch.
    """
    sync = _pollux_sync_table(frames)
    models = sorted(frames)
    index = {m: i for i, m in enumerate(models)}
    mi = np.array([index[m] for m in sync["model"].to_list()])
    gpus = sync["gpus"].to_numpy()
    nodes = sync["nodes"].to_numpy()
    measured = sync["sync_time"].to_numpy()

    def predict(x: FloatArray) -> FloatArray:
        g, nic = np.exp(x[:-1]), float(np.exp(x[-1]))
        out = np.empty(len(measured))
        for k in range(len(measured)):
            prof = CommProfile(models[mi[k]], 0.0, float(g[mi[k]]))
            bw = nic if nodes[k] > 1 else intra_gbps
            out[k] = ring_iteration_time(prof, int(gpus[k]), int(nodes[k]), bw, overhead_s)
        return out

    w = gpus.astype(np.float64)
    split = nodes > 1

    def predict_fast(x: FloatArray) -> FloatArray:
        # ring_iteration_time with zero compute, vectorised; ``res`` below uses the function.
        g, nic = np.exp(x[:-1]), float(np.exp(x[-1]))
        bw = np.where(split, nic, intra_gbps)
        comm = (g[mi] / w) * 2.0 * (w - 1.0) / bw
        return np.asarray(comm + np.where(split, overhead_s * nodes, 0.0), dtype=np.float64)

    def residuals(x: FloatArray) -> FloatArray:
        return np.asarray(np.log(predict_fast(x) / measured), dtype=np.float64)

    x0 = np.concatenate([np.zeros(len(models)), [math.log(POLLUX_NIC_GBPS)]])
    sol = least_squares(residuals, x0, xtol=1e-12, ftol=1e-12)
    res = np.log(predict(sol.x) / measured)
    g = np.exp(sol.x[:-1])
    src = (
        "Pollux placements, 16x4 T4 (AWS g4dn.12xlarge) (github.com/petuum/adaptdl osdi21-artifact)"
    )
    profiles: dict[str, CommProfile] = {}
    typical: dict[str, float] = {}
    for m in models:
        df = frames[m]
        bsz = df["local_bsz"].to_numpy().astype(np.float64)
        compute = (df["step_time"] - df["sync_time"]).to_numpy()
        slope, intercept = np.polyfit(bsz, compute, 1)
        typical[m] = float(np.median(bsz))
        compute_s = max(float(intercept + slope * typical[m]), POLLUX_COMPUTE_FLOOR)
        profiles[m] = CommProfile(m, compute_s, float(g[index[m]]), src)
    rms = {m: float(np.sqrt(np.mean(res[mi == index[m]] ** 2))) for m in models}
    return PolluxFit(profiles, float(np.exp(sol.x[-1])), typical, rms)


# ----------------------------------------------------------------------------- all together


SOURCE = (
    "fitted by linkwise.cluster.calibration from shared/data/calibration: DeepShare "
    "(github.com/gajagajago/deepshare scheduler/jobs: isolated_thp.csv, shared_thp_ratio.csv) "
    "and Pollux (github.com/petuum/adaptdl osdi21-artifact simulator/traces/*/placements.csv)"
)


def _type_key(t: JobType) -> str:
    return f"{t[0]},{t[1]},{t[2]}"


def _clean(x: float) -> float | None:
    return None if math.isnan(x) else x


def fit_calibration(
    data_dir: str | Path, *, prior_weight: float = DEFAULT_SCALE_PRIOR_WEIGHT
) -> Calibration:
    """Fit every parameter of the analytic model from shared/data (stages 1-3 above).

    Profiles: the 6 DeepShare and 6 Pollux models, named by model. ``alpha`` is fitted for
    duty-cycle sharing (``AnalyticModel``'s default); ``fit["alpha_flows"]`` for SJF-BCO's flow
    count. ``mix`` is uniform over the 12 profiles: the Philly trace names no models, and no
    measurement says which of these models its jobs were.
    """
    table = load_deepshare(data_dir)
    frames = load_pollux(data_dir)
    iso = fit_deepshare_profiles(table, prior_weight=prior_weight)
    types = table_types(table)
    measured = ratio_matrix(table)
    fits: dict[str, Any] = {}
    alphas: dict[str, float] = {}
    for sharing in ("duty", "flows"):
        terms = pair_terms(iso.profiles, iso.overhead_s, types, sharing)
        alpha = fit_alpha(terms, measured)
        alphas[sharing] = alpha
        in_sample = score(terms.ratios(alpha), measured)
        cv = cross_validate(terms, measured, types)
        fits[sharing] = {
            "alpha": alpha,
            "mae": in_sample.mae,
            "spearman": in_sample.spearman,
            "cv_random_half": cv["random_half"],
            "cv_leave_one_model_out": cv["leave_one_model_out"],
        }
    pollux = fit_pollux_profiles(frames, iso.overhead_s)
    profiles = {**iso.profiles, **pollux.profiles}
    scan = compute_share_scan(table, prior_weight=prior_weight)
    rel = iso.rel_errors()
    abs_rel = sorted(abs(v) for v in rel.values())
    fit: dict[str, Any] = {
        "sharing": "duty",
        "alpha_flows": alphas["flows"],
        "deepshare_isolated": {
            "nic_gbps": DEEPSHARE_NIC_GBPS,
            "prior_weight": prior_weight,
            "scale": dict(iso.scale),
            "scale_prior": dict(DEEPSHARE_BATCH),
            "rms_log_error": iso.rms_log_error(),
            "median_abs_rel_error": float(np.median(abs_rel)),
            "max_abs_rel_error": abs_rel[-1],
            "rel_error": {_type_key(t): v for t, v in rel.items()},
            "compute_ties": dict(COMPUTE_TIES),
            "compute_share_scan": {m: {str(k): v for k, v in e.items()} for m, e in scan.items()},
        },
        "deepshare_pairs": {
            "n_pairs": int(measured.size),
            "measured_mean": float(measured.mean()),
            "trivial_mae": float(np.mean(np.abs(measured - measured.mean()))),
            **{sharing: _nan_to_none(v) for sharing, v in fits.items()},
        },
        "pollux": {
            "nic_nominal_gbps": POLLUX_NIC_GBPS,
            "nic_effective_gbps": pollux.nic_effective_gbps,
            "intra_gbps": POLLUX_INTRA_GBPS,
            "typical_local_bsz": dict(pollux.typical_local_bsz),
            "rms_log_error": dict(pollux.rms_log_error),
        },
        "parameters": parameter_report(iso, scan, alphas, pollux, prior_weight),
    }
    return Calibration(
        profiles=profiles,
        alpha=alphas["duty"],
        overhead_s=iso.overhead_s,
        mix={name: 1.0 for name in profiles},
        source=SOURCE,
        fit=fit,
    )


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, float):
        return _clean(value)
    return value


def write_calibration(cal: Calibration, path: str | Path) -> None:
    """Write a calibration as the JSON ``load_calibration`` reads."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=2) + "\n")


# ----------------------------------------------------------------------------- checks


@dataclass(frozen=True, slots=True)
class SpreadCheck:
    """One Pollux model's spread-against-consolidated slowdowns, predicted with that model held
    out of the network fit: per (GPUs, nodes, local batch), measured and predicted."""

    model: str
    rows: tuple[tuple[int, int, int, float, float], ...]  # gpus, nodes, bsz, measured, predicted

    @property
    def mean_abs_rel_error(self) -> float:
        return float(np.mean([abs(p / m - 1.0) for *_, m, p in self.rows])) if self.rows else 0.0


def pollux_spread_checks(
    frames: Mapping[str, pl.DataFrame], overhead_s: float, *, intra_gbps: float = POLLUX_INTRA_GBPS
) -> tuple[SpreadCheck, ...]:
    """How well the analytic model predicts spreading a job over more nodes, out of sample.

    For each Pollux model: the network bandwidth is fitted on the other models only
    (``fit_pollux_profiles``); its gradient size from its own one-node sync times and its
    compute time from its own one-node rows (a line in the local batch), so none of its
    multi-node measurements is used. Then for every GPU count measured on more than the
    fewest nodes, the step-time ratio (more nodes / fewest nodes, same local batch, medians)
    is predicted with ``ring_iteration_time`` and compared with the measured one.
    """
    out = []
    for held in sorted(frames):
        others = {m: df for m, df in frames.items() if m != held}
        if not others:
            continue
        nic = fit_pollux_profiles(others, overhead_s, intra_gbps=intra_gbps).nic_effective_gbps
        df = frames[held]
        one = df.filter(pl.col("nodes") == 1)
        multi_gpu = one.filter(pl.col("gpus") > 1)
        if multi_gpu.is_empty():
            continue
        w1 = multi_gpu["gpus"].to_numpy().astype(np.float64)
        grad = float(
            np.median(multi_gpu["sync_time"].to_numpy() * w1 * intra_gbps / (2.0 * (w1 - 1.0)))
        )
        bsz1 = one["local_bsz"].to_numpy().astype(np.float64)
        slope, intercept = np.polyfit(bsz1, (one["step_time"] - one["sync_time"]).to_numpy(), 1)
        med = df.group_by("gpus", "nodes", "local_bsz").agg(pl.col("step_time").median())
        fewest = med.group_by("gpus").agg(pl.col("nodes").min().alias("n0"))
        med = med.join(fewest, on="gpus")
        base = med.filter(pl.col("nodes") == pl.col("n0")).select(
            "gpus", "local_bsz", pl.col("step_time").alias("t0")
        )
        spread = med.filter(pl.col("nodes") > pl.col("n0")).join(base, on=["gpus", "local_bsz"])
        rows = []
        for r in spread.sort("gpus", "nodes", "local_bsz").iter_rows(named=True):
            prof = CommProfile(held, max(float(intercept + slope * r["local_bsz"]), 1e-6), grad)
            n0 = int(r["n0"])

            def tau(
                nodes: int, prof: CommProfile = prof, gpus: int = int(r["gpus"]), net: float = nic
            ) -> float:
                bw = net if nodes > 1 else intra_gbps
                return ring_iteration_time(prof, gpus, nodes, bw, overhead_s)

            rows.append(
                (
                    int(r["gpus"]),
                    int(r["nodes"]),
                    int(r["local_bsz"]),
                    float(r["step_time"] / r["t0"]),
                    tau(int(r["nodes"])) / tau(n0),
                )
            )
        out.append(SpreadCheck(held, tuple(rows)))
    return tuple(out)


def compute_share_scan(
    table: PairwiseTable,
    shares: Sequence[float] = (0.05, 0.1, 0.25, 0.5),
    **fit_kwargs: Any,
) -> dict[str, dict[float, float]]:
    """How well the isolated throughputs determine each DeepShare model's compute time.

    For each model and each share, the stage-1 fit is redone with that model's compute_s
    held at ``share`` of its iteration time at its smallest measured type (its gradient,
    scale and every other model free), and the model's own rms log error is returned; the
    key ``-1.0`` holds the free fit's error and ``-2.0`` its fitted share. A model whose
    error barely moves across shares has an undetermined compute_s.
    """
    base = fit_deepshare_profiles(table, **fit_kwargs)
    types = table_types(table)
    out: dict[str, dict[float, float]] = {}
    for m in sorted({t[0] for t in types}):
        mine = [t for t in types if t[0] == m]
        smallest = min(mine, key=lambda t: (t[1], t[2]))
        tau = base.scale[m] * smallest[1] / table.isolated[smallest]
        errs = {
            -1.0: float(
                np.sqrt(
                    np.mean([math.log(base.predicted[t] / base.measured[t]) ** 2 for t in mine])
                )
            ),
            -2.0: base.profiles[m].compute_s / tau,
        }
        for share in shares:
            fit = fit_deepshare_profiles(table, fixed_compute={m: share * tau}, **fit_kwargs)
            errs[share] = float(
                np.sqrt(np.mean([math.log(fit.predicted[t] / fit.measured[t]) ** 2 for t in mine]))
            )
        out[m] = errs
    return out


# Across the shares of ``compute_share_scan``, a model's own rms log error must move by more
# than this for its compute_s to count as determined by its throughputs.
DETERMINED_RANGE = 0.02
SCAN_SHARES = ("0.05", "0.1", "0.25", "0.5")


def at_bound(value: float, bounds: Sequence[float | None], rel: float = 1e-6) -> bool:
    """Whether ``value`` sits on either end of ``bounds`` (None: unbounded on that side)."""
    lo, hi = bounds
    if lo is not None and value <= lo + rel * max(abs(lo), 1e-12):
        return True
    return hi is not None and value >= hi - rel * abs(hi)


def parameter_entry(
    value: float, bounds: tuple[float | None, float | None], status: str, basis: str
) -> dict[str, Any]:
    """One parameter of the report; a value at a bound is always reported as constrained."""
    hit = at_bound(value, bounds)
    return {
        "value": value,
        "bounds": list(bounds),
        "at_bound": hit,
        "status": "constrained" if hit else status,
        "basis": basis,
    }


def parameter_report(
    iso: IsolatedFit,
    scan: Mapping[str, Mapping[float, float]],
    alphas: Mapping[str, float],
    pollux: PolluxFit,
    prior_weight: float,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per profile (and ``"shared"`` for the model-wide parameters), each fitted parameter's
    value, its fit bounds, whether it sits at one, and its status with the reason:

    - ``determined``: the measurements pin it (for a DeepShare compute_s: its own error moves
      by more than ``DETERMINED_RANGE`` across a 5-50% compute share);
    - ``weakly determined``: an interior value of a flat valley (kept, but not a measurement);
    - ``constrained``: set by a tie, a prior or a bound, not by its own measurements; every
      value at a fit bound is reported so, with the reason.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    b = PROFILE_BOUNDS
    for m, prof in iso.profiles.items():
        e = scan[m]
        fixed = [e[float(k)] for k in SCAN_SHARES]
        spread = f"its own rms log error {min(fixed):.3f}-{max(fixed):.3f} at a 5-50% share"
        share = f"compute share {e[-2.0]:.0%} of its smallest type's iteration"
        if m in COMPUTE_TIES:
            status = "constrained"
            basis = (
                f"held at {COMPUTE_TIES[m]}'s fitted compute_s (COMPUTE_TIES: the same network "
                f"and per-GPU batch in DeepShare's launch scripts; {share}); its throughputs "
                f"leave it free ({spread})"
            )
        elif max(fixed) - min(fixed) > DETERMINED_RANGE:
            status, basis = "determined", f"by its throughputs ({share}; {spread})"
        else:
            status = "weakly determined"
            basis = (
                f"a flat valley of its throughputs ({share}; {spread}): compute and gradient "
                "trade off"
            )
        grad_status = "weakly determined" if status == "weakly determined" else "determined"
        grad_basis = "by the fall of its throughput with GPUs and nodes, given compute_s"
        out[m] = {
            "compute_s": parameter_entry(prof.compute_s, b, status, basis),
            "grad_gb": parameter_entry(prof.grad_gb, b, grad_status, grad_basis),
            "scale": parameter_entry(
                iso.scale[m],
                b,
                "constrained",
                f"a log-space prior (weight {prior_weight:g}) to the per-GPU batch "
                f"{DEEPSHARE_BATCH.get(m, 1.0):g} of DeepShare's launch script: the "
                "throughputs cannot separate it from a common time scale",
            ),
        }
    for m, prof in pollux.profiles.items():
        out[m] = {
            "compute_s": parameter_entry(
                prof.compute_s,
                (POLLUX_COMPUTE_FLOOR, None),
                "determined",
                "measured: a line through step_time - sync_time against local batch, at the "
                f"median local batch {pollux.typical_local_bsz[m]:g}",
            ),
            "grad_gb": parameter_entry(
                prof.grad_gb,
                (None, None),
                "determined",
                "by its all-reduce times over placements (rms log error "
                f"{pollux.rms_log_error[m]:.2f})",
            ),
        }
    out["shared"] = {
        "alpha": parameter_entry(
            alphas["duty"],
            ALPHA_BOUNDS,
            "determined",
            "by DeepShare's 1296 shared/isolated ratios (cross-validated)",
        ),
        "overhead_s": parameter_entry(
            iso.overhead_s,
            OVERHEAD_BOUNDS,
            "determined",
            "at its lower bound 0: one per-node constant large enough for MoE's and "
            "Transformer-XL's slowdown with nodes would wreck GraphSage's 4 ms iteration, so "
            "the ring model carries no per-node overhead",
        ),
        "alpha_flows": parameter_entry(
            alphas["flows"],
            ALPHA_BOUNDS,
            "determined",
            "SJF-BCO's whole-ring count (a diagnostic, not shipped): at its lower bound 0, "
            "even f(2) = 2 predicts more slowdown than DeepShare measured",
        ),
        "pollux_nic_effective_gbps": parameter_entry(
            pollux.nic_effective_gbps,
            (None, None),
            "determined",
            "by Pollux's one-node against multi-node all-reduce times of all six models",
        ),
    }
    return out
