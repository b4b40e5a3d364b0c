"""Export of transition frames: content-hashed Parquet with a manifest, d3rlpy, MLflow.

``export_dataset`` writes ``transitions-<hash16>.parquet`` and ``transitions-<hash16>.json``
(the manifest) into a folder. The hash is a SHA-256 over the canonical bytes of the
transitions (rows sorted by source, episode and step; every column's values and list
lengths in a fixed byte layout, independent of Parquet writers) followed by the manifest's
inputs (sources, ObsSpec, export version) as sorted JSON. Building the same inputs twice
gives the same hash and the same file names; where the folder is does not matter.

``to_mdp_dataset`` gives a discrete d3rlpy ``MDPDataset`` (an episode cut is a terminal
when the episode really ended, a timeout otherwise), optionally with each step's action
mask carried in the observation (``masks=True``, for ``models.masked``). ``log_to_mlflow``
records the file as a dataset input of an MLflow run when a tracking URI is configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.mdp import ObsSpec
from linkwise.datasets.transitions import TRANSITION_SCHEMA, check_frame, list_column_array

__all__ = [
    "EXPORT_VERSION",
    "canonical_frame",
    "content_hash",
    "dataset_report",
    "export_dataset",
    "file_sha256",
    "log_to_mlflow",
    "read_dataset",
    "to_mdp_dataset",
]

EXPORT_VERSION = 1
FORMAT = "linkwise-transitions"
_ATTEMPTS = ("exact", "nearest", "unslotted")  # steps that try to reproduce a start


def canonical_frame(df: pl.DataFrame) -> pl.DataFrame:
    """The rows in canonical order (source, episode, step), episodes contiguous."""
    return df.sort("source", "episode", "step", maintain_order=True)


def _with_transitions(canon: pl.DataFrame) -> pl.DataFrame:
    """The canonical frame without the episodes that give d3rlpy no transition: one step cut
    by a timeout (no next state). d3rlpy leaves them out of its episodes, so they are left
    out here too, and the frame's episodes stay those of the dataset."""
    one = canon.group_by("episode").agg(pl.len().alias("n"), pl.col("terminal").any())
    empty = one.filter((pl.col("n") == 1) & ~pl.col("terminal"))["episode"]
    return canon.filter(~pl.col("episode").is_in(empty.implode())) if empty.len() else canon


