"""How well does the calibrated analytic contention model predict DeepShare's measured pairs?

Fits the calibration from shared/data (as ``linkwise calibrate`` does), then scores the
model's shared/isolated ratio for each of the 36 x 36 measured pairs, computed through
``AnalyticModel.rates``, against the measurement: mean absolute error and Spearman rank
correlation, next to the constant predictor "every ratio is the mean". Held-out figures refit
alpha on part of the pairs and score the rest (random halves; leave one model out).

    .venv/bin/python benchmarks/contention_validation.py [--data ../shared/data] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.calibration.fit import fit_calibration
from linkwise.cluster.calibration.isolated import fit_deepshare_profiles
from linkwise.cluster.calibration.measurements import (
    DEEPSHARE_SPEC,
    DEEPSHARE_SPEC_8,
    JobType,
    load_deepshare,
    load_pollux,
    ratio_matrix,
    table_types,
)
from linkwise.cluster.calibration.pairs import fit_alpha, pair_terms, predict_pair_ratios
from linkwise.cluster.calibration.pollux import pollux_spread_checks
from linkwise.cluster.calibration.validation import cross_validate, score
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, LinkKind, Placement, Topology
from linkwise.cluster.profiles import Calibration
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import from_spec

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LINGJUN = Path("topology") / "alibaba_lingjun_2023_topo.csv"
# Crux (SIGCOMM'24), its published example: a 64-GPU GPT next to a 16-GPU BERT across two
# ToRs of Lingjun, +11% GPT iteration time. The calibration has no GPT: the proxies are its
# transformer language models (DeepShare's Transformer-XL, MoE and FSDP); BERT is Pollux's.
CRUX_SLOWDOWN = 0.11
CRUX_GPT_PROXIES = ("Transformer-XL", "MoE", "FSDP")
CRUX_BERT = "bert"
CRUX_DRAWS = 1000  # (GPT id, BERT id) pairs: the hash draws ECMP's path choice averages over
FABRICS = {"pooled": "", "ecmp": ",ecmp=1"}


def _row(
    name: str, alpha: float | None, mae: float, rho: float, cv: dict[str, Any] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"predictor": name, "alpha": alpha, "mae": mae, "spearman": rho}
    if cv is not None:
        half, lomo = cv["random_half"], cv["leave_one_model_out"]
        row.update(
            {
                "cv_half_mae": half["model_mae"],
                "cv_half_mae_sd": half["model_mae_sd"],
                "cv_half_spearman": half["model_spearman"],
                "cv_half_trivial_mae": half["trivial_mae"],
                "lomo_mae": lomo["model_mae"],
                "lomo_spearman": lomo["model_spearman"],
                "lomo_trivial_mae": lomo["trivial_mae"],
                "lomo_mae_per_model": {k[4:-1]: v for k, v in lomo.items() if k.startswith("mae[")},
            }
        )
    return row


def run(data_dir: Path) -> dict[str, Any]:
    """Every figure of the report, as one JSON-able dict."""
    t0 = time.perf_counter()
    cal = fit_calibration(data_dir)
    fit_s = time.perf_counter() - t0
    table = load_deepshare(data_dir)
    types = table_types(table)
    measured = ratio_matrix(table)
    trivial = float(np.mean(np.abs(measured - measured.mean())))
    rows = [
        {"predictor": "constant (matrix mean)", "alpha": None, "mae": trivial, "spearman": math.nan}
    ]
    per_pair: dict[str, np.ndarray] = {}
    for sharing, alpha in (("flows", float(cal.fit["alpha_flows"])), ("duty", cal.alpha)):
        model = AnalyticModel(replace(cal, alpha=alpha), sharing=sharing)
        pred = predict_pair_ratios(model, types)  # through AnalyticModel.rates
        per_pair[sharing] = pred
        s = score(pred, measured)
        terms = pair_terms(cal.profiles, cal.overhead_s, types, sharing)
        cv = cross_validate(terms, measured, types)
        label = "SJF-BCO flow count" if sharing == "flows" else "duty-cycle sharing (shipped)"
        rows.append(_row(label, alpha, s.mae, s.spearman, cv))
    # Ablation: let the DeepShare scales drift (weak prior), everything else the same.
    ablation = []
    for weight in (1.0, 0.1, 0.01):
        iso = fit_deepshare_profiles(table, prior_weight=weight)
        terms = pair_terms(iso.profiles, iso.overhead_s, types, "duty")
        alpha = fit_alpha(terms, measured)
        s = score(terms.ratios(alpha), measured)
        ablation.append(
            {
                "prior_weight": weight,
                "isolated_rms_log_error": iso.rms_log_error(),
                "overhead_s": iso.overhead_s,
                "scale_transformer_xl": iso.scale["Transformer-XL"],
                "alpha": alpha,
                "pairs_mae": s.mae,
                "pairs_spearman": s.spearman,
            }
        )
    # Where the shipped model errs: mean error by the measured job's and the neighbour's model.
    err = per_pair["duty"] - measured
    models = sorted({t[0] for t in types})
    by_model = {
        m: {
            "as_measured_bias": float(err[[t[0] == m for t in types]].mean()),
            "as_neighbour_bias": float(err[:, [t[0] == m for t in types]].mean()),
        }
        for m in models
    }
    iso_fit = cal.fit["deepshare_isolated"]
    fabric = fabric_sources(cal, data_dir, types, measured)
    spread = pollux_spread_checks(load_pollux(data_dir), cal.overhead_s)
    all_rows = [row for c in spread for row in c.rows]
    return {
        "pollux_spread": {
            "by_model": {
                c.model: {"n": len(c.rows), "mean_abs_rel_error": c.mean_abs_rel_error}
                for c in spread
            },
            "n": len(all_rows),
            "mean_abs_rel_error": float(np.mean([abs(p / m - 1.0) for *_, m, p in all_rows])),
            "measured_mean": float(np.mean([m for *_, m, _ in all_rows])),
            "predicted_mean": float(np.mean([p for *_, p in all_rows])),
            "constant_mean_abs_rel_error": float(
                np.mean(
                    [abs(np.mean([m for *_, m, _ in all_rows]) / m - 1.0) for *_, m, _ in all_rows]
                )
            ),
        },
        "fabric": fabric,
        "compute_share_scan": cal.fit["deepshare_isolated"]["compute_share_scan"],
        "parameters": cal.fit["parameters"],
        "pairs": int(measured.size),
        "measured_mean": float(measured.mean()),
        "measured_min": float(measured.min()),
        "rows": rows,
        "row_mean_oracle_mae": float(np.mean(np.abs(measured - measured.mean(1, keepdims=True)))),
        "bias_by_model": by_model,
        "scale_prior_ablation": ablation,
        "isolated": {
            "rms_log_error": iso_fit["rms_log_error"],
            "median_abs_rel_error": iso_fit["median_abs_rel_error"],
            "max_abs_rel_error": iso_fit["max_abs_rel_error"],
            "max_abs_rel_error_by_model": {
                m: max(abs(v) for k, v in iso_fit["rel_error"].items() if k.startswith(m + ","))
                for m in models
            },
        },
        "pollux": cal.fit["pollux"],
        "profiles": {
            p.name: {"compute_s": p.compute_s, "grad_gb": p.grad_gb} for p in cal.profiles.values()
        },
        "alpha": cal.alpha,
        "alpha_flows": cal.fit["alpha_flows"],
        "overhead_s": cal.overhead_s,
        "fit_seconds": fit_s,
        "total_seconds": time.perf_counter() - t0,
    }


def deepshare_spread(
    model: AnalyticModel, table_isolated: dict[JobType, float], fabric: str
) -> list[dict[str, Any]]:
    """DeepShare's spread ratios: per model and GPU count, the isolated throughput on ``n``
    nodes over that on the fewest, measured and predicted (``AnalyticModel.iteration_times``
    of the job alone on DeepShare's topology plus ``fabric``, ``gpus / n`` GPUs per node)."""
    rows = []
    for (name, gpus, nodes), thp in table_isolated.items():
        fewest = min(n for m, g, n in table_isolated if m == name and g == gpus)
        if nodes == fewest:
            continue
        job = Job(0, 0.0, gpus, 1.0, name)
        t = [
            model.iteration_times(
                from_spec((DEEPSHARE_SPEC_8 if n > 4 else DEEPSHARE_SPEC) + fabric),
                [(job, Placement.of([(i, gpus // n) for i in range(n)]))],
            )[0]
            for n in (fewest, nodes)
        ]
        rows.append(
            {
                "model": name,
                "gpus": gpus,
                "nodes": nodes,
                "fewest": fewest,
                "measured": thp / table_isolated[(name, gpus, fewest)],
                "predicted": t[0] / t[1],
            }
        )
    return rows


def _two_tors(topo: Topology, need: int) -> tuple[list[int], list[int]]:
    """Nodes of the first two ToRs under one aggregation switch with ``need`` nodes each."""
    by_agg: dict[int, list[tuple[int, ...]]] = {}
    for leaf, members in enumerate(topo.leaf_nodes):
        if len(members) >= need:
            by_agg.setdefault(topo.leaf_agg[leaf], []).append(members)
    a, b = next(tors for tors in by_agg.values() if len(tors) >= 2)[:2]
    return list(a), list(b)


def crux_example(cal: Calibration, data_dir: Path) -> dict[str, Any]:
    """Crux's example on the Lingjun topology as loaded (1:1): the GPT on 4 hosts of one ToR
    and 4 of another, the BERT on one more host of each; the GPT's iteration-time increase
    next to the BERT, pooled and with ECMP (over ``CRUX_DRAWS`` job-id pairs, i.e. hash draws:
    the share whose flows share a port, the mean, and the mean where they do)."""
    model = AnalyticModel(cal)
    path = data_dir / LINGJUN
    out: dict[str, Any] = {"topology": str(LINGJUN), "measured": CRUX_SLOWDOWN, "rows": []}
    topos = {f: load_topology(f"{path}{opts}") for f, opts in FABRICS.items()}
    tor_a, tor_b = _two_tors(topos["pooled"], 5)
    gpt_at = Placement.of([(n, 8) for n in tor_a[:4] + tor_b[:4]])
    bert_at = Placement.of([(tor_a[4], 8), (tor_b[4], 8)])
    port = {LinkKind.LEAF_PORT, LinkKind.AGG_PORT}
    for proxy in CRUX_GPT_PROXIES:
        row: dict[str, Any] = {"gpt_proxy": proxy}
        for fabric, topo in topos.items():
            slow, shared = [], []
            draws = CRUX_DRAWS if fabric == "ecmp" else 1
            for k in range(draws):
                gpt, bert = Job(k, 0.0, 64, 1.0, proxy), Job(10**6 + k, 0.0, 16, 1.0, CRUX_BERT)
                alone = model.iteration_times(topo, [(gpt, gpt_at)])[0]
                both = model.iteration_times(topo, [(gpt, gpt_at), (bert, bert_at)])[0]
                slow.append(both / alone - 1.0)
                links = [
                    set(topo.ring_links(p.nodes, j.job_id))
                    for j, p in ((gpt, gpt_at), (bert, bert_at))
                ]
                shared.append(any(topo.links[i].kind in port for i in links[0] & links[1]))
            hit = [s for s, h in zip(slow, shared, strict=True) if h]
            row[fabric] = {
                "mean": float(np.mean(slow)),
                "share_colliding": float(np.mean(shared)),
                "mean_colliding": float(np.mean(hit)) if hit else 0.0,
                "max": float(np.max(slow)),
            }
        out["rows"].append(row)
    out["spines"] = topos["ecmp"].ecmp_spines
    out["cores"] = topos["ecmp"].ecmp_cores
    return out


def fabric_sources(
    cal: Calibration, data_dir: Path, types: tuple[JobType, ...], measured: np.ndarray
) -> dict[str, Any]:
    """The error per source with ECMP off (pooled uplinks) and on (issue 33 item 4)."""
    model = AnalyticModel(cal)
    table = load_deepshare(data_dir)
    out: dict[str, Any] = {}
    for fabric, opts in FABRICS.items():
        rows = deepshare_spread(model, dict(table.isolated), opts)
        faster = [r for r in rows if r["measured"] > 1.0]
        pred = predict_pair_ratios(model, types, opts)
        out[fabric] = {
            "spread_rows": rows,
            "spread_mae": float(np.mean([abs(r["predicted"] - r["measured"]) for r in rows])),
            "spread_faster_n": len(faster),
            "spread_faster_max_predicted": max((r["predicted"] for r in faster), default=0.0),
            "pairs_mae": score(pred, measured).mae,
        }
    out["crux"] = crux_example(cal, data_dir)
    return out


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def render(report: dict[str, Any]) -> str:
    """The report as markdown tables."""
    out = [
        f"DeepShare pairs: {report['pairs']} (mean ratio {report['measured_mean']:.3f}, "
        f"min {report['measured_min']:.3f})",
        "",
        "| predictor | alpha | MAE | Spearman | half-out MAE (sd) | half-out Spearman "
        "| half-out const MAE | LOMO MAE | LOMO Spearman | LOMO const MAE |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        half = _f(r.get("cv_half_mae"))
        if "cv_half_mae_sd" in r:
            half += f" ({r['cv_half_mae_sd']:.3f})"
        cells = [
            r["predictor"],
            _f(r["alpha"], "{:.3g}"),
            _f(r["mae"]),
            _f(r["spearman"]),
            half,
            _f(r.get("cv_half_spearman")),
            _f(r.get("cv_half_trivial_mae")),
            _f(r.get("lomo_mae")),
            _f(r.get("lomo_spearman")),
            _f(r.get("lomo_trivial_mae")),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        f"Row-mean oracle (36 per-type means read off the matrix itself): MAE "
        f"{report['row_mean_oracle_mae']:.3f}",
        "",
        "| held-out model (LOMO) | duty MAE | flow-count MAE |",
        "|---|---|---|",
    ]
    duty = next(r for r in report["rows"] if r["predictor"].startswith("duty"))
    flows = next(r for r in report["rows"] if r["predictor"].startswith("SJF"))
    for m, v in duty["lomo_mae_per_model"].items():
        out.append(f"| {m} | {v:.3f} | {flows['lomo_mae_per_model'][m]:.3f} |")
    out += [
        "",
        "| model | mean error as the job measured | mean error as the neighbour |",
        "|---|---|---|",
    ]
    for m, v in report["bias_by_model"].items():
        out.append(f"| {m} | {v['as_measured_bias']:+.3f} | {v['as_neighbour_bias']:+.3f} |")
    out += [
        "",
        "| scale prior weight | isolated rms log err | overhead_s | Transformer-XL scale "
        "| alpha | pairs MAE | pairs Spearman |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in report["scale_prior_ablation"]:
        out.append(
            f"| {a['prior_weight']:g} | {a['isolated_rms_log_error']:.3f} | {a['overhead_s']:.3g} "
            f"| {a['scale_transformer_xl']:.3g} | {a['alpha']:.3g} | {a['pairs_mae']:.3f} "
            f"| {a['pairs_spearman']:.3f} |"
        )
    iso = report["isolated"]
    out += [
        "",
        f"Isolated throughputs (36 types): rms log error {iso['rms_log_error']:.3f}, "
        f"median |error| {iso['median_abs_rel_error']:.1%}, "
        f"max {iso['max_abs_rel_error']:.1%}; max by model: "
        + ", ".join(f"{m} {v:.0%}" for m, v in iso["max_abs_rel_error_by_model"].items()),
        "",
        f"Pollux: effective network {report['pollux']['nic_effective_gbps']:.2f} GB/s "
        f"(nominal {report['pollux']['nic_nominal_gbps']:.2f}); rms log error of sync time: "
        + ", ".join(f"{m} {v:.2f}" for m, v in report["pollux"]["rms_log_error"].items()),
        "",
        "Spread against consolidated, Pollux, held out (per model: network bandwidth fitted on "
        "the other five, gradient and compute from its own one-node rows only; the step-time "
        "ratio of each GPU count on more nodes over the fewest nodes, same local batch):",
        "",
        "| Pollux model | cases | mean abs relative error of the slowdown |",
        "|---|---:|---:|",
    ]
    ps = report["pollux_spread"]
    for m, v in ps["by_model"].items():
        out.append(f"| {m} | {v['n']} | {v['mean_abs_rel_error']:.1%} |")
    out += [
        f"| all | {ps['n']} | {ps['mean_abs_rel_error']:.1%} (constant: "
        f"{ps['constant_mean_abs_rel_error']:.1%}) |",
        "",
        f"Measured mean slowdown {ps['measured_mean']:.2f}, predicted {ps['predicted_mean']:.2f}.",
        "",
        "Is each DeepShare profile determined? Its own rms log error of isolated throughput "
        "when its compute_s is held at a share of its iteration time (smallest type), "
        "everything else refitted:",
        "",
        "| DeepShare model | shipped share | shipped fit | 5% | 10% | 25% | 50% "
        "| determined by its throughputs | compute_s in the calibration |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    params = report["parameters"]
    for m, e in report["compute_share_scan"].items():
        fixed = [e[k] for k in ("0.05", "0.1", "0.25", "0.5")]
        determined = max(fixed) - min(fixed) > 0.02
        out.append(
            f"| {m} | {e['-2.0']:.2f} | {e['-1.0']:.3f} | "
            + " | ".join(f"{v:.3f}" for v in fixed)
            + f" | {'yes' if determined else 'no'} | {params[m]['compute_s']['status']} |"
        )
    out += [
        "",
        "Every fitted parameter: its status (determined / weakly determined / constrained) and "
        "whether it sits at a fit bound (the calibration JSON's `fit.parameters` holds the "
        "reasons):",
        "",
        "| profile | parameter | value | at a bound | status |",
        "|---|---|---:|---|---|",
    ]
    for m, ps in params.items():
        for name, e in ps.items():
            out.append(
                f"| {m} | {name} | {e['value']:.4g} | {'yes' if e['at_bound'] else 'no'} "
                f"| {e['status']} |"
            )
    out += [
        "",
        "| profile | compute_s | grad_gb |",
        "|---|---|---|",
    ]
    for name, p in report["profiles"].items():
        out.append(f"| {name} | {p['compute_s']:.4g} | {p['grad_gb']:.4g} |")
    out += ["", *render_fabric(report)]
    out += [
        "",
        f"alpha {report['alpha']:.4g} (duty), {report['alpha_flows']:.4g} (flows); overhead_s "
        f"{report['overhead_s']:.3g}; fit {report['fit_seconds']:.1f} s, all "
        f"{report['total_seconds']:.1f} s",
    ]
    return "\n".join(out)


def render_fabric(report: dict[str, Any]) -> list[str]:
    """The error per source with pooled uplinks and with ECMP (``fabric_sources``)."""
    fab, ps = report["fabric"], report["pollux_spread"]
    pooled, ecmp = fab["pooled"], fab["ecmp"]
    crux = fab["crux"]
    lead = crux["rows"][0]
    out = [
        "Error per source, pooled uplinks (ECMP off) and ECMP (on):",
        "",
        "| source | what the model predicts | determines | error, ECMP off | error, ECMP on |",
        "|---|---|---|---:|---:|",
        f"| DeepShare spread ratios ({len(pooled['spread_rows'])}) | isolated throughput on n "
        "nodes / on the fewest | profiles (compute_s, grad_gb; stage 1, in sample) "
        f"| MAE {pooled['spread_mae']:.3f} | MAE {ecmp['spread_mae']:.3f} |",
        f"| DeepShare pair table ({report['pairs']}) | shared / isolated ratio | alpha "
        f"| MAE {pooled['pairs_mae']:.3f} | MAE {ecmp['pairs_mae']:.3f} |",
        f"| Pollux sync_time by spread ({ps['n']}) | step time on more nodes / fewest, held out "
        "| network bandwidth (other models), gradient (own one-node rows) "
        f"| {ps['mean_abs_rel_error']:.1%} | {ps['mean_abs_rel_error']:.1%} (no topology) |",
        f"| Crux's example (GPT as {lead['gpt_proxy']}) | GPT's iteration-time increase "
        f"(measured +{crux['measured']:.0%}) | nothing (a check of alpha and duty cycles) "
        f"| +{lead['pooled']['mean']:.1%} | +{lead['ecmp']['mean_colliding']:.1%} where the "
        f"flows collide ({lead['ecmp']['share_colliding']:.1%} of draws), "
        f"+{lead['ecmp']['mean']:.1%} mean |",
        "",
        "DeepShare's spread ratios above 1 (faster spread than packed): "
        f"{pooled['spread_faster_n']} of {len(pooled['spread_rows'])}; "
        "the largest predicted among them "
        f"{pooled['spread_faster_max_predicted']:.3f}.",
        "",
        "| DeepShare type | fewest nodes | measured ratio | predicted, ECMP off | on |",
        "|---|---:|---:|---:|---:|",
    ]
    for a, b in zip(pooled["spread_rows"], ecmp["spread_rows"], strict=True):
        out.append(
            f"| {a['model']},{a['gpus']},{a['nodes']} | {a['fewest']} | {a['measured']:.3f} "
            f"| {a['predicted']:.3f} | {b['predicted']:.3f} |"
        )
    out += [
        "",
        f"Crux's example on {crux['topology']} (1:1; ECMP: {crux['spines']} uplinks per ToR, "
        f"{crux['cores']} per aggregation switch), the GPT's iteration-time increase:",
        "",
        "| GPT proxy | pooled | ECMP: draws whose flows share a port | ECMP: increase there "
        "| ECMP: mean over draws |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in crux["rows"]:
        e = row["ecmp"]
        out.append(
            f"| {row['gpt_proxy']} | +{row['pooled']['mean']:.1%} | {e['share_colliding']:.1%} "
            f"| +{e['mean_colliding']:.1%} | +{e['mean']:.1%} |"
        )
    return out


def _json_safe(x: Any) -> Any:
    """NaN (Spearman of a constant) becomes null, so the output is strict JSON."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared/data folder")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    report = run(args.data)
    if args.json:
        print(json.dumps(_json_safe(report), indent=2))
    else:
        print(render(report))


if __name__ == "__main__":
    main()
