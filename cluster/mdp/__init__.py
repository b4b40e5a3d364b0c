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
  (``MdpConfig.generators``): the five of ``linkwise.cluster.placement.generators``,
  ``least_contention`` (defined here: among the other generators' placements and a
  best fit inside each leaf switch, the one minimising the job's predicted slowdown plus
  the slowdown it adds to running split jobs) and ``bounded`` (SJF-BCO's consolidated
  placement, ``cluster.placement.generators.bounded_placement``: None when the job would
  span more than ``ceil(span_lambda x n_min)`` servers, so a policy offered only
  ``bounded`` candidates waits for consolidation).
- Actions: ``K * P + 1``; ``a < K * P`` is (slot ``a // P``, candidate ``a % P``), the
  last one is "wait". The mask marks empty slots and generators that returned None;
  with ``mask_duplicates`` (default) a candidate equal to an earlier one of the same
  slot is masked too, so each distinct placement has exactly one action. Wait is
  always allowed.
- Running rows (``running_slots`` R > 0; off by default, and then no spec changes):
  after the start rows, R preempt rows (``preempt_offset + r``), then, with ``migrate``,
  R x P migrate rows (``migrate_offset + r * P + c``), then wait: ``K * P + R * (1 + P) +
  1`` actions. A running slot holds a job that may be preempted (``preempt_share`` of the
  jobs, by a hash of the job id; live, the deployer checks the opt-in) and has run
  ``min_run_s`` since its last start; a draining job is in ``ClusterState.transit``, not
  running, and gets none. Migrate candidates are the generators' placements with the job's
  own GPUs counted free; its current placement is masked. ``decode`` gives
  ``Decision(preempt=(id,))`` or ``Decision(migrate=(Start(id, placement),))``; inside a
  decision point the preempted or migrated job drains for the restart model's grace (its
  GPUs held), so a start cannot reuse them before the next decision point.
- Observation: a fixed-length float32 vector independent of cluster size (global,
  per-slot, per-(slot, candidate) features; with running rows per running slot and per
  (running slot, candidate): attained service, predicted remaining time, restart cost, the
  contention model's slowdown where it runs), described by an ``ObsSpec`` whose
  ``version`` hashes the feature names, the configuration and ``ENCODER_REVISION``.
  It holds only what a real Slurm with a run-time predictor knows (``docs/INFORMATION.md``):
  submit time, shape, time limit, wait, attained service, and the predictions of
  ``Job.pred_s`` / ``pred_hi_s`` (``datasets.predictor``), never ``Job.duration``,
  ``remaining_s``, a running job's rate or expected end. Times and GPU times are
  ``log1p(x / unit)`` clipped to ``[0, 1]`` (``features.log_time``, ``log_size``;
  ``time_from_log`` inverts the former, e.g. to read a slot's wait). Encoding a job
  without predictions raises ValueError: a run-time predictor fit on history is needed.
- Reward: ``-(jobs in system x dt) / time_scale - contention_weight x contention``;
  starts inside a decision point carry zero reward, so an episode's return is minus
  the total JCT over ``time_scale`` (Little's law).

Compute the candidates once per state (``candidates``) and pass them to
``action_mask``, ``encode`` and ``decode``. Predictions are keyed by (profile, GPU
count, placement), so jobs with the same shape share the work.

The package's modules: ``config`` (MdpConfig and the names), ``spec`` (feature names,
ObsSpec, ObsLayout), ``slots`` (which pending jobs get slots), ``placements`` (the
generators), ``slowdown`` (contention predictions), ``running`` (the running slots),
``candidates`` (mask, decode), ``known`` (predictions, preemptability, restart cost),
``features`` (encode), ``reward``, ``apply`` (a step's move on a local state),
``matching`` (log matching) and ``adapters`` (StepPolicyAdapter, MdpPolicy,
decide_by_steps). Import from here (``from linkwise.cluster.mdp import X``).
"""

from linkwise.cluster.mdp.adapters import (
    MdpPolicy,
    StepPolicyAdapter,
    decide_by_steps,
    nothing_fits,
)
from linkwise.cluster.mdp.apply import (
    apply_decision,
    apply_migrate,
    apply_preempt,
    apply_start,
    local_grace,
)
from linkwise.cluster.mdp.candidates import Candidates, action_mask, candidates, decode
from linkwise.cluster.mdp.config import (
    ENCODER_REVISION,
    GENERATORS,
    ORDERS,
    RUN_ORDERS,
    SLOT_ORDERS,
    BoolArray,
    FloatArray,
    InvalidAction,
    MdpConfig,
)
from linkwise.cluster.mdp.features import (
    encode,
    encode_partial,
    encode_state,
    time_from_log,
)
from linkwise.cluster.mdp.known import may_preempt, predicted_remaining, preemptable
from linkwise.cluster.mdp.matching import (
    MOVE_KINDS,
    START_KINDS,
    StepMatch,
    decision_steps,
    match_migrate,
    match_preempt,
    match_start,
)
from linkwise.cluster.mdp.reward import contention_term, jobs_in_system, step_reward
from linkwise.cluster.mdp.running import RunningRows
from linkwise.cluster.mdp.slowdown import comm_intensity
from linkwise.cluster.mdp.spec import ObsLayout, ObsSpec, make_spec, obs_layout

__all__ = [
    "ENCODER_REVISION",
    "GENERATORS",
    "MOVE_KINDS",
    "ORDERS",
    "RUN_ORDERS",
    "SLOT_ORDERS",
    "START_KINDS",
    "BoolArray",
    "Candidates",
    "FloatArray",
    "InvalidAction",
    "MdpConfig",
    "MdpPolicy",
    "ObsLayout",
    "ObsSpec",
    "RunningRows",
    "StepMatch",
    "StepPolicyAdapter",
    "action_mask",
    "apply_decision",
    "apply_migrate",
    "apply_preempt",
    "apply_start",
    "candidates",
    "comm_intensity",
    "contention_term",
    "decide_by_steps",
    "decision_steps",
    "decode",
    "encode",
    "encode_partial",
    "encode_state",
    "jobs_in_system",
    "local_grace",
    "make_spec",
    "match_migrate",
    "match_preempt",
    "match_start",
    "may_preempt",
    "nothing_fits",
    "obs_layout",
    "predicted_remaining",
    "preemptable",
    "step_reward",
    "time_from_log",
]
