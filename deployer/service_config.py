"""``linkwise serve --config FILE``: the loop's settings as a TOML file, for running it as a
service (``ops/systemd/linkwise-serve.service``), validated before the loop starts.

The file and the other ``serve`` options are mutually exclusive: with ``--config``, every
setting comes from the file (one place to read what a running loop was told; going from
shadow to active is an edit and a restart), and any other option given on the command line
is refused (exit 2). ``ops/linkwise-serve.example.toml`` documents every key::

    mode = "shadow"                 # or "active"
    partitions = ["gpu"]
    [policy]   source, digest, fallback, reload_s, default_profile, tracking_uri, calibration
    [slurm]    env_file, transport
    [loop]     interval_s, lease_s, max_hold_s, lease_root, watchdog, load_window_s, max_cycles
    [store]    db, state_dir
    [metrics]  address ("HOST:PORT"; "" for none)
    [migration] budget, min_run_s, grace_s, max_grace_s
    [log]      format ("json": one JSON object a line, for the journal; or "text")

Errors (``ConfigError``, a ``ValueError``) name the file and the key: an unknown key (with
the known ones), a wrong type, a bad value (a partition name, a negative time, a lease
shorter than two cycles in active mode, a malformed policy source or digest, a port out of
range, a Slurm env file that does not exist).

Relative paths in the file (``slurm.env_file``, ``store.db``, ``store.state_dir``,
``loop.lease_root``, a local package ``model:./PATH``, ``policy.calibration`` and
``policy.tracking_uri``, the model registry) are resolved against the file's own directory,
never the current one (issue 32 item 4: run from elsewhere, ``model:champion`` was looked up,
and an empty registry created, under that directory). ``policy.tracking_uri`` is an MLflow
tracking URI or a path of its SQLite file (default: ``linkwise-out/mlflow/mlflow.db`` beside
the file). ``policy.calibration``: ``serve --calibration`` (``deployer.calibration``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linkwise.deployer.locks import valid_name
from linkwise.deployer.loop import DEFAULT_LEASE_ROOT, ServeConfig
from linkwise.deployer.migration import MigrationConfig
from linkwise.policies.source import ModelSource
from linkwise.policies.spec import PolicySpec

__all__ = [
    "DEFAULT_REGISTRY",
    "LOG_FORMATS",
    "ConfigError",
    "JsonLineFormatter",
    "ServiceConfig",
    "configure_logging",
    "load_service_config",
    "parse_service_config",
    "resolve_tracking_uri",
]

LOG_FORMATS = ("text", "json")
_DIGEST = re.compile(r"[0-9a-f]{64}")
DEFAULT_REGISTRY = "linkwise-out/mlflow/mlflow.db"  # relative: to the file's (or the CLI's) dir
_SQLITE = "sqlite:///"


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ServiceConfig:
    """What a configuration file says: the loop's ``ServeConfig`` and how it logs."""

    serve: ServeConfig
    log_format: str = "json"
    source: str = ""  # the file


# ------------------------------------------------------------------------ the schema


@dataclass(frozen=True)
class _Key:
    kind: str  # "str" | "number" | "int" | "bool" | "names"
    check: Callable[[Any], str] | None = None  # "" when fine, else what is wrong


def _positive(v: float) -> str:
    return "" if v > 0 else "must be positive"


def _non_negative(v: float) -> str:
    return "" if v >= 0 else "must not be negative"


def _one_of(*allowed: str) -> Callable[[Any], str]:
    return lambda v: "" if v in allowed else f"must be one of {', '.join(map(repr, allowed))}"


def _not_empty(v: str) -> str:
    return "" if v.strip() else "must not be empty"


def _partitions(v: list[str]) -> str:
    if not v:
        return "name at least one partition"
    bad = [p for p in v if not valid_name(p)]
    return f"invalid partition name(s): {', '.join(map(repr, bad))}" if bad else ""


def _digest(v: str) -> str:
    return "" if _DIGEST.fullmatch(v.lower()) else "must be 64 hex digits (a SHA-256)"


def _address(v: str) -> str:
    if v == "":
        return ""
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return 'must be "HOST:PORT" with a port in 1-65535 (or "" for no metrics)'
    return ""


