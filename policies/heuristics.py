"""The named heuristics: one table of compositions, each built directly from its parts.

``fifo`` (strict FIFO, first fit), ``backfill`` (EASY backfill as Slurm's sched/backfill),
``best_fit`` (greedy scan, consolidated placement), ``sjf_bco`` (SJF-BCO, MobiHoc'22),
``tiresias_las`` (Tiresias' discretised 2D-LAS, preemptive), ``random`` (seeded) and
``qssf`` (Helios' quasi-shortest-service-first on predicted GPU time: needs run-time
predictions, ``Job.pred_s``); the frontier: ``qssf_preemptive``, ``tiresias_consolidated``
and ``deepshare``; ``backfill_switches`` (``backfill`` with Slurm's ``--switches=N@T``)
and ``qssf_wait_or_spread`` (the frontier's order with a placement that spreads flexible
jobs only after a wait and where cheap, issue 33) and ``qssf_group_aware`` (the frontier with
Arnold's alignment of pipeline jobs' DP groups to leaf switches, issue 33 item 4).

Every one but ``random`` is a ``Composed`` of parts (``policies.parts``): its builder below
takes the heuristic's typed parameters (the ones a spec ``NAME:key=value`` may give,
``heuristic_parameters``) and returns the composition; ``ComposeSpec.of`` renders it as the
``compose:`` spec it is (what ``linkwise policies`` shows), never parsed to build it.

Oracle ceilings, which read the true remaining run time no real scheduler has
(``ORACLE_POLICIES``): ``sjf_bco_oracle`` and ``srtf_oracle`` (preemptive). Tables mark
them ``oracle``; gates never take one as a reference.

The margin and minimum run time of the frontier policies keep them from thrashing under
honest restart costs (``cluster/restart.py``): a preempted job pays its checkpoint, grace
and restore.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import Policy
from linkwise.policies.composed import Composed
from linkwise.policies.parts.admission import Easy, Strict
from linkwise.policies.parts.backfill import DEFAULT_LIMIT_S
from linkwise.policies.parts.orders import (
    DEFAULT_THRESHOLDS,
    Gpus,
    Las,
    MissingPredictions,
    PredGpuTime,
    PredRemaining,
    Submit,
    TrueGpuTime,
    TrueRemaining,
)
from linkwise.policies.parts.placements import (
    WAIT_S,
    BestFit,
    Bounded,
    FirstFit,
    GroupAware,
    LeastContention,
    Select,
    WaitOrSpread,
)
from linkwise.policies.parts.preemption import Migrate, Priority
from linkwise.policies.random_policy import RandomPolicy

__all__ = [
    "DEFAULT_MARGIN",
    "DEFAULT_MIN_RUN_S",
    "ORACLE_POLICIES",
    "POLICIES",
    "PREDICTION_POLICIES",
    "MissingPredictions",
    "heuristic_parameters",
    "make_policy",
    "policy_names",
]

DEFAULT_MARGIN = 1.5
DEFAULT_MIN_RUN_S = 600.0


def fifo() -> Composed:
    """Start jobs in canonical queue order (first fit) until one does not fit, then wait.

    Strict FIFO with Slurm cons_tres-like first-fit placement, no backfill. Jobs larger
    than the whole cluster are skipped rather than blocking the queue forever."""
    return Composed("fifo", Submit(), FirstFit(), admission=Strict())


def backfill(
    max_job_test: int = 100,
    default_limit_s: float = DEFAULT_LIMIT_S,
    window_s: float = DEFAULT_LIMIT_S,
    resolution_s: float = 60.0,
) -> Composed:
    """Slurm's scheduling of one partition: the main scheduler, then sched/backfill.

    Every job asks for a shape (``domain.requested_shape``: nodes x GPUs per node) and
    starts only in it, on the nodes ``placement.slurm_select`` picks (cons_tres best fit,
    fewest leaf switches). The main scheduler starts jobs in queue (priority) order while
    each fits now in its shape, and stops at the first that does not. Backfill then walks
    the rest of the queue (at most ``max_job_test`` jobs, Slurm's ``bf_max_job_test``) and
    plans each at its earliest start in the node-space: the GPUs free now, plus those the
    running jobs release at their expected ends (start + estimate), minus the nodes
    reserved for the jobs planned before it. A job whose earliest start is now starts; one
    that must wait reserves its nodes, whole (as Slurm's backfill does), from that start
    for its estimated run time, both ends rounded down to ``resolution_s``
    (``bf_resolution``), if the start is within ``window_s`` (``bf_window``); a job whose
    run would reach a reservation's start may not use its nodes. So a later job starts
    only where it delays no earlier one, by the estimates. Estimates come from time limits,
    else the run-time predictor's upper quantile (``parts.backfill.runtime_estimate``,
    ``default_limit_s`` where a job has neither), never the true run time; an overdue job
    is expected to end within ``OVERDUE_S``. Jobs larger than the whole cluster are ignored.

    ``order=submit, placement=select, admission=easy``: the planner is
    ``parts.backfill.plan_backfill`` (the ``easy`` admission part calls it on the queue in
    the order's order), kept whole: its node-space is what Slurm's backfill plans in.
    """
    easy = Easy(max_job_test, default_limit_s, window_s, resolution_s)
    return Composed("backfill", Submit(), Select(), admission=easy)


def backfill_switches(
    switches: int = 1,
    max_wait_s: float = WAIT_S,
    max_job_test: int = 100,
    default_limit_s: float = DEFAULT_LIMIT_S,
    window_s: float = DEFAULT_LIMIT_S,
    resolution_s: float = 60.0,
) -> Composed:
    """``backfill`` with every job submitted ``--switches=N@T`` (``switches`` N,
    ``max_wait_s`` T; Slurm's default wait 300 s): a job whose nodes would span more than N
    leaf switches does not start until T after its submission, then starts anywhere
    (``placements.Select.held``): ``order=submit, placement=select:switches=N,
    admission=easy``."""
    easy = Easy(max_job_test, default_limit_s, window_s, resolution_s)
    return Composed("backfill_switches", Submit(), Select(switches, max_wait_s), admission=easy)


def best_fit() -> Composed:
    """Scan the queue in canonical order; start every job that fits, on a best-fit placement.

    Unlike ``fifo`` a job that does not fit does not block the ones behind it (greedy,
    no reservation, so a large job can wait long behind a stream of small ones):
    ``order=submit, placement=best_fit``."""
    return Composed("best_fit", Submit(), BestFit())


def sjf_bco(kappa: int | None = None, lam: float = 1.0) -> Composed:
    """Smallest job first; small jobs packed onto busy servers, large ones on least-busy servers.

    SJF-BCO (Smallest Job First with Balanced Contention and Overhead, Yu et al.,
    MobiHoc'22). Pending jobs are taken by GPU count ascending (ties: submit time, job id)
    and every job that fits is started (no reservation). A job with ``gpus <= kappa``
    (default: the GPUs of the largest node) is placed by ``fragment_first_fit`` (FA-FFP), a
    larger one by ``least_busy`` (LBSGF), which spreads large rings over the servers with
    the fewest jobs, balancing contention.

    ``lam`` (the paper's lambda, >= 1) bounds the other side of that balance, the overhead
    term ``gamma_j = xi2 * servers spanned``: a job may span at most ``ceil(lam * n_min)``
    servers, ``n_min`` being the fewest servers of the cluster that could hold it at all.
    When the rule's placement spans more, the consolidated ``best_fit`` placement is tried
    instead; when that spans more too, the job waits. With the default ``lam = 1`` a job
    that fits in one server is never split and a large one only starts on a fully
    consolidated placement; ``lam = inf`` removes the bound (the plain rules).
    ``order=gpus, placement=bounded``, shared with QSSF and the SJF-BCO oracle but for the
    order.
    """
    return Composed("sjf_bco", Gpus(), Bounded(kappa, lam))


def tiresias_las(
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
    starve_factor: float = 0.0,
    running_first: bool = True,
    order: str = "entry",
) -> Composed:
    """Discretised 2D-LAS: priority queues by attained GPU-seconds, fit-first inside a queue.

    Tiresias (Gu et al., NSDI'19), preemptive. A job's queue follows its attained service
    (GPUs x time held) against ``thresholds`` (ascending GPU-seconds; one number or an
    ``"a;b"`` string is accepted too): new jobs enter queue 0. At every decision the queues
    are scanned in priority order, each in its own order, and jobs are admitted greedily
    while the GPUs (free plus those held by running jobs) suffice, skipping ones that do not
    fit. Running jobs that are not admitted are preempted; admitted pending jobs start, in
    that order, on a best-fit placement over the GPUs free after the preemptions; admitted
    running jobs keep their placement: ``order=las, placement=best_fit,
    preempt=priority:refill=false`` (``parts.orders.Las`` keeps the queues and has the
    rest: ``order="entry"``, the reference ``dlas-gpu``, and ``order="submit"``, this
    project's earlier stateless form with its starvation guard ``starve_factor``).
    """
    las = Las(thresholds, order, starve_factor, running_first)
    return Composed("tiresias_las", las, BestFit(), Priority(refill=False))


def seeded_random(seed: int = 0, start_prob: float = 0.5) -> RandomPolicy:
    """Start a random subset of the pending jobs that fit, each on a random candidate placement.

    A baseline and a behaviour policy for offline data (``policies.random_policy``)."""
    return RandomPolicy(seed=seed, start_prob=start_prob)


def qssf(kappa: int | None = None, lam: float = 1.0) -> Composed:
    """Smallest *predicted* GPU time first, with SJF-BCO's placement rule and node-span bound.

    QSSF: Quasi-Shortest-Service-First (Hu et al., "Characterization and Prediction of Deep
    Learning Workloads in Large-Scale GPU Datacenters", SC'21, the Helios scheduler). Helios
    orders pending jobs by their expected service, GPUs x predicted run time, the prediction
    coming from the history of similar jobs. Here the prediction is the run-time
    predictor's median (``Job.pred_s``, set by ``datasets.predictor.RuntimePredictor``,
    fit only on jobs submitted before the evaluated ones): what a real scheduler can know,
    never the true run time. Ties: submit time, job id. Placement is SJF-BCO's (``kappa``,
    ``lam`` as in ``sjf_bco``); no preemption: ``order=pred_gpu_time, placement=bounded``.

    A pending job without a prediction is an error (``MissingPredictions``): QSSF is the
    best same-information heuristic only when it is given the same history a learned policy
    gets (``--history`` on the command line).
    """
    return Composed("qssf", PredGpuTime(who="qssf"), Bounded(kappa, lam))


def qssf_preemptive(
    margin: float = DEFAULT_MARGIN,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    kappa: int | None = None,
    lam: float = 1.0,
) -> Composed:
    """Preemptive QSSF: GPUs x predicted remaining time, a margin and a minimum run time.

    Every running and pending job ranked by GPUs x predicted remaining run time (the
    predictor's median, then its p90, then as long again as the job has run), admitted
    greedily, the rest preempted; a running job keeps its GPUs unless a pending one beats
    it by ``margin``, and is never preempted within ``min_run_s`` of its last start. Started
    on SJF-BCO's consolidated placement: ``order=pred_remaining, placement=bounded,
    preempt=priority``."""
    order = PredRemaining(who="qssf_preemptive")
    preempt = Priority(margin=margin, min_run_s=min_run_s)
    return Composed("qssf_preemptive", order, Bounded(kappa, lam), preempt)


def tiresias_consolidated(
    min_run_s: float = DEFAULT_MIN_RUN_S, kappa: int | None = None, lam: float = 1.0
) -> Composed:
    """Tiresias-LAS's queues with SJF-BCO's consolidated placement instead of best fit.

    The reference ``dlas-gpu`` order, the same minimum run time as ``qssf_preemptive``, and
    the refill rule (a preemption that frees nothing used is undone): ``order=las,
    placement=bounded, preempt=priority``."""
    preempt = Priority(min_run_s=min_run_s)
    return Composed("tiresias_consolidated", Las(), Bounded(kappa, lam), preempt)


def deepshare(
    ratio: float = 0.6,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    mode: str = "migrate",
    model: ContentionModel | None = None,
) -> Composed:
    """DeepShare: a split job whose predicted throughput ratio is low moves to a consolidated one.

    First come first served, least added contention, and a split job whose predicted
    shared/isolated throughput ratio is at most ``ratio`` migrated to a consolidated
    placement when one is free (``mode=preempt`` preempts it instead): ``order=submit,
    placement=least_contention, preempt=migrate``. ``model``: the contention model that
    predicts the throughput ratio (the shipped calibration's when None)."""
    migrate = Migrate(ratio=ratio, min_run_s=min_run_s, mode=mode, model=model)
    return Composed("deepshare", Submit(), LeastContention(), migrate)


def qssf_wait_or_spread(
    wait_s: float = 3600.0,
    lam: float = 2.0,
    min_rate: float = 0.9,
    apart: bool = True,
    margin: float = DEFAULT_MARGIN,
    min_run_s: float = DEFAULT_MIN_RUN_S,
) -> Composed:
    """``qssf_preemptive``'s order and preemption, placing a flexible job compactly when it
    can and spreading it only after a wait and only where spreading is predicted cheap.

    A flexible job starts on the fewest nodes and leaves that could hold it when they are
    free; else it waits ``wait_s`` from its submission, then may spread over at most
    ``ceil(lam * n_min)`` nodes where the shipped calibration's model predicts it at least
    ``min_rate`` of its isolated speed alone there, choosing the node set whose ring meets
    the least estimated traffic (``apart``: a communication-heavy job first keeps off links
    carrying another heavy ring): ``order=pred_remaining, placement=wait_or_spread,
    preempt=priority``."""
    order = PredRemaining(who="qssf_wait_or_spread")
    place = WaitOrSpread(wait_s=wait_s, lam=lam, min_rate=min_rate, apart=apart)
    preempt = Priority(margin=margin, min_run_s=min_run_s)
    return Composed("qssf_wait_or_spread", order, place, preempt)


def qssf_group_aware(
    margin: float = DEFAULT_MARGIN,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    kappa: int | None = None,
    lam: float = 1.0,
) -> Composed:
    """``qssf_preemptive`` with Arnold's alignment: a job with pipeline stages (``Job.pp``)
    whose consolidated placement would split a stage's DP group over leaf switches takes
    whole nodes with each DP group under one leaf and the stages under the fewest switches
    (``placement.aligned``); every other job as ``qssf_preemptive``: ``order=pred_remaining,
    placement=group_aware, preempt=priority``."""
    order = PredRemaining(who="qssf_group_aware")
    preempt = Priority(margin=margin, min_run_s=min_run_s)
    return Composed("qssf_group_aware", order, GroupAware(kappa, lam), preempt)


def sjf_bco_oracle(kappa: int | None = None, lam: float = 1.0) -> Composed:
    """SJF-BCO by true GPU time (``num_gpus x remaining_s``): an oracle ceiling.

    No real scheduler knows the true remaining run time, so an oracle is never a baseline
    to beat nor a gate's reference: it shows how far perfect run-time knowledge would go on
    the same cluster. ``order=true_gpu_time, placement=bounded`` (no preemption)."""
    return Composed("sjf_bco_oracle", TrueGpuTime(), Bounded(kappa, lam))


def srtf_oracle(kappa: int | None = None, lam: float = 1.0) -> Composed:
    """Preemptive shortest remaining (true, isolated) time first: an oracle ceiling.

    Every job, running or pending, is ranked by remaining time (ties: submit time, job id)
    and admitted in that order while the cluster's GPUs suffice; running jobs left out are
    preempted. The admitted pending jobs are then placed in rank order with SJF-BCO's
    placement rule and node-span bound (``kappa``, ``lam`` as in ``sjf_bco``), so the
    ceiling is not lost to spread-out rings: ``order=true_remaining, placement=bounded,
    preempt=priority`` (a preempted job whose GPUs no new start took keeps running, and the
    GPUs still free go to the other pending jobs, in rank order)."""
    return Composed("srtf_oracle", TrueRemaining(), Bounded(kappa, lam), Priority())


POLICIES: Mapping[str, Callable[..., Policy]] = MappingProxyType(
    {
        "fifo": fifo,
        "backfill": backfill,
        "backfill_switches": backfill_switches,
        "best_fit": best_fit,
        "sjf_bco": sjf_bco,
        "tiresias_las": tiresias_las,
        "random": seeded_random,
        "qssf": qssf,
        "qssf_preemptive": qssf_preemptive,
        "tiresias_consolidated": tiresias_consolidated,
        "deepshare": deepshare,
        "qssf_wait_or_spread": qssf_wait_or_spread,
        "qssf_group_aware": qssf_group_aware,
        "sjf_bco_oracle": sjf_bco_oracle,
        "srtf_oracle": srtf_oracle,
    }
)

# heuristics that read the true run time: ceilings, marked ``oracle``, never a gate reference
ORACLE_POLICIES: frozenset[str] = frozenset({"sjf_bco_oracle", "srtf_oracle"})
# heuristics that order by predicted run time (``Job.pred_s``): they need a fitted predictor
PREDICTION_POLICIES: frozenset[str] = frozenset(
    {"qssf", "qssf_preemptive", "qssf_wait_or_spread", "qssf_group_aware"}
)
# named heuristics the default lists (``policy_names``) leave out: ``qssf_group_aware`` decides
# as ``qssf_preemptive`` for every job without a parallel layout (``Job.pp``), so on workloads
# without them it would only repeat that row; ``linkwise policies`` lists it, a spec names it
OPT_IN_POLICIES: frozenset[str] = frozenset({"qssf_group_aware"})
_HIDDEN = frozenset({"model"})  # given by the builder (the scenario's model), not by a spec


def heuristic_parameters(name: str) -> dict[str, Any]:
    """The declared parameters (name -> type hint) of the heuristic ``name``, the ones a
    spec may give (ValueError naming the known heuristics if unknown)."""
    try:
        build = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    hints = typing.get_type_hints(build)
    return {
        p: hints[p]
        for p in inspect.signature(build).parameters
        if p not in _HIDDEN and not p.startswith("_")
    }


def takes_model(name: str) -> bool:
    """Whether the heuristic ``name`` predicts contention with a model it is given."""
    return "model" in inspect.signature(POLICIES[name]).parameters


def policy_names(*, predictions: bool = False, oracles: bool = True) -> list[str]:
    """The registered heuristic names, in registry order: those that run on any workload,
    with the ones that need run-time predictions (``qssf``) only when ``predictions``, and
    the oracle ceilings unless ``oracles`` is False; never the opt-in ones (``OPT_IN_POLICIES``)."""
    return [
        n
        for n in POLICIES
        if (predictions or n not in PREDICTION_POLICIES)
        and (oracles or n not in ORACLE_POLICIES)
        and n not in OPT_IN_POLICIES
    ]


def make_policy(name: str, **params: Any) -> Policy:
    """Build the heuristic ``name`` with ``params`` (typed values); ValueError naming the
    known ones if unknown."""
    try:
        build = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return build(**params)
