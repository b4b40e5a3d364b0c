"""One policy specification: heuristics with typed parameters, model sources, pinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from linkwise.models.build import pinned, registry_version, token
from linkwise.policies import heuristics as heur
from linkwise.policies.compose import convert_value
from linkwise.policies.composed import Composed
from linkwise.policies.heuristics import heuristic_parameters, policy_names
from linkwise.policies.parts.orders import Las
from linkwise.policies.spec import PolicySpec, split_specs


def test_heuristic_parameters_are_parsed_by_their_declared_type() -> None:
    spec = PolicySpec.parse("sjf_bco:kappa=4,lam=1.5")
    assert spec.params == (("kappa", 4), ("lam", 1.5))
    assert spec.build() == heur.sjf_bco(kappa=4, lam=1.5)
    assert PolicySpec.parse("sjf_bco:kappa=none").build() == heur.sjf_bco(kappa=None)
    assert PolicySpec.parse("backfill:max_job_test=200").build() == heur.backfill(max_job_test=200)
    tiresias = PolicySpec.parse("tiresias_las:thresholds=3600;36000").build()
    assert isinstance(tiresias, Composed) and isinstance(tiresias.order, Las)
    assert tiresias.order.thresholds == (3600.0, 36000.0)
    assert PolicySpec.parse(" sjf_bco:lam=2 ").describe() == "sjf_bco:lam=2.0"
    assert not PolicySpec.parse("fifo").is_model


def test_booleans_are_read_as_booleans_not_as_non_empty_strings() -> None:
    for text, value in (("false", False), ("no", False), ("0", False), ("true", True)):
        assert convert_value(bool, text) is value
    with pytest.raises(ValueError, match="true or false"):
        convert_value(bool, "maybe")
    assert convert_value(int | None, "none") is None and convert_value(int | None, "3") == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nosuch", "unknown policy"),
        ("sjf_bco:gamma=1", "no parameter 'gamma'"),
        ("sjf_bco:kappa=four", "kappa='four'"),
        ("backfill:max_job_test=1.5", "expected an integer"),
        ("sjf_bco:lam", "expected key=value"),
        ("", "empty"),
    ],
)
def test_unknown_or_ill_typed_parameters_are_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolicySpec.parse(text)


def test_every_heuristic_declares_command_line_parameters() -> None:
    for name in policy_names(predictions=True):
        PolicySpec.parse(name).build()  # defaults build
        for key, hint in heuristic_parameters(name).items():
            assert key != "name" and hint is not None


def test_model_specs_carry_their_source_and_pin_nothing_local(tmp_path: Path) -> None:
    spec = PolicySpec.parse("model:./pkg", cwd=tmp_path)
    assert spec.is_model and spec.source is not None and spec.source.kind == "path"
    assert registry_version(spec) is None and pinned(spec) == spec
    assert token(spec) == "missing"  # no package there (yet)
    uri = PolicySpec.parse("model:models:/linkwise-policy/4", cwd=tmp_path)
    assert registry_version(uri) == "4" and pinned(uri) == uri
    assert uri.describe() == "model:models:/linkwise-policy/4"


def test_a_list_of_specs_keeps_each_heuristics_parameters_together() -> None:
    assert split_specs("sjf_bco:kappa=4,lam=1.5,backfill, fifo") == [
        "sjf_bco:kappa=4,lam=1.5",
        "backfill",
        "fifo",
    ]
    assert split_specs("tiresias_las:thresholds=3600;36000,order=submit,model:champion") == [
        "tiresias_las:thresholds=3600;36000,order=submit",
        "model:champion",
    ]
    # a model source never swallows what follows it
    assert split_specs("model:/srv/pkg#sha256=" + "a" * 64 + ",random:seed=3") == [
        "model:/srv/pkg#sha256=" + "a" * 64,
        "random:seed=3",
    ]
    assert [PolicySpec.parse(s).describe() for s in split_specs("sjf_bco:kappa=4,lam=1.5")] == [
        "sjf_bco:kappa=4,lam=1.5"
    ]


def test_qssf_and_the_oracles_parse_with_sjf_bco_parameters_and_say_what_they_are() -> None:
    q = PolicySpec.parse("qssf:kappa=4,lam=1.5")
    assert q.build() == heur.qssf(kappa=4, lam=1.5)
    assert q.needs_predictions and not q.is_oracle and q.describe() == "qssf:kappa=4,lam=1.5"
    o = PolicySpec.parse("sjf_bco_oracle:lam=2")
    assert o.build() == heur.sjf_bco_oracle(lam=2.0) and o.is_oracle and not o.needs_predictions
    assert PolicySpec.parse("srtf_oracle").is_oracle
    assert not PolicySpec.parse("sjf_bco").is_oracle
    assert PolicySpec.parse("model:./pkg").needs_predictions
    with pytest.raises(ValueError, match="srtf_oracle has no parameter"):
        PolicySpec.parse("srtf_oracle:order=2")


def test_a_learned_spec_is_built_only_by_the_loader_it_is_given(tmp_path: Path) -> None:
    """``policies`` cannot load a package: ``build`` asks for the loader (``models.build``)
    and hands it the parsed source, once."""
    spec = PolicySpec.parse("model:./pkg", cwd=tmp_path)
    with pytest.raises(ValueError, match=r"models\.build\.build_policy"):
        spec.build()
    seen = []
    fifo = heur.fifo()

    def loader(source: object, model: object) -> Composed:
        seen.append(source)
        return fifo

    assert spec.build(learned=loader) is fifo and seen == [spec.source]


def test_a_lookahead_parses_its_base_and_alternatives_once() -> None:
    spec = PolicySpec.parse("lookahead:base=sjf_bco:lam=2,alts=fifo;qssf,n=2")
    assert spec.kind == "search" and spec.needs_predictions and not spec.is_oracle
    assert spec.inner == (
        PolicySpec.parse("sjf_bco:lam=2"),
        PolicySpec.parse("fifo"),
        PolicySpec.parse("qssf"),
    )
    with pytest.raises(ValueError, match="no parameter"):
        PolicySpec.parse("lookahead:base=fifo,alts=sjf_bco:gamma=1")
