"""The event store port, and ``open_store``.

One stream per workflow instance. The adapters (``_store_memory``, ``_store_sqlite``,
``_store_postgres``) wrap eventsourcing's application recorders (the SQLite and PostgreSQL ones are
subclasses with faster inserts and reads, which pass eventsourcing's own recorder test cases) and
pass one contract suite (``tests/store``).

Every driver and eventsourcing error is translated at this edge into the ``StoreError`` tree, by
class, through one table per adapter (``PERSISTENCE_ERRORS`` plus the driver's classes): the first
row whose class the error is an instance of gives the ``StoreError`` class. An adapter may refine
the class and add a hint from the driver's error code (never from the message text).
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    InterfaceError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)

from kernel._base._errors import (
    ConcurrencyConflictError,
    DecodeError,
    InvalidBatchError,
    LogIntegrityError,
    MissingKeyError,
    StepLogError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
)
from kernel._base._ids import check_id
from kernel._base._urls import hide, mask_url, split_url
from kernel._codec._chain import (
    ChainHead,
    ChainProblem,
    ChainReport,
    IntegrityMark,
    form_problem,
    link_problem,
    tail_problem,
)
from kernel._codec._cipher import (
    FROM_ENV,
    KEYS_ENV,
    Keyring,
    KeyringChoice,
    is_sealed,
    keyring_from,
)
from kernel._codec._hashing import ChainedRow, RowLink, genesis
from kernel._codec._mapper import RowMapper
from kernel._codec._rows import BATCH_CODES, place, row_count
from kernel._codec._values import ValueCodec
from kernel._log._events import EVENT_TYPES, EventBase
from kernel._store._lease import Lease, from_micros, lease_expiry, to_micros

if TYPE_CHECKING:
    from kernel._store._group import GroupCommitter

__all__ = [
    "DEFAULT_STORE_ENV",
    "PERSISTENCE_ERRORS",
    "ErrorTable",
    "EventStore",
    "Prepared",
    "Recorded",
    "driver_error",
    "error_class",
    "open_store",
]

DEFAULT_STORE_ENV = "STEPLOG_STORE"
ENCRYPTION_MARK = "encryption"
"""The meta key that marks an encrypted store (its value names the cipher)."""
INTEGRITY_MARK = "integrity"
"""The meta key of the store's ``IntegrityMark``: from which row on rows must carry hashes and,
in an encrypted store, be sealed (tagged with a key of the keyring there)."""
STORE_SCHEMA_VERSION = 3
"""Version of the tables steplog writes. A database stamped with a higher one is refused.

1: one row per event. 2: one row per appended batch (``kernel._codec._mapper``). 3: batch rows carry
the hash chain, and the store keeps each chain's head. Older rows stay readable, so an older
store is read as it is and restamped by its next writer (so that an older steplog, which would
write rows without hashes after chained ones, no longer opens it)."""

ROW_SHIFT = 20
"""A row's events have global positions ``(row id << ROW_SHIFT) + offset in the row``."""
ROW_EVENTS = 1 << ROW_SHIFT
"""The most events one append (one row) may hold."""
ROWS_PER_READ = 128
"""Rows fetched per query of the global log, while a page fills."""


def global_positions(row_id: int, count: int) -> list[int]:
    """The global positions of the ``count`` events of row ``row_id``."""
    base = row_id << ROW_SHIFT
    return list(range(base, base + count))


ErrorTable = tuple[tuple[type[BaseException], type[StoreError]], ...]
"""Rows ``(foreign error class, StoreError class)``, most specific class first."""

PERSISTENCE_ERRORS: ErrorTable = (
    (OperationalError, StoreUnavailableError),  # the server or file went away, a lock timed out
    (InterfaceError, StoreUnavailableError),  # no connection could be made
    (PersistenceError, StoreError),  # IntegrityError, ProgrammingError, DataError, ...
)
"""eventsourcing's PEP-249 classes (its datastores map sqlite3 and psycopg errors to them)."""


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


class _Scan:
    """Where a scan of the global log is: the global position its last page ended at (where the
    next page begins), the newest row it entered (rows after the last event returned may have
    been passed already: a ``types`` filter keeps none of their events), and the last row it
    entered of each instance (``from_start``: it began at the log's start, so an instance's
    first row must begin its stream)."""

    __slots__ = ("end", "entered", "from_start", "links")

    def __init__(self, end: int, links: dict[str, RowLink], *, from_start: bool) -> None:
        self.end = end
        self.entered = 0
        self.links = links
        self.from_start = from_start


@dataclass(frozen=True, slots=True)
class Prepared:
    """A batch checked and encoded for ``EventStore.append_prepared``: its one row (None for an
    empty batch)."""

    instance_id: str
    expected_version: int
    count: int
    row: StoredEvent | None


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event with its position in the store's global order (ids may have gaps)."""

    global_position: int
    event: EventBase


