"""What a preemption or a migration costs a training job: the restart model of the simulator.

A preempted (or migrated) job gets the checkpoint signal; for ``grace_s`` it still holds
its GPUs while it writes its checkpoint (it makes no progress), then frees them. When it
restarts (on any placement) it pays ``restore_s(profile)`` seconds of isolated work before
its progress resumes (relaunch, framework start-up, checkpoint load), and, if it does not
checkpoint on the signal, it also redoes the work since its last periodic checkpoint
(taken every ``checkpoint_interval_s`` seconds of its run).

Sources of the figures (``SIA_RESTORE_S``):

- Sia (Jayaram Subramanya et al., SOSP'23), artifact ``sia-simulator/applications.py``
  (github.com/siasosp23/artifacts), ``Application.rescale_time``: the measured seconds of
  no progress per restart (checkpoint plus restore) of each model: ncf 15 s, deepspeech2
  25 s, cifar10 50 s, yolov3 80 s, bert 120 s, imagenet 250 s, any other model 30 s.
- Pollux (Qiao et al., OSDI'21), artifact ``simulator/simulator.py`` (github.com/petuum/adaptdl,
  ``osdi21-artifact``), ``Job.reallocate``: a flat 30 s of no progress per reallocation.
  Used here as the cost of a job whose profile has no measured neighbour (it is also Sia's
  fallback), and available as ``RestartModel.constant(30.0)`` (``--restart-cost 30``).

The project's profiles (``cluster/data/calibration.json``) map to the nearest measured
model (``PROFILE_MODEL``): Pollux's six are the same models Sia measured; DeepShare's
DLRM and GraphSage (small recommendation / graph models, megabytes of gradients) map to
ncf; MobileNetV3 (a small vision CNN) to cifar10 (ResNet-18); FSDP, Transformer-XL and MoE
(gigabytes of gradients, the largest checkpoints) to bert, the largest model Sia measured.

``grace_s`` defaults to 30 s: Slurm's default ``KillWait`` (the seconds between the
signal and the kill of a preempted or cancelled job), and the lead time a job asks for
with ``--signal=B:USR1@30``. The whole grace is charged (the scheduler cannot count on a
job finishing its checkpoint earlier).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SIA_RESTORE_S: Mapping[str, float] = MappingProxyType(
    {
        "ncf": 15.0,
        "deepspeech2": 25.0,
        "cifar10": 50.0,
        "yolov3": 80.0,
        "bert": 120.0,
        "imagenet": 250.0,
    }
)
"""Sia's measured checkpoint-plus-restore seconds per model (``rescale_time``)."""

SIA_DEFAULT_RESTORE_S = 30.0
"""Sia's cost for any other model; also Pollux's flat cost per reallocation."""

PROFILE_MODEL: Mapping[str, str] = MappingProxyType(
    {
        "bert": "bert",
        "cifar10": "cifar10",
        "deepspeech2": "deepspeech2",
        "imagenet": "imagenet",
        "ncf": "ncf",
        "yolov3": "yolov3",
        "DLRM": "ncf",
        "GraphSage": "ncf",
        "MobileNetV3": "cifar10",
        "FSDP": "bert",
        "Transformer-XL": "bert",
        "MoE": "bert",
    }
)
"""Each project profile's nearest model that Sia measured (see the module docstring)."""

DEFAULT_GRACE_S = 30.0
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0


def _sia_costs() -> tuple[tuple[str, float], ...]:
    return tuple(sorted((p, SIA_RESTORE_S[m]) for p, m in PROFILE_MODEL.items()))


