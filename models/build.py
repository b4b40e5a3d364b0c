"""Where a parsed ``model:`` spec becomes a learned policy: the one place ``models`` builds
policy specs (``policies.spec.PolicySpec`` parses them; that floor cannot load packages).

``build_policy`` builds any spec, a learned package loaded and verified by ``load_learned``
(a plain package as ``models.learned.LearnedPolicy``, a residual one as
``models.residual.ResidualPolicy``). ``pinned`` turns a registry alias into the version it
points at now, so that an alias moving mid-run changes nothing; ``token`` changes whenever
the model behind a spec changes. ``pretrained_specs`` names the packages shipped in
``models/pretrained`` (``linkwise policies`` lists them).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import Policy
from linkwise.models.learned import CHECKSUMS
from linkwise.models.registry import (
    default_tracking_uri,
    load_source,
    mlflow_env,
    resolve_version,
)
from linkwise.models.residual import is_residual_meta, residual_from_learned
from linkwise.policies.source import ModelSource, parse_models_uri
from linkwise.policies.spec import PolicySpec

__all__ = [
    "PRETRAINED",
    "build_policy",
    "load_learned",
    "model_manifest",
    "pinned",
    "pretrained_specs",
    "registry_version",
    "token",
]

PRETRAINED = Path(__file__).with_name("pretrained")


def load_learned(
    source: ModelSource, model: ContentionModel | None = None, *, tracking_uri: str | None = None
) -> Policy:
    """The learned policy at ``source``, loaded and verified (its encoder predicts contention
    with ``model``; registry lookups at ``tracking_uri``)."""
    learned = load_source(source, model=model, tracking_uri=tracking_uri)
    if is_residual_meta(learned.meta):
        return residual_from_learned(learned, model)
    return learned


def build_policy(
    spec: PolicySpec, model: ContentionModel | None = None, *, tracking_uri: str | None = None
) -> Policy:
    """The ``Policy`` a parsed spec names, a learned one loaded by ``load_learned``."""
    return spec.build(model, learned=partial(load_learned, tracking_uri=tracking_uri))


def registry_version(spec: PolicySpec, tracking_uri: str | None = None) -> str | None:
    """The registry version ``spec`` names now (None for heuristics and folders)."""
    uri = spec.source.registry_uri if spec.source is not None else None
    if uri is None:
        return None
    _name, alias, version = parse_models_uri(uri)
    if alias is None:
        return str(version)
    return str(resolve_version(uri, tracking_uri or default_tracking_uri())[0].version)


def pinned(spec: PolicySpec, tracking_uri: str | None = None) -> PolicySpec:
    """``spec`` with a registry alias replaced by the version it points at now."""
    if spec.source is None or spec.source.registry_uri is None:
        return spec
    name = parse_models_uri(spec.source.registry_uri)[0]
    version = registry_version(spec, tracking_uri)
    return PolicySpec(source=ModelSource("uri", f"models:/{name}/{version}"))


def token(spec: PolicySpec, tracking_uri: str | None = None) -> str | None:
    """Changes when the model behind ``spec`` changes (an alias moved, a package
    rewritten); None for heuristics. Raises when it cannot be read."""
    if spec.source is None:
        return None
    version = registry_version(spec, tracking_uri)
    if version is not None:
        return version
    folder = Path(spec.source.target)
    sums = folder / CHECKSUMS
    if not sums.is_file():
        found = sorted(folder.rglob(CHECKSUMS))
        sums = found[0] if found else sums
    return hashlib.sha256(sums.read_bytes()).hexdigest() if sums.is_file() else "missing"


def model_manifest(spec: PolicySpec, tracking_uri: str | None = None) -> dict[str, Any] | None:
    """The dataset manifest inside a learned policy's package (``model:PATH`` or
    ``model:models:/...``), None for anything else."""
    source = spec.source
    if source is None:
        return None
    target = source.registry_uri or source.target
    if target.startswith("models:/"):
        mlflow_env()
        import mlflow  # MLflow (heavy) only for a registry model, after mlflow_env()

        uri = tracking_uri or default_tracking_uri()
        with tempfile.TemporaryDirectory(prefix="linkwise-manifest-") as tmp:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=resolve_version(target, uri)[1],
                dst_path=tmp,
                tracking_uri=uri,
            )
            found = sorted(Path(local).rglob("dataset.json"))
            return json.loads(found[0].read_text()) if found else None
    p = Path(target)
    if not p.exists():
        return None
    found = (
        [p / "dataset.json"] if (p / "dataset.json").is_file() else sorted(p.rglob("dataset.json"))
    )
    return json.loads(found[0].read_text()) if found else None


def pretrained_specs(root: Path = PRETRAINED) -> list[str]:
    """``model:PATH`` for every package shipped in ``root`` (relative to the working
    directory when it is inside it)."""
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if (p / CHECKSUMS).is_file()):
        try:
            shown = folder.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = folder
        out.append(f"model:{shown}")
    return out
