"""Encryption at rest of view documents: how a store's keyring seals what views keep.

Materialized views keep copies of state values, inputs, outputs, messages and error texts in the
event store's own database, so on a store opened with a keyring (``open_store(keyring=...)``)
the SQL view backends seal every document they write with the store's ``Keyring``, and open it
when they read it. Without a keyring nothing changes: documents are plain JSON text.

A sealed document is stored as ``~`` followed by the standard base64 of the sealed bytes (no JSON
text begins with ``~``). The seal is bound to its place: the view's table (without the
``__shadow`` or ``__verify`` suffix of a rebuild's or a verify's scratch table, which is renamed
into place), the instance id and the row key, so a document copied to another row does not open
(``LogIntegrityError``). The instance id and the row key (run ids, superstep ids, state key
names, positions) stay plain: readers look rows up by them.

``reseal_views`` re-seals every document of a store's view tables with the keyring's current
key (``steplog rekey``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel import (
    KEYS_ENV,
    Keyring,
    LogIntegrityError,
    MissingKeyError,
    ProjectionError,
)
from projections._views._backends import POSITIONS_TABLE, ViewBackend

__all__ = [
    "SEALED_DOC",
    "ResealReport",
    "doc_place",
    "open_doc",
    "reseal_views",
    "seal_doc",
]

SEALED_DOC = "~"
"""How a sealed document's stored text begins."""
_SCRATCH = ("__shadow", "__verify")
_MAGIC_AND_KEY = 12
"""The sealed value's magic (4 bytes) and key fingerprint (8 bytes), before its nonce."""
_ROWS_PER_TRANSACTION = 500


def doc_place(table: str, instance_id: str, key: str) -> bytes:
    """What a sealed document is bound to: its view's table (a scratch table's suffix left
    out), its instance and its row key."""
    for suffix in _SCRATCH:
        if table.endswith(suffix):
            table = table[: -len(suffix)]
            break
    return b"\x00".join(
        (
            b"view",
            table.encode(),
            instance_id.encode("utf-8", "surrogatepass"),
            key.encode("utf-8", "surrogatepass"),
        )
    )


def seal_doc(keyring: Keyring, plain: bytes, table: str, instance_id: str, key: str) -> str:
    """The stored text of a document (its JSON bytes ``plain``) sealed with the current key."""
    sealed = keyring.seal(plain, doc_place(table, instance_id, key))
    return SEALED_DOC + base64.b64encode(sealed).decode("ascii")


def _sealed_bytes(stored: str, where: str) -> bytes:
    try:
        return base64.b64decode(stored[len(SEALED_DOC) :], validate=True)
    except (binascii.Error, ValueError):
        raise LogIntegrityError(f"{where} is not a whole encrypted document") from None


def open_doc(
    keyring: Keyring | None, stored: str, table: str, instance_id: str, key: str
) -> str | bytes:
    """The JSON text of a stored document: ``stored`` itself when it is plain, else opened with
    ``keyring``. A sealed document read without keys, or sealed with a key not in the keyring,
    is a ``MissingKeyError`` (a ``DecodeError``); one altered or moved to another row, a
    ``LogIntegrityError``."""
    if not stored.startswith(SEALED_DOC):
        return stored
    where = f"view document {table} {instance_id!r}/{key!r}"
    sealed = _sealed_bytes(stored, where)
    if keyring is None:
        raise MissingKeyError(
            f"{where} is encrypted; open the store with its keys ({KEYS_ENV}=... or "
            "open_store(url, keyring=Keyring.from_text(...)))",
            where=where,
            key=Keyring.fingerprint_of(sealed),
        )
    return keyring.open(sealed, doc_place(table, instance_id, key), where)


@dataclass
class ResealReport:
    """What ``reseal_views`` did: documents looked at, rewritten (sealed with the current key,
    from plain or from an older key), and changed by another process meanwhile (left as that
    process wrote them), and the write transactions it took."""

    tables: int = 0
    documents: int = 0
    table_names: list[str] = field(default_factory=list)
    """The view tables found (for ``kernel.compact_store``)."""
    rewritten: int = 0
    changed_meanwhile: int = 0
    transactions: int = 0


