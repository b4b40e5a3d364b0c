"""The packaged learned policy: a TorchScript network giving a value for every action, the
``ObsSpec`` it was trained with, the dataset manifest and SHA-256 checksums; no pickle.

A package is a folder:

- ``network.pt``: TorchScript (``torch.jit.trace``) of the Q-network (DiscreteCQL: the mean
  of the critics' Q-values) or of the imitator (DiscreteBC: the logits), ``(B, dim) ->
  (B, n_actions)``. d3rlpy's own ``save_policy`` returns greedy actions, which cannot be
  masked, so the network is exported here.
- ``obs_spec.json``: ``ObsSpec.to_json()``; ``dataset.json``: the dataset manifest;
  ``policy.json``: what the values are (``q`` or ``logits``), versions, the dataset hash.
- ``predictor.json``: the run-time predictor (``datasets.predictor``) the training data was
  annotated with (the dataset manifest's ``sources.predictor``, or a PPO workload's), when it
  has one; a policy decides on the same predictions it was trained on.
- ``checksums.sha256``: ``sha256sum`` lines for every other file.

It is written by ``models.packaging`` (``write_package``, the one writer for BC/CQL and PPO).

``load_package`` verifies every checksum *before* reading anything else, then rebuilds the
spec with ``ObsSpec.from_json`` (refusing a model encoded differently from this code) and
checks the network's output shape; a ``predictor.json`` that the checksums do not cover is
refused. A network of the MLP structures ``models.numpy_net`` recognises gets a numpy forward
for small batches (``LearnedPolicy.forward``), accepted only where it reproduces the network
on probe rows. ``LearnedPolicy`` implements the ``Policy`` protocol as ``cluster.mdp.MdpPolicy``
does: it first annotates the jobs that have no run-time predictions with its package's
predictor (``LearnedPolicy.predictor``), then at each step it encodes the state with the
model's spec, sets masked actions to -inf, and takes the best; "wait" (always allowed) wins
only when the model prefers it.

Guard (``LearnedPolicy.guard``): what the policy does when the model's best allowed action
is "wait" while a start is allowed. ``"aging"`` (the default): starvation protection. It
starts the best-scoring allowed start when nothing runs (as ``"idle"``), or when some slot's
job with an allowed start has waited at least ``starve_s`` (``LearnedPolicy.starve_s``,
default 6 h; the wait is read from the observation's ``s{k}.wait_log`` with
``cluster.mdp.time_from_log``), then among the starving slots' rows only; otherwise the
model may hold GPUs, e.g. to wait for a consolidated placement. ``"strict"``: it always takes
its best-scoring allowed *start* instead, so the policy is work-conserving (it decides which
job starts where, never whether GPUs stay idle while a queued job fits them); trained on logs
of a scheduler that holds GPUs for reservations, a model learns to wait in states its own
waiting makes ever more common (a longer queue), and without a guard one such run queued
jobs for hundreds of hours on the held-out Philly week. ``"idle"``: only when nothing runs
(the model can never stall an idle cluster, the simulator's ``SimulationStalled``).
``"off"``: the model's choice. Each override is counted in ``wait_overrides``; the guard
never picks a masked action. It lives in ``act`` (reading "nothing runs" from the
observation's ``g.running_log`` and waits from ``s{k}.wait_log``), so it holds for every
caller of ``act`` (``decide``, the benchmark's step probe), not only ``decide``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.mdp import (
    Candidates,
    ObsSpec,
    action_mask,
    apply_decision,
    candidates,
    decide_by_steps,
    decode,
    encode,
    local_grace,
    nothing_fits,
    time_from_log,
)
from linkwise.cluster.mdp.features import RunningMemo
from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.export import file_sha256
from linkwise.datasets.prediction import (
    annotate_state,
    read_predictor,
)
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models import numpy_net as npnet
from linkwise.models.numpy_net import NumpyNet

__all__ = [
    "CHECKSUMS",
    "FILES",
    "GUARDS",
    "PACKAGE_FORMAT",
    "PREDICTOR",
    "STARVE_S",
    "ExplainedStep",
    "LearnedPolicy",
    "PackageError",
    "load_package",
    "masked_argmax",
    "verify_checksums",
]

PACKAGE_FORMAT = "linkwise-policy/1"
GUARDS = ("aging", "strict", "idle", "off")  # the guard's modes, the default first
RUNNING_FEATURE = "g.running_log"  # log1p(running jobs) / log1p(queue_scale): 0 iff idle
WAIT_FEATURE = "wait_log"  # per slot: the job's wait, log-scaled (cluster.mdp.time_from_log)
SMALL_BATCH = 64  # batches up to this many rows: numpy when verified, else one torch thread
STARVE_S = 6 * 3600.0  # the aging guard's default: a job waiting this long must start
NETWORK = "network.pt"
OBS_SPEC = "obs_spec.json"
DATASET = "dataset.json"
META = "policy.json"
CHECKSUMS = "checksums.sha256"
PREDICTOR = "predictor.json"  # optional; covered by the checksums when present
FILES: tuple[str, ...] = (NETWORK, OBS_SPEC, DATASET, META)

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]


class PackageError(ValueError):
    """A policy package that must not be served: tampered, incomplete, or built for another
    observation spec."""


def masked_argmax(values: npt.NDArray[Any], mask: BoolArray) -> npt.NDArray[np.int64]:
    """Row-wise argmax of ``values`` over allowed actions only. NaN counts as -inf; a row whose
    allowed values are all -inf/NaN gives its first allowed action, a row with nothing
    allowed -1. Never a masked action. One row (1-D) is taken in plain Python: a decision
    point's few actions cost less so than numpy's calls on a cold cache (the residual scores
    one row per decision point, ``benchmarks/learned_speed.md``)."""
    if np.ndim(values) == 1 and np.ndim(mask) == 1:
        row = _argmax_row(np.asarray(values).tolist(), np.asarray(mask).tolist())
        return np.array(row, dtype=np.int64)
    v = np.where(mask & ~np.isnan(values), values, -np.inf)
    best = np.argmax(v, axis=-1)
    degenerate = np.take_along_axis(v, best[..., None], axis=-1)[..., 0] == -np.inf
    first = np.argmax(mask, axis=-1)
    best = np.where(degenerate, first, best)
    return np.where(mask.any(axis=-1), best, -1).astype(np.int64)


def _argmax_row(values: list[Any], mask: list[bool]) -> int:
    """``masked_argmax`` of one row: the first allowed maximum (NaN never wins, ``x > best``
    is false for it), else the first allowed action, else -1."""
    first = best = -1
    top = -math.inf
    for i, allowed in enumerate(mask):
        if allowed:
            if first < 0:
                first = i
            x = values[i]
            if x > top:
                best, top = i, x
    return best if best >= 0 else first


# ------------------------------------------------------------------------ load


def verify_checksums(pkg_dir: str | Path) -> dict[str, str]:
    """Check every file listed in ``checksums.sha256`` (all of ``FILES`` must be listed);
    PackageError naming the first mismatch. Returns name -> digest."""
    d = Path(pkg_dir)
    sums_path = d / CHECKSUMS
    if not sums_path.is_file():
        raise PackageError(f"{d}: no {CHECKSUMS}: refusing an unverifiable model")
    listed: dict[str, str] = {}
    for line in sums_path.read_text().splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or "/" in name or name in listed:
            raise PackageError(f"{sums_path}: malformed line {line!r}")
        listed[name] = digest
    missing = [n for n in FILES if n not in listed]
    if (d / PREDICTOR).exists() and PREDICTOR not in listed:
        missing.append(PREDICTOR)
    if missing:
        raise PackageError(f"{sums_path}: {missing} not covered by the checksums")
    for name, digest in listed.items():
        path = d / name
        if not path.is_file():
            raise PackageError(f"{d}: {name} is missing")
        actual = file_sha256(path)
        if actual != digest:
            raise PackageError(
                f"{path}: SHA-256 {actual[:16]}... does not match the recorded {digest[:16]}...: "
                "the artifact was changed after packaging; refusing to load it"
            )
    return listed


def _read_spec(d: Path, meta: Mapping[str, Any], expected: str | None) -> ObsSpec:
    data = json.loads((d / OBS_SPEC).read_text())
    try:
        spec = ObsSpec.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise PackageError(f"{d}: {exc}") from None
    if meta.get("obs_spec_version") != spec.version:
        raise PackageError(
            f"{d}: policy.json says ObsSpec {meta.get('obs_spec_version')}, obs_spec.json is "
            f"{spec.version}"
        )
    if expected is not None and spec.version != expected:
        raise PackageError(
            f"{d}: the model's ObsSpec is {spec.version}, this deployment expects {expected}: "
            "refusing a model built for other observations"
        )
    return spec


@dataclass
class LearnedPolicy:
    """A learned policy (Policy protocol): all action values from the network, masked, best.

    ``guard`` is the guard of the module docstring (``GUARDS``), ``starve_s`` the wait after
    which the ``"aging"`` guard starts a job; ``wait_overrides`` counts the steps where the
    guard replaced the model's "wait" by a start.
    ``predictor``: the run-time predictor of the package; ``decide`` annotates the jobs that
    have no predictions with it (jobs annotated upstream keep theirs).
    ``numpy_net``: the network in numpy (``models.numpy_net``), set by ``load_package`` when
    recognised and verified; it scores batches of up to ``SMALL_BATCH`` rows (``forward``
    says which path they take)."""

    network: Any  # a torch.jit.ScriptModule, (B, dim) -> (B, n_actions)
    spec: ObsSpec
    model: ContentionModel
    values: str = "q"
    name: str = "learned"
    meta: Mapping[str, Any] = field(default_factory=dict)
    package_dir: str | None = None
    guard: str = GUARDS[0]
    predictor: RuntimePredictor | None = None
    starve_s: float = STARVE_S
    numpy_net: NumpyNet | None = field(default=None, repr=False, compare=False)
    wait_overrides: int = field(default=0, init=False)
    _running_feature: int = field(default=0, init=False, repr=False)
    _wait_features: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.guard not in GUARDS:
            raise ValueError(f"guard must be one of {GUARDS}, got {self.guard!r}")
        if not self.starve_s >= 0:
            raise ValueError(f"starve_s must be non-negative, got {self.starve_s}")
        names = self.spec.feature_names
        needed = [RUNNING_FEATURE]
        needed += [f"s{k}.{WAIT_FEATURE}" for k in range(self.spec.config.k_slots)]
        missing = [n for n in needed if n not in names]
        if missing:
            raise PackageError(f"the ObsSpec has no {missing}: the guard needs them")
        self._running_feature = names.index(RUNNING_FEATURE)
        self._wait_features = tuple(names.index(n) for n in needed[1:])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its package folder and settings, reloaded (checksums verified again) where
        it is unpickled: a TorchScript network does not pickle, and a rollout task carrying a
        learned behaviour travels to a process pool or a Dask worker."""
        if self.package_dir is None:
            raise TypeError("a LearnedPolicy without a package folder cannot be pickled")
        return (
            _reload,
            (self.package_dir, self.model, self.spec.version, self.name, self.guard, self.starve_s),
        )

    @property
    def forward(self) -> str:
        """How small batches are scored: ``"numpy"`` (``numpy_net``) or ``"torch"``."""
        return "torch" if self.numpy_net is None else "numpy"

    def action_values(self, obs: FloatArray) -> npt.NDArray[np.float32]:
        """The network's values for a batch of observations ``(B, dim) -> (B, n_actions)``:
        by ``numpy_net`` up to ``SMALL_BATCH`` rows when there is one, else by torch."""
        x = np.ascontiguousarray(obs, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.shape[1] != self.spec.dim:
            raise ValueError(f"observations have {x.shape[1]} features, the model {self.spec.dim}")
        if self.numpy_net is not None and x.shape[0] <= SMALL_BATCH:
            return npnet.evaluate(self.numpy_net, x)
        # torch takes seconds to import: only where a network is built, exported or read
        import torch

        threads = torch.get_num_threads()
        try:  # one thread for a decision's few rows: more only wait on each other (100x slower
            # on a loaded 2-core machine, benchmarks/learned_speed.md)
            if x.shape[0] <= SMALL_BATCH:
                torch.set_num_threads(1)
            with torch.inference_mode():
                out: npt.NDArray[np.float32] = self.network(torch.from_numpy(x)).numpy()
        finally:
            torch.set_num_threads(threads)
        return out

    def act(self, obs: FloatArray, mask: BoolArray) -> int:
        """The best allowed action for one observation (wait when it is the best, unless the
        guard turns it into the best allowed start, of the starving slots under "aging")."""
        return self._choose(self.action_values(obs)[0], obs, mask)[0]

    def _choose(
        self, values: npt.NDArray[np.float32], obs: FloatArray, mask: BoolArray
    ) -> tuple[int, str]:
        """``act`` on the network's values: the action and the guard's reason when it
        replaced the model's wait ("" otherwise)."""
        wait = self.spec.config.wait_action
        if not np.isfinite(values[mask]).any():  # a broken network: start nothing
            a = wait
        else:
            best = int(masked_argmax(values, mask))
            a = wait if best < 0 else best
        if a != wait or self.guard == "off":
            return a, ""
        allowed = mask
        reason = "strict guard: never wait while a start is allowed"
        if self.guard != "strict":
            if not self._idle(obs):
                if self.guard == "idle":
                    return a, ""
                allowed = mask & self._starving_rows(obs)  # "aging"
                reason = f"aging guard: a job has waited {self.starve_s:g} s or more"
            else:
                reason = f"{self.guard} guard: nothing runs, the cluster must not stay idle"
        start = self._best_start_of(values, allowed)
        if start < 0:
            return a, ""
        self.wait_overrides += 1
        return start, reason

    def _starving_rows(self, obs: FloatArray) -> BoolArray:
        """The actions of the slots whose job has waited at least ``starve_s`` (read from
        ``s{k}.wait_log``); wait excluded."""
        x = np.asarray(obs, dtype=np.float32).reshape(-1)
        cfg = self.spec.config
        p = cfg.n_candidates
        rows = np.zeros(cfg.n_actions, dtype=np.bool_)
        for k, i in enumerate(self._wait_features):
            if time_from_log(float(x[i]), cfg) >= self.starve_s:
                rows[k * p : (k + 1) * p] = True
        return rows

    def _idle(self, obs: FloatArray) -> bool:
        """Nothing runs, read from the observation (``g.running_log`` is 0 exactly then), so
        the guard also holds where only ``act`` is called (the benchmark's step probe)."""
        x = np.asarray(obs, dtype=np.float32).reshape(-1)
        return bool(x[self._running_feature] <= 0.0)

    def act_batch(self, obs: FloatArray, masks: BoolArray) -> npt.NDArray[np.int64]:
        """Best allowed actions for a batch (-1 where nothing is allowed)."""
        return masked_argmax(self.action_values(obs), masks)

    def best_start(self, obs: FloatArray, mask: BoolArray) -> int:
        """The best-scoring allowed start (never wait; -1 when no start is allowed)."""
        return self._best_start_of(self.action_values(obs)[0], mask)

    def _best_start_of(self, values: npt.NDArray[np.float32], mask: BoolArray) -> int:
        starts = mask.copy()
        starts[self.spec.config.n_start_actions :] = False  # wait, and preempt/migrate rows
        if not starts.any():
            return -1
        return int(masked_argmax(values, starts))

    def decide(self, state: ClusterState) -> Decision:
        """All starts the model chooses at this decision point (steps until it waits), each
        applied to a local copy of the state before the next observation; jobs without
        run-time predictions are annotated by ``predictor`` first (ValueError from the
        encoder when the policy has none)."""
        state = annotate_state(state, self.predictor)
        return decide_by_steps(state, self.act, self.spec, self.model)

    def decide_explained(self, state: ClusterState) -> tuple[Decision, tuple[ExplainedStep, ...]]:
        """``decide`` with every step's candidates, the action taken, its value, the best
        other allowed action (the runner-up) and its value, and the guard's reason when it
        overrode the model's wait: what ``deployer.explain`` records. The same steps as
        ``cluster.mdp.decide_by_steps`` (the network is asked once per step, as ``act``
        does), keeping each step's candidates instead of building them twice."""
        state = annotate_state(state, self.predictor)
        cfg = self.spec.config
        wait = cfg.wait_action
        grace = local_grace(cfg)
        starts: list[Start] = []
        preempt: list[int] = []
        migrate: list[Start] = []
        steps: list[ExplainedStep] = []
        s = state
        memo: RunningMemo = {}
        while True:
            if nothing_fits(s, cfg):
                break
            c = candidates(s, cfg, self.model)
            if not c.mask[:wait].any():
                break
            obs = encode(c, self.spec, memo)
            mask = action_mask(c)
            values = self.action_values(obs)[0]
            a, guard = self._choose(values, obs, mask)
            others = mask.copy()
            others[a] = False
            runner = int(masked_argmax(values, others)) if others.any() else -1
            steps.append(
                ExplainedStep(
                    candidates=c,
                    action=a,
                    score=_finite(values[a]),
                    runner_up=runner,
                    runner_up_score=_finite(values[runner]) if runner >= 0 else None,
                    guard=guard,
                )
            )
            if a == wait:
                break
            d = decode(c, a)  # InvalidAction if masked
            starts += d.starts
            preempt += d.preempt
            migrate += d.migrate
            s = apply_decision(s, d, self.model, grace)
        decision = Decision(starts=tuple(starts), preempt=tuple(preempt), migrate=tuple(migrate))
        return decision, tuple(steps)


def _reload(
    package_dir: str, model: ContentionModel, version: str, name: str, guard: str, starve_s: float
) -> LearnedPolicy:
    """``LearnedPolicy.__reduce__``'s loader: the same package, verified again."""
    return load_package(
        package_dir,
        model=model,
        expected_obs_spec=version,
        name=name,
        guard=guard,
        starve_s=starve_s,
    )


def _finite(x: Any) -> float | None:
    v = float(x)
    return v if np.isfinite(v) else None


@dataclass(frozen=True)
class ExplainedStep:
    """One step of a learned decision (``LearnedPolicy.decide_explained``): the state's
    candidates, the action taken and its value (Q-value or log-probability, the package's
    ``values``), the best other allowed action (-1: none) and its value, and the guard's
    reason when it replaced the model's wait ("" otherwise)."""

    candidates: Candidates
    action: int
    score: float | None
    runner_up: int
    runner_up_score: float | None
    guard: str


def _load_network(path: Path) -> Any:
    """The TorchScript network at ``path``; a pickle, a ``torch.save`` file or anything else
    that is not a TorchScript archive is refused (PackageError), never unpickled."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
            return torch.jit.load(str(path), map_location="cpu").eval()  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"{path}: not a TorchScript archive (a pickle or torch.save file is never loaded): "
            f"{first[:200]}"
        ) from None


def load_package(
    pkg_dir: str | Path,
    *,
    model: ContentionModel | None = None,
    expected_obs_spec: str | None = None,
    name: str | None = None,
    guard: str = GUARDS[0],
    starve_s: float = STARVE_S,
) -> LearnedPolicy:
    """Load a package after verifying its checksums and ObsSpec (PackageError otherwise).

    ``model`` is the contention model the encoder predicts with (default: the analytic model
    with the shipped calibration); ``expected_obs_spec`` an ObsSpec version the caller
    requires; ``guard`` and ``starve_s`` the guard (module docstring)."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    d = Path(pkg_dir)
    if not d.is_dir():
        raise PackageError(f"{d}: not a policy package folder")
    verify_checksums(d)
    meta: dict[str, Any] = json.loads((d / META).read_text())
    if meta.get("format") != PACKAGE_FORMAT:
        raise PackageError(f"{d}: package format {meta.get('format')!r}, expected {PACKAGE_FORMAT}")
    spec = _read_spec(d, meta, expected_obs_spec)
    network = _load_network(d / NETWORK)
    try:
        with torch.no_grad():
            shape = tuple(network(torch.zeros(1, spec.dim)).shape)
    except Exception as exc:  # a TorchScript module of another shape or kind
        raise PackageError(
            f"{d}: {NETWORK} cannot score a {spec.dim}-feature state: {exc}"
        ) from None
    if shape != (1, spec.n_actions):
        raise PackageError(f"{d}: network gives {shape}, the spec has {spec.n_actions} actions")
    fast = npnet.load(network, spec.dim)  # None: not recognised, or not verified
    predictor = None
    if (d / PREDICTOR).is_file():
        try:
            predictor = read_predictor(d / PREDICTOR)
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageError(f"{d}: {PREDICTOR}: {exc}") from None
    return LearnedPolicy(
        network=network,
        spec=spec,
        model=model if model is not None else AnalyticModel(load_calibration(None)),
        values=str(meta.get("values", "q")),
        name=name or f"learned:{meta.get('algo', '?')}",
        meta=meta,
        package_dir=os.fspath(d),
        guard=guard,
        predictor=predictor,
        starve_s=starve_s,
        numpy_net=fast,
    )
