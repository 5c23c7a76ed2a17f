"""The workflow's graph as the log shows it, drawn as inline SVG.

The log holds no graph definition: the executors are those invoked (and those messages were
routed to), the edges the routes of ``MessageStaged`` events. Executors are placed in columns by
the first superstep that invoked them (or routed to them), in order within a column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from markupsafe import Markup, escape

__all__ = ["Graph", "graph_of"]

_W, _H, _GAP_X, _GAP_Y, _PAD = 150, 36, 70, 22, 16


@dataclass(frozen=True)
class Graph:
    """Executors (``nodes``, placed), routes (``edges``: source, target, messages)."""

    nodes: dict[str, tuple[int, int]]
    edges: list[tuple[str, str, int]]

    def svg(self, active: Iterable[str] = ()) -> Markup:
        """The graph as an ``<svg>`` element; ``active`` executors highlighted. Every name is
        escaped."""
        on = set(active)
        if not self.nodes:
            return Markup('<p class="muted">no executor was invoked</p>')
        xs = [x for x, _ in self.nodes.values()]
        ys = [y for _, y in self.nodes.values()]
        width = max(xs) * (_W + _GAP_X) + _W + 2 * _PAD + 40  # room for a loop on the right
        height = max(ys) * (_H + _GAP_Y) + _H + 2 * _PAD + 36  # room for backward curves
        parts = [
            f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img">',
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
            'fill="#667"/></marker></defs>',
        ]
        for source, target, count in self.edges:
            (x1, y1), (x2, y2) = self._at(source), self._at(target)
            if source == target:
                d = (
                    f"M {x1 + _W} {y1 + 8} C {x1 + _W + 45} {y1 - 6} "
                    f"{x1 + _W + 45} {y1 + _H + 6} {x1 + _W} {y1 + _H - 8}"
                )
            elif x2 > x1:
                d = f"M {x1 + _W} {y1 + _H / 2} L {x2} {y2 + _H / 2}"
            else:  # backwards or within a column: curve around
                d = (
                    f"M {x1 + _W / 2} {y1 + _H} C {x1 + _W / 2} {y1 + _H + 40} "
                    f"{x2 + _W / 2} {y2 + _H + 40} {x2 + _W / 2} {y2 + _H}"
                )
            title = escape(f"{source} -> {target}: {count} message(s)")
            parts.append(
                f'<path class="edge" d="{d}" marker-end="url(#arrow)"><title>{title}</title></path>'
            )
        for name in self.nodes:
            x, y = self._at(name)
            cls = "node active" if name in on else "node"
            label = escape(name if len(name) <= 18 else name[:17] + "\u2026")
            parts.append(
                f'<g class="{cls}" data-executor="{escape(name)}"><rect x="{x}" y="{y}" '
                f'width="{_W}" height="{_H}" rx="6"/><text x="{x + _W / 2}" y="{y + _H / 2 + 5}" '
                f'text-anchor="middle">{label}</text><title>{escape(name)}</title></g>'
            )
        parts.append("</svg>")
        return Markup("".join(parts))

    def _at(self, name: str) -> tuple[int, int]:
        col, row = self.nodes[name]
        return _PAD + col * (_W + _GAP_X), _PAD + row * (_H + _GAP_Y)


def graph_of(first_ran: Mapping[str, int], routes: Mapping[tuple[str, str], int]) -> Graph:
    """The graph of an instance: its executors (with the index of the first superstep that
    invoked each) and the routes its messages took."""
    first = dict(first_ran)
    for source, target in routes:
        if target not in first:
            first[target] = first.get(source, 0) + 1
        first.setdefault(source, 0)
    columns: dict[int, list[str]] = {}
    for name, index in sorted(first.items(), key=lambda item: item[1]):
        columns.setdefault(index, []).append(name)
    nodes: dict[str, tuple[int, int]] = {}
    for col, index in enumerate(sorted(columns)):
        for row, name in enumerate(columns[index]):
            nodes[name] = (col, row)
    edges = [(s, t, n) for (s, t), n in sorted(routes.items())]
    return Graph(nodes, edges)
