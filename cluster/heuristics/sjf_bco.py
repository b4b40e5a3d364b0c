"""SJF-BCO: Smallest Job First with Balanced Contention and Overhead (Yu et al., MobiHoc'22)."""

from __future__ import annotations

from dataclasses import dataclass, field

from linkwise.cluster.compose import Composed, compose
from linkwise.cluster.compose.placements import check_bco_params
from linkwise.cluster.domain import ClusterState, Decision


def bounded_part(kappa: int | None, lam: float) -> str:
    """The ``placement=bounded`` part with these parameters (defaults left out)."""
    params = []
    if kappa is not None:
        params.append(f"kappa={kappa}")
    if lam != 1.0:
        params.append(f"lam={lam}")
    return "placement=bounded" + (":" + ",".join(params) if params else "")


@dataclass(frozen=True, slots=True)
class SjfBco:
    """Smallest job first; small jobs packed onto busy servers, large ones on least-busy servers.

    Pending jobs are taken by GPU count ascending (ties: submit time, job id) and every
    job that fits is started (no reservation). A job with ``gpus <= kappa`` (default: the
    GPUs of the largest node) is placed by ``fragment_first_fit`` (FA-FFP), a larger one by
    ``least_busy`` (LBSGF), which spreads large rings over the servers with the fewest
    jobs, balancing contention.

    ``lam`` (the paper's lambda, >= 1) bounds the other side of that balance, the overhead
    term ``gamma_j = xi2 * servers spanned``: a job may span at most ``ceil(lam * n_min)``
    servers, ``n_min`` being the fewest servers of the cluster that could hold it at all.
    When the rule's placement spans more, the consolidated ``best_fit`` placement is tried
    instead; when that spans more too, the job waits. With the default ``lam = 1`` a job
    that fits in one server is never split and a large one only starts on a fully
    consolidated placement; ``lam = inf`` removes the bound (the plain rules). The
    composition ``order=gpus, placement=bounded`` (greedy admission), shared with QSSF
    and the SJF-BCO oracle but for the order.
    """

    name: str = "sjf_bco"
    kappa: int | None = None
    lam: float = 1.0
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)
        object.__setattr__(self, "_policy", compose(self.composition, name=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return f"compose:order=gpus,{bounded_part(self.kappa, self.lam)}"

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest first, with SJF-BCO's placement rules."""
        return self._policy.decide(state)
