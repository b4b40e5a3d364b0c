"""The residual policy (issue 23 item 1): a learned correction anchored on the best
same-information heuristic, at worst that heuristic.

At each decision point the base policy (``base``, a heuristic spec chosen on validation
days, ``pipelines.residual.choose_base``) decides; its first move is matched to an action of
the decision problem (``cluster.mdp.StepPolicyAdapter``'s matching, on the base's decision,
without asking the base twice). The model scores every allowed action (its network's
values: CQL's Q-values, or BC's log-probabilities) and the advantage of an alternative is
its value less the base action's value. The policy deviates only where the best eligible
alternative's advantage exceeds ``margin`` (chosen on validation days; ``inf``: never, the
base itself); the deviating move is applied to a local copy of the state and the base
finishes the decision point there (a copy of it, its memory as of now: what the labels
assumed, ``datasets.labels``). Otherwise the base's decision stands, exactly. Waiting is
never a deviation while nothing runs or drains (an idle cluster must not stay idle).

Deferral (``Deferral``), where the model is out of its depth, the base stands:

- ``topology``: the cluster's signature (``topology_signature``: nodes, GPUs per node, the
  leaf/aggregation structure and link capacities) is none of the ones it was trained on;
- ``range``: more than ``max_out`` encoded features (0: any) lie outside the training range
  recorded in the package (by more than ``tolerance``);
- ``support``: an alternative scored fewer than ``min_support`` times in the label set is
  never eligible (when none is left, the base stands).

Advantage units: the network's values. For CQL trained on the counterfactual transitions
(``pipelines.residual.label_datasets``: one-step terminal transitions, reward = minus the
label in job-hours), a Q difference estimates the jobs-in-system hours saved over the
horizon; for BC a log-probability difference (how much more the labelled-best action is
preferred). The margin is chosen in those units, on validation days.

A package of kind ``residual`` is a learned package (``models.learned``) whose
``policy.json`` carries ``kind: "residual"`` and a ``residual`` object (base, margin,
deferral, how the base was chosen); ``model:PATH`` loads it (``models.build``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Policy, Topology
from linkwise.cluster.fork import fresh
from linkwise.cluster.mdp import (
    MdpConfig,
    ObsSpec,
    StepPolicyAdapter,
    apply_decision,
    candidates,
    decode,
    encode,
    encode_partial,
    local_grace,
    nothing_fits,
)
from linkwise.cluster.mdp.running import eligible as running_eligible
from linkwise.datasets.export import file_sha256
from linkwise.datasets.prediction import annotate_state
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models.learned import (
    CHECKSUMS,
    META,
    NETWORK,
    PREDICTOR,
    LearnedPolicy,
    PackageError,
    masked_argmax,
    verify_checksums,
)
from linkwise.policies.spec import PolicySpec

__all__ = [
    "KIND",
    "Deferral",
    "ResidualPolicy",
    "format_margin",
    "is_residual_meta",
    "merge_moves",
    "more_than_wait",
    "parse_margin",
    "residual_from_learned",
    "topology_signature",
    "write_residual_package",
]

KIND = "residual"
DEFER_REASONS = ("topology", "range", "support")


def topology_signature(topology: Topology) -> str:
    """A short digest of the cluster's shape and fabric: node count, GPUs and NIC/intra
    bandwidth per node, which leaf each node hangs off, leaf and aggregation uplinks (names
    left out: the same fabric under other host names is the same)."""
    parts: dict[str, Any] = {
        "nodes": [(n.gpus, n.leaf, n.nic_gbps, n.intra_gbps) for n in topology.nodes],
        "leaf_agg": list(topology.leaf_agg),
        "leaf_up": [_num(x) for x in topology.leaf_uplink_gbps],
        "agg_up": [_num(x) for x in topology.agg_uplink_gbps],
    }
    if topology.ecmp_spines:  # only then, so pooled fabrics keep their signatures
        parts["ecmp_spines"] = topology.ecmp_spines
    if topology.ecmp_cores:  # likewise for the core tier and rail fabrics
        parts["ecmp_cores"] = topology.ecmp_cores
    if topology.rails:
        parts["rails"] = topology.rails
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _num(x: float) -> Any:
    return "inf" if math.isinf(x) else float(x)


def parse_margin(value: Any) -> float:
    """A margin from JSON or the command line: a non-negative number or ``"inf"``."""
    m = float(value)
    if math.isnan(m) or m < 0:
        raise ValueError(f"a margin must be a non-negative number or inf, got {value!r}")
    return m


def format_margin(m: float) -> Any:
    """A margin as JSON (``"inf"`` for infinity: JSON has no infinity)."""
    return "inf" if math.isinf(m) else float(m)


@dataclass(frozen=True)
class Deferral:
    """When the model defers to the base (module docstring): the topology signatures it was
    trained on (empty: any), each feature's training range, the tolerance beyond it and how
    many features may lie outside (``max_out``), and per action how often the label set
    scored it, with the minimum to be eligible."""

    topologies: tuple[str, ...] = ()
    feature_lo: tuple[float, ...] = ()
    feature_hi: tuple[float, ...] = ()
    tolerance: float = 0.05
    support: tuple[int, ...] = ()
    min_support: int = 0
    max_out: int = 0

    def __post_init__(self) -> None:
        if len(self.feature_lo) != len(self.feature_hi):
            raise ValueError("feature_lo and feature_hi need one entry per feature")
        if not self.tolerance >= 0 or self.min_support < 0 or self.max_out < 0:
            raise ValueError("tolerance, min_support and max_out must be non-negative")

    @staticmethod
    def from_labels(
        obs: npt.NDArray[np.float32],
        actions: npt.NDArray[np.int64],
        n_actions: int,
        topologies: Sequence[str],
        *,
        tolerance: float = 0.05,
        min_support: int = 3,
    ) -> Deferral:
        """The deferral rule of a label set: the range of its encoded states, the count of
        each scored action, the topologies it was labelled on."""
        counts = np.bincount(np.asarray(actions, dtype=np.int64), minlength=n_actions)
        return Deferral(
            topologies=tuple(sorted(set(topologies))),
            feature_lo=tuple(float(x) for x in obs.min(axis=0)),
            feature_hi=tuple(float(x) for x in obs.max(axis=0)),
            tolerance=tolerance,
            support=tuple(int(c) for c in counts[:n_actions]),
            min_support=min_support,
        )

    def topology_reason(self, topology: Topology) -> str:
        """Why the model defers on this cluster ("" when it does not)."""
        if self.topologies and topology_signature(topology) not in self.topologies:
            return "topology"
        return ""

    def obs_reason(self, obs: npt.NDArray[np.float32]) -> str:
        """``"range"`` when more than ``max_out`` encoded features lie outside the training
        range (a NaN feature, unknown in ``encode_partial``, is never outside)."""
        if not self.feature_lo:
            return ""
        x = np.asarray(obs, dtype=np.float64).reshape(-1)
        lo = np.asarray(self.feature_lo) - self.tolerance
        hi = np.asarray(self.feature_hi) + self.tolerance
        if x.shape != lo.shape:
            raise ValueError(f"{x.size} features, the deferral rule has {lo.size}")
        out = int(np.count_nonzero((x < lo) | (x > hi)))
        return "range" if out > self.max_out else ""

    def supported(self, n_actions: int) -> npt.NDArray[np.bool_]:
        """The actions scored at least ``min_support`` times (all when no counts)."""
        if not self.support:
            return np.ones(n_actions, dtype=np.bool_)
        counts = np.zeros(n_actions, dtype=np.int64)
        counts[: len(self.support)] = self.support[:n_actions]
        return np.asarray(counts >= self.min_support, dtype=np.bool_)

    def to_json(self) -> dict[str, Any]:
        return {
            "topologies": list(self.topologies),
            "feature_lo": list(self.feature_lo),
            "feature_hi": list(self.feature_hi),
            "tolerance": self.tolerance,
            "support": list(self.support),
            "min_support": self.min_support,
            "max_out": self.max_out,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Deferral:
        return Deferral(
            topologies=tuple(str(t) for t in data.get("topologies", ())),
            feature_lo=tuple(float(x) for x in data.get("feature_lo", ())),
            feature_hi=tuple(float(x) for x in data.get("feature_hi", ())),
            tolerance=float(data.get("tolerance", 0.05)),
            support=tuple(int(x) for x in data.get("support", ())),
            min_support=int(data.get("min_support", 0)),
            max_out=int(data.get("max_out", 0)),
        )

    def describe(self) -> str:
        """One line: what makes the model defer."""
        topo = f"{len(self.topologies)} topologies" if self.topologies else "any topology"
        return (
            f"defer: {topo}, features within +-{self.tolerance:g} of training "
            f"(at most {self.max_out} outside), "
            f"support >= {self.min_support}"
        )


@dataclass(frozen=True)
class _Fixed:
    """A policy that returns one decision (to match the base's decision to an action
    without asking the base again)."""

    decision: Decision
    name: str = "base"

    def decide(self, state: ClusterState) -> Decision:
        return self.decision


@dataclass
class ResidualPolicy:
    """The residual (Policy protocol): the base decides; the model may replace its first
    move where its advantage exceeds ``margin`` and nothing makes it defer. ``values(obs)``
    gives the network's values ``(1, dim) -> (1, n_actions)``. Counters: ``decisions``
    (decision points with more than waiting allowed), ``deviations``, ``deferrals`` by
    reason."""

    base: Policy
    values: Any  # Callable[[FloatArray], FloatArray], e.g. LearnedPolicy.action_values
    obs_spec: ObsSpec
    belief: ContentionModel
    margin: float = math.inf
    deferral: Deferral = field(default_factory=Deferral)
    base_spec: str = "?"
    predictor: RuntimePredictor | None = None
    name: str = "residual"
    meta: Mapping[str, Any] = field(default_factory=dict)
    decisions: int = field(default=0, init=False)
    deviations: int = field(default=0, init=False)
    deferrals: dict[str, int] = field(default_factory=dict, init=False)
    advantages: list[float] = field(default_factory=list, init=False, repr=False)
    _topology_seen: tuple[Topology, Deferral, str] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _supported: tuple[Deferral, npt.NDArray[np.bool_]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # the last pending and running tuples found all annotated (``_annotate``)
    _annotated: tuple[Any, Any] = field(default=((), ()), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.margin = parse_margin(self.margin)
        self.deferrals = dict.fromkeys(DEFER_REASONS, 0)

    @property
    def label(self) -> str:
        """The policy as tables show it: ``residual(base=qssf,margin=0.5)``."""
        return f"residual(base={self.base_spec},margin={format_margin(self.margin)})"

    def decide(self, state: ClusterState) -> Decision:
        """The base's decision, or the model's deviation (module docstring). The fast path
        (``benchmarks/learned_speed.md``) decides and counts exactly as ``decide_plain``: no
        candidates where nothing but waiting can be allowed (``nothing_fits``), no encoding
        or scoring where the model defers or no alternative is eligible, the base's decision
        matched without asking it again, the base copied only when deviating."""
        state = self._annotate(state)
        base_d = self.base.decide(state)
        cfg = self.obs_spec.config
        if nothing_fits(state, cfg):  # every action but wait masked: no candidates needed
            return base_d
        reason = self._topology_reason(state.topology)
        if math.isinf(self.margin) or reason:  # the base stands: only the counters remain
            allowed = more_than_wait(state, cfg)
            if allowed is None:
                allowed = bool(candidates(state, cfg, self.belief).mask[: cfg.wait_action].any())
            if allowed:
                self.decisions += 1
                if not math.isinf(self.margin):
                    self.deferrals[reason] += 1
            return base_d
        if self.deferral.feature_lo:  # the range rule first, on what needs no candidates
            allowed = more_than_wait(state, cfg)
            if allowed is False:  # as candidates' mask would say: only waiting allowed
                return base_d
            if allowed and self._range_first(state):
                self.decisions += 1
                self.deferrals["range"] += 1
                return base_d
        c = candidates(state, cfg, self.belief)
        if not c.mask[: cfg.wait_action].any():
            return base_d
        self.decisions += 1
        eligible = self._eligible(state, c, base_d)
        obs: npt.NDArray[np.float32] | None = None
        if self.deferral.feature_lo:  # the range rule needs the observation
            obs = encode(c, self.obs_spec)
            if self.deferral.obs_reason(obs):
                self.deferrals["range"] += 1
                return base_d
        base_a, mask = eligible
        if not mask.any():
            self.deferrals["support"] += 1
            return base_d
        if obs is None:
            obs = encode(c, self.obs_spec)
        return self._score(state, c, obs, base_a, mask, base_d)

    def decide_plain(self, state: ClusterState) -> Decision:
        """``decide`` as first written (candidates, encoding and the topology's signature at
        every decision point): the reference the fast path is tested against."""
        state = annotate_state(state, self.predictor)
        base_d = self.base.decide(state)
        cfg = self.obs_spec.config
        c = candidates(state, cfg, self.belief)
        if not c.mask[: cfg.wait_action].any():
            return base_d
        self.decisions += 1
        if math.isinf(self.margin):
            return base_d
        reason = self.deferral.topology_reason(state.topology)
        obs = encode(c, self.obs_spec)
        reason = reason or self.deferral.obs_reason(obs)
        if reason:
            self.deferrals[reason] += 1
            return base_d
        base_a = StepPolicyAdapter(_Fixed(base_d)).act(c)
        eligible = c.mask & self.deferral.supported(cfg.n_actions)
        eligible[base_a] = False
        if not state.running and not state.transit:  # an idle cluster must not stay idle
            eligible[cfg.wait_action] = False
        if not eligible.any():
            self.deferrals["support"] += 1
            return base_d
        return self._score(state, c, obs, base_a, eligible, base_d, plain=True)

    def _annotate(self, state: ClusterState) -> ClusterState:
        """``annotate_state(state, self.predictor)``: the same state without a look at its
        jobs where its pending and running tuples are the ones last found all annotated
        (immutable tuples of frozen jobs: still all annotated)."""
        if self.predictor is None:
            return state
        pending, running = self._annotated
        fresh_p = state.pending is not pending
        fresh_r = state.running is not running
        if not fresh_p and not fresh_r:
            return state
        if (not fresh_p or all(p.job.pred_s > 0 for p in state.pending)) and (
            not fresh_r or all(r.job.pred_s > 0 for r in state.running)
        ):  # ``Job.predicted``, as annotate_state asks it
            self._annotated = (state.pending, state.running)
            return state
        return annotate_state(state, self.predictor)

    def _range_first(self, state: ClusterState) -> bool:
        """Whether the range rule defers on the features known without the candidates
        (``encode_partial``: the same values, NaN for the others, which never count): more
        than ``max_out`` of them outside the range means more of the whole observation."""
        spec, belief, rule = self.obs_spec, self.belief, self.deferral
        if rule.obs_reason(encode_partial(state, spec, belief, slots=False)):
            return True  # the global features alone (no slots chosen)
        return bool(rule.obs_reason(encode_partial(state, spec, belief)))

    def _topology_reason(self, topology: Topology) -> str:
        """``Deferral.topology_reason``, kept for the topology last seen (immutable)."""
        seen = self._topology_seen
        if seen is None or seen[0] is not topology or seen[1] is not self.deferral:
            seen = (topology, self.deferral, self.deferral.topology_reason(topology))
            self._topology_seen = seen
        return seen[2]

    def _eligible(
        self, state: ClusterState, c: Any, base_d: Decision
    ) -> tuple[int, npt.NDArray[np.bool_]]:
        """The base's action and the alternatives the model may choose instead."""
        cfg = self.obs_spec.config
        base_a = StepPolicyAdapter(_Fixed(base_d)).act(c)
        supported = self._supported
        if supported is None or supported[0] is not self.deferral:
            supported = (self.deferral, self.deferral.supported(cfg.n_actions))
            self._supported = supported
        eligible = c.mask & supported[1]
        eligible[base_a] = False
        if not state.running and not state.transit:  # an idle cluster must not stay idle
            eligible[cfg.wait_action] = False
        return base_a, eligible

    def _score(
        self,
        state: ClusterState,
        c: Any,
        obs: npt.NDArray[np.float32],
        base_a: int,
        eligible: npt.NDArray[np.bool_],
        base_d: Decision,
        *,
        plain: bool = False,
    ) -> Decision:
        """The network's values, the best eligible alternative's advantage, the deviation
        where it exceeds the margin."""
        v = np.asarray(self.values(obs)[0], dtype=np.float64)
        best = int(masked_argmax(v, eligible))
        if best < 0 or not (math.isfinite(v[best]) and math.isfinite(v[base_a])):
            return base_d
        advantage = float(v[best] - v[base_a])
        self.advantages.append(advantage)
        if advantage <= self.margin:
            return base_d
        self.deviations += 1
        return self._deviate(state, c, best, base_d, plain=plain)

    def _deviate(
        self, state: ClusterState, c: Any, action: int, base_d: Decision, *, plain: bool = False
    ) -> Decision:
        """The model's move, then the base (a copy, its memory as of now) finishes the
        decision point on the state the move leaves; a wait is the empty decision. The copy
        shares the contention model and the topology (both immutable; a base's cache keyed
        by the topology's identity stays valid)."""
        cfg = self.obs_spec.config
        if action == cfg.wait_action:
            return Decision(wake_at=base_d.wake_at)
        d = decode(c, action)
        after = apply_decision(state, d, self.belief, local_grace(cfg))
        if plain:
            copy_of = fresh(self.base, self.belief)
        else:
            memo = {id(self.belief): self.belief, id(state.topology): state.topology}
            copy_of = copy.deepcopy(self.base, memo)
        return merge_moves(d, copy_of.decide(after), base_d.wake_at)

    def stats(self) -> dict[str, float]:
        """Decision points, deviations per 1,000 of them, deferrals by reason."""
        n = max(1, self.decisions)
        return {
            "decision_points": float(self.decisions),
            "deviations": float(self.deviations),
            "deviations_per_1000": 1000.0 * self.deviations / n,
            **{f"deferrals_{k}": float(v) for k, v in self.deferrals.items()},
        }


