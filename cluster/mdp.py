"""The decision problem: the one definition of observation, action, mask and reward.

At a decision point the policy takes steps: each step either starts one pending job on
one candidate placement or waits (ends the decision point; time advances).

- Slots: the first ``K`` pending jobs in canonical order (``slot_order="head"``, the
  design's choice), the first ``K`` that fit the free GPUs now (``"fitting"``), the ``K``
  fitting jobs asking the fewest GPUs, oldest first among equals (``"smallest"``, the order
  SJF-BCO starts jobs in; it uses no run-time knowledge), or ``"mixed"``: the heads of four
  orders over the jobs that fit the free GPUs now (``ORDERS``: oldest first; fewest GPUs,
  SJF-BCO's; smallest predicted GPU time ``pred_s x gpus``, QSSF's; least attained
  service, Tiresias-LAS's; ties by submit order in each), taken round-robin in that order
  of orders, each order taking its next job not taken yet, until ``K`` slots (or no
  fitting job) are left. Only predictions are read, never true run times. Every slot
  carries its rank in each of the four orders (``rank_*``: rank / K, 1 beyond the first
  ``K``), whatever ``slot_order``, so one per-row network can tell which order picked it.
- Candidates: per slot, one placement from each of ``P`` deterministic generators
  (``MdpConfig.generators``): the five of ``linkwise.cluster.placement``,
  ``least_contention`` (defined here: among the other generators' placements and a
  best fit inside each leaf switch, the one minimising the job's predicted slowdown plus
  the slowdown it adds to running split jobs) and ``bounded`` (SJF-BCO's consolidated
  placement, ``heuristics._common.bounded_placement``: None when the job would span more
  than ``ceil(span_lambda x n_min)`` servers, so a policy offered only ``bounded``
  candidates waits for consolidation).
- Actions: ``K * P + 1``; ``a < K * P`` is (slot ``a // P``, candidate ``a % P``), the
  last one is "wait". The mask marks empty slots and generators that returned None;
  with ``mask_duplicates`` (default) a candidate equal to an earlier one of the same
  slot is masked too, so each distinct placement has exactly one action. Wait is
  always allowed.
- Observation: a fixed-length float32 vector independent of cluster size (global,
  per-slot, per-(slot, candidate) features), described by an ``ObsSpec`` whose
  ``version`` hashes the feature names, the configuration and ``ENCODER_REVISION``.
  It holds only what a real Slurm with a run-time predictor knows (``docs/INFORMATION.md``):
  submit time, shape, time limit, wait, attained service, and the predictions of
  ``Job.pred_s`` / ``pred_hi_s`` (``datasets.predictor``), never ``Job.duration``,
  ``remaining_s``, a running job's rate or expected end. Times and GPU times are
  ``log1p(x / unit)`` clipped to ``[0, 1]`` (``_log_time``, ``_log_size``;
  ``time_from_log`` inverts the former, e.g. to read a slot's wait). Encoding a job
  without predictions raises ValueError: a run-time predictor fit on history is needed.
- Reward: ``-(jobs in system x dt) / time_scale - contention_weight x contention``;
  starts inside a decision point carry zero reward, so an episode's return is minus
  the total JCT over ``time_scale`` (Little's law).

Compute the candidates once per state (``candidates``) and pass them to
``action_mask``, ``encode`` and ``decode``. Predictions are keyed by (profile, GPU
count, placement), so jobs with the same shape share the work.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.contention import (
    AnalyticModel,
    ContentionModel,
    min_nodes,
    ring_iteration_time,
    sharing_penalty,
)
from linkwise.cluster.domain import (
    WAIT,
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
    Topology,
)
from linkwise.cluster.heuristics._common import bounded_placement
from linkwise.cluster.placement import (
    best_fit,
    first_fit,
    fragment_first_fit,
    least_busy,
    same_leaf,
)

__all__ = [
    "ENCODER_REVISION",
    "GENERATORS",
    "ORDERS",
    "Candidates",
    "InvalidAction",
    "MdpConfig",
    "MdpPolicy",
    "ObsLayout",
    "ObsSpec",
    "StepMatch",
    "StepPolicyAdapter",
    "action_mask",
    "apply_start",
    "candidates",
    "contention_term",
    "decide_by_steps",
    "decision_steps",
    "decode",
    "encode",
    "encode_state",
    "jobs_in_system",
    "make_spec",
    "match_start",
    "obs_layout",
    "predicted_remaining",
    "step_reward",
    "time_from_log",
]

ENCODER_REVISION = 2  # bump when a feature's computation changes without its name changing
GENERATORS: tuple[str, ...] = (
    "best_fit",
    "least_contention",
    "same_leaf",
    "least_busy",
    "first_fit",
    "fragment_first_fit",
    "bounded",
)
SLOT_ORDERS = ("head", "fitting", "smallest", "mixed")
ORDERS = ("submit", "gpus", "gpu_time", "attained")  # the orders "mixed" draws slots from
_BASE_POOL = ("best_fit", "same_leaf", "least_busy", "first_fit", "fragment_first_fit")

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]


class InvalidAction(ValueError):
    """An action that is out of range or masked at this state."""


@dataclass(frozen=True)
class MdpConfig:
    """The shape of the decision problem and its normalisation constants."""

    k_slots: int = 8
    generators: tuple[str, ...] = (
        "best_fit",
        "least_contention",
        "same_leaf",
        "least_busy",
        "first_fit",
    )
    slot_order: str = "head"
    span_lambda: float = 1.0  # "bounded": a job spans at most ceil(span_lambda x n_min) servers
    mask_duplicates: bool = True
    contention_weight: float = 0.0
    time_of_day: bool = False
    time_scale_s: float = 3600.0  # rewards; the unit of waits and predicted run times
    gpu_scale: float = 8.0  # GPU counts
    node_scale: float = 8.0  # nodes spanned
    leaf_scale: float = 4.0  # leaf switches spanned
    size_scale_gpu_s: float = 8.0 * 3600.0  # the unit of GPU times (predicted, attained)
    max_time_s: float = 30 * 86400.0  # times are log1p(t / unit), clipped here, in [0, 1]
    max_size_gpu_s: float = 1e5 * 3600.0  # GPU times likewise
    queue_scale: float = 100.0  # job counts, as log1p(n) / log1p(queue_scale)
    flow_scale: float = 4.0  # rings per link
    max_slowdown: float = 10.0  # slowdowns are clipped to this

    def __post_init__(self) -> None:
        if self.k_slots <= 0:
            raise ValueError("k_slots must be positive")
        if not self.generators:
            raise ValueError("at least one candidate generator is needed")
        unknown = [g for g in self.generators if g not in GENERATORS]
        if unknown:
            raise ValueError(f"unknown generators {unknown} (known: {', '.join(GENERATORS)})")
        if self.slot_order not in SLOT_ORDERS:
            raise ValueError(f"slot_order must be one of {SLOT_ORDERS}, got {self.slot_order!r}")
        scales = [getattr(self, f.name) for f in fields(self) if f.name.endswith("_scale")]
        scales += [self.time_scale_s, self.size_scale_gpu_s, self.max_slowdown]
        scales += [self.max_time_s, self.max_size_gpu_s]
        if not all(0 < s < math.inf for s in scales):
            raise ValueError("normalisation constants must be positive and finite")
        if self.contention_weight < 0:
            raise ValueError("contention_weight must be non-negative")
        if not self.span_lambda >= 1.0:
            raise ValueError(f"span_lambda must be at least 1, got {self.span_lambda}")

    @property
    def n_candidates(self) -> int:
        return len(self.generators)

    @property
    def n_actions(self) -> int:
        return self.k_slots * self.n_candidates + 1

    @property
    def wait_action(self) -> int:
        return self.k_slots * self.n_candidates

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["generators"] = list(self.generators)
        return d

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> MdpConfig:
        known = {f.name for f in fields(MdpConfig)}
        extra = set(data) - known
        if extra:
            raise ValueError(f"unknown MdpConfig fields: {sorted(extra)}")
        kw = dict(data)
        if "generators" in kw:
            kw["generators"] = tuple(kw["generators"])
        return MdpConfig(**kw)


# ------------------------------------------------------------------------ features

_GLOBAL_BASE = (
    "utilisation",
    "free_nodes_none",
    "free_nodes_quarter",
    "free_nodes_half",
    "free_nodes_partial",
    "free_nodes_idle",
    "nic_flows_mean",
    "nic_flows_max",
    "nic_shared_share",
    "uplink_flows_mean",
    "uplink_flows_max",
    "nic_load_max",
    "pending_log",
    "running_log",
    "split_running_share",
    "queue_gpu_demand",
    "beyond_slots_share",
    "running_slowdown_mean",
    "running_slowdown_max",
    "running_pred_remaining",
    "gpus_free_soon",
)
_GLOBAL_TOD = ("time_of_day_sin", "time_of_day_cos")
_SLOT = (
    "present",
    "gpus",
    "min_nodes",
    "wait_log",
    "attained_log",
    "pred_remaining",
    "pred_remaining_hi",
    "pred_gpu_time",
    "pred_gpu_time_hi",
    "time_limit",
    "has_time_limit",
    "comm_intensity",
    "preempted",
    "fits_now",
    *(f"rank_{o}" for o in ORDERS),
)
_CAND = (
    "feasible",
    "redundant",
    "job_slowdown",
    "added_slowdown",
    "nodes",
    "extra_nodes",
    "leaves",
    "partial_nodes_after",
    "fragmented_free_after",
)


def _feature_names(cfg: MdpConfig) -> tuple[str, ...]:
    names = [f"g.{n}" for n in _GLOBAL_BASE]
    if cfg.time_of_day:
        names += [f"g.{n}" for n in _GLOBAL_TOD]
    for k in range(cfg.k_slots):
        names += [f"s{k}.{n}" for n in _SLOT]
    for k in range(cfg.k_slots):
        for g in cfg.generators:
            names += [f"s{k}.{g}.{n}" for n in _CAND]
    return tuple(names)


@dataclass(frozen=True)
class ObsSpec:
    """Feature order and normalisation of the observation vector; travels with every dataset
    and model. ``version`` changes whenever a feature, the configuration or the encoder
    revision changes."""

    config: MdpConfig
    feature_names: tuple[str, ...]
    revision: int = ENCODER_REVISION

    @property
    def dim(self) -> int:
        return len(self.feature_names)

    @property
    def n_actions(self) -> int:
        return self.config.n_actions

    @property
    def version(self) -> str:
        payload = json.dumps(
            {
                "revision": self.revision,
                "config": self.config.to_json(),
                "features": list(self.feature_names),
            },
            sort_keys=True,
        )
        return "obs-" + hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "revision": self.revision,
            "dim": self.dim,
            "n_actions": self.n_actions,
            "config": self.config.to_json(),
            "feature_names": list(self.feature_names),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ObsSpec:
        """Rebuild a spec; ValueError if this code would encode differently (a stale model)."""
        spec = ObsSpec(
            config=MdpConfig.from_json(data["config"]),
            feature_names=tuple(data["feature_names"]),
            revision=int(data["revision"]),
        )
        current = make_spec(spec.config)
        if spec.version != data.get("version", spec.version) or spec != current:
            raise ValueError(
                f"observation spec {data.get('version')} does not match this encoder "
                f"({current.version}): the model was built with other features"
            )
        return spec


def make_spec(config: MdpConfig | None = None) -> ObsSpec:
    """The spec this code encodes with for ``config`` (default config if None)."""
    cfg = config or MdpConfig()
    return ObsSpec(config=cfg, feature_names=_feature_names(cfg))


@dataclass(frozen=True)
class ObsLayout:
    """Where the parts of an observation vector lie, for networks that score every
    (slot, candidate) row with one shared function: ``[global | K x slot | K x P x cand]``,
    row ``(k, c)`` is action ``k * P + c`` and the last action is "wait"."""

    n_global: int
    k_slots: int
    n_slot: int  # features per slot (job)
    n_candidates: int  # P: candidates per slot
    n_cand: int  # features per (slot, candidate) row

    @property
    def slot_offset(self) -> int:
        return self.n_global

    @property
    def cand_offset(self) -> int:
        return self.n_global + self.k_slots * self.n_slot

    @property
    def dim(self) -> int:
        return self.cand_offset + self.k_slots * self.n_candidates * self.n_cand

    @property
    def n_rows(self) -> int:
        return self.k_slots * self.n_candidates

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def obs_layout(spec: ObsSpec) -> ObsLayout:
    """The layout of ``spec``'s observation vector (checked against its feature names)."""
    cfg = spec.config
    n_global = sum(1 for n in spec.feature_names if n.startswith("g."))
    layout = ObsLayout(n_global, cfg.k_slots, len(_SLOT), cfg.n_candidates, len(_CAND))
    if layout.dim != spec.dim:  # pragma: no cover - a bug in the feature lists
        raise AssertionError(f"layout has {layout.dim} features, the spec {spec.dim}")
    return layout


