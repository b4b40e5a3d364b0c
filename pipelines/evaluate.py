"""Evaluate, gate, promote: the plain functions and the Prefect flow.

``evaluate`` benchmarks policies on held-out windows of a workload (a trace file or the
store's accounting) and writes the report (``evaluation.report``), logged to MLflow:

1. ``model:ALIAS`` specs are pinned to the version the alias points at now
   (``model:models:/linkwise-policy/N``), so an alias moving mid-run changes nothing, and
   the versions are recorded in the report.
2. The training data to hold out from: the manifests given (``holdout_from``) and the
   dataset manifest inside every learned policy's package. Named windows overlapping them
   are refused (``evaluation.holdout.HoldoutError``); without named windows the last
   ``n_windows`` free windows (with ``min_jobs`` jobs) are taken.
3. Policies x windows x seeds in the simulator (``evaluation.benchmark``, ``executor`` as
   for rollouts), paired statistics against ``baseline`` (``evaluation.stats``).

``gate_challenger`` builds the challenger gate's evidence from an evaluation folder, the
registry's aliases and FQE numbers (``evaluation.ope``'s mapping ``policy -> {estimate,
behaviour_return, spread}``, or a JSON file of it) and checks it (``evaluation.gates``).
``promote_from_evaluation`` / ``promote_from_shadow`` apply ``deployer.promote``.
``evaluate_and_promote`` chains evaluate, gate and promote; ``evaluate_flow`` is its Prefect
flow. ``ope_estimates`` is FQE on a dataset's held-out episodes (``linkwise ope``).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.flexible import summary_text
from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.restart import parse_restart
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.backlog import Backlog
from linkwise.datasets.comm_profiles import ProfileCounts
from linkwise.datasets.export import read_dataset
from linkwise.datasets.log_jobs import store_cluster, topology_from_store
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window
from linkwise.datasets.store import open_store
from linkwise.deployer.promote import (
    CHALLENGER,
    CHAMPION,
    SHADOW,
    current_aliases,
    promote_challenger,
    promote_shadow,
    shadow_evidence,
)
from linkwise.evaluation.benchmark import (
    Benchmark,
    PolicyRef,
    load_benchmark,
    make_cases,
    run_benchmark,
)
from linkwise.evaluation.columns import MAX_WIDTH, columns_for, left_out, text_table
from linkwise.evaluation.gates import (
    ChallengerEvidence,
    GateConfig,
    GateReport,
    check_challenger,
    check_shadow,
    load_gates,
    ope_evidence,
)
from linkwise.evaluation.holdout import (
    Span,
    dataset_spans,
    window_spans,
)
from linkwise.evaluation.ope import ope_table, run_ope
from linkwise.evaluation.report import EvaluationReport, log_report, write_report
from linkwise.evaluation.stats import paired_ratio
from linkwise.models.build import model_manifest, pinned, registry_version
from linkwise.models.calibrations import CalibrationChoice
from linkwise.models.registry import (
    default_tracking_uri,
    load_policy,
)
from linkwise.models.training import split_episodes
from linkwise.parallel import patient_prefect_server
from linkwise.pipelines.evaluation_cases import (
    evaluation_topology,
    held_out_windows,
    load_workload,
    window_backlogs,
    window_predictor,
    window_profiles,
)
from linkwise.pipelines.evidence import challenger_fqe
from linkwise.pipelines.experiment import EvaluationPlan
from linkwise.policies.source import MODEL_NAME
from linkwise.policies.spec import PolicySpec

__all__ = [
    "evaluate",
    "evaluate_and_promote",
    "evaluate_flow",
    "gate_challenger",
    "gate_evidence",
    "ope_estimates",
    "pin_policies",
    "promote_from_evaluation",
    "promote_from_shadow",
]


# ------------------------------------------------------------------------ policies


def pin_policies(
    specs: Sequence[PolicySpec], tracking_uri: str
) -> tuple[list[PolicyRef], dict[str, str]]:
    """Policy refs with every registry model pinned to the version it names now
    (``model:ALIAS`` -> ``model:models:/linkwise-policy/N``), and the versions (label ->
    version) of every registry model among them."""
    refs: list[PolicyRef] = []
    versions: dict[str, str] = {}
    for spec in specs:
        try:
            fixed = pinned(spec, tracking_uri)  # one registry lookup
        except ValueError as exc:
            raise ValueError(f"{spec.label}: {exc}") from None
        version = registry_version(fixed)  # a version URI now: read, not looked up
        if version is None:
            refs.append(PolicyRef.of(spec))
            continue
        versions[spec.label] = version
        refs.append(PolicyRef(spec.label, fixed))
    return refs, versions


def _reference(spec: PolicySpec) -> bool:
    """A heuristic that may be a reference (baseline, gate): never an oracle ceiling."""
    return not spec.is_model and not spec.is_oracle


# ------------------------------------------------------------------------ evaluate


def evaluate(
    policies: Sequence[PolicySpec],
    *,
    trace: str | Path | None = None,
    db: str | Path | None = None,
    slurm_cluster: str | None = None,
    windows: Sequence[int] | None = None,
    n_windows: int = 4,
    holdout_from: Sequence[str | Path] = (),
    seeds: Sequence[int] = (0, 1, 2),
    cluster: str | None = None,
    window_s: float = 6 * 3600.0,
    block_s: float = 1800.0,
    min_jobs: int = 10,
    calibration: str | None = None,
    calibration_used: CalibrationChoice | None = None,
    contention: str = "analytic",
    tick_s: float | None = None,
    baseline: str | None = None,
    executor: str = "serial",
    out_dir: str | Path = "linkwise-out/evaluation",
    tracking_uri: str | None = None,
    log: bool = True,
    n_boot: int = 2000,
    seed: int = 0,
    warm_start: bool = False,
    history: str | Path | None = None,
    history_format: str = "auto",
    predictor: RuntimePredictor | None = None,
    learned_need_predictions: bool = False,
    wide: bool = False,
    restart_cost: str | float = "sia",
    restart_grace: float | None = None,
    flexible: float | None = None,
) -> tuple[EvaluationReport, str | None]:
    """Benchmark ``policies`` on held-out windows and write the report (module docstring);
    the report and the MLflow run id (None when ``log`` is False). ``warm_start`` (store
    only): every window starts from the cluster's state in the accounting at its start
    (``datasets.backlog``), not from an empty cluster. ``history`` (a trace or a store, the
    workload itself included): a run-time predictor is fit on its jobs submitted before the
    first evaluation window (``datasets.history.fit_history``) and annotates every case's
    jobs; ``predictor`` instead gives one already fit (a run's one predictor; not with
    ``history``). ``qssf`` needs one, and with ``learned_need_predictions`` (``linkwise
    evaluate``) so does a learned package without its own predictor. ``wide``: every column
    in the report's results table (``evaluation.columns``). ``restart_cost``/``restart_grace``:
    what a preemption costs (``cluster.restart.parse_restart``: ``sia`` by default, ``0``
    free, or seconds). ``cluster``: the topology (``evaluation_topology``: default, the cluster
    a store describes, else ``DEFAULT_TOPOLOGY``); the report says which and from where.
    ``flexible``: this share of the workload's multi-GPU jobs without a request form replayed
    as flexible, by ``cluster.flexible``'s rule under ``seed`` (as ``simulate --flexible``),
    before windows are cut; the report and the MLflow params state the share and the rule.
    ``calibration_used``: how ``calibration`` was chosen (``models.calibrations``; default:
    a file given, else the shipped one), which the report states."""
    _refuse_arguments(policies, trace, db, history, predictor, warm_start)
    restart = parse_restart(str(restart_cost), restart_grace)
    uri = tracking_uri or default_tracking_uri()
    refs, versions = _pinned_refs(policies, uri)
    slurm_cluster = _store_cluster(db, slurm_cluster)
    where = evaluation_topology(cluster, db, slurm_cluster)
    topo = where.topology
    work = load_workload(trace, db, slurm_cluster, flexible, seed)
    manifests, used = _training_spans(holdout_from, refs, uri, work.traces)
    held = held_out_windows(
        work, topo, used, windows=windows, n_windows=n_windows, min_jobs=min_jobs, window_s=window_s
    )
    chosen, cal, profiles = window_profiles(db, slurm_cluster, held.chosen, calibration)
    predictor, fitted = window_predictor(
        predictor, history, history_format, slurm_cluster, chosen, work, trace
    )
    backlogs = window_backlogs(db, topo, slurm_cluster, chosen, predictor) if warm_start else {}
    cases = make_cases(
        chosen,
        seeds,
        topo,
        calibration=cal,
        contention=contention,
        block_s=block_s,
        tick_s=tick_s,
        backlogs=backlogs,
        predictor=predictor,
        restart=restart,
    )
    bench = run_benchmark(
        refs,
        cases,
        executor=executor,
        tracking_uri=uri,
        learned_need_predictions=learned_need_predictions,
    )
    base = baseline or next((r.label for r in refs if _reference(r.spec)), refs[0].label)
    context: dict[str, Any] = {
        "cluster": where.name,
        "topology_source": where.source,
        **_calibration_context(calibration_used or CalibrationChoice.given(calibration)),
        **_profile_context(profiles),
        "gpus": topo.total_gpus,
        "contention": contention,
        "workload": work.description,
        "workload_source": work.source,
        "window_s": window_s,
        "block_s": block_s,
        "seeds": [int(s) for s in seeds],
        "cases": len(cases),
        "executor": executor,
        **_policy_context(refs, versions),
        "warm_start": warm_start,
        "evaluation_windows": _window_context(chosen, work.source, backlogs),
        "datasets": [str(m.get("hash", ""))[:16] for m in manifests],
        "dataset_windows": [s.to_json() for s in used],
        "oracles": [r.label for r in refs if r.spec.is_oracle],
        "predictor": fitted,
        "restart": restart.to_dict(),
        "history_note": held.shortfall,
        "flexible": work.flexible,
    }
    report = write_report(
        bench, out_dir, baseline=base, context=context, n_boot=n_boot, seed=seed, wide=wide
    )
    run_id = log_report(report, tracking_uri=uri) if log else None
    return report, run_id


def _refuse_arguments(
    policies: Sequence[PolicySpec],
    trace: str | Path | None,
    db: str | Path | None,
    history: str | Path | None,
    predictor: RuntimePredictor | None,
    warm_start: bool,
) -> None:
    """``evaluate``'s ValueError for arguments that do not go together."""
    if not policies:
        raise ValueError("no policies to evaluate")
    if (trace is None) == (db is None):
        raise ValueError("evaluate on exactly one workload: a trace or a store (db)")
    if history is not None and predictor is not None:
        raise ValueError("give a history to fit the predictor on, or a predictor, not both")
    if warm_start and db is None:
        raise ValueError(
            "warm_start needs the accounting store (db): a trace has no placements to start from"
        )


