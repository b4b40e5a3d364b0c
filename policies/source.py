"""Where a learned policy comes from, as data: what a ``model:`` spec names.

Explicit, so that no name means two things (``models.registry`` loads them):

- ``model:ALIAS`` (letters, digits, ``_``, ``-``): the registry's ``linkwise-policy@ALIAS``;
  refused as ambiguous when a file or folder of that name exists in the working directory;
- ``model:models:/NAME@ALIAS`` or ``model:models:/NAME/VERSION``: a registry URI;
- ``model:PATH`` with a ``/`` (``model:./champion``, ``model:/srv/pkg``): a local package or
  MLflow model folder, optionally ``model:PATH#sha256=DIGEST`` (the SHA-256 of the
  package's ``checksums.sha256``, what ``sha256sum PATH/checksums.sha256`` prints).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODEL_NAME", "ModelSource", "parse_models_uri"]

MODEL_NAME = "linkwise-policy"


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> (name, alias, version)."""
    rest = uri.removeprefix("models:/").strip("/")
    if "@" in rest:
        name, _, alias = rest.partition("@")
        return name, alias, None
    name, _, version = rest.rpartition("/")
    if not name or not version:
        raise ValueError(f"bad model URI {uri!r}: expected models:/NAME@ALIAS or /VERSION")
    return name, None, version


_ALIAS = re.compile(r"[A-Za-z0-9_-]+")
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ModelSource:
    """Where a learned policy comes from: a registry alias, a registry URI or a local folder
    (``path``, with an optional operator-given ``digest`` of its ``checksums.sha256``)."""

    kind: str  # "alias" | "uri" | "path"
    target: str  # the alias, the models:/ URI or the folder
    digest: str | None = None

    @classmethod
    def parse(cls, spec: str, cwd: str | Path | None = None) -> ModelSource:
        """``model:ALIAS``, ``model:models:/...`` or ``model:PATH[#sha256=DIGEST]`` (the
        ``model:`` prefix optional); ValueError on an empty, malformed or ambiguous source."""
        text = spec.strip().removeprefix("model:").strip()
        if not text:
            raise ValueError("model: needs an alias, a models:/ URI or a path")
        if text.startswith("models:/"):
            parse_models_uri(text)
            return cls("uri", text)
        if "/" in text or os.sep in text or text.startswith((".", "~")):
            folder, sep, pin = text.partition("#")
            digest = None
            if sep:
                digest = pin.removeprefix("sha256=").lower()
                if not pin.startswith("sha256=") or not _DIGEST.fullmatch(digest):
                    raise ValueError(
                        f"model:{text}: expected #sha256= and 64 hex digits after the path"
                    )
            return cls("path", os.path.expanduser(folder), digest)
        if not _ALIAS.fullmatch(text):
            raise ValueError(
                f"model:{text}: not a registry alias (letters, digits, _ and -); write a "
                f"local folder with a slash (model:./{text})"
            )
        if (Path(cwd) if cwd is not None else Path.cwd()).joinpath(text).exists():
            raise ValueError(
                f"model:{text} is ambiguous: it names the registry alias {MODEL_NAME}@{text}, "
                f"and ./{text} exists here; write model:models:/{MODEL_NAME}@{text} for the "
                f"registry or model:./{text} for the folder"
            )
        return cls("alias", text)

    @property
    def registry_uri(self) -> str | None:
        """The ``models:/`` URI for registry sources, None for a folder."""
        if self.kind == "alias":
            return f"models:/{MODEL_NAME}@{self.target}"
        return self.target if self.kind == "uri" else None

    def describe(self) -> str:
        """The source as a ``model:`` spec."""
        pin = f"#sha256={self.digest}" if self.digest else ""
        return f"model:{self.registry_uri or self.target}{pin}"
