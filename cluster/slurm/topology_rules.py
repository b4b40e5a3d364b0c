"""Whether Slurm's topology plugin lets a job run on a node list the live loop chose.

On a cluster with ``topology/tree`` or ``topology/block`` the topology takes precedence over
a node list (topology.html, "Requesting specific nodes": "Because topology enforcement takes
precedence, this will prevent the job from receiving an allocation"), so a ``ReqNodeList``
that breaks a rule leaves the job pending. ``check_nodes`` says whether a node list keeps
every rule below, ``place`` finds one that does, ``left_to_slurm`` names what the rules do
not model (the loop hands such jobs back to Slurm) and ``topology_request`` reads what a
job asked from its squeue JSON record. The sources are Slurm's documentation (topology.html,
topology.conf(5), topology.yaml(5), sbatch(1)) and, where it is silent, the plugins
themselves (``src/plugins/topology/tree/eval_nodes_tree.c``,
``src/plugins/topology/block/eval_nodes_block.c``,
``src/plugins/select/cons_tres/job_test.c``); each check's docstring names its rule.

Rules (a node list of ``n`` nodes, ``NumNodes=n``):

- ``flat`` (no plugin): none.
- ``tree``, T1: every node hangs off a leaf switch and all of them share one switch tree
  (topology.html: "no job will span leaf switches without a common parent (unless the
  TopologyParam=TopoOptional option is used)"; eval_nodes_tree.c refuses required nodes
  "that do not have shared network"). With ``TopoOptional`` and no ``--switches`` the tree
  is not applied at all (eval_nodes_tree.c).
- ``tree``, T2: ``--switches=N@T``: at most N leaf switches; with more, "the job remains
  pending until it either finds an allocation with desired switch count or the time limit
  expires" (sbatch(1) ``--switches``): not accepted, the verdict says how long Slurm waits.
- ``block``, B1-B3: every node is in a base block (B1); with base block size ``b`` (the
  first BlockSizes value, else the first block's node count) and the enforced levels (the
  BlockSizes as powers of two of ``b``; Slurm's default without BlockSizes is 1, 2, 4 and 8
  base blocks), the job uses the smallest enforced level of at least ``ceil(n / b)`` base
  blocks rounded up to a power of two, and all its nodes lie in one aggregated block of that
  level, base blocks ``k * 2**L .. (k + 1) * 2**L - 1`` in Slurm's order (B2; above every
  level: anywhere); within it, on at most ``ceil(n / size)`` blocks of the next lower
  enforced level (B3) (topology.conf(5) ``BlockSizes``; topology.html "Block Topology";
  eval_nodes_block.c ``_get_block_level`` and its required-node checks).
- ``block``, S1: ``--segment=S`` with S < n: n must be a multiple of S ("it must also be
  evenly divisible by the segment size", sbatch(1)), else no allocation; the nodes split
  into n / S segments of S nodes, each keeping B1-B3 for S nodes (this check splits them
  greedily, fullest base blocks first); with ``--consolidate-segments`` all of them in one
  block of the level for n nodes (sbatch(1)).
- ``block``, X1: ``--exclusive=topo``: "The job allocation can not share ... topology
  segment" (sbatch(1) ``--exclusive``): no other job on the base blocks it uses, and no job
  goes into a base block that holds a running ``--exclusive=topo`` job (job_test.c
  ``_block_by_topology``, topology_block.c ``topology_p_whole_topo``). The tree plugin does
  not support it (its ``TOPO_DATA_EXCLUSIVE_TOPO`` is 0): ignored there, as Slurm does.

Not modelled (``left_to_slurm``): other plugins (ring, torus3d, ...), ``TopologyParam=
dragonfly``, ``--spread-segments``, and on a tree a multi-node job whose record does not say
whether it asked ``--switches`` (Slurm 22.05's JSON has no such field). A partition's
``EXCLUSIVE_TOPO`` flag and a partition's own ``Topology=`` (topology.yaml) are not read.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.domain import Topology
from linkwise.cluster.slurm.records import TopologyRequest

__all__ = [
    "Verdict",
    "check_nodes",
    "left_to_slurm",
    "place",
    "topology_request",
]

_DEFAULT_LEVELS = (0, 1, 2, 3)  # block_record.c: bit_nset(block_levels, 0, 4)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether Slurm's topology rules accept a node list: ``reason`` names the broken rule;
    ``wait_s`` > 0 when Slurm would hold the job that long first (tree ``--switches``)."""

    ok: bool
    reason: str = ""
    wait_s: float = 0.0