def _pinned_refs(
    policies: Sequence[PolicySpec], uri: str
) -> tuple[list[PolicyRef], dict[str, str]]:
    """The policies to run, ``model:`` specs pinned to their registry versions (``pin_policies``,
    only when one names the registry), and those versions."""
    if any(s.is_model for s in policies):
        return pin_policies(policies, uri)
    return [PolicyRef.of(s) for s in policies], {}


def _training_spans(
    holdout_from: Sequence[str | Path],
    refs: Sequence[PolicyRef],
    uri: str,
    traces: Mapping[str, str | Path],
) -> tuple[list[dict[str, Any]], list[Span]]:
    """The dataset manifests to hold out from (those given, then each learned policy's) and
    the spans they trained on."""
    manifests: list[dict[str, Any]] = [json.loads(Path(m).read_text()) for m in holdout_from]
    for ref in refs:
        m = model_manifest(ref.spec, uri)
        if m is not None:
            manifests.append(m)
    used: list[Span] = [s for m in manifests for s in dataset_spans(m, traces=traces)]
    return manifests, used


def _store_cluster(db: str | Path | None, slurm_cluster: str | None) -> str | None:
    """The store's cluster, given or not (spans are named by it); ``slurm_cluster`` without
    a store."""
    if db is None:
        return slurm_cluster
    with closing(open_store(db)) as con:
        return store_cluster(con, slurm_cluster)


