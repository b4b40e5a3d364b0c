"""The measured link load the live loop reads: the latest valid NIC load of each node from
the store (``read_link_load``: NaN, infinite and negative rows ignored and counted), and the
flows a loaded NIC counts as (``measured_flows``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from linkwise.cluster.contention import link_flows
from linkwise.cluster.domain import RunningJob, Topology
from linkwise.deployer.recorder import Recorder

__all__ = ["measured_flows", "read_link_load"]

_MAX_FLOWS = 1024.0  # a measured NIC load counts as at most this many flows


def read_link_load(
    recorder: Recorder,
    cluster: str,
    since: float,
    on_bad: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """The latest valid NIC load (bytes/s, the busiest device and direction) of each node.

    A rate that is NaN, infinite, negative or not a number is ignored: the latest valid one
    of its link counts instead, and ``on_bad`` is told how many rows of the window were
    ignored (the loop counts them; it never dies on a bad row)."""
    rows = recorder.query(
        "SELECT node, arg_max(bytes_per_s, ts) FILTER (WHERE isfinite(bytes_per_s) "
        "AND bytes_per_s >= 0), count(*) FILTER (WHERE bytes_per_s IS NULL "
        "OR NOT isfinite(bytes_per_s) OR bytes_per_s < 0) FROM link_load "
        "WHERE ts >= ? AND link_class IN ('ib', 'eth') AND (cluster = ? OR cluster = '') "
        "GROUP BY node, device, direction",
        [since, cluster],
    )
    out: dict[str, float] = {}
    bad = 0
    for node, load, n_bad in rows or []:
        bad += int(n_bad or 0)
        value = _rate(load)
        if value is None:
            bad += load is not None
            continue
        out[str(node)] = max(out.get(str(node), 0.0), value)
    if bad and on_bad is not None:
        on_bad(bad)
    return out


def _rate(value: object) -> float | None:
    """A finite, non-negative rate, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    rate = float(value)
    return rate if math.isfinite(rate) and rate >= 0 else None


def measured_flows(
    topo: Topology, running: Sequence[RunningJob], link_load: Mapping[str, float]
) -> tuple[int, ...]:
    """Rings on each link, raised on a node's NIC to the flows its measured load counts as."""
    flows = link_flows(topo, (r.placement for r in running))
    for name, load in link_load.items():
        k = topo.node_index.get(name)
        rate = _rate(load)
        if k is not None and rate is not None and topo.nodes[k].nic_gbps > 0:
            measured = round(min(rate / (topo.nodes[k].nic_gbps * 1e9), _MAX_FLOWS))
            flows[k] = max(flows[k], measured)
    return tuple(flows)
