"""What the SQL view backends share: view tables in the event store's own database.

SQLite (``_views._sqlite``) and PostgreSQL (``_views._postgres``) both keep the layout of
``_views._backends`` (one table of JSON documents per view, and the positions table); their
statements differ only in quoting and placeholders, so all of the reading and writing is here,
in ``_SQLBackend`` and its page transaction ``_SQLTx``; each adapter adds its quoting, its
transaction, its lock and its driver's errors. ``backend_for(store)`` (``_views._backend_for``)
picks the backend that lives in a store's own database.

Beside writers. Views share the database with the workflows that append, so every transaction
that writes view rows is a write transaction from its first statement: on SQLite it starts with
``BEGIN IMMEDIATE``, which waits for the write lock under the store's busy timeout
(``lock_timeout``). A deferred transaction that read first could not: SQLite refuses to upgrade
a reader to a writer while another connection writes, with "database is locked" at once and no
wait. On PostgreSQL, a swap locks the positions rows before the tables, in the same order as a
catch-up, so the two never deadlock.

A page is one batch (``_SQLTx``): the rows it reads come in one statement (``prefetch``, a
join of a ``VALUES`` list on the primary key, each row an index lookup), and the rows it writes
are kept until the commit and written then, 300 per ``INSERT ... ON CONFLICT DO UPDATE``, in the
transaction that moves the position; a failure anywhere rolls all of it back.

Driver errors are classified by the store's own rule (``EventStore.classify_error``): what it
calls busy (``StoreBusyError``: contention that outlasted the waits, a lost connection) becomes
``StoreUnavailableError`` (``Projector.follow`` waits and retries on it); a damaged database
becomes ``StoreDamagedError``, which nothing retries; any other driver error (a file that is not
writable, a store opened read-only, a full disk) becomes ``ProjectionError``, which stops a
follower: waiting would not help.

Locks (``lock``): on SQLite a hidden lock file beside the database (``.<file>.<name>.lock``,
locked with ``flock``; the OS releases it when the process dies), which exists only while it is
held: the holder removes it when it is done (``_file_lock``); on PostgreSQL a session advisory lock
held on a connection of the store's pool (the server releases it when the session ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from kernel import (
    Keyring,
    LogIntegrityError,
    ProjectionError,
    StepLogError,
    StoreBusyError,
    StoreDamagedError,
    StoreError,
    StoreUnavailableError,
)
from projections._views._backends import (
    POSITIONS_TABLE,
    Json,
    RowKey,
    ViewBackend,
    ViewTx,
    check_table,
    decode_doc,
    encode_doc,
)
from projections._views._docseal import open_doc, seal_doc
from projections._views._manifest import VIEW_MISMATCH

__all__ = ["POSITIONS_FORMAT", "POSITIONS_FORMAT_ROW"]

_MANY = 500
"""Keys per statement of ``get_many`` (SQLite allows 999 parameters before 3.32)."""
_MANY_ROWS = 300
"""Rows per statement of a page's reads (2 parameters a row) and writes (3 a row)."""


POSITIONS_FORMAT_ROW = "#positions"
"""The positions table's marker row: its position says what the others count (``_migrate``)."""
POSITIONS_FORMAT = 2
"""2: global positions of batch rows, ``(row id << ROW_SHIFT) + offset``."""
ROW_SHIFT = 20
"""The kernel's global position of a row's first event is ``row id << 20`` (the kernel's own,
private ``ROW_SHIFT``; ``test_positions_migration`` checks that the two agree). A position of
format 1 (a one-event row's id) is carried over to format 2 by this shift, so it is fixed like a
table format."""

_DAMAGED_HINT = (
    "the database is damaged (its file is not a database, or its pages or data are malformed); "
    "waiting will not help: restore it from a backup"
)
_CONTENTION_HINT = (
    "another process held a lock on the database for longer than this process waits; "
    "retry (a follower retries by itself), or raise the store's lock_timeout"
)

# -- SQL (shared by SQLite and PostgreSQL) ----------------------------------------------------


