"""Every module path the docs name exists: a file moved (issue 22 moved them all) leaves no
pointer behind to a room that is gone."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FILE = re.compile(r"(?<![\w/.])((?:kernel|projections|bench|tests)/[\w/]*\w\.py)\b")
DOTTED = re.compile(r"`((?:kernel|projections)(?:\.\w+)*\._[a-z]\w*(?:\.\w+)*)")
"""Private paths only: a public name is checked where the docs' examples run."""


def named(text: str) -> list[str]:
    return FILE.findall(text) + DOTTED.findall(text)


def missing(name: str) -> bool:
    if "/" in name:  # from the repository's root, or from tests/ as docs/guarantees.md names tests
        return not (ROOT / name).is_file() and not (ROOT / "tests" / name).is_file()
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module; the rest, names
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is not None:
            rest, obj = parts[cut:], importlib.import_module(module)
            for part in rest:
                if not hasattr(obj, part):
                    return True
                obj = getattr(obj, part)
            return False
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_a_doc_names_exists(doc: Path) -> None:
    gone = sorted({name for name in named(doc.read_text()) if missing(name)})
    assert gone == [], f"{doc.name} names modules or files that do not exist: {gone}"


def test_the_check_finds_a_path_that_is_gone() -> None:
    text = "see `kernel/_mapper.py` and `kernel._codec._mapper.RowMapper`, `kernel._chain.X`"
    gone = [name for name in named(text) if missing(name)]
    assert gone == ["kernel/_mapper.py", "kernel._chain.X"]
