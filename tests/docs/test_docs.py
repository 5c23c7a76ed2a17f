"""The documentation is part of the product: its examples run, and what it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kernel
import projections
from projections.cli._commands import _COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(d)], ids=lambda d: d.name)
def test_the_examples_run_in_order_in_one_namespace(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict[str, object] = {"__name__": f"doc_{doc.stem}"}
    for number, block in enumerate(python_blocks(doc), start=1):
        exec(compile(block, f"{doc.name}[example {number}]", "exec"), namespace)


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
    documented = set(re.findall(r"^\| `(\w+)", text, flags=re.MULTILINE)) - {
        "pos",
        "step",
        "run",
        "time",
        "inside",
    }
    assert documented == set(_COMMANDS)


@pytest.mark.parametrize("package", [kernel, projections], ids=lambda p: p.__name__)
def test_public_names_are_exported_once_and_exist(package):
    names = package.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(package, name), name
    assert projections.fold_committed is kernel.fold_committed