TOTAL_GENERATORS = frozenset({"best_fit", "first_fit", "least_contention"})
"""Candidate generators that place every job asking at most the free GPUs (``best_fit`` and
``first_fit``: None iff fewer GPUs are free, ``cluster.placement``; ``least_contention``
picks among a pool that holds ``best_fit``'s)."""


def more_than_wait(state: ClusterState, cfg: MdpConfig) -> bool | None:
    """Whether ``candidates(state, cfg, model).mask`` allows more than waiting, without the
    contention model (None where that cannot be told so: no generator in
    ``TOTAL_GENERATORS``). A running row is allowed for every running job that may be
    preempted now; a start row for a slot whose job fits the free GPUs (its first
    candidate is never a duplicate), and every order but ``head`` fills the slots with
    fitting jobs only (``cluster.mdp.slots``)."""
    if not TOTAL_GENERATORS & set(cfg.generators):
        return None
    free = state.total_free_gpus
    pending = state.pending[: cfg.k_slots] if cfg.slot_order == "head" else state.pending
    if any(p.job.num_gpus <= free for p in pending):
        return True
    return bool(cfg.running_slots and running_eligible(state, cfg))


def merge_moves(move: Decision, rest: Decision, wake_at: float = math.inf) -> Decision:
    """The model's move and the base's decision on the state it leaves, as one Decision the
    simulator can apply (it preempts and migrates before it starts): a job the move starts
    that the base then preempts is not started (its GPUs stay free; the base planned with
    them held while it drained), one it then migrates starts at the migration's target."""
    moved = {m.job_id: m for m in rest.migrate}
    undone = set(rest.preempt)
    starts = (
        tuple(moved.get(s.job_id, s) for s in move.starts if s.job_id not in undone) + rest.starts
    )
    started = {s.job_id for s in move.starts}
    return Decision(
        starts=starts,
        preempt=move.preempt + tuple(j for j in rest.preempt if j not in started),
        migrate=move.migrate + tuple(m for m in rest.migrate if m.job_id not in started),
        wake_at=min(wake_at, rest.wake_at),
    )


