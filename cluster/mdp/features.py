"""The observation vector: global, per-slot and per-(slot, candidate) features, log-scaled
times and sizes. Only what a real Slurm with a run-time predictor knows is read."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from linkwise.cluster.contention import ContentionModel, min_nodes
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob, Topology
from linkwise.cluster.mdp.candidates import Candidates, candidates, slot_part
from linkwise.cluster.mdp.config import FloatArray, MdpConfig
from linkwise.cluster.mdp.known import predicted_remaining
from linkwise.cluster.mdp.running import RunningRows
from linkwise.cluster.mdp.slowdown import Prediction, link_flows
from linkwise.cluster.mdp.spec import (
    CAND_FEATURES,
    GLOBAL_FEATURES,
    RUN_FEATURES,
    SLOT_FEATURES,
    ObsSpec,
)


def log_count(n: int, scale: float) -> float:
    return math.log1p(n) / math.log1p(scale)


# per running job (by id, the object kept to tell a reused id): the job, the time, its GPUs,
# its log-scaled predicted remaining time, and whether it is predicted to end within the unit
RunningMemo = dict[int, tuple[RunningJob, float, int, float, bool]]


def _global(cands: Candidates, memo: RunningMemo | None = None) -> list[float]:
    c = cands.contention
    return _global_values(cands.state, cands.config, len(cands.slots), c.load, c.slowdown, memo)


def _global_values(
    state: ClusterState,
    cfg: MdpConfig,
    n_slots: int,
    contention_load: Sequence[float] | None,
    split: Sequence[float] | None,
    memo: RunningMemo | None = None,
) -> list[float]:
    """The global features; those that need the contention model's tables (``load``: link
    loads, ``split``: the split running jobs' slowdowns) are NaN where they are None."""
    topo = state.topology
    free = state.free_gpus
    total = topo.total_gpus
    n_nodes = len(topo.nodes)
    hist = [0, 0, 0, 0, 0]
    for node, f in zip(topo.nodes, free, strict=True):
        cap = node.gpus
        if f <= 0:
            hist[0] += 1
        elif f >= cap:
            hist[4] += 1
        elif 4 * f <= cap:
            hist[1] += 1
        elif 2 * f <= cap:
            hist[2] += 1
        else:
            hist[3] += 1
    flows = link_flows(state)
    nic = flows[:n_nodes]
    up = flows[n_nodes : n_nodes + len(topo.leaf_names)]
    fs = cfg.flow_scale
    n_pending, n_running = len(state.pending), len(state.running)
    demand = sum(p.job.num_gpus for p in state.pending)
    nan = math.nan
    if split is None:
        split_share, slowdown_mean, slowdown_max = nan, nan, nan
    else:
        split_share = len(split) / n_running if n_running else 0.0
        if split:
            slowdown_mean = min(cfg.max_slowdown, sum(s - 1.0 for s in split) / len(split))
            slowdown_max = min(cfg.max_slowdown, max(split) - 1.0)
        else:
            slowdown_mean, slowdown_max = 0.0, 0.0
    out = [
        1.0 - sum(free) / total,
        *(h / n_nodes for h in hist),
        sum(nic) / n_nodes / fs,
        max(nic) / fs,
        sum(1 for f in nic if f >= 2) / n_nodes,
        (sum(up) / len(up) / fs) if up else 0.0,
        (max(up) / fs) if up else 0.0,
        nan if contention_load is None else max(contention_load[:n_nodes]) / fs,
        log_count(n_pending, cfg.queue_scale),
        log_count(n_running, cfg.queue_scale),
        split_share,
        demand / total,
        max(0, n_pending - n_slots) / n_pending if n_pending else 0.0,
        slowdown_mean,
        slowdown_max,
        *_running_features(state, cfg, memo),
    ]
    if cfg.time_of_day:
        phase = 2.0 * math.pi * (state.time % 86400.0) / 86400.0
        out += [math.sin(phase), math.cos(phase)]
    return out


