"""Alibaba cluster-trace-gpu-v2023 pod lists: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,
gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``. The run time is
``deletion_time - scheduled_time``; pods never scheduled and CPU pods are rejected; pods
sharing one GPU (``gpu_milli < 1000``) are kept as one GPU and counted in the notes."""

from __future__ import annotations

import polars as pl

from linkwise.datasets.trace_formats.columns import (
    number_of,
    numeric_checks,
    row_order,
    standard_columns,
    text_of,
)

__all__ = ["alibaba_columns"]


def alibaba_columns(table: pl.DataFrame) -> pl.DataFrame:
    scheduled, deleted = number_of("scheduled_time"), number_of("deletion_time")
    checks = [
        (text_of("name").is_null(), "missing name"),
        *numeric_checks("num_gpu", "creation_time"),
        (text_of("scheduled_time").is_null(), "never scheduled"),
        *numeric_checks("scheduled_time", "deletion_time"),
        ((scheduled < 0) | (deleted < 0), "negative time"),
    ]
    milli = number_of("gpu_milli") if "gpu_milli" in table.columns else pl.lit(None, pl.Float64)
    fractional = ((number_of("num_gpu") == 1) & (milli > 0) & (milli < 1000)).fill_null(False)
    return standard_columns(
        table,
        checks,
        job_id=row_order(),
        submit=number_of("creation_time"),
        gpus=number_of("num_gpu"),
        duration=deleted - scheduled,
        user=pl.lit(""),
        name=text_of("name").fill_null(""),
        profile=pl.lit(""),
        extra={"_fractional": fractional},
    )
