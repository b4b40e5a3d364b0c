"""The demo's evaluation, gates and shadow loop (steps 4-6 of ``pipelines.demo``): every
heuristic and the learned policies on the held-out windows, the challenger gated and promoted
to ``@shadow``, then the shadow loop over the simulator and the shadow -> champion gate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from linkwise.cluster.domain import Topology
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.promote import current_aliases
from linkwise.evaluation.gates import load_gates
from linkwise.evaluation.shadow_replay import shadow_headline
from linkwise.pipelines.evaluate import evaluate, promote_from_evaluation, promote_from_shadow
from linkwise.pipelines.evidence import guard_overrides
from linkwise.pipelines.experiment import Experiment
from linkwise.pipelines.history import accounting_jobs
from linkwise.pipelines.sim_shadow import run_shadow
from linkwise.pipelines.tables import comparison_table
from linkwise.pipelines.workspace import Workspace
from linkwise.policies.heuristics import policy_names
from linkwise.policies.spec import PolicySpec

__all__ = ["BASELINE", "HEURISTICS", "evaluate_heldout", "gate_challenger", "shadow_stage"]

# every heuristic ``linkwise policies`` lists: the frontier (preemptive QSSF, Tiresias with
# consolidated placement, DeepShare's migration rule), QSSF and the oracle ceilings (marked
# ``oracle`` in the table, never a reference)
HEURISTICS: tuple[str, ...] = tuple(policy_names(predictions=True))
BASELINE = "backfill"


def evaluate_heldout(
    ws: Workspace,
    exp: Experiment,
    topo: Topology,
    models: Mapping[str, Mapping[str, Any]],
    dataset_path: str,
    *,
    slurm_cluster: str,
    seed: int,
    predictor: RuntimePredictor,
    extra: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """Every heuristic and the learned policies on the held-out windows, with the run's one
    predictor, and the learned policies' guard counts there: (the comparison table, the
    evaluation's summary, each learned policy's package folder by its spec). ``extra``:
    more policies (spec -> display name: the residuals), in the table beside them."""
    # each learned policy by its pinned registry version, labelled BC, CQL, PPO
    labels = {
        f"model:models:/{m['model_name']}/{m['version']}": algo.upper()
        for algo, m in models.items()
    }
    extra = dict(extra or {})
    report, eval_run = evaluate(
        [PolicySpec.parse(s) for s in (*HEURISTICS, *labels, *extra)],
        out_dir=ws.out / "evaluation",
        db=ws.db,
        slurm_cluster=slurm_cluster,
        n_windows=exp.evaluation.heldout_windows,
        seeds=exp.evaluation.seeds,
        cluster=exp.topology,
        window_s=exp.windows.window_s,
        block_s=exp.windows.block_s,
        min_jobs=exp.windows.min_jobs,
        baseline=BASELINE,
        executor="serial",
        tracking_uri=ws.uri,
        wide=ws.wide,
        n_boot=exp.evaluation.n_boot,
        seed=seed,
        warm_start=exp.windows.warm_start,
        # the dataset itself, so held-out windows are chosen even when no model is evaluated
        holdout_from=[dataset_path.removesuffix(".parquet") + ".json"],
        # the run's one predictor (fit before the split), for heuristics and warm starts alike;
        # the learned packages carry the same one
        predictor=predictor,
    )
    failed: dict[str, Any] = report.context.get("failed", {})
    for spec, info in failed.items():
        name = labels.get(spec, extra.get(spec, spec))
        ws.console.print(
            f"[red]{name} failed[/red] {info['cases']} evaluation cases "
            f"({info['first']}); left out of the comparison"
        )
    windows: list[dict[str, Any]] = report.context.get("evaluation_windows") or []
    # spec -> package: FQE's table is keyed by spec (the gate looks the challenger up by it)
    packages = {spec: models[label.lower()]["package_dir"] for spec, label in labels.items()}
    evaluation: dict[str, Any] = {
        "out_dir": report.out_dir,
        "report": str(Path(report.out_dir) / "report.md"),
        "files": report.files,
        "run_id": eval_run,
        "windows": report.context.get("evaluation_windows"),
        "dataset_windows": report.context.get("dataset_windows"),
        "seeds": report.context.get("seeds"),
        "failed": {labels.get(x, extra.get(x, x)): info for x, info in failed.items()},
        "guard": guard_overrides(
            {labels[spec]: pkg for spec, pkg in packages.items()},
            windows,
            ws.db,
            cluster=slurm_cluster,
            topology=topo,
            seed=seed,
        ),
    }
    ws.console.print(f"the guard (aging) on the held-out windows: {evaluation['guard']}")
    return comparison_table(report, {**labels, **extra}), evaluation, packages


def gate_challenger(
    evaluation_dir: str, uri: str, ope: Mapping[str, Any] | None, console: Console
) -> dict[str, Any]:
    """Gate ``@challenger`` on its evaluation (and FQE) and promote it to ``@shadow`` if it
    passes; the decision."""
    try:
        decision = promote_from_evaluation(
            evaluation_dir, tracking_uri=uri, gates=load_gates(), ope=ope
        )
    except ValueError as exc:  # the challenger failed its evaluation cases
        console.print(f"challenger->shadow REFUSED: {exc}")
        return {"action": "challenger->shadow", "passed": False, "reasons": [str(exc)]}
    console.print(decision.format())
    return dict(decision.to_json())


def shadow_stage(
    ws: Workspace,
    exp: Experiment,
    topo: Topology,
    windows: Sequence[Mapping[str, Any]],
    *,
    until: float,
    slurm_cluster: str,
    seed: int,
    predictor: RuntimePredictor,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The shadow loop with ``@shadow`` (else ``@challenger``) over the first held-out window,
    its jobs annotated by ``predictor``, and with ``@shadow`` the shadow -> champion gate on
    its log: (summary, gate decision)."""
    aliases = current_aliases(ws.uri)
    alias = "shadow" if "shadow" in aliases else "challenger"
    lo, hi = (
        (float(windows[0]["start"]), float(windows[0]["end"]))
        if windows
        else (until, until + exp.windows.window_s)
    )
    shadow = run_shadow(
        ws.db,
        accounting_jobs(ws.db, cluster=slurm_cluster, since=lo, until=hi,
                        max_gpus=topo.total_gpus),
        topo,
        spec=PolicySpec.parse(f"model:{alias}"),
        tracking_uri=ws.uri,
        cluster=slurm_cluster,
        state_dir=ws.out / "serve",
        max_cycles=exp.evaluation.shadow_cycles,
        seed=seed,
        predictor=predictor,
    )  # fmt: skip
    ws.console.print(
        f"shadow loop (@{alias}, version {shadow['model_version']}): {shadow['cycles']} cycles, "
        f"{shadow['decisions']} decision rows ({shadow['shadow_starts']} would-be starts), "
        f"backfill started {shadow['slurm_starts']} jobs"
    )
    if alias != "shadow":
        ws.console.print(
            shadow_headline(ws.db, topology=topo, tracking_uri=ws.uri, cluster=slurm_cluster,
                            model_version=str(shadow["model_version"]), seed=seed)
        )  # fmt: skip
        ws.console.print("no @shadow (the challenger did not pass): shadow -> champion not tried")
        return shadow, None
    d = promote_from_shadow(
        ws.db, tracking_uri=ws.uri, cluster=exp.topology, slurm_cluster=slurm_cluster, seed=seed
    )
    ws.console.print(str(d.evidence.get("headline", "shadow report: none")))
    ws.console.print(d.format())
    return shadow, dict(d.to_json())
