"""Whether the live loop can serve the model it is told to (``serving_problem``).

A model the loop is told to serve must be there when it starts: a registry model in the
registry it is configured to find (``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else
``./linkwise-out/mlflow/mlflow.db``; with ``--config`` the file's ``[policy] tracking_uri``,
relative to the file), a package folder where it is named. Else ``linkwise serve``
(``linkwise/cli/serve.py``) exits 2 with one line naming where it looked, instead of deciding
with the fallback and creating an empty registry (issue 32 item 4). Later, while it runs, a
model that cannot be reloaded still falls back to the heuristic, as before.
"""

from __future__ import annotations

from pathlib import Path

from linkwise.models.registry import resolve_version
from linkwise.policies.spec import PolicySpec

SQLITE = "sqlite:///"


def serving_problem(spec: PolicySpec, tracking_uri: str) -> str | None:
    """Why the model ``spec`` names cannot be served now (where it was looked for), or None:
    heuristics always can. A SQLite registry that does not exist is reported before any
    MLflow client opens it (which would create an empty one)."""
    source = spec.source
    if source is None:
        return None
    if source.registry_uri is None:
        if not Path(source.target).is_dir():
            return f"{spec.label}: no package folder at {source.target}"
        return None
    if tracking_uri.startswith(SQLITE):
        db = Path(tracking_uri.removeprefix(SQLITE))
        if not db.is_file():
            return f"{spec.label}: no model registry at {tracking_uri} (no such file)"
    try:
        resolve_version(source.registry_uri, tracking_uri)
    except ValueError as exc:
        return str(exc)
    return None
