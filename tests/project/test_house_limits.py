"""One concern per file (issue 35 item 3): no library file over ``MAX_FILE_LINES`` lines and
no function over ``MAX_FUNCTION_LINES`` lines (its ``def`` to its last line, nested functions
included) outside ``benchmarks/`` and the tests. Every ``.py`` file of the library folders is
read with ``ast``; the symlinks in ``linkwise/`` to those folders are not followed twice."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
LIBRARY = (
    "cluster",
    "policies",
    "datasets",
    "models",
    "evaluation",
    "pipelines",
    "deployer",
    "linkwise",
    "ops",
    "scripts",
)


def _root() -> Path:
    """The repository root: the first folder above this file with ``pyproject.toml``."""
    here = Path(__file__).resolve()
    return next(p for p in here.parents if (p / "pyproject.toml").is_file())


def _library_files(root: Path) -> Iterator[Path]:
    for top in LIBRARY:
        folder = root / top
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            inside = path.relative_to(root).parts
            # linkwise/cluster -> ../cluster and the like: measured under their own folder
            if any((root.joinpath(*inside[:i])).is_symlink() for i in range(1, len(inside))):
                continue
            yield path


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_library_is_found() -> None:
    """The walk sees the library (a wrong root would make the limits pass vacuously)."""
    root = _root()
    names = {p.relative_to(root).as_posix() for p in _library_files(root)}
    assert "cluster/domain.py" in names
    assert "pipelines/evaluate.py" in names
    assert not any(n.startswith("linkwise/cluster/") for n in names)


def test_no_library_file_is_over_the_limit() -> None:
    root = _root()
    long = {
        path.relative_to(root).as_posix(): n
        for path in _library_files(root)
        if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"library files over {MAX_FILE_LINES} lines (split by concern): {long}"


def test_no_library_function_is_over_the_limit() -> None:
    root = _root()
    long = {
        path.relative_to(root).as_posix(): found
        for path in _library_files(root)
        if (found := _long_functions(path, MAX_FUNCTION_LINES))
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (make small ones): {long}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 3, []),
        ("def f():\n" + "    x = 1\n" * 4, ["f (line 1): 5 lines"]),
        ("class C:\n    def g(self):\n" + "        x = 1\n" * 4, ["g (line 2): 5 lines"]),
    ],
)
def test_a_long_function_is_found(tmp_path: Path, source: str, expected: list[str]) -> None:
    """The measure itself: a function of more lines than the limit, methods included."""
    path = tmp_path / "m.py"
    path.write_text(source)
    assert _long_functions(path, 4) == expected
