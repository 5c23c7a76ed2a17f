"""docs/porting.md's "Name by name" table cannot go stale: it is checked against AF and kernel.

``af_workflow_api.txt`` lists AF 1.23's public workflow names (written by
``make_af_api_list.py``, run by hand; this suite never imports agent_framework). The table in
the ``## Name by name`` section of docs/porting.md (``| AF | steplog | notes |``) must:

(a) name every listed AF name in its AF column, and nothing else there;
(b) name in its steplog column only ``kernel.X`` that exist: ``X`` in ``kernel.__all__``,
    ``kernel.Class.member`` an attribute of the class (a method, property, field, or an attribute
    its ``__init__`` sets), ``kernel.Class(param=)`` / ``kernel.Class.method(param=)`` a named
    parameter of the constructor or method;
(c) say ``same`` only where kernel has the AF name itself (``kernel.`` + the AF name, as in (b)),
    and ``missing`` only where it does not. Any other steplog cell is a rename: it must name at
    least one ``kernel.`` name. A class renamed in its own row (``WorkflowRunResult`` ->
    ``kernel.RunResult``) has its members looked up under the new name.

A failure lists every row to fix, and how.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import kernel

ROOT = Path(__file__).resolve().parents[2]
PORTING = ROOT / "docs" / "porting.md"
AF_LIST = Path(__file__).with_name("af_workflow_api.txt")
SECTION = "## Name by name"
HEADER = ["AF", "steplog", "notes"]

_NAME = re.compile(r"^(?P<dotted>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\((?P<param>\w+)=\))?$")
_KERNEL_REF = re.compile(r"^kernel\.(?P<dotted>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?P<rest>.*)$")
_PARAM = re.compile(r"^\((?P<param>\w+)=\)$")


def af_names() -> list[str]:
    lines = AF_LIST.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@dataclasses.dataclass(frozen=True)
class Row:
    line: int
    af: list[str]
    steplog: str
    kernel_refs: list[tuple[str, str | None]]  # (dotted, param) of each `kernel.X`

    @property
    def kind(self) -> str:
        text = self.steplog.strip().lower()
        if text.startswith("same"):
            return "same"
        if text.startswith("missing"):
            return "missing"
        return "renamed"


def _cells(line: str) -> list[str]:
    """A table line's cells; ``\\|`` is a pipe inside a cell."""
    body = line.strip().removeprefix("|").removesuffix("|")
    return [cell.replace("\\|", "|").strip() for cell in re.split(r"(?<!\\)\|", body)]


def _ticked(cell: str) -> list[str]:
    return [span.strip() for span in re.findall(r"`([^`]+)`", cell)]


def parse_table(markdown: str) -> tuple[list[Row], list[str]]:
    """The rows of the ``## Name by name`` table, and what is wrong with its shape."""
    lines = markdown.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == SECTION)
    except StopIteration:
        return [], [f"docs/porting.md has no {SECTION!r} section"]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    table = [i for i in range(start + 1, end) if lines[i].lstrip().startswith("|")]
    if not table or _cells(lines[table[0]]) != HEADER:
        return [], [f"{SECTION!r} must hold one table headed | AF | steplog | notes |"]
    rows, problems = [], []
    for i in table[2:]:  # after the header and its --- line
        cells = _cells(lines[i])
        if len(cells) != 3:
            problems.append(f"line {i + 1}: a row needs 3 cells, got {len(cells)}")
            continue
        refs = []
        for span in _ticked(cells[1]):
            match = _KERNEL_REF.match(span)
            if match:
                param = _PARAM.match(match["rest"])
                refs.append((match["dotted"], param["param"] if param else None))
        rows.append(Row(i + 1, _ticked(cells[0]), cells[1], refs))
    return rows, problems


def _assigned_in_init(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if not inspect.isfunction(init):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr == name
            ):
                return True
    return False


