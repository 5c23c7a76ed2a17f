"""The loop as a LangGraph ``StateGraph``: nodes A and B alternate, each writing ``a``, ``b``
and the message channel ``count``; a conditional edge ends the graph at ``n``. Also exports the
SQLite and PostgreSQL checkpointers (the bench extra installs all three packages), and opens their
asyncio variants (``AsyncSqliteSaver`` on one aiosqlite connection, ``AsyncPostgresSaver`` on one
connection pool) for the concurrent benchmark, where many ``ainvoke`` share one checkpointer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import aiosqlite
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph

__all__ = [
    "AsyncPostgresSaver",
    "AsyncSqliteSaver",
    "GraphRecursionError",
    "LoopState",
    "PostgresSaver",
    "SqliteSaver",
    "async_postgres_saver",
    "async_sqlite_saver",
    "loop_graph",
]


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


@asynccontextmanager
async def async_sqlite_saver(path: Path) -> AsyncIterator[AsyncSqliteSaver]:
    """An ``AsyncSqliteSaver`` on one aiosqlite connection to ``path``, its tables created.

    ``setup()`` turns on WAL; ``synchronous`` stays at SQLite's default FULL, as for the
    synchronous saver. Must be entered in the event loop that will use it (the saver keeps it).
    """
    async with aiosqlite.connect(path) as conn:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield saver


@asynccontextmanager
async def async_postgres_saver(
    url: str, *, min_size: int, max_size: int
) -> AsyncIterator[AsyncPostgresSaver]:
    """An ``AsyncPostgresSaver`` on one ``AsyncConnectionPool`` of ``min_size..max_size``
    connections to ``url``, its tables created; the connection settings are the ones
    ``AsyncPostgresSaver.from_conn_string`` uses (autocommit, no prepared statements, dict rows).
    """
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(
        url, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False
    ) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver
