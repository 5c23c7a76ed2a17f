"""``EventStore``: events appended to instance streams and read back exactly, over a ``RowBackend``.

One stream per workflow instance. The store does what is the same on every database (checking and
encoding batches, decoding and checking rows against the hash chain and the store's integrity mark,
paging the global log, leases as values) and reaches the database only through its ``RowBackend``
(``_backend``), which an adapter (``_memory``, ``_sqlite``, ``_postgres``) implements.
``open_store`` (``_factory``) picks the adapter by URL.

Every driver and eventsourcing error is translated at the backend's edge into the ``StoreError``
tree, by class, through one table per adapter (``RowBackend.errors``).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Self

from eventsourcing.persistence import ApplicationRecorder, StoredEvent

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
from kernel._codec._chain import (
    ChainHead,
    ChainProblem,
    ChainReport,
    IntegrityMark,
    form_problem,
    link_problem,
    tail_problem,
)
from kernel._codec._cipher import KEYS_ENV, Keyring, is_sealed
from kernel._codec._mapper import ChainedRow, EventMapper, RowLink, genesis, row_count
from kernel._codec._values import ValueCodec
from kernel._log._events import EVENT_TYPES, EventBase
from kernel._store._backend import RowBackend
from kernel._store._lease import Lease, from_micros, lease_expiry, to_micros
from kernel._store._records import (
    ROW_EVENTS,
    ROW_SHIFT,
    Prepared,
    Recorded,
    global_positions,
)
from kernel._store._scan import ROWS_PER_LOOK, Scan, bulk, codes_pattern, row_may_hold

if TYPE_CHECKING:
    from kernel._store._group import GroupCommitter

__all__ = [
    "ENCRYPTION_MARK",
    "INTEGRITY_MARK",
    "STORE_SCHEMA_VERSION",
    "EventStore",
    "newer_schema",
]

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

ROWS_PER_READ = 128
"""Rows fetched per query of the global log, while a page fills."""


def newer_schema(stamped: object, *, where: str) -> bool:
    """Whether the schema version stamped in the meta table of the store at ``where`` is newer
    than this steplog's; a stamp that is not a whole number is a ``StoreError``."""
    text = str(stamped)
    if not (text.isascii() and text.isdigit()):
        raise StoreError(f"{where} has a malformed schema version {text!r:.40} in its meta table")
    return int(text) > STORE_SCHEMA_VERSION


