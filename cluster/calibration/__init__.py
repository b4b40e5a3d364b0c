"""Fit the analytic contention model to real measurements, and check how well it predicts.

Everything here is derived from the third-party measurements in ``shared/data/calibration``
(see its README): DeepShare's isolated and pairwise-shared throughputs (4 nodes x 8 TITAN Xp,
PCIe Gen3, 40 Gb/s InfiniBand) and Pollux's per-placement step and all-reduce times (AWS
g4dn.12xlarge: 4 T4 per node, PCIe, 50 Gb/s Ethernet), read by ``measurements``. Three
least-squares fits (``scipy.optimize.least_squares``), within the ``bounds``:

1. ``isolated.fit_deepshare_profiles``: per DeepShare model, ``compute_s`` and ``grad_gb`` of a
   ``CommProfile`` and a scale (samples per iteration per GPU), plus the shared
   ``overhead_s``, from the 6 isolated throughputs per model, in log space.
2. ``pairs.fit_alpha``: the sharing penalty ``alpha`` from the 36 x 36 shared/isolated matrix,
   each pair predicted by ``AnalyticModel.rates`` on the two jobs placed on the same nodes
   (scored and cross-validated by ``validation``).
3. ``pollux.fit_pollux_profiles``: per Pollux model, ``grad_gb`` from the all-reduce times
   across placements (one node vs several) and ``compute_s`` at a typical local batch.

``fit.fit_calibration`` runs all three and returns a ``Calibration`` whose ``fit`` holds the
diagnostics (residuals, errors, held-out errors) and ``fit["parameters"]``: per profile, every
fitted parameter with its bounds, whether it sits at one, and whether the measurements
determine it, leave it weakly determined, or a tie, prior or bound constrains it
(``report.parameter_report``; MoE's compute_s is tied to FSDP's, ``isolated.COMPUTE_TIES``).
``fit.write_calibration`` writes the JSON the package ships, ``fit.SHIPPED_CALIBRATION``
(``linkwise calibrate --data ../shared/data --out cluster/data/calibration.json``, or
``python -m linkwise.cli.calibrate``).
"""
