"""No policy and no encoder reads the true run time (``docs/INFORMATION.md``).

At a decision point a policy may know what a real Slurm knows: submit time, shape, user and
name, time limit, wait, attained service, and run-time predictions from history. Two states
that differ only in what the simulator alone knows (pending and running jobs' true
durations and remaining work, running jobs' progress rate and so their expected end) must
give every same-information heuristic, the MDP encoder and mask, and a learned policy the
same decision and the same observation.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linkwise.cluster import mdp
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.prediction import predictor_digest, predictor_record
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models.learned import PREDICTOR, LearnedPolicy, PackageError, load_package
from linkwise.models.packaging import write_package
from linkwise.policies import heuristics
from linkwise.policies.spec import PolicySpec

MODEL = AnalyticModel(load_calibration(None))
TOPO = from_spec("8x8,leaf=2,oversub=2")
PROFILES = ("bert", "imagenet", "deepspeech2", "cifar10")


def _oracles() -> frozenset[str]:
    """The heuristics that read the true run time on purpose (ceilings marked ``oracle``)."""
    marked = getattr(heuristics, "ORACLE_POLICIES", None)
    if marked is not None:
        return frozenset(marked)
    return frozenset(n for n in heuristics.POLICIES if "oracle" in n or "srtf" in n)


SAME_INFORMATION = [
    *sorted(set(heuristics.POLICIES) - _oracles()),
    # compositions of same-information parts (``policies.parts``), migration included
    "compose:order=pred_remaining,placement=least_contention,preempt=priority:margin=1.2",
    "compose:order=pred_gpu_time,placement=select,admission=easy",
    "compose:order=gpus,placement=bounded,preempt=migrate:ratio=0.9,min_run_s=0",
    "compose:order=las:mode=submit,placement=bounded,preempt=priority",
]


def _predictor() -> RuntimePredictor:
    """A predictor fit on a past that has nothing to do with the states' true run times."""
    rng = np.random.default_rng(42)
    past = [
        Job(
            i,
            float(i),
            int(rng.choice([1, 2, 4, 8, 16])),
            float(rng.lognormal(8, 1.5)),
            user=f"u{i % 3}",
            name=f"n{i % 5}",
        )
        for i in range(200)
    ]
    return RuntimePredictor.fit(past, min_count=3)


def _state(seed: int, *, predicted: bool = True) -> ClusterState:
    """Running jobs (one spans both leaves) and a queue with preempted jobs, time limits and
    users; every job annotated by ``_predictor`` when ``predicted``."""
    rng = np.random.default_rng(seed)
    now = 50_000.0
    pred = _predictor() if predicted else None

    def job(i: int, gpus: int, submit: float) -> Job:
        j = Job(
            i,
            submit,
            gpus,
            float(rng.lognormal(8, 1.5)),
            profile=str(rng.choice(PROFILES)),
            user=f"u{rng.integers(4)}",
            name=f"n{rng.integers(6)}",
            time_limit=float(rng.choice([0.0, 0.0, 7200.0, 86400.0])),
        )
        return pred.annotate([j])[0] if pred is not None else j

    placements = [
        Placement.of([(0, 8), (4, 8)]),  # across the two leaves
        Placement.of([(1, 4)]),
        Placement.of([(2, 8), (3, 8)]),
        Placement.of([(5, 2)]),
    ]
    running = []
    for i, p in enumerate(placements):
        j = job(100 + i, p.num_gpus, now - float(rng.uniform(1000, 40_000)))
        since = now - float(rng.uniform(0, 500))
        running.append(
            RunningJob(
                job=j,
                placement=p,
                start_time=since - float(rng.uniform(0, 2000)),
                remaining_s=float(rng.uniform(10, j.duration)),
                rate=float(rng.uniform(0.5, 1.0)),
                attained_gpu_s=float(rng.uniform(0, 1e5)),
                preemptions=int(rng.integers(2)),
                since=since,
            )
        )
    pending = []
    for i in range(12):
        j = job(i, int(rng.choice([1, 2, 4, 8, 12, 16])), now - float(rng.uniform(0, 30_000)))
        attained = float(rng.uniform(0, 5e4)) if i % 4 == 0 else 0.0
        pending.append(
            PendingJob(
                j, remaining_s=j.duration, attained_gpu_s=attained, preemptions=int(i % 4 == 0)
            )
        )
    pending.sort(key=lambda p: (p.job.submit_time, p.job.job_id))
    free = [n.gpus for n in TOPO.nodes]
    for r in running:
        for node, g in r.placement.alloc:
            free[node] -= g
    return ClusterState(
        time=now,
        topology=TOPO,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(pending),
    )


