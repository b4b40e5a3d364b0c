"""The hidden truth's sacct text against the real local Slurm (``scripts/local-slurm start``,
whichever ``LINKWISE_SLURM_VERSION`` it runs): the truth's job shapes, run as short ``sleep``
jobs pinned to the nodes and GPUs per node the truth gives them, read back through the
collector (``CliTransport.accounting``), parse to the same ``JobRun`` as the emitter's record
of the same job (times aside), and the emitter's record has the real record's fields."""

from __future__ import annotations

import getpass
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from linkwise.cluster.hostlist import compress
from linkwise.cluster.slurm.accounting import parse_sacct_output
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import JobRun
from linkwise.datasets.hidden_truth.exposition import accounting
from linkwise.datasets.hidden_truth.sacct import SacctJob, sacct_json, sacct_lines
from linkwise.datasets.hidden_truth.truth import HiddenTruth, simulate_timeline, truth_workload
from tests._slurm import slurm_argv

pytestmark = pytest.mark.services

SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
LOCAL_GPUS = 4  # scripts/local-slurm: gpu[01-04], 4 GPUs each
TIMES = ("submit_time", "start_time", "end_time", "time_limit_s")


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    env_file = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env_file.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return read_env_file(env_file)


def truth_shapes() -> list[SacctJob]:
    """One job of the truth per GPUs-per-node shape, on a truth the size of the local
    cluster (4 nodes x 4 GPUs; a light load, so 16-GPU jobs find the cluster free)."""
    shapes: dict[tuple[int, ...], SacctJob] = {}
    for seed in range(4):
        truth = HiddenTruth.default(
            topology_spec="4x4,leaf=2,nic=50,intra=450,oversub=2", hours=4.0, load=0.5, seed=seed
        )
        for job in accounting(truth, simulate_timeline(truth, truth_workload(truth))):
            shapes.setdefault(job.gpus_per_node, job)
    return [shapes[k] for k in sorted(shapes, key=lambda k: (sum(k), len(k), k))]


@dataclass(frozen=True)
class Ran:
    """A truth job run on the local Slurm: the truth's job (on the local node names) and
    the Slurm job id it ran as."""

    job: SacctJob
    slurm_id: int


def local(job: SacctJob) -> SacctJob:
    """The truth's job on the local cluster's node names (gpu1 -> gpu01)."""
    return replace(job, nodes=tuple(f"gpu{int(n.removeprefix('gpu')):02d}" for n in job.nodes))


