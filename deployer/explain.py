"""Why the live loop decided what it did: one explanation per decision row, recorded at
decision time, and ``linkwise explain JOB_ID`` to read a job's decisions in time order.

``explain_cycle`` builds, for every row a cycle writes (one per start, or the cycle's wait),
a JSON-able record (``EXPLAIN_VERSION``):

- ``chosen``: the start (job, nodes, GPUs) or the wait, with the policy's value of it where the
  policy scores its actions (a learned package: Q-value or log-probability); ``runner_up``:
  the best other allowed action at that step and its value (heuristics give none);
  ``advantage``: the value over the base policy, for a policy that is a residual on a
  heuristic (none is yet: always null).
- ``base``: what the base policy would have done on the same state (a learned policy's base
  is the loop's fallback heuristic, which also guards it; a heuristic's base is itself):
  whether it would start this job, where, and every start it would make; ``deviated``: the
  policy's treatment of the job differs from the base's (another placement, a start the base
  would not make, a wait where the base would start).
- ``predicted_slowdown``: the contention model's prediction, as the observation's candidate
  features compute it (``cluster.mdp``), of the job's slowdown at its placement next to what
  runs (t / t_best - 1) and of the slowdown it adds to its running neighbours in all.
- ``guard``: the guard's reason when it replaced the model's choice; ``note``: the loop's
  note (a fallback and its reason); ``preempt`` / ``migrate``: what the policy asked to
  preempt or move (the loop does not apply them yet); ``jobs``: every job the record names,
  for ``job_decisions``.
- ``queue`` (the cycle's first row only): every pending job the loop saw, in queue order, with
  what a person asks of a waiting job (issue 32 item 7): its GPUs, how long it has waited
  and its predicted run time (hours), and the rule that held it this cycle (``held``: too
  few free GPUs, the policy waiting where its base would start it, the policy's order putting
  the jobs it started first, or the policy keeping GPUs idle); the queue's jobs are in
  ``jobs``, so ``linkwise explain`` answers "why is my job still waiting?" for any of them.
  The decision log stores the queue only when it differs from the last one it stored
  (``queue_key``: the same jobs in the same order with the same GPUs, predictions and holds;
  what they have waited grows every cycle and is not compared); a cycle whose queue is
  unchanged stores ``"queue": null`` and keeps the queue's jobs in ``jobs``. ``job_decisions``
  gives such a row the run's latest snapshot at or before its cycle, each job's wait advanced
  to the row's time: ``linkwise explain`` reads every row as if the queue were stored in it.

Nothing here talks to Slurm: the explanation is built from the state the loop already read.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Placement, Policy, Start
from linkwise.cluster.hostlist import compress
from linkwise.cluster.mdp import MdpConfig, apply_start, candidates
from linkwise.cluster.metrics import duration_text

__all__ = [
    "EXPLAIN_VERSION",
    "as_of",
    "decide_explained",
    "describe",
    "duration_words",
    "explain_cycle",
    "explain_lines",
    "job_decisions",
    "queue_key",
    "queue_record",
]

# 2: the cycle's queue with each waiting job's hold (issue 32 item 7); 3: "queue": null where
# it is the run's last stored snapshot (stored when it changes)
EXPLAIN_VERSION = 3
ROW_COLUMNS = (
    "decision_id",
    "run_id",
    "cycle_id",
    "ts",
    "mode",
    "policy",
    "model_version",
    "job_id",
    "action",
    "nodes",
    "gpus",
    "latency_ms",
    "n_pending",
    "note",
    "actual_start",
    "actual_nodes",
    "deviated",
    "explanation",
)


def decide_explained(
    policy: Policy, state: ClusterState
) -> tuple[Decision, tuple[Any, ...] | None]:
    """The policy's decision and, for a policy with a ``decide_explained`` hook (a learned
    package), its steps (``models.learned.ExplainedStep``); None for the others."""
    hook = getattr(policy, "decide_explained", None)
    if callable(hook):
        decision, steps = hook(state)
        return decision, tuple(steps)
    return policy.decide(state), None


def _nodes(state: ClusterState, placement: Placement) -> str:
    return compress(state.topology.nodes[n].name for n in placement.nodes)


def _number(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _contention(state: ClusterState, model: ContentionModel) -> Any:
    """The mdp's contention predictor on this state (the one its candidate features use)."""
    return candidates(state, MdpConfig(k_slots=1), model).contention


