"""The SQLite adapter, the embedded default: eventsourcing's SQLite recorder on a file in WAL mode.

Each append is one transaction, committed with SQLite's default ``synchronous=FULL`` so that an
appended superstep survives a power cut. The fast paths (one ``executemany`` per append, pages of
the global log read as plain rows) live in ``SQLiteRecorder``, a subclass of eventsourcing's
recorder that passes eventsourcing's own recorder test cases.

Longer than 600 lines because ``SQLiteBackend`` is one class: opening a file (which is most of it:
read-only, foreign and older files), rows, chain heads, meta values, leases and maintenance share
one datastore. The file around the store is ``_sqlitefile``; the recorder, ``_sqliterecorder``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from eventsourcing.persistence import InterfaceError, StoredEvent
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteDatastore,
)

from kernel._base._errors import (
    ConcurrencyConflictError,
    DecodeError,
    SchemaVersionError,
    StoreBusyError,
    StoreConfigError,
    StoreDamagedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from kernel._base._urls import mask_url, split_url
from kernel._codec._cipher import MAGIC
from kernel._store._backend import (
    PERSISTENCE_ERRORS,
    ErrorTable,
    Insert,
    LogRow,
    RowBackend,
    RowChange,
    StreamRow,
    driver_error,
)
from kernel._store._core import STORE_SCHEMA_VERSION, newer_schema
from kernel._store._eventstore import EventStore
from kernel._store._sqlitefile import (
    ALL_TABLES,
    CHAIN_TABLE,
    EVENTS_TABLE,
    LEASES_TABLE,
    META_TABLE,
    TABLE_NAMES,
    TABLE_SQL,
    TABLES,
    TABLES_SQL,
    read_only_uri,
    refuse_foreign,
    remove_reader_files,
    setup_turn,
    steplog_tables,
    wal_files,
    writable,
)
from kernel._store._sqliterecorder import SQLiteRecorder

__all__ = ["EVENTS_TABLE", "SQLiteBackend", "SQLiteRecorder", "SQLiteStore", "sqlite_path"]

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


class SQLiteBackend(RowBackend):
    """Rows in one SQLite file in WAL mode (``SQLiteStore`` says how it is opened).

    Each call is one transaction; ``insert_rows`` is one commit (one fsync of the WAL) for every
    row it is given. ``write_transaction`` is the write transaction every writer of the file
    that also reads uses (``BEGIN IMMEDIATE``).
    """

    errors = SQLITE_ERRORS
    shares_commits = True

    def __init__(
        self,
        path: Path,
        *,
        create: bool = True,
        read_only: bool = False,
        lock_timeout: int = 30,
        adopt: bool = False,
    ) -> None:
        self.path = path
        self.where = f"SQLite store {path}"
        self._reader_files = not any(f.exists() for f in wal_files(path))
        """Whether the ``-wal`` and ``-shm`` files were both absent before this store looked at
        the file: then a read-only store removes those its reading made (``close``)."""
        self.read_only = read_only
        directory = path.parent.resolve()
        if not directory.is_dir():
            missing = StoreUnavailableError if create else StoreNotFoundError
            raise missing(
                f"cannot open SQLite store sqlite:///{path}: directory {directory} does not "
                "exist; create it or point the URL elsewhere"
            )
        if not create:
            self._check_exists(path)
        elif not adopt:
            refuse_foreign(path)
        self.read_only = read_only or (not create and not writable(path))
        # A URI, so that SQLite never creates the file when create is false (mode=rw), and a path
        # holding "?" or "#" is a file name, not URI syntax.
        if self.read_only:
            uri = read_only_uri(path)
        else:
            uri = f"{path.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
        self.datastore = SQLiteDatastore(uri, lock_timeout=lock_timeout, originator_id_type="text")
        """eventsourcing's datastore: its connections and transactions."""
        self.datastore.pool.close()  # it made no connection yet; this one makes them
        self.datastore.pool = CachingPool(db_name=uri, lock_timeout=lock_timeout)
        self.recorder: SQLiteRecorder = SQLiteRecorder(
            self.datastore, events_table_name=EVENTS_TABLE
        )
        try:
            with self.translated("open the store"):
                self._set_up(path, create=create, lock_timeout=lock_timeout)
        except BaseException:
            self.datastore.close()
            self._remove_reader_files()
            raise

    def _set_up(self, path: Path, *, create: bool, lock_timeout: int) -> None:
        # Setting up a new file takes turns, from its first connection on: that one switches the
        # file to WAL, which fails at once ("database is locked", no busy wait) while another
        # process is doing the same. So whether setup is needed is decided by a read-only look,
        # outside the datastore. A store made before leases lacks only their table: a writer
        # adds it, in the same turn; a reader (create=False) never does.
        if create and steplog_tables(path) != ALL_TABLES:
            lock = path.with_name(f"{path.name}.lock")
            with setup_turn(lock, timeout=lock_timeout):
                if not self._has_tables():
                    self.recorder.create_table()
                    self._stamp_schema_version()
                self._create_leases_table()
                self._create_chain_table()
            # The tables exist now, so no process will set them up again: whoever still waits
            # on (or later takes) a lock file finds them and does nothing. The lock file can go,
            # rather than sit beside the user's database.
            with suppress(OSError):
                lock.unlink()
        stamped = self._check_schema_version()
        if create and stamped is not None and int(stamped) < STORE_SCHEMA_VERSION:
            self._restamp()

    def _remove_reader_files(self) -> None:
        """After a read-only store's last connection closed: remove the empty ``-wal`` and the
        ``-shm`` that SQLite made to read the file, if neither was there before
        (``remove_reader_files``)."""
        if self.read_only and self._reader_files:
            remove_reader_files(self.path)

    def _check_exists(self, path: Path) -> None:
        """Raise ``StoreNotFoundError`` unless ``path`` is a database with steplog's tables; look
        read-only, so that neither the file nor its directory changes."""
        if not path.exists():
            raise StoreNotFoundError(
                f"SQLite store {path} does not exist; nothing was created (a command that writes, "
                "such as a run, creates it)"
            )
        with self.translated("open the store"):
            found = steplog_tables(path, strict=True)
        if not found >= TABLES:
            raise StoreNotFoundError(
                f"{path} holds no steplog store (no {EVENTS_TABLE} and {META_TABLE} tables); "
                "it was left untouched"
            )

    def _has_tables(self) -> bool:
        """Whether the events and meta tables exist (the leases table may not, in an old store)."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(TABLES_SQL, TABLE_NAMES)
            return {row[0] for row in cursor.fetchall()} >= TABLES

    def _create_leases_table(self) -> None:
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {LEASES_TABLE} (instance_id TEXT PRIMARY KEY, "
                "holder TEXT NOT NULL, expires INTEGER NOT NULL)"
            )

    def _create_chain_table(self) -> None:
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {CHAIN_TABLE} (instance_id TEXT PRIMARY KEY, "
                "position INTEGER NOT NULL, head BLOB NOT NULL)"
            )

    def _stamp_schema_version(self) -> None:
        with self.datastore.transaction(commit=True) as cursor:
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
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"UPDATE {META_TABLE} SET value = ? WHERE key = 'schema_version' AND "
                "CAST(value AS INTEGER) < ?",
                (str(STORE_SCHEMA_VERSION), STORE_SCHEMA_VERSION),
            )

    def _check_schema_version(self) -> str | None:
        """The stamped schema version (None: unstamped); refuse a newer one."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT value FROM {META_TABLE} WHERE key='schema_version'")
            row = cursor.fetchone()
        if row is not None and newer_schema(row[0], where=f"sqlite:///{self.path}"):
            raise SchemaVersionError(
                f"SQLite store {self.path} was written by a newer steplog (store schema "
                f"version {row[0]}; this steplog knows up to {STORE_SCHEMA_VERSION}); "
                "upgrade steplog to open it"
            )
        return None if row is None else str(row[0])

    # -- rows -----------------------------------------------------------------------------------

    def insert_rows(self, rows: Sequence[Insert]) -> list[int | ConcurrencyConflictError]:
        """Every row in one transaction: one commit, one fsync of the WAL for all of them.

        The hot path: the pool's writer connection (its writer lock and its checks, as
        ``datastore.transaction`` takes it), driven directly rather than through eventsourcing's
        transaction and cursor wrappers (about 15 us of an append). Driver errors come as
        ``sqlite3``'s, which the store translates like eventsourcing's."""
        outcomes: list[int | ConcurrencyConflictError] = []
        pool = self.datastore.pool
        connection = pool.get_connection(is_writer=True)
        try:
            driver: sqlite3.Connection = connection._sqlite_conn
            cursor = driver.cursor()
            cursor.execute("BEGIN")
            try:
                for instance_id, expected, row in rows:
                    try:
                        outcomes.append(self._insert_checked(cursor, instance_id, expected, row))
                    except ConcurrencyConflictError as conflict:
                        outcomes.append(conflict)
                driver.commit()
            except BaseException:
                if driver.in_transaction:  # never hand the pool a connection mid-transaction
                    with suppress(sqlite3.Error):
                        driver.rollback()
                raise
            finally:
                cursor.close()
        finally:
            pool.put_connection(connection)
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

    def stream_version(self, instance_id: str) -> int:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(_VERSION_SQL, (instance_id,))
            return _version(instance_id, cursor.fetchone()[0])

    def select_stream(
        self,
        instance_id: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
    ) -> list[StreamRow]:
        """The index on (instance, last position) finds the first row past ``after`` and the
        first row that reaches ``upto``."""
        statement = _STREAM_SQL
        params: list[Any] = [instance_id, after or 0]
        if upto is not None:
            statement += _STREAM_UPTO_SQL
            params += [instance_id, upto, upto]
        statement += " ORDER BY originator_version"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            rows: list[StreamRow] = cursor.fetchall()
        return rows

    def select_windows(
        self, instance_id: str, windows: Sequence[tuple[int, int]]
    ) -> list[list[StreamRow]]:
        """Every window's rows in one statement (per hundred windows): a ``UNION ALL`` of the
        windows' range reads, each tagged with its window."""
        found: list[list[StreamRow]] = [[] for _ in windows]
        with self.datastore.transaction(commit=False) as cursor:
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

    def select_rows(self, *, after: int = 0, limit: int, upto: int | None = None) -> list[LogRow]:
        return self.recorder.select_rows(after=after, limit=limit, upto=upto)  # type: ignore[return-value]

    def last_row_id(self) -> int:
        return int(self.recorder.max_notification_id() or 0)

    def instances(self) -> list[str]:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT DISTINCT originator_id FROM {EVENTS_TABLE} ORDER BY 1")
            return [row[0] for row in cursor.fetchall()]

    def row_id(self, instance_id: str, last_position: int) -> int | None:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT rowid FROM {EVENTS_TABLE} WHERE originator_id = ? AND "
                "originator_version = ?",
                (instance_id, last_position),
            )
            row = cursor.fetchone()
        return None if row is None else int(row[0])

    def first_sealed_row(self) -> int | None:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT min(rowid) FROM {EVENTS_TABLE} WHERE substr(state, 1, 4) = ?", (MAGIC,)
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def last_positions(self) -> dict[str, int]:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT originator_id, max(originator_version) FROM {EVENTS_TABLE} "
                "GROUP BY originator_id"
            )
            return {str(row[0]): int(row[1]) for row in cursor.fetchall()}

    # -- chain heads and meta values ------------------------------------------------------------

    def select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(TABLE_SQL, (CHAIN_TABLE,))
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

    def read_meta(self, key: str) -> str | None:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT value FROM {META_TABLE} WHERE key = ?", (key,))
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def write_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(f"{verb} INTO {META_TABLE} VALUES (?, ?)", (key, value))

    # -- leases -------------------------------------------------------------------------------

    def acquire_lease(
        self, instance_id: str, holder: str, *, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        stale_holder, stale_expires = replace if replace is not None else (None, None)
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                _ACQUIRE_SQL, (instance_id, holder, expires, stale_holder, stale_expires)
            )
            return cursor.fetchone() is not None

    def renew_lease(self, instance_id: str, holder: str, *, expires: int) -> bool:
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(_RENEW_SQL, (expires, instance_id, holder))
            return cursor.fetchone() is not None

    def release_lease(self, instance_id: str, holder: str) -> None:
        with self.datastore.transaction(commit=True) as cursor:
            cursor.execute(_RELEASE_SQL, (instance_id, holder))

    def read_lease(self, instance_id: str) -> tuple[str, int] | None:
        with self.datastore.transaction(commit=False) as cursor:
            # A reader of a store made before leases has no such table: that is no lease.
            cursor.execute(TABLE_SQL, (LEASES_TABLE,))
            if cursor.fetchone() is None:
                return None
            cursor.execute(_READ_SQL, (instance_id,))
            row = cursor.fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def leases_missing(self) -> bool:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(TABLE_SQL, (LEASES_TABLE,))
            return cursor.fetchone() is None

    # -- maintenance --------------------------------------------------------------------------

    @contextmanager
    def write_transaction(self, *, secure_delete: bool = False) -> Iterator[Any]:
        """A write transaction that holds the file's write lock from its start (``BEGIN
        IMMEDIATE``: it waits for the lock under the busy timeout, where a transaction that read
        first would fail at once with "database is locked"); yields its cursor, commits when the
        block ends, rolls back if it raises. ``secure_delete``: the plain text the transaction
        frees is zeroed in the file rather than left in its free space."""
        with self.datastore.get_connection(commit=True) as connection:
            cursor = connection.cursor()
            before = None
            if secure_delete:
                cursor.execute("PRAGMA secure_delete")
                before = int(cursor.fetchone()[0])
                cursor.execute("PRAGMA secure_delete=ON")
            try:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield cursor
                except BaseException:
                    connection.rollback()
                    raise
                connection.commit()
            finally:
                if before is not None:
                    cursor.execute(f"PRAGMA secure_delete={before}")

    def rewrite_rows(self, changes: Sequence[RowChange]) -> list[bool]:
        written = []
        with self.write_transaction(secure_delete=True) as cursor:
            for change in changes:
                cursor.execute(_REWRITE_SQL, change)
                written.append(cursor.fetchone() is not None)
        return written

    def compact(self, *, tables: Sequence[str] = ()) -> None:
        """``VACUUM`` (every table of the file, so ``tables`` changes nothing), then a WAL
        checkpoint that truncates the WAL file."""
        with self.datastore.get_connection(commit=True) as conn:
            cursor = conn.cursor()
            cursor.execute("PRAGMA secure_delete=ON")
            cursor.execute("VACUUM")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- lifecycle and errors -----------------------------------------------------------------

    def close(self) -> None:
        self.datastore.close()
        self._remove_reader_files()

    def refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
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
        if hint is None:
            return kind, ""
        return (StoreBusyError if primary in (_BUSY, _LOCKED) else StoreUnavailableError), hint


