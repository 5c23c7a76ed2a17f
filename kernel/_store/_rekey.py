"""Key rotation: re-seal every event row of a store with its keyring's current key (``rekey``).

``rekey(store)`` reads the log in row order, a page of rows at a time, and rewrites the rows that
are not sealed with the keyring's current (first) key: rows sealed with an older key (which must
still be in the keyring: it opens them) and plain rows, written before the store had a key. Each
page's rewrites are one write transaction; a row is rewritten only if it still holds what was
read (a compare-and-set on its ``state``), so two rekeys, or a rekey and a writer, never undo each
other. Interrupted, it is run again: rows already sealed with the current key are skipped, so it
rewrites only what is left.

What a row holds does not change: the events, their positions, their hashes (the hash chain is
over the logical events, ``_codec._hashing``), so ``verify_chain()`` finds the same chain after a
rekey. Only one thing changes shape: a row of the first row format (one event per row, written
before the store's schema version 2), which has no sealed form, is rewritten as a batch row of
one event (batch format 1: no hashes, as before) and sealed.

A store that gets its first key this way is marked encrypted before any row is sealed, so that
from then on a writer without keys is refused (``open_store``), and its integrity mark
(``kernel._codec._chain.IntegrityMark``, tagged with the key) records which rows were written plain:
each instance's last position so far; every other row must be sealed. Other plain rows are
refused, by rekey as by every reader: whoever has no key cannot have them sealed for him.
(Processes that opened the store without keys before it was marked must be stopped first: their
later rows are refused too.) A store whose mark cannot be believed (opened with
``allow_broken_chain``) is rekeyed as one whose every row must be sealed: every plain row is
refused. Once every row is sealed, the mark lists no plain row: from then on every row must be.

``compact_store(store)`` then drops what the rewritten rows leave behind in the files: on SQLite
a ``VACUUM`` (deleted content goes with the free pages) and a WAL checkpoint that empties the WAL
file; on PostgreSQL a ``VACUUM FULL`` of the events table, which drops the old row versions that
an ``UPDATE`` leaves in the table until vacuumed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from kernel._base._errors import LogIntegrityError, StoreConfigError
from kernel._codec._chain import IntegrityMark
from kernel._codec._cipher import Keyring, is_sealed
from kernel._codec._mapper import RowMapper
from kernel._codec._rows import place, row_count
from kernel._store._backend import LogRow, RowChange
from kernel._store._eventstore import EventStore

__all__ = ["RekeyReport", "compact_store", "rekey"]

ROWS_PER_TRANSACTION = 500
"""Rows read per page, and at most rewritten per write transaction, by default."""
_KEY_ID = slice(4, 12)
"""Where a sealed value names its key (``_codec._cipher``: magic, then the key's fingerprint)."""

_RESEALED, _SEALED, _CONVERTED = "resealed", "sealed", "converted"


@dataclass
class RekeyReport:
    """What ``rekey`` did. ``rows`` were looked at; ``current`` were already sealed with the
    current key; ``resealed`` were sealed with an older key and ``sealed`` were plain (of which
    ``converted`` were one-event rows of the first row format); ``changed_meanwhile`` were
    rewritten by another process between the read and the write (left as it wrote them);
    ``transactions`` is the number of write transactions."""

    key: str = ""
    """The fingerprint of the key every row is now sealed with."""
    rows: int = 0
    current: int = 0
    resealed: int = 0
    sealed: int = 0
    converted: int = 0
    changed_meanwhile: int = 0
    transactions: int = 0
    marked: bool = False
    """Whether this rekey marked the store encrypted (it had no key before)."""

    @property
    def written(self) -> int:
        """Rows this rekey rewrote."""
        return self.resealed + self.sealed


def rekey(
    store: EventStore,
    *,
    rows_per_transaction: int = ROWS_PER_TRANSACTION,
    progress: Callable[[RekeyReport], None] | None = None,
) -> RekeyReport:
    """Seal every event row of ``store`` with its keyring's current key (module docstring).

    ``store`` must have been opened with a keyring holding the current key first and every key
    rows were sealed with after it. ``progress`` is called with the report after each page.
    Raises ``StoreConfigError`` for a store opened without keys or read-only, ``DecodeError``
    for a row sealed with a key not in the keyring (rows before it are already rewritten: give
    the key and run again), ``LogIntegrityError`` for a sealed row that was altered, and
    ``StoreError`` when the store cannot be read or written."""
    keyring = store.keyring
    if keyring is None:
        raise StoreConfigError(
            f"cannot rekey {store.url}: it was opened without keys; open it with the new key "
            "first and the old ones after it"
        )
    if getattr(store, "read_only", False):
        raise StoreConfigError(f"cannot rekey {store.url}: it was opened read-only")
    if rows_per_transaction < 1:
        raise StoreConfigError(f"rows_per_transaction must be >= 1, got {rows_per_transaction}")
    report = RekeyReport(key=keyring.current.hex())
    marks, report.marked = store._mark_encrypted()
    backend = store.backend
    after = 0
    while True:
        with store._translated("read the global log"):
            rows: list[LogRow] = backend.select_rows(after=after, limit=rows_per_transaction)
        planned = [_change(keyring, store, row, marks) for row in rows]
        report.rows += len(rows)
        changes = [(c, kind) for c, kind in planned if c is not None]
        report.current += len(planned) - len(changes)
        if changes:
            with store._translated(f"rewrite {len(changes)} rows"):
                done = backend.rewrite_rows([c for c, _ in changes])
            report.transactions += 1
            for (_, kind), written in zip(changes, done, strict=True):
                if not written:
                    report.changed_meanwhile += 1
                elif kind == _RESEALED:
                    report.resealed += 1
                else:
                    report.sealed += 1
                    report.converted += kind == _CONVERTED
        if progress is not None:
            progress(report)
        if len(rows) < rows_per_transaction:
            # Every row is sealed now: from now on, every row must be.
            store._record_marks(IntegrityMark(marks.chained_from, {}))
            # Snapshots are a cache: dropped rather than resealed (the next run keeps a new one).
            store.drop_snapshots()
            return report
        after = rows[-1][0]


def _change(
    keyring: Keyring, store: EventStore, row: LogRow, marks: IntegrityMark
) -> tuple[RowChange | None, str]:
    """The rewrite of one row and its kind; None when it is already sealed with the current
    key. A plain row past the point from which rows must be sealed is refused, never sealed."""
    _, instance_id, last, topic, state = row
    count = row_count(instance_id, last, topic)
    if not is_sealed(state) and not marks.may_be_plain(instance_id, last):
        raise LogIntegrityError(
            f"the row holding {instance_id!r}#{last - count + 1}..{last} is not encrypted, "
            "though the store's integrity mark does not list it as written before the store got "
            "its key: it was written by someone without the key (or by a process that opened "
            "the store before it had one); rekey "
            "stopped there, leaving it as it is",
            instance_id=instance_id,
            position=last - count + 1,
            kind="unsealed",
        )
    if is_sealed(state):
        if state[_KEY_ID] == keyring.current:
            return None, ""
        where = f"row {instance_id!r}#{last - count + 1}..{last}"
        try:
            plain = keyring.open(state, place(instance_id, last, topic), where)
        except LogIntegrityError as error:
            raise LogIntegrityError(
                f"{error}; rekey stopped there, leaving it as it is",
                instance_id=instance_id,
                position=last - count + 1,
                kind="seal broken",
            ) from None
        sealed = keyring.seal(plain, place(instance_id, last, topic))
        return (topic, sealed, instance_id, last, state), _RESEALED
    kind, new_topic, plain = _SEALED, topic, state
    if not topic.isdigit():  # a one-event row of the first row format
        kind, new_topic = _CONVERTED, "1"
        plain = _as_batch_row(store, instance_id, last, topic, state)
    sealed = keyring.seal(plain, place(instance_id, last, new_topic))
    return (new_topic, sealed, instance_id, last, state), kind


def _as_batch_row(
    store: EventStore, instance_id: str, position: int, topic: str, state: bytes
) -> bytes:
    """The plain state of a one-event batch row (batch format 1: no hashes) holding the event of
    a first-format row, read as every reader reads it (upcast to its current schema version)."""
    event = store._mapper.decode(instance_id, position, topic, state)
    body = orjson.loads(RowMapper().to_row([event]).state)
    del body[4]  # the chain: a row of the first format had none, and still has none
    body[0] = 1
    return orjson.dumps(body)


def compact_store(store: EventStore, *, tables: Sequence[str] = ()) -> None:
    """Drop from the store's files what rewritten rows left behind (module docstring): SQLite,
    ``VACUUM`` then a WAL checkpoint that truncates the WAL file; PostgreSQL, ``VACUUM FULL``
    of the events table and of ``tables`` (more tables of its schema, such as view tables).
    Both hold the database's write lock while they run: writers wait. Memory: nothing."""
    with store._translated("compact the store"):
        store.backend.compact(tables=tables)
