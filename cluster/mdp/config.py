"""The decision problem's configuration: its shape (slots, candidate generators, slot order)
and normalisation constants, and the names every other part refers to."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.restart import parse_restart

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
# the orders running slots are drawn from, round-robin: most attained service, most predicted
# remaining GPU time, most predicted slowdown (``MdpConfig.running_slots``)
RUN_ORDERS = ("attained", "remaining", "slowdown")
# the running-row fields: left out of ``to_json`` (so of ``ObsSpec.version``) while
# ``running_slots`` is 0, so every spec without running rows keeps its version
RUNNING_FIELDS = ("running_slots", "migrate", "preempt_share", "min_run_s", "restart_cost")

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
    # rows for running jobs (off with 0): per running slot a preempt row and, with
    # ``migrate``, one migrate row per candidate generator
    running_slots: int = 0
    migrate: bool = True
    preempt_share: float = 1.0  # share of jobs that may be preempted (by a hash of the job id)
    min_run_s: float = 600.0  # never preempt or migrate within this of a job's last start
    restart_cost: str = "sia"  # the restart model the features assume (cluster.restart)

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
        if self.running_slots < 0:
            raise ValueError("running_slots must be non-negative")
        if not 0.0 <= self.preempt_share <= 1.0:
            raise ValueError(f"preempt_share must be in [0, 1], got {self.preempt_share}")
        if not 0.0 <= self.min_run_s < math.inf:
            raise ValueError("min_run_s must be non-negative and finite")
        if self.running_slots and not self.min_run_s > 0:
            # a job moved at a decision point must not be movable again at the same time
            raise ValueError("running rows need a positive min_run_s")
        parse_restart(self.restart_cost)  # ValueError for an unknown restart model

    @property
    def n_candidates(self) -> int:
        return len(self.generators)

    @property
    def n_start_actions(self) -> int:
        """``K * P``: the start rows, actions ``0 .. K * P - 1``."""
        return self.k_slots * self.n_candidates

    @property
    def preempt_offset(self) -> int:
        """The first preempt row (running slot ``r`` is ``preempt_offset + r``)."""
        return self.n_start_actions

    @property
    def n_migrate(self) -> int:
        """Migrate rows per running slot (``P`` with ``migrate``, else 0)."""
        return self.n_candidates if self.migrate else 0

    @property
    def migrate_offset(self) -> int:
        """The first migrate row (running slot ``r``, candidate ``c``: ``+ r * P + c``)."""
        return self.preempt_offset + self.running_slots

    @property
    def n_actions(self) -> int:
        return self.migrate_offset + self.running_slots * self.n_migrate + 1

    @property
    def wait_action(self) -> int:
        return self.n_actions - 1

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["generators"] = list(self.generators)
        if not self.running_slots:
            for name in RUNNING_FIELDS:
                del d[name]
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
