"""Stage 2: the sharing penalty ``alpha`` from DeepShare's shared/isolated ratios, each pair
predicted by ``AnalyticModel`` on DeepShare's placement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

from linkwise.cluster.calibration.bounds import ALPHA_BOUNDS, snap_to_zero
from linkwise.cluster.calibration.measurements import (
    DEEPSHARE_SPEC,
    DEEPSHARE_SPEC_8,
    FloatArray,
    JobType,
)
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.topology.spec import from_spec


def pair_placement(
    a: JobType, b: JobType, fabric: str = ""
) -> tuple[Topology, Placement, Placement]:
    """DeepShare's pair experiment on a topology: both jobs on the same (first) nodes.

    Each job takes ``gpus / nodes`` GPUs on nodes ``0..nodes-1``; the smaller one's nodes are
    all shared. A 4x8 topology, or 8x8 when either job spans 8 nodes (see DEEPSHARE_SPEC_8);
    ``fabric``: spec options appended to it (e.g. ``",ecmp=1"``).
    """
    topo = from_spec((DEEPSHARE_SPEC_8 if max(a[2], b[2]) > 4 else DEEPSHARE_SPEC) + fabric)
    return topo, _spread(a), _spread(b)


def _spread(t: JobType) -> Placement:
    _, gpus, nodes = t
    if gpus % nodes:
        raise ValueError(f"job type {t}: {gpus} GPUs do not divide over {nodes} nodes")
    return Placement.of([(i, gpus // nodes) for i in range(nodes)])


def _job(t: JobType, job_id: int) -> Job:
    return Job(job_id=job_id, submit_time=0.0, num_gpus=t[1], duration=1.0, profile=t[0])


def predict_pair_ratios(
    model: AnalyticModel, types: Sequence[JobType], fabric: str = ""
) -> FloatArray:
    """The model's shared/isolated ratio for every (measured, neighbour) pair, via ``rates``.

    ``ratio[a, b] = rate of a next to b / rate of a alone``, both on DeepShare's placement
    (``fabric``: as ``pair_placement``'s).
    """
    out = np.empty((len(types), len(types)))
    for i, a in enumerate(types):
        for j, b in enumerate(types):
            topo, pa, pb = pair_placement(a, b, fabric)
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
    this; ``tests/cluster/test_calibration.py`` checks it equals ``predict_pair_ratios``.
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
    return snap_to_zero(float(sol.x[0]))
