"""The SQLite adapter, the embedded default: eventsourcing's SQLite recorder on a file in WAL mode.

Each append is one transaction, committed with SQLite's default ``synchronous=FULL`` so that an
appended superstep survives a power cut. The fast paths (one ``executemany`` per append, pages of
the global log read as plain rows) live in ``SQLiteRecorder``, a subclass of eventsourcing's
recorder that passes eventsourcing's own recorder test cases.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteDatastore
from filelock import FileLock, Timeout

from kernel._base._errors import (
    ConcurrencyConflictError,
    DecodeError,
    SchemaVersionError,
    StoreConfigError,
    StoreDamagedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from kernel._base._urls import mask_url, split_url
from kernel._codec._cipher import MAGIC
from kernel._store._eventstore import (
    PERSISTENCE_ERRORS,
    STORE_SCHEMA_VERSION,
    ErrorTable,
    EventStore,
    driver_error,
)

__all__ = ["SQLiteRecorder", "SQLiteStore", "sqlite_path"]

EVENTS_TABLE = "steplog_events"
META_TABLE = "steplog_meta"
LEASES_TABLE = "steplog_leases"
CHAIN_TABLE = "steplog_chain"
"""Each instance's chain head ``(instance_id, position, head)``, written with each of its rows."""
"""One row per leased instance: holder, and expires in whole microseconds since the Unix epoch
(UTC). Added to stores made before leases by their next ``create=True`` open."""

Row = Sequence[Any]
"""A row of the global log (a ``sqlite3.Row``): rowid, instance id, position, topic, state."""

# Primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the low byte.
_SQLITE_ERROR, _PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _FULL, _CANTOPEN = (
    1, 3, 5, 6, 8, 10, 13, 14,
)  # fmt: skip
_NOT_WRITABLE = "check that the file and its directory exist and are writable by this user"
_HINTS: dict[int, str] = {
    _PERM: _NOT_WRITABLE,
    _READONLY: _NOT_WRITABLE,
    _CANTOPEN: _NOT_WRITABLE,
    _BUSY: "another process holds the database lock; retry, or raise lock_timeout",
    _LOCKED: "another process holds the database lock; retry, or raise lock_timeout",
    _IOERR: "the disk failed to read or write the file",
    _FULL: "the disk is full",
}

