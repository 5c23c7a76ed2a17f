"""The SQLite adapter, the embedded default: eventsourcing's SQLite recorder on a file in WAL mode.

Each append is one transaction, committed with SQLite's default ``synchronous=FULL`` so that an
appended superstep survives a power cut.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from eventsourcing.persistence import PersistenceError, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

from kernel._errors import (
    SchemaVersionError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
)
from kernel._store import STORE_SCHEMA_VERSION, EventStore, Recorded

__all__ = ["SQLiteStore", "sqlite_path"]

EVENTS_TABLE = "steplog_events"
META_TABLE = "steplog_meta"


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///...`` URL (three slashes: relative; four: absolute)."""
    parts = urlsplit(url)
    if parts.netloc:
        raise StoreConfigError(
            f"SQLite URL {url!r} names a host ({parts.netloc!r}); use sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path.endswith("/"):
        raise StoreConfigError(f"SQLite URL {url!r} names no file; use sqlite:///path/to/file.db")
    if path == ":memory:":
        raise StoreConfigError("use memory:// for an in-memory store, not sqlite:///:memory:")
    return path


@contextmanager
def _setup_turn(directory: Path, *, deadline: float) -> Iterator[None]:
    """Take turns creating tables: processes opening a new file at once otherwise get "database
    is locked" without SQLite's busy wait (a transaction that read the schema cannot upgrade to a
    write while another holds it). An exclusive ``flock`` on the directory serializes setups; it is
    independent of SQLite's own (fcntl) locks, and is released when the descriptor is closed."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield  # SQLite reports the real problem (missing or unreadable directory)
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(
                        f"another process has been creating a store in {directory} for too "
                        "long; retry, or raise lock_timeout"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


class SQLiteStore(EventStore):
    """Events in one SQLite file, shared safely by several processes on one machine."""

    def __init__(self, url: str, *, lock_timeout: int = 30, **options: Any) -> None:
        if options:
            raise StoreConfigError(f"unknown SQLite store options: {sorted(options)}")
        query = parse_qs(urlsplit(url).query)
        if query:
            raise StoreConfigError(f"SQLite URL {url!r} takes no query parameters")
        path = Path(sqlite_path(url))
        self.path = path
        directory = path.parent.resolve()
        if not directory.is_dir():
            raise StoreUnavailableError(
                f"cannot open SQLite store {url}: directory {directory} does not exist; create it "
                "or point the URL elsewhere"
            )
        self._ds = SQLiteDatastore(
            str(path), lock_timeout=lock_timeout, originator_id_type="text"
        )
        recorder = SQLiteApplicationRecorder(self._ds, events_table_name=EVENTS_TABLE)
        super().__init__(recorder, url=f"sqlite:///{path}")
        self._insert_sql = f"INSERT INTO {EVENTS_TABLE} VALUES (?,?,?,?)"
        try:
            with (
                _setup_turn(directory, deadline=time.monotonic() + lock_timeout),
                self._translated("create the tables"),
            ):
                recorder.create_table()
                self._stamp_schema_version()
        except BaseException:
            self._ds.close()
            raise

    def _insert(self, stored: list[StoredEvent]) -> list[int]:
        """All rows in one ``executemany``; their rowids (global positions) are consecutive,
        because no other writer can insert while this transaction holds SQLite's write lock."""
        rows = [(str(s.originator_id), s.originator_version, s.topic, s.state) for s in stored]
        with self._ds.transaction(commit=True) as cursor:
            cursor.executemany(self._insert_sql, rows)
            cursor.execute("SELECT last_insert_rowid()")
            last = int(cursor.fetchone()[0])
        return list(range(last - len(rows) + 1, last + 1))

    def _select_page(
        self, after: int, limit: int, upto: int | None, topics: list[str]
    ) -> list[Recorded]:
        """The global log read straight from the table (no intermediate record objects)."""
        statement = (
            "SELECT rowid, originator_id, originator_version, topic, state "
            f"FROM {EVENTS_TABLE} WHERE rowid > ?"
        )
        params: list[Any] = [after]
        if upto is not None:
            statement += " AND rowid <= ?"
            params.append(upto)
        if topics:
            statement += f" AND topic IN ({','.join('?' * len(topics))})"
            params.extend(topics)
        statement += " ORDER BY rowid LIMIT ?"
        params.append(limit)
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            rows = cursor.fetchall()
        decode = self._mapper.decode
        return [Recorded(row[0], decode(row[1], row[2], row[3], row[4])) for row in rows]

    def _stamp_schema_version(self) -> None:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {META_TABLE} "
                "(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            cursor.execute(f"SELECT value FROM {META_TABLE} WHERE key='schema_version'")
            row = cursor.fetchone()
            if row is None:
                cursor.execute(
                    f"INSERT INTO {META_TABLE} VALUES ('schema_version', ?)",
                    (str(STORE_SCHEMA_VERSION),),
                )
            elif int(row[0]) > STORE_SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"SQLite store {self.path} was written by a newer steplog (store schema "
                    f"version {row[0]}; this steplog knows up to {STORE_SCHEMA_VERSION}); "
                    "upgrade steplog to open it"
                )

    @property
    def datastore(self) -> SQLiteDatastore:
        """eventsourcing's datastore behind this store: its connections and transactions, for
        programs (such as materialized views) that keep their own tables in the same database."""
        return self._ds

    def instances(self) -> list[str]:
        with (
            self._translated("list instances"),
            self._ds.transaction(commit=False) as cursor,
        ):
            cursor.execute(f"SELECT DISTINCT originator_id FROM {EVENTS_TABLE} ORDER BY 1")
            return [row[0] for row in cursor.fetchall()]

    def close(self) -> None:
        if not self._closed:
            self._ds.close()
        super().close()

    def _translate(self, error: PersistenceError, action: str) -> StoreError:
        return self._explain(error, action)

    def _translate_driver(self, error: Exception, action: str) -> StoreError | None:
        if isinstance(error, sqlite3.Error):
            return self._explain(error, action)
        return None

    def _explain(self, error: Exception, action: str) -> StoreError:
        text = str(error)
        lowered = text.lower()
        if "readonly" in lowered or "read-only" in lowered or "unable to open" in lowered:
            return StoreUnavailableError(
                f"cannot {action} in SQLite store {self.path}: {text}; check that the file and "
                "its directory exist and are writable by this user"
            )
        if "locked" in lowered or "busy" in lowered:
            return StoreUnavailableError(
                f"cannot {action} in SQLite store {self.path}: {text}; another process holds the "
                "database lock, retry or raise lock_timeout"
            )
        if "not a database" in lowered or "malformed" in lowered:
            return StoreUnavailableError(
                f"cannot {action}: {self.path} is not a readable SQLite database ({text})"
            )
        return StoreError(f"cannot {action} in SQLite store {self.path}: {text}")
