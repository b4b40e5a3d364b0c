"""Slurm's own choice for a flexible GPU request, read from a real Slurm, against the model.

A case is a fragmented cluster and a GPU count: blockers pinned with ``-w`` (one per node,
``--gres=gpu:U --cpus-per-gpu=2``) hold ``used[i]`` GPUs of node ``i``; once they run, one job
asks the GPU count in one request form (``FORMS``) and Slurm places it. Slurm's choice (the
nodes and the GPUs on each, from squeue's ``nodes`` and ``gres_detail``) is compared with
``placement.slurm_select_flexible`` on the free GPUs Slurm reported just before. Every job is
cancelled at the end of its case, and the next case waits until no node is completing (a
completing node weighs more in cons_tres's node order). ``benchmarks/flexible_vs_slurm.py``
reports it; ``tests/evaluation/test_flexible_live.py`` asserts it on a handful of cases.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from linkwise.cluster.domain import Placement, Topology
from linkwise.cluster.hostlist import expand
from linkwise.cluster.placement.slurm_select import slurm_select_flexible
from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.gpu_counts import gres_gpus

# how a flexible request of {n} GPUs is asked ({nodes}: the cluster's node count); CPUs in
# proportion to GPUs (2 per GPU, as the blockers and ``slurm_select`` assume) except "bare"
FORMS: dict[str, tuple[str, ...]] = {
    "gpus": ("--gpus={n}", "--cpus-per-gpu=2"),
    "tasks": ("--ntasks={n}", "--gpus-per-task=1", "--cpus-per-gpu=2"),
    "range": ("--nodes=1-{nodes}", "--gpus={n}", "--cpus-per-gpu=2"),
    "bare": ("--gpus={n}",),
}

# hand-picked fragmented states (GPUs used per node on 4 x 4 GPUs, leaves gpu[01-02] and
# gpu[03-04]) and GPU counts, each exercising one step of the model; the live test runs them
HANDPICKED: tuple[tuple[tuple[int, ...], int], ...] = (
    ((3, 1, 2, 0), 6),  # the node with most free GPUs required, then the other leaf: 3 + 3
    ((1, 1, 2, 1), 5),  # one weight group on both leaves: the leaf that fits with fewer nodes
    ((2, 3, 2, 2), 5),  # no leaf fits: the one with more offered nodes, then the other
    ((2, 3, 3, 2), 5),  # two required nodes on two leaves, the rest from a required leaf
    ((2, 1, 3, 3), 6),  # three weight groups: two required nodes, then the other leaf
    ((1, 0, 0, 3), 2),  # one node: weights capped at the request, the leaf with fewer nodes
    ((0, 4, 1, 1), 6),  # a required node, then the first offered node of the other leaf
)


@dataclass(frozen=True, slots=True)
class FlexCase:
    """GPUs held on each node by pinned blockers, and the flexible job's GPU count."""

    used: tuple[int, ...]
    gpus: int


@dataclass(frozen=True, slots=True)
class FlexResult:
    """One case run in one request form: the free GPUs Slurm showed, its choice (None: the
    job did not start) and the model's."""

    case: FlexCase
    form: str
    free: tuple[int, ...]
    slurm: Placement | None
    model: Placement | None

    @property
    def agrees(self) -> bool:
        return self.slurm == self.model


def cases(n: int, seed: int, nodes: int = 4, gpus_per_node: int = 4) -> tuple[FlexCase, ...]:
    """``n`` fragmented states (GPUs used per node drawn from 0..``gpus_per_node``, every node
    with something free more often than not) with a GPU count of 2 .. min(12, free GPUs)."""
    rng = random.Random(seed)
    weights = [1] + [2] * (gpus_per_node - 1) + [1]  # 0 and full used less often
    out: list[FlexCase] = []
    while len(out) < n:
        used = tuple(rng.choices(range(gpus_per_node + 1), weights, k=nodes))
        free = nodes * gpus_per_node - sum(used)
        if free < 2:
            continue
        out.append(FlexCase(used, rng.randint(2, min(12, free))))
    return tuple(out)


def request_args(form: str, gpus: int, nodes: int) -> list[str]:
    """The sbatch arguments of a flexible request of ``gpus`` GPUs in ``form``."""
    return [a.format(n=gpus, nodes=nodes) for a in FORMS[form]]


def run_cases(
    client: SlurmClient,
    topo: Topology,
    todo: Sequence[FlexCase],
    forms: Sequence[str],
    *,
    tag: str = "lw-flex",
    start_timeout_s: float = 10.0,
) -> list[FlexResult]:
    """Run every case in every form (the blockers of a case once for all its forms)."""
    out: list[FlexResult] = []
    for case in todo:
        out.extend(_run_case(client, topo, case, forms, tag, start_timeout_s))
    return out


