"""One floor per layer (issue 23 item 8, issue 35 item 4), as ``docs/ARCHITECTURE.md`` draws
them: each floor imports only itself, the floors below it and the shared modules
(``linkwise/parallel.py``, ``linkwise/supervise.py``, which import no floor):

    cli            linkwise/cli: every command
    pipelines      flows, the steps of a run; may start the live loop's pieces
    deployer       the live loop, promotion
    evaluation     benchmark, statistics, gates, off-policy evaluation, shadow reports
    models         learned policies; builds ``model:`` specs
    datasets       logs, rollouts, stores
    policies       the policy language
    cluster        the domain, imports nothing of linkwise

``testkit`` (what tests and benchmarks share, not a floor of the library) imports the floors
``datasets`` does, and no floor imports it. Every import of every module (those made inside
functions included) is read with ``ast``.
No file circle among linkwise modules, and no linkwise import inside a function but for a
module that imports a slow third-party library at its top (with the reason beside it); every
third-party import inside a function carries its reason."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each floor's sources, lowest first (the order of the drawing above, read bottom up)
FLOORS: dict[str, tuple[str, ...]] = {
    "cluster": ("cluster",),
    "policies": ("policies",),
    "datasets": ("datasets",),
    "models": ("models",),
    "evaluation": ("evaluation",),
    "deployer": ("deployer",),
    "pipelines": ("pipelines",),
    "cli": ("linkwise/cli",),
}
SHARED: dict[str, tuple[str, ...]] = {
    "parallel": ("linkwise/parallel.py",),
    "supervise": ("linkwise/supervise.py",),
}
# what tests and benchmarks share: beside the floors, importing those ``datasets`` does
SIDE: dict[str, tuple[str, ...]] = {"testkit": ("testkit",)}
LAYERS = (*FLOORS, *SHARED, *SIDE, "ops")
# the linkwise packages each floor imports (itself included): what the code has, each set
# within the floors below it (test_the_floors_are_the_drawing)
ALLOWED: dict[str, frozenset[str]] = {
    "cluster": frozenset({"cluster"}),
    "policies": frozenset({"cluster", "policies"}),
    "datasets": frozenset({"cluster", "policies", "datasets", "parallel"}),
    "models": frozenset({"cluster", "policies", "datasets", "models"}),
    "evaluation": frozenset(
        {"cluster", "policies", "datasets", "models", "evaluation", "parallel"}
    ),
    "deployer": frozenset({"cluster", "policies", "datasets", "models", "evaluation", "deployer"}),
    "pipelines": frozenset(
        {
            "cluster",
            "policies",
            "datasets",
            "models",
            "evaluation",
            "deployer",
            "pipelines",
            "parallel",
        }
    ),
    "cli": frozenset({*FLOORS, "supervise"}),
    "parallel": frozenset({"parallel", "supervise"}),
    "testkit": frozenset({"cluster", "policies", "datasets", "testkit"}),
    "supervise": frozenset({"supervise"}),
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


def _files(sources: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for source in sources:
        path = ROOT / source
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def _violations(layer: str) -> list[str]:
    out = []
    for path in _files({**FLOORS, **SHARED, **SIDE}[layer]):
        rel = path.relative_to(ROOT).as_posix()
        for package, line in sorted(_imports(path)):
            if package not in ALLOWED[layer] and (rel, package) not in EXCEPTIONS:
                out.append(f"{rel}:{line} imports linkwise.{package}")
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_layer_imports_one_above_it(layer: str) -> None:
    assert all((ROOT / s).exists() for s in {**FLOORS, **SHARED, **SIDE}[layer])
    assert not _violations(layer), "\n".join(_violations(layer))


def test_the_floors_are_the_drawing() -> None:
    """Each floor's allowed set holds only floors below it and the shared modules, and every
    package with linkwise code has a floor (``ops/`` holds no Python: it would need one)."""
    order = list(FLOORS)
    for layer, allowed in ALLOWED.items():
        if layer in FLOORS:
            below = set(order[: order.index(layer) + 1]) | set(SHARED)
            assert allowed <= below, (layer, allowed - below)
    assert ALLOWED["parallel"] <= set(SHARED) and ALLOWED["supervise"] <= set(SHARED)
    assert ALLOWED["testkit"] <= ALLOWED["datasets"] | {"testkit"}
    assert set(ALLOWED) == set(FLOORS) | set(SHARED) | set(SIDE)
    assert not list((ROOT / "ops").rglob("*.py"))
    folders = {p.name for p in (ROOT / "linkwise").iterdir() if p.is_symlink()} - {"tests"}
    assert folders <= set(FLOORS) | set(SIDE), folders - set(FLOORS) - set(SIDE)
    modules = {p.stem for p in (ROOT / "linkwise").glob("*.py")} - {"__init__"}
    assert modules == set(SHARED), modules


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


# third-party libraries slow enough to import (a second or more, or torch underneath) that a
# module imports them inside the function that needs them, so that ``linkwise --help`` and
# ``linkwise serve`` start without them (test_the_command_line_starts_without_them)
SLOW = frozenset(
    {
        "torch",
        "d3rlpy",
        "stable_baselines3",
        "sb3_contrib",
        "mlflow",
        "prefect",
        "prefect_dask",
        "dask",
        "matplotlib",
        "scipy",
    }
)
# the slow libraries building the command line must not import
STARTUP_FREE = SLOW
# linkwise imports inside a function for a reason other than a slow library, with the reason
LAZY: dict[tuple[str, str], str] = {
    ("linkwise/cli/__init__.py", "linkwise.cli"): (
        "the command registry: the watchdog process (python -m linkwise.cli.watchdog) "
        "imports this package and loads 246 modules, not 920"
    ),
}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _sources() -> dict[str, Path]:
    """Every linkwise module's name and file."""
    out: dict[str, Path] = {}
    for sources in (*FLOORS.values(), *SHARED.values(), *SIDE.values(), ("linkwise/__init__.py",)):
        for path in _files(sources):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts if rel.parts[0] == "linkwise" else ("linkwise", *rel.parts)
            out[".".join(parts).removesuffix(".__init__")] = path
    return out