def _slowdowns(
    state: ClusterState,
    starts: Sequence[Start],
    model: ContentionModel,
    steps: Sequence[Any] | None,
) -> list[dict[str, Any]]:
    """Per start: the job's predicted slowdown and the slowdown it adds to its neighbours,
    each start next to what runs and to the starts before it in the decision; both None,
    with the reason, where the model cannot predict (a job without a communication profile)."""
    out: list[dict[str, Any]] = []
    s: ClusterState | None = state
    for i, start in enumerate(starts):
        step = steps[i] if steps is not None and i < len(steps) else None
        pred, why = None, ""
        try:
            if step is not None:
                p = step.candidates.config.n_candidates
                pred = step.candidates.predictions[step.action // p][step.action % p]
            elif s is not None:
                pj = next((p for p in s.pending if p.job.job_id == start.job_id), None)
                if pj is not None:
                    pred = _contention(s, model).predict(pj.job, start.placement)
            if s is not None:
                s = apply_start(s, start, model)
        except ValueError as exc:
            why, s = str(exc)[:200], None  # the later starts' neighbours are unknown too
        if pred is None:
            out.append({"job": None, "neighbours": None, "unknown": why or "not predicted"})
        else:
            sd = {"job": _number(pred.job_slowdown), "neighbours": _number(pred.added_slowdown)}
            out.append(sd)
    return out


def _action(step: Any, action: int, score: float | None) -> dict[str, Any] | None:
    """A step's action in words: a start (job, nodes, GPUs) or wait, with its value."""
    if action < 0:
        return None
    c = step.candidates
    if action == c.config.wait_action:
        return {"action": "wait", "score": _number(score)}
    start = c.start_for(action)
    return {
        "action": "start",
        "job_id": start.job_id,
        "nodes": _nodes(c.state, start.placement),
        "gpus": start.placement.num_gpus,
        "score": _number(score),
    }


def _hours(seconds: float) -> float:
    return round(seconds / 3600.0, 4)


def _held(
    gpus: int, free: int, base_starts_it: bool, started_any: bool, policy: str, base: str
) -> str:
    """The rule that kept a pending job waiting this cycle, in words."""
    if gpus > free:
        return f"too few free GPUs: it needs {gpus}, {free} free after this cycle's starts"
    if base_starts_it:
        return f"the policy {policy} chose to wait where its base {base} would start it"
    if started_any:
        return f"the policy {policy} started other jobs first (its order ranks them ahead)"
    return f"the policy {policy} kept the free GPUs idle (waiting for a better placement)"


def queue_record(
    state: ClusterState, decision: Decision, base_decision: Decision | None, policy: str, base: str
) -> list[dict[str, Any]]:
    """Every pending job of the cycle in queue order: GPUs, hours waited, predicted hours
    (None without a prediction), whether it started, and the rule that held it."""
    started = {s.job_id for s in decision.starts}
    base_ids = {s.job_id for s in (base_decision or decision).starts}
    free = state.total_free_gpus - sum(s.placement.num_gpus for s in decision.starts)
    out: list[dict[str, Any]] = []
    for i, p in enumerate(state.pending):
        job = p.job
        out.append(
            {
                "job_id": job.job_id,
                "position": i + 1,
                "gpus": job.num_gpus,
                "waited_h": _hours(max(0.0, state.time - job.submit_time)),
                "pred_h": _hours(job.pred_s) if job.pred_s > 0 else None,
                "started": job.job_id in started,
                "held": ""
                if job.job_id in started
                else _held(job.num_gpus, free, job.job_id in base_ids, bool(started), policy, base),
            }
        )
    return out


def queue_key(queue: Sequence[Mapping[str, Any]]) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """What makes two cycles' queues the same snapshot: every entry but how long the job has
    waited (it grows every cycle; read back from the snapshot's time, ``job_decisions``)."""
    return tuple(tuple(sorted((k, v) for k, v in q.items() if k != "waited_h")) for q in queue)


def explain_cycle(
    state: ClusterState,
    decision: Decision,
    *,
    policy: str,
    model_version: str,
    steps: Sequence[Any] | None,
    base: str,
    base_decision: Decision | None,
    model: ContentionModel,
    note: str = "",
) -> dict[int | None, dict[str, Any]]:
    """One explanation per row of the cycle (see the module docstring), by job id (None: the
    cycle's wait row). ``base_decision`` None: the policy is its own base."""
    queue = queue_record(state, decision, base_decision, policy, base)
    own = base_decision is None
    based = decision if base_decision is None else base_decision
    base_starts = {s.job_id: s for s in based.starts}
    base_list = [
        {"job_id": s.job_id, "nodes": _nodes(state, s.placement), "gpus": s.placement.num_gpus}
        for s in based.starts
    ]
    chosen_ids = {s.job_id for s in decision.starts}
    cycle_deviated = not own and (
        chosen_ids != set(base_starts)
        or any(base_starts[s.job_id].placement != s.placement for s in decision.starts)
    )
    common: dict[str, Any] = {
        "v": EXPLAIN_VERSION,
        "policy": policy,
        "model_version": model_version,
        "advantage": None,
        "cycle_deviated": cycle_deviated,
        "preempt": [int(j) for j in decision.preempt],
        "migrate": [
            {"job_id": m.job_id, "nodes": _nodes(state, m.placement)}
            for m in getattr(decision, "migrate", ())
        ],
        "note": note,
    }
    mentioned = set(base_starts) | chosen_ids | {int(j) for j in decision.preempt}
    out: dict[int | None, dict[str, Any]] = {}
    slow = _slowdowns(state, decision.starts, model, steps)
    for i, start in enumerate(decision.starts):
        step = steps[i] if steps is not None and i < len(steps) else None
        b = base_starts.get(start.job_id)
        deviated = not own and (b is None or b.placement != start.placement)
        runner = _action(step, step.runner_up, step.runner_up_score) if step else None
        jobs = set(mentioned)
        if runner and runner.get("job_id") is not None:
            jobs.add(int(runner["job_id"]))
        out[start.job_id] = {
            **common,
            "step": i,
            "chosen": {
                "action": "start",
                "job_id": start.job_id,
                "nodes": _nodes(state, start.placement),
                "gpus": start.placement.num_gpus,
                "score": _number(step.score) if step else None,
            },
            "runner_up": runner,
            "base": {
                "policy": base,
                "itself": own,
                "action": "start" if b is not None else "wait",
                "nodes": _nodes(state, b.placement) if b is not None else "",
                "starts": base_list,
            },
            "deviated": deviated,
            "predicted_slowdown": slow[i],
            "guard": step.guard if step else "",
            "jobs": sorted(jobs | ({q["job_id"] for q in queue} if i == 0 else set())),
            **({"queue": queue} if i == 0 else {}),
        }
    if not decision.starts:
        step = steps[-1] if steps else None
        runner = _action(step, step.runner_up, step.runner_up_score) if step else None
        jobs = set(mentioned)
        if runner and runner.get("job_id") is not None:
            jobs.add(int(runner["job_id"]))
        out[None] = {
            **common,
            "step": 0,
            "chosen": {"action": "wait", "score": _number(step.score) if step else None},
            "runner_up": runner,
            "base": {
                "policy": base,
                "itself": own,
                "action": "start" if base_list else "wait",
                "nodes": "",
                "starts": base_list,
            },
            "deviated": cycle_deviated,
            "predicted_slowdown": None,
            "guard": step.guard if step else "",
            "jobs": sorted(jobs | {q["job_id"] for q in queue}),
            "queue": queue,
        }
    return out


# ------------------------------------------------------------------------ reading


def job_decisions(con: Any, job_id: int) -> list[dict[str, Any]]:
    """Every decision row about ``job_id`` (its starts, and the rows whose explanation names
    it: as the runner-up, as a start the base would have made, as a preemption, as a job of
    the queue), oldest first; a row stored without its unchanged queue (``"queue": null``)
    is given its run's latest snapshot at or before its cycle (``as_of``)."""
    picked = (
        f"SELECT {', '.join(ROW_COLUMNS)} FROM decisions WHERE job_id = ? OR "
        "(explanation IS NOT NULL AND "
        "list_contains(CAST(json_extract(explanation, '$.jobs') AS BIGINT[]), ?))"
    )
    snapshots = (
        "SELECT run_id AS s_run, cycle_id AS s_cycle FROM decisions WHERE run_id IN "
        "(SELECT run_id FROM r) AND json_type(explanation, '$.queue') = 'ARRAY'"
    )
    sql = (
        f"WITH r AS ({picked}), s AS ({snapshots}) SELECT r.*, s.s_cycle FROM r "
        "ASOF LEFT JOIN s ON r.run_id = s.s_run AND r.cycle_id >= s.s_cycle "
        "ORDER BY r.ts, r.cycle_id, r.decision_id"
    )
    rows = con.execute(sql, [int(job_id), int(job_id)]).fetchall()
    stored: dict[tuple[str, int], tuple[float, list[dict[str, Any]]] | None] = {}
    out: list[dict[str, Any]] = []
    for r in rows:
        d = dict(zip(ROW_COLUMNS, r[:-1], strict=True))
        raw = d.get("explanation")
        e = d["explanation"] = json.loads(raw) if raw else None
        if e is not None and "queue" in e and e["queue"] is None and r[-1] is not None:
            key = (str(d["run_id"]), int(r[-1]))
            if key not in stored:
                stored[key] = _snapshot(con, *key)
            snap = stored[key]
            if snap is not None:
                e["queue"] = as_of(snap[1], float(d["ts"]) - snap[0])
        out.append(d)
    return out


def _snapshot(con: Any, run_id: str, cycle_id: int) -> tuple[float, list[dict[str, Any]]] | None:
    """(its row's time, the queue) of the snapshot the run stored in that cycle."""
    found = con.execute(
        "SELECT ts, json_extract(explanation, '$.queue') FROM decisions WHERE run_id = ? AND "
        "cycle_id = ? AND json_type(explanation, '$.queue') = 'ARRAY' LIMIT 1",
        [run_id, cycle_id],
    ).fetchone()
    return None if found is None else (float(found[0]), json.loads(found[1]))


def as_of(queue: Sequence[Mapping[str, Any]], later_s: float) -> list[dict[str, Any]]:
    """A stored queue snapshot read ``later_s`` seconds after it was stored: every job has
    waited that much longer."""
    return [
        {**q, "waited_h": _hours(float(q["waited_h"]) * 3600.0 + max(0.0, later_s))} for q in queue
    ]


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"+{100 * x:.0f}%"


def duration_words(hours: float | None) -> str:
    """A duration a person reads (``cluster.metrics.duration_text``), ``unknown`` if missing."""
    return "unknown" if hours is None else duration_text(hours * 3600.0)


def _in_queue(row: Mapping[str, Any], job_id: int) -> Mapping[str, Any] | None:
    """The job's entry in the row's recorded queue, None when the row has no queue or the
    job is not in it."""
    e = row.get("explanation") or {}
    return next((q for q in e.get("queue") or () if int(q["job_id"]) == job_id), None)


def waiting_words(q: Mapping[str, Any], n: int) -> str:
    """A waiting job's queue entry in plain words."""
    return (
        f"waiting: position {q['position']} of {n}, {q['gpus']} GPUs, waited "
        f"{duration_words(q.get('waited_h'))}, predicted run time "
        f"{duration_words(q.get('pred_h'))}; held by: {q['held']}"
    )


def _act_words(a: Mapping[str, Any] | None) -> str:
    if not a:
        return "none"
    score = f" (value {a['score']:.4g})" if a.get("score") is not None else ""
    if a.get("action") == "wait":
        return f"wait{score}"
    return f"start job {a['job_id']} on {a['nodes']} ({a['gpus']} GPUs){score}"


def describe(row: Mapping[str, Any], job_id: int) -> list[str]:
    """One decision row, as ``job_id``'s reader needs it, in lines of plain words."""
    e = row.get("explanation") or {}
    version = str(row.get("model_version") or "")
    head = (
        f"{_when(float(row['ts']))} UTC  cycle {row['cycle_id']}  {row['mode']}  "
        f"policy {row['policy']}" + (f" (version {version})" if version else "")
    )
    lines = [head]
    mine = row.get("job_id") == job_id
    if row["action"] == "start" and mine:
        lines.append(f"  decided: start job {job_id} on {row['nodes']} ({row['gpus']} GPUs)")
    elif row["action"] == "start":
        lines.append(f"  decided: start job {row['job_id']} on {row['nodes']}, not job {job_id}")
    elif mine:
        lines.append(f"  decided: not to start job {job_id}: {row['note']}")
    else:
        lines.append(f"  decided: start nothing ({row['n_pending']} pending)")
    q = _in_queue(row, job_id)
    if q is not None and not q.get("started"):
        lines.append("  " + waiting_words(q, len(e.get("queue") or ())))
    if not e:
        lines.append("  (no explanation recorded: a row written before explanations existed)")
        return lines
    chosen = e.get("chosen") or {}
    if chosen.get("score") is not None:
        lines.append(f"  its value: {chosen['score']:.4g}")
    runner = e.get("runner_up")
    if runner:
        lines.append(f"  runner-up: {_act_words(runner)}")
    if e.get("advantage") is not None:
        lines.append(f"  advantage over the base: {e['advantage']:.4g}")
    sd = e.get("predicted_slowdown")
    if sd and row["action"] == "start":
        lines.append(
            f"  predicted slowdown: job {row['job_id']} {_pct(sd.get('job'))} at these nodes, "
            f"its running neighbours {_pct(sd.get('neighbours'))} in all"
            + (f" ({sd['unknown']})" if sd.get("unknown") else "")
        )
    base = e.get("base") or {}
    if base.get("itself"):
        lines.append(f"  base: {base.get('policy')} is the policy itself (no deviation)")
    else:
        theirs = {int(s["job_id"]): s for s in base.get("starts", [])}
        if job_id in theirs:
            what = f"start job {job_id} on {theirs[job_id]['nodes']}"
        else:
            what = f"not start job {job_id}"
        others = [f"{j} on {s['nodes']}" for j, s in theirs.items() if j != job_id]
        more = f"; it would start {', '.join(others)}" if others else ""
        verdict = "the policy DEVIATED" if e.get("deviated") else "the policy agreed"
        lines.append(f"  base {base.get('policy')} would {what}{more}: {verdict}")
    if e.get("guard"):
        lines.append(f"  guard overrode the model: {e['guard']}")
    if e.get("preempt"):
        lines.append(f"  asked to preempt (not applied): {e['preempt']}")
    if e.get("note"):
        lines.append(f"  note: {e['note']}")
    if row["action"] == "start" and mine:
        if row.get("actual_start") is not None:
            lag = float(row["actual_start"]) - float(row["ts"])
            lines.append(
                f"  what Slurm did: started it at {_when(float(row['actual_start']))} UTC "
                f"({lag:+.0f} s) on {row.get('actual_nodes') or '?'}"
            )
        else:
            lines.append("  what Slurm did: not seen starting it yet")
    return lines


def explain_lines(rows: Sequence[Mapping[str, Any]], job_id: int) -> list[str]:
    """``linkwise explain``'s text: the latest hold first when the job was last seen waiting,
    then its decisions oldest first, cycles that held it for the same rule folded into one."""
    out = [f"job {job_id}: {len(rows)} decision(s), oldest first"]
    last = _in_queue(rows[-1], job_id)
    if last is not None and not last.get("started"):
        n = len((rows[-1].get("explanation") or {}).get("queue") or ())
        seen = _when(float(rows[-1]["ts"]))
        out.insert(0, f"job {job_id}, last seen at {seen} UTC: {waiting_words(last, n)}")
    held, same, until = "", 0, 0.0
    for r in rows:
        q = _in_queue(r, job_id)
        only_queued = q is not None and not q.get("started") and r.get("job_id") != job_id
        if only_queued and q is not None and q["held"] == held:
            same, until = same + 1, float(r["ts"])
            continue
        if same:
            out.append(f"  (held the same way in {same} more cycle(s), until {_when(until)} UTC)")
        held, same = (q["held"] if only_queued and q is not None else ""), 0
        out += describe(r, job_id)
    if same:
        out.append(f"  (held the same way in {same} more cycle(s), until {_when(until)} UTC)")
    return out
