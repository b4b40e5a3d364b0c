"""Interconnect telemetry: parsers, scrapers, counter->rate, and ingest into DuckDB.

One module per concern: ``samples`` (the sample frame), ``dcgm`` (DCGM fields, units and
blank values), ``prometheus`` (text exposition), ``sysfs`` and ``perfquery`` (InfiniBand
counters), ``scrape`` (HTTP), ``counters`` (counter deltas to rates) and ``store``
(DuckDB writes and the derivation of ``link_load``).

Formats (real fixtures in ../shared/data/telemetry/):

- Prometheus text exposition: DCGM exporter (``Hostname`` or ``hostname`` label, ``hpc_job``
  maps a GPU to a Slurm job, DCGM's blank values such as 9223372036854775794 = "not
  supported" are dropped and counted) and node_exporter's InfiniBand metrics.
  ``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` are rates in B/s and
  ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is a rate in MB/s despite its counter declaration,
  so they become ``link_load`` rows directly (``DCGM_FIELDS``: each field's unit and why).
- ``/sys/class/infiniband`` (``read_sysfs``) and ``perfquery -x`` (``parse_perfquery``):
  ``port_{xmit,rcv}_data`` / ``Port{Xmit,Rcv}Data`` count 4-byte words; legacy 32-bit
  counters saturate at 2**32-1.

All three InfiniBand sources land in ``telemetry_samples`` as raw counters; rates come from
``derive_ib_link_load`` (``counter_rates``: wrap, reset, saturation and gap detection, each
counted, no negative rate, capped at the link's line rate when known).
Parsing is vectorised with Polars; storing is DuckDB SQL over the frames.
"""