def _module(name: str, modules: dict[str, Path]) -> str | None:
    """The linkwise module an imported name is (a module, or a name inside one)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _in_functions(tree: ast.Module) -> set[int]:
    return {
        id(inner)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(fn)
        if isinstance(inner, ast.Import | ast.ImportFrom)
    }


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names an import statement reads (``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level or not node.module:
        return []
    return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]


@functools.cache
def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[ast.AST, list[str]]]]]:
    """Module -> the linkwise modules it imports (anywhere), and module -> its imports made
    inside a function (the node and the names it reads)."""
    modules = _sources()
    graph: dict[str, set[str]] = {}
    inner: dict[str, list[tuple[ast.AST, list[str]]]] = {}
    for name, path in modules.items():
        tree = _tree(path)
        lazy = _in_functions(tree)
        graph[name] = set()
        inner[name] = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _targets(node)
            found = {_module(n, modules) for n in names if n.split(".")[0] == "linkwise"}
            graph[name] |= {m for m in found if m and m != name}
            if id(node) in lazy:
                inner[name].append((node, names))
    return graph, inner


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One file circle of the graph, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_file_circle() -> None:
    """No circle among linkwise modules, counting every import (inside functions too)."""
    graph, _ = _graph()
    circle = _circle(graph)
    assert circle is None, "a file circle: " + " -> ".join(circle or [])


def test_the_circle_finder_finds_one() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


_MARKERS = re.compile(r"type:\s*ignore(\[[^\]]*\])?|noqa(:\s*[A-Z0-9, ]+)?|fmt:\s*\w+")


def _says_why(text: str) -> bool:
    """Whether a line carries a comment with words (not only type: ignore / noqa)."""
    if "#" not in text:
        return False
    return bool(_MARKERS.sub("", text[text.index("#") :]).replace("#", "").strip())


def _reason(lines: list[str], node: ast.AST, starts: dict[int, int]) -> bool:
    """Whether an import states its reason: a comment on its lines, or on the line above it
    or above the imports right before it."""
    first, last = node.lineno, node.end_lineno or node.lineno
    if any(_says_why(lines[i - 1]) for i in range(first, last + 1)):
        return True
    above = first - 1
    while above in starts:  # a line of the import statement just above
        above = starts[above] - 1
    return above > 0 and lines[above - 1].strip().startswith("#") and _says_why(lines[above - 1])


def _slow(module: str, graph_top: dict[str, set[str]], slow_top: dict[str, bool]) -> bool:
    """Whether importing ``module`` imports a ``SLOW`` library (its top-level imports, and
    theirs)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if slow_top.get(name):
            return True
        todo += graph_top.get(name, ())
    return False


