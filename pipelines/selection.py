"""Checkpoint selection on validation windows (issue 16 item 6).

The validation windows are the last windows of the training span, before the held-out ones
and left out of the dataset (``validation_windows``); every checkpoint of every candidate
run (``pipelines.learners.train_checkpoints``) is run in the simulator on them, warm-started
from the history like the evaluation's windows, with the run's one predictor
(``validate_packages``), and the one with the lowest average JCT is chosen (``select``;
failed candidates never are). ``log_selection`` writes the table and a plot of validation
average JCT against the step (one line per alpha and seed) and logs them to MLflow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from linkwise.cluster.domain import Topology
from linkwise.cluster.metrics import duration_text
from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.backlog import backlog_from_store
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window
from linkwise.datasets.store import open_store
from linkwise.evaluation.benchmark import PolicyRef, make_cases, run_benchmark
from linkwise.models.registry import registry_client
from linkwise.policies.spec import PolicySpec

__all__ = [
    "Candidate",
    "Selection",
    "log_selection",
    "plot_selection",
    "select",
    "validate_packages",
    "validation_windows",
]


@dataclass(frozen=True)
class Candidate:
    """One checkpoint of one training run: its package and where it came from."""

    algo: str
    seed: int
    step: int
    package_dir: str
    run_id: str
    alpha: float | None = None  # CQL's
    seconds: float = 0.0  # training time of its run up to this step
    heldout_action_match: float | None = None
    heldout_chance: float | None = None

    @property
    def label(self) -> str:
        """A unique name: ``cql-a1-s0-step100``."""
        alpha = f"-a{self.alpha:g}" if self.alpha is not None else ""
        return f"{self.algo}{alpha}-s{self.seed}-step{self.step}"


@dataclass(frozen=True)
class Selection:
    """Every candidate with its validation average JCT (None: failed), and the chosen one."""

    candidates: tuple[Candidate, ...]
    scores: tuple[float | None, ...]  # in candidate order
    chosen: Candidate
    train_s: float = 0.0
    validate_s: float = 0.0

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate: alpha, seed, step, validation avg JCT, chosen."""
        return [
            {
                "label": c.label,
                "algo": c.algo,
                "alpha": c.alpha,
                "seed": c.seed,
                "step": c.step,
                "val_avg_jct_s": s,
                "heldout_action_match": c.heldout_action_match,
                "chosen": c == self.chosen,
                "run_id": c.run_id,
                "package_dir": c.package_dir,
            }
            for c, s in zip(self.candidates, self.scores, strict=True)
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": asdict(self.chosen) | {"label": self.chosen.label},
            "val_avg_jct_s": self.scores[self.candidates.index(self.chosen)],
            "train_s": self.train_s,
            "validate_s": self.validate_s,
            "per_checkpoint_validate_s": self.validate_s / max(1, len(self.candidates)),
            "table": self.table(),
        }

    def format(self) -> str:
        """One line: the chosen checkpoint among how many, and its validation avg JCT."""
        c = self.chosen
        score = self.scores[self.candidates.index(c)] or math.nan
        return (
            f"{c.algo}: chose {c.label} among {len(self.candidates)} checkpoints "
            f"(validation avg JCT {duration_text(score)}; validation took "
            f"{self.validate_s:.0f} s)"
        )


def select(
    candidates: Sequence[Candidate],
    scores: Mapping[str, float | None],
    *,
    train_s: float = 0.0,
    validate_s: float = 0.0,
) -> Selection:
    """The candidate with the lowest finite score (by label; ties: the earlier in the given
    order); ValueError when none has one."""
    values = tuple(_finite(scores.get(c.label)) for c in candidates)
    ranked = [(v, i) for i, v in enumerate(values) if v is not None]
    if not ranked:
        raise ValueError(f"no candidate finished the validation windows ({len(candidates)} tried)")
    return Selection(tuple(candidates), values, candidates[min(ranked)[1]], train_s, validate_s)


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def validation_windows(
    windows: Sequence[Window], until: float, n: int, min_jobs: int
) -> list[Window]:
    """The last ``n`` windows (at least ``min_jobs`` jobs) ending by ``until`` (the start of
    the held-out windows); ValueError when fewer than ``n`` are there, or none lie before
    them (the dataset would have nothing left)."""
    if n <= 0:
        return []
    eligible = [w for w in windows if w.end <= until and len(w.jobs) >= min_jobs]
    chosen = eligible[-n:]
    first = min((w.start for w in windows), default=until)
    if len(chosen) < n or min(w.start for w in chosen) <= first:
        raise ValueError(
            f"{n} validation windows of {min_jobs}+ jobs do not fit in the training span "
            f"before {until} with training windows left ({len(eligible)} eligible)"
        )
    return chosen