def _log_scaled(x: float, unit: float, cap: float) -> float:
    """``log1p(x / unit) / log1p(cap / unit)``, ``x`` clipped to ``[0, cap]``: in [0, 1]."""
    return math.log1p(min(max(x, 0.0), cap) / unit) / math.log1p(cap / unit)


def log_time(seconds: float, cfg: MdpConfig) -> float:
    return _log_scaled(seconds, cfg.time_scale_s, cfg.max_time_s)


def time_from_log(value: float, cfg: MdpConfig) -> float:
    """The seconds a log-scaled time feature (``wait_log``, ``pred_remaining``, ...) stands for:
    the exact inverse of the encoder's scaling below ``max_time_s`` (1 gives ``max_time_s``)."""
    unit, cap = cfg.time_scale_s, cfg.max_time_s
    x = min(max(float(value), 0.0), 1.0)
    return min(cap, math.expm1(x * math.log1p(cap / unit)) * unit)


def log_size(gpu_s: float, cfg: MdpConfig) -> float:
    return _log_scaled(gpu_s, cfg.size_scale_gpu_s, cfg.max_size_gpu_s)


def _running_terms(run: RunningJob, t: float, cfg: MdpConfig) -> tuple[int, float, bool]:
    g = run.job.num_gpus
    rem = predicted_remaining(run.job, run.attained_at(t))
    return g, log_time(rem, cfg), rem <= cfg.time_scale_s


def _running_features(
    state: ClusterState, cfg: MdpConfig, memo: RunningMemo | None = None
) -> list[float]:
    """GPU-weighted mean predicted remaining time of the running jobs (log-scaled), and the
    share of the cluster's GPUs they are predicted to free within ``time_scale_s``. ``memo``
    keeps each running job's terms between the steps of one decision point (the same sums,
    in the same order)."""
    total = state.topology.total_gpus
    t = state.time
    gpus = 0
    weighted = 0.0
    soon = 0
    if memo is None:  # _running_terms inlined: the same operations, in the same order
        unit, cap = cfg.time_scale_s, cfg.max_time_s
        scale = math.log1p(cap / unit)
        log1p = math.log1p
        for r in state.running:
            job = r.job
            g = job.num_gpus
            pred = job.pred_s
            if not pred > 0:
                predicted_remaining(job, 0.0)  # raises: the job has no prediction
            # ``max(0.0, x)`` and ``min(x, cap)`` as conditionals: the same value they return
            # (the first of equal arguments, 0.0 for NaN), without a builtin call each
            rem = pred - (r.attained_gpu_s + g * (t - r.since)) / g
            gpus += g
            if rem > 0.0:  # else its term is 0.0 (log1p(0) / scale): the sum unchanged
                weighted += g * (log1p((rem if rem <= cap else cap) / unit) / scale)
            else:
                rem = 0.0
            if rem <= unit:
                soon += g
        return [weighted / gpus if gpus else 0.0, soon / total if total else 0.0]
    for r in state.running:
        hit = memo.get(id(r))
        if hit is None or hit[0] is not r or hit[1] != t:
            hit = (r, t, *_running_terms(r, t, cfg))
            memo[id(r)] = hit
        _, _, g, lt, ends = hit
        gpus += g
        weighted += g * lt
        if ends:
            soon += g
    return [weighted / gpus if gpus else 0.0, soon / total if total else 0.0]


def _slot_features(cands: Candidates, k: int) -> list[float]:
    return _slot_values(cands.state, cands.config, cands.slots, cands.intensity, cands.ranks, k)