SCHEMA: dict[str, _Key | dict[str, _Key]] = {
    "mode": _Key("str", _one_of("shadow", "active")),
    "partitions": _Key("names", _partitions),
    "policy": {
        "source": _Key("str", _not_empty),
        "digest": _Key("str", _digest),
        "fallback": _Key("str", _not_empty),
        "reload_s": _Key("number", _positive),
        "default_profile": _Key("str"),
        "tracking_uri": _Key("str", _not_empty),
        "calibration": _Key("str", _not_empty),
    },
    "slurm": {
        "env_file": _Key("str", _not_empty),
        "transport": _Key("str", _one_of("cli", "rest")),
    },
    "loop": {
        "interval_s": _Key("number", _positive),
        "lease_s": _Key("number", _positive),
        "max_hold_s": _Key("number", _positive),
        "lease_root": _Key("str", _not_empty),
        "watchdog": _Key("bool"),
        "load_window_s": _Key("number", _positive),
        "max_cycles": _Key("int", _positive),
    },
    "store": {"db": _Key("str"), "state_dir": _Key("str", _not_empty)},
    "metrics": {"address": _Key("str", _address)},
    "migration": {
        "budget": _Key("int", _non_negative),
        "min_run_s": _Key("number", _non_negative),
        "grace_s": _Key("number", _non_negative),
        "max_grace_s": _Key("number", _non_negative),
    },
    "log": {"format": _Key("str", _one_of(*LOG_FORMATS))},
}
REQUIRED = ("mode", "partitions")
_KINDS = {
    "str": "a string",
    "number": "a number",
    "int": "an integer",
    "bool": "true or false",
    "names": "a list of strings",
}


def _type_ok(kind: str, v: Any) -> bool:
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, int | float) and not isinstance(v, bool)
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _toml_type(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(v), "a table" if isinstance(v, dict) else "a list" if isinstance(v, list) else "?"
    )


def _validate(data: Mapping[str, Any], src: str) -> dict[str, Any]:
    """Flatten ``data`` to {"section.key": value}, refusing unknown keys, wrong types and
    bad values (each named)."""

    def fail(key: str, what: str) -> ConfigError:
        return ConfigError(f"{src}: {key}: {what}")

    flat: dict[str, Any] = {}
    for name, value in data.items():
        spec = SCHEMA.get(name)
        if spec is None:
            known = ", ".join(SCHEMA)
            raise fail(name, f"unknown key (known: {known})")
        items: list[tuple[str, _Key, Any]]
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise fail(name, f"expected a table [{name}], got {_toml_type(value)}")
            items = []
            for key, v in value.items():
                if key not in spec:
                    known = ", ".join(spec)
                    raise fail(f"{name}.{key}", f"unknown key (known in [{name}]: {known})")
                items.append((f"{name}.{key}", spec[key], v))
        else:
            items = [(name, spec, value)]
        for key, k, v in items:
            if not _type_ok(k.kind, v):
                raise fail(key, f"expected {_KINDS[k.kind]}, got {_toml_type(v)} {v!r}")
            problem = k.check(v) if k.check is not None else ""
            if problem:
                raise fail(key, f"{problem} (got {v!r})")
            flat[key] = v
    for key in REQUIRED:
        if key not in flat:
            raise fail(key, "missing (required)")
    return flat


