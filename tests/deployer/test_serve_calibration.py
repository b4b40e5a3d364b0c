"""The one calibration ``linkwise serve`` uses (deployer/calibration.py): a flag, else the
serving package's recorded one, else the cluster's newest fit in the tracking store, else the
shipped one; a tracking store that does not answer gives the shipped one and a warning. The
policies, the profiles and the drift monitor of the live loop use it."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from linkwise.cluster.profiles import load_calibration
from linkwise.deployer.calibration import CalibrationResolver
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.policies.spec import PolicySpec
from linkwise.tests import _profile_runs
from linkwise.tests._telemetry_truth import CLUSTER

LOG = logging.getLogger("test.serve_calibration")
FIFO = PolicySpec.parse("fifo")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A SQLite tracking store where a calibration fitted on ``CLUSTER`` is logged (as
    ``linkwise calibrate --db`` logs it): its URI and the fit's run id."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, log_cluster_calibration(uri, _profile_runs.fitted(), CLUSTER)


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOG.name]
    return [e for e in lines if e["event"] == name]


def _holder(resolver: CalibrationResolver, spec: PolicySpec = FIFO) -> PolicyHolder:
    return PolicyHolder(spec, FIFO, metrics=ServeMetrics(), logger=LOG, calibrate=resolver)


def test_serve_uses_the_clusters_newest_fit(
    fitted: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    uri, run_id = fitted
    with caplog.at_level(logging.INFO, logger=LOG.name):
        holder = _holder(CalibrationResolver(None, CLUSTER, uri))
    assert holder.calibration is not None
    assert (holder.calibration.source, holder.calibration.run_id) == ("cluster-fit", run_id)
    assert _profile_runs.BERT in holder.calibration.calibration.profiles
    assert holder.model is not None and holder.model.calibration == _profile_runs.fitted()
    (event,) = _events(caplog, "calibration")
    assert (event["source"], event["run_id"]) == ("cluster-fit", run_id)
    text = holder.metrics.text()
    assert f'linkwise_serve_calibration_info{{run_id="{run_id}",source="cluster-fit"}} 1.0' in text
    # the explanations of a heuristic predict with it too
    guarded = GuardedPolicy(holder, holder.metrics, LOG)
    assert guarded.model is None and guarded.holder.model is holder.model
    # another cluster has no fit: the shipped one
    other = _holder(CalibrationResolver(None, "elsewhere", uri)).calibration
    assert other is not None and other.source == "shipped" and not other.warning


def test_without_a_fit_or_a_store_serve_uses_the_shipped_one(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}"
    holder = _holder(CalibrationResolver(None, CLUSTER, missing))
    assert holder.calibration is not None and holder.calibration.source == "shipped"
    assert holder.calibration.calibration == load_calibration(None)
    assert not (tmp_path / "none").exists()  # no store created to look
    assert 'linkwise_serve_calibration_info{run_id="",source="shipped"} 1.0' in (
        holder.metrics.text()
    )


def test_a_package_that_records_its_calibration_gets_it(
    fitted: tuple[str, str], tmp_path: Path
) -> None:
    """A package's dataset manifest recording a cluster fit (fetched again from its run) or a
    file: that one, whatever the cluster's newest fit; one recording none (built with the
    shipped one): the cluster's fit."""
    uri, run_id = fitted
    resolver = CalibrationResolver(None, "elsewhere", uri)  # no fit for this cluster
    used = {"kind": "cluster", "run_id": run_id, "cluster": CLUSTER, "path": "/tmp/gone"}
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "dataset.json").write_text(
        json.dumps({"sources": {"calibration": "/tmp/gone", "calibration_used": used}})
    )
    got = resolver(PolicySpec.parse(f"model:{pkg}"))
    assert (got.source, got.run_id) == ("package", run_id)
    assert got.calibration == _profile_runs.fitted()
    cal_file = tmp_path / "cal.json"
    cal_file.write_text(json.dumps(_profile_runs.fitted().to_json()))
    (pkg / "dataset.json").write_text(json.dumps({"sources": {"calibration": str(cal_file)}}))
    got = CalibrationResolver(None, CLUSTER, uri)(PolicySpec.parse(f"model:{pkg}"))
    assert (got.source, got.path, got.run_id) == ("package", str(cal_file), "")
    (pkg / "dataset.json").write_text(json.dumps({"sources": {"calibration": None}}))
    got = CalibrationResolver(None, CLUSTER, uri)(PolicySpec.parse(f"model:{pkg}"))
    assert (got.source, got.run_id) == ("cluster-fit", run_id)
    # the flag overrides everything
    flagged = CalibrationResolver(str(cal_file), CLUSTER, uri)(PolicySpec.parse(f"model:{pkg}"))
    assert (flagged.source, flagged.path) == ("flag", str(cal_file))


def test_a_tracking_store_that_does_not_answer_gives_the_shipped_one_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as s:  # a port where nothing listens: MLflow retries for minutes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    resolver = CalibrationResolver(None, CLUSTER, f"http://127.0.0.1:{port}", timeout_s=1.0)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        holder = _holder(resolver)
    assert time.monotonic() - t0 < 10.0  # never hangs
    assert holder.calibration is not None and holder.calibration.source == "shipped"
    assert "calibration lookup failed" in holder.calibration.warning
    (warning,) = _events(caplog, "calibration_lookup_failed")
    assert "calibration lookup failed" in warning["error"]
    (event,) = _events(caplog, "calibration")
    assert event["source"] == "shipped" and "warning" in event
