"""Where materialized views keep their rows: the port (``ViewBackend``, ``ViewTx``) and memory.

Every view is one table of JSON documents keyed by ``(instance_id, key)`` (a view may keep one
document per instance, or many: one per run, per superstep, per write); the position of every
table (the last global position it has folded in) is a row of ``steplog_view_positions``. A
``ViewTx`` changes rows and the position in one database transaction, so a view and its position
never disagree. ``swap`` replaces a table by another one (a rebuilt shadow) atomically.
``lock(name, timeout)`` takes a named lock shared by every process using the same database, held
while a rebuild uses its shadow table, so that two of them never share one (a verify refolds in
memory and takes none).

Documents are turned into stored text and back by ``encode_doc`` and ``decode_doc`` only, in every
backend.

The SQLite and PostgreSQL backends are in ``projections._views._sqlite`` and ``_postgres`` (what
they share in ``_sqlbackends``), and ``backend_for(store)`` (the backend that lives in the store's
own database) in ``_backend_for``.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import orjson

from kernel import ProjectionError

__all__ = [
    "POSITIONS_TABLE",
    "Json",
    "MemoryViewBackend",
    "RowKey",
    "ViewBackend",
    "ViewTx",
    "decode_doc",
    "encode_doc",
]

POSITIONS_TABLE = "steplog_view_positions"
_TABLE = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")
Json = Any
RowKey = tuple[str, str]


def encode_doc(doc: Json) -> bytes:
    """A view document as stored (compact JSON, UTF-8). The one place documents are encoded."""
    return orjson.dumps(doc)


def decode_doc(stored: bytes | str) -> Json:
    """A stored view document back as JSON data. The one place documents are decoded."""
    return orjson.loads(stored)


def check_table(table: str) -> str:
    """``table`` if it is a plain lower-case identifier; else ``ProjectionError``."""
    if not _TABLE.match(table):
        raise ProjectionError(f"view table name {table!r} is not a plain lower-case identifier")
    return table


class ViewTx(ABC):
    """One transaction on view tables: reads see this transaction's own writes."""

    @abstractmethod
    def claim(self, table: str, expected: int) -> bool:
        """Lock ``table``'s position; True if it is still ``expected`` (else change nothing)."""

    @abstractmethod
    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        """A document, or None."""

    def prefetch(self, table: str, rows: Iterable[RowKey]) -> None:
        """Read the documents under ``rows`` ahead, in as few statements as the backend can, so
        that the ``get`` of each costs no round trip (a hint: the SQL backends do it; a row left
        out is read when asked for, and one never asked for costs only its fetch)."""
        del table, rows

    @abstractmethod
    def put(self, table: str, instance_id: str, key: str, doc: Json) -> None:
        """Insert or replace a document (a backend may keep it until the commit: the same
        transaction's ``get`` sees it either way)."""

    @abstractmethod
    def set_position(self, table: str, position: int) -> None:
        """Record that ``table`` has folded in every event up to global ``position``."""

    @abstractmethod
    def written(self, table: str) -> dict[RowKey, bytes]:
        """The rows of ``table`` put in this transaction so far, as ``encode_doc`` bytes."""

    @abstractmethod
    def stored(self, table: str, rows: Iterable[RowKey]) -> dict[RowKey, bytes | None]:
        """The committed documents under ``rows`` as they were before this transaction's
        writes (``encode_doc`` bytes; None for a row that was not there), read in as few
        statements as the backend can."""


class ViewBackend(ABC):
    """The tables of materialized views in one database (see the module docstring)."""

    @abstractmethod
    def ensure(self, table: str) -> None:
        """Create ``table`` (and the positions table) if missing."""

    @abstractmethod
    def drop(self, table: str) -> None:
        """Drop ``table`` and forget its position."""

    @abstractmethod
    def position(self, table: str) -> int:
        """The last global position folded into ``table`` (0 if none)."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[ViewTx]:
        """A transaction that commits on normal exit and rolls back on an exception."""

    @abstractmethod
    def swap(self, shadow: str, table: str) -> None:
        """Replace ``table`` by ``shadow`` (rows and position) in one transaction."""

    @abstractmethod
    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        """A committed document, or None."""

    def get_many(self, table: str, instance_id: str, keys: Sequence[str]) -> dict[str, Json]:
        """The committed documents of ``instance_id`` under ``keys``, by key (missing ones left
        out). The SQL backends read them in one statement, so a reader of many rows (the key
        index) pays one round trip, not one per row."""
        found = {key: self.get(table, instance_id, key) for key in keys}
        return {key: doc for key, doc in found.items() if doc is not None}

    @abstractmethod
    def floor(self, table: str, instance_id: str, low: str, high: str) -> tuple[str, Json] | None:
        """The document with the greatest key in ``[low, high]`` (an indexed lookup), or None."""

    @abstractmethod
    def documents(self, table: str, instance_id: str) -> dict[str, Json]:
        """Every committed document of ``instance_id`` in ``table`` by key, read in one
        statement (an indexed range of the primary key)."""

    def count(self, table: str, instance_id: str) -> int:
        """How many rows ``instance_id`` has in ``table`` (counted, not read: the SQL backends
        count an index range)."""
        return len(self.documents(table, instance_id))

    @abstractmethod
    def rows(self, table: str) -> tuple[int, dict[RowKey, Json]]:
        """``table``'s position and every row, read consistently (for ``verify``)."""

    def exists(self, table: str) -> bool:
        """Whether ``table`` has been created."""
        return True

    @abstractmethod
    def lock(self, name: str, timeout: float) -> AbstractContextManager[bool]:
        """Hold the lock ``name`` (shared by every process on this database) for the ``with``
        block, waiting up to ``timeout`` seconds for it; the block gets True if it holds the
        lock, False if the wait ran out (it then holds nothing). Released when the block ends,
        and by the database or the OS if the process dies."""