def _calibration_context(choice: CalibrationChoice) -> dict[str, Any]:
    """The report's ``calibration`` (how it reads) and ``calibration_used`` (the record)."""
    return {"calibration": choice.describe(), "calibration_used": choice.to_dict()}


def _profile_context(profiles: ProfileCounts | None) -> dict[str, Any]:
    """The report's ``profiles`` (the line: how many jobs had a learned profile, how many the
    default mix) and ``profile_counts``; None for a trace (no telemetry to learn from)."""
    if profiles is None:
        return {"profiles": None, "profile_counts": None}
    return {"profiles": profiles.line(), "profile_counts": profiles.to_dict()}


def _policy_context(refs: Sequence[PolicyRef], versions: Mapping[str, str]) -> dict[str, Any]:
    """The report's ``policies`` (labels), ``specs`` and ``model_versions``."""
    return {
        "policies": [r.label for r in refs],
        "specs": {r.label: r.spec.label for r in refs},
        "model_versions": versions,
    }


def _window_context(
    chosen: Sequence[Window], source: str, backlogs: Mapping[int, Backlog]
) -> list[dict[str, Any]]:
    """The report's ``evaluation_windows``: each window's span, jobs and starting backlog."""
    return [
        {
            **s.to_json(),
            "jobs": len(w.jobs),
            **({"backlog": backlogs[w.window_id].to_json()} if w.window_id in backlogs else {}),
        }
        for s, w in zip(window_spans(chosen, source), chosen, strict=True)
    ]


