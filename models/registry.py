"""MLflow packaging and the model registry: log a policy package as a pyfunc model, register
it as ``linkwise-policy`` (alias ``challenger`` on each new version), and load it back by
alias, version or path with its checksums and ObsSpec verified.

The pyfunc model uses ``loader_module`` (this module's ``_load_pyfunc``) with the package
folder as ``data_path``: nothing is pickled. Its ``predict`` takes observations (a 2-D array
or a frame with ``obs`` and optional ``mask`` list columns) and returns the chosen actions.

Every registered version carries tags: ``linkwise.checksums_sha256`` (SHA-256 of the
package's ``checksums.sha256``), ``linkwise.obs_spec_version`` and
``linkwise.dataset_hash``. ``load_policy`` checks the downloaded package against its own
checksums and against the registry's tag, so a changed byte in any file, or a replaced
checksums file, is refused.

Model sources (``policies.source.ModelSource``: a registry alias, a ``models:/`` URI or a
local folder with an optional ``#sha256=`` digest) are loaded by ``load_source``.

A registry model is verified against the checksum tag recorded when it was registered. A
local package is only as trustworthy as the ``checksums.sha256`` beside it: whoever can
rewrite the folder can rewrite that file too. ``#sha256=DIGEST`` (the SHA-256 of the
package's ``checksums.sha256``, what ``sha256sum PATH/checksums.sha256`` prints) pins it to
what the operator reviewed. ``policies.spec.PolicySpec`` is the one parser of policy
strings (heuristics and model sources, ``policies.source``).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

from linkwise.cluster.contention import ContentionModel
from linkwise.datasets.export import file_sha256
from linkwise.models.learned import (
    CHECKSUMS,
    LearnedPolicy,
    PackageError,
    load_package,
    masked_argmax,
)
from linkwise.policies.source import MODEL_NAME, ModelSource, parse_models_uri

__all__ = [
    "DEFAULT_ALIAS",
    "PIP_REQUIREMENTS",
    "RegisteredPolicy",
    "default_tracking_uri",
    "ensure_experiment",
    "load_policy",
    "load_source",
    "log_policy",
    "mlflow_env",
    "open_registry",
    "registry_client",
    "resolve_version",
    "sqlite_file",
]

DEFAULT_ALIAS = "challenger"
TAG_CHECKSUMS = "linkwise.checksums_sha256"
TAG_OBS_SPEC = "linkwise.obs_spec_version"
TAG_DATASET = "linkwise.dataset_hash"
PIP_REQUIREMENTS: tuple[str, ...] = (
    "torch==2.13.0",
    "numpy==2.4.*",
    "mlflow==3.17.2",
    "linkwise==0.1.0",
)


def mlflow_env() -> None:
    """Environment MLflow needs here: no telemetry lookups, no download progress bars."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else a sqlite store in ``./linkwise-out/mlflow/mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = Path("linkwise-out/mlflow/mlflow.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` tracking URI (``sqlite:////abs`` absolute,
    else relative to the working directory, as SQLAlchemy reads it); None for any other URI,
    an in-memory SQLite one included."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri.removeprefix("sqlite:///").partition("?")[0]
    return Path(path) if path and path != ":memory:" else None


def open_registry(tracking_uri: str) -> None:
    """Make the tracking store (and model registry) at ``tracking_uri`` ready for use: for a
    SQLite one, its schema is created (or migrated) here, once, holding an exclusive
    ``fcntl.flock`` on ``DB.lock`` beside the database file. MLflow creates the schema on a
    client's first call without any lock, and two processes doing so at once race ("table
    experiments already exists"); every path that opens the registry (training, evaluation,
    promotion, serving) calls this first, through ``registry_client`` or itself. A store that
    already has its schema is only checked (MLflow finds every table and creates nothing);
    one whose folder this process may not write is read without the lock. Other stores (a
    tracking server) are left to MLflow."""
    mlflow_env()
    db = sqlite_file(tracking_uri)
    if db is None:
        return
    from mlflow.tracking import MlflowClient  # optional heavy dependency, imported on use

    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = open(db.with_name(db.name + ".lock"), "a")  # noqa: SIM115 (closed below)
    except PermissionError:
        if db.is_file():  # a registry this process may only read: no schema to create
            return
        raise
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            # the first call of a client creates the schema: the tracking store's tables
            # and the registry's, one metadata and one chain of migrations
            MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def registry_client(tracking_uri: str) -> MlflowClient:
    """An ``MlflowClient`` of the tracking store and model registry at ``tracking_uri``, the
    store opened first (``open_registry``)."""
    open_registry(tracking_uri)
    from mlflow.tracking import MlflowClient  # optional heavy dependency, imported on use

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _default_artifacts(tracking_uri: str) -> str:
    """Artifact root beside a sqlite store, else ``./linkwise-out/mlflow/artifacts``."""
    if tracking_uri.startswith("sqlite:///"):
        root = Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts"
    else:
        root = Path("linkwise-out/mlflow/artifacts")
    return root.resolve().as_uri()


def ensure_experiment(
    client: Any, name: str, artifact_location: str | None = None, tracking_uri: str = ""
) -> str:
    """The experiment's id, creating it with an explicit artifact location (never
    ``./mlruns``). Against a tracking server (``http(s)://``) the server's own artifact
    location is used unless one is given."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    loc = artifact_location
    if loc is None and not tracking_uri.startswith(("http://", "https://")):
        loc = _default_artifacts(tracking_uri)
    return str(client.create_experiment(name, artifact_location=loc))


# ------------------------------------------------------------------------ pyfunc flavour


class _PyfuncPolicy:
    """What ``mlflow.pyfunc.load_model`` wraps: observations (and masks) -> actions."""

    def __init__(self, policy: LearnedPolicy) -> None:
        self.policy = policy

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> Any:
        obs, masks = _inputs(model_input, self.policy.spec.dim, self.policy.spec.n_actions)
        if masks is None:
            masks = np.ones((len(obs), self.policy.spec.n_actions), dtype=bool)
        return masked_argmax(self.policy.action_values(obs), masks)


def _inputs(data: Any, dim: int, n_actions: int) -> tuple[Any, Any]:
    if hasattr(data, "columns") and "obs" in data.columns:
        obs = np.asarray([np.asarray(o, dtype=np.float32) for o in data["obs"]])
        masks = (
            np.asarray([np.asarray(m, dtype=bool) for m in data["mask"]])
            if "mask" in data.columns
            else None
        )
    else:
        obs = np.asarray(data, dtype=np.float32)
        masks = None
    obs = obs.reshape(-1, dim)
    if masks is not None:
        masks = masks.reshape(-1, n_actions)
    return obs, masks


def _load_pyfunc(data_path: str) -> _PyfuncPolicy:
    """MLflow's loader_module entry point: the package folder -> a pyfunc-able object."""
    return _PyfuncPolicy(load_package(data_path))


# ------------------------------------------------------------------------ logging


@dataclass(frozen=True)
class RegisteredPolicy:
    """A logged (and possibly registered) policy model."""

    run_id: str
    model_uri: str  # runs:/... or models:/m-...
    name: str | None  # registered model name
    version: str | None
    alias: str | None


def log_policy(
    pkg_dir: str | Path,
    *,
    run_id: str,
    tracking_uri: str,
    name: str | None = MODEL_NAME,
    alias: str | None = DEFAULT_ALIAS,
    pip_requirements: Sequence[str] = PIP_REQUIREMENTS,
) -> RegisteredPolicy:
    """Log the package as a pyfunc model in the (active or given) run; register it under
    ``name`` (None: don't) and point ``alias`` at the new version."""
    mlflow_env()
    # MLflow takes about a second to import: only where a run or the registry is used
    import mlflow

    pkg = Path(pkg_dir)
    load_package(pkg)  # refuse to register a broken package
    spec_version = _json(pkg / "policy.json").get("obs_spec_version", "")
    dataset_hash = _json(pkg / "policy.json").get("dataset_hash", "")
    checks = file_sha256(pkg / CHECKSUMS)
    client = registry_client(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    active = mlflow.active_run()
    ctx = (
        mlflow.start_run(run_id=run_id) if active is None or active.info.run_id != run_id else None
    )
    try:
        info = mlflow.pyfunc.log_model(
            name="policy",
            loader_module="linkwise.models.registry",
            data_path=str(pkg),
            pip_requirements=list(pip_requirements),
            tags={TAG_CHECKSUMS: checks, TAG_OBS_SPEC: str(spec_version)},
        )
    finally:
        if ctx is not None:
            mlflow.end_run()
    version: str | None = None
    if name is not None:
        with _quiet_stdout():
            mv = mlflow.register_model(
                info.model_uri,
                name,
                tags={
                    TAG_CHECKSUMS: checks,
                    TAG_OBS_SPEC: str(spec_version),
                    TAG_DATASET: str(dataset_hash),
                },
            )
        version = str(mv.version)
        client.set_model_version_tag(name, version, "linkwise.run_id", run_id)
        if alias:
            client.set_registered_model_alias(name, alias, version)
    return RegisteredPolicy(
        run_id=run_id,
        model_uri=str(info.model_uri),
        name=name,
        version=version,
        alias=alias if name is not None else None,
    )


def _json(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text())
    return out


class _quiet_stdout:
    """register_model prints to stdout; keep the CLI's output clean."""

    def __enter__(self) -> None:
        self._cm = contextlib.redirect_stdout(io.StringIO())
        self._cm.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(None, None, None)


# ------------------------------------------------------------------------ loading


def _package_in(model_dir: Path) -> Path:
    """The package folder inside an MLflow model folder (or the folder itself)."""
    if (model_dir / CHECKSUMS).is_file():
        return model_dir
    mlmodel = model_dir / "MLmodel"
    if not mlmodel.is_file():
        raise PackageError(f"{model_dir}: neither a policy package nor an MLflow model")
    meta = yaml.safe_load(mlmodel.read_text())
    flavor = meta.get("flavors", {}).get("python_function", {})
    if flavor.get("loader_module") != "linkwise.models.registry" or "data" not in flavor:
        raise PackageError(f"{model_dir}: not a linkwise policy model")
    return model_dir / str(flavor["data"])


def resolve_version(text: str, tracking_uri: str) -> tuple[ModelVersion, str]:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> (the model version, the URI of
    its artifacts), looked up in the registry at ``tracking_uri`` (not the environment's)."""
    # MLflow takes about a second to import: only where a run or the registry is used
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    name, alias, version = parse_models_uri(text)
    try:
        mv = (
            client.get_model_version_by_alias(name, alias)
            if alias is not None
            else client.get_model_version(name, str(version))
        )
    except MlflowException as exc:
        raise ValueError(
            f"{text}: not found in the registry at {tracking_uri} ({exc.message})"
        ) from None
    return mv, client.get_model_version_download_uri(name, mv.version)


def load_policy(
    source: str | Path,
    *,
    model: ContentionModel | None = None,
    tracking_uri: str | None = None,
    expected_obs_spec: str | None = None,
    digest: str | None = None,
) -> LearnedPolicy:
    """Load a learned policy from ``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, an MLflow
    model folder or a package folder; checksums, the registry's checksum tag and the ObsSpec
    are verified (PackageError, a ValueError, on any mismatch). ``digest``: for a folder, the
    SHA-256 its ``checksums.sha256`` must have."""
    text = os.fspath(source)
    if not text.startswith("models:/"):
        pkg = _package_in(Path(text))
        if digest is not None:
            sums = pkg / CHECKSUMS
            found = file_sha256(sums) if sums.is_file() else "none"
            if found != digest.lower():
                raise PackageError(
                    f"{text}: the SHA-256 of {CHECKSUMS} is {found}, the operator gave "
                    f"{digest}: refusing"
                )
        return load_package(
            pkg, model=model, expected_obs_spec=expected_obs_spec, name=f"model:{text}"
        )
    mlflow_env()
    # MLflow takes about a second to import: only where a run or the registry is used
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    mv, artifacts = resolve_version(text, uri)
    name = mv.name
    expected_sums = (mv.tags or {}).get(TAG_CHECKSUMS)
    if not expected_sums:
        raise PackageError(f"{text} (version {mv.version}): no {TAG_CHECKSUMS} tag: refusing")
    with tempfile.TemporaryDirectory(prefix="linkwise-model-") as tmp:
        local = mlflow.artifacts.download_artifacts(
            # the version's own artifact location: a ``models:/`` URI would be resolved
            # against the environment's registry, not this one
            artifact_uri=artifacts,
            dst_path=tmp,
            tracking_uri=uri,
        )
        pkg = _package_in(Path(local))
        sums = pkg / CHECKSUMS
        if not sums.is_file() or file_sha256(sums) != expected_sums:
            raise PackageError(
                f"{text} (version {mv.version}): the checksums file does not match the one "
                "registered: the artifacts were changed after registration; refusing"
            )
        policy = load_package(
            pkg, model=model, expected_obs_spec=expected_obs_spec, name=f"model:{text}"
        )
    policy.package_dir = f"models:/{name}/{mv.version}"
    return policy


def load_source(
    source: ModelSource,
    *,
    model: ContentionModel | None = None,
    tracking_uri: str | None = None,
    expected_obs_spec: str | None = None,
) -> LearnedPolicy:
    """``load_policy`` for a parsed ``ModelSource``."""
    uri = source.registry_uri
    return load_policy(
        uri if uri is not None else Path(source.target),
        model=model,
        tracking_uri=tracking_uri,
        expected_obs_spec=expected_obs_spec,
        digest=source.digest,
    )
