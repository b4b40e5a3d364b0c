"""The parts schedulers are composed of (issue 22; Blox keeps its parts apart the same way).

A policy is ``order x placement x preemption`` plus an admission rule:

- ``orders``: which job comes first (submit, fewest GPUs, predicted GPU time, predicted
  remaining GPU time, Tiresias' attained-service queues, and two oracle orders that read
  the true remaining run time);
- ``placements``: where a job goes (first fit, Slurm's select, best fit, SJF-BCO's bounded
  rule, least added contention);
- ``admission``: how pending jobs are let in without preemption (``strict`` FIFO prefix,
  ``greedy`` scan, ``easy`` backfill's reservation, planned by ``backfill``);
- ``preemption``: ``none``, ``priority`` (preempt to admit by priority, with a margin and a
  minimum run time), ``migrate`` (DeepShare's rule).

``policies.composed.Composed`` is the ``Policy`` made of them; ``policies.compose`` names
them in ``compose:order=...,placement=...,preempt=...`` specs.
"""
