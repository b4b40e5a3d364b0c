"""The tests mirror the package (issue 35 item 5): every test module sits in the folder of
what it tests (``tests/cluster/`` for ``cluster/``, ``tests/cli/`` for the root package
``linkwise/``: the command line, ``parallel.py``, ``supervise.py``; ``tests/ops/`` for
``ops/``; ``tests/project/`` for checks of the whole tree), never flat in ``tests/``. The root
holds only ``conftest.py``, the shared helpers (``_*.py``) and the data the tests read
(``data/``, ``fixtures/``, ``migration_job.sh``). Every services module ``conftest.py`` names
exists."""

from __future__ import annotations

from pathlib import Path

from linkwise.tests.conftest import SERVICES_MODULES

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
# test folders that mirror no top-level folder of the same name, each with what it holds
OTHER_FOLDERS = {
    "cli": "the root package linkwise/ (cli/, parallel.py, supervise.py)",
    "project": "checks of the whole tree (floors, this layout)",
}
DATA_FOLDERS = frozenset({"data", "fixtures"})


def _is_test_module(path: Path) -> bool:
    """What pytest collects by default (``python_files``)."""
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def _misplaced(tests: Path, root: Path) -> list[str]:
    """Test modules at the root of ``tests``, and test folders that mirror nothing in ``root``."""
    out = [p.name for p in sorted(tests.iterdir()) if p.is_file() and _is_test_module(p)]
    for folder in sorted(p for p in tests.iterdir() if p.is_dir()):
        if folder.name in DATA_FOLDERS or folder.name.startswith((".", "_")):
            continue
        if not any(_is_test_module(p) for p in folder.rglob("*.py")):
            continue  # __pycache__ and the like
        if folder.name not in OTHER_FOLDERS and not (root / folder.name).is_dir():
            out.append(f"{folder.name}/ (no {folder.name}/ in the repository)")
    return out


def test_no_test_module_is_flat_in_tests_and_every_folder_mirrors_one() -> None:
    assert not _misplaced(TESTS, ROOT), (
        f"move these into the folder of what they test: {_misplaced(TESTS, ROOT)}"
    )


def test_the_check_sees_a_flat_module_and_a_folder_that_mirrors_nothing(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    for rel in ("conftest.py", "_helper.py", "test_flat.py", "cluster/test_ok.py"):
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text("")
    (tests / "data").mkdir()
    (tests / "data" / "test_recorded.py").write_text("")  # data, not collected from here
    (tmp_path / "cluster").mkdir()
    assert _misplaced(tests, tmp_path) == ["test_flat.py"]
    (tests / "clustr").mkdir()
    (tests / "clustr" / "test_typo.py").write_text("")
    assert _misplaced(tests, tmp_path) == ["test_flat.py", "clustr/ (no clustr/ in the repository)"]


def test_every_services_module_exists() -> None:
    missing = sorted(m for m in SERVICES_MODULES if not (TESTS / m).is_file())
    assert not missing, f"tests/conftest.py's SERVICES_MODULES names no such file: {missing}"
