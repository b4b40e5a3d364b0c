"""The third-party measurements the calibration is fitted to, and their testbeds.

``load_deepshare``: DeepShare's isolated throughputs and shared/isolated ratios (a
``PairwiseTable``); ``load_pollux``: Pollux's per-placement step and all-reduce times; the
testbeds' network and batch constants each fit reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from linkwise.cluster.contention import PairwiseTable

JobType = tuple[str, int, int]  # (model, total GPUs, nodes), e.g. ("MoE", 8, 4)
FloatArray = npt.NDArray[np.float64]
DEEPSHARE_MODELS = ("MobileNetV3", "GraphSage", "FSDP", "Transformer-XL", "DLRM", "MoE")
POLLUX_MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

# Per-GPU batch size of each DeepShare job, from its launch script
# (github.com/gajagajago/deepshare, slurm_examples/job_launch_scripts/isolated/*.sh, and the
# argparse defaults of slurm_examples/fsdp.py and moe.py for the two that pass none). Its
# profiler counts ``batch_size * world_size`` samples per step, so this is the scale that turns
# iterations into the samples/s of isolated_thp.csv.
DEEPSHARE_BATCH: Mapping[str, float] = {
    "MobileNetV3": 16.0,
    "GraphSage": 1024.0,
    "FSDP": 8.0,
    "Transformer-XL": 16.0,
    "DLRM": 48.0,
    "MoE": 8.0,
}

# DeepShare testbed: 40 Gb/s InfiniBand = 5 GB/s per node, PCIe Gen3 (topology.PCIE_GBPS, 12
# GB/s) inside a node. Its jobs run NCCL over sockets (NCCL_IB_DISABLE=1), which reach less
# than the nominal 5 GB/s; with no single-node measurement the two cannot be told apart, so the
# fitted grad_gb is the effective volume at the nominal 5 GB/s.
DEEPSHARE_NIC_GBPS = 5.0
DEEPSHARE_SPEC = "4x8,pcie,nic=5,leaf=4"
# The "<model>,8,8" types span 8 nodes although the testbed has 4: their throughputs differ from
# the 8,4 types by up to 1.7x in both directions (MobileNetV3 +9%, Transformer-XL -40%), so
# they are not 8 processes packed onto the same 4 nodes (that is the 8,4 job). We read them as
# 8 nodes x 1 GPU (DeepShare's four nodes, elsa-10, -11, -13 and -15, belong to a larger
# cluster) and place them on 8 nodes of the same kind.
DEEPSHARE_SPEC_8 = "8x8,pcie,nic=5,leaf=8"

# Pollux testbed (OSDI'21): 16 AWS g4dn.12xlarge nodes, 4 NVIDIA T4 each on PCIe Gen3, 50 Gb/s
# network (6.25 GB/s nominal). The effective network bandwidth is fitted (see
# fit_pollux_profiles); the intra-node one is taken as PCIe Gen3's 12 GB/s.
POLLUX_NIC_GBPS = 6.25
POLLUX_INTRA_GBPS = 12.0


def calibration_dir(data_dir: str | Path) -> Path:
    """``data_dir/calibration`` for the shared/data root (or ``data_dir`` if it is that folder)."""
    root = Path(data_dir)
    for candidate in (root / "calibration", root):
        if (candidate / "deepshare").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no calibration/deepshare under {root} (expected the shared/data folder)"
    )


def _parse_type(key: str) -> JobType:
    model, gpus, nodes = (part.strip() for part in key.split(","))
    return model, int(gpus), int(nodes)


def load_deepshare(data_dir: str | Path) -> PairwiseTable:
    """DeepShare's isolated throughputs and 36 x 36 shared/isolated ratios.

    Keys like ``"MobileNetV3,2,2"`` become ``("MobileNetV3", 2, 2)``; in the ratio matrix the
    row is the job measured and the column its neighbour. Types keep the files' order.
    """
    folder = calibration_dir(data_dir) / "deepshare"
    iso = pl.read_csv(folder / "isolated_thp.csv")
    key_col = iso.columns[0]
    isolated = {
        _parse_type(k): float(v)
        for k, v in zip(iso[key_col].to_list(), iso["isol_thp"].to_list(), strict=True)
    }
    mat = pl.read_csv(folder / "shared_thp_ratio.csv")
    row_col = mat.columns[0]
    cols = [_parse_type(c) for c in mat.columns[1:]]
    ratio: dict[tuple[JobType, JobType], float] = {}
    for row in mat.iter_rows():
        a = _parse_type(str(row[0]))
        for b, value in zip(cols, row[1:], strict=True):
            ratio[(a, b)] = float(value)
    rows = {_parse_type(str(r)) for r in mat[row_col].to_list()}
    if rows != set(isolated) or set(cols) != set(isolated):
        raise ValueError(f"{folder}: the ratio matrix and the isolated table name different types")
    return PairwiseTable(isolated=isolated, ratio=ratio)


def load_pollux(data_dir: str | Path) -> dict[str, pl.DataFrame]:
    """Pollux's per-placement measurements, one frame per model.

    Columns: ``placement`` (GPUs per node, e.g. ``"1111"`` = 4 nodes x 1 GPU, ``"4"`` = one
    node x 4), ``local_bsz``, ``step_time``, ``sync_time`` (seconds), and derived ``gpus`` and
    ``nodes``.
    """
    folder = calibration_dir(data_dir) / "pollux_placements"
    out: dict[str, pl.DataFrame] = {}
    for path in sorted(folder.glob("*/placements.csv")):
        df = pl.read_csv(path, schema_overrides={"placement": pl.Utf8})
        digits = df["placement"].str.split("")
        out[path.parent.name] = df.with_columns(
            gpus=digits.list.eval(pl.element().cast(pl.Int64)).list.sum(),
            nodes=df["placement"].str.len_chars().cast(pl.Int64),
        )
    if not out:
        raise FileNotFoundError(f"no */placements.csv under {folder}")
    return out


def table_types(table: PairwiseTable) -> tuple[JobType, ...]:
    """The table's job types in file order."""
    return tuple(table.isolated)


def ratio_matrix(table: PairwiseTable) -> FloatArray:
    """The measured shared/isolated ratios as a matrix (row: job measured, column: neighbour)."""
    types = table_types(table)
    return np.array([[table.ratio[(a, b)] for b in types] for a in types], dtype=np.float64)
