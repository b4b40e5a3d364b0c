"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19), preemptive."""

from __future__ import annotations

from dataclasses import dataclass, field

from linkwise.cluster.compose import Composed, ComposeSpec
from linkwise.cluster.compose.orders import (
    DEFAULT_THRESHOLDS,
    LAS_MODES,
    Las,
    parse_thresholds,
)
from linkwise.cluster.domain import ClusterState, Decision

DEFAULT_STARVE_FACTOR = 0.0
ORDERS = LAS_MODES

__all__ = ["DEFAULT_STARVE_FACTOR", "DEFAULT_THRESHOLDS", "ORDERS", "TiresiasLas", "las_part"]


def las_part(
    thresholds: tuple[float, ...], order: str, starve_factor: float, running_first: bool
) -> str:
    """The ``order=las`` part with these parameters (defaults left out)."""
    params = []
    if thresholds != DEFAULT_THRESHOLDS:
        params.append("thresholds=" + ";".join(repr(t) for t in thresholds))
    if order != "entry":
        params.append(f"mode={order}")
    if starve_factor:
        params.append(f"starve_factor={starve_factor!r}")
    if not running_first:
        params.append("running_first=false")
    return "order=las" + (":" + ",".join(params) if params else "")


@dataclass(frozen=True, slots=True)
class TiresiasLas:
    """Discretised 2D-LAS: priority queues by attained GPU-seconds, fit-first inside a queue.

    A job's queue follows its attained service (GPUs x time held) against ``thresholds``
    (ascending GPU-seconds; one number or an ``"a;b"`` string is accepted too, for
    command-line specs): new jobs enter queue 0. At every decision the queues are scanned
    in priority order, each in its own order, and jobs are admitted greedily while the GPUs
    (free plus those held by running jobs) suffice, skipping ones that do not fit. Running
    jobs that are not admitted are preempted; admitted pending jobs start, in that order, on
    a best-fit placement over the GPUs free after the preemptions; admitted running jobs
    keep their placement. The composition ``order=las, placement=best_fit,
    preempt=priority:refill=false`` (``compose.orders.Las`` keeps the queues).

    ``order="entry"`` (default) is the reference ``dlas-gpu``: each queue keeps the order
    jobs entered it (arrivals to queue 0, demoted jobs appended to the tail of the next
    queue, behind the jobs already waiting there), and after every round its pending jobs
    move behind its running ones; a running job crossing its queue's threshold is noticed
    as an event (``Decision.wake_at``) and demoted one level. That order is the scheduler's
    own memory, so this policy keeps it between decisions (reset when the clock goes back or
    none of the jobs it knows is left); jobs it has not seen (a warm start) join the queue
    their service says, in submit order. No starvation guard (``starve_factor`` must be 0).

    ``order="submit"`` is this project's earlier stateless form: every job's queue from its
    attained service now, and inside a queue (with ``running_first``) running before
    pending, then submit time and job id. Its starvation guard (a stateless form of
    Tiresias' STARVE_LIMIT): a pending job whose time in the system without GPUs is at
    least ``starve_factor`` times its executed time (attained GPU-seconds / GPUs) is treated
    as queue 0; a running job stays there while that ratio is at least half the factor.
    The earlier defaults were ``thresholds=3600,starve_factor=10``.
    """

    name: str = "tiresias_las"
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    starve_factor: float = DEFAULT_STARVE_FACTOR
    running_first: bool = True
    order: str = "entry"
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", parse_thresholds(self.thresholds))
        # the order's own checks (modes, the starvation guard)
        Las(self.thresholds, self.order, self.starve_factor, self.running_first)
        policy = ComposeSpec.parse(self.composition).build(name=self.name)
        object.__setattr__(self, "_policy", policy)

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        las = las_part(self.thresholds, self.order, self.starve_factor, self.running_first)
        return f"compose:{las},placement=best_fit,preempt=priority:refill=false"

    def queue_of(
        self, attained_gpu_s: float, gpus: int, waited_s: float, running: bool = False
    ) -> int:
        """The queue index of a job with this service, size and time spent without GPUs."""
        order = self._policy.order
        assert isinstance(order, Las)
        return order.queue_of(attained_gpu_s, gpus, waited_s, running)

    def decide(self, state: ClusterState) -> Decision:
        """Admit by priority; preempt the running jobs left out, start the admitted pending ones."""
        return self._policy.decide(state)
