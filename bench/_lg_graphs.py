"""The loop as a LangGraph ``StateGraph``: nodes A and B alternate, each writing ``a``, ``b``
and the message channel ``count``; a conditional edge ends the graph at ``n``. Also exports the
SQLite and PostgreSQL checkpointers (the bench extra installs all three packages)."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph

__all__ = ["GraphRecursionError", "LoopState", "PostgresSaver", "SqliteSaver", "loop_graph"]


class LoopState(TypedDict):
    count: int
    a: int
    b: int


def _step(state: LoopState) -> dict[str, int]:
    c = state["count"]
    return {"a": c, "b": c, "count": c + 1}


def loop_graph(n: int, checkpointer: Any = None) -> Any:
    graph = StateGraph(LoopState)
    graph.add_node("A", _step)
    graph.add_node("B", _step)
    graph.add_edge(START, "A")
    graph.add_conditional_edges("A", lambda s: END if s["count"] >= n else "B", ["B", END])
    graph.add_conditional_edges("B", lambda s: END if s["count"] >= n else "A", ["A", END])
    return graph.compile(checkpointer=checkpointer)