class _SQLTx(ViewTx):
    """A page's transaction: rows read through it are cached, and the rows it writes are kept
    (as ``encode_doc`` bytes) and written by ``flush`` in a few multi-row statements just before
    the commit, so a page costs a handful of round trips, not one per row. Reads see the page's
    own writes (they come from what is kept); a transaction that fails writes none of them."""

    def __init__(self, backend: _SQLBackend, cursor: Any) -> None:
        self._b = backend
        self._cursor = cursor
        self._writes: dict[str, dict[RowKey, bytes]] = {}
        self._read: dict[str, dict[RowKey, str | bytes | None]] = {}

    def _one(self, statement: str, params: tuple[Any, ...]) -> Any:
        self._cursor.execute(statement, params)
        return self._cursor.fetchone()

    def claim(self, table: str, expected: int) -> bool:
        b = self._b
        self._cursor.execute(b.sql_claim_insert.format(p=b.positions), (table,))
        row = self._one(b.sql_claim_select.format(p=b.positions), (table,))
        # No row: a concurrent swap replaced it while this claim waited for its lock.
        return row is not None and int(b.column(row, "position")) == expected

    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        row = (instance_id, key)
        written = self._writes.get(table, {}).get(row)
        if written is not None:
            return decode_doc(written)
        read = self._read.setdefault(table, {})
        if row not in read:
            self.prefetch(table, [row])
        plain = read.get(row)
        return None if plain is None else decode_doc(plain)

    def prefetch(self, table: str, rows: Iterable[RowKey]) -> None:
        written = self._writes.get(table, {})
        self._fetch(table, [row for row in rows if row not in written])

    def written(self, table: str) -> dict[RowKey, bytes]:
        return dict(self._writes.get(table, {}))

    def stored(self, table: str, rows: Iterable[RowKey]) -> dict[RowKey, bytes | None]:
        rows = list(rows)
        self._fetch(table, rows)
        read = self._read[table]
        found: dict[RowKey, bytes | None] = {}
        for row in rows:
            text = read[row]
            found[row] = None if text is None else _plain(text)
        return found

    def _fetch(self, table: str, rows: Iterable[RowKey]) -> None:
        """Read the committed documents of ``rows`` not read yet (a few statements)."""
        b = self._b
        read = self._read.setdefault(table, {})
        wanted = sorted({row for row in rows if row not in read})
        for start in range(0, len(wanted), _MANY_ROWS):
            some = wanted[start : start + _MANY_ROWS]
            self._cursor.execute(
                b.sql_read_rows(table, len(some)), tuple(part for row in some for part in row)
            )
            for row in some:
                read[row] = None
            for found in self._cursor.fetchall():
                instance_id, key = b.column(found, "instance_id"), b.column(found, "key")
                # Decoded here, so that a document that is not JSON is refused by name.
                doc = b.decode(b.column(found, "doc"), table, instance_id, key)
                read[(instance_id, key)] = encode_doc(doc)

    def put(self, table: str, instance_id: str, key: str, doc: Json) -> None:
        self._writes.setdefault(table, {})[(instance_id, key)] = encode_doc(doc)

    def set_position(self, table: str, position: int) -> None:
        b = self._b
        self._cursor.execute(
            f"UPDATE {b.positions} SET position={b.mark} WHERE name={b.mark}", (position, table)
        )

    def flush(self) -> None:
        """Write every row put, a few hundred per statement (within the transaction)."""
        b, m = self._b, self._b.mark
        for table, writes in self._writes.items():
            rows = sorted(writes.items())  # one order for every writer: no lock-order deadlock
            for start in range(0, len(rows), _MANY_ROWS):
                some = rows[start : start + _MANY_ROWS]
                values = ", ".join([f"({m}, {m}, {m})"] * len(some))
                self._cursor.execute(
                    f"INSERT INTO {b.name(table)} (instance_id, key, doc) VALUES {values} "
                    "ON CONFLICT (instance_id, key) DO UPDATE SET doc=excluded.doc",
                    tuple(
                        part
                        for (instance_id, key), plain in some
                        for part in (instance_id, key, b.seal(plain, table, instance_id, key))
                    ),
                )
        self._writes = {}


def _plain(text: str | bytes) -> bytes:
    """A document's JSON as ``encode_doc`` writes it (a stored text re-encoded)."""
    return encode_doc(decode_doc(text))