_OK = Verdict(True)


def topology_request(job: Mapping[str, Any]) -> TopologyRequest:
    """A job's topology requests from its squeue/slurmrestd JSON record: ``required_switches``
    and ``maximum_switch_wait_time`` (seconds; absent in 22.05: switches None),
    ``segment_size`` (24.05+), "topo" in ``shared`` (24.11/26.05) or ``exclusive`` (later),
    and ``SPREAD_SEGMENTS``/``CONSOLIDATE_SEGMENTS`` in ``flags``."""
    switches = _number(job.get("required_switches")) if "required_switches" in job else None
    flags = {str(f).upper() for f in _strings(job.get("flags"))}
    shared = {s.lower() for s in (*_strings(job.get("shared")), *_strings(job.get("exclusive")))}
    return TopologyRequest(
        switches=switches,
        switch_wait_s=float(_number(job.get("maximum_switch_wait_time"))),
        segment=_number(job.get("segment_size")),
        exclusive_topo="topo" in shared,
        spread_segments="SPREAD_SEGMENTS" in flags,
        consolidate_segments="CONSOLIDATE_SEGMENTS" in flags,
    )


def _number(value: object) -> int:
    """A count Slurm writes as a number or ``{"set", "infinite", "number"}``; 0 if unset."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return 0
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 0
    try:
        number = int(value)
    except ValueError:
        return 0
    return number if 0 < number < 0xFFFFFFFE else 0  # NO_VAL / INFINITE: not asked


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def left_to_slurm(topo: Topology, req: TopologyRequest, nodes: int) -> str | None:
    """Why the rules cannot judge a job of ``nodes`` nodes on this topology (the loop hands
    it back to Slurm), None when they can (module docstring, "Not modelled")."""
    if topo.plugin in ("", "flat"):
        return None
    if topo.plugin not in ("tree", "block"):
        return f"topology/{topo.plugin} is not modelled"
    if topo.plugin == "tree":
        if "dragonfly" in topo.plugin_params:
            return "TopologyParam=dragonfly is not modelled"
        if req.switches is None and nodes > 1:
            return "its record does not say whether it asked --switches (topology/tree)"
        return None
    if req.spread_segments and 0 < req.segment < nodes:
        return "--spread-segments is not modelled"
    return None


def check_nodes(
    topo: Topology,
    req: TopologyRequest,
    nodes: Sequence[int],
    *,
    busy: Collection[int] = (),
    topo_held: Collection[int] = (),
) -> Verdict:
    """Whether Slurm's topology rules let the job run on exactly ``nodes`` (indices into
    ``topo.nodes``; module docstring for the rules). ``busy``: nodes with another job on
    them; ``topo_held``: nodes of running ``--exclusive=topo`` jobs (rule X1)."""
    if topo.plugin == "tree":
        return _check_tree(topo, req, nodes)
    if topo.plugin == "block":
        return _check_block(topo, req, nodes, busy, topo_held)
    return _OK


def _check_tree(topo: Topology, req: TopologyRequest, nodes: Sequence[int]) -> Verdict:
    """T1 (one switch tree, every node under a leaf switch) and T2 (``--switches``)."""
    switches = req.switches or 0
    if "topooptional" in topo.plugin_params and not switches:
        return _OK  # eval_nodes_tree.c: the tree is not applied
    leaves = {topo.nodes[i].leaf for i in nodes}
    fabric = topo.leaf_fabric or (0,) * len(topo.leaf_names)
    outside = sorted(topo.nodes[i].name for i in nodes if fabric[topo.nodes[i].leaf] < 0)
    if outside:
        return Verdict(False, f"T1: {', '.join(outside)} hang(s) off no leaf switch")
    if len({fabric[leaf] for leaf in leaves}) > 1:
        return Verdict(False, "T1: the nodes share no switch (topology.html, tree)")
    if switches and len(leaves) > switches:
        return Verdict(
            False,
            f"T2: {len(leaves)} leaf switches, the job asks --switches={switches}; Slurm keeps "
            f"it pending up to {req.switch_wait_s:g} s first",
            wait_s=req.switch_wait_s,
        )
    return _OK


@dataclass(frozen=True, slots=True)
class _Levels:
    """The block plugin's view of one allocation size (eval_nodes_block.c)."""

    per_block: int  # base blocks per aggregated block of the chosen level (0: all)
    per_low: int  # base blocks per block of the next lower enforced level
    max_low: int  # at most this many of those