# ------------------------------------------------------------------- contention


@dataclass(frozen=True, slots=True)
class _Prediction:
    job_slowdown: float  # t / t_best - 1 for the job at this placement, next to the running
    added_slowdown: float  # sum over running jobs of the increase of their t / t_best


class _Contention:
    """What the contention model predicts for one more job next to the running ones.

    For an ``AnalyticModel`` the prediction is incremental (only the rings sharing a link
    with the new one are recomputed, with the model's own formulas); other models are
    asked for all rates at once.
    """

    def __init__(self, state: ClusterState, model: ContentionModel) -> None:
        topo = state.topology
        self.topo = topo
        self.model = model
        self.analytic = model if isinstance(model, AnalyticModel) else None
        self.split = [r for r in state.running if r.placement.num_nodes > 1]
        self.load = [0.0] * len(topo.links)
        self.users: dict[int, list[int]] = {}
        self.links: list[tuple[int, ...]] = []
        self.weights: list[float] = []
        self.slowdown: list[float] = []  # t / t_best per split running job (>= 1)
        self._best: list[float] = []
        if self.analytic is not None:
            a = self.analytic
            for i, r in enumerate(self.split):
                links = topo.ring_links(r.placement.nodes)
                w = self._weight(r.job, r.placement)
                self.links.append(links)
                self.weights.append(w)
                for link in links:
                    self.load[link] += w
                    self.users.setdefault(link, []).append(i)
            for i, r in enumerate(self.split):
                best = a.best_time(topo, r.job)
                self._best.append(best)
                t = self._time(r.job, r.placement, self.links[i], self.weights[i], None, 0.0)
                self.slowdown.append(max(1.0, t / best))
        else:
            self._all = [(r.job, r.placement) for r in state.running]
            base = model.rates(topo, self._all) if self._all else []
            self._base_inv = [1.0 / max(r, 1e-9) for r in base]
            self.slowdown = [
                inv
                for r, inv in zip(state.running, self._base_inv, strict=True)
                if r.placement.num_nodes > 1
            ]
            self.load = [float(f) for f in _flows(state)]

    def _weight(self, job: Job, placement: Placement) -> float:
        assert self.analytic is not None
        if self.analytic.sharing == "flows":
            return 1.0
        return self.analytic.duty_cycle(self.topo, job, placement)

    def _time(
        self,
        job: Job,
        placement: Placement,
        links: tuple[int, ...],
        own: float,
        extra_links: frozenset[int] | None,
        extra: float,
    ) -> float:
        """Iteration time with ``extra`` load added on ``extra_links`` (AnalyticModel's rule)."""
        assert self.analytic is not None
        a = self.analytic
        topo = self.topo
        nodes = placement.nodes
        bw = min(topo.nodes[n].intra_gbps for n in nodes)
        if len(nodes) > 1:
            gbps = topo.link_gbps
            alpha = a.calibration.alpha
            load = self.load
            for link in links:
                lv = load[link] + (extra if extra_links is not None and link in extra_links else 0)
                k = 1.0 + max(0.0, lv - own)
                bw = min(bw, gbps[link] / sharing_penalty(k, alpha))
        return ring_iteration_time(
            a.profile(job), job.num_gpus, len(nodes), bw, a.calibration.overhead_s
        )

    def predict(self, job: Job, placement: Placement) -> _Prediction:
        if self.analytic is None:
            return self._predict_generic(job, placement)
        best = self.analytic.best_time(self.topo, job)
        if placement.num_nodes <= 1:
            t = self._time(job, placement, (), 0.0, None, 0.0)
            return _Prediction(max(0.0, t / best - 1.0), 0.0)
        links = self.topo.ring_links(placement.nodes)
        w = self._weight(job, placement)
        t = self._time(job, placement, links, 0.0, None, 0.0)
        linkset = frozenset(links)
        affected: set[int] = set()
        for link in links:
            affected.update(self.users.get(link, ()))
        added = 0.0
        for i in sorted(affected):
            r = self.split[i]
            t_new = self._time(r.job, r.placement, self.links[i], self.weights[i], linkset, w)
            added += max(1.0, t_new / self._best[i]) - self.slowdown[i]
        return _Prediction(max(0.0, t / best - 1.0), max(0.0, added))

    def _predict_generic(self, job: Job, placement: Placement) -> _Prediction:
        rates = self.model.rates(self.topo, [*self._all, (job, placement)])
        inv = [1.0 / max(r, 1e-9) for r in rates]
        added = sum(n - o for n, o in zip(inv[:-1], self._base_inv, strict=True))
        return _Prediction(inv[-1] - 1.0, max(0.0, added))