SQLITE_ERRORS: ErrorTable = (
    (sqlite3.OperationalError, StoreUnavailableError),
    (sqlite3.InterfaceError, StoreUnavailableError),
    (sqlite3.Error, StoreError),
    *PERSISTENCE_ERRORS,
)
"""sqlite3's classes, then eventsourcing's (which wrap sqlite3's inside its transactions)."""


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///...`` URL (three slashes: relative; four: absolute)."""
    parts = split_url(url)
    if parts.netloc:
        raise StoreConfigError(
            f"SQLite URL {mask_url(url)!r} names "
            + (f"a host ({parts.hostname!r})" if parts.hostname else "a user")
            + "; use sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path.endswith("/"):
        raise StoreConfigError(
            f"SQLite URL {mask_url(url)!r} names no file; use sqlite:///path/to/file.db"
        )
    if path == ":memory:":
        raise StoreConfigError("use memory:// for an in-memory store, not sqlite:///:memory:")
    return path


class SQLiteRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder, with steplog's fast paths.

    ``insert_events`` writes a batch with one ``executemany`` and reads its rowids (consecutive:
    no other writer can insert while the transaction holds SQLite's write lock);
    ``select_rows`` reads a page of the global log as plain tuples, and ``select_notifications``
    is built on it, so eventsourcing's recorder test cases exercise both.
    """

    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = EVENTS_TABLE) -> None:
        super().__init__(datastore, events_table_name)
        self._select_rows_sql = f"SELECT rowid, * FROM {events_table_name}"

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **_: Any
    ) -> Sequence[int] | None:
        rows = [
            (
                s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
                s.originator_version,
                s.topic,
                s.state,
            )
            for s in stored_events
        ]
        c.executemany(self.insert_events_statement, rows)
        c.execute("SELECT last_insert_rowid()")
        last = int(c.fetchone()[0])
        return list(range(last - len(rows) + 1, last + 1))

    def select_rows(
        self,
        *,
        after: int | None,
        limit: int,
        upto: int | None = None,
        topics: Sequence[str] = (),
    ) -> list[Row]:
        """Up to ``limit`` rows with ``after < rowid <= upto`` (bounds optional), of ``topics``
        only if given, in rowid order."""
        conditions, params = _range("rowid", after, upto, topics)
        statement = self._select_rows_sql
        if conditions:
            statement += " WHERE " + " AND ".join(conditions)
        statement += " ORDER BY rowid LIMIT ?"
        params.append(limit)
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            rows: list[Row] = cursor.fetchall()
        return rows

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        after = None if start is None else start - 1 if inclusive_of_start else start
        convert = self.convert_originator_id
        return [
            Notification(
                id=row[0],
                originator_id=convert(row[1]),
                originator_version=row[2],
                topic=row[3],
                state=row[4],
            )
            for row in self.select_rows(after=after, limit=limit, upto=stop, topics=topics)
        ]


def _range(
    column: str, after: int | None, upto: int | None, topics: Sequence[str]
) -> tuple[list[str], list[Any]]:
    """SQL conditions (and their parameters) for ``after < column <= upto`` (bounds optional),
    of ``topics`` only if given."""
    conditions: list[str] = []
    params: list[Any] = []
    if after is not None:
        conditions.append(f"{column} > ?")
        params.append(after)
    if upto is not None:
        conditions.append(f"{column} <= ?")
        params.append(upto)
    if topics:
        conditions.append(f"topic IN ({','.join('?' * len(topics))})")
        params.extend(topics)
    return conditions, params


@contextmanager
def _setup_turn(lock_path: Path, *, timeout: float) -> Iterator[None]:
    """Take turns creating tables: processes opening a new file at once otherwise get "database
    is locked" without SQLite's busy wait (a transaction that read the schema cannot upgrade to a
    write while another holds it). A ``filelock`` lock file beside the database serializes the
    setups, on every platform; it is taken only while a store is being created."""
    lock = FileLock(lock_path, timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise StoreUnavailableError(
            f"another process has been creating the store {lock_path.with_suffix('')} for too "
            f"long (lock file {lock_path}); retry, or raise lock_timeout"
        ) from None
    except OSError:
        locked = False  # no lock file here (read-only directory): SQLite reports the real problem
    else:
        locked = True
    try:
        yield
    finally:
        if locked:
            lock.release()


class SQLiteStore(EventStore):
    """Events in one SQLite file, shared safely by several processes on one machine.

    With ``create=True`` a missing file is created with its tables, and a file without them gets
    them; while it does, ``<file>.lock`` beside it serializes the processes that do the same (the
    lock file is removed once the tables exist). With ``create=False`` the file
    is first inspected read-only: a missing file, or one without steplog's tables, raises
    ``StoreNotFoundError`` and is left exactly as it was.
    """

    _errors = SQLITE_ERRORS
    shares_commits = True

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        read_only: bool = False,
        lock_timeout: int = 30,
        adopt: bool = False,
        **options: Any,
    ) -> None:
        if options:
            raise StoreConfigError(f"unknown SQLite store options: {sorted(options)}")
        query = parse_qs(split_url(url).query, keep_blank_values=True)
        if query and query != {"mode": ["ro"]}:
            raise StoreConfigError(
                f"SQLite URL {mask_url(url)!r} takes no query parameter but mode=ro (read only)"
            )
        read_only = read_only or bool(query)
        if read_only:
            create = False  # a store opened read-only is never created
        path = Path(sqlite_path(url))
        self.path = path
        self._reader_files = not any(f.exists() for f in _wal_files(path))
        """Whether the ``-wal`` and ``-shm`` files were both absent before this store looked at
        the file: then a read-only store removes those its reading made (``close``)."""
        directory = path.parent.resolve()
        if not directory.is_dir():
            missing = StoreUnavailableError if create else StoreNotFoundError
            raise missing(
                f"cannot open SQLite store {url}: directory {directory} does not exist; create it "
                "or point the URL elsewhere"
            )
        if not create:
            self._check_exists(path)
        elif not adopt:
            _refuse_foreign(path)
        self.read_only: bool = read_only or (not create and not _writable(path))
        """Whether the store was opened read-only: asked with ``read_only=True`` or ``?mode=ro``,
        or opened with ``create=False`` while the file (or, for its WAL files, its directory) is
        not writable by this user. Reading works; writing raises ``StoreUnavailableError``."""
        # A URI, so that SQLite never creates the file when create is false (mode=rw), and a path
        # holding "?" or "#" is a file name, not URI syntax.
        if self.read_only:
            uri = _read_only_uri(path)
        else:
            uri = f"{path.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
        self._ds = SQLiteDatastore(uri, lock_timeout=lock_timeout, originator_id_type="text")
        self._sqlite: SQLiteRecorder = SQLiteRecorder(self._ds, events_table_name=EVENTS_TABLE)
        super().__init__(self._sqlite, url=f"sqlite:///{path}")
        try:
            with self._translated("open the store"):
                # Setting up a new file takes turns, from its first connection on: that one
                # switches the file to WAL, which fails at once ("database is locked", no busy
                # wait) while another process is doing the same. So whether setup is needed is
                # decided by a read-only look, outside the datastore.
                # A store made before leases lacks only their table: a writer adds it, in the
                # same turn; a reader (create=False) never does.
                if create and _steplog_tables(path) != _ALL_TABLES:
                    lock = path.with_name(f"{path.name}.lock")
                    with _setup_turn(lock, timeout=lock_timeout):
                        if not self._has_tables():
                            self._sqlite.create_table()
                            self._stamp_schema_version()
                        self._create_leases_table()
                        self._create_chain_table()
                    # The tables exist now, so no process will set them up again: whoever still
                    # waits on (or later takes) a lock file finds them and does nothing. The lock
                    # file can go, rather than sit beside the user's database.
                    with suppress(OSError):
                        lock.unlink()
                stamped = self._check_schema_version()
                if create and stamped is not None and int(stamped) < STORE_SCHEMA_VERSION:
                    self._restamp()
        except BaseException:
            self._ds.close()
            self._remove_reader_files()
            raise

    def _remove_reader_files(self) -> None:
        """After a read-only store's last connection closed: remove the empty ``-wal`` and the
        ``-shm`` that SQLite made to read the file, if neither was there before
        (``_remove_reader_files``)."""
        if self.read_only and self._reader_files:
            _remove_reader_files(self.path)

    def _check_exists(self, path: Path) -> None:
        """Raise ``StoreNotFoundError`` unless ``path`` is a database with steplog's tables; look
        read-only, so that neither the file nor its directory changes."""
        if not path.exists():
            raise StoreNotFoundError(
                f"SQLite store {path} does not exist; nothing was created (a command that writes, "
                "such as a run, creates it)"
            )
        try:
            found = _steplog_tables(path, strict=True)
        except sqlite3.Error as error:
            raise self._store_error(error, "open the store") from error
        if not found >= _TABLES:
            raise StoreNotFoundError(
                f"{path} holds no steplog store (no {EVENTS_TABLE} and {META_TABLE} tables); "
                "it was left untouched"
            )

    def _has_tables(self) -> bool:
        """Whether the events and meta tables exist (the leases table may not, in an old store)."""
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(_TABLES_SQL, _TABLE_NAMES)
            return {row[0] for row in cursor.fetchall()} >= _TABLES

    def _create_leases_table(self) -> None:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {LEASES_TABLE} (instance_id TEXT PRIMARY KEY, "
                "holder TEXT NOT NULL, expires INTEGER NOT NULL)"
            )

    def _create_chain_table(self) -> None:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {CHAIN_TABLE} (instance_id TEXT PRIMARY KEY, "
                "position INTEGER NOT NULL, head BLOB NOT NULL)"
            )

    def _stamp_schema_version(self) -> None:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {META_TABLE} "
                "(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            cursor.execute(
                f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('schema_version', ?)",
                (str(STORE_SCHEMA_VERSION),),
            )

    def _restamp(self) -> None:
        """Stamp an older store with this steplog's schema version before it writes the new row
        format (which older steplogs cannot read); the old rows stay as they are."""
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                f"UPDATE {META_TABLE} SET value = ? WHERE key = 'schema_version' AND "
                "CAST(value AS INTEGER) < ?",
                (str(STORE_SCHEMA_VERSION), STORE_SCHEMA_VERSION),
            )

    def _check_schema_version(self) -> str | None:
        """The stamped schema version (None: unstamped); refuse a newer one."""
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT value FROM {META_TABLE} WHERE key='schema_version'")
            row = cursor.fetchone()
        if row is not None and self._newer_schema(row[0]):
            raise SchemaVersionError(
                f"SQLite store {self.path} was written by a newer steplog (store schema "
                f"version {row[0]}; this steplog knows up to {STORE_SCHEMA_VERSION}); "
                "upgrade steplog to open it"
            )
        return None if row is None else str(row[0])

    # -- meta and chain heads ---------------------------------------------------------------

    def _read_meta(self, key: str) -> str | None:
        with self._translated("read the meta table"), self._ds.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT value FROM {META_TABLE} WHERE key = ?", (key,))
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def _write_meta(self, key: str, value: str) -> None:
        with self._translated("write the meta table"), self._ds.transaction(commit=True) as cursor:
            cursor.execute(f"INSERT OR IGNORE INTO {META_TABLE} VALUES (?, ?)", (key, value))

    def _replace_meta(self, key: str, value: str) -> None:
        with self._translated("write the meta table"), self._ds.transaction(commit=True) as cursor:
            cursor.execute(f"INSERT OR REPLACE INTO {META_TABLE} VALUES (?, ?)", (key, value))

    def _first_sealed_row(self) -> int | None:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT min(rowid) FROM {EVENTS_TABLE} WHERE substr(state, 1, 4) = ?", (MAGIC,)
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _plain_positions(self) -> dict[str, int]:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT originator_id, max(originator_version) FROM {EVENTS_TABLE} "
                "GROUP BY originator_id"
            )
            return {str(row[0]): int(row[1]) for row in cursor.fetchall()}

    def _row_id(self, instance_id: str, last_position: int) -> int | None:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT rowid FROM {EVENTS_TABLE} WHERE originator_id = ? AND "
                "originator_version = ?",
                (instance_id, last_position),
            )
            row = cursor.fetchone()
        return None if row is None else int(row[0])

    def _select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(_TABLE_SQL, (CHAIN_TABLE,))
            if cursor.fetchone() is None:  # a store made before the chain (read, never changed)
                return {}
            if instance_id is None:
                cursor.execute(f"SELECT instance_id, position, head FROM {CHAIN_TABLE}")
            else:
                cursor.execute(
                    f"SELECT instance_id, position, head FROM {CHAIN_TABLE} WHERE instance_id = ?",
                    (instance_id,),
                )
            return {str(i): (int(p), bytes(h)) for i, p, h in cursor.fetchall()}

    # -- leases -------------------------------------------------------------------------------

    def _acquire_lease(
        self, instance_id: str, holder: str, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        stale_holder, stale_expires = replace if replace is not None else (None, None)
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                _ACQUIRE_SQL, (instance_id, holder, expires, stale_holder, stale_expires)
            )
            return cursor.fetchone() is not None

    def _renew_lease(self, instance_id: str, holder: str, expires: int) -> bool:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(_RENEW_SQL, (expires, instance_id, holder))
            return cursor.fetchone() is not None

    def _release_lease(self, instance_id: str, holder: str) -> None:
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(_RELEASE_SQL, (instance_id, holder))

    def _read_lease(self, instance_id: str) -> tuple[str, int] | None:
        with self._ds.transaction(commit=False) as cursor:
            # A reader of a store made before leases has no such table: that is no lease.
            cursor.execute(_TABLE_SQL, (LEASES_TABLE,))
            if cursor.fetchone() is None:
                return None
            cursor.execute(_READ_SQL, (instance_id,))
            row = cursor.fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def _leases_missing(self) -> bool:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(_TABLE_SQL, (LEASES_TABLE,))
            return cursor.fetchone() is None

    # -- rows -----------------------------------------------------------------------------------

    def _insert_row(self, instance_id: str, expected_version: int, row: StoredEvent) -> int:
        with self._ds.transaction(commit=True) as cursor:
            return self._insert_checked(cursor, instance_id, expected_version, row)

    def _insert_rows(
        self, rows: Sequence[tuple[str, int, StoredEvent]]
    ) -> list[int | ConcurrencyConflictError]:
        """Every row in one transaction: one commit, one fsync of the WAL for all of them."""
        outcomes: list[int | ConcurrencyConflictError] = []
        with self._ds.transaction(commit=True) as cursor:
            for instance_id, expected, row in rows:
                try:
                    outcomes.append(self._insert_checked(cursor, instance_id, expected, row))
                except ConcurrencyConflictError as conflict:
                    outcomes.append(conflict)
        return outcomes

    @staticmethod
    def _insert_checked(
        cursor: Any, instance_id: str, expected_version: int, row: StoredEvent
    ) -> int:
        """Insert ``row`` iff the stream is at ``expected_version``: one statement, checked and
        written under the database's write lock (the first statement of the transaction takes
        it), so no other writer can move the stream in between."""
        cursor.execute(
            _INSERT_SQL,
            (
                instance_id,
                row.originator_version,
                row.topic,
                row.state,
                instance_id,
                expected_version,
            ),
        )
        inserted = cursor.fetchone()
        if inserted is not None:
            head = getattr(row, "head", None)
            if head:
                cursor.execute(_HEAD_SQL, (instance_id, row.originator_version, head))
            return int(inserted[0])
        cursor.execute(_VERSION_SQL, (instance_id,))
        actual = _version(instance_id, cursor.fetchone()[0])
        raise ConcurrencyConflictError(instance_id, expected_version, actual)

    def _stream_version(self, instance_id: str) -> int:
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(_VERSION_SQL, (instance_id,))
            return _version(instance_id, cursor.fetchone()[0])

    def _select_stream(
        self, instance_id: str, after: int | None, upto: int | None, limit: int | None = None
    ) -> list[tuple[int, str, bytes]]:
        """The rows holding ``(after, upto]``: the index on (instance, last position) finds the
        first row past ``after`` and the first row that reaches ``upto``."""
        statement = _STREAM_SQL
        params: list[Any] = [instance_id, after or 0]
        if upto is not None:
            statement += _STREAM_UPTO_SQL
            params += [instance_id, upto, upto]
        statement += " ORDER BY originator_version"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            rows: list[tuple[int, str, bytes]] = cursor.fetchall()
        return rows

    def _select_windows(
        self, instance_id: str, windows: Sequence[tuple[int, int]]
    ) -> list[list[tuple[int, str, bytes]]]:
        """Every window's rows in one statement (per hundred windows): a ``UNION ALL`` of the
        windows' range reads, each tagged with its window."""
        found: list[list[tuple[int, str, bytes]]] = [[] for _ in windows]
        with self._ds.transaction(commit=False) as cursor:
            for start in range(0, len(windows), 100):
                chunk = windows[start : start + 100]
                parts, params = [], []
                for n, (after, upto) in enumerate(chunk, start=start):
                    parts.append(f"SELECT * FROM ({_WINDOW_SQL})")
                    params += [n, instance_id, after, instance_id, upto, upto]
                cursor.execute(
                    f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY n, originator_version",
                    params,
                )
                for n, last, topic, state in cursor.fetchall():
                    found[n].append((last, topic, state))
        return found

    def _select_rows(
        self, after_row: int, limit: int, upto_row: int | None
    ) -> list[tuple[int, str, int, str, bytes]]:
        return self._sqlite.select_rows(after=after_row, limit=limit, upto=upto_row)  # type: ignore[return-value]

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
            self._stop_committer()
            self._ds.close()
            self._remove_reader_files()
        super().close()

    def _where(self) -> str:
        return f"SQLite store {self.path}"

    def _refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
        cause = driver_error(error, sqlite3.Error)
        code = getattr(cause, "sqlite_errorcode", None)
        if not isinstance(code, int):
            return kind, ""
        primary = code & 0xFF
        if primary == _SQLITE_ERROR:  # a statement failed ("no such table"): the file is there
            return StoreError, ""
        if cause is not None and StoreDamagedError.detects(cause):
            return StoreDamagedError, (
                f"the file {self.path} is damaged: it is not a SQLite database, or its pages are "
                "malformed; nothing was changed, and waiting will not help: restore it from a "
                "backup (sqlite3's .recover may save what is left)"
            )
        if primary == _READONLY and self.read_only:
            return StoreUnavailableError, (
                "the store was opened read-only (?mode=ro, or the file or its directory is not "
                "writable by this user): it can be read, not written"
            )
        hint = _HINTS.get(primary)
        return (StoreUnavailableError, hint) if hint else (kind, "")


