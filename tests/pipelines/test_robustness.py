"""Robust by test (issue 23 item 5): a package against its base on cluster sizes and
fabrics it was not trained on (``pipelines.residual.robustness``), and the gate that refuses
one worse than 1.02x its base on any (``evaluation.gates.check_robustness``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from linkwise.cli import main
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.evaluation.gates import check_robustness
from linkwise.models.packaging import write_package
from linkwise.models.residual import Deferral, topology_signature, write_residual_package
from linkwise.pipelines.residual import robustness, robustness_topologies
from linkwise.policies.spec import PolicySpec

CFG = MdpConfig(k_slots=3)
SPEC = make_spec(CFG)
TRAINED = "2x8"


def _network(path: Path) -> str:
    """A real TorchScript network that rates waiting far above every start."""
    import torch

    class Waits(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(x.shape[0], SPEC.n_actions)
            out[:, CFG.wait_action] = 5.0
            return out + 0.0 * x.sum(dim=1, keepdim=True)

    traced = torch.jit.trace(Waits(), torch.zeros(2, SPEC.dim))  # type: ignore[no-untyped-call]
    traced.save(str(path))
    return "q"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("robust")
    predictor = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=16))
    learned = write_package(root / "learned", SPEC, {"hash": "test"}, export=_network,
                            algo="test", versions={}, predictor=predictor)  # fmt: skip
    deferral = Deferral(topologies=(topology_signature(from_spec(TRAINED)),))
    return write_residual_package(learned, root / "residual", base="sjf_bco", margin=0.0,
                                  deferral=deferral)  # fmt: skip


def test_the_topologies_are_three_sizes_by_two_fabrics() -> None:
    topos = robustness_topologies("16x8,leaf=4", oversub=4)
    assert topos == {
        "0.5x": "8x8,leaf=4",
        "0.5x-oversub4": "8x8,leaf=4,oversub=4",
        "1x": "16x8,leaf=4",
        "1x-oversub4": "16x8,leaf=4,oversub=4",
        "2x": "32x8,leaf=4",
        "2x-oversub4": "32x8,leaf=4,oversub=4",
    }
    signatures = {topology_signature(from_spec(t)) for t in topos.values()}
    assert len(signatures) == 6  # every case is a cluster the signature tells apart


def test_a_residual_that_defers_off_its_cluster_is_its_base_there(package: Path) -> None:
    jobs = synthetic.generate(80, seed=2, max_gpus=16, load_scale=8.0)
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, min_jobs=5)[:1]
    trained = [topology_signature(from_spec(TRAINED))]
    rows = robustness(str(package), PolicySpec.parse("sjf_bco"), robustness_topologies(TRAINED),
                      windows, [0],
                      predictor=RuntimePredictor.fit(jobs), trained=trained)  # fmt: skip
    by_name = {r.name: r for r in rows}
    assert by_name["1x"].trained_on and not by_name["1x-oversub4"].trained_on
    off = [r for r in rows if not r.trained_on]
    assert len(off) == 5
    for r in off:  # deferred at every decision: exactly the base
        assert r.avg_jct_s == r.base_avg_jct_s and r.deviations_per_1000 == 0.0
    assert by_name["1x"].deviations_per_1000 is not None and by_name["1x"].deviations_per_1000 > 0
    report = check_robustness("pkg", {r.name: (r.avg_jct_s, r.base_avg_jct_s) for r in off})
    assert report.passed, report.format()


def test_the_gate_refuses_a_package_worse_than_1_02x_on_one_case() -> None:
    cases = {f"c{i}": (100.0, 100.0) for i in range(5)}
    assert check_robustness("pkg", cases).passed
    cases["c3"] = (102.5, 100.0)
    report = check_robustness("pkg", cases)
    assert not report.passed
    failed = [c.name for c in report.checks if not c.passed]
    assert failed == ["robust_c3"]
    assert not check_robustness("pkg", dict(list(cases.items())[:2])).passed  # too few cases
    assert check_robustness("pkg", {**cases, "c3": (102.0, 100.0)}).passed  # 1.02 itself


def test_linkwise_robust_reports_the_gate(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["robust", str(package), "--cluster", TRAINED, "--jobs", "80", "--load-scale", "8",
            "--window-h", "6", "--windows", "1", "--json"]  # fmt: skip
    rc = main(args)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["base"] == "sjf_bco" and out["gate"]["passed"]
    assert len(out["cases"]) == 6
    assert np.isclose(sum(c["trained_on"] for c in out["cases"]), 1)
    assert main(["robust", str(package.parent / "missing")]) == 2
