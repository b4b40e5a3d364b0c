"""What ``linkwise calibrate --db`` prints of a contention fit (``render_fit_text``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linkwise.datasets.contention_fit.result import ClusterFit

__all__ = ["render_fit_text"]


def render_fit_text(fit: ClusterFit) -> str:
    """What ``linkwise calibrate --db`` prints: the data, every parameter with its status,
    the validation."""
    cal = fit.calibration
    d = cal.fit["data"]
    v = cal.fit["validation"]
    lines = [
        f"fitted on {d['runs_summarized']} runs ({d['job_hours']:.1f} job-hours over "
        f"{d['hours']:.1f} h; {d['runs_fitted']} in the training part, {d['observations']} "
        f"activity means), rms log residual {d['rms_log_residual']:.3f}",
        f"samples: {d['samples']['activity_used']} used, {d['samples']['activity_shared']} "
        f"shared, {d['samples']['activity_bad']} bad, {d['samples']['activity_missing']} "
        f"missing (bad and missing left out); {d['runs_without_activity']} runs without "
        f"enough activity, {d['runs_unknown_nodes']} on unknown nodes, "
        f"{d['runs_fallback_profile']} with the fallback profile",
        f"time unit: {fit.reference}'s isolated iteration",
        "",
        f"{'parameter':44s} {'value':>11s}  status",
    ]
    for group, entries in fit.parameters.items():
        for name, e in entries.items():
            if "status" not in e:
                continue
            lines.append(
                f"{group + '.' + name:44s} {e['value']:11.4g}  {e['status']}: {e['basis']}"
            )
    drop, act = v["drop"], v["activity"]

    def fmt(s: Mapping[str, Any]) -> str:
        mae = "n/a" if s["mae"] is None else f"{s['mae']:.4f}"
        rho = "n/a" if s["spearman"] is None else f"{s['spearman']:.3f}"
        return f"MAE {mae}, Spearman {rho} (n={s['n']})"

    def const(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    lines += [
        "",
        f"validation on {v['runs']} later runs ({v['without_profile']} without a profile "
        "from the training part, left out):",
        f"  activity means: fitted {fmt(act['fit'])}; shipped alpha/overhead "
        f"{fmt(act['shipped'])}; constant MAE {const(act['constant_mae'])}",
        f"  drop beside others: fitted {fmt(drop['fit'])}; shipped {fmt(drop['shipped'])}; "
        f"constant MAE {const(drop['constant_mae'])}",
    ]
    return "\n".join(lines) + "\n"