# A batch row goes in only if the stream is at the expected version (its last row's last position).
_INSERT_SQL = f"""
INSERT INTO {EVENTS_TABLE} (originator_id, originator_version, topic, state)
SELECT ?, ?, ?, ? WHERE (
    SELECT coalesce(max(originator_version), 0) FROM {EVENTS_TABLE} WHERE originator_id = ?
) = ?
RETURNING rowid
"""
_HEAD_SQL = f"""
INSERT INTO {CHAIN_TABLE} (instance_id, position, head) VALUES (?, ?, ?)
ON CONFLICT (instance_id) DO UPDATE SET position = excluded.position, head = excluded.head
"""
_VERSION_SQL = (
    f"SELECT coalesce(max(originator_version), 0) FROM {EVENTS_TABLE} WHERE originator_id = ?"
)
_STREAM_SQL = (
    f"SELECT originator_version, topic, state FROM {EVENTS_TABLE} "
    "WHERE originator_id = ? AND originator_version > ?"
)
_WINDOW_SQL = (
    f"SELECT ? AS n, originator_version, topic, state FROM {EVENTS_TABLE} "
    "WHERE originator_id = ? AND originator_version > ? AND originator_version <= "
    f"coalesce((SELECT min(originator_version) FROM {EVENTS_TABLE} WHERE originator_id = ? "
    "AND originator_version >= ?), ?) ORDER BY originator_version"
)
"""The rows of one window ``(after, upto]`` of a stream, tagged with the window's number."""
# Up to the first row that reaches ``upto`` (or every row, if none does yet).
_STREAM_UPTO_SQL = (
    f" AND originator_version <= coalesce((SELECT min(originator_version) FROM {EVENTS_TABLE} "
    "WHERE originator_id = ? AND originator_version >= ?), ?)"
)