def _base_size(topo: Topology) -> int:
    if topo.block_sizes:
        return topo.block_sizes[0]
    return next((len(b.nodes) for b in topo.blocks if b.nodes), 1)


def _levels_for(topo: Topology, count: int) -> _Levels:
    """B2/B3 for ``count`` nodes: eval_nodes_block.c ``_get_block_level`` (the smallest
    enforced level of at least ``ceil(log2(ceil(count / b)))``, the highest enforced level
    below that for the lower blocks, at most ``ceil(count / their size)`` of them)."""
    base = _base_size(topo)
    levels = (
        tuple(int(math.log2(s // base)) for s in topo.block_sizes)
        if topo.block_sizes
        else _DEFAULT_LEVELS
    )
    raw = math.ceil(math.log2(max(1, math.ceil(count / base))))
    level = min((lv for lv in levels if lv >= raw), default=None)
    low = max((lv for lv in levels if lv <= raw - 1), default=0) if raw > 0 else 0
    per_low = 1 << low
    return _Levels(
        per_block=0 if level is None else 1 << level,
        per_low=per_low,
        max_low=math.ceil(count / (per_low * base)),
    )


def _block_of(topo: Topology) -> dict[int, int]:
    """Node index -> its base block's position in Slurm's order."""
    return {i: k for k, b in enumerate(topo.blocks) for i in b.nodes}


def _one_allocation(topo: Topology, nodes: Sequence[int], block_of: Mapping[int, int]) -> str:
    """B1-B3 for one allocation (or one segment) on ``nodes``; "" when kept."""
    outside = sorted(topo.nodes[i].name for i in nodes if i not in block_of)
    if outside:
        return f"B1: {', '.join(outside)} in no block"
    lv = _levels_for(topo, len(nodes))
    bblocks = sorted({block_of[i] for i in nodes})
    if lv.per_block and len({k // lv.per_block for k in bblocks}) > 1:
        names = ", ".join(topo.blocks[k].name for k in bblocks)
        return (
            f"B2: {len(nodes)} node(s) must lie in one block of {lv.per_block} base "
            f"block(s), not across {names}"
        )
    whole = lv.per_block == 0 or lv.per_block == lv.per_low * lv.max_low
    lows = {k // lv.per_low for k in bblocks}
    if not whole and len(lows) > lv.max_low:
        return (
            f"B3: {len(nodes)} node(s) on {len(lows)} blocks of {lv.per_low} base block(s), "
            f"at most {lv.max_low}"
        )
    return ""


def _check_block(
    topo: Topology,
    req: TopologyRequest,
    nodes: Sequence[int],
    busy: Collection[int],
    topo_held: Collection[int],
) -> Verdict:
    """B1-B3, S1 (``--segment``) and X1 (``--exclusive=topo``)."""
    block_of = _block_of(topo)
    why = _exclusive(topo, req, nodes, block_of, busy, topo_held)
    if why:
        return Verdict(False, why)
    n = len(nodes)
    if not 0 < req.segment < n:
        why = _one_allocation(topo, nodes, block_of)
        return Verdict(False, why) if why else _OK
    if n % req.segment:
        return Verdict(False, f"S1: {n} nodes is not a multiple of --segment={req.segment}")
    if req.consolidate_segments:
        why = _one_allocation(topo, nodes, block_of)
        if why.startswith(("B1", "B2")):
            return Verdict(False, f"S1 (--consolidate-segments): {why}")
    if _segments(topo, nodes, req.segment, block_of) is None:
        return Verdict(
            False, f"S1: the nodes do not split into segments of {req.segment} that keep B1-B3"
        )
    return _OK


def _exclusive(
    topo: Topology,
    req: TopologyRequest,
    nodes: Sequence[int],
    block_of: Mapping[int, int],
    busy: Collection[int],
    topo_held: Collection[int],
) -> str:
    """X1: an ``--exclusive=topo`` job's base blocks hold no other job; no job enters a base
    block holding a running ``--exclusive=topo`` job. "" when kept."""
    mine = {block_of[i] for i in nodes if i in block_of}
    held = {block_of[i] for i in topo_held if i in block_of}
    if mine & held:
        names = ", ".join(topo.blocks[k].name for k in sorted(mine & held))
        return f"X1: block(s) {names} hold an --exclusive=topo job"
    if req.exclusive_topo:
        taken = {block_of[i] for i in busy if i in block_of} & mine
        if taken:
            names = ", ".join(topo.blocks[k].name for k in sorted(taken))
            return f"X1: --exclusive=topo, but block(s) {names} hold other jobs"
    return ""


def _segments(
    topo: Topology, nodes: Sequence[int], size: int, block_of: Mapping[int, int]
) -> list[list[int]] | None:
    """A split of ``nodes`` into segments of ``size`` nodes, each keeping B1-B3 (the fullest
    base blocks first), or None when this greedy split finds none."""
    left = _by_unit(nodes, block_of)
    out: list[list[int]] = []
    while left:
        segment = left[:size]
        if len(segment) < size or _one_allocation(topo, segment, block_of):
            return None
        out.append(segment)
        left = _by_unit(left[size:], block_of)
    return out


def _by_unit(nodes: Iterable[int], unit_of: Mapping[int, int]) -> list[int]:
    """``nodes`` grouped by unit (-1: none), the unit with most nodes first (ties: first
    seen)."""
    ordered = sorted(_groups(nodes, unit_of), key=len, reverse=True)
    return [i for group in ordered for i in group]


def _groups(nodes: Iterable[int], unit_of: Mapping[int, int]) -> list[list[int]]:
    """``nodes`` grouped by unit (-1: none), units in the order of their first node."""
    groups: dict[int, list[int]] = {}
    for i in nodes:
        groups.setdefault(unit_of.get(i, -1), []).append(i)
    return list(groups.values())


def _coarse(block_of: Mapping[int, int], per_block: int) -> dict[int, int]:
    """Node -> its aggregated block of ``per_block`` base blocks (0: one for all)."""
    return {i: k // per_block if per_block else 0 for i, k in block_of.items()}


def place(
    topo: Topology,
    req: TopologyRequest,
    count: int,
    candidates: Sequence[int],
    *,
    busy: Collection[int] = (),
    topo_held: Collection[int] = (),
) -> tuple[int, ...] | None:
    """``count`` of the ``candidates`` (node indices, most preferred first) that
    ``check_nodes`` accepts, or None. It tries each unit the rules confine the job to (a
    switch tree; an aggregated block of the job's level; for segments, one such block per
    segment), in the order of their first candidate, taking the candidates of the fullest
    leaf switches or base blocks first (fewest leaves, fewest blocks)."""
    if count <= 0 or len(candidates) < count:
        return None
    if topo.plugin not in ("tree", "block"):
        return tuple(candidates[:count])
    if topo.plugin == "tree":
        fabric = topo.leaf_fabric or (0,) * len(topo.leaf_names)
        inner = {i: topo.nodes[i].leaf for i in candidates}
        units = _groups(candidates, {i: fabric[leaf] for i, leaf in inner.items()})
    else:
        inner = _block_of(topo)
        segmented = 0 < req.segment < count
        if segmented and not req.consolidate_segments:
            units = [list(candidates)]  # segments may lie in different blocks
        else:
            units = _groups(candidates, _coarse(inner, _levels_for(topo, count).per_block))
    for unit in units:
        if len(unit) < count:
            continue
        ordered = _by_unit(unit, inner)
        if topo.plugin == "block" and 0 < req.segment < count:
            chosen = _segment_pick(topo, ordered, count, req.segment, inner)
        else:
            chosen = ordered[:count]
        verdict = check_nodes(topo, req, chosen, busy=busy, topo_held=topo_held)
        if len(chosen) == count and verdict.ok:
            return tuple(chosen)
    return None


def _segment_pick(
    topo: Topology, ordered: Sequence[int], count: int, size: int, block_of: Mapping[int, int]
) -> list[int]:
    """``count`` nodes in segments of ``size``: each segment the fullest base blocks' nodes
    of the first block of the segment's level that still has ``size`` candidates in blocks;
    [] when none is left."""
    coarse = _coarse(block_of, _levels_for(topo, size).per_block)
    left = list(ordered)
    out: list[int] = []
    while len(out) < count:
        fit = next((u for u in _groups(left, coarse) if len(u) >= size and u[0] in block_of), None)
        if fit is None:
            return []
        segment = _by_unit(fit, block_of)[:size]
        out.extend(segment)
        taken = set(segment)
        left = [i for i in left if i not in taken]
    return out