def _flows(state: ClusterState) -> tuple[int, ...]:
    topo = state.topology
    if len(state.link_flows) == len(topo.links):
        return state.link_flows
    flows = [0] * len(topo.links)
    for r in state.running:
        if r.placement.num_nodes > 1:
            for link in topo.ring_links(r.placement.nodes):
                flows[link] += 1
    return tuple(flows)


def comm_intensity(model: ContentionModel, topo: Topology, job: Job) -> float:
    """Share of the job's isolated best iteration spent communicating (0 if the model has no
    profiles)."""
    if not isinstance(model, AnalyticModel):
        return 0.0
    best = model.best_time(topo, job)
    return max(0.0, 1.0 - model.profile(job).compute_s / best) if best > 0 else 0.0


# ------------------------------------------------------------------- candidates


def _leaf_best_fit(members: Sequence[int], free: Sequence[int], gpus: int) -> Placement | None:
    """Best fit inside one leaf: the tightest node that holds the job, else the fewest nodes
    (most free first, the tail on the tightest node that holds it)."""
    if sum(free[i] for i in members) < gpus:
        return None
    best, best_free = -1, 0
    for i in members:
        f = free[i]
        if f >= gpus and (best < 0 or f < best_free):
            best, best_free = i, f
    if best >= 0:
        return Placement(((best, gpus),))
    order = sorted((i for i in members if free[i] > 0), key=lambda i: (-free[i], i))
    need = gpus
    pairs: list[tuple[int, int]] = []
    for pos, node in enumerate(order):
        if free[node] < need:
            pairs.append((node, free[node]))
            need -= free[node]
            continue
        tail = node
        for other in order[pos + 1 :]:
            if free[other] < need:
                break
            tail = other
        pairs.append((tail, need))
        break
    return Placement(tuple(sorted(pairs)))


