"""A hidden truth: a simulated cluster whose contention parameters and communication
profiles the calibration does not know, observed only through what real exporters print and
what Slurm's accounting holds (issue 34 item 4).

The truth is a ``Calibration`` (``alpha``, ``overhead_s``, one ``CommProfile`` per job name)
on a topology of its own (link speeds unlike the shipped defaults). Its jobs run in the real
simulator (``cluster.simulator.engine.Simulator`` with an ``AnalyticModel`` of the hidden
calibration, scheduled by the seeded ``RandomPolicy``, which spreads jobs over nodes and so
makes rings share links); every running set is recorded with its rates (``Timeline``). What
the cluster's exporters would print at every scrape follows from it:

- dcgm-exporter (``dcgm_exposition``): per GPU ``DCGM_FI_PROF_SM_ACTIVE`` (a ratio),
  ``DCGM_FI_DEV_GPU_UTIL`` (a percentage) and NVLink tx/rx bytes/s, with the ``hpc_job``
  label of DCGM's job mapping. A ring all-reduce job computes, then communicates with its
  GPUs idle, so its SM activity is its compute share of an iteration: at rate r (the model's
  isolated time at its best placement over its time now) it shows r x its compute share at
  the best placement, plus a seeded noise of sd ``noise`` x min(activity, 1 - activity) (so
  no sample is clipped at 0 or 1 and the mean stays the model's); GPU_UTIL counts every kernel
  (compute and NCCL), the iteration less the per-node overhead;
- node_exporter (``node_exporter_exposition``): each node's InfiniBand byte counters, the
  ring edge of every split job on the node (one per node, ``2 (g - 1) / g x grad_gb`` per
  iteration each way). 64-bit counters (``legacy``, counters_ext) start near 2**64 on some
  nodes so they wrap; ``reset_nodes`` have their counter cleared once (a driver reload);
  ``port32_nodes`` expose only the 32-bit PMA counters, which saturate at 4 x (2**32 - 1)
  and so never give a rate (as on HCAs without extended counters);
- sacct (``accounting`` -> ``sacct.sacct_json``, ``sacct.sacct_lines``): the text of
  ``sacct -a -D --json`` and of the ``sacct -P`` exit-code lines when the window ends, in the
  schema of Slurm ``HiddenTruth.slurm`` (22.05, 24.11 or 26.05): every job started in the
  window on the nodes of its first placement (a hostlist in node order), the GPU total in
  ``tres.allocated`` (sacct keeps no count per node: the one per-node count is the ``batch``
  step's, on the first node), still-running jobs with no end.

What is real and what is simulated. Real: the exposition text and its ingest, and sacct's
text read by the collector's own parser (``parse_sacct_output``, what ``linkwise collect``
runs on sacct's output) and ``ingest_job_runs``. The sacct records' fields and shapes are
Slurm's: ``tests/datasets/test_hidden_truth_slurm.py`` runs the truth's job shapes (2, 4, 8
and 16 GPUs on 1 to 4 nodes, an uneven 2+4+2 split among them, one left running) as
``sleep`` jobs on the real local Slurm, and the records Slurm 22.05.8, 24.11.5 and 26.05.5
print parse to the same ``JobRun`` as the emitter's (times aside), with the same fields and
the same batch step. Simulated: what ran when (the simulator's schedule, not Slurm's), the
times, the GPU indices each job holds, and users, accounts and names (not a real cluster's).

Some samples are bad on purpose: a share ``bad_rate`` of SM samples is out of range (above
1) or NaN, and a share ``miss_rate`` of scrapes never happens; the report lists them so tests
can check they are counted, not guessed.

``fill_truth_store`` sends it all through the real ingest functions (``ingest_prometheus`` per
scrape and exporter, ``derive_ib_link_load``, ``parse_sacct_output`` and ``ingest_job_runs``)
into a DuckDB store.

The workload is synthetic: GPU counts from the multi-GPU part of the Philly trace's GPU-count
distribution (``datasets/data/philly_stats.json``: 2, 4, 8, 16 GPUs in proportion 521 : 360 :
450 : 43; one-GPU jobs never communicate, so none is drawn), run times log-uniform in
[``min_s``, ``max_s``] (not Philly's, which run for hours: a few hours of telemetry must hold
many runs), Poisson arrivals at ``load`` x the cluster's GPUs, job names drawn by ``weights``.
The hidden profiles (``TRUTH_PROFILES``) are invented, H100-scale numbers: they are not
measurements of the models they are named after.

The parts: ``truth`` (``HiddenTruth``, its workload and the simulated ``Timeline``),
``exposition`` (what dcgm-exporter and node_exporter print of it, the jobs sacct holds),
``sacct`` (sacct's text of those jobs), ``store``
(``fill_truth_store``: every scrape through the real ingest) and ``recovery`` (fitted against
true parameters).
"""
