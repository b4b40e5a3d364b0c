"""Fixtures in code that tests and benchmarks share, importable without reaching into
``tests/`` (which is not a package the library or the benchmarks build on):

- ``history``: a simulated accounting history (``simulated_history``) and the settled
  ``JobRun`` one completed run makes (``completed_run``).

It imports ``cluster``, ``policies`` and ``datasets`` and nothing above them; no library
floor imports it.
"""
