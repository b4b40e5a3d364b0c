"""Ingest speed: accounting (JobRun -> DuckDB) and telemetry (Prometheus text -> DuckDB).

- Accounting: 100k JobRun records, synthesised by replicating a few realistic records
  (single-GPU, multi-node, failed, cancelled, requeued) with new job ids, ingested into a
  fresh file-backed store; then the same batch again (idempotent: no new rows).
  Real captures from the local Slurm will replace the templates once the client exists.
- Telemetry: 1M samples of DCGM exporter text, built by replicating the real A100 fixture
  (../shared/data/telemetry/dcgm_exporter_metrics_a100_mig.prom) over hosts and GPUs with an
  ``hpc_job`` label, parsed and stored (telemetry_samples + link_load) in one call.

    .venv/bin/python benchmarks/ingest_speed.py [--jobs 100000] [--samples 1000000] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DCGM_FIXTURE = REPO.parent / "shared" / "data" / "telemetry" / "dcgm_exporter_metrics_a100_mig.prom"


def template_runs() -> list[object]:
    """A few realistic JobRun values (as the Slurm client yields them)."""
    from linkwise.cluster.slurm.records import JobRun

    base = JobRun(
        cluster="linkwise",
        job_id=1,
        run_index=0,
        name="resnet50-ddp",
        user="alice",
        account="ml",
        partition="gpu",
        state="COMPLETED",
        exit_code=0,
        signal=None,
        submit_time=1_700_000_000.0,
        start_time=1_700_000_012.0,
        end_time=1_700_003_612.0,
        time_limit_s=7200.0,
        nodes=("gpu01",),
        gpus=1,
        gpus_per_node=(1,),
        allocation_nodes=1,
        settled=True,
    )
    return [
        base,
        dataclasses.replace(
            base,
            name="gpt-pretrain",
            nodes=("gpu01", "gpu02", "gpu03", "gpu04"),
            gpus=16,
            gpus_per_node=(4, 4, 4, 4),
            allocation_nodes=4,
        ),
        dataclasses.replace(base, name="exit3", state="FAILED", exit_code=3, end_time=1.7e9 + 40),
        dataclasses.replace(base, name="cancelled", state="CANCELLED", exit_code=None, signal=15),
        dataclasses.replace(
            base,
            name=";$(rm -rf /) é",
            nodes=("gpu02", "gpu03"),
            gpus=4,
            gpus_per_node=(2, 2),
            allocation_nodes=2,
            run_index=1,
        ),
    ]


def bench_accounting(n: int) -> dict[str, float]:
    """Ingest n synthetic runs into a fresh store; then the same runs again."""
    from linkwise.datasets.ingest import ingest_job_runs
    from linkwise.datasets.store import open_store

    templates = template_runs()
    runs = [
        dataclasses.replace(templates[i % len(templates)], job_id=1000 + i)  # type: ignore[type-var]
        for i in range(n)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "bench.duckdb")
        first = ingest_job_runs(con, runs, source="bench")  # type: ignore[arg-type]
        again = ingest_job_runs(con, runs, source="bench")  # type: ignore[arg-type]
        con.close()
    return {
        "jobs": n,
        "first_s": first.seconds,
        "first_jobs_per_s": first.jobs_per_s,
        "inserted": first.inserted,
        "job_node_rows": first.job_node_rows,
        "again_s": again.seconds,
        "again_jobs_per_s": again.jobs_per_s,
        "again_inserted": again.inserted + again.updated,
    }


def synth_prometheus(n_samples: int) -> str:
    """DCGM exporter text with about n_samples samples: the real fixture over hosts/GPUs."""
    lines = [
        ln
        for ln in DCGM_FIXTURE.read_text().splitlines()
        if ln and not ln.startswith("#") and "GPU_I_ID" not in ln
    ]
    out: list[str] = []
    host = 0
    while len(out) < n_samples:
        for gpu in range(8):
            for ln in lines:
                ln2 = re.sub(r'gpu="0"', f'gpu="{gpu}"', ln, count=1)
                ln2 = ln2.replace(
                    'Hostname="ub20-a100-k8s"',
                    f'Hostname="node{host:05d}",hpc_job="{100000 + host}"',
                )
                out.append(ln2)
        host += 1
    return "\n".join(out[:n_samples]) + "\n"


def bench_telemetry(n: int) -> dict[str, float]:
    """Parse and store n Prometheus samples in one ingest call."""
    from linkwise.datasets.store import open_store
    from linkwise.datasets.telemetry import ingest_prometheus, parse_prometheus

    text = synth_prometheus(n)
    t0 = time.perf_counter()
    parsed = parse_prometheus(text, ts=1_700_000_000.0)
    parse_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "bench.duckdb")
        report = ingest_prometheus(con, text, source="bench", ts=1_700_000_000.0)
        con.close()
    return {
        "samples": report.samples,
        "bytes": len(text),
        "parse_only_s": parse_s,
        "parse_only_samples_per_s": parsed.samples.height / parse_s,
        "parse_and_store_s": report.seconds,
        "samples_per_s": report.samples_per_s,
        "link_load_rows": report.link_load_rows,
    }


def main() -> None:
    """Run both benchmarks and print a Markdown summary (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    acc = bench_accounting(args.jobs)
    tel = bench_telemetry(args.samples)
    if args.json:
        print(json.dumps({"accounting": acc, "telemetry": tel}, indent=2))
        return
    print("| benchmark | size | seconds | rate | target |")
    print("|---|---|---|---|---|")
    print(
        f"| accounting ingest (new) | {acc['jobs']:,} jobs | {acc['first_s']:.2f} | "
        f"{acc['first_jobs_per_s']:,.0f} jobs/s | >= 20,000 |"
    )
    print(
        f"| accounting re-ingest (no-op) | {acc['jobs']:,} jobs | {acc['again_s']:.2f} | "
        f"{acc['again_jobs_per_s']:,.0f} jobs/s | - |"
    )
    print(
        f"| telemetry parse only | {tel['samples']:,} samples | {tel['parse_only_s']:.2f} | "
        f"{tel['parse_only_samples_per_s']:,.0f} samples/s | - |"
    )
    print(
        f"| telemetry parse + store | {tel['samples']:,} samples | "
        f"{tel['parse_and_store_s']:.2f} | {tel['samples_per_s']:,.0f} samples/s | >= 500,000 |"
    )


if __name__ == "__main__":
    main()