class _SQLBackend(ViewBackend):
    """What SQLite and PostgreSQL share: the statements differ only in quoting and placeholders."""

    mark = "?"
    sql_claim_insert = ""
    sql_claim_select = ""
    sql_exists = ""

    def __init__(
        self,
        datastore: Any,
        url: str,
        *,
        keyring: Keyring | None = None,
        classify: Callable[[BaseException], type[StoreError] | None],
    ) -> None:
        self._datastore = datastore
        self._classify = classify
        """The store's rule for driver errors (``EventStore.classify_error``)."""
        self.keyring = keyring
        """The store's keys: documents are sealed with them (None: plain JSON text)."""
        self._url = url
        self._ready: set[str] = set()
        self._seen: set[str] = set()  # tables ``exists`` found: read as they are, never ensured
        self._migrated = False  # the positions table has its marker row (``_migrate_positions``)

    def name(self, table: str) -> str:
        return check_table(table)

    @property
    def positions(self) -> str:
        return self.name(POSITIONS_TABLE)

    def sql_read_rows(self, table: str, count: int) -> str:
        """The statement reading ``count`` rows of ``table`` by ``(instance_id, key)`` (their
        ``2 * count`` parameters in order), each an index lookup. A join, not ``(instance_id,
        key) IN (VALUES ...)``, which SQLite answers by scanning the whole table."""
        pairs = ", ".join([f"({self.mark}, {self.mark})"] * count)
        return (
            f"SELECT v.instance_id, v.key, v.doc FROM (VALUES {pairs}) AS w JOIN "
            f"{self.name(table)} AS v ON v.instance_id = w.column1 AND v.key = w.column2"
        )

    @staticmethod
    def column(row: Any, name: str) -> Any:
        return row[name]

    def encode(self, doc: Json, table: str, instance_id: str, key: str) -> str:
        """A document as the ``doc`` column stores it (``encode_doc``, as text), sealed with
        the store's keyring when it has one (``projections._views._docseal``)."""
        return self.seal(encode_doc(doc), table, instance_id, key)

    def seal(self, plain: bytes, table: str, instance_id: str, key: str) -> str:
        """An encoded document (``encode_doc``) as the ``doc`` column stores it."""
        if self.keyring is None:
            return plain.decode()
        return seal_doc(self.keyring, plain, table, instance_id, key)

    def open(self, stored: str, table: str, instance_id: str, key: str) -> str | bytes:
        """A ``doc`` column's value as encoded JSON (for ``decode_doc``), opened if sealed."""
        return open_doc(self.keyring, stored, table, instance_id, key)

    def decode(self, stored: str, table: str, instance_id: str, key: str) -> Json:
        """A ``doc`` column's value as a document (``decode_doc``), opened if it is sealed. One
        that is not JSON was written by no steplog: ``LogIntegrityError`` (kind ``view
        mismatch``), naming the table, instance and row."""
        opened = self.open(stored, table, instance_id, key)
        try:
            return decode_doc(opened)
        except orjson.JSONDecodeError:
            raise LogIntegrityError(
                f"view document {table} {instance_id!r}/{key!r} is not JSON: it was altered or "
                "damaged since a view wrote it; its answer is refused. Rebuild the view from "
                "the log ('steplog rebuild') and run 'steplog verify' to see what differed",
                instance_id=instance_id,
                kind=VIEW_MISMATCH,
            ) from None

    def _readable_doc(self, stored: str, table: str, instance_id: str, key: str) -> Json:
        """``decode``, or for a document that cannot be read as a view wrote it (altered,
        damaged, not JSON) a stand-in that says why, which equals no rebuilt row: for
        ``verify``, which lists such rows as differing."""
        try:
            return self.decode(stored, table, instance_id, key)
        except LogIntegrityError as error:
            return {"unreadable": " ".join(str(error).split(";")[0].split())}

    @contextmanager
    def _cursor(self, action: str, *, commit: bool = True) -> Iterator[Any]:
        with self._errors(action), self._transaction(commit=commit) as cursor:
            yield cursor

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Driver errors raised in the block, translated (module docstring)."""
        try:
            yield
        except StepLogError:
            raise
        except Exception as error:
            kind = self._classify(error)
            if kind is None:
                raise
            text = " ".join(str(error).split())
            if issubclass(kind, StoreDamagedError):
                raise StoreDamagedError(
                    f"cannot {action} in {self._url}: {text}; {_DAMAGED_HINT}"
                ) from error
            if issubclass(kind, StoreBusyError):
                raise StoreUnavailableError(
                    f"cannot {action} in {self._url}: {text}; {_CONTENTION_HINT}"
                ) from error
            raise ProjectionError(f"cannot {action} in {self._url}: {text}") from error

    def _transaction(self, *, commit: bool) -> Any:
        """A transaction of the datastore (a context manager yielding a cursor)."""
        return self._datastore.transaction(commit=commit)

    def ensure(self, table: str) -> None:
        if table in self._ready:
            return
        name = self.name(table)
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self.positions} (name TEXT PRIMARY KEY, "
            "position BIGINT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {name} (instance_id TEXT NOT NULL, key TEXT NOT NULL, "
            f"doc TEXT NOT NULL, CONSTRAINT {table}_pk PRIMARY KEY (instance_id, key))",
        ]
        for attempt in range(3):
            try:
                # One statement per transaction: a CREATE after a read in the same transaction
                # could not wait for SQLite's write lock (it fails at once while another process
                # writes); as the first statement, it waits like any write.
                for statement in statements:
                    with self._cursor(f"create view table {table}") as cursor:
                        cursor.execute(statement)
                break
            except ProjectionError:
                if attempt == 2:  # concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL
                    raise
                time.sleep(0.05 * (attempt + 1))
        self._ready.add(table)

    def _migrate_positions(self) -> None:
        """Carry positions tracked before the store's batch rows over to global positions.

        Before, a global position was the row id of a row holding one event; since, it is
        ``(row id << ROW_SHIFT) + offset``, and that same event is at ``row id << ROW_SHIFT``. A
        positions table without the marker row holds only positions of that kind: they are
        shifted once, and the marker written, in the one transaction that finds the marker
        missing (two projectors racing: the second finds it and changes nothing). So a view
        goes on exactly where it stopped, with no rebuild. Only writers migrate (``transaction``);
        a reader shifts what it reads instead (``_stored``): reading never writes.

        The marker is looked for first in a read: a write in the same transaction as the reads
        before it could not wait for SQLite's lock (it would fail at once while another process
        writes); the transaction that writes starts with its write."""
        if self._has_marker():
            return
        m = self.mark
        with self._cursor("carry positions over to global positions") as cursor:
            cursor.execute(
                f"INSERT INTO {self.positions} (name, position) VALUES ({m}, {m}) "
                "ON CONFLICT (name) DO NOTHING RETURNING name",
                (POSITIONS_FORMAT_ROW, POSITIONS_FORMAT),
            )
            if cursor.fetchone() is not None:
                cursor.execute(
                    f"UPDATE {self.positions} SET position = position * {1 << ROW_SHIFT} "
                    f"WHERE name <> {m}",
                    (POSITIONS_FORMAT_ROW,),
                )
        self._migrated = True

    def _has_marker(self) -> bool:
        """Whether the positions table has its marker row (remembered once it has)."""
        if not self._migrated:
            with self._cursor("read the positions' format", commit=False) as cursor:
                cursor.execute(
                    f"SELECT position FROM {self.positions} WHERE name={self.mark}",
                    (POSITIONS_FORMAT_ROW,),
                )
                self._migrated = cursor.fetchone() is not None
        return self._migrated

    def _stored(self, row: Any) -> int:
        """A tracked position as read: 0 for none; shifted if the table is not migrated yet."""
        if row is None:
            return 0
        position = int(self.column(row, "position"))
        return position if self._has_marker() else position << ROW_SHIFT

    def exists(self, table: str) -> bool:
        """Whether ``table`` exists, found without creating (or migrating) anything, so that a
        reader can tell a view that was never built from an empty one. A table found is then
        read as it is by ``get`` and ``get_many``."""
        if table in self._ready or table in self._seen:
            return True
        with self._cursor(f"look for {table}", commit=False) as cursor:
            cursor.execute(self.sql_exists, self._exists_params(check_table(table)))
            found = cursor.fetchone() is not None
        if found:
            self._seen.add(table)
        return found

    def _exists_params(self, table: str) -> tuple[str, ...]:
        return (table,)

    def _readable(self, table: str) -> None:
        """Make ``table`` readable: create it, unless ``exists`` found it (reading never writes)."""
        if table not in self._seen:
            self.ensure(table)

    def drop(self, table: str) -> None:
        self.ensure(POSITIONS_TABLE)
        with self._cursor(f"drop view table {table}") as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {self.name(table)}")
            cursor.execute(f"DELETE FROM {self.positions} WHERE name={self.mark}", (table,))
        self._ready.discard(table)
        self._seen.discard(table)

    def position(self, table: str) -> int:
        self.ensure(POSITIONS_TABLE)
        with self._cursor(f"read the position of {table}", commit=False) as cursor:
            cursor.execute(
                f"SELECT position FROM {self.positions} WHERE name={self.mark}", (table,)
            )
            row = cursor.fetchone()
        return self._stored(row)

    @contextmanager
    def transaction(self) -> Iterator[ViewTx]:
        self.ensure(POSITIONS_TABLE)
        self._migrate_positions()
        with self._cursor("update views") as cursor:
            tx = _SQLTx(self, cursor)
            yield tx
            tx.flush()  # the rows go with the position, in this transaction, or not at all

    def swap(self, shadow: str, table: str) -> None:
        self.ensure(table)
        self.ensure(shadow)
        with self._cursor(f"swap {shadow} in as {table}") as cursor:
            self._lock_positions(cursor, (shadow, table))
            cursor.execute(f"DROP TABLE {self.name(table)}")
            cursor.execute(f"ALTER TABLE {self.name(shadow)} RENAME TO {table}")
            self._rename_constraint(cursor, table, shadow)
            cursor.execute(f"DELETE FROM {self.positions} WHERE name={self.mark}", (table,))
            cursor.execute(
                f"UPDATE {self.positions} SET name={self.mark} WHERE name={self.mark}",
                (table, shadow),
            )
        self._ready.discard(shadow)

    def _rename_constraint(self, cursor: Any, table: str, shadow: str) -> None:
        """SQLite names constraints per table; PostgreSQL needs the index renamed too."""

    def _lock_positions(self, cursor: Any, tables: Sequence[str]) -> None:
        """Lock the positions rows of ``tables`` before their tables, as a catch-up's claim does
        (SQLite: the transaction already holds the write lock)."""

    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        self._readable(table)
        with self._cursor(f"read {table}", commit=False) as cursor:
            cursor.execute(
                f"SELECT doc FROM {self.name(table)} WHERE instance_id={self.mark} "
                f"AND key={self.mark}",
                (instance_id, key),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        return self.decode(self.column(row, "doc"), table, instance_id, key)

    def get_many(self, table: str, instance_id: str, keys: Sequence[str]) -> dict[str, Json]:
        self._readable(table)
        m = self.mark
        found: dict[str, Json] = {}
        with self._cursor(f"read {table}", commit=False) as cursor:
            for start in range(0, len(keys), _MANY):
                some = list(keys[start : start + _MANY])
                cursor.execute(
                    f"SELECT key, doc FROM {self.name(table)} WHERE instance_id={m} "
                    f"AND key IN ({', '.join([m] * len(some))})",
                    (instance_id, *some),
                )
                for row in cursor.fetchall():
                    key = self.column(row, "key")
                    found[key] = self.decode(self.column(row, "doc"), table, instance_id, key)
        return found

    def floor(self, table: str, instance_id: str, low: str, high: str) -> tuple[str, Json] | None:
        self.ensure(table)
        m = self.mark
        with self._cursor(f"read {table}", commit=False) as cursor:
            cursor.execute(
                f"SELECT key, doc FROM {self.name(table)} WHERE instance_id={m} AND key>={m} "
                f"AND key<={m} ORDER BY key DESC LIMIT 1",
                (instance_id, low, high),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        key = self.column(row, "key")
        return key, self.decode(self.column(row, "doc"), table, instance_id, key)

    def documents(self, table: str, instance_id: str) -> dict[str, Json]:
        self.ensure(table)
        with self._cursor(f"read {table}", commit=False) as cursor:
            cursor.execute(
                f"SELECT key, doc FROM {self.name(table)} WHERE instance_id={self.mark}",
                (instance_id,),
            )
            found = cursor.fetchall()
        column = self.column
        return {
            column(r, "key"): self.decode(column(r, "doc"), table, instance_id, column(r, "key"))
            for r in found
        }

    def count(self, table: str, instance_id: str) -> int:
        self._readable(table)
        with self._cursor(f"count the rows of {table}", commit=False) as cursor:
            cursor.execute(
                f"SELECT count(*) AS n FROM {self.name(table)} WHERE instance_id={self.mark}",
                (instance_id,),
            )
            return int(self.column(cursor.fetchone(), "n"))

    def rows(self, table: str) -> tuple[int, dict[RowKey, Json]]:
        if not self.exists(table):
            return 0, {}  # a view never built: nothing to read, and reading creates nothing
        with self._cursor(f"read {table}", commit=False) as cursor:
            self._consistent_reads(cursor)
            cursor.execute(
                f"SELECT position FROM {self.positions} WHERE name={self.mark}", (table,)
            )
            row = cursor.fetchone()
            cursor.execute(f"SELECT instance_id, key, doc FROM {self.name(table)}")
            found = cursor.fetchall()
        position = self._stored(row)
        return position, {
            (self.column(r, "instance_id"), self.column(r, "key")): self._readable_doc(
                self.column(r, "doc"), table, self.column(r, "instance_id"), self.column(r, "key")
            )
            for r in found
        }

    def _consistent_reads(self, cursor: Any) -> None:
        """Make the reads of this transaction see one snapshot (SQLite always does)."""
