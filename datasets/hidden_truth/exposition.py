"""What the hidden truth's cluster prints: dcgm-exporter's text (``dcgm_exposition``),
node_exporter's InfiniBand counters (``node_exporter_exposition``) and the jobs sacct holds
of the runs (``accounting``; ``sacct`` prints them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from linkwise.cluster.hostlist import sort_hosts
from linkwise.datasets.hidden_truth.sacct import SacctJob
from linkwise.datasets.hidden_truth.truth import HiddenTruth, Timeline

__all__ = ["GpuSample", "IbPort", "accounting", "dcgm_exposition", "node_exporter_exposition"]

GPU_MODEL = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU in one dcgm-exporter scrape."""

    gpu: int
    job: int | None  # the hpc_job label's job id (None: idle, or no job mapping)
    sm_active: float
    gpu_util: int
    nvlink_tx: float  # bytes/s
    nvlink_rx: float


def _gpu_labels(node: str, gpu: int, job: int | None) -> str:
    job_label = f',hpc_job="{job}"' if job is not None else ""
    return (
        f'gpu="{gpu}",UUID="GPU-{node}-{gpu:04d}",device="nvidia{gpu}",'
        f'modelName="{GPU_MODEL}",Hostname="{node}"{job_label}'
    )


def dcgm_exposition(node: str, samples: Sequence[GpuSample]) -> str:
    """What dcgm-exporter prints for ``node``'s GPUs: SM activity, GPU utilisation and the
    NVLink byte rates, each GPU with its ``hpc_job`` label where it has one."""
    lines = [
        "# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.",
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
    ]
    lines += [
        f"DCGM_FI_PROF_SM_ACTIVE{{{_gpu_labels(node, s.gpu, s.job)}}} {s.sm_active!r}"
        for s in samples
    ]
    lines.append("# TYPE DCGM_FI_DEV_GPU_UTIL gauge")
    lines += [
        f"DCGM_FI_DEV_GPU_UTIL{{{_gpu_labels(node, s.gpu, s.job)}}} {s.gpu_util}" for s in samples
    ]
    for metric, attr in (
        ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx"),
        ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx"),
    ):
        lines.append(f"# TYPE {metric} gauge")
        lines += [
            f"{metric}{{{_gpu_labels(node, s.gpu, s.job)}}} {getattr(s, attr)!r}" for s in samples
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class IbPort:
    """One HCA port's byte counters in one node_exporter scrape: the 64-bit ``legacy`` ones
    (counters_ext) and/or the 32-bit ``port`` ones (counters/), None where absent."""

    legacy_tx: float | None
    legacy_rx: float | None
    port_tx: float | None = None
    port_rx: float | None = None
    device: str = "mlx5_0"
    port: str = "1"


def node_exporter_exposition(ports: Sequence[IbPort]) -> str:
    """node_exporter's InfiniBand byte counters of the ports."""
    lines: list[str] = []
    for what, legacy, port in (
        ("transmitted", "legacy_tx", "port_tx"),
        ("received", "legacy_rx", "port_rx"),
    ):
        for kind, attr in (("legacy", legacy), ("port", port)):
            metric = f"node_infiniband_{kind}_data_{what}_bytes_total"
            values = [(p, getattr(p, attr)) for p in ports if getattr(p, attr) is not None]
            if values:
                lines.append(f"# TYPE {metric} counter")
                lines += [
                    f'{metric}{{device="{p.device}",port="{p.port}"}} {v!r}' for p, v in values
                ]
    return "\n".join(lines) + "\n"


def accounting(truth: HiddenTruth, timeline: Timeline) -> list[SacctJob]:
    """The jobs sacct holds at the end of the window (``sacct.sacct_json`` prints them): every
    job started in it, on the nodes and with the GPUs per node of its first placement (in
    the cluster's node order, as Slurm lists them), its times floored to epoch seconds,
    still RUNNING (no end) where it ends after the window."""
    topo = truth.topology()
    names = [n.name for n in topo.nodes]
    first = {p.job_id: p for _, _, ps in timeline.segments() for p in ps}
    out: list[SacctJob] = []
    for job_id, start in sorted(timeline.started.items()):
        if start >= truth.window_s:
            continue
        job = timeline.jobs[job_id]
        end = timeline.ended.get(job_id, math.inf)
        done = end <= truth.window_s
        gpus = dict(first[job_id].placement.alloc)
        nodes = sort_hosts(names[n] for n in gpus)
        index = {name: n for n, name in enumerate(names)}
        out.append(
            SacctJob(
                job_id=job_id,
                name=job.name,
                user=job.user,
                account="a",
                partition="gpu",
                cluster=truth.cluster,
                state="COMPLETED" if done else "RUNNING",
                exit_code=0,
                submit=math.floor(truth.t0 + job.submit_time),
                start=math.floor(truth.t0 + start),
                end=math.floor(truth.t0 + end) if done else None,
                nodes=tuple(nodes),
                gpus_per_node=tuple(gpus[index[n]] for n in nodes),
            )
        )
    return out
