"""Opening stores: ``create=False`` never creates anything; ``create=True`` takes turns creating.

A store that does not exist is refused with ``StoreNotFoundError`` and left exactly as it was: no
SQLite file, ``-wal``/``-shm`` or lock file, no directory; no PostgreSQL schema, table, function,
row or advisory lock.
"""

from __future__ import annotations

import inspect
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from filelock import FileLock
from psycopg import sql

from kernel import (
    EventStore,
    MemoryStore,
    StateStaged,
    StoreDamagedError,
    StoreNotFoundError,
    StoreUnavailableError,
    open_store,
)
from kernel._store._backend import RowBackend
from kernel._store._memory import MemoryBackend
from kernel._store._postgres import postgres_params


def event(position: int = 1) -> StateStaged:
    return StateStaged(
        instance_id="a", position=position, timestamp=datetime(2024, 1, 1, tzinfo=UTC),
        run_id="r", superstep_id="s", executor_id="e", key="k", op="set", value=position,
    )  # fmt: skip


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root`` with its size, modification time and bytes."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns,
                                      path.read_bytes() if path.is_file() else b"")
        for path in sorted(root.rglob("*"))
    }  # fmt: skip


# -- SQLite ---------------------------------------------------------------------------------


def test_a_missing_sqlite_file_is_not_found_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match=r"does not exist; nothing was created"):
        open_store(f"sqlite:///{tmp_path}/missing.db", create=False)
    assert tree(tmp_path) == {}


def test_a_missing_sqlite_directory_is_not_found_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/sub/missing.db", create=False)
    assert tree(tmp_path) == {}


def other_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('mine')")


@pytest.mark.parametrize(
    "make",
    [pytest.param(lambda p: p.write_bytes(b""), id="empty-file"),
     pytest.param(other_database, id="another-programs-database")],
)  # fmt: skip
def test_a_file_without_steplog_tables_is_refused_untouched(tmp_path: Path, make: Any) -> None:
    path = tmp_path / "other.db"
    make(path)
    before = tree(tmp_path)
    with pytest.raises(StoreNotFoundError, match="holds no steplog store"):
        open_store(f"sqlite:///{path}", create=False)
    assert tree(tmp_path) == before


def test_a_file_that_is_not_a_database_is_damaged_untouched(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a SQLite file\n" * 200)
    before = tree(tmp_path)
    with pytest.raises(StoreDamagedError, match=f"the file {re.escape(str(path))} is damaged"):
        open_store(f"sqlite:///{path}", create=False)
    assert tree(tmp_path) == before


def test_the_lock_file_serializes_creating_a_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    with FileLock(tmp_path / "new.db.lock"), pytest.raises(StoreUnavailableError) as caught:
        open_store(url, lock_timeout=1)  # another process is creating it, for too long
    assert "for too long" in str(caught.value)
    assert "new.db.lock" in str(caught.value)
    with open_store(url) as store:
        store.append("a", [event()], expected_version=0)


def test_creating_a_store_leaves_no_lock_file_beside_it(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path}/s.db").close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")) == []


def test_opening_an_existing_sqlite_store_takes_no_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    open_store(url).close()
    with FileLock(tmp_path / "s.db.lock"), open_store(url, lock_timeout=1) as store:
        assert store.read("a") == []


