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
    load_deepshare,
    load_pollux,
    ratio_matrix,
    table_types,
)
from linkwise.cluster.calibration.pairs import fit_alpha, pair_terms, predict_pair_ratios
from linkwise.cluster.calibration.pollux import pollux_spread_checks
from linkwise.cluster.calibration.validation import cross_validate, score
from linkwise.cluster.contention import AnalyticModel

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
    out += [
        "",
        f"alpha {report['alpha']:.4g} (duty), {report['alpha_flows']:.4g} (flows); overhead_s "
        f"{report['overhead_s']:.3g}; fit {report['fit_seconds']:.1f} s, all "
        f"{report['total_seconds']:.1f} s",
    ]
    return "\n".join(out)


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