def _list_parts(col: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flattened values) of a list column without nulls."""
    lens = col.list.len().to_numpy().astype("<i8")
    flat = col.explode().drop_nulls().to_numpy()
    return lens, flat


def _column_bytes(col: pl.Series) -> list[bytes]:
    if col.null_count():
        raise ValueError(f"column {col.name!r} has nulls")
    dtype = col.dtype
    if isinstance(dtype, pl.List):
        lens, flat = _list_parts(col)
        inner = flat.astype(np.uint8) if flat.dtype == np.bool_ else flat.astype("<f4")
        return [lens.tobytes(), inner.tobytes()]
    if dtype == pl.String:
        encoded = [s.encode() for s in col.to_list()]
        lens = np.fromiter((len(b) for b in encoded), dtype="<i8", count=len(encoded))
        return [lens.tobytes(), b"".join(encoded)]
    if dtype == pl.Boolean:
        return [col.to_numpy().astype(np.uint8).tobytes()]
    if dtype == pl.Int64:
        return [col.to_numpy().astype("<i8").tobytes()]
    return [col.to_numpy().astype("<f8").tobytes()]


def file_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(df: pl.DataFrame, inputs: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a transition frame's canonical bytes and the JSON of ``inputs``."""
    check_frame(df)
    canon = canonical_frame(df)
    h = hashlib.sha256()
    h.update(f"{FORMAT}/{EXPORT_VERSION}/{canon.height}\n".encode())
    for name in TRANSITION_SCHEMA:
        h.update(name.encode() + b"\0")
        for part in _column_bytes(canon[name]):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    h.update(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def _check_dims(df: pl.DataFrame, spec: ObsSpec) -> None:
    if df.is_empty():
        return
    lens = df.select(
        pl.col("obs").list.len().min().alias("o_min"),
        pl.col("obs").list.len().max().alias("o_max"),
        pl.col("mask").list.len().min().alias("m_min"),
        pl.col("mask").list.len().max().alias("m_max"),
        pl.col("action").min().alias("a_min"),
        pl.col("action").max().alias("a_max"),
    ).row(0, named=True)
    if not lens["o_min"] == lens["o_max"] == spec.dim:
        raise ValueError(
            f"observations have {lens['o_min']}..{lens['o_max']} features, the spec {spec.dim}"
        )
    if not lens["m_min"] == lens["m_max"] == spec.n_actions:
        raise ValueError(
            f"masks have {lens['m_min']}..{lens['m_max']} entries, "
            f"the spec {spec.n_actions} actions"
        )
    if lens["a_min"] < 0 or lens["a_max"] >= spec.n_actions:
        raise ValueError(f"actions outside 0..{spec.n_actions - 1}")


def dataset_report(df: pl.DataFrame, spec: ObsSpec) -> dict[str, Any]:
    """Counts per source and behaviour, the exact-match share of reproduced starts (per
    source: real allocations for logs, heuristic starts for rollouts) and an action
    histogram summary (wait share, distinct actions, top actions, counts per slot and per
    candidate generator)."""
    cfg = spec.config
    n = df.height
    episodes = df["episode"].n_unique() if n else 0
    by_source = {
        str(r["source"]): {"transitions": int(r["transitions"]), "episodes": int(r["episodes"])}
        for r in df.group_by("source")
        .agg(pl.len().alias("transitions"), pl.col("episode").n_unique().alias("episodes"))
        .sort("source")
        .iter_rows(named=True)
    }
    by_behaviour = {
        str(r["behaviour"]): int(r["len"])
        for r in df.group_by("behaviour").len().sort("behaviour").iter_rows(named=True)
    }
    attempts = df.filter(pl.col("match").is_in(_ATTEMPTS))
    match = {
        str(r["source"]): {
            "starts": int(r["starts"]),
            "exact_share": float(r["exact"]) / int(r["starts"]),
        }
        for r in attempts.group_by("source")
        .agg(pl.len().alias("starts"), (pl.col("match") == "exact").sum().alias("exact"))
        .sort("source")
        .iter_rows(named=True)
    }
    exact_all = (
        float((attempts["match"] == "exact").sum()) / attempts.height if attempts.height else None
    )
    counts = (
        np.bincount(df["action"].to_numpy(), minlength=cfg.n_actions)
        if n
        else np.zeros(cfg.n_actions, dtype=np.int64)
    )
    starts = counts[: cfg.wait_action].reshape(cfg.k_slots, cfg.n_candidates)
    order = np.argsort(-counts, kind="stable")[:5]
    return {
        "transitions": n,
        "episodes": episodes,
        "by_source": by_source,
        "by_behaviour": by_behaviour,
        "exact_match_share": exact_all,
        "match_by_source": match,
        "match_kinds": {
            str(r["match"]): int(r["len"])
            for r in df.group_by("match").len().sort("match").iter_rows(named=True)
        },
        "actions": {
            "wait_share": float(counts[cfg.wait_action]) / n if n else 0.0,
            "distinct": int((counts > 0).sum()),
            "top": [[int(a), int(counts[a])] for a in order if counts[a] > 0],
            "by_slot": [int(x) for x in starts.sum(axis=1)],
            "by_candidate": {
                g: int(x) for g, x in zip(cfg.generators, starts.sum(axis=0), strict=True)
            },
        },
    }


def export_dataset(
    df: pl.DataFrame, spec: ObsSpec, sources: Mapping[str, Any], out_dir: str | Path
) -> dict[str, Any]:
    """Write the frame as content-hashed Parquet plus its manifest into ``out_dir``; return the
    manifest (with ``path`` and ``manifest_path`` added, which are not part of the file).

    ``sources`` describes the inputs (accounting window, traces, rollout policies and seeds)
    and must be JSON-serialisable; it enters the hash."""
    check_frame(df)
    _check_dims(df, spec)
    inputs = {
        "format": FORMAT,
        "version": EXPORT_VERSION,
        "sources": json.loads(json.dumps(sources, sort_keys=True)),
        "obs_spec": spec.to_json(),
    }
    digest = content_hash(df, inputs)
    stem = f"transitions-{digest[:16]}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = dataset_report(df, spec)
    manifest: dict[str, Any] = {
        **inputs,
        "hash": digest,
        "file": f"{stem}.parquet",
        "obs_spec_version": spec.version,
        "counts": {
            "transitions": report["transitions"],
            "episodes": report["episodes"],
            "by_source": report["by_source"],
            "by_behaviour": report["by_behaviour"],
        },
        "report": report,
    }
    path = out / f"{stem}.parquet"
    tmp = out / f".{stem}.parquet.tmp"
    canonical_frame(df).write_parquet(tmp, compression="zstd", statistics=False)
    tmp.replace(path)
    mpath = out / f"{stem}.json"
    mtmp = out / f".{stem}.json.tmp"
    mtmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    mtmp.replace(mpath)
    return {**manifest, "path": str(path), "manifest_path": str(mpath)}


def read_dataset(path: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A dataset written by ``export_dataset`` (its Parquet or manifest path): the frame and
    the manifest; ValueError if the content no longer matches the manifest's hash."""
    p = Path(path)
    stem = p.name.removesuffix(".parquet").removesuffix(".json")
    manifest: dict[str, Any] = json.loads((p.parent / f"{stem}.json").read_text())
    df = pl.read_parquet(p.parent / manifest["file"]).cast(pl.Schema(TRANSITION_SCHEMA))
    inputs = {k: manifest[k] for k in ("format", "version", "sources", "obs_spec")}
    if content_hash(df, inputs) != manifest["hash"]:
        raise ValueError(f"{p}: content does not match the manifest's hash")
    return df, manifest


def to_mdp_dataset(df: pl.DataFrame, spec: ObsSpec, *, masks: bool = False) -> Any:
    """A discrete d3rlpy dataset (a ``ReplayBuffer``, ``action_size = spec.n_actions``) of the
    frame in canonical order: each episode's last step is a terminal when the episode ended,
    a timeout when it was cut.

    With ``masks``, each observation is d3rlpy's tuple ``(obs, mask)``: the step's action mask
    as 0/1 float32 ``(N, n_actions)``, so a sampled transition's next observation carries the
    next state's mask (a terminal's next observation is all zeros: nothing allowed); what
    ``models.masked`` trains on. A logged action its own mask forbids is refused.

    The episodes are ``datasets.credit_buffer.TimedEpisode`` (each step's time to the next
    decision point), for ``with_credit``; d3rlpy's default transition picker ignores that."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy  # type: ignore[import-untyped]

    # credit_buffer subclasses d3rlpy's classes, so it imports d3rlpy (torch) at its top
    from linkwise.datasets.credit_buffer import timed_dataset

    check_frame(df)
    _check_dims(df, spec)
    if df.is_empty():
        raise ValueError("cannot build an MDPDataset from no transitions")
    canon = _with_transitions(canonical_frame(df))
    if canon.is_empty():
        raise ValueError("no episode has a transition (each is one step cut by a timeout)")
    observations: Any = list_column_array(canon, "obs", spec.dim, np.float32)
    actions = canon["action"].to_numpy().astype(np.int64)
    if masks:
        allowed = list_column_array(canon, "mask", spec.n_actions, np.bool_)
        bad = ~allowed[np.arange(len(actions)), actions]
        if bad.any():
            first = canon.row(int(np.argmax(bad)), named=True)
            raise ValueError(
                f"{int(bad.sum())} logged actions are not allowed by their own mask, e.g. "
                f"episode {first['episode']!r} step {first['step']} action {first['action']}"
            )
        observations = [observations, allowed.astype(np.float32)]
    dataset = d3rlpy.dataset.MDPDataset(
        observations=observations,
        actions=actions,
        rewards=canon["reward"].to_numpy().astype(np.float32),
        terminals=canon["terminal"].to_numpy().astype(np.float32),
        timeouts=canon["timeout"].to_numpy().astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=spec.n_actions,
    )
    return timed_dataset(dataset, canon)


def log_to_mlflow(
    path: str | Path,
    manifest: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str = "linkwise-datasets",
    run_id: str | None = None,
) -> str | None:
    """Record the dataset as an input of an MLflow run (``run_id``, else a new run named after
    the hash in ``experiment``), with its hash and counts as ``linkwise.dataset.*`` tags; the
    run id, or None when no tracking URI is given or set in ``MLFLOW_TRACKING_URI``. The
    caller opens the store first (``models.registry.open_registry``: a fresh SQLite one's
    schema is created under a lock)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return None
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow takes about a second to import: only where a run or the registry is used
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    short = str(manifest["hash"])[:16]
    if run_id is None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            artifacts = (Path(path).resolve().parent / "mlartifacts").as_uri()
            exp_id = client.create_experiment(experiment, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        run_id = client.create_run(exp_id, run_name=f"dataset-{short}").info.run_id
        finish = True
    else:
        finish = False
    with warnings.catch_warnings():  # the file:// scheme is registered twice by MLflow itself
        warnings.filterwarnings("ignore", message=".*can be interpreted in multiple ways.*")
        source = resolve_dataset_source(Path(path).resolve().as_uri())
    ds = MetaDataset(  # type: ignore[abstract]
        source=source, name=f"transitions-{short}", digest=short
    )
    tags = [InputTag("mlflow.data.context", "training")]
    client.log_inputs(run_id, datasets=[DatasetInput(ds._to_mlflow_entity(), tags=tags)])
    counts = manifest.get("counts", {})
    for key, value in {
        "hash": manifest["hash"],
        "obs_spec_version": manifest.get("obs_spec_version", ""),
        "transitions": counts.get("transitions", ""),
        "episodes": counts.get("episodes", ""),
    }.items():
        client.set_tag(run_id, f"linkwise.dataset.{key}", str(value))
    if finish:
        client.set_terminated(run_id)
    return run_id