@dataclass(frozen=True, slots=True)
class RestartModel:
    """The cost of a restart after a preemption or a migration (see the module docstring).

    ``costs``: restore seconds per profile name, ``(profile, seconds)`` pairs; a profile not
    listed (or a job without one) pays ``default_s``. ``grace_s``: seconds a signalled job
    still holds its GPUs. ``checkpoint_on_signal``: whether jobs checkpoint when signalled;
    if not, they redo the work since their last periodic checkpoint, taken every
    ``checkpoint_interval_s`` seconds of run time. ``name``: how outputs call this model.
    """

    costs: tuple[tuple[str, float], ...] = field(default_factory=_sia_costs)
    default_s: float = SIA_DEFAULT_RESTORE_S
    grace_s: float = DEFAULT_GRACE_S
    checkpoint_on_signal: bool = True
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    name: str = "sia"
    _by_profile: Mapping[str, float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.default_s < 0 or any(s < 0 for _, s in self.costs):
            raise ValueError("restore costs must be non-negative")
        if self.grace_s < 0:
            raise ValueError("grace_s must be non-negative")
        if not self.checkpoint_interval_s > 0:
            raise ValueError("checkpoint_interval_s must be positive")
        object.__setattr__(self, "_by_profile", dict(self.costs))

    @staticmethod
    def sia(grace_s: float = DEFAULT_GRACE_S) -> RestartModel:
        """The default: Sia's measured cost per profile, a ``grace_s`` signal grace."""
        return RestartModel(grace_s=grace_s)

    @staticmethod
    def constant(seconds: float, grace_s: float = DEFAULT_GRACE_S) -> RestartModel:
        """The same restore cost for every job (Pollux: 30 s)."""
        return RestartModel(costs=(), default_s=seconds, grace_s=grace_s, name=f"{seconds:g}s")

    @staticmethod
    def free() -> RestartModel:
        """Free preemption: no grace, no restore cost, no lost work."""
        return RestartModel(costs=(), default_s=0.0, grace_s=0.0, name="free")

    @property
    def is_free(self) -> bool:
        """Whether a preemption costs nothing at all."""
        return (
            self.grace_s == 0
            and self.default_s == 0
            and all(s == 0 for _, s in self.costs)
            and self.checkpoint_on_signal
        )

    def restore_s(self, profile: str) -> float:
        """Isolated seconds of work a job of this profile pays at each restart."""
        return self._by_profile.get(profile, self.default_s)

    def lost_s(self, progress_s: float, run_s: float, rate: float) -> float:
        """Isolated work redone after a signal, ``progress_s`` made in a run of ``run_s``
        seconds at ``rate`` now: none when jobs checkpoint on the signal, else the work
        since the last periodic checkpoint (at most what the run made)."""
        if self.checkpoint_on_signal or progress_s <= 0:
            return 0.0
        since_checkpoint = run_s % self.checkpoint_interval_s
        return min(progress_s, rate * since_checkpoint)

    def describe(self) -> str:
        """One line for outputs, e.g. ``Sia's measured cost per profile, grace 30 s, ...``."""
        if self.is_free:
            return "0 (preemption is free)"
        what = "Sia's measured cost per profile" if self.name == "sia" else f"{self.default_s:g} s"
        lost = (
            "checkpoint on signal"
            if self.checkpoint_on_signal
            else f"periodic checkpoint every {self.checkpoint_interval_s:g} s"
        )
        return f"{what}, grace {self.grace_s:g} s, {lost}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON view (``free_preemption`` says whether preemption costs nothing)."""
        return {
            "name": self.name,
            "free_preemption": self.is_free,
            "grace_s": self.grace_s,
            "default_s": self.default_s,
            "costs": dict(self.costs),
            "checkpoint_on_signal": self.checkpoint_on_signal,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "description": self.describe(),
        }


def parse_restart(cost: str, grace_s: float | None = None) -> RestartModel:
    """A restart model from a command line: ``sia`` (default), ``0`` (free) or seconds.

    ``grace_s`` None: 30 s, or 0 with ``0`` (free preemption)."""
    text = cost.strip().lower()
    if text == "sia":
        return RestartModel.sia(DEFAULT_GRACE_S if grace_s is None else grace_s)
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"restart cost must be 'sia', '0' or seconds, got {cost!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"restart cost must be a non-negative number of seconds, got {cost!r}")
    if seconds == 0 and not grace_s:
        return RestartModel.free()
    return RestartModel.constant(seconds, DEFAULT_GRACE_S if grace_s is None else grace_s)