# ------------------------------------------------------------------------ packages


def is_residual_meta(meta: Mapping[str, Any]) -> bool:
    """Whether a package's ``policy.json`` is a residual's."""
    return meta.get("kind") == KIND


def residual_from_learned(
    learned: LearnedPolicy, model: ContentionModel | None = None
) -> ResidualPolicy:
    """The residual a loaded package of kind ``residual`` describes: its base built from the
    spec it records (``policies.spec``), its network's values, margin and deferral."""
    meta = learned.meta
    if not is_residual_meta(meta):
        raise PackageError(f"{learned.package_dir}: not a residual package")
    data = meta.get("residual")
    if not isinstance(data, Mapping) or "base" not in data:
        raise PackageError(f"{learned.package_dir}: policy.json has no residual.base")
    base_spec = PolicySpec.parse(str(data["base"]))
    if base_spec.is_model or base_spec.is_oracle:
        raise PackageError(f"{learned.package_dir}: a residual's base must be a heuristic")
    belief = model if model is not None else learned.model
    try:
        margin = parse_margin(data.get("margin", "inf"))
        deferral = Deferral.from_json(data.get("deferral", {}))
    except (TypeError, ValueError) as exc:
        raise PackageError(f"{learned.package_dir}: residual: {exc}") from None
    policy = ResidualPolicy(
        base=base_spec.build(belief),
        values=learned.action_values,
        obs_spec=learned.spec,
        belief=belief,
        margin=margin,
        deferral=deferral,
        base_spec=base_spec.describe(),
        predictor=learned.predictor,
        meta=meta,
    )
    policy.name = policy.label
    return policy