class _Builder:
    """Per-state memo tables shared by all slots (placements by GPU count, predictions by
    job shape and placement)."""

    def __init__(
        self, state: ClusterState, model: ContentionModel, span_lambda: float = 1.0
    ) -> None:
        self.state = state
        self.span_lambda = span_lambda
        self.topo = state.topology
        self.free = state.free_gpus
        self.busy = state.jobs_per_node
        self.contention = _Contention(state, model)
        self._placements: dict[tuple[str, int], Placement | None] = {}
        self._predictions: dict[tuple[str, int, Placement], _Prediction] = {}
        self._least: dict[tuple[str, int], Placement | None] = {}
        self._capacities: list[int] | None = None

    def base(self, gen: str, gpus: int) -> Placement | None:
        key = (gen, gpus)
        if key in self._placements:
            return self._placements[key]
        topo, free, busy = self.topo, self.free, self.busy
        p: Placement | None
        if gen == "best_fit":
            p = best_fit(topo, free, gpus)
        elif gen == "same_leaf":
            p = same_leaf(topo, free, gpus)
        elif gen == "least_busy":
            p = least_busy(topo, free, gpus, busy)
        elif gen == "first_fit":
            p = first_fit(topo, free, gpus)
        elif gen == "fragment_first_fit":
            p = fragment_first_fit(topo, free, gpus, busy)
        elif gen == "bounded":
            if self._capacities is None:
                self._capacities = sorted((n.gpus for n in topo.nodes), reverse=True)
            lam = self.span_lambda
            p = bounded_placement(topo, free, busy, gpus, None, lam, self._capacities)
        else:  # pragma: no cover - guarded by MdpConfig
            raise ValueError(f"unknown generator {gen!r}")
        self._placements[key] = p
        return p

    def predict(self, job: Job, placement: Placement) -> _Prediction:
        key = (job.profile, job.num_gpus, placement)
        hit = self._predictions.get(key)
        if hit is None:
            hit = self._predictions[key] = self.contention.predict(job, placement)
        return hit

    def least_contention(self, job: Job) -> Placement | None:
        key = (job.profile, job.num_gpus)
        if key in self._least:
            return self._least[key]
        gpus = job.num_gpus
        pool: list[Placement] = []
        for gen in _BASE_POOL:
            p = self.base(gen, gpus)
            if p is not None and p not in pool:
                pool.append(p)
        if pool and pool[0].num_nodes > 1:  # no single node holds it: try every leaf too
            for members in self.topo.leaf_nodes:
                p = _leaf_best_fit(members, self.free, gpus)
                if p is not None and p not in pool:
                    pool.append(p)
        best: Placement | None = None
        best_key = (0.0, 0)
        for p in pool:
            pred = self.predict(job, p)
            k = (pred.job_slowdown + pred.added_slowdown, p.num_nodes)
            if best is None or k < best_key:
                best, best_key = p, k
        self._least[key] = best
        return best

    def placement(self, gen: str, job: Job) -> Placement | None:
        if gen == "least_contention":
            return self.least_contention(job)
        return self.base(gen, job.num_gpus)


