"""The contention model fitted on the cluster's own data (issue 34 item 3).

What is observed: per finished run, its GPU activity while alone on a node and while beside
other runs (``job_telemetry``: ``activity_alone``, ``activity_beside``, GPU-weighted means
over the scrape instants of each kind, bad and missing samples counted and left out). What
is known: the topology (link speeds), the accounting (which run held which nodes when, GPUs
per node corrected by dcgm-exporter's ``hpc_job`` labels where present: sacct splits a
total evenly) and, per job name, the gradient all-reduced per second of compute
(``comm_profiles``: from the bytes the run moved while alone).

What is fitted (``scipy.optimize.least_squares``): the analytic model's ``alpha`` and
``overhead_s``, and per job name its ``compute_s`` (and its gradient per compute second
where ``comm_profiles`` has none). A ring all-reduce job's activity is its compute share of
an iteration (its GPUs idle while the ring runs): at rate r it shows r x its compute share
at its best placement (``cluster.contention.AnalyticModel``'s rates). The accounting cuts
time into segments in which the same runs hold the same nodes; in each, the model gives
every run's rate next to the split rings running then (``ContentionTerms``, checked against
``AnalyticModel.rates`` by the tests); a run's predicted activity alone and beside others
is the mean over its segments, weighted as ``job_telemetry`` weights its instants (the GPUs
it holds on each node that is alone, or not, times the node's activity samples in the
segment, read from the store). Residuals: log observed over predicted activity, alone and beside,
per run (their difference is the drop in activity beside others against the predicted
slowdown; the level anchors the overhead, which a ratio alone cannot see).

Telemetry holds ratios only (activities, bytes per second), never an iteration's length:
scaling every compute time, gradient and the overhead by one factor changes no prediction.
The time unit is therefore one convention: the job name with the most runs keeps the
compute time ``comm_profiles`` gives it (its median activity alone: its isolated iteration
at its usual placement is one unit) and everything else is fitted relative to it. A compute
time is only seen through the overhead it is compared with (multi-node runs of that name,
an overhead above 0); otherwise it does not move the predictions and is reported so.

Identifiability is reported as ``cluster.calibration`` reports it (``fit["parameters"]``,
``parameter_entry``): from the Jacobian at the solution, the standard error of each
parameter (the residuals' variance times the inverse normal matrix): ``determined`` within
``DETERMINED_REL``, else ``weakly determined``; ``constrained`` when no data moves it (held
at its start, with the reason) or it sits at a bound. Validation is on later runs
(``train_fraction`` of the observed runs by end time fit, the rest scored: mean absolute
error and Spearman rank correlation of the activity drop beside others and of the activity
levels, beside the shipped calibration's contention parameters with the same profiles and a
constant predictor).

The parts, one concern each: ``data`` (the runs, their placements and observations, read from
the store: ``load_fit_data``), ``terms`` (the analytic model over those placements as arrays:
``ContentionTerms``), ``solve`` (the profiles' starts, the least squares and its standard
errors), ``validation`` (scores on the later runs), ``fit`` (``fit_cluster_calibration``: the
whole fit and its parameter report) and ``report`` (``render_fit_text``).
"""