STATEMENT_CACHE = 64
"""Compiled statements each connection keeps (sqlite3's default is 128)."""


class CachingPool(SQLiteConnectionPool):
    """eventsourcing's connection pool, whose connections keep their compiled statements.

    eventsourcing opens its connections with ``cached_statements=True``, which ``sqlite3`` takes
    as a cache of one statement: each of an append's statements was compiled again on every
    append (about 30 to 50 us of an append's CPU). The connection is otherwise made as
    eventsourcing makes it (``SQLiteConnectionPool._create_connection``, eventsourcing 9.5):
    autocommit, WAL, ``sqlite3.Row`` rows.
    """

    def _create_connection(self) -> SQLiteConnection:
        try:
            connection = sqlite3.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,  # autocommit: transactions are begun explicitly
                cached_statements=STATEMENT_CACHE,
                timeout=self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
        except (sqlite3.Error, TypeError) as error:
            raise InterfaceError(error) from error
        if not self.is_sqlite_memory_mode and not self.is_journal_mode_wal:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode;")
            if cursor.fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL;")
                self.journal_mode_was_changed_to_wal = True
            self.is_journal_mode_wal = True
        connection.row_factory = sqlite3.Row
        return SQLiteConnection(sqlite_conn=connection, max_age=self.max_age)


