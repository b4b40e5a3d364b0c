"""Ingest speed: accounting (JobRun -> DuckDB) and telemetry (Prometheus text -> DuckDB).

- Accounting: 100k job records from ``sacct --json`` text into a fresh file-backed store:
  the real records captured from the local Slurm (tests/fixtures/slurm/sacct.json: 1-GPU,
  2-node, exit 3, cancelled, requeued runs, a name with shell metacharacters and unicode)
  replicated with new job ids; ``parse_accounting_json`` (orjson decode + parse into JobRun,
  the CLI transport's path) + ingest, then the same batch again (idempotent: no new rows).
- Telemetry: 1M samples of DCGM exporter text, built by replicating the real A100 fixture
  (../shared/data/telemetry/dcgm_exporter_metrics_a100_mig.prom) over hosts and GPUs with an
  ``hpc_job`` label, parsed and stored (telemetry_samples + link_load) in one call.

    .venv/bin/python benchmarks/ingest_speed.py [--jobs 100000] [--samples 1000000] [--json]
        [--only accounting|telemetry]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "slurm"
DCGM_FIXTURE = REPO.parent / "shared" / "data" / "telemetry" / "dcgm_exporter_metrics_a100_mig.prom"


def captured_doc(n: int) -> tuple[str, dict[tuple[int, int], tuple[int | None, int | None]]]:
    """``sacct --json`` text with n job records: the real records captured from the local
    Slurm (tests/fixtures/slurm/sacct.json) replicated with new job ids; and the
    ``sacct -P -o ExitCode`` corrections (the 22.05 exit-code defect) for the new ids."""
    from linkwise.cluster.slurm.accounting import parse_acct_lines

    doc = json.loads(FIXTURES.joinpath("sacct.json").read_text())
    records = doc["jobs"]
    lines = parse_acct_lines(FIXTURES.joinpath("sacct_lines.txt").read_text())
    fixes = {(x.job_id, x.submit_time): (x.exit_code, x.signal) for x in lines}
    jobs: list[dict[str, object]] = []
    codes: dict[tuple[int, int], tuple[int | None, int | None]] = {}
    for i in range(n):
        rec = records[i % len(records)]
        new_id = 1_000_000 + i
        submit = int(rec["time"]["submission"])
        jobs.append({**rec, "job_id": new_id})
        if (int(rec["job_id"]), submit) in fixes:
            codes[(new_id, submit)] = fixes[(int(rec["job_id"]), submit)]
    return json.dumps({**doc, "jobs": jobs}), codes


def bench_accounting(n: int) -> dict[str, Any]:
    """Real records from JSON into a fresh store (decode, parse, ingest); then again."""
    from linkwise.cluster.slurm.accounting import parse_accounting_json
    from linkwise.datasets.ingest import ingest_job_runs
    from linkwise.datasets.store import open_store

    text, codes = captured_doc(n)
    t0 = time.perf_counter()
    runs = parse_accounting_json(text, codes)
    parse_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "bench.duckdb")
        first = ingest_job_runs(con, runs, source="bench")
        again = ingest_job_runs(con, runs, source="bench")
        con.close()
    states = sorted({r.state for r in runs})
    return {
        "jobs": n,
        "json_bytes": len(text),
        "states": ",".join(states),
        "parse_s": parse_s,
        "ingest_s": first.seconds,
        "first_s": parse_s + first.seconds,
        "first_jobs_per_s": n / (parse_s + first.seconds),
        "ingest_only_jobs_per_s": first.jobs_per_s,
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
    from linkwise.datasets.telemetry.prometheus import parse_prometheus
    from linkwise.datasets.telemetry.store import ingest_prometheus

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
    ap.add_argument("--only", choices=["accounting", "telemetry"])
    args = ap.parse_args()
    acc = bench_accounting(args.jobs) if args.only != "telemetry" else None
    tel = bench_telemetry(args.samples) if args.only != "accounting" else None
    if args.json:
        print(json.dumps({"accounting": acc, "telemetry": tel}, indent=2))
        return
    print("| benchmark | size | seconds | rate | target |")
    print("|---|---|---|---|---|")
    if acc is not None:
        print_accounting(acc)
    if tel is not None:
        print_telemetry(tel)


def print_accounting(acc: dict[str, Any]) -> None:
    """Markdown rows of the accounting benchmark."""
    print(
        f"| accounting JSON decode + parse | {acc['jobs']:,} jobs | {acc['parse_s']:.2f} | "
        f"{acc['jobs'] / acc['parse_s']:,.0f} jobs/s | - |"
    )
    print(
        f"| accounting JSON -> DuckDB (new) | {acc['jobs']:,} jobs | {acc['first_s']:.2f} | "
        f"{acc['first_jobs_per_s']:,.0f} jobs/s | >= 20,000 |"
    )
    print(
        f"| accounting ingest only (JobRun -> DuckDB) | {acc['jobs']:,} jobs | "
        f"{acc['ingest_s']:.2f} | {acc['ingest_only_jobs_per_s']:,.0f} jobs/s | - |"
    )
    print(
        f"| accounting re-ingest (no-op) | {acc['jobs']:,} jobs | {acc['again_s']:.2f} | "
        f"{acc['again_jobs_per_s']:,.0f} jobs/s | - |"
    )


def print_telemetry(tel: dict[str, float]) -> None:
    """Markdown rows of the telemetry benchmark."""
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