# ------------------------------------------------------------------------ gates


def gate_evidence(
    bench: Benchmark,
    challenger: str,
    *,
    champion: str | None,
    version: str | None = None,
    ope: Mapping[str, Any] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> ChallengerEvidence:
    """The challenger gate's evidence from a benchmark: paired ratios against the champion
    (a policy label, or None when there is none) and the best heuristic (lowest mean avg
    JCT among the heuristics run, never an oracle ceiling: ``PolicySpec.is_oracle``),
    FQE numbers, latency and masked actions."""

    summary = {r["policy"]: r for r in bench.summary()}
    heur = [p for p in bench.policies if bench.kinds.get(p) != "learned" and p not in bench.oracles]
    best = min(heur, key=lambda p: float(summary[p]["avg_jct_s"])) if heur else None

    def ratio(ref: str | None, stat: str) -> Any:
        if ref is None or ref not in bench.policies:
            return None
        return paired_ratio(bench, challenger, ref, stat, n_boot=n_boot, seed=seed)

    row = summary[challenger]
    ev = ope_evidence(ope, challenger) or ope_evidence(ope, bench.specs.get(challenger, ""))
    return ChallengerEvidence(
        challenger=challenger,
        version=version,
        champion=champion,
        avg_vs_champion=ratio(champion, "avg"),
        p99_vs_champion=ratio(champion, "p99"),
        best_heuristic=best,
        avg_vs_heuristic=ratio(best, "avg"),
        p99_vs_heuristic=ratio(best, "p99"),
        ope=ev,
        latency_ms_p99=float(row["latency_ms_p99"]),
        masked_actions=row["masked_actions"],
        best_heuristic_oracle=best is not None and best in bench.oracles,
    )


def _read_ope(ope: Mapping[str, Any] | str | Path | None) -> Mapping[str, Any] | None:
    if ope is None or isinstance(ope, Mapping):
        return ope
    data: Mapping[str, Any] = json.loads(Path(ope).read_text())
    return data


def gate_challenger(
    evaluation_dir: str | Path,
    *,
    tracking_uri: str,
    gates: GateConfig | None = None,
    ope: Mapping[str, Any] | str | Path | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[GateReport, ChallengerEvidence, str]:
    """Check the current ``@challenger`` against an evaluation folder: the report, the
    evidence and the challenger's version. The evaluation must contain the challenger's
    version (and the champion's when there is one), else the missing comparisons fail."""

    cfg = gates or load_gates()
    aliases = current_aliases(tracking_uri)
    if CHALLENGER not in aliases:
        raise ValueError(f"no @{CHALLENGER} in the registry at {tracking_uri}")
    version = aliases[CHALLENGER]
    results = json.loads((Path(evaluation_dir) / "results.json").read_text())
    versions: dict[str, str] = results["context"].get("model_versions", {})
    bench = load_benchmark(evaluation_dir)
    by_version = {v: label for label, v in versions.items() if label in bench.policies}
    challenger = by_version.get(version)
    failed = bench.failed()
    label = next((x for x, v in versions.items() if v == version), None)
    if challenger is None and label in failed:
        raise ValueError(
            f"the challenger {label} (version {version}) failed {len(failed[label])} of "
            f"{len(bench.cases)} evaluation cases ({failed[label][0].error[:200]}): refused"
        )
    if challenger is None:
        raise ValueError(
            f"{evaluation_dir} does not evaluate the current challenger (version {version}; "
            f"it has {versions or 'no registry models'}): evaluate model:{CHALLENGER} again"
        )
    champ_version = aliases.get(CHAMPION)
    champion = None
    if champ_version is not None:
        champion = by_version.get(
            champ_version, f"model:{CHAMPION} (version {champ_version}, not evaluated)"
        )
    evidence = gate_evidence(
        bench,
        challenger,
        champion=champion,
        version=version,
        ope=_read_ope(ope),
        n_boot=n_boot,
        seed=seed,
    )
    return check_challenger(evidence, cfg.challenger), evidence, version


def promote_from_evaluation(
    evaluation_dir: str | Path,
    *,
    tracking_uri: str,
    gates: GateConfig | None = None,
    ope: Mapping[str, Any] | str | Path | None = None,
) -> Any:
    """Gate the current challenger on an evaluation and promote it to ``shadow`` if it
    passes; the ``deployer.promote.PromotionDecision`` (logged in MLflow either way)."""

    report, evidence, version = gate_challenger(
        evaluation_dir, tracking_uri=tracking_uri, gates=gates, ope=ope
    )
    return promote_challenger(
        report,
        version,
        tracking_uri=tracking_uri,
        evidence={"evaluation": str(evaluation_dir), **evidence.to_json()},
    )


def promote_from_shadow(
    db: str | Path,
    *,
    tracking_uri: str,
    gates: GateConfig | None = None,
    cluster: str | None = None,
    slurm_cluster: str | None = None,
    calibration: str | None = None,
    seed: int = 0,
    calibration_used: CalibrationChoice | None = None,
) -> Any:
    """Gate the current ``@shadow`` on its shadow-mode evidence in the live store and make it
    champion if it passes; the decision (logged in MLflow either way), its evidence naming
    the calibration the replay used (``calibration_used``: how it was chosen)."""

    cfg = gates or load_gates()
    aliases = current_aliases(tracking_uri)
    if SHADOW not in aliases:
        raise ValueError(f"no @{SHADOW} in the registry at {tracking_uri}")
    version = aliases[SHADOW]
    cal = load_calibration(calibration)
    # refused here when it does not load or verify (the replay loads it again)
    load_policy(
        f"models:/{MODEL_NAME}/{version}", model=AnalyticModel(cal), tracking_uri=tracking_uri
    )
    with closing(open_store(db)) as con:
        topo = load_topology(cluster) if cluster else topology_from_store(con, slurm_cluster)
        ev, info = shadow_evidence(
            con,
            version,
            topology=topo,
            calibration=cal,
            cluster=slurm_cluster,
            seed=seed,
            tracking_uri=tracking_uri,
        )
    report = check_shadow(ev, cfg.shadow)
    return promote_shadow(
        report,
        version,
        tracking_uri=tracking_uri,
        evidence={
            **ev.to_json(),
            **info,
            "db": str(db),
            "calibration": (calibration_used or CalibrationChoice.given(calibration)).to_dict(),
        },
    )


def evaluate_and_promote(
    policies: Sequence[PolicySpec],
    *,
    gates: str | Path | None = None,
    ope: Mapping[str, Any] | str | Path | None = None,
    fqe: EvaluationPlan | None = None,
    promote: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Evaluate (``evaluate``'s keyword arguments), then gate the challenger and promote it
    to shadow when it passes (``promote``); a JSON-able summary. The gate's FQE evidence:
    ``ope`` (a table, or its JSON file) when given, else with ``fqe`` the challenger's FQE on
    its training dataset's held-out episodes (``pipelines.evidence.challenger_fqe``, the
    plan's ``ope_steps`` and ``ope_seeds``; its note in ``fqe``), else none (a refusal)."""
    report, run_id = evaluate(policies, **kwargs)
    out: dict[str, Any] = {"evaluation": report.to_json(), "evaluation_run_id": run_id}
    if promote:
        uri = kwargs.get("tracking_uri") or default_tracking_uri()
        if ope is None and fqe is not None:
            ope, out["fqe"] = challenger_fqe(uri, fqe)
        decision = promote_from_evaluation(
            report.out_dir, tracking_uri=uri, gates=load_gates(gates), ope=ope
        )
        out["decision"] = decision.to_json()
    return out


def evaluate_flow(policies: Sequence[PolicySpec], **kwargs: Any) -> dict[str, Any]:
    """``evaluate_and_promote`` as a Prefect flow run (same arguments)."""
    from prefect import flow  # Prefect (heavy, starts a server) only for a flow run

    fl = flow(name="evaluate", validate_parameters=False, log_prints=False)(evaluate_and_promote)
    with patient_prefect_server():
        result: dict[str, Any] = fl(policies, **kwargs)
    return result


# ------------------------------------------------------------------------ summaries


def format_evaluation(report: EvaluationReport, run_id: str | None, wide: bool = False) -> str:
    """The human-readable summary: the table (the columns of ``evaluation.columns``; ``wide``:
    all of them) and the ratios to the baseline."""
    lines = [
        f"evaluation: {report.context['cases']} cases "
        f"({len(report.context['evaluation_windows'])} windows x "
        f"{len(report.context['seeds'])} seeds) on {report.context['cluster']}",
        f"  topology: {report.context.get('topology_source', 'given')}",
    ]
    if report.context.get("profiles"):  # a store's workload: learned profiles or the mix
        lines.append(f"  {report.context['profiles']}")
    note = report.context.get("history_note")
    if note:
        lines += ["  " + part for part in textwrap.wrap(f"note: {note}", MAX_WIDTH - 2)]
    restart = report.context.get("restart")
    if isinstance(restart, dict):
        lines.append(f"  restart cost: {restart.get('description', restart.get('name'))}")
    forms = report.context.get("flexible")
    if isinstance(forms, dict):
        lines.append(f"  flexible requests: {summary_text(forms)}")
    base = report.baseline
    lines += text_table(report.summary, columns_for("evaluation", wide), base)
    left = left_out("evaluation", wide, base)
    if left:  # wrapped: the note stays within the default width however many columns
        note = f"(--wide adds: {', '.join(left)})"
        lines += ["  " + part for part in textwrap.wrap(note, MAX_WIDTH - 2)]
    for q in [*report.ratios, *report.reference_ratios]:
        lines.append(
            f"  {q.policy} / {q.baseline} {q.stat}: {q.ratio:.3f} [{q.low:.3f}, {q.high:.3f}]"
        )
    for policy, failure in report.context.get("failed", {}).items():
        lines.append(f"  FAILED {policy}, {failure['cases']} cases (left out): {failure['first']}")
    refs = report.references
    if refs:
        lines.append(
            f"  references: baseline {refs.get('baseline')}, best same-information heuristic "
            f"{refs.get('best_heuristic')}, oracle ceiling {refs.get('oracle')}"
        )
    lines.append(f"  report: {report.files['report']}")
    if run_id:
        lines.append(f"MLflow run id: {run_id}")
    return "\n".join(lines)


def ope_estimates(
    dataset: Path,
    specs: Sequence[PolicySpec],
    *,
    seeds: Sequence[int],
    holdout: float,
    split_seed: int,
) -> dict[str, dict[str, Any]]:
    """FQE estimates of the learned policies ``specs`` against the behaviour policy's return
    (``evaluation.ope.ope_table``: the ``--ope`` input of promote), on the ``holdout`` share
    of ``dataset``'s episodes held out as training split them (``split_seed``; 0: all)."""
    data: Any = dataset
    spec = None
    if holdout > 0:  # the held-out episodes, as training split them
        df, manifest = read_dataset(dataset)
        spec = ObsSpec.from_json(manifest["obs_spec"])
        _, data = split_episodes(df, holdout, split_seed)
        if data.height == 0:
            raise ValueError(f"{dataset}: no held-out episodes at --holdout {holdout}")
    return ope_table(run_ope(data, {s.label: s for s in specs}, spec=spec, seeds=seeds))
