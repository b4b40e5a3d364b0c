"""One command-line package (issue 35 item 2): every command answers ``--help`` with its
defaults shown, and no library module defines a command line (``argparse``, ``sys.exit``)."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkwise.cli import build_parser, main
from linkwise.cli.common import shown_default

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("cluster", "datasets", "models", "evaluation", "pipelines", "deployer")


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


def _option_help(text: str, flag: str) -> str:
    """The lines ``--help`` prints for ``flag``: its invocation and its help, joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] in ([flag], [flag + ","]))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip().startswith("-"):
            break
        block.append(line)
    return " ".join(" ".join(block).split())


COMMANDS = [path for path, _ in _subcommands(build_parser())]


def test_the_registry_has_every_command() -> None:
    top = [path[0] for path in COMMANDS if len(path) == 1]
    assert len(top) == len(set(top)) == 20
    assert ("collect", "accounting") in COMMANDS and ("collect", "telemetry") in COMMANDS
    assert top[:3] == ["simulate", "compare", "calibrate"]  # the order --help lists


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_answers_help_with_its_defaults(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option, no wrapped values
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: linkwise {' '.join(path)}")
    parser = dict(_subcommands(build_parser()))[path]
    for action in parser._actions:
        shown = shown_default(action)
        if shown is None:
            continue
        flag = action.option_strings[0]
        assert action.help, f"{' '.join(path)} {flag}: a default and no help"
        line = _option_help(text, flag)
        said = "default" in action.help.lower() or f"({shown})" in action.help  # in its words
        assert said or line.endswith(f"(default: {shown})"), line


def test_a_default_the_help_already_states_is_not_shown_twice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["label", "--help"])
    text = capsys.readouterr().out
    assert _option_help(text, "--samples").endswith("forked samples per move (4)")
    assert _option_help(text, "--seeds").endswith("(default: 0)")  # a tuple, as typed
    assert _option_help(text, "--window-hours").endswith("window length, hours (default: 24.0)")


def _library_modules() -> list[Path]:
    files = [p for folder in LIBRARY for p in sorted((ROOT / folder).rglob("*.py"))]
    return files + sorted((ROOT / "linkwise").glob("*.py"))


def _is_sys_exit(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "exit"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _command_line_parts(path: Path) -> list[str]:
    """Where ``path`` imports argparse or calls ``sys.exit`` / raises ``SystemExit``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if "argparse" in names:
            found.append(f"{node.lineno}: imports argparse")
        if _is_sys_exit(node):
            found.append(f"{node.lineno}: sys.exit")
        if isinstance(node, ast.Name) and node.id == "SystemExit":
            found.append(f"{node.lineno}: SystemExit")
    return found


def test_no_library_module_defines_a_command_line() -> None:
    files = _library_modules()
    assert len(files) > 100 and not any("cli" in p.relative_to(ROOT).parts for p in files)
    bad = [f"{p.relative_to(ROOT)}:{where}" for p in files for where in _command_line_parts(p)]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_lazy_imports_and_exits(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import sys\n"
        "def f():\n"
        "    from argparse import ArgumentParser\n"
        "    sys.exit(ArgumentParser())\n"
        "def g():\n"
        "    import argparse as a\n"
        "    raise SystemExit(1)\n"
    )
    assert set(_command_line_parts(src)) == {
        "3: imports argparse",
        "4: sys.exit",
        "6: imports argparse",
        "7: SystemExit",
    }
