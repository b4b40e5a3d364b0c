"""One floor per layer (issue 23 item 8, issue 35): ``cluster`` imports nothing of linkwise
above it, ``policies`` (the policy language) only ``cluster`` and itself, ``datasets`` only
``cluster``, ``policies`` and itself, never ``models``, ``evaluation``, ``pipelines`` or
``deployer``; ``testkit`` (what tests and benchmarks share) the same floors as ``datasets``,
and no floor below it imports it. Every import of every module (lazy ones inside functions
included) is read with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = (
    "cluster",
    "policies",
    "datasets",
    "models",
    "evaluation",
    "pipelines",
    "deployer",
    "ops",
    "testkit",
)
# the linkwise packages each floor may import (itself included)
ALLOWED: dict[str, frozenset[str]] = {
    "cluster": frozenset({"cluster"}),
    "policies": frozenset({"cluster", "policies"}),
    "datasets": frozenset({"cluster", "policies", "datasets"}),
    # what tests and benchmarks share: the floors it builds on, never one above
    "testkit": frozenset({"cluster", "policies", "datasets", "testkit"}),
}
# (module path, imported package) pairs allowed despite the floors, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _imports(path: Path) -> set[tuple[str, int]]:
    """The linkwise subpackages ``path`` imports (absolute imports), with the line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "linkwise":  # from linkwise import models
                names = [f"linkwise.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "linkwise" and len(parts) > 1 and parts[1] in LAYERS:
                found.add((parts[1], node.lineno))
    return found


def _violations(layer: str) -> list[str]:
    out = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for package, line in sorted(_imports(path)):
            if package not in ALLOWED[layer] and (rel, package) not in EXCEPTIONS:
                out.append(f"{rel}:{line} imports linkwise.{package}")
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_layer_imports_one_above_it(layer: str) -> None:
    assert (ROOT / layer).is_dir()
    assert not _violations(layer), "\n".join(_violations(layer))


def test_the_checker_sees_lazy_and_aliased_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import linkwise.cluster.mdp\n"
        "def f():\n"
        "    from linkwise.models.learned import load_package\n"
        "    import linkwise.pipelines.iterate as it\n"
        "    from linkwise import deployer\n"
    )
    assert {p for p, _ in _imports(src)} == {"cluster", "models", "pipelines", "deployer"}


def test_every_exception_still_names_an_import() -> None:
    for (rel, package), reason in EXCEPTIONS.items():
        assert reason and (package,) in {(p,) for p, _ in _imports(ROOT / rel)}, rel


def test_learned_behaviours_are_resolved_at_the_pipelines_edge(tmp_path: Path) -> None:
    """A ``model:PATH`` rollout needs its policy resolved by the pipeline (datasets cannot
    load it), and the resolved policy pickles to a worker (reloaded, checksums verified)."""
    import pickle

    import numpy as np

    from linkwise.cluster.topology.load import load_topology
    from linkwise.datasets.rollouts import RolloutTask, Window
    from linkwise.pipelines.build_dataset import resolve_learned
    from linkwise.policies.spec import PolicySpec

    pkg = PolicySpec.parse(f"model:{ROOT / 'models' / 'pretrained' / 'philly-all'}")
    window = Window(0, 0.0, 3600.0, ())
    with pytest.raises(ValueError, match="pipeline's edge"):
        RolloutTask(pkg, 0.0, 0, window, load_topology("2x8"))
    from linkwise.models.learned import load_package

    spec = load_package(str(ROOT / "models" / "pretrained" / "philly-all")).spec
    learned = resolve_learned([PolicySpec.parse("fifo"), pkg], spec)
    assert list(learned) == [pkg]
    task = RolloutTask(pkg, 0.0, 0, window, load_topology("2x8"), spec.config, learned=learned[pkg])
    copy = pickle.loads(pickle.dumps(task))
    assert copy.learned is not None and copy.learned is not task.learned
    obs = np.zeros(spec.dim, dtype=np.float32)
    mask = np.ones(spec.config.n_actions, dtype=np.bool_)
    assert copy.learned.act(obs, mask) == task.learned.act(obs, mask)
    with pytest.raises(ValueError, match="heuristic"):
        RolloutTask(
            PolicySpec.parse("fifo"), 0.0, 0, window, load_topology("2x8"), learned=learned[pkg]
        )


# folders whose files import each other only at the top (no import inside a function, which
# would hide a circle) and in no circle
NO_CIRCLES = ("policies",)


def _linkwise_imports(path: Path) -> tuple[set[str], list[int]]:
    """The linkwise modules ``path`` imports at its top level, and the lines of linkwise
    imports made inside a function."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("linkwise."):
                top.add(node.module)
        elif isinstance(node, ast.Import):
            top |= {a.name for a in node.names if a.name.startswith("linkwise.")}
    inside = [
        inner.lineno
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(fn)
        if (isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("linkwise"))
        or (
            isinstance(inner, ast.Import)
            and any(a.name.startswith("linkwise") for a in inner.names)
        )
    ]
    return top, inside


@pytest.mark.parametrize("layer", NO_CIRCLES)
def test_no_file_circle_and_no_import_inside_a_function(layer: str) -> None:
    graph: dict[str, set[str]] = {}
    lazy: list[str] = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = "linkwise." + ".".join(rel.parts).removesuffix(".__init__")
        top, inside = _linkwise_imports(path)
        graph[name] = top
        lazy += [f"{rel}.py:{line}" for line in inside]
    assert not lazy, f"imports inside a function: {lazy}"
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ()) & graph.keys()):
            assert seen.get(nxt) != 1, f"a file circle: {' -> '.join([*path, node, nxt])}"
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [])
