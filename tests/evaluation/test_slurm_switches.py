"""The model's side of ``evaluation.slurm_switches`` without a Slurm: ``backfill_switches`` on
each case's state gives the outcomes the live test expects of Slurm (its blockers started 3 s
before the job, everything watched for 60 s), and outcomes compare as documented."""

from __future__ import annotations

from pathlib import Path

from linkwise.cluster.topology.load import load_topology
from linkwise.evaluation.slurm_switches import (
    CASES,
    TOLERANCE_S,
    Outcome,
    model_outcomes,
    switches_arg,
)


def test_the_model_waits_for_one_leaf_spreads_after_t_and_reserves(tmp_path: Path) -> None:
    # the local Slurm's configuration with LINKWISE_SLURM_TOPOLOGY=tree (scripts/local-slurm)
    (tmp_path / "slurm.conf").write_text(
        "TopologyPlugin=topology/tree\nGresTypes=gpu\n"
        "NodeName=gpu[01-04] CPUs=8 RealMemory=16000 Gres=gpu:4\n"
        "PartitionName=gpu Nodes=gpu[01-04] Default=YES\n"
    )
    (tmp_path / "topology.conf").write_text(
        "SwitchName=s1 Nodes=gpu[01-02]\nSwitchName=s2 Nodes=gpu[03-04]\n"
        "SwitchName=s0 Switches=s[1-2]\n"
    )
    topo = load_topology(str(tmp_path))
    assert [n.name for n in topo.nodes] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert topo.leaf_names == ("s1", "s2")
    got = {}
    for case in CASES:
        blockers = [(b, -3.0) for b in case.blockers]
        submits = [0.0] if case.later is None else [0.0, 0.0]
        got[case.name] = model_outcomes(topo, case, blockers, submits, 60.0)
    s2 = ("gpu03", "gpu04")
    assert got["a_fits"] == (Outcome(0.0, s2),)
    assert got["b_waits"] == (Outcome(7.0, s2),)  # gpu03's blocker ends 10 s after its start
    assert got["c_spreads"] == (Outcome(30.0, ("gpu02", "gpu04")),)  # at T, over both leaves
    assert got["d_reserves"] == (Outcome(12.0, s2), Outcome(None, ()))  # gpu04 kept for it


def test_outcomes_agree_on_the_same_nodes_within_the_tolerance_or_both_not_started() -> None:
    at = Outcome(10.0, ("gpu03", "gpu04"))
    assert at.agrees(Outcome(10.0 + TOLERANCE_S, at.nodes))
    assert not at.agrees(Outcome(11.0 + TOLERANCE_S, at.nodes))
    assert not at.agrees(Outcome(10.0, ("gpu02", "gpu04")))
    assert not at.agrees(Outcome(None, ()))
    assert Outcome(None, (), ("Priority",)).agrees(Outcome(None, ()))
    assert switches_arg(1, 30) == "--switches=1@0:30" and switches_arg(2, 90) == "--switches=2@1:30"