def _has_member(owner: Any, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if not isinstance(owner, type):
        return False
    if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
        return True
    if name in getattr(owner, "model_fields", {}):
        return True
    if any(name in vars(klass).get("__annotations__", {}) for klass in owner.__mro__):
        return True
    return _assigned_in_init(owner, name)


def kernel_lookup(dotted: str, param: str | None) -> str | None:
    """Why ``kernel.<dotted>`` (with its ``param``) does not exist, or None if it does."""
    first, *rest = dotted.split(".")
    if first not in kernel.__all__:
        return f"kernel.{first} is not in kernel.__all__"
    try:
        owner: Any = getattr(kernel, first)
    except AttributeError:
        return f"kernel.{first} is in __all__ but cannot be imported"
    path = f"kernel.{first}"
    for part in rest:
        if not _has_member(owner, part):
            return f"{path} has no attribute {part!r}"
        path += f".{part}"
        owner = getattr(owner, part, None)
    if param is None:
        return None
    target = owner.__init__ if isinstance(owner, type) else owner
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return f"{path} has no signature to take {param}="
    named = {
        p.name
        for p in parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    return None if param in named else f"{path} takes no parameter {param!r}"


def class_aliases(rows: list[Row]) -> dict[str, str]:
    """AF names that kernel spells otherwise: a row whose AF cell is one bare name and whose
    steplog cell renames it to one bare ``kernel.X`` (``WorkflowRunResult`` -> ``RunResult``).
    Their members are then looked up under kernel's name."""
    aliases = {}
    for row in rows:
        if row.kind == "renamed" and len(row.af) == 1 and len(row.kernel_refs) == 1:
            (dotted, param), af = row.kernel_refs[0], row.af[0]
            if "." not in af and "(" not in af and "." not in dotted and param is None:
                aliases[af] = dotted
    return aliases


def _counterpart(dotted: str, aliases: dict[str, str]) -> str:
    first, dot, rest = dotted.partition(".")
    return aliases.get(first, first) + dot + rest


def check(markdown: str, listed: list[str]) -> list[str]:
    """Everything wrong with the table, each with the row to fix."""
    rows, problems = parse_table(markdown)
    if not rows:
        return problems
    listed_set = set(listed)
    aliases = class_aliases(rows)
    seen: dict[str, int] = {}
    for row in rows:
        where = f"porting.md line {row.line}"
        if not row.af:
            problems.append(f"{where}: the AF cell names nothing (write names in backticks)")
        for name in row.af:
            if name not in listed_set:
                problems.append(f"{where}: `{name}` is not an AF name of af_workflow_api.txt")
            elif name in seen:
                problems.append(f"{where}: `{name}` has a row already (line {seen[name]})")
            else:
                seen[name] = row.line
        for dotted, param in row.kernel_refs:
            why = kernel_lookup(dotted, param)
            if why is not None:
                shown = f"kernel.{dotted}" + (f"({param}=)" if param else "")
                problems.append(f"{where}: `{shown}` does not exist: {why}")
        for name in row.af:
            match = _NAME.match(name)
            if match is None or name not in listed_set:
                continue
            absent = kernel_lookup(_counterpart(match["dotted"], aliases), match["param"])
            if row.kind == "same" and absent is not None:
                problems.append(f"{where}: says same, but {absent}: write what steplog has")
            if row.kind == "missing" and absent is None:
                problems.append(
                    f"{where}: says missing, but kernel has `{name}` now: "
                    "say same (or how it differs)"
                )
        if row.kind == "renamed" and not row.kernel_refs:
            problems.append(
                f"{where}: say same, missing, or name steplog's counterpart as `kernel.X`"
            )
    for name in listed:
        if name not in seen:
            problems.append(f"no row for `{name}`: add | `{name}` | same/missing/`kernel.X` | |")
    return problems


def test_the_af_list_is_generated_and_clean() -> None:
    header = AF_LIST.read_text().splitlines()[0]
    assert header.startswith("# Public workflow names of Agent Framework 1.23.0")
    names = af_names()
    assert len(names) == len(set(names)), "a name is listed twice"
    assert {"WorkflowBuilder", "WorkflowBuilder.add_edge", "Workflow.run(stream=)"} <= set(names)
    assert all(_NAME.match(name) for name in names)


def test_the_name_by_name_table_matches_af_and_kernel() -> None:
    problems = check(PORTING.read_text(), af_names())
    assert not problems, f"{SECTION!r} in docs/porting.md needs fixing:\n" + "\n".join(problems)


# -- the checker itself -------------------------------------------------------------------------

_DOC = """# Porting

{section}

| AF | steplog | notes |
| --- | --- | --- |
{rows}

## Next
"""


def _problems(rows: str, listed: list[str]) -> list[str]:
    return check(_DOC.format(section=SECTION, rows=rows), listed)


def test_a_correct_table_passes() -> None:
    rows = "\n".join(
        [
            "| `WorkflowBuilder` | same | |",
            "| `WorkflowBuilder(max_iterations=)` | `kernel.WorkflowBuilder(max_supersteps=)` | |",
            "| `WorkflowRunResult.get_outputs` | `kernel.RunResult.get_outputs` | |",
            "| `Executor.id`, `Executor(id=)` | same | |",
            '| `FileCheckpointStorage` | missing: `kernel.open_store("sqlite:///x.db")` | |',
        ]
    )
    listed = [
        "WorkflowBuilder",
        "WorkflowBuilder(max_iterations=)",
        "WorkflowRunResult.get_outputs",
        "Executor.id",
        "Executor(id=)",
        "FileCheckpointStorage",
    ]
    assert _problems(rows, listed) == []


@pytest.mark.parametrize(
    ("row", "listed", "expected"),
    [
        ("| `Nope` | same | |", ["Nope"], "says same, but kernel.Nope is not in kernel.__all__"),
        ("| `Executor` | missing | |", ["Executor"], "says missing, but kernel has `Executor`"),
        (
            "| `Executor.to_json` | `kernel.Executor.to_json` | |",
            ["Executor.to_json"],
            "`kernel.Executor.to_json` does not exist: kernel.Executor has no attribute",
        ),
        (
            "| `WorkflowBuilder(max_iterations=)` | `kernel.WorkflowBuilder(max_rounds=)` | |",
            ["WorkflowBuilder(max_iterations=)"],
            "kernel.WorkflowBuilder takes no parameter 'max_rounds'",
        ),
        ("| `Executor` | renamed to something | |", ["Executor"], "name steplog's counterpart"),
        ("| `Executor` | same | |", ["Executor", "handler"], "no row for `handler`"),
        ("| `Exekutor` | missing | |", [], "`Exekutor` is not an AF name"),
        (
            "| `WorkflowRunResult` | `kernel.RunResult` | |\n"
            "| `WorkflowRunResult.get_outputs` | missing | |",
            ["WorkflowRunResult", "WorkflowRunResult.get_outputs"],
            "says missing, but kernel has `WorkflowRunResult.get_outputs`",
        ),
        (
            "| `kernel_lookup` | `kernel._run._runner` | |",
            ["kernel_lookup"],
            "kernel._run is not in kernel.__all__",
        ),
    ],
)
def test_the_checker_names_what_to_fix(row: str, listed: list[str], expected: str) -> None:
    problems = _problems(row, listed)
    assert any(expected in problem for problem in problems), problems


def test_a_missing_section_or_header_is_reported() -> None:
    assert check("# Porting\n", ["Executor"]) == [f"docs/porting.md has no {SECTION!r} section"]
    bad = f"{SECTION}\n\n| AF | kernel |\n| --- | --- |\n| `Executor` | same |\n"
    assert "one table headed" in check(bad, ["Executor"])[0]


def test_a_name_kernel_gains_makes_its_missing_row_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the lead sees when kernel gains a name the table still says is missing (an AF
    internal steplog will never export, so the real table says missing for good)."""

    class InProcRunnerContext:
        pass

    assert check(PORTING.read_text(), af_names()) == []
    monkeypatch.setattr(kernel, "InProcRunnerContext", InProcRunnerContext, raising=False)
    monkeypatch.setattr(kernel, "__all__", [*kernel.__all__, "InProcRunnerContext"])
    problems = check(PORTING.read_text(), af_names())
    assert len(problems) == 1
    assert "says missing, but kernel has `InProcRunnerContext` now" in problems[0]