class SQLiteStore(EventStore):
    """Events in one SQLite file, shared safely by several processes on one machine.

    With ``create=True`` a missing file is created with its tables, and a file without them gets
    them; while it does, ``<file>.lock`` beside it serializes the processes that do the same (the
    lock file is removed once the tables exist). With ``create=False`` the file
    is first inspected read-only: a missing file, or one without steplog's tables, raises
    ``StoreNotFoundError`` and is left exactly as it was.
    """

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
        backend = SQLiteBackend(
            path, create=create, read_only=read_only, lock_timeout=lock_timeout, adopt=adopt
        )
        self.read_only: bool = backend.read_only
        """Whether the store was opened read-only: asked with ``read_only=True`` or ``?mode=ro``,
        or opened with ``create=False`` while the file (or, for its WAL files, its directory) is
        not writable by this user. Reading works; writing raises ``StoreUnavailableError``."""
        self._sqlite = backend
        super().__init__(backend, url=f"sqlite:///{path}")

    @property
    def datastore(self) -> SQLiteDatastore:
        """eventsourcing's datastore behind this store: its connections and transactions, for
        programs (such as materialized views) that keep their own tables in the same database."""
        return self._sqlite.datastore

    def write_transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A write transaction on the store's file, for programs that keep their own tables in
        it (materialized views): it takes the write lock first (``BEGIN IMMEDIATE``), waiting for
        it under the store's ``lock_timeout`` rather than failing at once as a transaction that
        read first would. A context manager yielding a ``sqlite3`` cursor; it commits when the
        block ends and rolls back if it raises. Driver errors are raised as they come
        (``classify_error`` says what they are); a closed store raises
        ``StoreUnavailableError``."""
        if self._closed:
            raise StoreUnavailableError(
                f"cannot open a write transaction: the store {self.url} is closed"
            )
        return self._sqlite.write_transaction()


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
_REWRITE_SQL = (
    f"UPDATE {EVENTS_TABLE} SET topic = ?, state = ? "
    "WHERE originator_id = ? AND originator_version = ? AND state = ? RETURNING 1"
)


def _version(instance_id: str, value: Any) -> int:
    """A stream's version as stored: a row whose position is not an integer (written around the
    store) is a ``DecodeError``, like any malformed row."""
    if type(value) is not int:
        raise DecodeError(
            f"stream {instance_id!r} has a row whose position {value!r:.40} is not an integer"
        )
    return value
