"""The analytic contention model over a fixed history of placements, as arrays
(``ContentionTerms``): per (segment, run) pair a run's activity for any alpha, overhead and
profiles, and the weights that turn pairs into a run's mean activity alone and beside others
(checked against ``AnalyticModel.rates`` by ``tests/datasets/test_contention_fit.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from linkwise.cluster.contention import min_nodes
from linkwise.cluster.domain import Placement, Topology
from linkwise.datasets.contention_fit.data import FloatArray, IntArray

__all__ = ["ContentionTerms", "contention_terms"]


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
