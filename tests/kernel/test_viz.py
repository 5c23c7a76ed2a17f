"""``WorkflowViz``: DOT and Mermaid text of a workflow's graph (Agent Framework's pictures, with
every id and label escaped), and export to files through Graphviz's ``dot``."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import (
    Case,
    Default,
    Executor,
    GraphvizNotFoundError,
    VisualizationError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowViz,
    handler,
)

HOSTILE = [
    'say "hi"',
    "a<b>c",
    "two\nlines",
    "back\\slash",
    "tail\\",
    'both\\"',
    "#35; & `code` | pipe",
    "ctrl\x01\x7f",
    "end",
    "步骤甲",
    "1st",
    "x;y];z",
]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def need_dot() -> str:
    """Graphviz's dot, or a skip that says why (a failure in CI, which must install it)."""
    program = shutil.which("dot")
    if program is None:
        reason = "Graphviz's dot is not installed (apt-get install graphviz)"
        if in_ci():
            pytest.fail(f"{reason}; CI=true, so the rendering tests must run")
        pytest.skip(reason)
    return program


class Step(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext) -> None:
        pass


class Join(Executor):
    @handler
    async def run(self, messages: list[str], ctx: WorkflowContext) -> None:
        pass


class Nested(Step):
    """Stands for an executor that runs a workflow (``WorkflowExecutor``)."""

    def __init__(self, id: str, workflow: Any) -> None:
        super().__init__(id)
        self.workflow = workflow


def chain(*ids: str) -> Any:
    steps = [Step(i) for i in ids]
    builder = WorkflowBuilder(start_executor=steps[0])
    if len(steps) > 1:
        builder.add_chain(steps)
    return builder.build()


def only_if_foo(message: str) -> bool:
    return message == "foo"


# -- DOT ------------------------------------------------------------------------------------------


def test_digraph_of_a_chain() -> None:
    dot = WorkflowViz(chain("executor1", "executor2")).to_digraph()
    assert dot.startswith("digraph Workflow {\n")
    assert '"executor1" [fillcolor=lightgreen, label="executor1\\n(Start)"];' in dot
    assert '"executor2" [label="executor2"];' in dot
    assert '"executor1" -> "executor2";' in dot


def test_digraph_conditional_switch_case_and_multi_selection_edges() -> None:
    start, mid, end, low, high, a, b = (
        Step(i) for i in ("start", "mid", "end", "low", "high", "a", "b")
    )

    def pick(message: str, targets: list[str]) -> list[str]:
        return targets

    wf = (
        WorkflowBuilder(start_executor=start)
        .add_edge(start, mid, condition=only_if_foo)
        .add_edge(mid, end)
        .add_switch_case_edge_group(end, [Case(only_if_foo, low), Default(high)])
        .add_multi_selection_edge_group(high, [a, b], pick)
        .build()
    )
    dot = WorkflowViz(wf).to_digraph()
    assert '"start" -> "mid" [style=dashed, label="conditional"];' in dot
    assert '"mid" -> "end";' in dot
    assert '"end" -> "low" [style=dashed, label="case: only_if_foo"];' in dot
    assert '"end" -> "high" [style=dashed, label="default"];' in dot
    assert '"high" -> "a" [style=dashed, label="selected by pick"];' in dot
    assert '"high" -> "b" [style=dashed, label="selected by pick"];' in dot


def test_digraph_routes_a_fan_in_through_its_own_node() -> None:
    start, s1, s2, t = Step("start"), Step("s1"), Step("s2"), Join("t")
    wf = (
        WorkflowBuilder(start_executor=start)
        .add_fan_out_edges(start, [s1, s2])
        .add_fan_in_edges([s1, s2], t)
        .build()
    )
    dot = WorkflowViz(wf).to_digraph()
    (fan,) = re.findall(r'^\s*"([^"]+)" \[shape=ellipse, [^\n]*label="fan-in"\];$', dot, re.M)
    assert f'"s1" -> "{fan}";' in dot
    assert f'"s2" -> "{fan}";' in dot
    assert f'"{fan}" -> "t";' in dot
    assert '"s1" -> "t"' not in dot


def test_a_fan_in_node_never_takes_an_executors_id() -> None:
    start, source, target = Step("start"), Step("source"), Join("target")
    squatter = Step("fan_in::target::2")  # the name the fan-in group (index 2) would get
    wf = (
        WorkflowBuilder(start_executor=start)
        .add_edge(start, source)
        .add_edge(start, squatter)
        .add_fan_in_edges([start, source], target)
        .build()
    )
    dot = WorkflowViz(wf).to_digraph()
    (fan,) = re.findall(r'^\s*"([^"]+)" \[shape=ellipse', dot, re.M)
    assert fan != squatter.id
    assert f'"{squatter.id}" [label="{squatter.id}"];' in dot


