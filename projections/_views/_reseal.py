"""Re-sealing a store's view documents with the keyring's current key (``steplog rekey``).

``reseal_views`` walks every view table of a SQL backend's database a page at a time and
rewrites each document that is plain or sealed with an older key (``_views._docseal`` seals and
opens them), one write transaction per page, leaving a document another process rewrote
meanwhile as that process wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel import Keyring, ProjectionError
from projections._views._backends import POSITIONS_TABLE, ViewBackend
from projections._views._docseal import (
    MAGIC_AND_KEY,
    SEALED_DOC,
    open_doc,
    seal_doc,
    sealed_bytes,
)
from projections._views._postgres import PostgresViewBackend
from projections._views._sqlite import SQLiteViewBackend

__all__ = ["ResealReport", "reseal_views"]

_ROWS_PER_TRANSACTION = 500


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
            if sealed_bytes(doc, where)[4:MAGIC_AND_KEY] == keyring.current:
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
