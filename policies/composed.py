"""``Composed``: a ``Policy`` made of an order, a placement, an admission rule and a
preemption rule (``policies.parts``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from linkwise.cluster.domain import ClusterState, Decision
from linkwise.policies.parts.admission import Admission, Greedy
from linkwise.policies.parts.orders import Order
from linkwise.policies.parts.placements import PlacementRule
from linkwise.policies.parts.preemption import NoPreemption, Preemption


@dataclass(frozen=True)
class Composed:
    """``order x placement x preemption`` (plus ``admission`` where nothing is preempted).

    Without preemption the pending jobs, in ``order``, are let in by ``admission`` on
    ``placement``; a preemption rule decides over running and pending jobs together
    (``preemption``'s module docstring). ``policies.compose.ComposeSpec.of`` renders it as
    the ``compose:...`` text that builds it.
    """

    name: str
    order: Order
    placement: PlacementRule
    preemption: Preemption = field(default_factory=NoPreemption)
    admission: Admission = field(default_factory=Greedy)

    def __post_init__(self) -> None:
        if self.order.name == "las" and not self.preemption.preemptive:
            raise ValueError(
                "order=las ranks running and pending jobs together: it needs a preemption "
                "rule that decides over both (preempt=priority)"
            )
        if self.preemption.name == "priority" and self.admission.name != "greedy":
            raise ValueError(
                f"preempt=priority admits greedily by priority: admission={self.admission.name} "
                "does not apply"
            )

    @property
    def needs_predictions(self) -> bool:
        """Whether its order reads run-time predictions."""
        return self.order.needs_predictions

    @property
    def oracle(self) -> bool:
        """Whether its order reads the true run time (an oracle ceiling)."""
        return self.order.oracle

    @property
    def preemptive(self) -> bool:
        """Whether it preempts running jobs."""
        return self.preemption.preemptive

    @property
    def migrates(self) -> bool:
        """Whether it moves running jobs."""
        return self.preemption.migrates

    def decide(self, state: ClusterState) -> Decision:
        """The preemption rule's decision (which lets pending jobs in by its own rule or
        by the admission rule), on the placement bound to this state; the decision point
        the placement asks for (a job waiting for a compact set) joins the decision's."""
        rule = self.placement.at(state)
        decision = self.preemption.decide(state, self.order, rule, self.admission)
        wake = rule.wake_at()
        if state.time < wake < decision.wake_at:
            return replace(decision, wake_at=wake)
        return decision
