"""Fixtures shared by every test module: store URLs for each backend, and an open store.

``store_url`` runs a test once per backend (ids ``memory``, ``sqlite``, ``postgres``), each time
on an empty store: a fresh SQLite file under ``tmp_path``, a fresh PostgreSQL schema dropped at
teardown. ``durable_store_url`` does the same for SQLite and PostgreSQL only; ``sqlite_url`` and
``postgres_url`` give one backend.

PostgreSQL is the server at ``$STEPLOG_TEST_PG`` (default
``postgresql://postgres@127.0.0.1:5432/test``), checked once per session. When it cannot be
reached, the PostgreSQL tests are skipped with the reason, or fail when ``CI=true``: a CI run must
not pass by skipping them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from kernel import EventStore, open_store

PG_ENV = "STEPLOG_TEST_PG"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA_PREFIX = "steplog_t_"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The PostgreSQL server URL (no schema), after checking once that it answers."""
    url = os.environ.get(PG_ENV) or DEFAULT_PG_URL
    parts = urlsplit(url)
    where = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        reason = f"PostgreSQL not reachable at {where}: {' '.join(str(error).split())}"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true, so the PostgreSQL tests must run; set {PG_ENV})")
        pytest.skip(reason)
    return url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A URL naming a fresh schema, dropped with everything in it after the test."""
    schema = f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}"
    separator = "&" if "?" in postgres_server_url else "?"
    yield f"{postgres_server_url}{separator}schema={schema}"
    with psycopg.connect(postgres_server_url, connect_timeout=5, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A URL naming a SQLite file that does not exist yet (absolute path, four slashes)."""
    return f"sqlite:///{tmp_path / 'steplog.db'}"


_POSTGRES = pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)


@pytest.fixture(params=["memory", "sqlite", _POSTGRES])
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty store, once per backend."""
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture(params=["sqlite", _POSTGRES])
def durable_store_url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty store that other processes can open: SQLite, then PostgreSQL."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def trap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``steplog_trap`` on ``sys.path`` (under ``tmp_path``) whose import leaves a marker
    file; it defines ``Evil`` (an enum) and ``Box`` (a dataclass) for hostile values to name.

    Returns the marker's path, which must never exist.
    """
    marker = tmp_path / "trap-fired"
    (tmp_path / "steplog_trap.py").write_text(
        "import enum, pathlib\n"
        "from dataclasses import dataclass\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "class Evil(enum.Enum):\n"
        "    X = 'x'\n"
        "@dataclass\n"
        "class Box:\n"
        "    v: int\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "steplog_trap", raising=False)
    return marker


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    """An open, empty store on each backend, closed after the test."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()
