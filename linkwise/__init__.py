"""linkwise: contention-aware scheduling for Slurm GPU clusters.

The subpackages are the project's top-level folders (see pyproject.toml):
``cluster`` (domain, topology, contention, simulator), ``datasets`` (traces
and transitions), ``models`` (policies), ``evaluation``, ``deployer`` and
``pipelines``.
"""

__version__ = "0.1.0"