def test_internal_edges_are_drawn_only_when_asked() -> None:
    wf = chain("a", "b")
    assert "internal:" not in WorkflowViz(wf).to_digraph()
    dot = WorkflowViz(wf).to_digraph(include_internal_executors=True)
    assert '"internal:a" -> "a";' in dot
    assert '"internal:b" -> "b";' in dot
    mermaid = WorkflowViz(wf).to_mermaid(include_internal_executors=True)
    assert "internal_a --> a;" in mermaid
    assert "internal_b --> b;" in mermaid


def test_a_nested_workflow_is_drawn_in_a_cluster_and_a_subgraph() -> None:
    inner = chain("sub1", "sub2")
    main, final = Step("main"), Step("final")
    holder = Nested("holder", inner)
    wf = WorkflowBuilder(start_executor=main).add_chain([main, holder, final]).build()
    dot = WorkflowViz(wf).to_digraph()
    assert 'subgraph "cluster_holder" {' in dot
    assert 'label="sub-workflow: holder";' in dot
    assert '"holder/sub1" -> "holder/sub2";' in dot
    mermaid = WorkflowViz(wf).to_mermaid()
    assert 'subgraph holder__workflow["sub-workflow: holder"]' in mermaid
    assert "holder__sub1 --> holder__sub2;" in mermaid
    assert "main --> holder;" in mermaid


# -- Mermaid --------------------------------------------------------------------------------------


def test_mermaid_of_a_chain_and_a_conditional_edge() -> None:
    mermaid = WorkflowViz(chain("executor1", "executor2")).to_mermaid()
    assert mermaid.startswith("flowchart TD\n")
    assert 'executor1["executor1 (Start)"];' in mermaid
    assert 'executor2["executor2"];' in mermaid
    assert "executor1 --> executor2;" in mermaid
    start, mid = Step("start"), Step("mid")
    wf = WorkflowBuilder(start_executor=start).add_edge(start, mid, condition=only_if_foo).build()
    assert "start -. conditional .-> mid;" in WorkflowViz(wf).to_mermaid()


def test_mermaid_fan_in() -> None:
    start, s1, s2, t = Step("start"), Step("s1"), Step("s2"), Join("t")
    wf = (
        WorkflowBuilder(start_executor=start)
        .add_fan_out_edges(start, [s1, s2])
        .add_fan_in_edges([s1, s2], t)
        .build()
    )
    mermaid = WorkflowViz(wf).to_mermaid()
    (fan,) = re.findall(r"^\s*([A-Za-z][A-Za-z0-9_]*)\(\(fan-in\)\)$", mermaid, re.M)
    assert f"s1 --> {fan};" in mermaid
    assert f"{fan} --> t;" in mermaid
    assert "s1 --> t" not in mermaid


@pytest.mark.parametrize(
    "ids",
    [
        ("step-a", "step_a"),
        ("step a", "step-a", "step_a", "step_a_2"),
        ("1step", "n_1step"),
        ("_step", "n__step"),
        ("end", "End"),
    ],
)
def test_mermaid_keeps_distinct_executors_distinct(ids: tuple[str, ...]) -> None:
    mermaid = WorkflowViz(chain(*ids)).to_mermaid()
    declared = parse_mermaid(mermaid)
    assert [label for _, label in declared] == [f"{ids[0]} (Start)", *ids[1:]]
    aliases = [alias for alias, _ in declared]
    assert len(set(aliases)) == len(ids)
    for source, target in itertools.pairwise(aliases):
        assert f"{source} --> {target};" in mermaid
    for executor_id, alias in zip(ids, aliases, strict=True):
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", executor_id) and executor_id != "end":
            assert alias == executor_id  # a plain id is kept
    assert "end" not in aliases  # a Mermaid keyword is never a node id


# -- escaping -------------------------------------------------------------------------------------

_MERMAID_LINE = re.compile(
    r'(?P<decl>(?P<alias>[A-Za-z][A-Za-z0-9_]*)\["(?P<label>[^"\n]*)"\];)'
    r"|(?P<edge>[A-Za-z][A-Za-z0-9_]* (-->|-\. conditional \.->) [A-Za-z][A-Za-z0-9_]*;)"
)


def parse_mermaid(text: str) -> list[tuple[str, str]]:
    """Every node declaration (alias, label decoded), after checking that every line is a
    declaration or an edge, with nothing left over."""
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    declared = []
    for line in lines[1:]:
        match = _MERMAID_LINE.fullmatch(line.strip())
        assert match is not None, f"not a Mermaid node or edge: {line!r}"
        if match["decl"]:
            label = re.sub(r"#quot;", '"', match["label"])
            label = re.sub(r"#(\d+);", lambda m: chr(int(m[1])), label)
            declared.append((match["alias"], label))
    return declared


_DOT_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def dot_strings(line: str) -> list[str]:
    """The quoted strings of one DOT line, unescaped as the exporter escapes them."""
    found = []
    for raw in _DOT_STRING.findall(line):
        found.append(
            re.sub(
                r"\\(x[0-9a-f]{2}|.)",
                lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m[1]) or chr(int(m[1][1:], 16)),
                raw,
            )
        )
    return found


def node_lines(dot: str) -> list[str]:
    return [
        line for line in dot.splitlines() if "[label=" in line or "fillcolor=lightgreen" in line
    ]


