"""The clusters' own calibrations in MLflow, and which calibration a command uses.

``linkwise calibrate --db`` logs each fit (``log_cluster_calibration``) as a run of the
experiment ``linkwise-calibration``: the calibration JSON as the artifact
``calibration.json``, its data span and size as params (``since``, ``until``, ``hours``,
``jobs``, ``job_hours``, ``cluster``), its validation as metrics (``drop_mae``,
``drop_spearman``, ``activity_mae``, ``activity_spearman``, and the shipped calibration's
beside them) and the tag ``linkwise.calibration.cluster`` naming the Slurm cluster.
``latest_cluster_calibration`` finds the newest finished such run of a cluster.

``resolve_calibration`` is the one rule every command that takes ``--calibration`` follows
(``build-dataset``, ``evaluate`` and its gates, ``shadow-report``, ``label``): a file given
is used; else the newest calibration fitted for the store's cluster in the tracking store
(``lookup_tracking_uri``: the one given, else ``$MLFLOW_TRACKING_URI``, else the default
SQLite store when it exists; none is created to look); else the shipped one. The choice says
which it is (``CalibrationChoice.describe``), and every report prints it.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from linkwise.cluster.profiles import Calibration
from linkwise.datasets.log_jobs import store_cluster
from linkwise.datasets.store import open_store
from linkwise.models.registry import ensure_experiment, registry_client, sqlite_file

__all__ = [
    "ARTIFACT",
    "EXPERIMENT",
    "TAG_CLUSTER",
    "CalibrationChoice",
    "CalibrationRecord",
    "calibration_for_store",
    "latest_cluster_calibration",
    "log_cluster_calibration",
    "lookup_tracking_uri",
    "recorded_calibration",
    "resolve_calibration",
]

EXPERIMENT = "linkwise-calibration"
TAG_CLUSTER = "linkwise.calibration.cluster"
ARTIFACT = "calibration.json"
DEFAULT_SQLITE = Path("linkwise-out/mlflow/mlflow.db")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


@dataclass(frozen=True)
class CalibrationRecord:
    """A cluster's calibration logged in MLflow: its run, the local copy of its JSON."""

    run_id: str
    cluster: str
    path: Path
    params: Mapping[str, str]


def lookup_tracking_uri(given: str | None = None) -> str | None:
    """The tracking store to look for a cluster's calibration in: ``given``, else
    ``$MLFLOW_TRACKING_URI``, else the default SQLite store (``linkwise-out/mlflow``) when it
    exists; None otherwise, and for a SQLite store whose file does not exist (nothing is
    created to look)."""
    uri = given or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        # a SQLite store that does not exist holds no calibration: looking would create it
        # (and MLflow would print its table creation on stderr, into serve's JSON lines)
        db = sqlite_file(uri)
        return None if db is not None and not db.is_file() else uri
    return f"sqlite:///{DEFAULT_SQLITE.resolve()}" if DEFAULT_SQLITE.is_file() else None


def _metrics(fit: Mapping[str, Any]) -> dict[str, float]:
    v = fit.get("validation", {})
    out: dict[str, float] = {}
    for what in ("drop", "activity"):
        for who, prefix in (("fit", ""), ("shipped", "shipped_")):
            for stat in ("mae", "spearman"):
                value = v.get(what, {}).get(who, {}).get(stat)
                if value is not None and math.isfinite(float(value)):
                    out[f"{prefix}{what}_{stat}"] = float(value)
    rms = fit.get("data", {}).get("rms_log_residual")
    if rms is not None and math.isfinite(float(rms)):
        out["rms_log_residual"] = float(rms)
    return out


def log_cluster_calibration(
    tracking_uri: str, calibration: Calibration, cluster: str, *, db: str | None = None
) -> str:
    """Log a calibration fitted on ``cluster``'s telemetry (its ``fit`` holds ``data`` and
    ``validation``) as a run of ``EXPERIMENT`` (module docstring); its run id."""
    if not _CLUSTER_NAME.fullmatch(cluster):
        raise ValueError(f"cluster name {cluster!r}: letters, digits and _.:- only")
    client = registry_client(tracking_uri)
    exp_id = ensure_experiment(client, EXPERIMENT, tracking_uri=tracking_uri)
    data = calibration.fit.get("data", {})
    run = client.create_run(exp_id, run_name=f"{cluster}-calibration", tags={TAG_CLUSTER: cluster})
    run_id = str(run.info.run_id)
    params = {
        "cluster": cluster,
        "since": data.get("since"),
        "until": data.get("until"),
        "hours": data.get("hours"),
        "jobs": data.get("runs_summarized"),
        "jobs_fitted": data.get("runs_fitted"),
        "job_hours": data.get("job_hours"),
        "reference": calibration.fit.get("reference"),
        "store": db,
    }
    try:
        for key, value in params.items():
            if value is not None:
                client.log_param(run_id, key, value)
        for key, num in _metrics(calibration.fit).items():
            client.log_metric(run_id, key, num)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / ARTIFACT
            out.write_text(_json_text(calibration))
            client.log_artifact(run_id, str(out))
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id


