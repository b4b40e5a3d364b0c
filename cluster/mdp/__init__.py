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

The package's modules: ``config`` (MdpConfig and the names), ``spec`` (feature names,
ObsSpec, ObsLayout), ``slowdown`` (contention predictions), ``candidates`` (slots,
placements, mask, decode), ``features`` (encode), ``reward``, ``apply`` (a step's move on a
local state), ``matching`` (log matching) and ``adapters`` (StepPolicyAdapter, MdpPolicy,
decide_by_steps). Import from here (``from linkwise.cluster.mdp import X``).
"""

from linkwise.cluster.mdp.adapters import MdpPolicy, StepPolicyAdapter, decide_by_steps
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
    encode_state,
    time_from_log,
)
from linkwise.cluster.mdp.known import predicted_remaining, preemptable
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
    "encode_state",
    "jobs_in_system",
    "local_grace",
    "make_spec",
    "match_migrate",
    "match_preempt",
    "match_start",
    "obs_layout",
    "predicted_remaining",
    "preemptable",
    "step_reward",
    "time_from_log",
]
