"""Which GPUs a start may take: free ones, or ones that jobs in transit are draining and no
other start has reserved. ``check_fits`` checks a placement against them, ``reserve`` takes
them (the ``Simulator``'s ledgers, passed in).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from linkwise.cluster.domain import Job, Placement, Topology, requested_shape, within_request
from linkwise.cluster.simulator.bookkeeping import Transit
from linkwise.cluster.simulator.errors import InvalidDecision


def check_fits(
    topology: Topology,
    free: Sequence[int],
    claimable: Sequence[int],
    time: float,
    job: Job,
    placement: Placement,
    own: dict[int, int] | None = None,
) -> None:
    """Raise InvalidDecision unless ``placement`` fits the job and the GPUs ``free``, held by
    jobs draining (not yet reserved, ``claimable``) or, for a migration, its own ``own``, at
    ``time``."""
    if placement.num_gpus != job.num_gpus:
        raise InvalidDecision(
            f"t={time:.1f}: job {job.job_id} asks {job.num_gpus} GPUs, "
            f"placement gives {placement.num_gpus}"
        )
    if not within_request(job, placement, topology.max_gpus_per_node):
        raise InvalidDecision(
            f"t={time:.1f}: job {job.job_id} asks the fixed shape "
            f"{requested_shape(job, topology.max_gpus_per_node)}, "
            f"placement gives {placement.alloc}"
        )
    for node, gpus in placement.alloc:
        if not 0 <= node < len(free):
            have: object = "no such node"
        else:
            have = free[node] + claimable[node] + (own.get(node, 0) if own else 0)
            if have >= gpus:
                continue
        raise InvalidDecision(
            f"t={time:.1f}: job {job.job_id} wants {gpus} GPUs on node {node}, free: {have}"
        )


def reserve(
    placement: Placement,
    time: float,
    free: list[int],
    claimable: list[int],
    transit: Collection[Transit],
    own: Transit | None = None,
) -> float:
    """Take ``placement``'s GPUs: ``free`` ones first, then ones being drained (``own``'s
    first, then those of the jobs in ``transit``); return when the last of them is let go
    (``time`` if all were free). Checked beforehand by ``check_fits``."""
    ready = time
    for node, gpus in placement.alloc:
        take = min(free[node], gpus)
        free[node] -= take
        need = gpus - take
        if not need:
            continue
        donors = [own] if own is not None else []
        donors += sorted(
            (t for t in transit if t is not own and t.unclaimed.get(node)),
            key=lambda t: t.drain_end,
        )
        for donor in donors:
            have = donor.unclaimed.get(node, 0)
            if not have:
                continue
            got = min(have, need)
            donor.unclaimed[node] = have - got
            claimable[node] -= got
            ready = max(ready, donor.drain_end)
            need -= got
            if not need:
                break
        assert not need, "reservation checked by check_fits"
    return ready
