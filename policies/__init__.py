"""The policy language, one floor above ``cluster`` (it imports only ``cluster`` and itself):

- ``parts/``: the roles a scheduler is made of, each a small frozen value with one protocol
  (``orders``, ``placements``, ``admission`` with Slurm's backfill planner ``backfill``,
  ``preemption``);
- ``composed``: ``Composed``, the ``Policy`` made of one part per role;
- ``compose``: the parts by name and the ``compose:order=...,placement=...`` text;
- ``heuristics``: the named heuristics, one table of compositions built from parts
  (``random_policy``: the one that is not a composition);
- ``lookahead``: the search policy over forks of the simulator;
- ``source``: what a ``model:`` spec names (a registry alias, URI or folder), as data;
- ``spec``: ``PolicySpec``, the one parser of policy strings;
- ``catalog``: what each policy is (``linkwise policies``).

A learned policy is loaded by ``models`` (``models.build``), above this floor.
"""
