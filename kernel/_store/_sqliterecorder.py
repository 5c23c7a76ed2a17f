"""``SQLiteRecorder``: eventsourcing's SQLite application recorder with steplog's fast paths (it
passes eventsourcing's own recorder test cases)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteDatastore

from kernel._store._sqlitefile import EVENTS_TABLE

__all__ = ["Row", "SQLiteRecorder"]

Row = Sequence[Any]
"""A row of the global log (a ``sqlite3.Row``): rowid, instance id, position, topic, state."""


class SQLiteRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder, with steplog's fast paths.

    ``insert_events`` writes a batch with one ``executemany`` and reads its rowids (consecutive:
    no other writer can insert while the transaction holds SQLite's write lock);
    ``select_rows`` reads a page of the global log as plain tuples, and ``select_notifications``
    is built on it, so eventsourcing's recorder test cases exercise both.
    """

    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = EVENTS_TABLE) -> None:
        super().__init__(datastore, events_table_name)
        self._select_rows_sql = f"SELECT rowid, * FROM {events_table_name}"

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **_: Any
    ) -> Sequence[int] | None:
        rows = [
            (
                s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
                s.originator_version,
                s.topic,
                s.state,
            )
            for s in stored_events
        ]
        c.executemany(self.insert_events_statement, rows)
        c.execute("SELECT last_insert_rowid()")
        last = int(c.fetchone()[0])
        return list(range(last - len(rows) + 1, last + 1))

    def select_rows(
        self,
        *,
        after: int | None,
        limit: int,
        upto: int | None = None,
        topics: Sequence[str] = (),
    ) -> list[Row]:
        """Up to ``limit`` rows with ``after < rowid <= upto`` (bounds optional), of ``topics``
        only if given, in rowid order."""
        conditions, params = _range("rowid", after, upto, topics)
        statement = self._select_rows_sql
        if conditions:
            statement += " WHERE " + " AND ".join(conditions)
        statement += " ORDER BY rowid LIMIT ?"
        params.append(limit)
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            rows: list[Row] = cursor.fetchall()
        return rows

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        after = None if start is None else start - 1 if inclusive_of_start else start
        convert = self.convert_originator_id
        return [
            Notification(
                id=row[0],
                originator_id=convert(row[1]),
                originator_version=row[2],
                topic=row[3],
                state=row[4],
            )
            for row in self.select_rows(after=after, limit=limit, upto=stop, topics=topics)
        ]


def _range(
    column: str, after: int | None, upto: int | None, topics: Sequence[str]
) -> tuple[list[str], list[Any]]:
    """SQL conditions (and their parameters) for ``after < column <= upto`` (bounds optional),
    of ``topics`` only if given."""
    conditions: list[str] = []
    params: list[Any] = []
    if after is not None:
        conditions.append(f"{column} > ?")
        params.append(after)
    if upto is not None:
        conditions.append(f"{column} <= ?")
        params.append(upto)
    if topics:
        conditions.append(f"topic IN ({','.join('?' * len(topics))})")
        params.extend(topics)
    return conditions, params