def _twin(state: ClusterState, seed: int) -> ClusterState:
    """The same state but for what only the simulator knows: every job's true duration and
    remaining work, running jobs' rate (so their expected end); attained service unchanged."""
    rng = np.random.default_rng(seed + 1000)

    def other(job: Job) -> Job:
        return replace(job, duration=job.duration * float(rng.uniform(0.05, 20.0)))

    pending = tuple(
        replace(p, job=(j := other(p.job)), remaining_s=j.duration * float(rng.uniform(0.1, 1)))
        for p in state.pending
    )
    running = tuple(
        replace(
            r,
            job=(j := other(r.job)),
            remaining_s=j.duration * float(rng.uniform(0.01, 1)),
            rate=float(rng.uniform(0.1, 1.0)),
        )
        for r in state.running
    )
    twin = replace(state, pending=pending, running=running)
    for a, b in zip(state.running, twin.running, strict=True):
        assert a.expected_end != b.expected_end and a.attained_at(state.time) == b.attained_at(
            state.time
        )
    return twin


SEEDS = (0, 1, 2, 3)


@pytest.mark.parametrize("name", SAME_INFORMATION)
@pytest.mark.parametrize("seed", SEEDS)
def test_heuristics_do_not_read_the_true_run_time(name: str, seed: int) -> None:
    state = _state(seed)
    twin = _twin(state, seed)
    # a fresh policy per state: stateful ones (Tiresias' queues) start alike
    a = PolicySpec.parse(name).build().decide(state)
    b = PolicySpec.parse(name).build().decide(twin)
    assert a == b
    assert a.starts or a.preempt or name == "fifo"  # a real decision, not a vacuous wait


def test_oracles_are_the_only_exceptions() -> None:
    """The oracle ceilings do read the true run time (else they would not be oracles)."""
    oracles = sorted(_oracles() & set(heuristics.POLICIES))
    differs = []
    for name in oracles:
        for seed in SEEDS:
            state = _state(seed)
            twin = _twin(state, seed)
            if heuristics.make_policy(name).decide(state) != heuristics.make_policy(name).decide(
                twin
            ):
                differs.append(name)
                break
    assert differs == oracles


CONFIGS = (
    mdp.MdpConfig(k_slots=4, slot_order="head"),
    mdp.MdpConfig(k_slots=4, slot_order="fitting", time_of_day=True),
    mdp.MdpConfig(k_slots=8, slot_order="smallest", contention_weight=1.0),
    mdp.MdpConfig(
        k_slots=6,
        slot_order="mixed",
        generators=("bounded", "best_fit", "least_contention"),
        span_lambda=1.5,
    ),
)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.slot_order)
@pytest.mark.parametrize("seed", SEEDS)
def test_encoder_and_mask_do_not_read_the_true_run_time(config: mdp.MdpConfig, seed: int) -> None:
    spec = mdp.make_spec(config)
    state = _state(seed)
    twin = _twin(state, seed)
    ca = mdp.candidates(state, config, MODEL)
    cb = mdp.candidates(twin, config, MODEL)
    assert np.array_equal(mdp.action_mask(ca), mdp.action_mask(cb))
    assert mdp.encode(ca, spec).tobytes() == mdp.encode(cb, spec).tobytes()
    # and after a start applied inside the decision point (the stepping every policy does)
    a = int(np.flatnonzero(ca.mask)[0])
    if a != config.wait_action:
        sa = mdp.apply_start(state, ca.start_for(a), MODEL)
        sb = mdp.apply_start(twin, cb.start_for(a), MODEL)
        assert (
            mdp.encode_state(sa, spec, MODEL).tobytes()
            == mdp.encode_state(sb, spec, MODEL).tobytes()
        )