def _json_text(calibration: Calibration) -> str:
    return json.dumps(calibration.to_json(), indent=2) + "\n"


def latest_cluster_calibration(tracking_uri: str, cluster: str) -> CalibrationRecord | None:
    """The newest finished calibration run of ``cluster`` in ``EXPERIMENT``, its JSON
    downloaded (a temporary folder per run, reused); None when there is none."""
    if not _CLUSTER_NAME.fullmatch(cluster):
        return None
    client = registry_client(tracking_uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{TAG_CLUSTER}` = '{cluster}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    run = runs[0]
    run_id = str(run.info.run_id)
    path = _local_copy(client, run_id)
    return CalibrationRecord(run_id, cluster, path, dict(run.data.params))


def _local_copy(client: Any, run_id: str) -> Path:
    """The run's calibration JSON, downloaded into a temporary folder per run (reused while
    it exists, downloaded again once gone)."""
    dst = Path(tempfile.gettempdir()) / "linkwise-calibrations" / run_id
    path = dst / ARTIFACT
    if not path.is_file():
        dst.mkdir(parents=True, exist_ok=True)
        path = Path(client.download_artifacts(run_id, ARTIFACT, str(dst)))
    return path


def recorded_calibration(sources: Mapping[str, Any], tracking_uri: str | None = None) -> str | None:
    """The calibration a dataset's manifest (its ``sources``) was built with, to load again:
    a cluster's fitted one fetched again from its MLflow run (``calibration_used``; the path
    the build read is a temporary copy), else the file recorded (None: the shipped one)."""
    used = sources.get("calibration_used") or {}
    if used.get("kind") == "cluster" and used.get("run_id"):
        uri = lookup_tracking_uri(tracking_uri)
        if uri is None:
            raise ValueError(
                f"the dataset was built with {used.get('text', 'a fitted calibration')}: "
                "name the tracking store it is in (--tracking-uri or MLFLOW_TRACKING_URI)"
            )
        return str(_local_copy(registry_client(uri), str(used["run_id"])))
    path = sources.get("calibration")
    return None if path is None else str(path)


@dataclass(frozen=True)
class CalibrationChoice:
    """The calibration a command uses: ``path`` (None: the shipped one) and why."""

    kind: Literal["file", "cluster", "shipped"]
    path: str | None
    run_id: str | None = None
    cluster: str | None = None
    span: str | None = None

    @classmethod
    def given(cls, path: str | Path | None) -> CalibrationChoice:
        """The choice of a caller that names its calibration itself: a file, or None for the
        shipped one."""
        return cls("file", str(path)) if path is not None else cls("shipped", None)

    def describe(self) -> str:
        """The line every report prints: which calibration."""
        if self.kind == "file":
            return f"a file ({self.path})"
        if self.kind == "cluster":
            span = f", {self.span}" if self.span else ""
            return f"cluster {self.cluster}'s fitted calibration (MLflow run {self.run_id}{span})"
        return "shipped (DeepShare/Pollux testbeds; no calibration fitted for this cluster)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "run_id": self.run_id,
            "cluster": self.cluster,
            "text": self.describe(),
        }


def resolve_calibration(
    given: str | Path | None, *, cluster: str | None, tracking_uri: str | None = None
) -> CalibrationChoice:
    """The calibration to use (module docstring): ``given``, else ``cluster``'s newest
    fitted one in the tracking store (``lookup_tracking_uri(tracking_uri)``), else the
    shipped one."""
    if given is not None:
        return CalibrationChoice("file", str(given))
    uri = lookup_tracking_uri(tracking_uri)
    if cluster is None or uri is None:
        return CalibrationChoice("shipped", None)
    record = latest_cluster_calibration(uri, cluster)
    if record is None:
        return CalibrationChoice("shipped", None)
    hours = record.params.get("hours")
    jobs = record.params.get("jobs")
    span = f"{jobs} jobs over {float(hours):.1f} h" if hours and jobs else None
    return CalibrationChoice("cluster", str(record.path), record.run_id, cluster, span)


def calibration_for_store(
    given: str | Path | None,
    db: str | Path | None,
    *,
    slurm_cluster: str | None = None,
    tracking_uri: str | None = None,
    lock_wait_s: float = 10.0,
) -> CalibrationChoice:
    """``resolve_calibration`` for a command on a store: the cluster is ``slurm_cluster``,
    else the store's only one (``store_cluster``); without a store (or a store naming no
    single cluster), only a file given or the shipped calibration."""
    if given is not None:
        return resolve_calibration(given, cluster=None)
    cluster = slurm_cluster
    if cluster is None and db is not None and Path(db).is_file():
        with closing(open_store(db, lock_wait_s=lock_wait_s)) as con:
            try:
                cluster = store_cluster(con)
            except ValueError:
                cluster = None
    return resolve_calibration(None, cluster=cluster, tracking_uri=tracking_uri)