def test_hostile_ids_cannot_break_the_dot_text() -> None:
    wf = chain(*HOSTILE)
    dot = WorkflowViz(wf).to_digraph()
    names = [dot_strings(line)[0] for line in node_lines(dot)]
    assert names == HOSTILE  # each node is named by exactly its id
    assert "\x01" not in dot
    assert "\x7f" not in dot
    assert len(dot.splitlines()) == 6 + len(HOSTILE) + len(HOSTILE) - 1  # nothing split a line


def test_hostile_ids_cannot_break_the_mermaid_text() -> None:
    declared = parse_mermaid(WorkflowViz(chain(*HOSTILE)).to_mermaid())
    assert [label for _, label in declared] == [f"{HOSTILE[0]} (Start)", *HOSTILE[1:]]
    assert len({alias for alias, _ in declared}) == len(HOSTILE)


def test_graphviz_parses_hostile_ids_as_distinct_nodes(tmp_path: Path) -> None:
    program = need_dot()
    wf = chain(*HOSTILE)
    done = subprocess.run(
        [program, "-Tjson"],
        input=WorkflowViz(wf).to_digraph().encode(),
        capture_output=True,
        check=True,
    )
    graph = json.loads(done.stdout)
    names = [node["name"] for node in graph["objects"]]
    assert len(names) == len(set(names)) == len(HOSTILE)
    assert len(graph["edges"]) == len(HOSTILE) - 1
    for executor_id in ('say "hi"', "a<b>c", "end", "步骤甲", "x;y];z"):
        assert executor_id in names  # without backslashes or line breaks, names are the ids
    # It renders, too.
    assert WorkflowViz(wf).export("svg", str(tmp_path / "hostile.svg")).endswith(".svg")


ids = st.lists(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12),
    min_size=1,
    max_size=5,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(ids)
def test_any_ids_give_parseable_text_with_one_node_each(executor_ids: list[str]) -> None:
    viz = WorkflowViz(chain(*executor_ids))
    declared = parse_mermaid(viz.to_mermaid())
    assert [label for _, label in declared] == [
        f"{executor_ids[0]} (Start)",
        *executor_ids[1:],
    ]
    assert len({alias for alias, _ in declared}) == len(executor_ids)
    dot = viz.to_digraph()
    assert [dot_strings(line)[0] for line in node_lines(dot)] == executor_ids
    edges = [line for line in dot.splitlines() if " -> " in line]
    assert [dot_strings(line) for line in edges] == [
        [s, t] for s, t in itertools.pairwise(executor_ids)
    ]


# -- export ---------------------------------------------------------------------------------------


def test_export_dot_needs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    viz = WorkflowViz(chain("executor1", "executor2"))
    temp = viz.export(format="dot")
    assert temp.endswith(".dot")
    assert Path(temp).read_text(encoding="utf-8") == viz.to_digraph()
    Path(temp).unlink()
    named = tmp_path / "wf.dot"
    assert viz.export(format="dot", filename=str(named)) == str(named)
    assert '"executor1" -> "executor2";' in named.read_text(encoding="utf-8")


def test_export_without_graphviz_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    viz = WorkflowViz(chain("a", "b"))
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz") as raised:
        viz.export("svg", str(tmp_path / "wf.svg"))
    assert isinstance(raised.value, ImportError)  # what Agent Framework's samples catch
    assert "format='dot'" in str(raised.value)
    assert not (tmp_path / "wf.svg").exists()


@pytest.mark.parametrize("format", ["svg", "png", "pdf"])
def test_export_renders_through_graphviz(tmp_path: Path, format: str) -> None:
    need_dot()
    viz = WorkflowViz(chain("a", "b"))
    path = viz.export(format, str(tmp_path / "picture"))  # the extension is added
    assert path == str(tmp_path / f"picture.{format}")
    head = Path(path).read_bytes()[:8]
    assert head.startswith({"svg": b"<?xml", "png": b"\x89PNG", "pdf": b"%PDF"}[format])
    saved = getattr(viz, f"save_{format}")(str(tmp_path / f"again.{format}"))
    assert Path(saved).read_bytes()[:4] == head[:4]


def test_export_reports_graphviz_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(VisualizationError, match="dot could not render svg: syntax error"):
        WorkflowViz(chain("a", "b")).export("svg", str(tmp_path / "wf.svg"))


def test_export_refuses_unknown_formats_and_mismatched_names(tmp_path: Path) -> None:
    viz = WorkflowViz(chain("a", "b"))
    with pytest.raises(ValueError, match="Unsupported format: 'gif'"):
        viz.export(format="gif")  # type: ignore[arg-type]
    with pytest.raises(VisualizationError, match=r"extension '.png' .* is not the format 'svg'"):
        viz.export("svg", str(tmp_path / "wf.png"))
    with pytest.raises(VisualizationError, match="WorkflowViz draws a built workflow"):
        WorkflowViz(WorkflowBuilder(start_executor=Step("a")))  # type: ignore[arg-type]
