"""``linkwise explain`` against the real local Slurm: a live ``serve`` in shadow mode (best fit,
a heuristic: its own base) sees this test's jobs pending (``--begin`` in the future, so they
wait in the queue), records an explanation with every decision row, and ``explain`` tells a
job's story from the store. Other engineers' jobs share the cluster: the assertions are on
this test's own jobs, named ``lw24-explain-*``. (A learned package cannot decide on the live
queue yet: squeue's jobs carry no communication profile, so it falls back; the explanation
records that note. The learned path is tested on the demo's shadow run, test_explain.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from linkwise.cli import main
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.policies.spec import PolicySpec
from linkwise.tests._slurm import slurm_cmd

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = ROOT / "scripts" / "local-slurm"
POLICY = "best_fit"


@pytest.fixture(scope="module")
def env_file() -> Path:
    env = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return env


def test_explain_a_live_shadow_decision(
    env_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = read_env_file(env_file)
    client = SlurmClient.from_env(env, "cli")
    partition = env.get("LINKWISE_SLURM_PARTITION", "gpu")
    tag = f"lw24-explain-{os.getpid()}"
    ids = [
        client.submit("sleep 1", name=f"{tag}-{i}", gpus_per_node=1,
                      extra_args=["--begin=now+900"])  # pending throughout
        for i in range(3)
    ]  # fmt: skip
    db = tmp_path / "store.duckdb"
    try:
        named: list[int] = []
        deadline = time.time() + 240
        while not named:
            assert time.time() < deadline, "the shadow loop never named this test's jobs"
            cfg = ServeConfig(
                mode="shadow", partitions=(partition,), policy=PolicySpec.parse(POLICY),
                fallback=PolicySpec.parse("backfill"), slurm_env=str(env_file), db=str(db),
                state_dir=str(tmp_path / "state"), interval_s=1.0, max_cycles=4,
                watchdog=False, lease_root=str(tmp_path / "leases"),
            )  # fmt: skip
            summary = serve(cfg)
            assert summary["cycles"] == 4 and summary["spooled"] == 0
            con = duckdb.connect(str(db), read_only=True)
            try:
                rows = con.execute(
                    "SELECT job_id, action, deviated, explanation FROM decisions"
                ).fetchall()
            finally:
                con.close()
            assert rows and all(r[3] is not None for r in rows)  # every row explained
            for job_id, _, deviated, raw in rows:
                e = json.loads(raw)
                assert e["policy"] == POLICY and e["base"]["policy"] == POLICY
                assert e["base"]["itself"] is True and deviated is False
                named += [j for j in ids if j in e["jobs"] or j == job_id]
        job = named[0]
        assert main(["explain", str(job), "--db", str(db), "--json"]) == 0
        mine = json.loads(capsys.readouterr().out)
        assert mine and [r["ts"] for r in mine] == sorted(r["ts"] for r in mine)
        assert all(job == r["job_id"] or job in r["explanation"]["jobs"] for r in mine)
        assert all(r["mode"] == "shadow" and r["policy"] == POLICY for r in mine)
        assert main(["explain", str(job), "--db", str(db)]) == 0
        text = capsys.readouterr().out
        assert f"job {job}: {len(mine)} decision(s)" in text
        assert f"base: {POLICY} is the policy itself" in text
        # shadow changed nothing: this test's jobs are still pending, not held, no node list
        queue = {q.job_id: q for q in client.queue() if q.job_id in ids}
        assert all(q.state == "PENDING" and not q.held for q in queue.values())
    finally:
        subprocess.run(
            [slurm_cmd(env, "scancel"), *map(str, ids)], env={**os.environ, **env}, check=False,
            capture_output=True,
        )  # fmt: skip