def run(env: Mapping[str, str], name: str, *args: str) -> str:
    out = subprocess.run(
        slurm_argv(env, name, *args), capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"{name} {' '.join(args)}: {out.stderr.strip()}"
    return out.stdout


def sbatch(env: Mapping[str, str], *args: str, wrap: str) -> int:
    common = ["--parsable", "--output=/dev/null", "--chdir=/tmp", f"--wrap={wrap}"]
    return int(run(env, "sbatch", *args, *common).strip().split(";")[0])


def submit(env: Mapping[str, str], job: SacctJob, wrap: str = "sleep 2") -> int:
    """``job`` pinned to its nodes: ``--gres`` per node where the split is even; an uneven
    one with ``--gpus`` (a job total) while blockers hold the GPUs it must not get, so
    Slurm's only choice is the truth's split (the caller cancels the blockers)."""
    n, per = len(job.nodes), job.gpus_per_node
    pin = [f"--job-name={job.name}", f"--nodes={n}", f"--nodelist={compress(job.nodes)}"]
    if len(set(per)) == 1:
        return sbatch(env, *pin, f"--gres=gpu:{per[0]}", wrap=wrap)
    return sbatch(env, *pin, f"--gpus={sum(per)}", wrap=wrap)


def squeue_states(env: Mapping[str, str], ids: Sequence[int]) -> dict[int, str]:
    out = run(env, "squeue", "-h", "-o", "%i %T", "-j", ",".join(map(str, ids)))
    return {int(i): s for i, s in (line.split() for line in out.splitlines() if line.strip())}


def wait_for(what: str, ok: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def run_uneven(env: Mapping[str, str], job: SacctJob) -> int:
    blockers = [
        sbatch(env, f"--nodelist={node}", f"--gres=gpu:{LOCAL_GPUS - g}", wrap="sleep 120")
        for node, g in zip(job.nodes, job.gpus_per_node, strict=True)
        if g < LOCAL_GPUS
    ]
    try:
        wait_for(
            "blockers running",
            lambda: set(squeue_states(env, blockers).values()) == {"RUNNING"},
        )
        slurm_id = submit(env, job)
        wait_for(
            "uneven job started", lambda: squeue_states(env, [slurm_id]) != {slurm_id: "PENDING"}
        )
    finally:
        run(env, "scancel", *map(str, blockers))
    return slurm_id


@pytest.fixture(scope="module")
def ran(env: dict[str, str]) -> Iterator[tuple[SlurmClient, float, list[Ran], Ran]]:
    """Every truth shape run to completion (uneven ones first, each with its blockers),
    then one left running (as a truth job still running at the window's end)."""
    client = SlurmClient.from_env(env, "cli")
    since = time.time() - 2
    shapes = [local(j) for j in truth_shapes()]
    assert {sum(j.gpus_per_node) for j in shapes} == {2, 4, 8, 16}
    assert {len(j.nodes) for j in shapes} >= {1, 2, 4}
    done = [Ran(j, run_uneven(env, j)) for j in shapes if len(set(j.gpus_per_node)) > 1]
    done += [Ran(j, submit(env, j)) for j in shapes if len(set(j.gpus_per_node)) == 1]
    ids = [r.slurm_id for r in done]
    wait_for("the truth's jobs finished", lambda: not squeue_states(env, ids), timeout=90)
    running = Ran(replace(shapes[0], state="RUNNING"), submit(env, shapes[0], "sleep 120"))
    try:
        wait_for(
            "every record settled, one running",
            lambda: _settled(client, since, [*ids, running.slurm_id]),
            timeout=60,
        )
        yield client, since, done, running
    finally:
        run(env, "scancel", str(running.slurm_id))


def _settled(client: SlurmClient, since: float, ids: Sequence[int]) -> bool:
    runs = {r.job_id: r for r in client.jobs(since)}
    return all(i in runs and runs[i].settled for i in ids) and runs[ids[-1]].state == "RUNNING"


def emitted(job: SacctJob, real: JobRun, slurm: str) -> tuple[JobRun, dict[str, Any]]:
    """The emitter's record of the real job (its id, user, account, cluster, partition,
    times), parsed as the collector parses it, and its raw record."""
    mine = replace(
        job,
        job_id=real.job_id,
        user=real.user,
        account=real.account,
        cluster=real.cluster,
        partition=real.partition,
        submit=int(real.submit_time),
        start=int(real.start_time or 0),
        end=None if real.end_time is None else int(real.end_time),
    )
    text = sacct_json([mine], slurm)
    (run_,) = parse_sacct_output(text, sacct_lines([mine])).strict()
    return run_, orjson.loads(text)["jobs"][0]


def fields(run_: JobRun) -> dict[str, Any]:
    return {k: v for k, v in asdict(run_).items() if k not in TIMES}


def raw_record(env: Mapping[str, str], slurm_id: int) -> dict[str, Any]:
    doc = orjson.loads(run(env, "sacct", "-a", "-D", "--json", "-j", str(slurm_id)))
    (rec,) = [r for r in doc["jobs"] if r["job_id"] == slurm_id]
    return dict(rec)


def batch_step(rec: Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
    """The batch step's node and GPUs (the one per-node GPU count sacct holds)."""
    (step,) = [s for s in rec["steps"] if str(s["step"]["id"]).endswith("batch")]
    gpus = sum(t["count"] for t in step["tres"]["allocated"] if t["type"] == "gres")
    return tuple(step["nodes"]["list"]), gpus


def keys(value: Any, at: str = "") -> set[str]:
    """The paths of a record's fields (a list's items as one)."""
    if isinstance(value, Mapping):
        out = set()
        for k, v in value.items():
            out |= {f"{at}/{k}", *keys(v, f"{at}/{k}")}
        return out
    if isinstance(value, list) and value and isinstance(value[0], Mapping):
        return keys(value[0], f"{at}[]")
    return set()


def test_truth_shapes_parse_as_on_slurm(
    env: dict[str, str], ran: tuple[SlurmClient, float, list[Ran], Ran]
) -> None:
    client, since, done, running = ran
    slurm = env.get("LINKWISE_SLURM_VERSION", "24.11")
    real_runs = {r.job_id: r for r in client.jobs(since)}
    user = getpass.getuser()
    for r in [*done, running]:
        real = real_runs[r.slurm_id]
        assert (real.name, real.user) == (r.job.name, user)
        mine, mine_raw = emitted(r.job, real, slurm)
        assert fields(mine) == fields(real), r.job
        real_raw = raw_record(env, r.slurm_id)
        assert (
            batch_step(mine_raw)
            == batch_step(real_raw)
            == (r.job.nodes[:1], r.job.gpus_per_node[0])
        )
        shape = r.job.gpus_per_node
        assert keys(real_raw) - keys(mine_raw) == set(), f"{shape}: Slurm {slurm} prints more"
        assert keys(mine_raw) - keys(real_raw) == set(), f"{shape}: not in Slurm {slurm}'s"
