"""Slots and candidate placements of one state, the action mask, and decoding an action into
a ``Decision``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import (
    WAIT,
    ClusterState,
    Decision,
    PendingJob,
    Placement,
    Start,
    within_request,
)
from linkwise.cluster.mdp.config import BoolArray, InvalidAction, MdpConfig
from linkwise.cluster.mdp.placements import builder_of
from linkwise.cluster.mdp.running import RunningRows, running_rows
from linkwise.cluster.mdp.slots import order_heads, pending_slots, slot_ranks
from linkwise.cluster.mdp.slowdown import Contention, Prediction, comm_intensity


@dataclass(frozen=True, eq=False)
class Candidates:
    """Everything one state's mask, observation and decoding need, computed once."""

    state: ClusterState
    config: MdpConfig
    slots: tuple[PendingJob, ...]
    placements: tuple[tuple[Placement | None, ...], ...]  # one row per slot (<= K)
    redundant: tuple[tuple[bool, ...], ...]  # equal to an earlier candidate of the same slot
    predictions: tuple[tuple[Prediction | None, ...], ...]
    mask: BoolArray
    contention: Contention = field(repr=False)
    intensity: tuple[float, ...] = ()
    ranks: tuple[tuple[float, ...], ...] = ()  # per slot, its scaled rank in each of ORDERS
    running: RunningRows | None = None  # the running slots (``MdpConfig.running_slots``)

    def start_for(self, action: int) -> Start:
        """The start an unmasked start action stands for."""
        p = self.config.n_candidates
        placement = self.placements[action // p][action % p]
        assert placement is not None
        return Start(self.slots[action // p].job.job_id, placement)

    def preempt_action(self, job_id: int) -> int | None:
        """The preempt row of a running job (None when it is in no running slot)."""
        rows = self.running
        if rows is None:
            return None
        for r, run in enumerate(rows.slots):
            if run.job.job_id == job_id:
                return self.config.preempt_offset + r
        return None

    def migrate_row(self, job_id: int) -> tuple[int, tuple[Placement | None, ...]] | None:
        """(first migrate action, candidates) of a running job's slot (None: no slot)."""
        rows, cfg = self.running, self.config
        if rows is None or not cfg.migrate:
            return None
        for r, run in enumerate(rows.slots):
            if run.job.job_id == job_id:
                return cfg.migrate_offset + r * cfg.n_migrate, rows.placements[r]
        return None


@dataclass(frozen=True, eq=False)
class SlotPart:
    """What a state's pending slots are without placements or the contention model: the
    orders' heads, the slots, each slot's communication share and ranks."""

    heads: tuple[list[PendingJob], ...]
    slots: tuple[PendingJob, ...]
    intensity: tuple[float, ...]
    ranks: tuple[tuple[float, ...], ...]


def slot_part(state: ClusterState, config: MdpConfig, model: ContentionModel) -> SlotPart:
    """The pending slots of one state (``candidates`` and ``features.encode_partial``)."""
    heads = order_heads(state, config.k_slots)
    slots = pending_slots(state, config, heads)
    return SlotPart(
        heads=heads,
        slots=slots,
        intensity=tuple(comm_intensity(model, state.topology, pj.job) for pj in slots),
        ranks=slot_ranks(slots, heads, config.k_slots),
    )


def candidates(state: ClusterState, config: MdpConfig, model: ContentionModel) -> Candidates:
    """Slots, candidate placements, contention predictions and the mask of one state."""
    b = builder_of(state, model, config.span_lambda)
    part = slot_part(state, config, model)
    slots = part.slots
    n_c = config.n_candidates
    mask = np.zeros(config.n_actions, dtype=np.bool_)
    mask[-1] = True
    total_free = state.total_free_gpus
    rows: list[tuple[Placement | None, ...]] = []
    reds: list[tuple[bool, ...]] = []
    preds: list[tuple[Prediction | None, ...]] = []
    for k, pj in enumerate(slots):
        job = pj.job
        if job.num_gpus > total_free:
            rows.append((None,) * n_c)
            reds.append((False,) * n_c)
            preds.append((None,) * n_c)
            continue
        row = tuple(b.placement(g, job) for g in config.generators)
        if job.flexible is False:  # a fixed request: only the generators' placements in shape
            node_gpus = state.topology.max_gpus_per_node
            row = tuple(p if p and within_request(job, p, node_gpus) else None for p in row)
        red = tuple(p is not None and p in row[:c] for c, p in enumerate(row))
        rows.append(row)
        reds.append(red)
        preds.append(tuple(None if p is None else b.predict(job, p) for p in row))
        for c, p in enumerate(row):
            if p is not None and not (config.mask_duplicates and red[c]):
                mask[k * n_c + c] = True
    running = None
    if config.running_slots:
        running = running_rows(state, config, model, b.contention)
        m = config.n_migrate
        mask[config.preempt_offset : config.preempt_offset + len(running.slots)] = True
        for r, movable in enumerate(running.movable):
            for c, ok in enumerate(movable):
                mask[config.migrate_offset + r * m + c] = ok
    return Candidates(
        state=state,
        config=config,
        slots=slots,
        placements=tuple(rows),
        redundant=tuple(reds),
        predictions=tuple(preds),
        mask=mask,
        contention=b.contention,
        intensity=part.intensity,
        ranks=part.ranks,
        running=running,
    )


def action_mask(cands: Candidates) -> BoolArray:
    """Which actions are allowed (a copy): True for feasible starts, preempts and migrations,
    and for wait."""
    return cands.mask.copy()


def decode(cands: Candidates, action: int) -> Decision:
    """The Decision an action stands for (one start, preemption or migration, or WAIT);
    InvalidAction if masked."""
    cfg = cands.config
    a = int(action)
    if not 0 <= a < cfg.n_actions:
        raise InvalidAction(f"action {a} out of range 0..{cfg.n_actions - 1}")
    if not cands.mask[a]:
        raise InvalidAction(f"action {a} is masked at t={cands.state.time:.1f}")
    if a == cfg.wait_action:
        return WAIT
    if a < cfg.n_start_actions:
        return Decision(starts=(cands.start_for(a),))
    rows = cands.running
    assert rows is not None  # an unmasked running row
    if a < cfg.migrate_offset:
        return Decision(preempt=(rows.slots[a - cfg.preempt_offset].job.job_id,))
    r, c = divmod(a - cfg.migrate_offset, cfg.n_migrate)
    placement = rows.placements[r][c]
    assert placement is not None
    return Decision(migrate=(Start(rows.slots[r].job.job_id, placement),))