@dataclass(frozen=True, eq=False)
class Candidates:
    """Everything one state's mask, observation and decoding need, computed once."""

    state: ClusterState
    config: MdpConfig
    slots: tuple[PendingJob, ...]
    placements: tuple[tuple[Placement | None, ...], ...]  # one row per slot (<= K)
    redundant: tuple[tuple[bool, ...], ...]  # equal to an earlier candidate of the same slot
    predictions: tuple[tuple[_Prediction | None, ...], ...]
    mask: BoolArray
    contention: _Contention = field(repr=False)
    intensity: tuple[float, ...] = ()
    ranks: tuple[tuple[float, ...], ...] = ()  # per slot, its scaled rank in each of ORDERS

    def start_for(self, action: int) -> Start:
        """The start an unmasked non-wait action stands for."""
        p = self.config.n_candidates
        placement = self.placements[action // p][action % p]
        assert placement is not None
        return Start(self.slots[action // p].job.job_id, placement)


def _by_gpus(p: PendingJob) -> int:
    return p.job.num_gpus


def _by_gpu_time(p: PendingJob) -> float:
    return p.job.pred_s * p.job.num_gpus  # a prediction, never the true run time


def _by_attained(p: PendingJob) -> float:
    return p.attained_gpu_s


def _order_heads(state: ClusterState, k: int) -> tuple[list[PendingJob], ...]:
    """The first ``k`` jobs fitting the free GPUs now in each of ``ORDERS`` (stable: submit
    order among equals, ``state.pending`` being in submit order)."""
    free = state.total_free_gpus
    fit = [p for p in state.pending if p.job.num_gpus <= free]
    return (
        fit[:k],
        heapq.nsmallest(k, fit, key=_by_gpus),
        heapq.nsmallest(k, fit, key=_by_gpu_time),
        heapq.nsmallest(k, fit, key=_by_attained),
    )


def _round_robin(heads: Sequence[Sequence[PendingJob]], k: int) -> tuple[PendingJob, ...]:
    """Up to ``k`` jobs taken from ``heads`` in turn, each its next job not yet taken."""
    out: list[PendingJob] = []
    taken: set[int] = set()
    pos = [0] * len(heads)
    progressed = True
    while progressed and len(out) < k:
        progressed = False
        for i, head in enumerate(heads):
            while pos[i] < len(head) and head[pos[i]].job.job_id in taken:
                pos[i] += 1
            if pos[i] < len(head) and len(out) < k:
                p = head[pos[i]]
                out.append(p)
                taken.add(p.job.job_id)
                pos[i] += 1
                progressed = True
    return tuple(out)


def _slots(
    state: ClusterState, cfg: MdpConfig, heads: Sequence[Sequence[PendingJob]]
) -> tuple[PendingJob, ...]:
    if cfg.slot_order == "head":
        return state.pending[: cfg.k_slots]
    if cfg.slot_order == "fitting":
        return tuple(heads[0])
    if cfg.slot_order == "smallest":
        return tuple(heads[1])
    return _round_robin(heads, cfg.k_slots)


def _ranks(
    slots: Sequence[PendingJob], heads: Sequence[Sequence[PendingJob]], k: int
) -> tuple[tuple[float, ...], ...]:
    """Each slot's rank in each order over the fitting jobs, over ``k``; 1 beyond the head."""
    where = [{p.job.job_id: i / k for i, p in enumerate(head)} for head in heads]
    return tuple(tuple(w.get(p.job.job_id, 1.0) for w in where) for p in slots)


def candidates(state: ClusterState, config: MdpConfig, model: ContentionModel) -> Candidates:
    """Slots, candidate placements, contention predictions and the mask of one state."""
    b = _Builder(state, model, config.span_lambda)
    heads = _order_heads(state, config.k_slots)
    slots = _slots(state, config, heads)
    n_c = config.n_candidates
    mask = np.zeros(config.n_actions, dtype=np.bool_)
    mask[-1] = True
    total_free = state.total_free_gpus
    rows: list[tuple[Placement | None, ...]] = []
    reds: list[tuple[bool, ...]] = []
    preds: list[tuple[_Prediction | None, ...]] = []
    for k, pj in enumerate(slots):
        job = pj.job
        if job.num_gpus > total_free:
            rows.append((None,) * n_c)
            reds.append((False,) * n_c)
            preds.append((None,) * n_c)
            continue
        row = tuple(b.placement(g, job) for g in config.generators)
        red = tuple(p is not None and p in row[:c] for c, p in enumerate(row))
        rows.append(row)
        reds.append(red)
        preds.append(tuple(None if p is None else b.predict(job, p) for p in row))
        for c, p in enumerate(row):
            if p is not None and not (config.mask_duplicates and red[c]):
                mask[k * n_c + c] = True
    intensity = tuple(comm_intensity(model, state.topology, pj.job) for pj in slots)
    return Candidates(
        state=state,
        config=config,
        slots=slots,
        placements=tuple(rows),
        redundant=tuple(reds),
        predictions=tuple(preds),
        mask=mask,
        contention=b.contention,
        intensity=intensity,
        ranks=_ranks(slots, heads, config.k_slots),
    )


def action_mask(cands: Candidates) -> BoolArray:
    """Which actions are allowed (a copy): True for feasible starts and for wait."""
    return cands.mask.copy()


def decode(cands: Candidates, action: int) -> Decision:
    """The Decision an action stands for (one Start, or WAIT); InvalidAction if masked."""
    a = int(action)
    if not 0 <= a < cands.config.n_actions:
        raise InvalidAction(f"action {a} out of range 0..{cands.config.n_actions - 1}")
    if not cands.mask[a]:
        raise InvalidAction(f"action {a} is masked at t={cands.state.time:.1f}")
    if a == cands.config.wait_action:
        return WAIT
    return Decision(starts=(cands.start_for(a),))


# ------------------------------------------------------------------- encoding


def _log_count(n: int, scale: float) -> float:
    return math.log1p(n) / math.log1p(scale)


def _global(cands: Candidates) -> list[float]:
    state, cfg = cands.state, cands.config
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
    flows = _flows(state)
    nic = flows[:n_nodes]
    up = flows[n_nodes : n_nodes + len(topo.leaf_names)]
    load = cands.contention.load[:n_nodes]
    fs = cfg.flow_scale
    n_pending, n_running = len(state.pending), len(state.running)
    split = cands.contention.slowdown
    demand = sum(p.job.num_gpus for p in state.pending)
    out = [
        1.0 - sum(free) / total,
        *(h / n_nodes for h in hist),
        sum(nic) / n_nodes / fs,
        max(nic) / fs,
        sum(1 for f in nic if f >= 2) / n_nodes,
        (sum(up) / len(up) / fs) if up else 0.0,
        (max(up) / fs) if up else 0.0,
        max(load) / fs,
        _log_count(n_pending, cfg.queue_scale),
        _log_count(n_running, cfg.queue_scale),
        len(split) / n_running if n_running else 0.0,
        demand / total,
        max(0, n_pending - len(cands.slots)) / n_pending if n_pending else 0.0,
        min(cfg.max_slowdown, sum(s - 1.0 for s in split) / len(split)) if split else 0.0,
        min(cfg.max_slowdown, max(split) - 1.0) if split else 0.0,
        *_running_features(state, cfg),
    ]
    if cfg.time_of_day:
        phase = 2.0 * math.pi * (state.time % 86400.0) / 86400.0
        out += [math.sin(phase), math.cos(phase)]
    return out


def _log_scaled(x: float, unit: float, cap: float) -> float:
    """``log1p(x / unit) / log1p(cap / unit)``, ``x`` clipped to ``[0, cap]``: in [0, 1]."""
    return math.log1p(min(max(x, 0.0), cap) / unit) / math.log1p(cap / unit)


def _log_time(seconds: float, cfg: MdpConfig) -> float:
    return _log_scaled(seconds, cfg.time_scale_s, cfg.max_time_s)


def time_from_log(value: float, cfg: MdpConfig) -> float:
    """The seconds a log-scaled time feature (``wait_log``, ``pred_remaining``, ...) stands for:
    the exact inverse of the encoder's scaling below ``max_time_s`` (1 gives ``max_time_s``)."""
    unit, cap = cfg.time_scale_s, cfg.max_time_s
    x = min(max(float(value), 0.0), 1.0)
    return min(cap, math.expm1(x * math.log1p(cap / unit)) * unit)


def _log_size(gpu_s: float, cfg: MdpConfig) -> float:
    return _log_scaled(gpu_s, cfg.size_scale_gpu_s, cfg.max_size_gpu_s)


def _require_prediction(job: Job) -> None:
    if not job.predicted:
        raise ValueError(
            f"job {job.job_id} has no run-time prediction (pred_s): the observation never "
            "reads the true run time, so a run-time predictor fit on history is needed "
            "(datasets.predictor.RuntimePredictor.annotate; --history on the command line)"
        )


def predicted_remaining(job: Job, attained_gpu_s: float, *, upper: bool = False) -> float:
    """Seconds a job is predicted to still need: its predicted run time (``pred_s``, or
    ``pred_hi_s`` with ``upper``) less the service it had, at least 0. ValueError for a job
    without predictions."""
    _require_prediction(job)
    pred = job.pred_hi_s if upper else job.pred_s
    return max(0.0, pred - attained_gpu_s / job.num_gpus)


def _running_features(state: ClusterState, cfg: MdpConfig) -> list[float]:
    """GPU-weighted mean predicted remaining time of the running jobs (log-scaled), and the
    share of the cluster's GPUs they are predicted to free within ``time_scale_s``."""
    total = state.topology.total_gpus
    gpus = 0
    weighted = 0.0
    soon = 0
    for r in state.running:
        g = r.job.num_gpus
        rem = predicted_remaining(r.job, r.attained_at(state.time))
        gpus += g
        weighted += g * _log_time(rem, cfg)
        if rem <= cfg.time_scale_s:
            soon += g
    return [weighted / gpus if gpus else 0.0, soon / total if total else 0.0]


def _slot_features(cands: Candidates, k: int) -> list[float]:
    cfg = cands.config
    if k >= len(cands.slots):
        return [0.0] * len(_SLOT)
    pj = cands.slots[k]
    job = pj.job
    topo = cands.state.topology
    remaining = predicted_remaining(job, pj.attained_gpu_s)
    remaining_hi = predicted_remaining(job, pj.attained_gpu_s, upper=True)
    return [
        1.0,
        job.num_gpus / cfg.gpu_scale,
        min_nodes(topo, job.num_gpus) / cfg.node_scale,
        _log_time(cands.state.time - job.submit_time, cfg),
        _log_size(pj.attained_gpu_s, cfg),
        _log_time(remaining, cfg),
        _log_time(remaining_hi, cfg),
        _log_size(job.pred_s * job.num_gpus, cfg),
        _log_size(job.pred_hi_s * job.num_gpus, cfg),
        _log_time(job.time_limit, cfg),
        1.0 if job.time_limit > 0 else 0.0,
        cands.intensity[k],
        1.0 if pj.preemptions else 0.0,
        1.0 if job.num_gpus <= cands.state.total_free_gpus else 0.0,
        *cands.ranks[k],
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


def encode(cands: Candidates, spec: ObsSpec) -> FloatArray:
    """The observation vector of a state (deterministic, finite, length ``spec.dim``)."""
    cfg = spec.config
    if cands.config != cfg:
        raise ValueError("candidates were built with another MdpConfig than the spec's")
    values = _global(cands)
    for k in range(cfg.k_slots):
        values += _slot_features(cands, k)
    topo = cands.state.topology
    frag = _Frag(cands.state)
    zeros = [0.0] * len(_CAND)
    ms = cfg.max_slowdown
    for k in range(cfg.k_slots):
        if k >= len(cands.slots):
            values += zeros * cfg.n_candidates
            continue
        job = cands.slots[k].job
        need = min_nodes(topo, job.num_gpus)
        for c in range(cfg.n_candidates):
            p = cands.placements[k][c]
            pred = cands.predictions[k][c]
            if p is None or pred is None:
                values += zeros
                continue
            leaves = len({topo.nodes[n].leaf for n in p.nodes})
            partial, fragmented = frag.after(p)
            values += [
                1.0,
                1.0 if cands.redundant[k][c] else 0.0,
                min(ms, pred.job_slowdown),
                min(ms, pred.added_slowdown),
                p.num_nodes / cfg.node_scale,
                (p.num_nodes - need) / cfg.node_scale,
                leaves / cfg.leaf_scale,
                partial,
                fragmented,
            ]
    out = np.asarray(values, dtype=np.float32)
    if out.shape[0] != spec.dim:  # pragma: no cover - a bug in the feature lists
        raise AssertionError(f"encoded {out.shape[0]} features, spec has {spec.dim}")
    return out


def encode_state(state: ClusterState, spec: ObsSpec, model: ContentionModel) -> FloatArray:
    """``encode(candidates(state, spec.config, model), spec)``."""
    return encode(candidates(state, spec.config, model), spec)


# ------------------------------------------------------------------- reward


def jobs_in_system(state: ClusterState) -> int:
    """Pending plus running jobs."""
    return len(state.pending) + len(state.running)


def contention_term(state: ClusterState, dt: float, cfg: MdpConfig) -> float:
    """Progress lost to contention over ``dt``: sum over running jobs of (1 - rate) x dt,
    over the time scale (uses the running jobs' recorded rates)."""
    lost = sum(1.0 - min(1.0, r.rate) for r in state.running)
    return lost * dt / cfg.time_scale_s


def step_reward(
    prev_time: float, now: float, jobs: int, contention: float, cfg: MdpConfig
) -> float:
    """-(jobs in system x dt) / time_scale - contention_weight x contention (0 if no time passed
    and no contention)."""
    dt = max(0.0, now - prev_time)
    return -(jobs * dt) / cfg.time_scale_s - cfg.contention_weight * contention


# ------------------------------------------------------------------- stepping


def apply_start(state: ClusterState, start: Start, model: ContentionModel) -> ClusterState:
    """The state after one start at the same time (pure; ValueError if infeasible).

    The new running job gets its isolated rate; the others keep theirs (the encoder reads
    placements, not rates).
    """
    pj = next((p for p in state.pending if p.job.job_id == start.job_id), None)
    if pj is None:
        raise ValueError(f"job {start.job_id} is not pending")
    if start.placement.num_gpus != pj.job.num_gpus:
        raise ValueError(f"job {start.job_id}: placement has the wrong GPU count")
    free = list(state.free_gpus)
    for node, g in start.placement.alloc:
        if not 0 <= node < len(free) or free[node] < g:
            raise ValueError(f"job {start.job_id}: {g} GPUs not free on node {node}")
        free[node] -= g
    flows = list(_flows(state))
    if start.placement.num_nodes > 1:
        for link in state.topology.ring_links(start.placement.nodes):
            flows[link] += 1
    rate = model.rates(state.topology, [(pj.job, start.placement)])[0]
    run = RunningJob(
        job=pj.job,
        placement=start.placement,
        start_time=state.time,
        remaining_s=pj.remaining_s,
        rate=rate,
        attained_gpu_s=pj.attained_gpu_s,
        preemptions=pj.preemptions,
        since=state.time,
    )
    return replace(
        state,
        free_gpus=tuple(free),
        running=(*state.running, run),
        pending=tuple(p for p in state.pending if p is not pj),
        link_flows=tuple(flows),
    )


@dataclass(frozen=True, slots=True)
class StepMatch:
    """How an action reproduces a start: ``kind`` is "exact" (the candidate is the start's
    placement), "nearest" (most GPUs on the same nodes), "unslotted" (the job is in no slot or
    has no candidate: wait is emitted) or "wait" (the decision starts nothing more)."""

    action: int
    job_id: int | None
    kind: str
    overlap: float  # share of the job's GPUs the candidate puts on the start's nodes


def _overlap(a: Placement, b: Placement) -> float:
    mine = dict(a.alloc)
    return sum(min(g, mine.get(n, 0)) for n, g in b.alloc) / max(1, b.num_gpus)


def match_start(cands: Candidates, start: Start) -> StepMatch | None:
    """The unmasked action closest to ``start`` (None if its job has no unmasked candidate)."""
    n_c = cands.config.n_candidates
    for k, pj in enumerate(cands.slots):
        if pj.job.job_id != start.job_id:
            continue
        best: StepMatch | None = None
        for c, p in enumerate(cands.placements[k]):
            a = k * n_c + c
            if p is None or not cands.mask[a]:
                continue
            if p == start.placement:
                return StepMatch(a, start.job_id, "exact", 1.0)
            ov = _overlap(p, start.placement)
            if best is None or ov > best.overlap:
                best = StepMatch(a, start.job_id, "nearest", ov)
        return best
    return None


def decision_steps(
    state: ClusterState, decision: Decision, spec: ObsSpec, model: ContentionModel
) -> list[tuple[Candidates, StepMatch]]:
    """The steps that reproduce a decision (e.g. a real one from the logs): each start in
    order, matched to its closest action, then wait. The state follows the real placements."""
    cfg = spec.config
    out: list[tuple[Candidates, StepMatch]] = []
    s = state
    for start in decision.starts:
        c = candidates(s, cfg, model)
        m = match_start(c, start) or StepMatch(cfg.wait_action, start.job_id, "unslotted", 0.0)
        out.append((c, m))
        s = apply_start(s, start, model)
    out.append((candidates(s, cfg, model), StepMatch(cfg.wait_action, None, "wait", 1.0)))
    return out


class StepPolicyAdapter:
    """A heuristic Policy as a per-step action chooser, recording how well it matches.

    At every step the heuristic decides on the current state; its first start that maps to a
    slot becomes the action (exact candidate, else the nearest by node overlap); no start (or
    none in a slot) gives wait. Preemptions cannot be expressed and are counted as ignored.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.matches: list[StepMatch] = []
        self.ignored_preemptions = 0

    @property
    def name(self) -> str:
        return str(self.policy.name)

    def act(self, cands: Candidates) -> int:
        """The action reproducing the heuristic's next start at this state."""
        decision: Decision = self.policy.decide(cands.state)
        self.ignored_preemptions += len(decision.preempt)
        for start in decision.starts:
            m = match_start(cands, start)
            if m is not None:
                self.matches.append(m)
                return m.action
        wait = cands.config.wait_action
        if decision.starts:
            self.matches.append(StepMatch(wait, decision.starts[0].job_id, "unslotted", 0.0))
        else:
            self.matches.append(StepMatch(wait, None, "wait", 1.0))
        return wait

    @property
    def match_rate(self) -> float:
        """Share of the heuristic's starts reproduced exactly (1.0 when it started nothing)."""
        starts = [m for m in self.matches if m.kind != "wait"]
        if not starts:
            return 1.0
        return sum(1 for m in starts if m.kind == "exact") / len(starts)


@dataclass(frozen=True)
class MdpPolicy:
    """A function ``(obs, mask) -> action`` as a Policy: step until it waits (or nothing can
    start), each start applied to a local copy of the state before the next observation."""

    act: Callable[[FloatArray, BoolArray], int]
    spec: ObsSpec
    model: ContentionModel
    name: str = "mdp"

    def decide(self, state: ClusterState) -> Decision:
        """All starts the function chooses at this decision point."""
        return decide_by_steps(state, self.act, self.spec, self.model)


def decide_by_steps(
    state: ClusterState,
    act: Callable[[FloatArray, BoolArray], int],
    spec: ObsSpec,
    model: ContentionModel,
) -> Decision:
    """The starts ``act`` chooses at one decision point: observe, act, apply the start to a
    local copy of the state, until it waits or nothing can start (the one stepping loop of
    every step policy)."""
    starts: list[Start] = []
    s = state
    wait = spec.config.wait_action
    while True:
        c = candidates(s, spec.config, model)
        if not c.mask[:wait].any():
            break
        a = int(act(encode(c, spec), action_mask(c)))
        if a == wait:
            break
        start = decode(c, a).starts[0]  # InvalidAction if masked
        starts.append(start)
        s = apply_start(s, start, model)
    return Decision(starts=tuple(starts))