def test_sqlite_paths_are_file_names_not_uri_syntax(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/odd %3F name.db"  # SQLite opens it by URI: quoted, not decoded
    with open_store(url) as store:
        store.append("a", [event()], expected_version=0)
    assert (tmp_path / "odd %3F name.db").is_file()
    with open_store(url, create=False) as store:
        assert [e.position for e in store.read("a")] == [1]


# -- every durable backend ------------------------------------------------------------------


def test_an_existing_store_opens_without_create_and_reads(durable_store_url: str) -> None:
    with open_store(durable_store_url) as store:
        store.append("a", [event(1), event(2)], expected_version=0)
    with open_store(durable_store_url, create=False) as store:
        assert [e.position for e in store.read("a")] == [1, 2]
        assert store.instances() == ["a"]
        store.append("a", [event(3)], expected_version=2)  # it is a store, not a read-only view
    with open_store(durable_store_url, create=False) as store:
        assert store.version("a") == 3


def test_memory_is_always_new_and_empty(tmp_path: Path) -> None:
    with open_store("memory://", create=False) as store:
        assert isinstance(store, MemoryStore)
        assert store.instances() == []
        assert store.last_position() == 0


# -- PostgreSQL -----------------------------------------------------------------------------


@pytest.fixture
def admin(postgres_server_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema(postgres_url: str) -> str:
    """The schema ``postgres_url`` names."""
    return postgres_params(postgres_url)["schema"]


def schema_objects(admin: psycopg.Connection[Any], schema: str) -> dict[str, list[str]]:
    """What exists in ``schema``: the schema itself, its relations, functions and types."""
    found = admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    objects: dict[str, list[str]] = {"schema": [schema] if found and found[0] else []}
    for kind, query in {
        "relations": "SELECT c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s ORDER BY 1",
        "functions": "SELECT p.proname FROM pg_proc p JOIN pg_namespace n "
        "ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1",
        "types": "SELECT t.typname FROM pg_type t JOIN pg_namespace n "
        "ON n.oid = t.typnamespace WHERE n.nspname = %s ORDER BY 1",
    }.items():
        objects[kind] = [row[0] for row in admin.execute(query, (schema,))]
    return objects


@pytest.mark.postgres
def test_a_missing_postgres_schema_is_not_found_and_not_created(
    postgres_url: str, admin: psycopg.Connection[Any], schema: str
) -> None:
    with pytest.raises(StoreNotFoundError, match="holds no steplog store"):
        open_store(postgres_url, create=False)
    assert schema_objects(admin, schema) == {
        "schema": [], "relations": [], "functions": [], "types": []
    }  # fmt: skip


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_opening_without_create_never_waits_for_the_setup_lock(
    postgres_url: str, schema: str
) -> None:
    open_store(postgres_url).close()
    with psycopg.connect(postgres_url.split("?")[0], autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"steplog setup {schema}",))
        # Were create=False to take the setup lock, this would wait for as long as it is held.
        with open_store(postgres_url, create=False) as store:
            assert store.read("a") == []


@pytest.mark.postgres
def test_an_empty_postgres_schema_is_not_found_and_left_empty(
    postgres_url: str, admin: psycopg.Connection[Any], schema: str
) -> None:
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    with pytest.raises(StoreNotFoundError):
        open_store(postgres_url, create=False)
    assert schema_objects(admin, schema) == {
        "schema": [schema], "relations": [], "functions": [], "types": []
    }  # fmt: skip


@pytest.mark.postgres
def test_opening_an_existing_postgres_store_without_create_runs_no_ddl(
    postgres_url: str, admin: psycopg.Connection[Any], schema: str
) -> None:
    open_store(postgres_url).close()
    created = schema_objects(admin, schema)
    assert "steplog_append" in created["functions"]
    admin.execute(
        sql.SQL("DROP FUNCTION {}").format(sql.Identifier(schema, "steplog_append"))
    )  # a create=False open must not put it back
    with open_store(postgres_url, create=False) as store:
        assert store.read("a") == []
    assert "steplog_append" not in schema_objects(admin, schema)["functions"]


@pytest.mark.postgres
def test_a_missing_postgres_database_is_not_found(postgres_server_url: str) -> None:
    p = postgres_params(postgres_server_url)
    url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/steplog_no_such_database"
    for create in (False, True):  # a database is never created, only schemas
        with pytest.raises(StoreNotFoundError, match="does not exist"):
            open_store(url, create=create, connect_timeout=2)


def test_the_store_port_is_abstract() -> None:
    assert inspect.isabstract(RowBackend)
    assert RowBackend.__abstractmethods__ == frozenset(
        {
            "insert_rows",
            "select_stream",
            "stream_version",
            "select_rows",
            "last_row_id",
            "instances",
            "select_heads",
            "read_meta",
            "write_meta",
            "acquire_lease",
            "renew_lease",
            "release_lease",
            "read_lease",
            "rewrite_rows",
        }
    )

    class NoInstances(MemoryBackend):  # an adapter that forgot a port method
        instances = RowBackend.instances  # type: ignore[assignment]

    NoInstances.__abstractmethods__ = frozenset({"instances"})
    with pytest.raises(TypeError, match="instances"):
        EventStore(NoInstances(), url="memory://")