def _slot_values(
    state: ClusterState,
    cfg: MdpConfig,
    slots: Sequence[PendingJob],
    intensity: Sequence[float],
    ranks: Sequence[Sequence[float]],
    k: int,
) -> list[float]:
    if k >= len(slots):
        return [0.0] * len(SLOT_FEATURES)
    pj = slots[k]
    job = pj.job
    topo = state.topology
    remaining = predicted_remaining(job, pj.attained_gpu_s)
    remaining_hi = predicted_remaining(job, pj.attained_gpu_s, upper=True)
    return [
        1.0,
        job.num_gpus / cfg.gpu_scale,
        min_nodes(topo, job.num_gpus) / cfg.node_scale,
        log_time(state.time - job.submit_time, cfg),
        log_size(pj.attained_gpu_s, cfg),
        log_time(remaining, cfg),
        log_time(remaining_hi, cfg),
        log_size(job.pred_s * job.num_gpus, cfg),
        log_size(job.pred_hi_s * job.num_gpus, cfg),
        log_time(job.time_limit, cfg),
        1.0 if job.time_limit > 0 else 0.0,
        intensity[k],
        1.0 if pj.preemptions else 0.0,
        1.0 if job.num_gpus <= state.total_free_gpus else 0.0,
        *ranks[k],
    ]


class _Frag:
    """Partially used nodes before a placement, to score fragmentation after it."""

    def __init__(self, state: ClusterState) -> None:
        self.caps = [n.gpus for n in state.topology.nodes]
        self.free = state.free_gpus
        self.partial = 0
        self.partial_free = 0
        for f, c in zip(self.free, self.caps, strict=True):
            if 0 < f < c:
                self.partial += 1
                self.partial_free += f
        self.total_free = sum(self.free)
        self.memo: dict[Placement, tuple[float, float]] = {}

    def after(self, placement: Placement) -> tuple[float, float]:
        hit = self.memo.get(placement)
        if hit is not None:
            return hit
        partial, partial_free = self.partial, self.partial_free
        for node, g in placement.alloc:
            f, c = self.free[node], self.caps[node]
            if 0 < f < c:
                partial -= 1
                partial_free -= f
            f2 = f - g
            if 0 < f2 < c:
                partial += 1
                partial_free += f2
        left = self.total_free - placement.num_gpus
        hit = (partial / len(self.caps), partial_free / left if left > 0 else 0.0)
        self.memo[placement] = hit
        return hit


def _cand_rows(
    job: Job,
    placements: Sequence[Placement | None],
    predictions: Sequence[Prediction | None],
    redundant: Sequence[bool],
    frag: _Frag,
    topo: Topology,
    cfg: MdpConfig,
) -> list[float]:
    """The CAND_FEATURES of one slot's candidates (zeros for a missing one)."""
    values: list[float] = []
    zeros = [0.0] * len(CAND_FEATURES)
    need = min_nodes(topo, job.num_gpus)
    ms = cfg.max_slowdown
    for c in range(cfg.n_candidates):
        p = placements[c]
        pred = predictions[c]
        if p is None or pred is None:
            values += zeros
            continue
        leaves = len({topo.nodes[n].leaf for n in p.nodes})
        partial, fragmented = frag.after(p)
        values += [
            1.0,
            1.0 if redundant[c] else 0.0,
            min(ms, pred.job_slowdown),
            min(ms, pred.added_slowdown),
            p.num_nodes / cfg.node_scale,
            (p.num_nodes - need) / cfg.node_scale,
            leaves / cfg.leaf_scale,
            partial,
            fragmented,
        ]
    return values


def _running_slot_features(cands: Candidates, rows: RunningRows, r: int) -> list[float]:
    """RUN_FEATURES of running slot ``r``: predictions, service and the models' estimates,
    never the job's true run time, remaining work or rate."""
    cfg, state = cands.config, cands.state
    run = rows.slots[r]
    job = run.job
    topo = state.topology
    attained = run.attained_at(state.time)
    remaining = predicted_remaining(job, attained)
    return [
        1.0,
        job.num_gpus / cfg.gpu_scale,
        run.placement.num_nodes / cfg.node_scale,
        len({topo.nodes[n].leaf for n in run.placement.nodes}) / cfg.leaf_scale,
        log_time(state.time - run.start_time, cfg),
        log_size(attained, cfg),
        log_time(remaining, cfg),
        log_time(predicted_remaining(job, attained, upper=True), cfg),
        log_size(remaining * job.num_gpus, cfg),
        log_time(rows.restart_s[r], cfg),
        min(cfg.max_slowdown, rows.slowdown[r]),
        log_count(run.preemptions, cfg.queue_scale),
        rows.intensity[r],
        *rows.ranks[r],
    ]


