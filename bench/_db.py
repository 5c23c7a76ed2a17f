"""Database helpers shared by the cases: on-disk sizes, throwaway PostgreSQL schemas."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench._core import Config, Skipped

T = TypeVar("T")

__all__ = [
    "fresh_schema",
    "pg_connect",
    "pg_growth",
    "pg_reachable",
    "pg_schema_bytes",
    "pg_server_version",
    "remove_sqlite",
    "sqlite_bytes",
    "sqlite_growth",
    "url_with_query",
]


# -- SQLite -------------------------------------------------------------------------------------


def sqlite_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes the database occupies once its WAL is checkpointed into the main file.

    ``PRAGMA wal_checkpoint(TRUNCATE)`` folds the WAL into the file and empties it; the size is
    then ``page_count * page_size`` (plus any WAL left behind, normally 0). Every writer must have
    closed its connection (or be idle) for the truncate to complete.
    """
    path = Path(path)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    wal = Path(f"{path}-wal")
    return int(pages * page_size + (wal.stat().st_size if wal.exists() else 0))


def remove_sqlite(path: str | os.PathLike[str]) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{path}{suffix}")
        if p.exists():
            p.unlink()


def sqlite_growth(
    path: Path, create: Callable[[Path], object], run: Callable[[Path], T]
) -> tuple[T, int]:
    """``run(path)`` and the bytes it added to a fresh SQLite file at ``path``.

    ``create(path)`` makes the empty tables first (not billed to ``run``) and must close its
    connections; the file is removed at the end.
    """
    try:
        create(path)
        empty = sqlite_bytes(path)
        result = run(path)
        return result, sqlite_bytes(path) - empty
    finally:
        remove_sqlite(path)


# -- PostgreSQL ---------------------------------------------------------------------------------


def url_with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def pg_connect(url: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(url, connect_timeout=5, **kwargs)


_reachable: dict[str, str | None] = {}


def pg_reachable(url: str) -> str | None:
    """None when the server answers, else why not (cached per URL)."""
    if url not in _reachable:
        try:
            with pg_connect(url, autocommit=True) as conn:
                conn.execute("SELECT 1")
            _reachable[url] = None
        except Exception as error:
            _reachable[url] = f"{type(error).__name__}: {str(error).strip()[:200]}"
    return _reachable[url]


def require_pg(cfg: Config) -> None:
    """Skip the case when PostgreSQL is unreachable (under CI=true that is a failure)."""
    reason = pg_reachable(cfg.pg_url)
    if reason is None:
        return
    if cfg.ci:
        raise RuntimeError(f"PostgreSQL is required under CI=true but unreachable: {reason}")
    raise Skipped(f"PostgreSQL unreachable at {cfg.pg_url}: {reason}")


def pg_server_version(url: str) -> str | None:
    if pg_reachable(url) is not None:
        return None
    with pg_connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else None


def pg_settings(url: str, names: tuple[str, ...]) -> dict[str, str]:
    if pg_reachable(url) is not None:
        return {}
    out = {}
    with pg_connect(url, autocommit=True) as conn:
        for name in names:
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = str(row[0]) if row else "?"
    return out


@contextmanager
def fresh_schema(cfg: Config, prefix: str) -> Iterator[str]:
    """A new, empty schema, dropped (with everything in it) on exit."""
    require_pg(cfg)
    name = f"bench_{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with pg_connect(cfg.pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with pg_connect(cfg.pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_schema_bytes(url: str, schema: str) -> int:
    """``pg_total_relation_size`` (heap + indexes + TOAST) summed over the schema's tables."""
    with pg_connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


def pg_growth(
    cfg: Config, prefix: str, create: Callable[[str], object], run: Callable[[str], T]
) -> tuple[T, int]:
    """``run(schema)`` and the bytes it added to a fresh schema (``create(schema)`` makes the
    empty tables first, not billed to ``run``); the schema is dropped at the end."""
    with fresh_schema(cfg, prefix) as schema:
        create(schema)
        empty = pg_schema_bytes(cfg.pg_url, schema)
        result = run(schema)
        return result, pg_schema_bytes(cfg.pg_url, schema) - empty