# Take the lease if it is free, ours, or exactly the stale one named (holder, expires): the
# conflict's update is skipped otherwise, and RETURNING then yields no row.
_ACQUIRE_SQL = f"""
INSERT INTO {LEASES_TABLE} (instance_id, holder, expires) VALUES (?, ?, ?)
ON CONFLICT (instance_id) DO UPDATE SET holder = excluded.holder, expires = excluded.expires
WHERE {LEASES_TABLE}.holder = excluded.holder
   OR ({LEASES_TABLE}.holder = ? AND {LEASES_TABLE}.expires = ?)
RETURNING holder
"""
_RENEW_SQL = (
    f"UPDATE {LEASES_TABLE} SET expires = ? WHERE instance_id = ? AND holder = ? RETURNING 1"
)
_RELEASE_SQL = f"DELETE FROM {LEASES_TABLE} WHERE instance_id = ? AND holder = ?"
_READ_SQL = f"SELECT holder, expires FROM {LEASES_TABLE} WHERE instance_id = ?"
_TABLE_SQL = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"

_TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?, ?)"
_TABLE_NAMES = (EVENTS_TABLE, META_TABLE, LEASES_TABLE, CHAIN_TABLE)
_TABLES = frozenset({EVENTS_TABLE, META_TABLE})
"""The tables that make a file a steplog store (a reader needs no more)."""
_ALL_TABLES = frozenset(_TABLE_NAMES)
"""The tables a writer makes sure exist."""