@functools.cache
def _top_imports() -> tuple[dict[str, set[str]], dict[str, bool]]:
    """Module -> the linkwise modules it imports at its top; module -> whether its top
    imports a ``SLOW`` library."""
    modules = _sources()
    top: dict[str, set[str]] = {}
    slow: dict[str, bool] = {}
    for name, path in modules.items():
        tree = _tree(path)
        lazy = _in_functions(tree)
        nodes = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in lazy
        ]
        names = [t for n in nodes for t in _targets(n)]
        top[name] = {m for t in names if t.startswith("linkwise") and (m := _module(t, modules))}
        slow[name] = any(t.split(".")[0] in SLOW for t in names)
    return top, slow


@functools.cache
def _lazy_imports() -> tuple[list[str], list[str]]:
    """The linkwise imports inside a function that break the rule, and the third-party ones
    inside a function that give no reason."""
    _, inner = _graph()
    top, slow = _top_imports()
    modules = _sources()
    linkwise: list[str] = []
    silent: list[str] = []
    for name, nodes in sorted(inner.items()):
        path = modules[name]
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text().splitlines()
        tree = _tree(path)
        starts = {
            line: n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)
        }
        for node, names in nodes:
            where = f"{rel}:{node.lineno}"
            roots = {n.split(".")[0] for n in names}
            if roots <= set(sys.stdlib_module_names):
                linkwise.append(f"{where} (the standard library: import it at the top)")
            elif "linkwise" in roots:
                found = {_module(n, modules) or "" for n in names if n.startswith("linkwise")}
                # ``from linkwise.models import masked``: the module masked, not the package
                targets = {m for m in found if m and not any(o.startswith(f"{m}.") for o in found)}
                if (rel, names[0]) in LAZY:
                    continue
                if not all(_slow(t, top, slow) for t in targets):
                    linkwise.append(f"{where} imports {sorted(targets)}, which import nothing slow")
                elif not _reason(lines, node, starts):
                    linkwise.append(f"{where} gives no reason")
            elif not _reason(lines, node, starts):
                silent.append(where)
    return linkwise, silent


def test_no_linkwise_import_inside_a_function() -> None:
    """A linkwise import sits at its module's top, unless the module imported loads a slow
    library at its top (``SLOW``; the reason beside it) or ``LAZY`` names it."""
    linkwise, _ = _lazy_imports()
    assert not linkwise, "\n".join(linkwise)


def test_every_third_party_import_inside_a_function_says_why() -> None:
    _, silent = _lazy_imports()
    assert not silent, "third-party imports inside a function without a reason:\n" + "\n".join(
        silent
    )


def test_every_lazy_entry_still_names_an_import() -> None:
    _, inner = _graph()
    modules = {p.relative_to(ROOT).as_posix(): n for n, p in _sources().items()}
    for (rel, name), reason in LAZY.items():
        assert reason and any(names[0] == name for _, names in inner[modules[rel]]), rel


def test_the_reason_checker_reads_comments() -> None:
    lines = [
        "def f():",
        "    # torch takes seconds to import",
        "    import torch",
        "    import numpy  # type: ignore[import-untyped]",
        "    x = 1",
        "    import scipy  # only here",
        "    import yaml  # type: ignore[import-untyped]",
    ]
    tree = ast.parse("\n".join(lines))
    starts = {n.lineno: n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import)}
    found = {
        n.names[0].name: _reason(lines, n, starts)
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
    }
    assert found == {"torch": True, "numpy": True, "scipy": True, "yaml": False}


def test_the_command_line_starts_without_the_slow_libraries() -> None:
    """What the imports kept inside functions are for: building every command's parser (what
    ``linkwise --help`` and ``linkwise serve`` do first) imports none of ``STARTUP_FREE``, and the
    watchdog process none of the command modules."""
    code = (
        "import sys; from linkwise.cli import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    argv = [sys.executable, "-c", code, *sorted(STARTUP_FREE)]
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout
    code = "import sys, linkwise.cli.watchdog; print(sorted(sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    commands = {f"linkwise.cli.{c}" for c in ("calibrate", "data", "evaluate", "serve", "simulate")}
    assert "linkwise.cli.watchdog" in res.stdout
    assert not commands & set(ast.literal_eval(res.stdout.strip())), res.stdout