RUNNING_ROWS = mdp.MdpConfig(k_slots=4, slot_order="mixed", running_slots=3, min_run_s=60.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_running_rows_do_not_read_the_true_run_time(seed: int) -> None:
    """Preempt and migrate rows (attained service, predicted remaining time, restart cost, the
    model's slowdown) and the states after each preemption or migration, on twin states."""
    cfg = RUNNING_ROWS
    spec = mdp.make_spec(cfg)
    state = _state(seed)
    twin = _twin(state, seed)
    ca = mdp.candidates(state, cfg, MODEL)
    cb = mdp.candidates(twin, cfg, MODEL)
    assert np.array_equal(mdp.action_mask(ca), mdp.action_mask(cb))
    assert mdp.encode(ca, spec).tobytes() == mdp.encode(cb, spec).tobytes()
    moves = np.flatnonzero(ca.mask[cfg.n_start_actions : cfg.wait_action]) + cfg.n_start_actions
    assert len(moves) > 0  # running rows are offered: the check is not vacuous
    for a in moves:
        da, db = mdp.decode(ca, int(a)), mdp.decode(cb, int(a))
        assert da == db and (da.preempt or da.migrate)
        sa = mdp.apply_decision(state, da, MODEL, 30.0)
        sb = mdp.apply_decision(twin, db, MODEL, 30.0)
        assert (
            mdp.encode_state(sa, spec, MODEL).tobytes()
            == mdp.encode_state(sb, spec, MODEL).tobytes()
        )


def _learned(spec: mdp.ObsSpec, predictor: RuntimePredictor | None = None) -> LearnedPolicy:
    """A learned policy with a fixed random network (its weights do not matter here)."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(spec.dim, 32), torch.nn.Tanh(), torch.nn.Linear(32, spec.n_actions)
    ).eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
        traced: Any = torch.jit.trace(net, torch.zeros(1, spec.dim))  # type: ignore[no-untyped-call]
    return LearnedPolicy(network=traced, spec=spec, model=MODEL, predictor=predictor)


@pytest.mark.parametrize("guard", ["aging", "strict", "off"])
@pytest.mark.parametrize(
    "config",
    [CONFIGS[2], CONFIGS[3], RUNNING_ROWS],
    ids=lambda c: f"{c.slot_order}{c.running_slots}",
)
@pytest.mark.parametrize("seed", SEEDS)
def test_learned_policy_does_not_read_the_true_run_time(
    guard: str, config: mdp.MdpConfig, seed: int
) -> None:
    spec = mdp.make_spec(config)
    policy = _learned(spec)
    policy.guard = guard
    state = _state(seed)
    assert policy.decide(state) == policy.decide(_twin(state, seed))


def test_learned_policy_annotates_with_its_own_predictor() -> None:
    """Jobs without predictions are annotated by the package's predictor: the same decision
    as on jobs annotated upstream with that predictor, whatever the true run times."""
    spec = mdp.make_spec(CONFIGS[0])
    bare = _state(5, predicted=False)
    with pytest.raises(ValueError, match="run-time predictor"):
        _learned(spec).decide(bare)
    policy = _learned(spec, _predictor())
    expected = policy.decide(_state(5))
    assert policy.decide(bare) == expected
    assert policy.decide(_twin(bare, 5)) == expected


def test_packages_carry_their_predictor_under_the_checksums(tmp_path: Path) -> None:
    """A package written from a dataset manifest that records a predictor carries it as
    ``predictor.json`` (covered by the checksums); the loaded policy decides with it."""
    spec = mdp.make_spec(CONFIGS[0])
    net = _learned(spec).network
    pred = _predictor()
    manifest = {"hash": "x", "sources": {"predictor": predictor_record(pred)}}

    def export(path: Path) -> str:
        net.save(str(path))
        return "q"

    pkg = write_package(tmp_path / "pkg", spec, manifest, export=export, algo="test", versions={})
    policy = load_package(pkg)
    assert policy.predictor == pred
    assert policy.meta["predictor_sha256"] == predictor_digest(pred)
    assert policy.decide(_state(6, predicted=False)) == policy.decide(_state(6))
    # tampered: refused by its checksum; not covered by the checksums: refused too
    (pkg / PREDICTOR).write_bytes((pkg / PREDICTOR).read_bytes().replace(b"0", b"1", 1))
    with pytest.raises(PackageError, match="SHA-256"):
        load_package(pkg)
    bare = write_package(
        tmp_path / "bare", spec, {"hash": "y"}, export=export, algo="t", versions={}
    )
    assert load_package(bare).predictor is None
    shutil.copy(pkg / PREDICTOR, bare / PREDICTOR)
    with pytest.raises(PackageError, match="not covered"):
        load_package(bare)