# -- memory -----------------------------------------------------------------------------------


class _MemoryTx(ViewTx):
    def __init__(self, backend: MemoryViewBackend) -> None:
        self._backend = backend
        self.writes: dict[str, dict[RowKey, Json]] = {}
        self.positions: dict[str, int] = {}

    def claim(self, table: str, expected: int) -> bool:
        return self._backend.positions.get(table, 0) == expected

    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        row = (instance_id, key)
        staged = self.writes.get(table, {})
        if row in staged:
            return decode_doc(staged[row])
        stored = self._backend.tables.get(table, {}).get(row)
        return None if stored is None else decode_doc(stored)

    def put(self, table: str, instance_id: str, key: str, doc: Json) -> None:
        self.writes.setdefault(table, {})[(instance_id, key)] = encode_doc(doc)

    def set_position(self, table: str, position: int) -> None:
        self.positions[table] = position

    def written(self, table: str) -> dict[RowKey, bytes]:
        return dict(self.writes.get(table, {}))

    def stored(self, table: str, rows: Iterable[RowKey]) -> dict[RowKey, bytes | None]:
        committed = self._backend.tables.get(table, {})
        return {row: committed.get(row) for row in rows}


class MemoryViewBackend(ViewBackend):
    """View tables as dictionaries (documents kept as JSON bytes, as a database would)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[RowKey, bytes]] = {}
        self.positions: dict[str, int] = {}
        self._lock = threading.RLock()
        self._named: dict[str, threading.Lock] = {}

    def ensure(self, table: str) -> None:
        with self._lock:
            self.tables.setdefault(check_table(table), {})

    def exists(self, table: str) -> bool:
        return table in self.tables

    @contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        with self._lock:
            named = self._named.setdefault(name, threading.Lock())
        acquired = named.acquire(timeout=max(timeout, 0))
        try:
            yield acquired
        finally:
            if acquired:
                named.release()

    def drop(self, table: str) -> None:
        with self._lock:
            self.tables.pop(table, None)
            self.positions.pop(table, None)

    def position(self, table: str) -> int:
        return self.positions.get(table, 0)

    @contextmanager
    def transaction(self) -> Iterator[ViewTx]:
        with self._lock:
            tx = _MemoryTx(self)
            yield tx
            for table, writes in tx.writes.items():
                self.tables.setdefault(table, {}).update(writes)
            self.positions.update(tx.positions)

    def swap(self, shadow: str, table: str) -> None:
        with self._lock:
            self.tables[table] = self.tables.pop(shadow, {})
            self.positions[table] = self.positions.pop(shadow, 0)

    def get(self, table: str, instance_id: str, key: str) -> Json | None:
        stored = self.tables.get(table, {}).get((instance_id, key))
        return None if stored is None else decode_doc(stored)

    def floor(self, table: str, instance_id: str, low: str, high: str) -> tuple[str, Json] | None:
        with self._lock:
            keys = [
                k for (i, k) in self.tables.get(table, {}) if i == instance_id and low <= k <= high
            ]
            if not keys:
                return None
            key = max(keys)
            return key, decode_doc(self.tables[table][(instance_id, key)])

    def documents(self, table: str, instance_id: str) -> dict[str, Json]:
        with self._lock:
            stored = self.tables.get(table, {})
            return {k: decode_doc(doc) for (i, k), doc in stored.items() if i == instance_id}

    def rows(self, table: str) -> tuple[int, dict[RowKey, Json]]:
        with self._lock:
            found = {row: decode_doc(doc) for row, doc in self.tables.get(table, {}).items()}
            return self.positions.get(table, 0), found