def validate_packages(
    packages: Mapping[str, str],
    windows: Sequence[Window],
    *,
    db: str | Path,
    slurm_cluster: str,
    topology: Topology,
    block_s: float,
    seed: int,
    predictor: RuntimePredictor | None,
    tracking_uri: str | None = None,
) -> dict[str, float | None]:
    """Each package (label -> folder) in the simulator on ``windows`` with one seed, each
    window warm-started from the store's state at its start (as ``pipelines.evaluate``
    does): label -> average JCT over the windows (None: it failed a case)."""
    with closing(open_store(db)) as con:
        backlogs = {
            w.window_id: backlog_from_store(con, topology, slurm_cluster, w.start, predictor)
            for w in windows
        }
    cases = make_cases(
        windows, (seed,), topology, calibration=load_calibration(None), block_s=block_s,
        backlogs=backlogs, predictor=predictor,
    )  # fmt: skip
    refs = [PolicyRef(label, PolicySpec.parse(f"model:{pkg}")) for label, pkg in packages.items()]
    bench = run_benchmark(refs, cases, executor="serial", tracking_uri=tracking_uri)
    scores: dict[str, float | None] = dict.fromkeys(packages)
    for row in bench.summary():
        scores[row["policy"]] = float(row["avg_jct_s"])
    return scores


def plot_selection(selection: Selection, path: Path) -> Path:
    """Validation average JCT (hours) against the step, one line per (alpha, seed), the
    chosen checkpoint circled; a PNG at ``path``."""
    # matplotlib takes about half a second to import: only where a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): drawn to a file, no display

    lines: dict[tuple[float | None, int], list[tuple[int, float]]] = {}
    for c, s in zip(selection.candidates, selection.scores, strict=True):
        if s is not None:
            lines.setdefault((c.alpha, c.seed), []).append((c.step, s / 3600.0))
    fig, ax = plt.subplots(figsize=(6, 4))
    for (alpha, seed), pts in sorted(lines.items(), key=lambda kv: str(kv[0])):
        name = (f"alpha {alpha:g}, " if alpha is not None else "") + f"seed {seed}"
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=name)
    c = selection.chosen
    best = selection.scores[selection.candidates.index(c)]
    if best is not None:
        ax.scatter([c.step], [best / 3600.0], s=160, facecolors="none", edgecolors="k")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation avg JCT (h)")
    ax.set_title(f"{c.algo.upper()} checkpoints on the validation windows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def log_selection(selection: Selection, *, uri: str, out: Path) -> dict[str, str]:
    """Write ``out.json`` (the selection) and ``out.png`` (the plot); log every candidate's
    ``validation_avg_jct_s`` at its step into its run, and both files and the chosen
    label into the chosen run. The files written, by kind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    table = out.with_suffix(".json")
    table.write_text(json.dumps(selection.to_json(), indent=2, default=str) + "\n")
    plot = plot_selection(selection, out.with_suffix(".png"))
    client = registry_client(uri)
    for c, s in zip(selection.candidates, selection.scores, strict=True):
        if s is not None:
            client.log_metric(c.run_id, "validation_avg_jct_s", s, step=c.step)
    run = selection.chosen.run_id
    client.set_tag(run, "linkwise.selected", selection.chosen.label)
    for f in (table, plot):
        client.log_artifact(run, str(f), artifact_path="selection")
    return {"table": str(table), "plot": str(plot)}
