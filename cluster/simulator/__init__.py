"""A discrete-event cluster simulator: one of the Backends a policy drives.

Events are arrivals, completions, optional periodic ticks and the wake-ups policies ask
for (``Decision.wake_at``). Between events every
running job progresses at the rate the contention model gives for the current
placement of everything (a fluid model). Rates are recomputed at every event that
changes the set of jobs split across nodes (single-node jobs never contend, so their
rate is fixed at start). Completions are kept in a heap with lazy invalidation.

Preemption and migration cost what the restart model (``cluster/restart.py``) says: a
signalled job drains (holds its GPUs for the grace, no progress, no communication), then
frees them; every restart adds the restore cost (and any lost work) to its isolated work.
Jobs draining or waiting on reserved GPUs are ``ClusterState.transit``.

The simulator is deterministic: it has no randomness of its own; the same jobs,
topology, model and policy give the same result.

One module per concern: ``engine`` (the ``Simulator`` itself), ``config`` (``SimConfig``),
``errors``, ``records`` (``JobRecord``, ``SimResult``), ``bookkeeping`` (a running job's,
a job in transit's and a job's totals; ``ResumedTransit``, what ``Simulator.from_state``
takes), ``reservations`` (free and drained GPUs: ``check_fits``, ``reserve``) and ``run``
(``simulate``, a whole run).
"""
