"""The observation's feature names, its spec (``ObsSpec``: the version every dataset and model
carries) and its layout for per-row networks (``ObsLayout``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from linkwise.cluster.mdp.config import ENCODER_REVISION, ORDERS, RUN_ORDERS, MdpConfig

GLOBAL_FEATURES = (
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
TOD_FEATURES = ("time_of_day_sin", "time_of_day_cos")
SLOT_FEATURES = (
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
CAND_FEATURES = (
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

# per running slot (``MdpConfig.running_slots``): what Slurm and the models know of a running
# job (never its true run time, remaining work or rate); its migrate rows carry CAND_FEATURES
RUN_FEATURES = (
    "present",
    "gpus",
    "nodes",
    "leaves",
    "run_log",
    "attained_log",
    "pred_remaining",
    "pred_remaining_hi",
    "pred_remaining_gpu_time",
    "restart_cost",
    "slowdown",
    "preemptions",
    "comm_intensity",
    *(f"rank_{o}" for o in RUN_ORDERS),
)


def _feature_names(cfg: MdpConfig) -> tuple[str, ...]:
    names = [f"g.{n}" for n in GLOBAL_FEATURES]
    if cfg.time_of_day:
        names += [f"g.{n}" for n in TOD_FEATURES]
    for k in range(cfg.k_slots):
        names += [f"s{k}.{n}" for n in SLOT_FEATURES]
    for k in range(cfg.k_slots):
        for g in cfg.generators:
            names += [f"s{k}.{g}.{n}" for n in CAND_FEATURES]
    for r in range(cfg.running_slots):
        names += [f"r{r}.{n}" for n in RUN_FEATURES]
    if cfg.migrate:
        for r in range(cfg.running_slots):
            for g in cfg.generators:
                names += [f"r{r}.{g}.{n}" for n in CAND_FEATURES]
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
    """The layout of ``spec``'s observation vector (checked against its feature names);
    ValueError for a spec with running rows (the row network scores start rows only)."""
    cfg = spec.config
    if cfg.running_slots:
        raise ValueError(
            "the observation layout covers start rows only: a spec with running_slots > 0 "
            "needs a network that reads the whole vector (the MLP), not the row network"
        )
    n_global = sum(1 for n in spec.feature_names if n.startswith("g."))
    layout = ObsLayout(
        n_global, cfg.k_slots, len(SLOT_FEATURES), cfg.n_candidates, len(CAND_FEATURES)
    )
    if layout.dim != spec.dim:  # pragma: no cover - a bug in the feature lists
        raise AssertionError(f"layout has {layout.dim} features, the spec {spec.dim}")
    return layout
