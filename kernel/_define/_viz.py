"""``WorkflowViz``: a workflow's graph as Graphviz DOT or Mermaid text, and DOT rendered to files.

The text is made here, from the graph alone; rendering SVG, PNG or PDF runs Graphviz's ``dot``
program, which must be installed (``GraphvizNotFoundError`` says how otherwise). Executor ids are
arbitrary text, so every id and label is escaped: an id holding quotes, ``<``, backslashes or
newlines cannot break the text, and distinct ids stay distinct nodes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kernel._base._errors import GraphvizNotFoundError, VisualizationError
from kernel._define._definition import DefinitionView, callable_name
from kernel._define._graph import FanIn, Graph, MultiSelection, Single, SwitchCase

__all__ = ["WorkflowViz"]

ExportFormat = Literal["svg", "png", "pdf", "dot"]
_FORMATS = ("svg", "png", "pdf", "dot")
_INTERNAL = "internal:"
# Words a Mermaid flowchart reads as syntax where a node id is expected.
_MERMAID_RESERVED = frozenset(
    {"end", "graph", "flowchart", "subgraph", "style", "class", "classDef", "click", "linkStyle"}
    | {"direction", "call", "href", "default"}
)
_PLAIN_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class _Edge:
    """One drawn edge: ``style`` None (plain), ``"conditional"`` (AF's dashed edge labelled
    "conditional"), or ``"labelled"`` (dashed, with ``label``)."""

    source: str
    target: str
    style: Literal["conditional", "labelled"] | None = None
    label: str = ""
    internal: bool = False  # source is the outside (responses), not an executor


@dataclass(frozen=True)
class _FanInNode:
    key: str  # unique among the graph's node keys
    sources: tuple[str, ...]
    target: str


class WorkflowViz:
    """Pictures of a workflow's graph: ``to_digraph()`` (Graphviz DOT), ``to_mermaid()``, and
    ``export(format, filename)`` to a file.

    The start executor is marked ``(Start)``; a fan-in group is drawn as a node its sources lead
    to; a conditional edge is dashed and labelled ``conditional``; switch-case and
    multi-selection edges are dashed and labelled with their condition or selection function. An
    executor that runs a workflow (one with a ``workflow`` attribute) has that workflow drawn
    inside a cluster (DOT) or subgraph (Mermaid), its nodes namespaced by the executor's id.
    ``include_internal_executors=True`` also draws, for each executor, the edge by which the
    outside reaches it (``internal:<id>``: responses to its requests).
    """

    def __init__(self, workflow: DefinitionView) -> None:
        if not isinstance(workflow, DefinitionView):
            raise VisualizationError(
                f"WorkflowViz draws a built workflow (WorkflowBuilder(...).build()), got "
                f"{type(workflow).__qualname__}"
            )
        self._workflow = workflow

    # -- DOT ----------------------------------------------------------------------------------

    def to_digraph(self, include_internal_executors: bool = False) -> str:
        """The graph in Graphviz's DOT language."""
        lines = [
            "digraph Workflow {",
            "  rankdir=TB;",
            "  node [shape=box, style=filled, fillcolor=lightblue];",
            "  edge [color=black, arrowhead=vee];",
            "",
        ]
        self._dot_graph(self._workflow.graph, lines, "  ", "", include_internal_executors)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _dot_graph(
        self, graph: Graph, lines: list[str], indent: str, ns: str, internal: bool
    ) -> None:
        def node(executor_id: str) -> str:
            return _dot_quote(ns + executor_id)

        start = graph.start
        lines.append(f"{indent}{node(start)} [fillcolor=lightgreen, label={_dot_label(start)}];")
        for executor_id in graph.executors:
            if executor_id != start:
                lines.append(f"{indent}{node(executor_id)} [label={_dot_quote(executor_id)}];")
        fan_ins = _fan_in_nodes(graph)
        if fan_ins:
            lines.append("")
        for fan in fan_ins:
            lines.append(
                f"{indent}{_dot_quote(ns + fan.key)} [shape=ellipse, fillcolor=lightgoldenrod, "
                'label="fan-in"];'
            )
        for fan in fan_ins:
            for source in fan.sources:
                lines.append(f"{indent}{node(source)} -> {_dot_quote(ns + fan.key)};")
            lines.append(f"{indent}{_dot_quote(ns + fan.key)} -> {node(fan.target)};")
        for edge in _edges(graph, internal):
            attrs = ""
            if edge.style == "conditional":
                attrs = ' [style=dashed, label="conditional"]'
            elif edge.style == "labelled":
                attrs = f" [style=dashed, label={_dot_quote(edge.label)}]"
            lines.append(f"{indent}{node(edge.source)} -> {node(edge.target)}{attrs};")
        for executor_id, inner in _sub_workflows(graph):
            lines.append(f"{indent}subgraph {_dot_quote('cluster_' + ns + executor_id)} {{")
            lines.append(f"{indent}  label={_dot_quote('sub-workflow: ' + executor_id)};")
            lines.append(f"{indent}  style=dashed;")
            self._dot_graph(inner, lines, indent + "  ", f"{ns}{executor_id}/", internal)
            lines.append(f"{indent}}}")

    # -- Mermaid ------------------------------------------------------------------------------

    def to_mermaid(self, include_internal_executors: bool = False) -> str:
        """The graph as a Mermaid flowchart. Node ids are the executor ids where those are
        plain identifiers, else unique aliases; the labels show the ids as they are."""
        aliases = _Aliases(self._workflow.graph, include_internal_executors)
        lines = ["flowchart TD"]
        graph = self._workflow.graph
        self._mermaid_graph(graph, lines, "  ", (), aliases, include_internal_executors)
        return "\n".join(lines) + "\n"

    def _mermaid_graph(
        self,
        graph: Graph,
        lines: list[str],
        indent: str,
        ns: tuple[str, ...],
        aliases: _Aliases,
        internal: bool,
    ) -> None:
        def node(executor_id: str) -> str:
            return aliases.of(ns, "executor", executor_id)

        start = graph.start
        lines.append(f'{indent}{node(start)}["{_mermaid_text(start)} (Start)"];')
        for executor_id in graph.executors:
            if executor_id != start:
                lines.append(f'{indent}{node(executor_id)}["{_mermaid_text(executor_id)}"];')
        fan_ins = _fan_in_nodes(graph)
        for fan in fan_ins:
            lines.append(f"{indent}{aliases.of(ns, 'fan-in', fan.key)}((fan-in))")
        for fan in fan_ins:
            fan_node = aliases.of(ns, "fan-in", fan.key)
            for source in fan.sources:
                lines.append(f"{indent}{node(source)} --> {fan_node};")
            lines.append(f"{indent}{fan_node} --> {node(fan.target)};")
        for edge in _edges(graph, internal):
            source = aliases.of(ns, "internal", edge.source) if edge.internal else node(edge.source)
            target = node(edge.target)
            if edge.style == "conditional":
                lines.append(f"{indent}{source} -. conditional .-> {target};")
            elif edge.style == "labelled":
                lines.append(f'{indent}{source} -.->|"{_mermaid_text(edge.label)}"| {target};')
            else:
                lines.append(f"{indent}{source} --> {target};")
        for executor_id, inner in _sub_workflows(graph):
            box = aliases.of(ns, "subgraph", executor_id)
            title = _mermaid_text(f"sub-workflow: {executor_id}")
            lines.append(f'{indent}subgraph {box}["{title}"]')
            self._mermaid_graph(inner, lines, indent + "  ", (*ns, executor_id), aliases, internal)
            lines.append(f"{indent}end")

    # -- files --------------------------------------------------------------------------------

    def export(
        self,
        format: ExportFormat = "svg",
        filename: str | None = None,
        include_internal_executors: bool = False,
    ) -> str:
        """Write the picture to ``filename`` (default: a new temporary file) and return its path.

        ``"dot"`` writes the DOT text and needs nothing else; ``"svg"``, ``"png"`` and ``"pdf"``
        run Graphviz's ``dot`` program. A ``filename`` without an extension gets the format's.
        Raises ``VisualizationError`` (a ``ValueError``) for another format, a filename whose
        extension is another format's, or ``dot`` failing; ``GraphvizNotFoundError`` (an
        ``ImportError``, as Agent Framework raises) when ``dot`` is not installed.
        """
        if format not in _FORMATS:
            raise VisualizationError(
                f"Unsupported format: {format!r}; give one of {', '.join(_FORMATS)}"
            )
        text = self.to_digraph(include_internal_executors=include_internal_executors)
        path = _target(filename, format)
        program = None
        if format != "dot":
            program = shutil.which("dot")
            if program is None:
                raise GraphvizNotFoundError(
                    f"exporting {format} needs Graphviz's `dot` program, which is not on PATH: "
                    "install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew "
                    "install graphviz; others: https://graphviz.org/download/), or export "
                    "format='dot' (or to_mermaid()), which needs nothing"
                )
        if path is None:
            with tempfile.NamedTemporaryFile(suffix=f".{format}", delete=False) as handle:
                path = Path(handle.name)
        if program is None:
            path.write_text(text, encoding="utf-8")
            return str(path)
        done = subprocess.run(  # the program is Graphviz's dot, found on PATH
            [program, f"-T{format}", "-o", str(path)],
            input=text.encode("utf-8"),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
            raise VisualizationError(f"Graphviz's dot could not render {format}: {detail}")
        return str(path)

    def save_svg(self, filename: str, include_internal_executors: bool = False) -> str:
        """``export("svg", filename)``."""
        return self.export("svg", filename, include_internal_executors)

    def save_png(self, filename: str, include_internal_executors: bool = False) -> str:
        """``export("png", filename)``."""
        return self.export("png", filename, include_internal_executors)

    def save_pdf(self, filename: str, include_internal_executors: bool = False) -> str:
        """``export("pdf", filename)``."""
        return self.export("pdf", filename, include_internal_executors)


# -- the graph's drawing, shared by both languages ----------------------------------------------


def _fan_in_nodes(graph: Graph) -> list[_FanInNode]:
    """A node per fan-in group, keyed ``fan_in::<target>::<n>`` (``n`` the group's index, made
    longer while it equals an executor id)."""
    found: list[_FanInNode] = []
    taken = set(graph.executors)
    for index, group in enumerate(graph.groups):
        if isinstance(group, FanIn):
            key = f"fan_in::{group.target}::{index}"
            while key in taken:
                key += "'"
            taken.add(key)
            found.append(_FanInNode(key, tuple(group.sources), group.target))
    return found


def _edges(graph: Graph, internal: bool) -> Iterator[_Edge]:
    if internal:
        for executor_id in graph.executors:
            yield _Edge(_INTERNAL + executor_id, executor_id, internal=True)
    for group in graph.groups:
        if isinstance(group, FanIn):
            continue
        if isinstance(group, Single):
            if group.condition is None:
                yield _Edge(group.source, group.target)
            else:
                yield _Edge(group.source, group.target, "conditional")
        elif isinstance(group, SwitchCase):
            for condition, target in group.cases:
                label = f"case: {callable_name(condition)}"
                yield _Edge(group.source, target, "labelled", label)
            if group.default is not None:
                yield _Edge(group.source, group.default, "labelled", "default")
        elif isinstance(group, MultiSelection):
            label = f"selected by {callable_name(group.selection)}"
            for target in group.targets:
                yield _Edge(group.source, target, "labelled", label)
        else:
            for target in group.targets:
                yield _Edge(group.source, target)


def _sub_workflows(graph: Graph) -> Iterator[tuple[str, Graph]]:
    """The executors that run a workflow (``executor.workflow``), with that workflow's graph."""
    for executor_id, executor in graph.executors.items():
        inner = getattr(executor, "workflow", None)
        if isinstance(inner, DefinitionView):
            yield executor_id, inner.graph


def _target(filename: str | None, format: str) -> Path | None:
    """The file ``filename`` names for ``format`` (None: a temporary file, made when written)."""
    if filename is None:
        return None
    path = Path(filename)
    if not path.suffix:
        return path.with_name(f"{path.name}.{format}")
    if path.suffix[1:].lower() != format:
        raise VisualizationError(
            f"the file extension {path.suffix!r} of {filename!r} is not the format {format!r}: "
            f"name a .{format} file, or pass format={path.suffix[1:]!r}"
        )
    return path


# -- escaping -----------------------------------------------------------------------------------


def _dot_quote(text: str) -> str:
    """``text`` as a quoted DOT string: backslashes and quotes escaped, line breaks as ``\\n``,
    other control characters as ``\\xHH``. The mapping is one to one, so distinct ids stay
    distinct node names."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "\n":
            out.append("\\n")
        elif unicodedata.category(char) == "Cc":
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _dot_label(start: str) -> str:
    """The start node's label: its id, then ``(Start)`` on a line of its own."""
    return _dot_quote(start)[:-1] + '\\n(Start)"'


def _mermaid_text(text: str) -> str:
    """``text`` for a quoted Mermaid label: characters Mermaid would read as syntax or markup
    (quotes, ``#``, ``<``, ``>``, ``&``, backquotes, ``|``) and control characters become its
    entity codes (``#quot;``, ``#35;``, ...), so nothing in an id can end the label."""
    out: list[str] = []
    for char in text:
        if char == '"':
            out.append("#quot;")
        elif char in "#<>&`|" or unicodedata.category(char) == "Cc":
            out.append(f"#{ord(char)};")
        else:
            out.append(char)
    return "".join(out)


_Key = tuple[tuple[str, ...], str, str]  # (namespace, kind of node, name)


class _Aliases:
    """Mermaid node ids for every node of a drawing (nested workflows included), unique across
    it. An executor whose id is a plain identifier (and no Mermaid keyword) keeps it; other
    nodes get the id with anything but ``[A-Za-z0-9_]`` made ``_`` (``n_`` in front when it does
    not start with a letter), with a ``_2``, ``_3``, ... suffix while that is taken."""

    def __init__(self, graph: Graph, internal: bool) -> None:
        keys: list[tuple[_Key, str]] = []  # each node, and the text its alias is made from
        self._collect(graph, (), internal, keys)
        self._ids: dict[_Key, str] = {}
        used: set[str] = set()
        for key, _ in keys:  # first, the executors that keep their own ids
            ns, kind, name = key
            if not ns and kind == "executor" and _plain(name) and name not in used:
                self._ids[key] = name
                used.add(name)
        reserved = set(used)
        for key, hint in keys:
            if key in self._ids:
                continue
            candidate = _sanitize("__".join((*key[0], hint)))
            alias, suffix = candidate, 2
            while alias in used or alias in reserved or alias in _MERMAID_RESERVED:
                alias, suffix = f"{candidate}_{suffix}", suffix + 1
            self._ids[key] = alias
            used.add(alias)

    def _collect(
        self,
        graph: Graph,
        ns: tuple[str, ...],
        internal: bool,
        keys: list[tuple[_Key, str]],
    ) -> None:
        for executor_id in graph.executors:
            keys.append(((ns, "executor", executor_id), executor_id))
            if internal:
                keys.append(((ns, "internal", _INTERNAL + executor_id), f"internal_{executor_id}"))
        for fan in _fan_in_nodes(graph):
            keys.append(((ns, "fan-in", fan.key), f"fan_in__{fan.target}"))
        for executor_id, inner in _sub_workflows(graph):
            keys.append(((ns, "subgraph", executor_id), f"{executor_id}__workflow"))
            self._collect(inner, (*ns, executor_id), internal, keys)

    def of(self, ns: tuple[str, ...], kind: str, name: str) -> str:
        return self._ids[(ns, kind, name)]


def _plain(name: str) -> bool:
    return bool(_PLAIN_ID.fullmatch(name)) and name not in _MERMAID_RESERVED


def _sanitize(text: str) -> str:
    cleaned = re.sub(r"[^0-9A-Za-z_]", "_", text)
    return cleaned if cleaned[:1].isascii() and cleaned[:1].isalpha() else f"n_{cleaned}"
