"""The SQLite file around a store: its tables, its setup turn, opening it read-only, and the files
SQLite keeps beside it. No store here: the SQLite adapter (``_sqlite``) uses these to open one."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from kernel._base._errors import StoreConfigError, StoreUnavailableError

__all__ = [
    "ALL_TABLES",
    "CHAIN_TABLE",
    "EVENTS_TABLE",
    "LEASES_TABLE",
    "META_TABLE",
    "TABLES",
    "TABLES_SQL",
    "TABLE_NAMES",
    "TABLE_SQL",
    "read_only_uri",
    "refuse_foreign",
    "remove_reader_files",
    "setup_turn",
    "steplog_tables",
    "wal_files",
    "writable",
]

EVENTS_TABLE = "steplog_events"
META_TABLE = "steplog_meta"
LEASES_TABLE = "steplog_leases"
"""One row per leased instance: holder, and expires in whole microseconds since the Unix epoch
(UTC). Added to stores made before leases by their next ``create=True`` open."""
CHAIN_TABLE = "steplog_chain"
"""Each instance's chain head ``(instance_id, position, head)``, written with each of its rows."""

READONLY, CANTOPEN = 8, 14
"""SQLite's primary result codes (https://sqlite.org/rescode.html) of a file it cannot write or
open."""

TABLE_SQL = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"

TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?, ?)"
TABLE_NAMES = (EVENTS_TABLE, META_TABLE, LEASES_TABLE, CHAIN_TABLE)
TABLES = frozenset({EVENTS_TABLE, META_TABLE})
"""The tables that make a file a steplog store (a reader needs no more)."""
ALL_TABLES = frozenset(TABLE_NAMES)
"""The tables a writer makes sure exist."""


@contextmanager
def setup_turn(lock_path: Path, *, timeout: float) -> Iterator[None]:
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


def steplog_tables(path: Path, *, strict: bool = False) -> frozenset[str]:
    """Which of steplog's tables the file at ``path`` holds, looked at read-only (nothing is
    created or changed); none for a missing file. An unreadable file also counts as none unless
    ``strict``, when the ``sqlite3.Error`` is raised."""
    if not path.exists():
        return frozenset()
    try:
        with closing(connect_read_only(path)) as db:
            return frozenset(row[0] for row in db.execute(TABLES_SQL, TABLE_NAMES))
    except sqlite3.Error:
        if strict:
            raise
        return frozenset()


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that reads ``path`` and changes nothing in it (see ``read_only_uri``)."""
    return open_read_only(path)[0]


def read_only_uri(path: Path) -> str:
    """A URI that opens ``path`` read-only, changing nothing in it.

    ``mode=ro`` when SQLite can read the file so; when it cannot because it cannot make the
    ``-shm`` file it needs to read a WAL-mode file (a directory this user cannot write, or a
    read-only mount), ``mode=ro&immutable=1``, which reads the file alone (``open_read_only``)."""
    try:
        db, uri = open_read_only(path)
    except sqlite3.Error:
        return f"{path.resolve().as_uri()}?mode=ro"  # unreadable: the open reports why
    db.close()
    return uri


def open_read_only(path: Path) -> tuple[sqlite3.Connection, str]:
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
        if (getattr(error, "sqlite_errorcode", 0) & 0xFF) not in (READONLY, CANTOPEN):
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


def wal_files(path: Path) -> tuple[Path, Path]:
    """The ``-wal`` and ``-shm`` files SQLite keeps beside a WAL-mode database at ``path``."""
    return path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")


def writable(path: Path) -> bool:
    """Whether this user can write the store at ``path``: the file, and its directory unless the
    WAL files already exist beside it (SQLite creates them there)."""
    if not os.access(path, os.W_OK):
        return False
    return os.access(path.parent, os.W_OK) or all(f.exists() for f in wal_files(path))


def remove_reader_files(path: Path) -> None:
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
    wal, shm = wal_files(path)
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


def refuse_foreign(path: Path) -> None:
    """Refuse to make a store of another application's database: a file that holds tables but
    not steplog's raises ``StoreConfigError`` naming a few, before anything is written to it (no
    table, no WAL switch, no lock file). A file SQLite cannot read is left to the open to report.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with closing(connect_read_only(path)) as db:
            names = sorted(
                str(row[0])
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            )
    except sqlite3.Error:
        return
    if set(names) >= TABLES:
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
