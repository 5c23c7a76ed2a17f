"""Write ``af_workflow_api.txt``: the public workflow names of Agent Framework, one per line.

Run it by hand, in an environment where AF is installed (never in the test suite, which must not
import agent_framework)::

    /work/main/.venv/bin/python tests/docs/make_af_api_list.py

It lists:

- every name ``agent_framework.__all__`` exports from ``agent_framework._workflows``: ``Name``;
- for the classes a port touches (``PORTED_CLASSES``), each public method, property, classmethod
  and class attribute they define or inherit from AF itself: ``Class.member``;
- their constructor's named parameters, ``Class(param=)``, and the named parameters of their
  public methods, ``Class.method(param=)`` (``self``, ``cls``, ``*args`` and ``**kwargs`` left
  out).

``tests/docs/test_porting_table.py`` checks that docs/porting.md's "Name by name" table has a row
for each. When AF is upgraded, rerun this script and fix what the test then reports.
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("af_workflow_api.txt")
PORTED_CLASSES = [
    "WorkflowBuilder",
    "Workflow",
    "WorkflowContext",
    "Executor",
    "WorkflowEvent",
    "WorkflowRunResult",
]
# Classes a user constructs: their constructor's parameters are listed. AF builds the others
# (a Workflow comes from build(), a context and a result from a run).
CONSTRUCTED = {"WorkflowBuilder", "Executor", "WorkflowEvent"}
# Members the framework calls, never user code.
INTERNAL = {"Executor.execute"}


def workflow_exports(af: Any) -> list[str]:
    """The names of ``agent_framework.__all__`` that come from ``agent_framework._workflows``."""
    lazy: dict[str, str] = getattr(af, "_LAZY_EXPORTS", {})
    names = []
    for name in af.__all__:
        if lazy.get(name, "").startswith("._workflows"):
            names.append(name)
            continue
        module = getattr(getattr(af, name, None), "__module__", "") or ""
        if module.startswith("agent_framework._workflows"):
            names.append(name)
    return sorted(set(names))


def _own_bases(cls: type) -> list[type]:
    """``cls`` and the classes it inherits from AF itself (not ``object``, ``list``, ...)."""
    return [c for c in cls.__mro__ if c.__module__.startswith("agent_framework")]


def _params(func: Any) -> list[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls")
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def _instance_attributes(cls: type) -> set[str]:
    """The public attributes ``cls.__init__`` assigns (``self.name = ...``)."""
    import ast
    import textwrap

    init = vars(cls).get("__init__")
    if not inspect.isfunction(init):
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and not node.attr.startswith("_")
    }


def class_members(name: str, cls: type) -> list[str]:
    """``Class.member``, ``Class(param=)`` and ``Class.method(param=)`` of one class."""
    found = {f"{name}({p}=)" for p in _params(cls.__init__)} if name in CONSTRUCTED else set()
    for base in _own_bases(cls):
        found.update(f"{name}.{member}" for member in _instance_attributes(base))
        for member, raw in vars(base).items():
            if member.startswith("_") or f"{name}.{member}" in INTERNAL:
                continue
            found.add(f"{name}.{member}")
            func = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
            if inspect.isfunction(func):
                found.update(f"{name}.{member}({p}=)" for p in _params(func))
        for member in getattr(base, "__annotations__", {}):
            if not member.startswith("_"):
                found.add(f"{name}.{member}")
    return sorted(found)


def main() -> None:
    import agent_framework as af

    lines = [
        f"# Public workflow names of Agent Framework {version('agent-framework-core')}: written",
        "# by tests/docs/make_af_api_list.py (run by hand where AF is installed, never in tests).",
    ]
    lines += workflow_exports(af)
    for name in PORTED_CLASSES:
        lines += class_members(name, getattr(af, name))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines) - 2} names to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
