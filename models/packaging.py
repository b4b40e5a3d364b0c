"""Writing a policy package (the format: ``models.learned``): the network of all action
values of a fitted d3rlpy algorithm traced to TorchScript (``export_network``, checked against
the algorithm's greedy actions), and ``write_package``, the one writer for BC/CQL and PPO
(network, spec, dataset manifest, run-time predictor, metadata, checksums)."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.mdp import ObsSpec
from linkwise.datasets.export import file_sha256
from linkwise.datasets.prediction import predictor_from_manifest, write_predictor
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.models.learned import (
    CHECKSUMS,
    DATASET,
    FILES,
    META,
    NETWORK,
    OBS_SPEC,
    PACKAGE_FORMAT,
    PREDICTOR,
)

__all__ = ["export_network", "save_package", "value_module", "write_package"]


def value_module(algo: Any) -> tuple[Any, str]:
    """The torch module giving all action values of a fitted d3rlpy algorithm, and its kind."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    impl = algo.impl
    if impl is None:
        raise ValueError("the algorithm has no model yet: fit it first")
    scaler = getattr(algo.config, "observation_scaler", None)
    if scaler is not None:
        raise ValueError("observation scalers are not exported (the ObsSpec normalises)")
    name = type(algo).__name__
    modules = impl.modules
    if hasattr(modules, "q_funcs"):  # DQN family (DiscreteCQL, DQN, DoubleDQN)
        q_funcs = modules.q_funcs

        class QValues(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.q_funcs = q_funcs

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                values = [q(x).q_value for q in self.q_funcs]
                return torch.stack(values, dim=0).mean(dim=0)

        return QValues(), "q"
    if hasattr(modules, "imitator"):  # DiscreteBC
        imitator = modules.imitator

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.imitator = imitator

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.log_softmax(self.imitator(x).logits, dim=-1)

        return Logits(), "logits"
    raise ValueError(f"cannot export {name}: neither a Q-function nor an imitator")


def export_network(algo: Any, spec: ObsSpec, path: str | Path) -> str:
    """Trace the algorithm's all-action network on CPU to TorchScript at ``path``; returns the
    kind of values ("q" or "logits"). The traced network reproduces the algorithm's greedy
    actions (checked on random inputs)."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    module, kind = value_module(algo)
    module = copy.deepcopy(module).to("cpu").eval()
    for p in module.parameters():
        p.requires_grad_(False)
    example = torch.zeros(2, spec.dim, dtype=torch.float32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
        traced = torch.jit.trace(module, example)  # type: ignore[no-untyped-call]
        probe = torch.rand(16, spec.dim, generator=torch.Generator().manual_seed(0))
        values = traced(probe).numpy()
    if values.shape != (16, spec.n_actions):
        raise ValueError(f"network gives shape {values.shape}, expected (16, {spec.n_actions})")
    expected = np.asarray(algo.predict(probe.numpy()))
    if not np.array_equal(values.argmax(axis=1), expected):
        raise ValueError("the exported network disagrees with the algorithm's greedy actions")
    traced.save(str(path))
    return kind


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_package(
    out_dir: str | Path,
    spec: ObsSpec,
    manifest: Mapping[str, Any],
    *,
    export: Callable[[Path], str],
    algo: str,
    versions: Mapping[str, str],
    meta: Mapping[str, Any] | None = None,
    predictor: RuntimePredictor | None = None,
) -> Path:
    """The one package writer (BC/CQL and PPO): ``export`` writes the TorchScript network to
    the path it is given and returns what its outputs are (``"q"`` or ``"logits"``); then the
    spec, the dataset manifest, the run-time predictor (``predictor``, else the one the
    manifest records, if any), the metadata (with ``versions`` of the libraries) and the
    checksums. ``out_dir`` is created and must be empty or absent; returns the folder."""
    # torch takes seconds to import: only where a network is built, exported or read
    import torch

    if predictor is None:
        predictor = predictor_from_manifest(manifest)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    kind = export(out / NETWORK)
    _write_json(out / OBS_SPEC, spec.to_json())
    dataset = {k: v for k, v in manifest.items() if k not in ("path", "manifest_path")}
    _write_json(out / DATASET, dataset)
    names = list(FILES)
    if predictor is not None:
        write_predictor(predictor, out / PREDICTOR)
        names.append(PREDICTOR)
    _write_json(
        out / META,
        {
            **(meta or {}),
            "format": PACKAGE_FORMAT,
            "algo": algo,
            "values": kind,
            "obs_spec_version": spec.version,
            "dim": spec.dim,
            "n_actions": spec.n_actions,
            "dataset_hash": manifest.get("hash"),
            "predictor_sha256": file_sha256(out / PREDICTOR) if predictor is not None else None,
            "torch": torch.__version__,
            **versions,
        },
    )
    lines = [f"{file_sha256(out / name)}  {name}\n" for name in names]
    (out / CHECKSUMS).write_text("".join(lines))
    return out


def save_package(
    algo: Any,
    spec: ObsSpec,
    manifest: Mapping[str, Any],
    out_dir: str | Path,
    *,
    meta: Mapping[str, Any] | None = None,
    predictor: RuntimePredictor | None = None,
) -> Path:
    """Write a policy package for a fitted d3rlpy algorithm into ``out_dir`` (created; must
    be empty or absent), with ``predictor`` (else the one the manifest records); returns the
    folder."""
    # d3rlpy (torch) takes seconds to import: only where an algorithm is built or fit
    import d3rlpy  # type: ignore[import-untyped]

    return write_package(
        out_dir,
        spec,
        manifest,
        export=lambda path: export_network(algo, spec, path),
        algo=type(algo).__name__,
        versions={"d3rlpy": d3rlpy.__version__},
        meta=meta,
        predictor=predictor,
    )
