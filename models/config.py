"""Helpers shared by the TOML experiment configurations (training, PPO)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def check_keys(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """Refuse keys a section does not know (a typo must not be silently ignored)."""
    extra = sorted(set(d) - allowed)
    if extra:
        raise ValueError(f"unknown keys in {where}: {extra} (allowed: {sorted(allowed)})")


def resolve_path(text: str, base: Path | None) -> str:
    """A config path: absolute as is; else the first existing one under the working
    directory, the config's folder (``base``) or the repository root; else as written."""
    p = Path(text).expanduser()
    if p.is_absolute():
        return str(p)
    for root in (Path.cwd(), base, REPO_ROOT):
        if root is not None and (root / p).exists():
            return str((root / p).resolve())
    return str(p)


def config_digest(description: Mapping[str, Any]) -> str:
    """SHA-256 of a configuration's canonical JSON, without its ``source`` path."""
    d = dict(description)
    d.pop("source", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()
