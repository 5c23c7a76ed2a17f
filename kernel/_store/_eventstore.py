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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Self

from eventsourcing.persistence import StoredEvent

from kernel._base._errors import (
    ConcurrencyConflictError,
    InvalidBatchError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
)
from kernel._base._ids import check_id
from kernel._codec._chain import ChainProblem
from kernel._codec._cipher import KEYS_ENV
from kernel._codec._hashing import ChainedRow, genesis
from kernel._log._events import EventBase
from kernel._store._core import (
    ENCRYPTION_MARK,
    INTEGRITY_MARK,
    STORE_SCHEMA_VERSION,
    newer_schema,
)
from kernel._store._lease import Lease, from_micros, lease_expiry, to_micros
from kernel._store._marks import TrustedStore
from kernel._store._reads import StoreReads
from kernel._store._records import (
    ROW_EVENTS,
    Prepared,
    global_positions,
)
from kernel._store._verify import ChainChecks

if TYPE_CHECKING:
    from kernel._store._group import GroupCommitter

__all__ = [
    "ENCRYPTION_MARK",
    "INTEGRITY_MARK",
    "STORE_SCHEMA_VERSION",
    "EventStore",
    "newer_schema",
]


class EventStore(TrustedStore, StoreReads, ChainChecks):
    """Appends events to instance streams atomically, and reads them back exactly.

    Instances are made by ``open_store``, each over the ``RowBackend`` of its adapter (the adapters'
    stores only build their backend). All methods are synchronous and thread-safe; they raise only
    ``StoreError`` subclasses.
    """

    _committer: GroupCommitter | None = None

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
        try:  # not self._translated(): this is the hot path
            outcomes = iter(self._backend.insert_rows(rows) if rows else [])
        except BaseException as error:
            for instance_id, _, row in rows:
                self._not_landed(instance_id, row)
            if not isinstance(error, Exception):
                raise
            translated = self._backend.translate_error(error, f"append {len(rows)} batches")
            if translated is error:
                raise
            raise translated from error
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

    def chain_hash_at(self, instance_id: str, position: int) -> bytes:
        """The chain hash the row of ``instance_id`` ending at ``position`` ends with (what a
        snapshot folded to ``position`` names). Raises ``ConcurrencyConflictError`` when no row
        ends there."""
        return self._chain_previous(instance_id, position)

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
        self._refuse_if_truncated(instance_id, expected_version)
        return genesis(instance_id) if link.head is None else link.head

    def _refuse_if_truncated(self, instance_id: str, expected_version: int) -> None:
        """Refuse to chain past the end of a log that ends before its recorded head: events were
        removed from its end, and an append would overwrite the head that is the evidence
        (``verify`` names it as ``truncated``). A head past ``expected_version`` with the stream
        reaching it is another writer's append: the insert's version check refuses that one.
        (The head is read before the stream's version: both are written in one transaction.)"""
        with self._translated(f"read the chain head of {instance_id!r}"):
            recorded = self._backend.select_heads(instance_id).get(instance_id)
        if recorded is None or recorded[0] <= expected_version:
            return
        end = self._version_or_none(instance_id)
        if end is None or end >= recorded[0]:
            return
        raise ChainProblem(
            instance_id,
            end + 1,
            "truncated",
            f"the log of {instance_id!r} ends at position {end}, before its recorded chain head "
            f"at {recorded[0]}: events were removed from its end ('steplog verify' names them); "
            "nothing was appended after it",
        ).error()

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
