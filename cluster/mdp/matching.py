"""Log matching: the actions that reproduce a recorded decision."""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Placement, Start
from linkwise.cluster.mdp.apply import apply_migrate, apply_preempt, apply_start, local_grace
from linkwise.cluster.mdp.candidates import Candidates, candidates
from linkwise.cluster.mdp.spec import ObsSpec

START_KINDS = ("exact", "nearest", "unslotted")  # the kinds of a step that reproduces a start
MOVE_KINDS = ("preempt", "migrate", "migrate_nearest")  # a step that preempts or migrates


@dataclass(frozen=True, slots=True)
class StepMatch:
    """How an action reproduces a start: ``kind`` is "exact" (the candidate is the start's
    placement), "nearest" (most GPUs on the same nodes), "unslotted" (the job is in no slot or
    has no candidate: wait is emitted) or "wait" (the decision starts nothing more). With
    running rows a preemption is "preempt" (its job's preempt row), a migration "migrate"
    (the candidate is its target) or "migrate_nearest" (most GPUs on the target's nodes); one
    whose job has no unmasked row is "unslotted" like a start."""

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


def match_migrate(cands: Candidates, move: Start) -> StepMatch | None:
    """The unmasked migrate action closest to ``move`` (None if its job has none)."""
    row = cands.migrate_row(move.job_id)
    if row is None:
        return None
    first, placements = row
    best: StepMatch | None = None
    for c, p in enumerate(placements):
        a = first + c
        if p is None or not cands.mask[a]:
            continue
        if p == move.placement:
            return StepMatch(a, move.job_id, "migrate", 1.0)
        ov = _overlap(p, move.placement)
        if best is None or ov > best.overlap:
            best = StepMatch(a, move.job_id, "migrate_nearest", ov)
    return best


def match_preempt(cands: Candidates, job_id: int) -> StepMatch | None:
    """The preempt action of ``job_id`` (None if it has no unmasked preempt row)."""
    a = cands.preempt_action(job_id)
    if a is None or not cands.mask[a]:
        return None
    return StepMatch(a, job_id, "preempt", 1.0)


def decision_steps(
    state: ClusterState, decision: Decision, spec: ObsSpec, model: ContentionModel
) -> list[tuple[Candidates, StepMatch]]:
    """The steps that reproduce a decision (e.g. a real one from the logs): with running rows
    (``MdpConfig.running_slots``) each preemption, then each migration, then each start, in
    order, matched to its closest action, then wait (without, preemptions and migrations are
    left out, as before). The state follows the real moves."""
    cfg = spec.config
    out: list[tuple[Candidates, StepMatch]] = []
    s = state
    wait = cfg.wait_action
    if cfg.running_slots:
        grace = local_grace(cfg)
        for job_id in decision.preempt:
            c = candidates(s, cfg, model)
            out.append((c, match_preempt(c, job_id) or StepMatch(wait, job_id, "unslotted", 0.0)))
            s = apply_preempt(s, job_id, grace)
        for move in decision.migrate:
            c = candidates(s, cfg, model)
            m = match_migrate(c, move) or StepMatch(wait, move.job_id, "unslotted", 0.0)
            out.append((c, m))
            s = apply_migrate(s, move, model, grace)
    for start in decision.starts:
        c = candidates(s, cfg, model)
        m = match_start(c, start) or StepMatch(wait, start.job_id, "unslotted", 0.0)
        out.append((c, m))
        s = apply_start(s, start, model)
    out.append((candidates(s, cfg, model), StepMatch(wait, None, "wait", 1.0)))
    return out
