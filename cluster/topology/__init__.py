"""Build a ``Topology``: from a compact spec, Slurm's slurm.conf/topology.conf, or Alibaba's CSV.

``load.load_topology`` picks the builder from one string (what the CLI takes): a spec
such as ``64x8,leaf=16,oversub=2`` (``spec``), a directory holding ``slurm.conf`` (and maybe
``topology.yaml`` or ``topology.conf``), a ``slurm.conf`` file (``slurm_conf``), or a ``.csv``
file in the Alibaba Lingjun ``ip,DSW,PSW,ASW`` format (``lingjun``). A path may carry options:
``path,nic=25,oversub=2``.

From Slurm's configuration the topology also carries what Slurm's topology plugin enforces
(``Topology.plugin``, ``blocks``, ``block_sizes``, ``leaf_fabric``; the rules themselves are
``cluster.slurm.topology_rules``): the plugin from slurm.conf ``TopologyPlugin=`` (absent:
``flat``), read as Slurm reads it (topology.conf(5), topology.yaml(5), topology.html):
``topology.yaml`` first (25.05+; its cluster-default topology, the first with
``cluster_default: true``, else the first; ``topology_yaml``), else ``topology.conf``
(``SwitchName`` lines for tree, ``BlockName``/``BlockSizes`` lines for block;
``topology_conf``); ``scontrol show topology`` output is read too
(``scontrol.parse_scontrol_topology``), as a source or a cross-check
(``scontrol.topology_differences``). ``conf_lines`` reads the ``Key=Value`` lines of all three.

In every builder (``build.build_topology`` assembles them) a leaf uplink carries ``nodes
under the leaf * NIC / oversub`` and, when there are several aggregation switches, an
aggregation uplink carries ``nodes under it * NIC / agg_oversub``; with one aggregation
switch its uplink is infinite (no ring ever needs it).
"""