def _version(instance_id: str, value: Any) -> int:
    """A stream's version as stored: a row whose position is not an integer (written around the
    store) is a ``DecodeError``, like any malformed row."""
    if type(value) is not int:
        raise DecodeError(
            f"stream {instance_id!r} has a row whose position {value!r:.40} is not an integer"
        )
    return value


def _steplog_tables(path: Path, *, strict: bool = False) -> frozenset[str]:
    """Which of steplog's tables the file at ``path`` holds, looked at read-only (nothing is
    created or changed); none for a missing file. An unreadable file also counts as none unless
    ``strict``, when the ``sqlite3.Error`` is raised."""
    if not path.exists():
        return frozenset()
    try:
        with closing(_connect_read_only(path)) as db:
            return frozenset(row[0] for row in db.execute(_TABLES_SQL, _TABLE_NAMES))
    except sqlite3.Error:
        if strict:
            raise
        return frozenset()


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that reads ``path`` and changes nothing in it (see ``_read_only_uri``)."""
    return _open_read_only(path)[0]


def _read_only_uri(path: Path) -> str:
    """A URI that opens ``path`` read-only, changing nothing in it.

    ``mode=ro`` when SQLite can read the file so; when it cannot because it cannot make the
    ``-shm`` file it needs to read a WAL-mode file (a directory this user cannot write, or a
    read-only mount), ``mode=ro&immutable=1``, which reads the file alone (``_open_read_only``)."""
    try:
        db, uri = _open_read_only(path)
    except sqlite3.Error:
        return f"{path.resolve().as_uri()}?mode=ro"  # unreadable: the open reports why
    db.close()
    return uri


def _open_read_only(path: Path) -> tuple[sqlite3.Connection, str]:
    """A read-only connection to ``path``, and the URI it was opened with.

    ``mode=ro`` first. SQLite reads a WAL-mode file through its ``-shm`` file; where it cannot
    create it (a read-only directory: ``SQLITE_READONLY``; a read-only mount: ``SQLITE_CANTOPEN``)
    the file is opened with ``immutable=1``: read alone, as a snapshot, with no lock and no
    ``-shm``. That is safe because no writer can be active: a writer needs the ``-wal`` and
    ``-shm`` files, which do not exist and cannot be made there. A ``-wal`` file that holds
    commits (a store copied or mounted while a writer had it open) would be ignored by
    ``immutable=1``, so it is refused with ``StoreUnavailableError`` rather than read without
    them."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    db = sqlite3.connect(uri, uri=True)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as error:
        db.close()
        if (getattr(error, "sqlite_errorcode", 0) & 0xFF) not in (_READONLY, _CANTOPEN):
            raise
        if not os.access(path, os.R_OK):
            raise
        wal = path.with_name(f"{path.name}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreUnavailableError(
                f"SQLite store {path} cannot be read here: its write-ahead log {wal.name} holds "
                "commits, which SQLite reads only through a -shm file that cannot be created in "
                "this read-only directory or mount; open it once where it is writable (that "
                "folds the log into the file), or copy the files to such a place"
            ) from None
        uri += "&immutable=1"
        return sqlite3.connect(uri, uri=True), uri
    except BaseException:
        db.close()
        raise
    return db, uri