def reseal_views(
    backend: ViewBackend,
    keyring: Keyring,
    *,
    rows_per_transaction: int = _ROWS_PER_TRANSACTION,
    progress: Callable[[ResealReport], None] | None = None,
) -> ResealReport:
    """Seal every view document of ``backend``'s database with ``keyring``'s current key: plain
    ones and those sealed with an older key (which must be in ``keyring``). One write
    transaction per ``rows_per_transaction`` documents that need it; a document another process
    rewrote meanwhile is left as it is. Run again after an interruption, it rewrites only what is
    left. The memory backend's documents never leave the process and are not sealed."""
    from projections._views._sqlbackends import PostgresViewBackend, SQLiteViewBackend

    _check_limit(rows_per_transaction)
    report = ResealReport()
    if not isinstance(backend, SQLiteViewBackend | PostgresViewBackend):
        return report
    for table in _view_tables(backend):
        report.tables += 1
        report.table_names.append(table)
        after: tuple[str, str] | None = None
        while True:
            after = _reseal_page(backend, keyring, table, after, rows_per_transaction, report)
            if progress is not None:
                progress(report)
            if after is None:
                break
    return report


def _view_tables(backend: Any) -> list[str]:
    """The view tables in the backend's database (every ``steplog_view_*`` table)."""
    from projections._views._sqlbackends import PostgresViewBackend

    if isinstance(backend, PostgresViewBackend):
        statement = "SELECT tablename AS name FROM pg_catalog.pg_tables WHERE schemaname=%s"
        params: tuple[str, ...] = (backend._schema,)
    else:
        statement = "SELECT name FROM sqlite_master WHERE type='table'"
        params = ()
    with backend._cursor("list the view tables", commit=False) as cursor:
        cursor.execute(statement, params)
        names = [str(backend.column(row, "name")) for row in cursor.fetchall()]
    return sorted(n for n in names if n.startswith("steplog_view_") and n != POSITIONS_TABLE)


def _reseal_page(
    backend: Any,
    keyring: Keyring,
    table: str,
    after: tuple[str, str] | None,
    limit: int,
    report: ResealReport,
) -> tuple[str, str] | None:
    """Reseal the documents of one page of ``table`` after the row ``after``; the last row of
    the page, None at the end of the table."""
    m = backend.mark
    name = backend.name(table)
    query = f"SELECT instance_id, key, doc FROM {name}"
    params: tuple[str, ...] = ()
    if after is not None:
        query += f" WHERE instance_id > {m} OR (instance_id = {m} AND key > {m})"
        params = (after[0], after[0], after[1])
    query += f" ORDER BY instance_id, key LIMIT {int(limit)}"
    with backend._cursor(f"read {table}", commit=False) as cursor:
        cursor.execute(query, params)
        found = [
            (backend.column(r, "instance_id"), backend.column(r, "key"), backend.column(r, "doc"))
            for r in cursor.fetchall()
        ]
    changes: list[tuple[str, str, str, str]] = []
    for instance_id, key, doc in found:
        report.documents += 1
        if doc.startswith(SEALED_DOC):
            where = f"view document {table} {instance_id!r}/{key!r}"
            if _sealed_bytes(doc, where)[4:_MAGIC_AND_KEY] == keyring.current:
                continue
        plain = open_doc(keyring, doc, table, instance_id, key)
        plain_bytes = plain.encode() if isinstance(plain, str) else plain
        changes.append(
            (seal_doc(keyring, plain_bytes, table, instance_id, key), instance_id, key, doc)
        )
    if changes:
        update = (
            f"UPDATE {name} SET doc={m} WHERE instance_id={m} AND key={m} AND doc={m} RETURNING 1"
        )
        with backend._cursor(f"reseal the documents of {table}") as cursor:
            for values in changes:
                cursor.execute(update, values)
                if cursor.fetchone() is not None:
                    report.rewritten += 1
                else:
                    report.changed_meanwhile += 1
        report.transactions += 1
    if len(found) < limit:
        return None
    return found[-1][0], found[-1][1]


def _check_limit(rows_per_transaction: int) -> None:
    if rows_per_transaction < 1:
        raise ProjectionError(f"rows_per_transaction must be >= 1, got {rows_per_transaction}")