def _under(base: Path, path: str) -> str:
    """``path`` (``~`` expanded) made absolute against ``base`` when it is relative."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def resolve_tracking_uri(value: str, base: Path) -> str:
    """An MLflow tracking URI with a relative SQLite path resolved against ``base``: a bare
    path is the SQLite file (``sqlite:///ABSOLUTE``); other URIs are kept as they are."""
    text = value.strip()
    if text.startswith(_SQLITE):
        return _SQLITE + _under(base, text.removeprefix(_SQLITE))
    if "://" in text:
        return text
    return _SQLITE + _under(base, text)


def _policy(flat: Mapping[str, Any], src: str, base: Path) -> tuple[PolicySpec, PolicySpec]:
    """The policy spec (a local package pinned as ``model:PATH#sha256=DIGEST``, its folder
    resolved against ``base``) and the fallback heuristic, each parsed once."""
    source = str(flat.get("policy.source", "backfill")).strip()
    digest = flat.get("policy.digest")
    try:
        spec = PolicySpec.parse(source, cwd=base)
    except ValueError as exc:
        raise ConfigError(f"{src}: policy.source: {exc}") from exc
    where = spec.source
    if where is not None:
        pin = where.digest
        if digest is not None:
            if where.kind != "path":
                raise ConfigError(
                    f"{src}: policy.digest: pins a local package (model:./PATH) only; pin a "
                    "registry model by its version (model:models:/NAME/N)"
                )
            if pin is not None:
                raise ConfigError(
                    f"{src}: policy.digest: the source already carries #sha256=: give one"
                )
            pin = str(digest).lower()
        if where.kind == "path":
            pinned = ModelSource("path", _under(base, where.target), pin)
            spec = PolicySpec(source=pinned, text=pinned.describe())
    elif digest is not None:
        raise ConfigError(f"{src}: policy.digest: {source!r} is a heuristic, not a package")
    fallback = str(flat.get("policy.fallback", "backfill")).strip()
    try:
        fb = PolicySpec.parse(fallback)
    except ValueError as exc:
        raise ConfigError(f"{src}: policy.fallback: {exc}") from exc
    if fb.is_model:
        raise ConfigError(f"{src}: policy.fallback: must be a heuristic, got {fallback!r}")
    return spec, fb


def parse_service_config(
    text: str, src: str = "<config>", base: Path | None = None
) -> ServiceConfig:
    """A ``ServiceConfig`` from TOML text, relative paths resolved against ``base`` (the
    file's directory; default the current one); ``ConfigError`` naming the key on any
    problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{src}: not valid TOML: {exc}") from exc
    flat = _validate(data, src)
    here = base if base is not None else Path.cwd()
    policy, fallback = _policy(flat, src, here)
    env_file = _under(here, str(flat.get("slurm.env_file", ServeConfig.slurm_env)))
    if not Path(env_file).is_file():
        raise ConfigError(f"{src}: slurm.env_file: no such file {env_file!r}")
    address = str(flat.get("metrics.address", ""))
    host, _, port = address.rpartition(":")
    interval = float(flat.get("loop.interval_s", ServeConfig.interval_s))
    lease = float(flat.get("loop.lease_s", ServeConfig.lease_s))
    if flat["mode"] == "active" and lease < 2 * interval:
        raise ConfigError(
            f"{src}: loop.lease_s: the lease must last at least two cycles "
            f"(2 x loop.interval_s = {2 * interval:g} s; got {lease:g})"
        )
    defaults = MigrationConfig()
    migration = MigrationConfig(
        grace_s=float(flat.get("migration.grace_s", defaults.grace_s)),
        max_grace_s=float(flat.get("migration.max_grace_s", defaults.max_grace_s)),
        budget=int(flat.get("migration.budget", defaults.budget)),
        min_run_s=float(flat.get("migration.min_run_s", defaults.min_run_s)),
    )
    db = flat.get("store.db", ServeConfig.db)
    try:
        serve = ServeConfig(
            mode=flat["mode"],
            partitions=tuple(p.strip() for p in flat["partitions"]),
            policy=policy,
            fallback=fallback,
            slurm_env=env_file,
            transport=flat.get("slurm.transport", ServeConfig.transport),
            db=_under(here, str(db)) if db else None,
            state_dir=_under(here, str(flat.get("store.state_dir", ServeConfig.state_dir))),
            interval_s=interval,
            lease_s=lease,
            max_hold_s=float(flat.get("loop.max_hold_s", ServeConfig.max_hold_s)),
            reload_s=float(flat.get("policy.reload_s", ServeConfig.reload_s)),
            metrics_port=int(port) if address else None,
            metrics_addr=host.strip("[]") if address else ServeConfig.metrics_addr,
            max_cycles=flat.get("loop.max_cycles"),
            watchdog=bool(flat.get("loop.watchdog", True)),
            load_window_s=float(flat.get("loop.load_window_s", ServeConfig.load_window_s)),
            lease_root=_under(here, str(flat.get("loop.lease_root", DEFAULT_LEASE_ROOT))),
            migration=migration,
            default_profile=str(flat.get("policy.default_profile", "")).strip(),
            tracking_uri=resolve_tracking_uri(
                str(flat.get("policy.tracking_uri", DEFAULT_REGISTRY)), here
            ),
            calibration=(
                _under(here, str(flat["policy.calibration"]))
                if "policy.calibration" in flat
                else None
            ),
        )
    except ValueError as exc:  # what the loop's own checks refuse
        raise ConfigError(f"{src}: {exc}") from exc
    return ServiceConfig(serve, str(flat.get("log.format", "json")), src)


def load_service_config(path: str | Path) -> ServiceConfig:
    """``parse_service_config`` of a file; ``ConfigError`` when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    return parse_service_config(text, str(path), Path(path).resolve().parent)


# ------------------------------------------------------------------------ logging


class JsonLineFormatter(logging.Formatter):
    """Every record as one JSON object on one line (journald keeps one entry per line): the
    loop's structured events (``events.log_event``) keep their fields and gain ``level`` and
    ``logger``; any other record becomes ``{ts, message, level, logger}``, a traceback
    folded into ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] | None = None
        if message.startswith("{"):
            try:
                parsed = json.loads(message)
            except ValueError:
                parsed = None
            line = parsed if isinstance(parsed, dict) else None
        if line is None:
            line = {"ts": round(record.created, 3), "message": message}
        line.setdefault("level", record.levelname.lower())
        line.setdefault("logger", record.name)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(fmt: str) -> None:
    """Log INFO and above on stderr: ``text`` (the structured events as they are) or
    ``json`` (every record one JSON line, ``JsonLineFormatter``)."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    if fmt == "text":  # force: a handler set up before (Prefect's, at WARNING) goes
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr, force=True)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