def _wal_files(path: Path) -> tuple[Path, Path]:
    """The ``-wal`` and ``-shm`` files SQLite keeps beside a WAL-mode database at ``path``."""
    return path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")


def _writable(path: Path) -> bool:
    """Whether this user can write the store at ``path``: the file, and its directory unless the
    WAL files already exist beside it (SQLite creates them there)."""
    if not os.access(path, os.W_OK):
        return False
    return os.access(path.parent, os.W_OK) or all(f.exists() for f in _wal_files(path))


def _remove_reader_files(path: Path) -> None:
    """Remove the ``-wal`` and ``-shm`` files a read-only reader of ``path`` made, when no other
    connection has the file open; change nothing else.

    To read a WAL-mode file, a ``mode=ro`` connection needs the ``-shm`` file (its
    shared-memory index) and an open ``-wal``: SQLite creates both, empty, where the directory
    is writable, and leaves them when it closes (a read-only connection never checkpoints, so
    never removes them). A writer's last connection would remove them, after folding the
    ``-wal`` into the file. Here nothing is folded: the reader's files go only if the ``-wal``
    is still empty (no writer committed since) and an exclusive lock on the file, taken the way
    SQLite takes it (``locking_mode=EXCLUSIVE``, ``BEGIN IMMEDIATE``: another connection, in any
    process, makes it fail at once), shows that nobody else uses them. The transaction writes
    nothing and is rolled back; closing the connection then deletes the empty ``-wal`` (its
    checkpoint has nothing to copy) and the ``-shm`` is unlinked while the lock is held (in
    exclusive mode SQLite never opens it). Otherwise, or where this user cannot open the file
    for writing, the files are left as SQLite leaves them."""
    path = path.resolve()
    wal, shm = _wal_files(path)
    try:
        if wal.stat().st_size != 0:
            return  # a writer has committed since: its -wal is its own to fold and remove
        db = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=0)
    except (OSError, sqlite3.Error):
        return
    try:
        db.isolation_level = None
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        db.execute("BEGIN IMMEDIATE")  # the file's exclusive lock, or "locked" at once
        try:
            if wal.stat().st_size == 0:
                shm.unlink(missing_ok=True)
        finally:
            db.execute("ROLLBACK")
    except (OSError, sqlite3.Error):
        pass  # another connection has the file open: the files are in use, and stay
    finally:
        db.close()


_OURS = ("steplog_", "sqlite_")
"""Name prefixes of the tables a steplog store holds: steplog's own, its materialized views'
(``steplog_view_*``), and SQLite's internal ones."""


def _refuse_foreign(path: Path) -> None:
    """Refuse to make a store of another application's database: a file that holds tables but
    not steplog's raises ``StoreConfigError`` naming a few, before anything is written to it (no
    table, no WAL switch, no lock file). A file SQLite cannot read is left to the open to report.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with closing(_connect_read_only(path)) as db:
            names = sorted(
                str(row[0])
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            )
    except sqlite3.Error:
        return
    if set(names) >= _TABLES:
        return
    foreign = [name for name in names if not name.startswith(_OURS)]
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise StoreConfigError(
            f"{path} is another application's SQLite database (it holds the tables {shown}{more} "
            "and no steplog store); nothing was written to it. Point the URL at a file of its own, "
            "or pass adopt=True to open_store to add steplog's tables to this one (which also "
            "switches it to WAL mode)"
        )
