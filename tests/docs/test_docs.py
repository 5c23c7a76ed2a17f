"""The documentation is part of the product: its examples run, and what it names exists."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import kernel
import projections
from projections.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(d)], ids=lambda d: d.name)
def test_the_examples_run_in_order_in_one_namespace(doc, tmp_path, monkeypatch):
    if doc.name == "agents.md":  # the agents extra (tests/agents/conftest.py: never skipped in CI)
        pytest.importorskip("agent_framework")
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = types.ModuleType(f"doc_{doc.stem}")  # a real module: dataclasses look it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for number, block in enumerate(python_blocks(doc), start=1):
        exec(compile(block, f"{doc.name}[example {number}]", "exec"), namespace)


def promised_output(example: str) -> list[str]:
    """What an example says it prints: the comment after each ``print(...)`` line."""
    return [
        line.rpartition("  # ")[2]
        for line in example.splitlines()
        if line.lstrip().startswith("print(") and "  # " in line
    ]


def test_the_readme_example_prints_what_its_comment_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(kernel.DEFAULT_STORE_ENV, raising=False)  # the example's memory store
    (example,) = python_blocks(ROOT / "README.md")
    promised = promised_output(example)
    assert promised, "the README example's print line says what it prints in a comment"
    exec(compile(example, "README.md[example 1]", "exec"), {"__name__": "doc_readme"})
    assert capsys.readouterr().out.splitlines() == promised


def test_the_readme_example_is_at_most_sixteen_lines():
    (example,) = python_blocks(ROOT / "README.md")
    assert len(example.strip().splitlines()) <= 16


def test_every_test_the_guarantees_name_exists():
    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = 0
    for cell in re.findall(r"`([a-z_/]+\.py)((?:::\w+)?)`((?:, `::\w+`)*)", text):
        path, first, rest = cell
        functions = _test_functions(ROOT / "tests" / path)
        for name in [first, *re.findall(r"::(\w+)", rest)]:
            if name:
                assert name.removeprefix("::") in functions, f"{path}{name} does not exist"
                named += 1
    assert named >= 30


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_the_cli_reference_lists_exactly_the_commands():
    text = (ROOT / "docs" / "cli.md").read_text()
    text = text[text.index("## Commands") :]
    documented = set(re.findall(r"^\| `(\w+)", text, flags=re.MULTILINE)) - {
        "pos",
        "step",
        "run",
        "time",
        "inside",
    }
    assert documented == set(COMMANDS)


@pytest.mark.parametrize("package", [kernel, projections], ids=lambda p: p.__name__)
def test_public_names_are_exported_once_and_exist(package):
    names = package.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(package, name), name
    assert projections.fold_committed is kernel.fold_committed


def test_the_import_contracts_hold():
    """kernel never imports projections; projections imports only the package ``kernel``; the
    rooms of each package keep their layers, with no circle (pyproject.toml's
    ``[tool.importlinter]``, also run by ``.ci/run``): every contract there is run and kept."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"{len(contracts['contracts'])} kept, 0 broken" in done.stdout


def test_projections_source_names_no_private_kernel_module():
    for path in sorted((ROOT / "projections").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("kernel."), f"{path}: {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("kernel.") for a in node.names), path


def run_promising(name: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the examples of ``docs/<name>`` in order in one module; what their print lines say
    they print."""
    doc = ROOT / "docs" / name
    module = types.ModuleType(f"doc_{doc.stem}_printed")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    promised: list[str] = []
    for number, block in enumerate(python_blocks(doc), start=1):
        promised += promised_output(block)
        exec(compile(block, f"{name}[example {number}]", "exec"), module.__dict__)
    return promised


def test_the_recovery_examples_print_what_their_comments_say(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    promised = run_promising("recovery.md", monkeypatch)
    assert len(promised) >= 10
    assert capsys.readouterr().out.splitlines() == promised


def test_the_agents_examples_print_what_their_comments_say(tmp_path, monkeypatch, capsys):
    pytest.importorskip("agent_framework")
    monkeypatch.chdir(tmp_path)
    promised = run_promising("agents.md", monkeypatch)
    steps = ("model_call", "hold_seat")  # the loop printing each step record, shown apart
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(steps)]
    assert len(promised) >= 6
    assert printed == promised
