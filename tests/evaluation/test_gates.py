"""Gates accept and refuse on constructed evidence; thresholds come from TOML."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from linkwise.evaluation.gates import (
    ChallengerEvidence,
    ChallengerGates,
    OpeEvidence,
    ShadowEvidence,
    ShadowGates,
    check_challenger,
    check_shadow,
    load_gates,
    ope_evidence,
)
from linkwise.evaluation.stats import RatioCI
from linkwise.policies.spec import PolicySpec

CFG = ChallengerGates(margin_vs_champion=0.02, margin_vs_heuristic=0.02, require_ci=True,
                      p99_tolerance=0.0, latency_budget_ms=50.0)  # fmt: skip


def _r(base: str, stat: str, ratio: float, low: float, high: float) -> RatioCI:
    return RatioCI("model:challenger", base, stat, ratio, low, high, 0.95, 6, 1.0, 1000, 0)


def _good() -> ChallengerEvidence:
    return ChallengerEvidence(
        challenger="model:challenger",
        version="2",
        champion="model:champion",
        avg_vs_champion=_r("model:champion", "avg", 0.90, 0.85, 0.95),
        p99_vs_champion=_r("model:champion", "p99", 0.97, 0.9, 1.05),
        best_heuristic="sjf_bco",
        avg_vs_heuristic=_r("sjf_bco", "avg", 0.95, 0.92, 0.98),
        p99_vs_heuristic=_r("sjf_bco", "p99", 1.0, 0.95, 1.04),
        ope=OpeEvidence(estimate=-100.0, behaviour_return=-120.0, spread=5.0),
        latency_ms_p99=12.0,
        masked_actions=0,
    )


def _failed(report: object) -> set[str]:
    return {c.name for c in report.checks if not c.passed}  # type: ignore[attr-defined]


def test_good_evidence_passes_every_gate() -> None:
    rep = check_challenger(_good(), CFG)
    assert rep.passed, rep.format()
    assert len(rep.checks) == 7
    assert rep.metrics()["better_than_champion.ratio"] == pytest.approx(0.90)
    assert "PASSED" in rep.format()


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        # 1% better than the champion: under the 2% margin
        ({"avg_vs_champion": _r("model:champion", "avg", 0.99, 0.97, 0.995)},
         {"better_than_champion"}),
        # beyond the margin, but the interval reaches 1: not shown to be better
        ({"avg_vs_heuristic": _r("sjf_bco", "avg", 0.97, 0.90, 1.01)},
         {"better_than_best_heuristic"}),
        ({"p99_vs_champion": _r("model:champion", "p99", 1.01, 0.95, 1.08)}, {"p99_vs_champion"}),
        ({"p99_vs_heuristic": _r("sjf_bco", "p99", 1.2, 1.1, 1.3)}, {"p99_vs_best_heuristic"}),
        ({"ope": OpeEvidence(estimate=-130.0, behaviour_return=-120.0, spread=5.0)},
         {"fqe_not_below_behaviour"}),
        ({"ope": None}, {"fqe_not_below_behaviour"}),
        ({"latency_ms_p99": 80.0}, {"decision_latency"}),
        ({"latency_ms_p99": math.nan}, {"decision_latency"}),
        ({"masked_actions": 1}, {"no_masked_actions"}),
        ({"masked_actions": None}, {"no_masked_actions"}),
        ({"best_heuristic": None}, {"better_than_best_heuristic", "p99_vs_best_heuristic"}),
        ({"avg_vs_champion": None}, {"better_than_champion"}),
    ],
)  # fmt: skip
def test_each_gate_refuses_on_its_own(change: dict[str, object], failing: set[str]) -> None:
    rep = check_challenger(dataclasses.replace(_good(), **change), CFG)  # type: ignore[arg-type]
    assert not rep.passed
    assert _failed(rep) == failing
    assert "REFUSED" in rep.format()


def test_fqe_is_compared_with_its_own_estimate_of_the_behaviour_when_given() -> None:
    # FQE underestimates everything here: the observed return would let anything pass
    biased = OpeEvidence(
        estimate=-10.0, behaviour_return=-120.0, spread=1.0, behaviour_estimate=-5.0
    )
    assert biased.reference == -5.0
    report = check_challenger(dataclasses.replace(_good(), ope=biased), CFG)
    assert _failed(report) == {"fqe_not_below_behaviour"}
    assert "behaviour FQE estimate" in report.format()
    fair = dataclasses.replace(biased, estimate=-4.5)
    assert check_challenger(dataclasses.replace(_good(), ope=fair), CFG).passed
    table = {"m": {"estimate": 1.0, "behaviour_return": 0.5, "behaviour_estimate": 0.9}}
    assert ope_evidence(table, "m") == OpeEvidence(1.0, 0.5, 0.0, 0.9)


def test_missing_fqe_says_missing_evidence() -> None:
    rep = check_challenger(dataclasses.replace(_good(), ope=None), CFG)
    (fqe,) = [c for c in rep.checks if c.name == "fqe_not_below_behaviour"]
    assert "missing evidence" in fqe.reason


def test_no_champion_yet_passes_the_champion_gates_only() -> None:
    ev = dataclasses.replace(_good(), champion=None, avg_vs_champion=None, p99_vs_champion=None)
    rep = check_challenger(ev, CFG)
    assert rep.passed
    assert any("no champion yet" in r for r in rep.reasons)


def test_tolerances_loosen_the_gates() -> None:
    ev = dataclasses.replace(
        _good(),
        ope=OpeEvidence(estimate=-124.0, behaviour_return=-120.0, spread=5.0),
        avg_vs_heuristic=_r("sjf_bco", "avg", 0.97, 0.90, 1.01),
    )
    assert _failed(check_challenger(ev, CFG)) == {
        "fqe_not_below_behaviour",
        "better_than_best_heuristic",
    }
    loose = dataclasses.replace(CFG, fqe_tolerance=1.0, require_ci=False)
    assert check_challenger(ev, loose).passed


def test_ope_mapping_lookup() -> None:
    ope = {"model:challenger": {"estimate": 1.0, "behaviour_return": 0.5, "spread": 0.1}}
    assert ope_evidence(ope, "model:challenger") == OpeEvidence(1.0, 0.5, 0.1)
    assert ope_evidence(ope, "other") is None
    assert ope_evidence(None, "model:challenger") is None


def _shadow(**kw: object) -> ShadowEvidence:
    base = ShadowEvidence(version="3", cycles=500, since=0.0, until=3600.0, jobs=40,
                          sim_avg_jct_s=900.0, actual_avg_jct_s=1000.0, sim_p99_jct_s=5000.0,
                          actual_p99_jct_s=5200.0)  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_shadow_gate() -> None:
    cfg = ShadowGates(min_cycles=100, min_jobs=20)
    assert check_shadow(_shadow(), cfg).passed
    assert _failed(check_shadow(_shadow(cycles=99), cfg)) == {"shadow_cycles"}
    assert _failed(check_shadow(_shadow(jobs=3), cfg)) == {"replayed_jobs"}
    assert _failed(check_shadow(_shadow(sim_avg_jct_s=1100.0), cfg)) == {"counterfactual_avg_jct"}
    assert _failed(check_shadow(_shadow(sim_p99_jct_s=6000.0), cfg)) == {"counterfactual_p99_jct"}
    # no evidence at all (nothing logged): every check fails, none passes by default
    empty = _shadow(cycles=0, jobs=0, sim_avg_jct_s=math.nan, actual_avg_jct_s=math.nan,
                    sim_p99_jct_s=math.nan, actual_p99_jct_s=math.nan)  # fmt: skip
    assert _failed(check_shadow(empty, cfg)) == {c.name for c in check_shadow(empty, cfg).checks}


def test_gates_toml(tmp_path: Path) -> None:
    shipped = load_gates()
    assert shipped.challenger.max_masked_actions == 0
    assert shipped.challenger.require_ci is True
    assert shipped.shadow.min_cycles > 0
    f = tmp_path / "g.toml"
    f.write_text("[challenger]\nmargin_vs_champion = 0.1\n[shadow]\nmin_cycles = 7\n")
    g = load_gates(f)
    assert g.challenger.margin_vs_champion == 0.1 and g.shadow.min_cycles == 7
    assert g.challenger.latency_budget_ms == ChallengerGates().latency_budget_ms
    f.write_text("[challenger]\nmargn = 0.1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_gates(f)
    f.write_text("[challenger]\nmargin_vs_champion = -0.1\n")
    with pytest.raises(ValueError, match="non-negative"):
        load_gates(f)
    f.write_text("[promotion]\n")
    with pytest.raises(ValueError, match="unknown sections"):
        load_gates(f)


def test_an_oracle_is_never_the_gate_reference() -> None:
    ev = dataclasses.replace(
        _good(),
        best_heuristic="srtf_oracle",
        best_heuristic_oracle=PolicySpec.parse("srtf_oracle").is_oracle,
        avg_vs_heuristic=_r("srtf_oracle", "avg", 0.9, 0.85, 0.95),
        p99_vs_heuristic=_r("srtf_oracle", "p99", 0.9, 0.85, 0.95),
    )
    report = check_challenger(ev, CFG)
    assert _failed(report) == {"better_than_best_heuristic", "p99_vs_best_heuristic"}
    assert all("oracle" in c.reason for c in report.checks if not c.passed)


def test_the_reference_candidates_are_every_non_oracle_heuristic_listed() -> None:
    from linkwise.evaluation.gates import same_information_heuristics
    from linkwise.policies.heuristics import ORACLE_POLICIES, POLICIES

    names = same_information_heuristics()
    assert {"qssf", "qssf_preemptive", "tiresias_consolidated", "deepshare"} <= set(names)
    assert set(names) == set(POLICIES) - ORACLE_POLICIES
    without = same_information_heuristics(predictions=False)
    assert "qssf" not in without and "qssf_preemptive" not in without and "deepshare" in without


def test_a_composed_oracle_is_never_the_gate_reference() -> None:
    spec = "compose:order=true_remaining,placement=bounded,preempt=priority"
    ev = dataclasses.replace(
        _good(),
        best_heuristic=spec,
        best_heuristic_oracle=PolicySpec.parse(spec).is_oracle,
        avg_vs_heuristic=_r(spec, "avg", 0.9, 0.85, 0.95),
        p99_vs_heuristic=_r(spec, "p99", 0.9, 0.85, 0.95),
    )
    assert _failed(check_challenger(ev, CFG)) == {
        "better_than_best_heuristic",
        "p99_vs_best_heuristic",
    }
    same_info = "compose:order=pred_remaining,placement=bounded,preempt=priority"
    ev = dataclasses.replace(
        ev, best_heuristic=same_info, best_heuristic_oracle=PolicySpec.parse(same_info).is_oracle
    )
    assert check_challenger(ev, CFG).passed
