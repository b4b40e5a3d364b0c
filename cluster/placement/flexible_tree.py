"""The nodes Slurm's cons_tres with ``topology/tree`` gives a flexible request
(``eval_nodes_tree.c`` ``_eval_nodes_topo``, Slurm 24.11 and 26.05): ``flexible_tree_nodes``.

1. Node weights: cons_tres favours nodes with more usable GPUs (``job_test.c``: the low byte
   of a node's scheduling weight is 0xff minus its free GPUs, capped at the request), so the
   nodes fall into groups by ``min(free, gpus)``, most first (``_weight_groups``).
2. Groups are taken whole, in that order, until they hold ``gpus`` free GPUs; all groups but
   the last are *required* (allocated whatever follows), the last only *offered*.
3. The leaf switches of required nodes are filled first (offered nodes, index order), then
   other leaf switches one at a time (``_topo_choose_best_switch``, ``_next_leaf``): the
   closest to the switches used so far, then one that *fits* (enough offered nodes, and free
   GPUs on all its nodes for the rest) with the fewest offered nodes, else the one with the
   most (compared at the aggregation level when the leaves' parents differ), else the first;
   inside a leaf, offered nodes in index order, until the job holds ``gpus``.

The job's topmost switch is the switch tree (``Topology.leaf_fabric``) that holds the request
with the most usable GPUs on one node (the last on ties), as Slurm keeps the highest switch
that holds it and has the lowest node weight (``_top_candidates``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from linkwise.cluster.domain import Topology

__all__ = ["FAR", "SwitchTree", "flexible_tree_nodes"]

FAR = 1 << 20
"""The distance between switches without a shared switch above them (Slurm's INFINITE)."""


@dataclass(frozen=True)
class SwitchTree:
    """The switches as ``topology/tree`` numbers them: the leaves, then the aggregation
    switches, then (with several aggregation switches) the one above them."""

    n_leaves: int
    n_aggs: int
    leaf_agg: tuple[int, ...]  # per leaf, its aggregation switch

    @staticmethod
    def of(topo: Topology) -> SwitchTree:
        return SwitchTree(len(topo.leaf_names), len(topo.agg_names), tuple(topo.leaf_agg))

    @property
    def core(self) -> int:
        """The switch above the aggregation layer, -1 without one."""
        return self.n_leaves + self.n_aggs if self.n_aggs > 1 else -1

    @property
    def switches(self) -> range:
        return range(self.n_leaves + self.n_aggs + (1 if self.core >= 0 else 0))

    def parent(self, s: int) -> int:
        if s < self.n_leaves:
            return self.n_leaves + self.leaf_agg[s]
        return self.core if s < self.n_leaves + self.n_aggs else -1

    def ancestors(self, s: int) -> list[int]:
        """``s`` and every switch above it, bottom up."""
        out = [s]
        while self.parent(out[-1]) >= 0:
            out.append(self.parent(out[-1]))
        return out

    def hops(self, a: int, b: int) -> int:
        """Switch hops from ``a`` to ``b`` through their lowest shared switch (``FAR``
        without one)."""
        up_a, up_b = self.ancestors(a), self.ancestors(b)
        common = next((s for s in up_a if s in up_b), None)
        if common is None:
            return FAR
        return up_a.index(common) + up_b.index(common)


@dataclass
class _Walk:
    """The nodes taken so far, the GPUs still needed, and per switch its offered nodes not
    yet counted off (``count``) and the free GPUs of every candidate under it (``room``).
    Local to one ``flexible_tree_nodes`` call, changed as leaves are filled."""

    tree: SwitchTree
    free: Sequence[int]
    by_leaf: dict[int, list[int]]  # per leaf, its offered nodes in index order
    count: dict[int, int]
    room: dict[int, int]
    taken: list[int]
    need: int

    def fill(self, leaf: int) -> bool:
        """Take the leaf's offered nodes in index order until the job holds its GPUs
        (True), or the leaf runs out (False)."""
        for i in self.by_leaf.get(leaf, []):
            if i in self.taken:
                continue
            self.taken.append(i)
            self.need -= self.free[i]
            if self.need <= 0:
                return True
        return False

    def decrement(self, leaf: int, k: int) -> None:
        for s in self.tree.ancestors(leaf):
            self.count[s] = max(0, self.count[s] - k)

    def fits(self, s: int, rem_nodes: int) -> bool:
        return self.count[s] >= rem_nodes and self.room[s] >= self.need

    def compare(self, i: int, j: int, rem_nodes: int) -> tuple[int, bool]:
        """``_topo_compare_switches``: 1 when leaf ``i`` fits better than ``j``, -1 when
        worse, 0 when neither; and whether ``i`` fits (at the level compared last)."""
        while True:
            i_fit, j_fit = self.fits(i, rem_nodes), self.fits(j, rem_nodes)
            if i_fit and j_fit:
                if self.count[i] != self.count[j]:
                    return (1 if self.count[i] < self.count[j] else -1), i_fit
                break
            if i_fit or j_fit:
                return (1 if i_fit else -1), i_fit
            if self.tree.parent(i) != self.tree.parent(j):
                i, j = self.tree.parent(i), self.tree.parent(j)
                continue
            break
        if self.count[i] != self.count[j]:
            return (1 if self.count[i] > self.count[j] else -1), i_fit
        return 0, i_fit


def flexible_tree_nodes(topo: Topology, free: Sequence[int], gpus: int) -> list[int] | None:
    """The nodes cons_tres with ``topology/tree`` gives a request of ``gpus`` GPUs in any
    split, in the order it picks them, or None (the module docstring says how)."""
    cand = _top_candidates(topo, free, gpus)
    if cand is None:
        return None
    required, offered = _weight_groups(cand, free, gpus)
    tree = SwitchTree.of(topo)
    leaf_of = [topo.nodes[i].leaf for i in range(len(free))]
    walk = _start_walk(tree, leaf_of, cand, required, offered, free, gpus)
    used = {s for i in required for s in tree.ancestors(leaf_of[i])}
    if _fill_required_leaves(walk, sorted({leaf_of[i] for i in required})):
        return walk.taken
    # further leaf switches, one at a time; distances from every switch above a required
    # node and every leaf chosen since (``_topo_add_dist``)
    sources = sorted(used)
    while walk.need > 0:
        best = _next_leaf(walk, used, sources)
        if best < 0:
            return None
        used.add(best)
        sources.append(best)
        if walk.fill(best):
            break
        walk.decrement(best, walk.count[best])
        walk.count[best] = 0
    return walk.taken


def _top_candidates(topo: Topology, free: Sequence[int], gpus: int) -> list[int] | None:
    """The nodes with free GPUs in the switch tree that holds the request with the most
    usable GPUs on one node (the last on ties), or None when no tree holds it."""
    n_leaves = len(topo.leaf_names)
    fabric = topo.leaf_fabric or (0,) * n_leaves
    cand = [i for i, f in enumerate(free) if f > 0 and fabric[topo.nodes[i].leaf] >= 0]
    by_fabric: dict[int, list[int]] = {}
    for i in cand:
        by_fabric.setdefault(fabric[topo.nodes[i].leaf], []).append(i)
    top, top_near = -1, -1
    for fab in sorted(by_fabric):
        members = by_fabric[fab]
        near = max(min(free[i], gpus) for i in members)
        if sum(free[i] for i in members) >= gpus and near >= top_near:
            top, top_near = fab, near
    return by_fabric[top] if top >= 0 else None


def _weight_groups(
    cand: Sequence[int], free: Sequence[int], gpus: int
) -> tuple[list[int], set[int]]:
    """Steps 1-2: the required nodes (every weight group but the last taken) and the offered
    ones (every group taken), groups by usable GPUs, most first, until they hold ``gpus``."""
    levels = sorted({min(free[i], gpus) for i in cand}, reverse=True)
    offered: set[int] = set()
    required: list[int] = []
    held = 0
    for level in levels:
        required = sorted(offered)
        group = [i for i in cand if min(free[i], gpus) == level]
        offered.update(group)
        held += sum(free[i] for i in group)
        if held >= gpus:
            break
    return required, offered


def _start_walk(
    tree: SwitchTree,
    leaf_of: Sequence[int],
    cand: Sequence[int],
    required: Sequence[int],
    offered: set[int],
    free: Sequence[int],
    gpus: int,
) -> _Walk:
    """The walk with the required nodes taken and each switch's offered nodes and room."""
    count = dict.fromkeys(tree.switches, 0)
    room = dict.fromkeys(tree.switches, 0)
    for i in cand:
        for s in tree.ancestors(leaf_of[i]):
            room[s] += free[i]
            if i in offered:
                count[s] += 1
    need = gpus
    taken: list[int] = []
    for i in required:
        taken.append(i)
        need -= free[i]
    by_leaf: dict[int, list[int]] = {}
    for i in sorted(offered):
        by_leaf.setdefault(leaf_of[i], []).append(i)
    return _Walk(tree, free, by_leaf, count, room, taken, need)


def _fill_required_leaves(walk: _Walk, leaves: Sequence[int]) -> bool:
    """Step 3a: offered nodes on the leaf switches of required nodes (the count taken
    accumulates over those leaves, as in Slurm); True when the job then holds its GPUs."""
    took = 0
    for leaf in leaves:
        before = len(walk.taken)
        if walk.fill(leaf):
            return True
        took += len(walk.taken) - before
        walk.decrement(leaf, took)
    return False


def _next_leaf(walk: _Walk, used: set[int], sources: Sequence[int]) -> int:
    """Step 3b, one leaf: the unused leaf with offered nodes closest to ``sources``, then
    the one that fits best (``_Walk.compare``); -1 when none is left."""
    rem_nodes = 1 - len(walk.taken)
    dist = {
        leaf: sum(walk.tree.hops(r, leaf) for r in sources) for leaf in range(walk.tree.n_leaves)
    }
    best = -1
    for leaf in range(walk.tree.n_leaves):
        if leaf in used or not walk.count[leaf] or dist[leaf] >= FAR:
            continue
        if best < 0:
            best = leaf
            continue
        better, i_fit = walk.compare(leaf, best, rem_nodes)
        if (dist[leaf] < dist[best] and i_fit) or (dist[leaf] == dist[best] and better > 0):
            best = leaf
    return best