def _running_values(cands: Candidates) -> list[float]:
    """The running slots' features, then their migrate candidates' (zeros for empty slots)."""
    cfg = cands.config
    rows = cands.running
    n = len(rows.slots) if rows is not None else 0
    values: list[float] = []
    for r in range(cfg.running_slots):
        if rows is None or r >= n:
            values += [0.0] * len(RUN_FEATURES)
        else:
            values += _running_slot_features(cands, rows, r)
    if not cfg.migrate:
        return values
    topo = cands.state.topology
    for r in range(cfg.running_slots):
        if rows is None or r >= n:
            values += [0.0] * (len(CAND_FEATURES) * cfg.n_candidates)
            continue
        frag = _Frag(rows.bases[r])
        job = rows.slots[r].job
        values += _cand_rows(
            job, rows.placements[r], rows.predictions[r], rows.redundant[r], frag, topo, cfg
        )
    return values


def encode(cands: Candidates, spec: ObsSpec, memo: RunningMemo | None = None) -> FloatArray:
    """The observation vector of a state (deterministic, finite, length ``spec.dim``);
    ``memo`` (a dict the caller keeps for one decision point) saves recomputing the running
    jobs' terms at every step, with the same result."""
    cfg = spec.config
    if cands.config != cfg:
        raise ValueError("candidates were built with another MdpConfig than the spec's")
    values = _global(cands, memo)
    for k in range(cfg.k_slots):
        values += _slot_features(cands, k)
    topo = cands.state.topology
    frag = _Frag(cands.state)
    zeros = [0.0] * len(CAND_FEATURES)
    for k in range(cfg.k_slots):
        if k >= len(cands.slots):
            values += zeros * cfg.n_candidates
            continue
        values += _cand_rows(
            cands.slots[k].job,
            cands.placements[k],
            cands.predictions[k],
            cands.redundant[k],
            frag,
            topo,
            cfg,
        )
    if cfg.running_slots:
        values += _running_values(cands)
    out = np.asarray(values, dtype=np.float32)
    if out.shape[0] != spec.dim:  # pragma: no cover - a bug in the feature lists
        raise AssertionError(f"encoded {out.shape[0]} features, spec has {spec.dim}")
    return out


def encode_partial(
    state: ClusterState, spec: ObsSpec, model: ContentionModel, *, slots: bool = True
) -> FloatArray:
    """``encode(candidates(state, spec.config, model), spec)`` where a feature is known
    without the candidates' placements or the contention model's tables (the global
    features but the link loads and the split jobs' slowdowns, every slot feature), NaN
    elsewhere: the same float32 values there, bit for bit, at a fraction of the cost
    (a feature range checked on these alone before the candidates are built). ``slots``
    False: the global ones only (cheaper still: no slots are chosen)."""
    cfg = spec.config
    if slots:
        part = slot_part(state, cfg, model)
        values = _global_values(state, cfg, len(part.slots), None, None)
        for k in range(cfg.k_slots):
            values += _slot_values(state, cfg, part.slots, part.intensity, part.ranks, k)
    else:
        values = _global_values(state, cfg, -1, None, None)
        values[_BEYOND_SLOTS] = math.nan  # the share of the queue beyond the slots
    values += [math.nan] * (spec.dim - len(values))
    return np.asarray(values, dtype=np.float32)


_BEYOND_SLOTS = GLOBAL_FEATURES.index("beyond_slots_share")


def encode_state(state: ClusterState, spec: ObsSpec, model: ContentionModel) -> FloatArray:
    """``encode(candidates(state, spec.config, model), spec)``."""
    return encode(candidates(state, spec.config, model), spec)