def _run_case(
    client: SlurmClient,
    topo: Topology,
    case: FlexCase,
    forms: Sequence[str],
    tag: str,
    start_timeout_s: float,
) -> list[FlexResult]:
    names = [n.name for n in topo.nodes]
    wait_settled(client)
    ids: list[int] = []
    out: list[FlexResult] = []
    try:
        for name, used in zip(names, case.used, strict=True):
            if used:
                pin = ["-w", name, "--nodes=1", f"--gres=gpu:{used}", "--cpus-per-gpu=2"]
                ids.append(sbatch(client, f"{tag}-block", pin))
        wait_running(client, ids, 30.0)
        for form in forms:
            free = _free(client, names)
            args = request_args(form, case.gpus, len(names))
            job = sbatch(client, f"{tag}-{form}", args)
            ids.append(job)
            slurm = _wait_placement(client, job, names, start_timeout_s)
            model = slurm_select_flexible(topo, free, case.gpus, per_task=form == "tasks")
            out.append(FlexResult(case, form, free, slurm, model))
            client.cancel(job)
            wait_settled(client, keep=set(ids) - {job})
    finally:
        left = {q.job_id for q in client.queue()}
        for job in ids:
            if job in left:
                client.cancel(job)
    return out


def sbatch(client: SlurmClient, name: str, args: Sequence[str], sleep_s: int = 600) -> int:
    """Submit a job that sleeps ``sleep_s``; its id."""
    cmd = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", "--chdir=/tmp"]
    out = client.runner.run([*cmd, *args, f"--wrap=sleep {sleep_s}"]).strip()
    return int(out.split(";")[0])


def squeue_jobs(client: SlurmClient) -> list[dict[str, object]]:
    """squeue's JSON records of every job in the queue."""
    jobs = json.loads(client.runner.run(["squeue", "--json"])).get("jobs", [])
    return [j for j in jobs if isinstance(j, dict)]


def job_state(job: dict[str, object]) -> str:
    """A squeue JSON record's state (RUNNING, PENDING, ...)."""
    state = job.get("job_state")
    return str(state[0] if isinstance(state, list) and state else state)


def wait_running(client: SlurmClient, ids: Sequence[int], timeout_s: float) -> None:
    """Until every job of ``ids`` runs (TimeoutError after ``timeout_s``)."""
    deadline = time.time() + timeout_s
    while True:
        states = {j.get("job_id"): job_state(j) for j in squeue_jobs(client)}
        if all(states.get(i) == "RUNNING" for i in ids):
            return
        if time.time() > deadline:
            raise TimeoutError(f"blockers {list(ids)} not running after {timeout_s:.0f} s")
        time.sleep(0.3)


def wait_settled(client: SlurmClient, keep: set[int] | None = None) -> None:
    """Until only ``keep`` (default: nothing) is in the queue and no node is completing."""
    deadline = time.time() + 60.0
    while True:
        queue = {q.job_id for q in client.queue()}
        busy = any("COMPLETING" in n.state.upper() for n in client.nodes())
        if queue <= (keep or set()) and not busy:
            return
        if time.time() > deadline:
            raise TimeoutError("the cluster did not settle within 60 s")
        time.sleep(0.3)


def _free(client: SlurmClient, names: Sequence[str]) -> tuple[int, ...]:
    by_name = {n.name: n for n in client.nodes()}
    return tuple(by_name[n].gpus_total - by_name[n].gpus_used for n in names)


def _wait_placement(
    client: SlurmClient, job: int, names: Sequence[str], timeout_s: float
) -> Placement | None:
    """The nodes and GPUs per node Slurm gave ``job`` (None: not started in time)."""
    index = {n: i for i, n in enumerate(names)}
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        rec = next((j for j in squeue_jobs(client) if j.get("job_id") == job), None)
        if rec is not None and job_state(rec) == "RUNNING":
            hosts = expand(str(rec.get("nodes") or ""))
            detail = rec.get("gres_detail") or []
            gpus = [gres_gpus(str(d)) for d in detail] if isinstance(detail, list) else []
            if len(gpus) != len(hosts):
                raise ValueError(f"job {job}: gres_detail {detail!r} does not match {hosts}")
            return Placement.of([(index[h], g) for h, g in zip(hosts, gpus, strict=True)])
        time.sleep(0.3)
    return None