def write_residual_package(
    learned_dir: str | Path,
    out_dir: str | Path,
    *,
    base: str,
    margin: float,
    deferral: Deferral,
    chosen: Mapping[str, Any] | None = None,
) -> Path:
    """A residual package in ``out_dir`` (created, must be empty or absent): the learned
    package's files (checksums verified first), its ``policy.json`` with ``kind: residual``
    and the ``residual`` object (base, margin, deferral, ``chosen``: how base and margin
    were chosen, with their validation figures), the checksums rewritten."""
    src = Path(learned_dir)
    verify_checksums(src)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    names = [ln.partition("  ")[2] for ln in (src / CHECKSUMS).read_text().splitlines()]
    for name in names:
        if name != META:
            shutil.copyfile(src / name, out / name)
    meta = json.loads((src / META).read_text())
    meta["kind"] = KIND
    meta["residual"] = {
        "base": base,
        "margin": format_margin(parse_margin(margin)),
        "deferral": deferral.to_json(),
        "advantage": "q difference" if meta.get("values") == "q" else "log-probability difference",
        "chosen": dict(chosen or {}),
        "learned_from": str(src),
    }
    (out / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    order = [n for n in (NETWORK, *[n for n in names if n not in (NETWORK, PREDICTOR)])]
    if PREDICTOR in names:
        order.append(PREDICTOR)
    lines = [f"{file_sha256(out / n)}  {n}\n" for n in dict.fromkeys(order)]
    (out / CHECKSUMS).write_text("".join(lines))
    return out
