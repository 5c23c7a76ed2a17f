"""The store's port: ``RowBackend``, what an adapter implements, and the error edge.

``EventStore`` (``_eventstore``) does everything that is the same on every database: it checks and
encodes batches, decodes and checks rows, keeps the hash chain and the integrity mark, pages the
global log. It reaches its database only through a ``RowBackend``: a few methods on rows, grouped
below, that an adapter (``_memory``, ``_sqlite``, ``_postgres``) implements. A fourth backend is a
subclass of ``RowBackend`` plus the contract suite (``tests/store/backend_contract.py``).

The rows are opaque to a backend: it stores ``(instance id, last position, topic, state)`` as it is
given them, never decodes a state, and returns them as it stored them. What a row means is the
mapper's (``kernel._codec._mapper``).

Errors. A backend method raises its driver's errors as they come (or eventsourcing's); the store
translates them at this edge, by class, through the backend's one table ``errors`` (the first row
whose class the error is an instance of gives the ``StoreError`` class), which ``refine`` may
sharpen from the driver's error code (never from the message text). ``translate_error`` is that
rule; ``EventStore.classify_error`` exposes it to programs that share the store's database.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

from eventsourcing.persistence import (
    ApplicationRecorder,
    ConnectionUnavailableError,
    InterfaceError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)

from kernel._base._errors import (
    ConcurrencyConflictError,
    StepLogError,
    StoreBusyError,
    StoreError,
    StoreUnavailableError,
)
from kernel._base._urls import hide
from kernel._codec._cipher import is_sealed

__all__ = [
    "PERSISTENCE_ERRORS",
    "ErrorTable",
    "Insert",
    "LogRow",
    "RowBackend",
    "RowChange",
    "StreamRow",
    "driver_error",
    "error_class",
]

StreamRow = tuple[int, str, bytes]
"""A row of one stream: ``(last position, topic, state)``."""
LogRow = tuple[int, str, int, str, bytes]
"""A row of the global log: ``(row id, instance id, last position, topic, state)``."""
Insert = tuple[str, int, StoredEvent]
"""A row to insert: ``(instance id, the stream's expected version, the row)``."""
RowChange = tuple[str, bytes, str, int, bytes]
"""A rewrite of a row in place: ``(new topic, new state, instance id, last position, the state the
row must still hold)``."""

ErrorTable = tuple[tuple[type[BaseException], type[StoreError]], ...]
"""Rows ``(foreign error class, StoreError class)``, most specific class first."""

PERSISTENCE_ERRORS: ErrorTable = (
    (ConnectionUnavailableError, StoreBusyError),  # no pooled connection came free in time
    (OperationalError, StoreUnavailableError),  # the server or file went away, a lock timed out
    (InterfaceError, StoreUnavailableError),  # no connection could be made
    (PersistenceError, StoreError),  # IntegrityError, ProgrammingError, DataError, ...
)
"""eventsourcing's PEP-249 classes (its datastores map sqlite3 and psycopg errors to them)."""

_SCAN = 128
"""Rows per query of the defaults that scan the global log."""


def error_class(error: BaseException, table: ErrorTable) -> type[StoreError] | None:
    """The ``StoreError`` class of the first row of ``table`` that ``error`` is an instance of."""
    for foreign, ours in table:
        if isinstance(error, foreign):
            return ours
    return None


def driver_error(error: BaseException, driver: type[BaseException]) -> BaseException | None:
    """``error`` or its first cause that is a ``driver`` error (eventsourcing wraps them)."""
    seen: BaseException | None = error
    for _ in range(8):  # a cause chain is short; never loop on a cycle
        if seen is None or isinstance(seen, driver):
            return seen
        seen = seen.__cause__
    return None


class RowBackend(ABC):
    """Where an ``EventStore`` keeps its rows: one adapter per database.

    Every method is one atomic operation of the database (one transaction, or one statement) and
    is thread-safe. Methods raise the driver's errors untranslated (the store translates them
    with ``translate_error``); ``insert_rows`` also returns ``ConcurrencyConflictError``s.

    Groups: rows (``insert_rows``, ``select_stream``, ``stream_version``, ``select_rows``,
    ``last_row_id``, ``instances``), chain heads (``select_heads``), meta values (``read_meta``,
    ``write_meta``), leases (``acquire_lease``, ``renew_lease``, ``release_lease``,
    ``read_lease``) and maintenance (``rewrite_rows``). The other methods have defaults built on
    those, which an adapter may replace with one query.
    """

    errors: ClassVar[ErrorTable] = PERSISTENCE_ERRORS
    """How this backend's foreign errors become ``StoreError``s: the driver's classes first."""

    shares_commits: ClassVar[bool] = False
    """Whether a commit costs an fsync, so that concurrent runs should share one
    (``EventStore.group_committer``)."""

    recorder: ApplicationRecorder
    """eventsourcing's application recorder over the same rows, for tools and tests that work on
    ``StoredEvent``s directly (it bypasses every check of the store)."""

    where: str = "the store"
    """The store, as error messages name it."""

    secrets: tuple[str, ...] = ()
    """Text hidden from every message made of a driver's text (a URL's password)."""

    # -- rows ---------------------------------------------------------------------------------

    @abstractmethod
    def insert_rows(self, rows: Sequence[Insert]) -> list[int | ConcurrencyConflictError]:
        """Insert every ``(instance_id, expected_version, row)`` in one transaction, each iff its
        stream's version (``stream_version``) is then its expected version, and record the
        row's chain head (``row.head``, if it has one) for ``select_heads`` in the same
        transaction.

        Returns, in order, each row's id (ids grow with every insert; a row's events have global
        positions from ``row id << ROW_SHIFT``), or the ``ConcurrencyConflictError`` of a row
        whose stream was not at its expected version (nothing of that row written; the others
        are). Raises the driver's error when the transaction fails (nothing written)."""

    @abstractmethod
    def select_stream(
        self,
        instance_id: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
    ) -> list[StreamRow]:
        """The stream's rows ``(last position, topic, state)`` that hold positions in
        ``(after, upto]``, in order: those whose last position is past ``after``, up to and
        including the first whose last position reaches ``upto`` (every later one, without
        ``upto``); at most ``limit`` rows. Empty for an unknown stream."""

    @abstractmethod
    def stream_version(self, instance_id: str) -> int:
        """The last position of the stream's last row; 0 for an empty or unknown stream. Raises
        ``DecodeError`` for a stored position that is not an integer."""

    @abstractmethod
    def select_rows(self, *, after: int = 0, limit: int, upto: int | None = None) -> list[LogRow]:
        """Rows ``(row id, instance id, last position, topic, state)`` of the global log with
        ``after < row id <= upto``, by row id, at most ``limit``: only rows a reader may pass
        (on PostgreSQL, those of settled transactions), so that a reader that has passed a row
        id never misses a row committed later below it."""

    @abstractmethod
    def last_row_id(self) -> int:
        """The id of the newest row a reader may pass (``select_rows``); 0 for an empty log."""

    @abstractmethod
    def instances(self) -> list[str]:
        """The ids of every instance with at least one row, sorted."""

    def newest_row_id(self) -> int:
        """The id of the newest committed row, passable or not (``last_row_id`` by default)."""
        return self.last_row_id()

    def select_windows(
        self, instance_id: str, windows: Sequence[tuple[int, int]]
    ) -> list[list[StreamRow]]:
        """``select_stream`` of each window ``(after, upto]``, in the order given."""
        return [self.select_stream(instance_id, after=a, upto=u) for a, u in windows]

    def row_id(self, instance_id: str, last_position: int) -> int | None:
        """The id of the row of ``instance_id`` whose last position is ``last_position`` (None:
        no such row)."""
        after = 0
        while rows := self.select_rows(after=after, limit=_SCAN):
            for row_id, instance, last, _, _ in rows:
                if instance == instance_id and last == last_position:
                    return row_id
            after = rows[-1][0]
        return None

    def first_sealed_row(self) -> int | None:
        """The id of the first row whose state is sealed (``_codec._cipher.is_sealed``); None:
        none is."""
        after = 0
        while rows := self.select_rows(after=after, limit=_SCAN):
            for row_id, _, _, _, state in rows:
                if is_sealed(bytes(state)):
                    return row_id
            after = rows[-1][0]
        return None

    def last_positions(self) -> dict[str, int]:
        """Each instance's version (``stream_version``), for every instance with rows."""
        found = {name: self.stream_version(name) for name in self.instances()}
        return {name: version for name, version in found.items() if version}

    # -- chain heads ----------------------------------------------------------------------------

    @abstractmethod
    def select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        """The recorded chain heads ``{instance id: (position, hash)}`` (``insert_rows`` records
        them), of every instance or only ``instance_id``'s. Empty in a store made before the
        chain (reading never creates anything)."""

    # -- meta values --------------------------------------------------------------------------

    @abstractmethod
    def read_meta(self, key: str) -> str | None:
        """The value of ``key`` in the store's meta table; None when it is not set."""

    @abstractmethod
    def write_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        """Set ``key`` to ``value``: only if it is not set yet, or, with ``replace``, always."""

    # -- leases -------------------------------------------------------------------------------
    # One row per leased instance: (holder, expires), expires in whole microseconds since the
    # Unix epoch (UTC), so that a compare-and-set on an expiry is exact. "Free" means no row.

    @abstractmethod
    def acquire_lease(
        self, instance_id: str, holder: str, *, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        """Write ``(holder, expires)`` if there is no row, or it is ``holder``'s, or it is
        exactly ``replace`` ``(holder, expires)``; whether it was written. Atomic: of two
        callers replacing the same row, one writes."""

    @abstractmethod
    def renew_lease(self, instance_id: str, holder: str, *, expires: int) -> bool:
        """Set ``expires`` on ``holder``'s row; whether there was one."""

    @abstractmethod
    def release_lease(self, instance_id: str, holder: str) -> None:
        """Delete ``holder``'s row, if there is one; change nothing otherwise."""

    @abstractmethod
    def read_lease(self, instance_id: str) -> tuple[str, int] | None:
        """``(holder, expires)`` of the row, or None; never writes, never creates a table (a
        store made before leases reads None)."""

    def leases_missing(self) -> bool:
        """Whether the store lacks its leases table (an old store opened without create)."""
        return False

    # -- maintenance --------------------------------------------------------------------------

    @abstractmethod
    def rewrite_rows(self, changes: Sequence[RowChange]) -> list[bool]:
        """Rewrite rows in place, in one transaction: each ``(topic, state, instance id, last
        position, old state)`` sets the row's topic and state iff it still holds ``old state``
        (a compare-and-set, so that two rewriters never undo each other). Which were written,
        in order. Plain text a rewrite frees should not stay readable in the files."""

    def compact(self, *, tables: Sequence[str] = ()) -> None:  # noqa: B027 - nothing to drop
        """Drop from the store's files what rewritten rows left behind (and from ``tables``,
        more tables of the same database). Nothing by default."""

    # -- followers and lifecycle ----------------------------------------------------------------

    def wait_for_appends(
        self, *, newer: Callable[[], bool], timeout: float, stop: threading.Event
    ) -> None:
        """Wait up to ``timeout`` seconds for an append (or ``stop``); return at once when
        ``newer()`` says the log already moved. This default only waits: backends that can be
        told (in-process, LISTEN/NOTIFY) wake at the append."""
        if not newer():
            stop.wait(timeout)

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections; the backend is not used afterwards."""

    # -- the error edge -----------------------------------------------------------------------

    def refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
        """The ``StoreError`` class and a hint for ``error`` (``kind`` by the table), from the
        driver's error code where it has one; ``(kind, "")`` by default."""
        return kind, ""

    def classify_error(self, error: BaseException) -> tuple[type[StoreError], str] | None:
        """The ``StoreError`` class ``error`` becomes here, with a hint (``errors``, then
        ``refine``); None when it is not a foreign error this backend knows."""
        if isinstance(error, StepLogError):
            return None
        kind = error_class(error, self.errors)
        return None if kind is None else self.refine(error, kind)

    def translate_error(self, error: BaseException, action: str) -> BaseException:
        """``error`` in the ``StoreError`` tree, its message naming ``action`` and ``where`` (with
        ``secrets`` hidden); our own errors and unknown ones come back as they are."""
        found = self.classify_error(error)
        if found is None:
            return error
        kind, hint = found
        text = hide(" ".join(str(error).split()), self.secrets) or type(error).__name__
        message = f"cannot {action} in {self.where}: {text}"
        return kind(f"{message}; {hint}" if hint else message)

    @contextmanager
    def translated(self, action: str) -> Iterator[None]:
        """Run the block, raising any foreign error as ``translate_error`` gives it."""
        try:
            yield
        except Exception as error:
            translated = self.translate_error(error, action)
            if translated is error:
                raise
            raise translated from error