class EventStore(ABC):
    """Appends events to instance streams atomically, and reads them back exactly.

    Instances are made by ``open_store``. All methods are synchronous and thread-safe; they raise
    only ``StoreError`` subclasses. Each adapter implements the abstract methods, and may replace
    the recorder calls of the others with faster ones.
    """

    _errors: ClassVar[ErrorTable] = PERSISTENCE_ERRORS
    """How foreign errors become ``StoreError``s: adapters put their driver's classes first."""

    url: str
    """The store's URL, its password (if any) masked as ``***`` (``_base._urls.mask_url``)."""

    _secrets: tuple[str, ...] = ()
    """The URL's password, as ``kernel._base._urls.url_secrets`` gives it: hidden from every message
    made of a driver's text (``_store_error``)."""

    shares_commits: ClassVar[bool] = False
    """Whether concurrent runs should append their commit batches through the store's
    ``group_committer()``: true where a commit costs an fsync (SQLite, PostgreSQL)."""

    _committer: GroupCommitter | None = None

    _closed = False
    """Set by ``close()``. A class default, so ``_translated`` also serves an adapter's setup
    before ``EventStore.__init__`` runs."""

    def __init__(self, recorder: ApplicationRecorder, *, url: str, mapper: RowMapper | None = None):
        self._recorder = recorder
        self._mapper = mapper or RowMapper()
        self.codec = ValueCodec()
        """The codec shared by everything that writes or reads values through this store."""
        self.url = url
        self._closed = False
        self._insert_lock = threading.Lock()
        self._heads_cache: dict[str, tuple[int, bytes]] = {}
        """Each instance's chain head as this store last wrote it: ``(position, hash)``."""
        self._memory_heads: dict[str, tuple[int, bytes]] = {}
        """The recorded heads of the memory store (the SQL adapters keep them in a table)."""
        self._encrypted = False
        self._marks = IntegrityMark()
        """What this store's rows must be (``_settle_marks``); no rule until it is opened."""
        self._mark_problem: ChainProblem | None = None
        """What is wrong with the store's integrity mark (read with ``allow_broken_chain``)."""
        self._memory_meta: dict[str, str] = {}
        self._scan: _Scan | None = None
        """The global scan the last ``read_all`` page ended (see ``read_all``)."""
        self.chain_problems: list[ChainProblem] = []
        """What reads found wrong with the chain, when opened with ``allow_broken_chain``."""
        self.stranded_leases: dict[str, str] = {}
        """Leases that a keeper of this store could not give back (a store error at release, such
        as a full disk): instance id -> holder. Such a lease belongs to a run of this process
        that has ended, so the next keeper here takes it over at once (``LeaseKeeper``) instead
        of refusing itself with ``RunInProgressError`` until the lease expires."""

    def _configure(
        self, *, keyring: Keyring | None, allow_broken_chain: bool, create: bool
    ) -> None:
        """Apply ``open_store``'s trust options: the keyring that seals and opens rows, whether
        a broken chain is read (and noted in ``chain_problems``) rather than refused, and the
        store's encryption mark (set by the first writer with a key; a writer without one is
        refused, so that no plain row follows sealed ones), and its ``IntegrityMark``
        (``_settle_marks``)."""
        self._mapper = RowMapper(  # built whole: the keys and the policy are known only now
            self._mapper.upcasters,
            keyring=keyring,
            on_broken=self._note_broken if allow_broken_chain else None,
        )
        text = self._read_meta(INTEGRITY_MARK)
        parsed = None if text is None else IntegrityMark.from_text(text)
        mark = None if parsed is None else parsed[0]
        marked = self._read_meta(ENCRYPTION_MARK) is not None
        # A mark that says sealed (tagged or not), or a sealed newest row, says encrypted too:
        # deleting the meta row ``encryption`` must not turn encryption off.
        marked = marked or (mark is not None and mark.plain is not None)
        if keyring is None and create and (marked or self._newest_row_sealed()):
            raise StoreConfigError(
                f"{self._where()} is encrypted: open it with its keys to write to it ({KEYS_ENV}, "
                "or steplog's --keys-file FILE; in Python, open_store(url, "
                "keyring=Keyring.from_text(...)), or create=False to only read what is not sealed)"
            )
        self._encrypted = marked
        self._settle_marks(text, parsed, writes=create and not getattr(self, "read_only", False))

    def _settle_marks(
        self, text: str | None, parsed: tuple[IntegrityMark, str] | None, *, writes: bool
    ) -> None:
        """Decide what this store's rows must be (its ``IntegrityMark``, ``text`` as read from
        the meta table), and record it when this store may write and it is not recorded yet.

        With keys, only a mark tagged with one of them is believed. A store that holds sealed
        rows (or is marked encrypted) without such a mark, a mark that is malformed, or one
        whose tag does not match or names a key not in the keyring raises
        ``LogIntegrityError`` (``mark altered``; with ``allow_broken_chain``, noted, and every
        row must then be chained and sealed). A mark is never computed from the rows of such a
        store (they would vouch for a forged one). A store without sealed rows read with keys
        is plain; its first writer with keys records which rows were written plain (the last
        position of each instance), tags the mark, then marks the store encrypted. Without
        keys, a recorded mark is used as it is (it cannot be checked); without one, the rows
        say from which row on they are chained, and a writer records that."""
        keyring = self._mapper.keyring
        mark, tag = parsed if parsed is not None else (None, "")
        malformed = text is not None and parsed is None
        if keyring is not None:
            if mark is not None and tag and keyring.tag_matches(tag, mark.message()) is True:
                self._marks = mark
                if writes and mark.plain is not None:  # put back a deleted encryption mark
                    self._write_meta(ENCRYPTION_MARK, "aes-256-gcm")
                    self._encrypted = True
                return
            encrypted = self._encrypted or self._first_sealed_row() is not None
            if mark is not None and tag and keyring.tag_matches(tag, mark.message()) is None:
                # Tagged with a key not in the keyring: wrong keys, or a forged tag. Reading
                # goes on with every row having to be sealed (rows sealed with that key say
                # which key they need); nothing is written with keys that may be the wrong ones.
                self._encrypted = True
                self._mark_refused(
                    f"it is tagged with key {tag.partition(':')[0][:16]!r}, which is not in the "
                    "keyring (wrong keys, or a tag forged by someone without the key)",
                    now=writes,
                )
                return
            if malformed or tag or encrypted:
                self._encrypted = self._encrypted or encrypted
                self._mark_refused(
                    "its keys wrote none"
                    if text is None
                    else "it is not one its keys wrote (malformed, untagged, or tagged with a "
                    "key not in the keyring)"
                )
                return
            chained = self._computed_marks().chained_from if mark is None else mark.chained_from
            if not writes:
                self._marks = IntegrityMark(chained, None)
                return
            with self._translated("read the global log"):
                plain = self._plain_positions()
            # The mark first: a store marked encrypted without its mark would be refused.
            self._record_marks(IntegrityMark(chained, plain))
            self._write_meta(ENCRYPTION_MARK, "aes-256-gcm")
            self._encrypted = True
            return
        if malformed:
            self._mark_refused("it is malformed")
        elif mark is not None:
            self._marks = mark
        elif self._encrypted:  # an encrypted store whose mark was removed: every row sealed
            self._marks = IntegrityMark(None, {})
        else:
            self._marks = self._computed_marks()
            if writes:
                self._record_marks(self._marks)

    def _mark_refused(self, why: str, *, now: bool = True) -> None:
        """Refuse (or note, reading every row as having to be chained and sealed) a store whose
        integrity mark cannot be believed, for ``why``. Not ``now``: only noted (``verify``
        names it), every row read as having to be sealed."""
        self._marks = IntegrityMark(0, {} if self._encrypted else None)
        self._mark_problem = ChainProblem(
            "",
            0,
            "mark altered",
            f"the integrity mark of {self._where()} (meta key {INTEGRITY_MARK!r}) cannot be "
            f"believed: {why}. Someone without the key may have altered or removed it, to have "
            "plain or unchained rows read as if written before the key or the chain. A store "
            "encrypted by a steplog older than this mark gets it from 'steplog "
            "--allow-broken-chain rekey' with its keys (which refuses every plain row)",
        )
        if now:
            self._refuse(self._mark_problem)

    def _record_marks(self, mark: IntegrityMark) -> None:
        """Write ``mark`` to the meta table (tagged with the current key, if any)."""
        keyring = self._mapper.keyring
        tag = "" if keyring is None else keyring.tag(mark.message())
        self._replace_meta(INTEGRITY_MARK, mark.to_text(tag))
        self._marks = mark

    def _computed_marks(self) -> IntegrityMark:
        """The ``IntegrityMark`` the rows of a plain store give (``_settle_marks``): one look
        at the log in row order up to its first chained row."""
        keyring = self._mapper.keyring
        with self._translated("read the global log"):
            last = self._newest_row_id()
            chained_at = None
            after = 0
            while chained_at is None:
                rows = self._select_rows(after, ROWS_PER_READ, None)
                for row_id, instance_id, position, topic, state in rows:
                    if keyring is None and is_sealed(bytes(state)):
                        chained_at = row_id  # cannot be looked into: its readers will say
                        break
                    try:
                        link = self._mapper.row_link(instance_id, position, topic, state)
                    except StepLogError:
                        continue  # left to its readers to name
                    if link.head is not None:
                        chained_at = row_id
                        break
                if len(rows) < ROWS_PER_READ:
                    break
                after = rows[-1][0]
        return IntegrityMark(last if chained_at is None else chained_at - 1, None)

    def _plain_positions(self) -> dict[str, int]:
        """Each instance's last position (what a plain store's rows hold when it gets its first
        key); adapters ask the database in one grouped query."""
        found: dict[str, int] = {}
        for instance_id in self.instances():
            version = self._version_or_none(instance_id)
            if version:
                found[instance_id] = version
        return found

    def _newest_row_sealed(self) -> bool:
        """Whether the store's newest row is sealed (one row read)."""
        with self._translated("read the newest row"):
            last = self._newest_row_id()
            rows = self._select_rows(last - 1, 1, None) if last > 0 else []
        return bool(rows) and is_sealed(bytes(rows[0][4]))

    def _first_sealed_row(self) -> int | None:
        """The id of the store's first sealed row (None: none); adapters ask the database."""
        after = 0
        while True:
            rows = self._select_rows(after, ROWS_PER_READ, None)
            for row_id, _, _, _, state in rows:
                if is_sealed(bytes(state)):
                    return row_id
            if len(rows) < ROWS_PER_READ:
                return None
            after = rows[-1][0]

    def _refuse(self, problem: ChainProblem) -> None:
        """Raise ``problem`` as a ``LogIntegrityError``, or note it when broken chains are read."""
        if self._mapper.on_broken is None:
            raise problem.error()
        self._mapper.on_broken(problem.error())

    def _form_problem(
        self, instance_id: str, link: RowLink, state: bytes, row_id: int | None = None
    ) -> ChainProblem | None:
        """What is wrong with a row that is not what the store's ``IntegrityMark`` says rows
        must be (chained after a point, sealed unless listed as written before the key), or
        None. ``row_id``: the row's id, looked up only when the chained bound is not 0 and the
        row breaks it."""
        mark = self._marks
        unsealed = not is_sealed(bytes(state)) and not mark.may_be_plain(instance_id, link.last)
        unchained = mark.chained_from is not None and link.head is None
        if not (unsealed or unchained):
            return None
        if row_id is None and unchained and mark.chained_from:
            with self._translated(f"read the row of {instance_id!r}#{link.last}"):
                row_id = self._row_id(instance_id, link.last)
        found = row_id if row_id is not None else 1 << 62
        unchained = unchained and found > (mark.chained_from or 0)
        return form_problem(instance_id, link, chained=not unchained, sealed=not unsealed)

    def _check_form(
        self, instance_id: str, link: RowLink, state: bytes, row_id: int | None = None
    ) -> None:
        """Refuse (or note) a row that breaks the store's ``IntegrityMark``."""
        problem = self._form_problem(instance_id, link, state, row_id)
        if problem is not None:
            self._refuse(problem)

    def _row_id(self, instance_id: str, last_position: int) -> int | None:
        """The id of the row of ``instance_id`` ending at ``last_position`` (None: no such row);
        adapters look it up by their index."""
        for note in self._recorder.select_notifications(start=1, limit=1 << 30):
            if note.originator_id == instance_id and note.originator_version == last_position:
                return int(note.id)
        return None

    def _note_broken(self, error: LogIntegrityError) -> None:
        problem = ChainProblem.of(error, error.instance_id or "", error.position or 0)
        if problem not in self.chain_problems:
            self.chain_problems.append(problem)

    def _read_meta(self, key: str) -> str | None:
        """A value of the store's meta table (the memory store keeps a dict)."""
        return self._memory_meta.get(key)

    def _write_meta(self, key: str, value: str) -> None:
        """Set a meta value that is not set yet (a set one is left as it is)."""
        self._memory_meta.setdefault(key, value)

    def _replace_meta(self, key: str, value: str) -> None:
        """Set a meta value, replacing the one set."""
        self._memory_meta[key] = value

    @property
    def keyring(self) -> Keyring | None:
        """The keys this store seals and opens rows with (None: rows are plain JSON). Views
        that keep copies of values in the same database seal them with it too."""
        return self._mapper.keyring

    @property
    def encrypted(self) -> bool:
        """Whether the store is marked encrypted (its first writer with a key marked it): its
        rows are sealed, and reading them needs its keys. Known when the store is opened."""
        return self._encrypted

    def holds_plain_rows(self) -> bool:
        """Whether this store holds rows in plain text, told cheaply (no scan): an encrypted
        store holds those its integrity mark lists as written before its first key (``rekey``
        seals them, and only them); a store never written with a key holds only plain rows (by
        its first row: an empty store holds none)."""
        if self._marks.plain is not None:  # encrypted: the rows its mark lists as plain
            return bool(self._marks.plain)
        with self._translated("read the first row"):
            first = self._select_rows(0, 1, None)
        return bool(first) and not is_sealed(bytes(first[0][4]))

    def _newer_schema(self, stamped: object) -> bool:
        """Whether the schema version stamped in the store's meta table is newer than this
        steplog's; a stamp that is not a whole number is a ``StoreError``."""
        text = str(stamped)
        if not (text.isascii() and text.isdigit()):
            raise StoreError(
                f"{self.url} has a malformed schema version {text!r:.40} in its meta table"
            )
        return int(text) > STORE_SCHEMA_VERSION

    @property
    def recorder(self) -> ApplicationRecorder:
        """eventsourcing's application recorder behind this store, for tools and tests that work
        on stored records (``StoredEvent``) directly, bypassing ``append``'s checks."""
        return self._recorder

    # -- writing ------------------------------------------------------------------------------

    def append(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> list[int]:
        """Append ``events`` to ``instance_id``'s stream, all or nothing.

        ``expected_version`` is the stream's version before the append (0 for a new stream), and
        the events' positions must follow it: ``expected_version + 1``, ``+ 2``, ...

        The batch is stored as one row (see ``_codec._mapper``), so an append is one insert however
        many events it holds. Returns the events' global positions. Raises
        ``ConcurrencyConflictError`` (writing nothing) when the stream is not at
        ``expected_version``, and ``InvalidBatchError`` (writing nothing) when an event belongs to
        another instance or is not at the position that follows.
        """
        if self._closed:
            raise StoreUnavailableError(f"cannot append: the store {self.url} is closed")
        if not events:
            return []
        row = self._row(instance_id, events, expected_version)
        try:  # not self._translated(): this is the hot path
            row_id = self._insert_row(instance_id, expected_version, row)
        except Exception as error:
            self._not_landed(instance_id, row)
            translated = self._store_error(error, f"append to {instance_id!r}")
            if translated is error:
                raise
            raise translated from error
        self._after_append(instance_id)
        return global_positions(row_id, len(events))

    def append_many(
        self, batches: Sequence[tuple[str, Sequence[EventBase], int]]
    ) -> list[list[int] | ConcurrencyConflictError]:
        """Append several batches ``(instance_id, events, expected_version)`` in one transaction:
        one commit (one fsync) for all of them.

        Each batch is checked against its own ``expected_version``: a batch whose stream has moved
        writes nothing and gets its ``ConcurrencyConflictError`` in the result, in its place; the
        others are appended, each getting its global positions. A batch that is invalid
        (``InvalidBatchError``, ``EncodingError``) raises before anything is written; a store error
        fails every batch (nothing is written)."""
        prepared = [self.prepare(i, events, expected_version=v) for i, events, v in batches]
        return self.append_prepared(prepared)

    def prepare(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> Prepared:
        """Check and encode a batch for ``append_prepared``: what can be refused without the
        database (``InvalidBatchError``, ``EncodingError``) is refused here, in the caller."""
        row = self._row(instance_id, events, expected_version) if events else None
        return Prepared(instance_id, expected_version, len(events), row)

    def append_prepared(
        self, batches: Sequence[Prepared]
    ) -> list[list[int] | ConcurrencyConflictError]:
        """Append prepared batches in one transaction (see ``append_many``)."""
        if self._closed:
            raise StoreUnavailableError(f"cannot append: the store {self.url} is closed")
        rows = [(b.instance_id, b.expected_version, b.row) for b in batches if b.row is not None]
        try:
            with self._translated(f"append {len(rows)} batches"):
                outcomes = iter(self._insert_rows(rows) if rows else [])
        except BaseException:
            for instance_id, _, row in rows:
                self._not_landed(instance_id, row)
            raise
        results: list[list[int] | ConcurrencyConflictError] = []
        for batch in batches:
            if batch.row is None:
                results.append([])
                continue
            outcome = next(outcomes)
            if isinstance(outcome, ConcurrencyConflictError):
                self._not_landed(batch.instance_id, batch.row)
                results.append(outcome)
                continue
            self._after_append(batch.instance_id)
            results.append(global_positions(outcome, batch.count))
        return results

    def _row(
        self, instance_id: str, events: Sequence[EventBase], expected_version: int
    ) -> StoredEvent:
        """The checked batch as the one row it is stored as."""
        self._check_batch(instance_id, events, expected_version)
        if len(events) > ROW_EVENTS:
            raise InvalidBatchError(
                f"a batch holds at most {ROW_EVENTS} events; this one for {instance_id!r} holds "
                f"{len(events)}"
            )
        if self._encrypted and self._mapper.keyring is None:
            raise StoreConfigError(
                f"cannot append to {instance_id!r}: {self._where()} is encrypted and this store "
                f"was opened without its keys ({KEYS_ENV})"
            )
        row = self._mapper.to_row(events, self._chain_previous(instance_id, expected_version))
        # The head this batch will end the chain with, so that the next batch of the same
        # instance can be prepared before this one lands (a group commit holds both); a batch
        # that does not land forgets it.
        self._heads_cache[instance_id] = (row.originator_version, row.head)
        return row

    def _chain_previous(self, instance_id: str, expected_version: int) -> bytes:
        """The hash a batch appended at ``expected_version`` chains to: the instance's head as
        this store last wrote it, else read from the row holding that position."""
        if expected_version == 0:
            return genesis(instance_id)
        cached = self._heads_cache.get(instance_id)
        if cached is not None and cached[0] == expected_version:
            return cached[1]
        with self._translated(f"read the chain head of {instance_id!r}"):
            rows = self._select_stream(instance_id, expected_version - 1, expected_version, 1)
        if not rows or rows[0][0] != expected_version:
            raise ConcurrencyConflictError(
                instance_id, expected_version, self._version_or_none(instance_id)
            )
        last, topic, state = rows[0]
        link = self._mapper.row_link(instance_id, last, topic, state)
        problem = self._form_problem(instance_id, link, state)
        if problem is not None:  # never chain to (and so vouch for) a row written around us
            raise problem.error()
        return genesis(instance_id) if link.head is None else link.head

    def _not_landed(self, instance_id: str, row: StoredEvent | None) -> None:
        """Forget the head a batch that was not written would have ended the chain with."""
        if isinstance(row, ChainedRow):
            cached = self._heads_cache.get(instance_id)
            if cached is not None and cached[1] == row.head:
                del self._heads_cache[instance_id]

    def _insert_row(self, instance_id: str, expected_version: int, row: StoredEvent) -> int:
        """Insert ``row`` iff the stream's version is ``expected_version``, atomically; its row
        id. Otherwise raise ``ConcurrencyConflictError``, having written nothing.

        This default (the memory store's) checks the version under a lock, then inserts through
        the recorder; the SQL adapters check it in the insert statement."""
        with self._insert_lock:
            actual = self._stream_version(instance_id)
            if actual != expected_version:
                raise ConcurrencyConflictError(instance_id, expected_version, actual)
            try:
                ids = self._recorder.insert_events([row])
            except IntegrityError as error:
                raise ConcurrencyConflictError(
                    instance_id, expected_version, self._version_or_none(instance_id)
                ) from error
            if isinstance(row, ChainedRow):
                self._memory_heads[instance_id] = (row.originator_version, row.head)
            return int(ids[0]) if ids else self.last_row_id()

    def _insert_rows(
        self, rows: Sequence[tuple[str, int, StoredEvent]]
    ) -> list[int | ConcurrencyConflictError]:
        """Insert every ``(instance_id, expected_version, row)`` in one transaction, each iff its
        stream is at its expected version; each row's id, or its conflict. This default inserts
        them one by one (the memory store has no commit to share)."""
        outcomes: list[int | ConcurrencyConflictError] = []
        for instance_id, expected, row in rows:
            try:
                outcomes.append(self._insert_row(instance_id, expected, row))
            except ConcurrencyConflictError as conflict:
                outcomes.append(conflict)
        return outcomes

    def last_row_id(self) -> int:
        """The id of the newest row (0 for an empty store)."""
        return int(self._recorder.max_notification_id() or 0)

    def _newest_row_id(self) -> int:
        """The id of the newest committed row, settled or not (``last_row_id`` where every
        committed row is settled): where the rows written before a key end (``IntegrityMark``)."""
        return self.last_row_id()

    @staticmethod
    def _check_batch(instance_id: str, events: Sequence[EventBase], expected_version: int) -> None:
        check_id(instance_id, "instance id", InvalidBatchError)
        if expected_version < 0:
            raise InvalidBatchError(f"expected_version must be >= 0, got {expected_version}")
        for offset, event in enumerate(events, start=1):
            if event.instance_id != instance_id:
                raise InvalidBatchError(
                    f"event {offset} of the batch belongs to instance {event.instance_id!r}, "
                    f"not {instance_id!r}; a batch goes to one stream"
                )
            if event.position != expected_version + offset:
                raise InvalidBatchError(
                    f"event {offset} of the batch for {instance_id!r} has position "
                    f"{event.position}; after version {expected_version} it must be "
                    f"{expected_version + offset}"
                )

    def _after_append(self, instance_id: str) -> None:  # noqa: B027 - optional, empty by default
        """Hook for adapters that wake followers in-process."""

    # -- reading ------------------------------------------------------------------------------

    def read(
        self,
        instance_id: str,
        *,
        after: int = 0,
        upto: int | None = None,
        limit: int | None = None,
        types: Collection[str] = (),
    ) -> list[EventBase]:
        """The events of ``instance_id`` with ``after < position <= upto``, in stream order.

        ``limit`` keeps the first ``limit`` positions of that window; ``types`` then keeps only
        events of those ``type`` strings (the others are never built). Stream positions are
        contiguous, so page a filtered read by position windows (``after=k, upto=k + n``).
        """
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        if limit is not None:
            if limit < 1:
                return []
            upto = after + limit if upto is None else min(upto, after + limit)
        with self._translated(f"read {instance_id!r}"), _bulk():
            rows = self._select_stream(instance_id, after or None, upto, limit)
            if not rows:
                return []
            events, _ = self._decode_run(instance_id, rows, after, upto, wanted)
            return events

    def _decode_run(
        self,
        instance_id: str,
        rows: Sequence[tuple[int, str, bytes]],
        after: int,
        upto: int | None,
        wanted: Collection[str] | None,
    ) -> tuple[list[EventBase], list[RowLink]]:
        """The events in ``(after, upto]`` of consecutive ``rows`` of ``instance_id``, each row
        checked against its hashes and the store's ``IntegrityMark``, and the rows checked to
        link up (from the stream's start when ``after`` is 0); with the rows' links."""
        decode = self._mapper.decode_row
        events: list[EventBase] = []
        links: list[RowLink] = []
        for last, topic, state in rows:
            events += decode(
                instance_id, last, topic, state, after=after, upto=upto, types=wanted, links=links
            )
            self._check_form(instance_id, links[-1], state)
        self._check_links(instance_id, links, from_start=not after)
        return events, links

    def _check_links(self, instance_id: str, links: Sequence[RowLink], *, from_start: bool) -> None:
        """Check that consecutive rows of a read link up (and, read from the start, that the
        first one begins the stream): raise, or note the problem when broken chains are read."""
        before = None
        for n, link in enumerate(links):
            if n or from_start:
                problem = link_problem(instance_id, before, link)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())
            before = link

    def read_ranges(
        self,
        instance_id: str,
        ranges: Sequence[tuple[int, int]],
        *,
        types: Collection[str] = (),
    ) -> list[EventBase]:
        """The events of ``instance_id`` in each window ``(after, upto]`` of ``ranges`` (in order,
        not overlapping), in stream order: ``read`` of many short windows in one query, for
        readers that know where the events they need are (a key index).

        Each event is checked against its hash, as ``read`` checks it, and so is the chain around
        each window: its rows link up with each other, its first row with the row before it
        (or begins the stream), and its last row with the row after it, read in one more query
        for all the windows. A row forged between rows it does not link up with is refused
        (``LogIntegrityError``), as a ``read`` of the whole stream would refuse it."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        windows = sorted(ranges)
        for (_, upto), (after, _) in itertools.pairwise(windows):
            if after < upto:
                raise StoreConfigError(f"read_ranges: windows overlap at position {after}")
        with self._translated(f"read {instance_id!r}"), _bulk():
            events: list[EventBase] = []
            read: list[list[RowLink]] = []
            for (after, upto), rows in zip(
                windows, self._select_windows(instance_id, windows), strict=True
            ):
                found, links = self._decode_run(instance_id, rows, after, upto, wanted)
                events += found
                read.append(links)
            self._check_around(instance_id, [links for links in read if links])
            return events

    def _check_around(self, instance_id: str, windows: Sequence[Sequence[RowLink]]) -> None:
        """Check that each run of rows in ``windows`` links up with the row before it (unless it
        begins the stream) and the row after it (if there is one), read in one query."""
        around: list[tuple[int, int]] = []
        for links in windows:
            if links[0].first > 1:
                around.append((links[0].first - 2, links[0].first - 1))
            around.append((links[-1].last, links[-1].last + 1))
        neighbours = self._select_windows(instance_id, around)
        n = 0
        for links in windows:
            pairs: list[tuple[RowLink, RowLink]] = []
            first = links[0].first
            if first > 1:
                found = [row for row in neighbours[n] if row[0] < first]
                n += 1
                if not found:  # no row ends before it: those positions were deleted
                    before = RowLink(0, 0, None, None)
                else:
                    before = self._mapper.row_link(instance_id, *found[-1])
                pairs.append((before, links[0]))
            found = neighbours[n]
            n += 1
            if found:
                pairs.append((links[-1], self._mapper.row_link(instance_id, *found[-1])))
            for earlier, row in pairs:
                problem = link_problem(instance_id, earlier, row)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())

    def find_events(
        self,
        instance_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        upto: int | None = None,
    ) -> list[EventBase]:
        """The events of ``instance_id`` of ``types`` with ``after < position <= upto``, in
        stream order: what ``read(..., types=types)`` returns, found by looking at each row's
        bytes first. For rare types (run starts, forks) in a long log: only the rows that may
        hold one are decoded.

        A batch row names each of its events' types by a code opening a JSON array
        (``[code, ...``): a row whose JSON (opened first, if sealed) has no array opening with
        the code of a wanted type holds none, and is skipped undecoded (``row_may_hold``). The
        rows that may hold one are decoded as ``read`` decodes them, each event built checked
        against its hash; the rows skipped are not checked, nor are the links between the rows
        decoded (they are not consecutive): a read of the whole log checks those.
        """
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        if wanted is None:
            raise StoreConfigError("find_events needs at least one event type")
        needle = codes_pattern(wanted)
        keyring = self._mapper.keyring
        events: list[EventBase] = []
        with self._translated(f"read {instance_id!r}"), _bulk():
            decode = self._mapper.decode_row
            start = after
            while True:
                rows = self._select_stream(instance_id, start or None, upto, _ROWS_PER_LOOK)
                for last, topic, state in rows:
                    if row_may_hold(instance_id, last, topic, state, wanted, needle, keyring):
                        links: list[RowLink] = []
                        events += decode(
                            instance_id,
                            last,
                            topic,
                            state,
                            after=after,
                            upto=upto,
                            types=wanted,
                            links=links,
                        )
                        self._check_form(instance_id, links[0], state)
                if len(rows) < _ROWS_PER_LOOK or (upto is not None and rows[-1][0] >= upto):
                    return events
                start = rows[-1][0]

    def _select_windows(
        self, instance_id: str, windows: Sequence[tuple[int, int]]
    ) -> list[list[tuple[int, str, bytes]]]:
        """``_select_stream`` of each window; adapters may read them all in one query."""
        return [self._select_stream(instance_id, after, upto) for after, upto in windows]

    def _select_stream(
        self, instance_id: str, after: int | None, upto: int | None, limit: int | None = None
    ) -> list[tuple[int, str, bytes]]:
        """The stream's rows ``(last position, topic, state)`` holding positions in
        ``(after, upto]``: those whose last position is after ``after``, up to and including the
        first whose last position reaches ``upto``; at most ``limit`` rows. In order."""
        stored = self._recorder.select_events(instance_id, gt=after)
        rows: list[tuple[int, str, bytes]] = []
        for s in stored:
            rows.append((s.originator_version, s.topic, s.state))
            if (upto is not None and s.originator_version >= upto) or (
                limit is not None and len(rows) >= limit
            ):
                break
        return rows

    @staticmethod
    def _wanted(types: Collection[str]) -> frozenset[str] | None:
        """The type names to keep (``None``: all), each checked to exist."""
        if not types:
            return None
        for name in types:
            if name not in EVENT_TYPES:
                raise StoreConfigError(f"unknown event type {name!r}; known: {sorted(EVENT_TYPES)}")
        return frozenset(types)

    # -- the hash chain ---------------------------------------------------------------------

    def _select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        """The recorded chain heads ``{instance: (position, hash)}`` (one instance's, if
        named); adapters keep them in a table written with each row."""
        if instance_id is None:
            return dict(self._memory_heads)
        found = self._memory_heads.get(instance_id)
        return {} if found is None else {instance_id: found}

    def chain_head(self, instance_id: str) -> ChainHead | None:
        """The instance's recorded chain head (None: none recorded), to export: held elsewhere,
        it lets ``verify_chain(heads=...)`` prove later that nothing up to it changed."""
        with self._translated(f"read the chain head of {instance_id!r}"):
            found = self._select_heads(instance_id).get(instance_id)
        return None if found is None else ChainHead(instance_id, found[0], found[1].hex())

    def event_hash(self, instance_id: str, position: int) -> bytes | None:
        """The chain's hash of the event of ``instance_id`` at ``position``, as its row holds it
        (opened with the store's keys if sealed): what a materialized view records to say which
        log it was folded from. None when there is no event there, or its row was written
        before the hash chain. Reads one row; checks nothing else."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        if position < 1:
            return None
        with self._translated(f"read {instance_id!r}#{position}"):
            rows = self._select_stream(instance_id, position - 1, position, 1)
            if not rows or rows[0][0] < position:
                return None
            last, topic, state = rows[0]
            return self._mapper.event_hash(instance_id, last, topic, state, position)

    def verify_chain(
        self,
        instance_id: str | None = None,
        *,
        heads: Sequence[ChainHead] = (),
        progress: Callable[[int], None] | None = None,
    ) -> ChainReport:
        """Check the hash chain of one instance (or of every one): every event against its
        hash, every row against the one before it, the end of the log against the recorded
        head, and each of ``heads`` (exported earlier) against the event at its position.

        Returns a ``ChainReport`` listing every problem with its position and kind; raises only
        when the store cannot be read: a ``StoreError``, or ``MissingKeyError`` for a sealed row
        whose key this store was not given (no keys, or wrong ones), since what cannot be opened
        cannot be checked, and is not evidence of tampering either. ``progress`` is called with
        the number of events checked after each batch of rows."""
        report = ChainReport()
        if self._mark_problem is not None:
            report.problems.append(self._mark_problem)
        with self._translated("verify the hash chain"):
            recorded = self._select_heads(instance_id)
            wanted: dict[str, list[ChainHead]] = {}
            for head in heads:
                if instance_id is None or head.instance_id == instance_id:
                    wanted.setdefault(head.instance_id, []).append(head)
            names = [instance_id] if instance_id is not None else self.instances()
            if instance_id is None:  # instances whose rows are all gone: heads still name them
                names += sorted((set(recorded) | set(wanted)) - set(names))
            for name in names:
                self._verify_instance(name, wanted.get(name, []), report, progress)
        return report

    def _verify_instance(
        self,
        instance_id: str,
        heads: list[ChainHead],
        report: ChainReport,
        progress: Callable[[int], None] | None,
    ) -> None:
        report.instances += 1
        problems: list[LogIntegrityError] = []
        before: RowLink | None = None
        lost = False  # the row before could not be read: nothing to link the next one to
        after = 0
        by_position = {head.position: head for head in heads}
        while True:
            rows = self._select_stream(instance_id, after or None, None, ROWS_PER_READ)
            for last, topic, state in rows:
                after = last
                links: list[RowLink] = []
                try:
                    self._mapper.decode_row(
                        instance_id,
                        last,
                        topic,
                        state,
                        types=(),
                        links=links,
                        on_broken=problems.append,
                        check_all=True,
                    )
                except MissingKeyError:
                    raise  # a row this keyring cannot open cannot be checked: not a broken chain
                except (LogIntegrityError, DecodeError) as error:
                    where = before.last + 1 if before is not None else 1
                    if isinstance(error, LogIntegrityError):
                        report.problems.append(ChainProblem.of(error, instance_id, where))
                    else:
                        report.problems.append(
                            ChainProblem(instance_id, where, "malformed", str(error))
                        )
                    before, lost = None, True
                    continue
                link = links[0]
                report.rows += 1
                count = link.last - link.first + 1
                report.events += count
                if link.head is None:
                    report.unchained_events += count
                report.problems += [ChainProblem.of(e, instance_id, link.first) for e in problems]
                problems.clear()
                form = self._form_problem(instance_id, link, state)
                if form is not None:
                    report.problems.append(form)
                problem = None if lost else link_problem(instance_id, before, link)
                if problem is not None and (form is None or form.kind != problem.kind):
                    report.problems.append(problem)
                for position in [p for p in by_position if link.first <= p <= link.last]:
                    head = by_position.pop(position)
                    self._check_exported(instance_id, head, link, state, topic, report)
                before, lost = link, False
            if progress is not None:
                progress(report.events)
            if len(rows) == ROWS_PER_READ:
                continue
            # The log is read to its end; its head is read after it, so that a writer appending
            # meanwhile (a row and its head in one transaction) is seen as having written more,
            # read next, never as rows past the head or as a truncated tail.
            recorded = self._select_heads(instance_id).get(instance_id)
            if recorded is None or recorded[0] <= after:
                break
            if not self._select_stream(instance_id, after or None, None, 1):
                break  # the head is past the last row: the tail was removed
        problem = tail_problem(instance_id, before, recorded)
        if problem is not None:
            report.problems.append(problem)
        for head in by_position.values():
            report.problems.append(
                ChainProblem(
                    instance_id,
                    head.position,
                    "truncated",
                    f"the exported head of {instance_id!r} at position {head.position} is past the "
                    "end of its log: events were removed",
                )
            )

    def _check_exported(
        self,
        instance_id: str,
        head: ChainHead,
        link: RowLink,
        state: bytes,
        topic: str,
        report: ChainReport,
    ) -> None:
        """Check an exported head against the hash of the event at its position."""
        found = self._mapper.event_hash(instance_id, link.last, topic, state, head.position)
        if found is None or found.hex() != head.hash:
            report.problems.append(
                ChainProblem(
                    instance_id,
                    head.position,
                    "head mismatch",
                    f"the event of {instance_id!r} at position {head.position} does not end in "
                    "the exported head: something up to it was changed since the head was taken",
                )
            )

    def version(self, instance_id: str) -> int:
        """The position of the stream's last event, 0 when the stream is empty."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        with self._translated(f"read the version of {instance_id!r}"):
            version = self._stream_version(instance_id)
        return version

    def _stream_version(self, instance_id: str) -> int:
        """The stream's version, read from the recorder (its last row's last position)."""
        last = self._recorder.select_events(instance_id, desc=True, limit=1)
        return last[0].originator_version if last else 0

    def _version_or_none(self, instance_id: str) -> int | None:
        try:
            return self.version(instance_id)
        except StoreError:
            return None

    def read_all(
        self,
        *,
        after: int = 0,
        limit: int = 500,
        upto: int | None = None,
        types: Collection[str] = (),
    ) -> list[Recorded]:
        """One page of events of every stream in global order, with ``global_position > after``.

        ``types`` keeps only events of those ``type`` strings (the others are never built). A
        page holds ``limit`` events unless the log has no more up to ``upto``: a short page means
        the reader has seen everything so far.

        Each event is checked against its hash; a scan (a read from the start, or one that goes
        on where this store's previous page ended, as a projector's catch-up and ``iter_all``
        do) also checks that each instance's rows link up, as ``read`` does.
        """
        if limit < 1:
            raise StoreConfigError(f"limit must be >= 1, got {limit}")
        wanted = self._wanted(types)
        upto_row = None if upto is None else upto >> ROW_SHIFT
        page: list[Recorded] = []
        after_row = (after >> ROW_SHIFT) - 1 if after else 0
        scan, self._scan = self._scan, None  # taken: a concurrent reader starts its own
        if scan is None or scan.end != after:
            scan = _Scan(after, {}, from_start=not after)
        try:
            with self._translated("read the global log"), _bulk():
                while len(page) < limit:
                    # Rows are read a few at a time (a row usually holds a whole superstep, so a
                    # page needs far fewer rows than events); a short read means no more.
                    wanted_rows = min(limit - len(page), ROWS_PER_READ)
                    rows = self._select_rows(after_row, wanted_rows, upto_row)
                    for row_id, instance_id, last, topic, state in rows:
                        self._page_row(
                            page, row_id, instance_id, last, topic, state, after, upto, wanted, scan
                        )
                        if len(page) >= limit:
                            del page[limit:]
                            return page
                    if len(rows) < wanted_rows:
                        return page
                    after_row = rows[-1][0]
            return page
        finally:
            if page:
                scan.end = page[-1].global_position
            self._scan = scan

    def _page_row(
        self,
        page: list[Recorded],
        row_id: int,
        instance_id: str,
        last: int,
        topic: str,
        state: bytes,
        after: int,
        upto: int | None,
        wanted: frozenset[str] | None,
        scan: _Scan,
    ) -> None:
        """Add the events of one row that fall in ``(after, upto]`` (global) to ``page``; check
        that a row entered from its start links up with the instance's row before it."""
        base = row_id << ROW_SHIFT
        count = row_count(instance_id, last, topic)
        first = last - count + 1
        low = first + max(after - base + 1, 0) - 1  # positions up to ``low`` are already read
        high = last if upto is None else min(last, first + upto - base)
        if low >= high:
            return
        links: list[RowLink] = []
        for event in self._mapper.decode_row(
            instance_id, last, topic, state, after=low, upto=high, types=wanted, links=links
        ):
            page.append(Recorded(base + event.position - first, event))
        self._check_form(instance_id, links[0], state, row_id)
        if low < first and row_id > scan.entered:  # entered from its start, for the first time
            scan.entered = row_id
            link = links[0]
            before = scan.links.get(instance_id)
            if before is not None or scan.from_start:
                problem = link_problem(instance_id, before, link)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())
            scan.links[instance_id] = link

    def _select_rows(
        self, after_row: int, limit: int, upto_row: int | None
    ) -> list[tuple[int, str, int, str, bytes]]:
        """Rows ``(row id, instance id, last position, topic, state)`` of the global log with
        ``after_row < row id <= upto_row``, by row id, at most ``limit``; only rows that a reader
        may pass (on PostgreSQL, only those of settled transactions)."""
        notes = self._recorder.select_notifications(
            start=after_row, limit=limit, stop=upto_row, inclusive_of_start=False
        )
        return [(n.id, str(n.originator_id), n.originator_version, n.topic, n.state) for n in notes]

    def _last_row(self) -> tuple[int, str, int, str] | None:
        """``(row id, instance id, last position, topic)`` of the newest row a reader may pass."""
        last = self.last_row_id()
        if not last:
            return None
        rows = self._select_rows(last - 1, 1, last)
        return None if not rows else rows[0][:4]

    def iter_all(
        self, *, after: int = 0, page_size: int = 500, types: Collection[str] = ()
    ) -> Iterator[Recorded]:
        """Every event after ``after`` in global order (only ``types``, if given), page by page."""
        position = after
        while True:
            page = self.read_all(after=position, limit=page_size, types=types)
            yield from page
            if len(page) < page_size:
                return
            position = page[-1].global_position

    def last_position(self) -> int:
        """The global position of the newest event, 0 for an empty store."""
        with self._translated("read the global log"):
            last = self._last_row()
        if last is None:
            return 0
        row_id, instance_id, position, topic = last
        return (row_id << ROW_SHIFT) + row_count(instance_id, position, topic) - 1

    def follow(
        self,
        *,
        after: int = 0,
        stop: threading.Event | None = None,
        poll_interval: float = 0.2,
        page_size: int = 500,
    ) -> Iterator[Recorded]:
        """Every event after ``after``, then each new one as it is appended, until ``stop`` is set.

        Backends that can push (memory, PostgreSQL's LISTEN/NOTIFY) wake at once; SQLite polls
        every ``poll_interval`` seconds.
        """
        stop = stop or threading.Event()
        position = after
        while not stop.is_set():
            page = self.read_all(after=position, limit=page_size)
            for recorded in page:
                yield recorded
                position = recorded.global_position
                if stop.is_set():
                    return
            if len(page) < page_size:
                self._wait_for_appends(position, poll_interval, stop)

    def _wait_for_appends(self, position: int, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)

    @abstractmethod
    def instances(self) -> list[str]:
        """The ids of every instance with at least one event, sorted."""

    # -- leases -------------------------------------------------------------------------------
    # One lease per instance: who may advance it, and until when (see ``kernel._store._lease``). The
    # adapters keep a row (instance_id, holder, expires) with ``expires`` in whole microseconds
    # since the Unix epoch (UTC), so a compare-and-set on an expiry is exact. Each call below is
    # one atomic statement. "Free" means no row: an expired lease is taken only with ``replace``.

    def acquire_lease(
        self,
        instance_id: str,
        holder: str,
        *,
        ttl: float,
        now: datetime,
        replace: Lease | None = None,
    ) -> Lease | None:
        """Take the lease on ``instance_id`` for ``ttl`` seconds from ``now`` (aware).

        Succeeds when the lease is free, when ``holder`` already has it (a renewal), or when the
        stored lease is exactly ``replace`` (same holder and expiry): a takeover of a lease the
        caller judged expired or dead, as a compare-and-set, so that of two processes taking over
        the same lease one wins. Returns the new ``Lease`` (``expires = now + ttl``), or ``None``
        when another holder has it.
        """
        expires = lease_expiry(now, ttl)
        stale: tuple[str, int] | None = None
        if replace is not None:
            if replace.instance_id != instance_id:
                raise StoreConfigError(
                    f"cannot replace the lease of {replace.instance_id!r} while acquiring the "
                    f"lease of {instance_id!r}"
                )
            stale = (replace.holder, to_micros(replace.expires))
        with self._lease_call(f"acquire the lease on {instance_id!r}"):
            taken = self._acquire_lease(instance_id, holder, to_micros(expires), stale)
        return Lease(instance_id, holder, expires) if taken else None

    def renew_lease(
        self, instance_id: str, holder: str, *, ttl: float, now: datetime
    ) -> Lease | None:
        """Extend ``holder``'s lease to ``now + ttl``; ``None`` if it is no longer ``holder``'s
        (taken over, or released)."""
        expires = lease_expiry(now, ttl)
        with self._lease_call(f"renew the lease on {instance_id!r}"):
            renewed = self._renew_lease(instance_id, holder, to_micros(expires))
        return Lease(instance_id, holder, expires) if renewed else None

    def release_lease(self, instance_id: str, holder: str) -> None:
        """Delete the lease on ``instance_id`` if ``holder`` has it; otherwise change nothing."""
        with self._lease_call(f"release the lease on {instance_id!r}"):
            self._release_lease(instance_id, holder)

    def read_lease(self, instance_id: str) -> Lease | None:
        """The lease on ``instance_id``, expired or not; ``None`` when there is none. Reading
        never writes: a store made before leases existed, opened with ``create=False``, has no
        leases table and reads ``None``."""
        with self._translated(f"read the lease on {instance_id!r}"):
            row = self._read_lease(instance_id)
        return None if row is None else Lease(instance_id, row[0], from_micros(row[1]))

    @contextmanager
    def _lease_call(self, action: str) -> Iterator[None]:
        """``_translated``, with a plain answer for a store that has no leases table."""
        try:
            with self._translated(action):
                yield
        except StoreUnavailableError:
            raise
        except StoreError as error:
            try:
                missing = self._leases_missing()
            except Exception:
                missing = False
            if not missing:
                raise
            raise StoreError(
                f"cannot {action}: {self._where()} has no leases table (it was made by an older "
                "steplog and opened with create=False); open it once with create=True to add it"
            ) from error

    def _acquire_lease(
        self, instance_id: str, holder: str, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        """Write ``(holder, expires)`` if the row is missing, is ``holder``'s, or is exactly
        ``replace`` (holder, expires); whether it was written. One atomic statement."""
        raise self._no_leases()

    def _renew_lease(self, instance_id: str, holder: str, expires: int) -> bool:
        """Set ``expires`` on ``holder``'s row; whether there was one."""
        raise self._no_leases()

    def _release_lease(self, instance_id: str, holder: str) -> None:
        """Delete ``holder``'s row, if there is one."""
        raise self._no_leases()

    def _read_lease(self, instance_id: str) -> tuple[str, int] | None:
        """``(holder, expires)`` of the row, or ``None``; never writes, never creates a table."""
        raise self._no_leases()

    def _leases_missing(self) -> bool:
        """Whether the store lacks its leases table (an old store opened with create=False)."""
        return False

    def _no_leases(self) -> StoreError:
        return StoreError(f"{type(self).__name__} ({self._where()}) keeps no leases")

    def group_committer(self) -> GroupCommitter:
        """The store's one ``GroupCommitter`` (``kernel._store._group``), made on first use."""
        with self._insert_lock:
            if self._committer is None:
                from kernel._store._group import GroupCommitter

                self._committer = GroupCommitter(self)
            return self._committer

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections. The store cannot be used afterwards."""
        self._stop_committer()
        self._closed = True

    def _stop_committer(self) -> None:
        """Commit what the group committer holds, and stop it (before connections close)."""
        committer = self._committer
        if committer is not None:
            committer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- error translation --------------------------------------------------------------------

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        """Run a recorder call, turning any driver or eventsourcing error into a ``StoreError``."""
        if self._closed:
            raise StoreUnavailableError(f"cannot {action}: the store {self.url} is closed")
        try:
            yield
        except Exception as error:
            translated = self._store_error(error, action)
            if translated is error:
                raise
            raise translated from error

    def _store_error(self, error: Exception, action: str) -> Exception:
        """``error`` in the ``StoreError`` tree; our own errors and unknown ones come back as is."""
        if isinstance(error, StepLogError):
            return error
        kind = error_class(error, self._errors)
        if kind is None:
            return error
        kind, hint = self._refine(error, kind)
        text = hide(" ".join(str(error).split()), self._secrets) or type(error).__name__
        message = f"cannot {action} in {self._where()}: {text}"
        return kind(f"{message}; {hint}" if hint else message)

    def _refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
        """The class and a hint for ``error``, from the driver's error code where it has one."""
        return kind, ""

    def _where(self) -> str:
        """The store, as error messages name it."""
        return self.url


_ROWS_PER_LOOK = 4096  # rows per query of ``find_events``: most are looked at and dropped
_JSON_SPACE = rb"[ \t\n\r]*"


def codes_pattern(types: Collection[str]) -> re.Pattern[bytes]:
    """What a batch row's JSON must contain to hold an event of ``types``: an array opening with
    one of their type codes (every schema version's), JSON whitespace allowed where JSON allows
    it, and ``-0`` for ``0`` (JSON reads it as the integer 0)."""
    codes = sorted(str(code) for code, (name, _) in enumerate(BATCH_CODES) if name in types)
    if not codes:
        return re.compile(rb"(?!)")  # matches nothing: no row holds such an event
    alternatives = b"|".join(c.encode() for c in codes)
    return re.compile(
        rb"\[" + _JSON_SPACE + rb"-?(?:" + alternatives + rb")" + _JSON_SPACE + rb"[,\]]"
    )


def row_may_hold(
    instance_id: str,
    last: int,
    topic: str,
    state: bytes,
    types: Collection[str],
    needle: re.Pattern[bytes],
    keyring: Keyring | None,
) -> bool:
    """Whether the row ``(instance_id, last, topic, state)`` may hold an event of ``types``
    (``needle``: their ``codes_pattern``), by its bytes: False only if it holds none. A row
    that cannot be looked at so (an event row, a sealed row that does not open, not bytes) may
    hold one: decoding it tells, or says what is wrong with it."""
    if type(topic) is not str or not topic.isdigit():
        return type(topic) is not str or topic.partition("@")[0] in types
    if type(state) is not bytes:
        if not isinstance(state, bytes | bytearray | memoryview):
            return True
        state = bytes(state)
    if is_sealed(state):
        if keyring is None:
            return True
        try:
            state = keyring.open(state, place(instance_id, last, topic), f"row {instance_id!r}")
        except (StepLogError, ValueError):  # decoding the row raises the right error
            return True
    return needle.search(state) is not None


@contextmanager
def _bulk() -> Iterator[None]:
    """Hold the cyclic garbage collector off while a read builds many objects at once.

    Decoded events hold no reference cycles, but every allocation of a long read counts towards
    the collector's thresholds, and its full passes over a growing heap made reading 700,000
    events 40 % slower. Collection resumes, as it was, when the read ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_store(
    url: str | None = None,
    *,
    create: bool = True,
    read_only: bool = False,
    keyring: KeyringChoice = FROM_ENV,
    allow_broken_chain: bool = False,
    **options: Any,
) -> EventStore:
    """Open the event store at ``url``.

    ``memory://`` keeps events in this process; ``sqlite:///relative.db`` and
    ``sqlite:////absolute/path.db`` use a SQLite file;
    ``postgresql://user[:password]@host[:port]/database[?schema=name]`` uses PostgreSQL, in the
    ``public`` schema unless one is named. Without a URL, ``$STEPLOG_STORE`` is used, else memory.

    With ``create=True`` (the default) a store that does not exist is created: the SQLite file and
    its tables, the PostgreSQL schema and tables. With ``create=False`` nothing is ever created
    (no file, no schema, no table, no row): a missing store raises ``StoreNotFoundError``. Use it
    for programs that only read. A ``memory://`` store is always new and empty.

    SQLite: a file that holds another application's tables (and no steplog store) is refused with
    ``StoreConfigError``, leaving it untouched, unless ``adopt=True`` is passed (steplog then adds
    its tables and switches the file to WAL mode). ``sqlite:///path.db?mode=ro`` opens a store
    read-only (never creating it); so does ``create=False`` when this user cannot write the file
    or its directory.

    ``read_only=True`` opens the store only to read, and implies ``create=False``: a SQLite file
    is opened as with ``?mode=ro`` (SQLite's ``mode=ro``; ``immutable=1`` where the directory
    or mount is read-only), so it is never written, its write-ahead log is read but never folded
    into it (no checkpoint), and no file is removed; the empty ``-wal`` and the ``-shm`` that
    SQLite makes to read a WAL-mode file are removed on ``close`` if they were not there before
    and no other connection uses them (docs/cli.md, "Reading never writes"). Elsewhere it is
    ``create=False``. The CLI's reading commands and ``steplog ui`` open their store so.

    A password in the URL is never shown: ``store.url``, ``repr(store)`` and every error message
    show it as ``***`` (the user name is kept).

    With a ``keyring`` (``Keyring``), rows are written encrypted and read back with its keys; a
    store once written with a key refuses writers without one. By default (``kernel.FROM_ENV``)
    the keys are those in ``$STEPLOG_KEYS``, so that a program opening its store by URL encrypts
    as the CLI and the builder's default store do; ``keyring=None`` opens it without keys, even
    when ``$STEPLOG_KEYS`` is set (``kernel._codec._cipher.keyring_from`` is the rule). Every read
    checks the hash chain and raises ``LogIntegrityError`` at the first event that does not match
    its hash or row that does not link up; ``allow_broken_chain=True`` reads such a log anyway,
    noting each problem in ``store.chain_problems`` for the reader to show.

    Raises ``StoreConfigError`` for a URL that is wrong or malformed (naming what is wrong), or
    keys that are not keys, ``StoreUnavailableError`` when the database cannot be reached or
    opened (``StoreDamagedError``, one of those, when its file is damaged; ``StoreNotFoundError``,
    another, when it does not exist and ``create`` is false), and ``SchemaVersionError`` when it
    was written by a newer steplog.
    """
    if url is None:
        url = os.environ.get(DEFAULT_STORE_ENV) or "memory://"
    if not isinstance(url, str) or not url.strip():
        shown = mask_url(url) if isinstance(url, str) else url
        raise StoreConfigError(f"a store URL must be a non-empty string, got {shown!r}")
    keys = keyring_from(keyring, os.environ)
    create = create and not read_only
    scheme = split_url(url).scheme.lower()
    store: EventStore
    if scheme == "memory":
        from kernel._store._memory import MemoryStore

        store = MemoryStore(url, create=create, **options)
    elif scheme == "sqlite":
        from kernel._store._sqlite import SQLiteStore

        store = SQLiteStore(url, create=create, read_only=read_only, **options)
    elif scheme in ("postgresql", "postgres"):
        from kernel._store._postgres import PostgresStore

        store = PostgresStore(url, create=create, **options)
    else:
        raise _unknown_scheme(scheme, url)
    try:
        store._configure(keyring=keys, allow_broken_chain=allow_broken_chain, create=create)
    except BaseException:
        store.close()
        raise
    return store


def _unknown_scheme(scheme: str, url: str) -> StoreConfigError:
    return StoreConfigError(
        f"unknown store URL {mask_url(url)!r}: use memory://, sqlite:///path/to/file.db or "
        "postgresql://user@host:port/database"
    )