class EventStore:
    """Appends events to instance streams atomically, and reads them back exactly.

    Instances are made by ``open_store``, each over the ``RowBackend`` of its adapter (the adapters'
    stores only build their backend). All methods are synchronous and thread-safe; they raise only
    ``StoreError`` subclasses.
    """

    url: str
    """The store's URL, its password (if any) masked as ``***`` (``_base._urls.mask_url``)."""

    _committer: GroupCommitter | None = None

    _closed = False
    """Set by ``close()``. A class default, so ``_translated`` also serves an adapter's setup
    before ``EventStore.__init__`` runs."""

    def __init__(self, backend: RowBackend, *, url: str, mapper: EventMapper | None = None):
        self._backend = backend
        self.shares_commits: bool = backend.shares_commits
        """Whether concurrent runs should append their commit batches through the store's
        ``group_committer()``: true where a commit costs an fsync (SQLite, PostgreSQL)."""
        self._mapper = mapper or EventMapper()
        self.codec = ValueCodec()
        """The codec shared by everything that writes or reads values through this store."""
        self.url = url
        self._closed = False
        self._insert_lock = threading.Lock()
        self._heads_cache: dict[str, tuple[int, bytes]] = {}
        """Each instance's chain head as this store last wrote it: ``(position, hash)``."""
        self._encrypted = False
        self._marks = IntegrityMark()
        """What this store's rows must be (``_settle_marks``); no rule until it is opened."""
        self._mark_problem: ChainProblem | None = None
        """What is wrong with the store's integrity mark (read with ``allow_broken_chain``)."""
        self._scan: Scan | None = None
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
        self._mapper.keyring = keyring
        if allow_broken_chain:
            self._mapper.on_broken = self._note_broken
        text = self._meta(INTEGRITY_MARK)
        parsed = None if text is None else IntegrityMark.from_text(text)
        mark = None if parsed is None else parsed[0]
        marked = self._meta(ENCRYPTION_MARK) is not None
        # A mark that says sealed (tagged or not), or a sealed newest row, says encrypted too:
        # deleting the meta row ``encryption`` must not turn encryption off.
        marked = marked or (mark is not None and mark.plain is not None)
        if keyring is None and create and (marked or self._newest_row_sealed()):
            raise StoreConfigError(
                f"{self._where} is encrypted: open it with its keys to write to it ({KEYS_ENV}, "
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
                    self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
                    self._encrypted = True
                return
            encrypted = self._encrypted or self._backend.first_sealed_row() is not None
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
                plain = self._backend.last_positions()
            # The mark first: a store marked encrypted without its mark would be refused.
            self._record_marks(IntegrityMark(chained, plain))
            self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
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
            f"the integrity mark of {self._where} (meta key {INTEGRITY_MARK!r}) cannot be "
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
        self._set_meta(INTEGRITY_MARK, mark.to_text(tag), replace=True)
        self._marks = mark

    def _meta(self, key: str) -> str | None:
        """A value of the store's meta table (None: not set)."""
        with self._translated("read the meta table"):
            return self._backend.read_meta(key)

    def _set_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        """Set a meta value if it is not set yet (``replace``: always)."""
        with self._translated("write the meta table"):
            self._backend.write_meta(key, value, replace=replace)

    def _mark_encrypted(self) -> tuple[IntegrityMark, bool]:
        """Mark the store encrypted, for ``rekey`` (``_rekey``): record the ``IntegrityMark``
        its rows are then checked against (tagged with the current key), then the encryption
        mark. Returns that mark, and whether the store was not marked encrypted before.

        The mark lists the rows written plain (each instance's last position so far) when the
        store gets its first key; when its mark cannot be believed, none (every row must be
        sealed)."""
        marks = self._marks
        if self._mark_problem is not None:
            marks = IntegrityMark(self._computed_marks().chained_from, {})
        elif marks.plain is None:
            with self._translated("read the global log"):
                marks = IntegrityMark(marks.chained_from, self._backend.last_positions())
        newly = self._meta(ENCRYPTION_MARK) is None
        self._record_marks(marks)
        self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
        self._encrypted = True
        return marks, newly

    def _computed_marks(self) -> IntegrityMark:
        """The ``IntegrityMark`` the rows of a plain store give (``_settle_marks``): one look
        at the log in row order up to its first chained row."""
        keyring = self._mapper.keyring
        with self._translated("read the global log"):
            last = self._backend.newest_row_id()
            chained_at = None
            after = 0
            while chained_at is None:
                rows = self._backend.select_rows(after=after, limit=ROWS_PER_READ, upto=None)
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

    def _newest_row_sealed(self) -> bool:
        """Whether the store's newest row is sealed (one row read)."""
        with self._translated("read the newest row"):
            last = self._backend.newest_row_id()
            rows = self._backend.select_rows(after=last - 1, limit=1, upto=None) if last > 0 else []
        return bool(rows) and is_sealed(bytes(rows[0][4]))

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
                row_id = self._backend.row_id(instance_id, link.last)
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

    def _note_broken(self, error: LogIntegrityError) -> None:
        problem = ChainProblem.of(error, error.instance_id or "", error.position or 0)
        if problem not in self.chain_problems:
            self.chain_problems.append(problem)

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
            first = self._backend.select_rows(after=0, limit=1, upto=None)
        return bool(first) and not is_sealed(bytes(first[0][4]))

    @property
    def recorder(self) -> ApplicationRecorder:
        """eventsourcing's application recorder behind this store, for tools and tests that work
        on stored records (``StoredEvent``) directly, bypassing ``append``'s checks."""
        return self._backend.recorder

    @property
    def backend(self) -> RowBackend:
        """The ``RowBackend`` this store keeps its rows in (``kernel._store._backend``): for
        maintenance (``rekey``, ``compact_store``) and tests of the port itself."""
        return self._backend

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
            (outcome,) = self._backend.insert_rows([(instance_id, expected_version, row)])
        except Exception as error:
            self._not_landed(instance_id, row)
            translated = self._backend.translate_error(error, f"append to {instance_id!r}")
            if translated is error:
                raise
            raise translated from error
        if isinstance(outcome, ConcurrencyConflictError):
            self._not_landed(instance_id, row)
            raise outcome
        return global_positions(outcome, len(events))

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
                outcomes = iter(self._backend.insert_rows(rows) if rows else [])
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
                f"cannot append to {instance_id!r}: {self._where} is encrypted and this store "
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
            rows = self._backend.select_stream(
                instance_id, after=expected_version - 1, upto=expected_version, limit=1
            )
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

    def last_row_id(self) -> int:
        """The id of the newest row a reader may pass (0 for an empty store)."""
        with self._translated("read the global log"):
            return self._backend.last_row_id()

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
        with self._translated(f"read {instance_id!r}"), bulk():
            rows = self._backend.select_stream(
                instance_id, after=after or None, upto=upto, limit=limit
            )
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
        with self._translated(f"read {instance_id!r}"), bulk():
            events: list[EventBase] = []
            read: list[list[RowLink]] = []
            for (after, upto), rows in zip(
                windows, self._backend.select_windows(instance_id, windows), strict=True
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
        neighbours = self._backend.select_windows(instance_id, around)
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
        with self._translated(f"read {instance_id!r}"), bulk():
            decode = self._mapper.decode_row
            start = after
            while True:
                rows = self._backend.select_stream(
                    instance_id, after=start or None, upto=upto, limit=ROWS_PER_LOOK
                )
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
                if len(rows) < ROWS_PER_LOOK or (upto is not None and rows[-1][0] >= upto):
                    return events
                start = rows[-1][0]

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

    def chain_head(self, instance_id: str) -> ChainHead | None:
        """The instance's recorded chain head (None: none recorded), to export: held elsewhere,
        it lets ``verify_chain(heads=...)`` prove later that nothing up to it changed."""
        with self._translated(f"read the chain head of {instance_id!r}"):
            found = self._backend.select_heads(instance_id).get(instance_id)
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
            rows = self._backend.select_stream(
                instance_id, after=position - 1, upto=position, limit=1
            )
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
            recorded = self._backend.select_heads(instance_id)
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
            rows = self._backend.select_stream(
                instance_id, after=after or None, upto=None, limit=ROWS_PER_READ
            )
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
            recorded = self._backend.select_heads(instance_id).get(instance_id)
            if recorded is None or recorded[0] <= after:
                break
            if not self._backend.select_stream(
                instance_id, after=after or None, upto=None, limit=1
            ):
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
            version = self._backend.stream_version(instance_id)
        return version

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
            scan = Scan(after, {}, from_start=not after)
        try:
            with self._translated("read the global log"), bulk():
                while len(page) < limit:
                    # Rows are read a few at a time (a row usually holds a whole superstep, so a
                    # page needs far fewer rows than events); a short read means no more.
                    wanted_rows = min(limit - len(page), ROWS_PER_READ)
                    rows = self._backend.select_rows(
                        after=after_row, limit=wanted_rows, upto=upto_row
                    )
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
        scan: Scan,
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

    def _last_row(self) -> tuple[int, str, int, str] | None:
        """``(row id, instance id, last position, topic)`` of the newest row a reader may pass."""
        last = self._backend.last_row_id()
        if not last:
            return None
        rows = self._backend.select_rows(after=last - 1, limit=1, upto=last)
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
                self._backend.wait_for_appends(
                    newer=functools.partial(self._moved_past, position),
                    timeout=poll_interval,
                    stop=stop,
                )

    def _moved_past(self, position: int) -> bool:
        """Whether the log holds an event after global ``position``."""
        return self.last_position() > position

    def instances(self) -> list[str]:
        """The ids of every instance with at least one event, sorted."""
        with self._translated("list instances"):
            return self._backend.instances()

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
            taken = self._backend.acquire_lease(
                instance_id, holder, expires=to_micros(expires), replace=stale
            )
        return Lease(instance_id, holder, expires) if taken else None

    def renew_lease(
        self, instance_id: str, holder: str, *, ttl: float, now: datetime
    ) -> Lease | None:
        """Extend ``holder``'s lease to ``now + ttl``; ``None`` if it is no longer ``holder``'s
        (taken over, or released)."""
        expires = lease_expiry(now, ttl)
        with self._lease_call(f"renew the lease on {instance_id!r}"):
            renewed = self._backend.renew_lease(instance_id, holder, expires=to_micros(expires))
        return Lease(instance_id, holder, expires) if renewed else None

    def release_lease(self, instance_id: str, holder: str) -> None:
        """Delete the lease on ``instance_id`` if ``holder`` has it; otherwise change nothing."""
        with self._lease_call(f"release the lease on {instance_id!r}"):
            self._backend.release_lease(instance_id, holder)

    def read_lease(self, instance_id: str) -> Lease | None:
        """The lease on ``instance_id``, expired or not; ``None`` when there is none. Reading
        never writes: a store made before leases existed, opened with ``create=False``, has no
        leases table and reads ``None``."""
        with self._translated(f"read the lease on {instance_id!r}"):
            row = self._backend.read_lease(instance_id)
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
                missing = self._backend.leases_missing()
            except Exception:
                missing = False
            if not missing:
                raise
            raise StoreError(
                f"cannot {action}: {self._where} has no leases table (it was made by an older "
                "steplog and opened with create=False); open it once with create=True to add it"
            ) from error

    def group_committer(self) -> GroupCommitter:
        """The store's one ``GroupCommitter`` (``kernel._store._group``), made on first use."""
        with self._insert_lock:
            if self._committer is None:
                from kernel._store._group import GroupCommitter

                self._committer = GroupCommitter(self)
            return self._committer

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what the group committer holds, then release connections. The store cannot
        be used afterwards; closing it again does nothing."""
        if self._closed:
            return
        committer = self._committer
        if committer is not None:
            committer.close()
        self._backend.close()
        self._closed = True

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

    @property
    def _where(self) -> str:
        """The store, as error messages name it."""
        return self._backend.where

    def classify_error(self, error: BaseException) -> type[StoreError] | None:
        """The ``StoreError`` class a foreign (driver or eventsourcing) error becomes at this
        store's edge, or None when ``error`` is not one (steplog's own errors included).

        The one rule for programs that share the store's database (materialized views): a
        ``StoreDamagedError`` means the database is damaged (waiting will not help); another
        ``StoreUnavailableError`` means contention that outlasted the waits or a lost
        connection (retrying may help); any other class, a statement that failed."""
        found = self._backend.classify_error(error)
        return None if found is None else found[0]

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        """Run backend calls, turning any driver or eventsourcing error into a ``StoreError``."""
        if self._closed:
            raise StoreUnavailableError(f"cannot {action}: the store {self.url} is closed")
        with self._backend.translated(action):
            yield
