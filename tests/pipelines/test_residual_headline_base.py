"""``benchmarks/residual_headline.py``'s base read from a frontier run (``--base-from``) and
from a finished run's results (``--ship-from``): both must give a ``BaseChoice`` whose spec is
a ``PolicySpec``, so the run's manifest serialises (it held a bare string before)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from linkwise.policies.spec import PolicySpec

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "residual_headline.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("residual_headline", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_base_from_frontier_gives_a_policy_spec(tmp_path: Path) -> None:
    frontier = tmp_path / "frontier.json"
    frontier.write_text(
        json.dumps(
            {
                "best_on_validation": "qssf_preemptive",
                "validation": {
                    "summary": [
                        {"policy": "qssf_preemptive", "avg_jct_s": 3600.0},
                        {"policy": "backfill", "avg_jct_s": 7200.0},
                        {"policy": "lookahead", "avg_jct_s": 3000.0},
                        {"policy": "oracle_sjf", "avg_jct_s": 1000.0, "oracle": True},
                    ]
                },
            }
        )
    )
    base = _script().base_from_frontier(frontier)
    assert isinstance(base.spec, PolicySpec)
    assert base.spec.label == "qssf_preemptive"
    assert base.avg_jct_s == 3600.0
    assert set(base.figures) == {"qssf_preemptive", "backfill"}  # oracle, search left out
    assert json.loads(json.dumps(base.to_json()))["base"] == "qssf_preemptive"
