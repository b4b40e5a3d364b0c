"""``scontrol show topology``: what Slurm says it uses, as a source
(``parse_scontrol_topology``) or a cross-check of the configuration
(``topology_differences``).
"""

from __future__ import annotations

from collections.abc import Sequence

from linkwise.cluster.domain import Block, Topology
from linkwise.cluster.hostlist import compress
from linkwise.cluster.topology.build import IMPLICIT_LEAF
from linkwise.cluster.topology.conf_lines import conf_lines
from linkwise.cluster.topology.topology_conf import parse_topology_units


def parse_scontrol_topology(text: str) -> tuple[str, str]:
    """``scontrol show topology`` output -> (plugin kind, the topology.conf text it stands
    for): tree lines ``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=... Switches=...``, block lines
    ``BlockName=b1 BlockIndex=0 Nodes=... BlockSize=2`` and ``AggregatedBlock=b1,b2
    BlockIndex=2 Nodes=... BlockSize=4`` (Slurm's topology_tree.c/topology_block.c
    ``_print_topo_record``); the BlockSizes are the base block's size and the aggregated
    ones' (levels beyond the cluster are not printed, and change nothing: a request that
    large spans the whole topology either way)."""
    kind = ""
    lines: list[str] = []
    sizes: list[int] = []
    for lineno, pairs in conf_lines(text, "scontrol show topology"):
        key, value = pairs[0]
        fields = dict(pairs[1:])
        nodes = fields.get("nodes", "")
        if key == "switchname":
            kind = kind or "tree"
            line = f"SwitchName={value}"
            line += f" Nodes={nodes}" if nodes else ""
            line += f" Switches={fields['switches']}" if fields.get("switches") else ""
            lines.append(line)
        elif key in ("blockname", "aggregatedblock"):
            kind = kind or "block"
            size = fields.get("blocksize", "")
            if not size.isdigit():
                raise ValueError(f"scontrol show topology line {lineno}: no BlockSize")
            sizes.append(int(size))
            if key == "blockname":
                lines.append(f"BlockName={value} Nodes={nodes}" if nodes else f"BlockName={value}")
        else:
            raise ValueError(f"scontrol show topology line {lineno}: unknown record {key}=")
    if kind != ("block" if sizes else kind):
        raise ValueError("scontrol show topology: both switches and blocks")
    if sizes:
        lines.append("BlockSizes=" + ",".join(str(s) for s in sorted(set(sizes))))
    return kind or "flat", "\n".join(lines) + ("\n" if lines else "")


def topology_differences(topo: Topology, scontrol_text: str) -> list[str]:
    """How ``topo`` (from the configuration files) differs from what ``scontrol show
    topology`` says Slurm uses: plugin kind, leaf switches' nodes, base blocks' nodes,
    BlockSizes; [] when they agree."""
    kind, conf = parse_scontrol_topology(scontrol_text)
    diffs: list[str] = []
    if topo.plugin not in (kind, ""):
        diffs.append(f"plugin: configured {topo.plugin!r}, scontrol shows {kind!r}")
        return diffs
    units = parse_topology_units(conf, blocks=kind == "block")
    names = [n.name for n in topo.nodes]
    if kind == "tree":
        ours = {
            leaf: compress([names[i] for i in members])
            for leaf, members in zip(topo.leaf_names, topo.leaf_nodes, strict=True)
            if leaf != IMPLICIT_LEAF
        }
        theirs = {sw.name: compress(list(sw.nodes)) for sw in units.switches.values() if sw.nodes}
        if ours != theirs:
            diffs.append(f"leaf switches: configured {ours}, scontrol shows {theirs}")
    if kind == "block":
        ours_b = [(b.name, compress([names[i] for i in b.nodes])) for b in topo.blocks]
        theirs_b = [(name, compress(list(hosts))) for name, hosts in units.blocks]
        if ours_b != theirs_b:
            diffs.append(f"blocks: configured {ours_b}, scontrol shows {theirs_b}")
        mine = _effective_sizes(topo.block_sizes, topo.blocks, len(topo.blocks))
        shown = _effective_sizes(units.block_sizes, topo.blocks, len(topo.blocks))
        if mine != shown:
            diffs.append(f"block sizes: configured {mine}, scontrol shows {shown}")
    return diffs


def _effective_sizes(sizes: Sequence[int], blocks: Sequence[Block], n_blocks: int) -> list[int]:
    """The block sizes that matter on ``n_blocks`` base blocks (up to the first that holds
    them all), with Slurm's default (base block, 2, 4, 8 base blocks) when none are given."""
    base = sizes[0] if sizes else (len(blocks[0].nodes) if blocks else 1)
    all_sizes = list(sizes) or [base * (1 << k) for k in range(4)]
    out: list[int] = []
    for size in all_sizes:
        out.append(size)
        if size // base >= n_blocks:
            break
    return out
