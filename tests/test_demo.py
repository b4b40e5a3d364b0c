"""The demo pipeline end to end on the CI budget (the same code path as ``linkwise demo``,
smaller numbers): the history lands in the accounting tables, the dataset is built only from
the first part, a model is registered with aliases, the report folder has its Markdown and
plots, and the shadow loop left decisions in DuckDB."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from linkwise.datasets.store import open_store
from linkwise.pipelines.demo import DemoResult, run_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    out = tmp_path_factory.mktemp("demo")
    return run_demo(out, experiment="ci", progress=False)


def test_history_is_stored_as_accounting(demo: DemoResult) -> None:
    with closing(open_store(demo.db)) as con:
        jobs, nodes, with_nodes = con.execute(
            "SELECT count(*), (SELECT count(*) FROM nodes WHERE cluster = 'demo'), "
            "(SELECT count(DISTINCT job_id) FROM job_nodes WHERE cluster = 'demo') "
            "FROM jobs WHERE cluster = 'demo' AND state = 'COMPLETED' AND settled"
        ).fetchone()  # type: ignore[misc]
    assert jobs == demo.history["jobs"] > 100
    assert nodes == 8  # the ci budget's 8x8 cluster
    assert with_nodes == jobs  # every job has its node placement
    assert demo.history["avg_queue_s"] > 0  # queues form under backfill


def test_dataset_uses_only_the_first_part(demo: DemoResult) -> None:
    until = demo.split["until"]
    windows = demo.evaluation["windows"]
    assert windows and all(w["start"] >= until for w in windows)
    used = demo.evaluation["dataset_windows"]
    assert used and all(u["end"] <= until + 1e-6 for u in used)
    assert demo.dataset["counts"]["by_source"]["log"]["transitions"] > 0
    assert demo.dataset["counts"]["by_source"]["rollout"]["transitions"] > 0


def test_registered_model_with_aliases(demo: DemoResult) -> None:
    from linkwise.deployer.promote import current_aliases

    aliases = current_aliases(demo.tracking_uri)
    assert aliases.get("challenger") == demo.models["cql"]["version"]
    assert demo.models["bc"]["version"] != demo.models["cql"]["version"]
    # the online baseline: its own registered model, trained on the dataset's days only
    ppo = demo.models["ppo"]
    assert ppo["model_name"] == "linkwise-ppo" and ppo["steps"] >= 1024
    assert ppo["train_days"] * 86400.0 <= demo.split["until"] - demo.split["first_submit"] + 1e-6
    assert isinstance(demo.gate["passed"], bool) and demo.gate["reasons"]
    if demo.gate["passed"]:
        assert aliases.get("shadow") == demo.models["cql"]["version"]
    else:
        assert "shadow" not in aliases


def test_report_folder(demo: DemoResult) -> None:
    folder = Path(demo.evaluation["out_dir"])
    text = (folder / "report.md").read_text()
    assert "backfill" in text and "sjf_bco" in text
    assert list(folder.glob("*.png"))
    # every evaluation window starts from the history's state at its start (warm start)
    windows = demo.evaluation["windows"]
    assert windows and all("backlog" in w for w in windows)
    assert "warm start:" in text
    policies = {r["policy"] for r in demo.table}
    assert {"fifo", "backfill", "best_fit", "sjf_bco", "tiresias_las", "random"} <= policies
    # the learned policies' work-conserving guard: they cannot stall, so both are compared
    assert demo.evaluation["failed"] == {}
    assert {"BC", "CQL", "PPO"} <= policies
    guard = demo.evaluation["guard"]
    assert set(guard) == {"BC", "CQL", "PPO"}
    assert all(g["jobs"] > 0 and 0 <= g["wait_overrides"] <= g["starts"] for g in guard.values())
    base = next(r for r in demo.table if r["policy"] == "backfill")
    assert base["avg_ratio"] is None
    other = next(r for r in demo.table if r["policy"] == "sjf_bco")
    assert other["avg_low"] <= other["avg_ratio"] <= other["avg_high"]


def test_shadow_decision_log(demo: DemoResult) -> None:
    s: dict[str, Any] = demo.shadow
    with closing(open_store(demo.db)) as con:
        rows = con.execute(
            "SELECT count(*), count(*) FILTER (action = 'start'), count(DISTINCT cycle_id), "
            "min(ts), max(ts), any_value(mode), any_value(model_version) "
            "FROM decisions WHERE run_id = ?",
            [s["run_id"]],
        ).fetchone()
    assert rows is not None
    n, starts, cycles, lo, hi, mode, version = rows
    assert n == s["decisions"] > 0 and starts == s["shadow_starts"]
    assert cycles == s["cycles"] > 10
    assert mode == "shadow" and version == s["model_version"]
    # stamped in the simulated clock: inside the held-out window it ran over
    w0 = demo.evaluation["windows"][0]
    assert w0["start"] <= lo <= hi
    assert s["slurm_starts"] > 0  # backfill (the simulated Slurm) acted meanwhile


def test_one_predictor_fit_before_the_split_everywhere(demo: DemoResult) -> None:
    """One run-time predictor, fit only on the dataset's part of the history: the dataset's
    manifest records it and every learned package (BC, CQL, PPO) carries the same file; the
    table has QSSF (same information) and the oracle ceilings, marked."""
    import json

    from linkwise.datasets.export import file_sha256

    pred = demo.predictor
    assert pred["fit_until"] == demo.split["until"] and pred["n_jobs"] > 0
    assert file_sha256(pred["path"]) == pred["sha256"]
    manifest = json.loads(Path(demo.dataset["path"].removesuffix(".parquet") + ".json").read_text())
    assert manifest["sources"]["predictor"]["sha256"] == pred["sha256"]
    for algo in ("bc", "cql", "ppo"):
        pkg = Path(demo.models[algo]["package_dir"])
        assert file_sha256(pkg / "predictor.json") == pred["sha256"], algo
    assert pred["heldout_accuracy"]["jobs"] > 0
    rows = {r["policy"]: r for r in demo.table}
    assert "qssf" in rows and not rows["qssf"]["oracle"]
    assert rows["sjf_bco_oracle"]["oracle"] and rows["srtf_oracle"]["oracle"]
