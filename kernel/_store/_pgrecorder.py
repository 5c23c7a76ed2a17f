"""``PostgresRecorder``: eventsourcing's PostgreSQL application recorder without its table lock, and
the SQL it installs (the heads table, the functions that hand out row ids and append, the upgrade
of older stores). It passes eventsourcing's own recorder test cases; ``_postgres`` builds the
store's backend on it. ``docs/scaling.md`` has the whole argument."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql

__all__ = [
    "APPEND_PROCEDURE",
    "EVENTS_TABLE",
    "HEADS_TABLE",
    "IDS_FUNCTION",
    "INSERT_FUNCTION",
    "SETTLED",
    "WRITE_FUNCTION",
    "PostgresRecorder",
    "append_columns",
]

EVENTS_TABLE = "steplog_events"
HEADS_TABLE = "steplog_heads"
"""One row per stream: ``(instance_id, version, last_row, chain)``, the stream's version, its last
row's id and its chain head (the hash of the event at ``version``; NULL before the chain).
Appends compare and set it, so writers of one instance take turns on its row and writers of
different ones never meet."""
APPEND_PROCEDURE = "steplog_append_and_notify"
WRITE_FUNCTION = "steplog_append"
INSERT_FUNCTION = "steplog_insert"
IDS_FUNCTION = "steplog_take_ids"
_LEGACY_APPEND_SIGNATURE = "(text[], bigint[], text[], bytea[])"
"""The table-locking append function of stores made before issue 10, dropped by the upgrade."""
_UNCHAINED_SIGNATURE = "(text[], bigint[], bigint[], text[], bytea[])"
_UNCHAINED_PROCEDURE_SIGNATURE = "(text[], bigint[], bigint[], text[], bytea[], bigint[])"
"""The append function and procedure of stores made before the hash chain, dropped by the
upgrade (the new ones also take each row's chain head)."""

# Row ids are handed out in transaction-id order. Inside a short critical section (an advisory
# lock held for the two calls, not until commit) the transaction takes its id
# (pg_current_xact_id) and all the row ids it will write. So a transaction with a smaller xid
# holds smaller row ids, and "tx_id < pg_snapshot_xmin(pg_current_snapshot())" (every
# transaction below the oldest running one is settled) marks a prefix of the log in row-id
# order: a follower that reads only settled rows never passes a row id that a running
# transaction could still commit. Without the critical section an older transaction could take
# its row id after a younger one and commit after it, below the follower's position.
# The lock is released by the exception handler on any error, so a failed call cannot leave it
# held by a pooled connection; it must be the transaction's first write (checked).
_IDS_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION {function}(n integer) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'steplog row ids must be taken before the transaction writes'
            USING ERRCODE = '55000';
    END IF;
    BEGIN
        PERFORM pg_advisory_lock({key});
        PERFORM pg_current_xact_id();
        ids := ARRAY(SELECT nextval({sequence}::regclass) FROM generate_series(1, n));
        PERFORM pg_advisory_unlock({key});
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_advisory_unlock({key});
        RAISE;
    END;
    RETURN ids;
END;
$$
"""
# The rows of one append, in the calling transaction (which they must open): any number of rows
# of any instances (a group commit). Each row is written iff its stream is at expected[i]: a
# compare-and-set on the stream's heads row (an insert for a new stream), so only writers of the
# same instance wait, on that row. The heads row also keeps the stream's last row id, and a row
# must come after it: an append sent before the previous one of its stream committed (so with an
# expected version it could not have read) may hold a smaller row id, and would put the stream's
# positions out of order in the global log; it is refused like a conflict (retried, it takes a
# new id). A row whose check fails writes nothing and gets NULL; the others are written. Rows
# are visited in instance order (stable), so two group commits never lock heads rows in
# opposite orders.
_WRITE_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION {function}(
    ids text[], expected bigint[], versions bigint[], topics text[], states bytea[],
    chains bytea[]
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    row_ids bigint[] := {take_ids}(cardinality(ids));
    tx xid8 := pg_current_xact_id();
    written bigint[] := array_fill(NULL::bigint, ARRAY[cardinality(ids)]);
    i integer;
BEGIN
    FOR i IN SELECT k FROM generate_subscripts(ids, 1) AS k ORDER BY ids[k], k LOOP
        IF expected[i] = 0 THEN
            INSERT INTO {heads} (instance_id, version, last_row, chain)
            VALUES (ids[i], versions[i], row_ids[i], chains[i])
            ON CONFLICT (instance_id) DO NOTHING;
        ELSE
            UPDATE {heads} SET version = versions[i], last_row = row_ids[i], chain = chains[i]
            WHERE instance_id = ids[i] AND version = expected[i] AND last_row < row_ids[i];
        END IF;
        IF FOUND THEN
            INSERT INTO {table}
                (notification_id, originator_id, originator_version, topic, state, tx_id)
            VALUES (row_ids[i], ids[i], versions[i], topics[i], states[i], tx);
            written[i] := row_ids[i];
        END IF;
    END LOOP;
    RETURN written;
END;
$$
"""
# The append, one CALL (one round trip, autocommit): the rows in one transaction, committed;
# then, if any was written, the wake-up in a second transaction, committed without waiting for
# its WAL flush. NOTIFY takes a database-wide lock from its commit's start to its end, so in the
# rows' transaction it would serialize every writer's commit and WAL flush (as a table lock
# does); alone and asynchronous it holds that lock for microseconds. Listeners get it after the
# rows are committed.
_APPEND_PROCEDURE_SQL = """
CREATE OR REPLACE PROCEDURE {procedure}(
    ids text[], expected bigint[], versions bigint[], topics text[], states bytea[],
    chains bytea[], INOUT written bigint[] DEFAULT NULL
) LANGUAGE plpgsql AS $$
BEGIN
    written := {write}(ids, expected, versions, topics, states, chains);
    COMMIT;
    IF EXISTS (SELECT FROM unnest(written) AS w WHERE w IS NOT NULL) THEN
        SET LOCAL synchronous_commit = off;
        NOTIFY {channel};
    END IF;
END;
$$
"""
# eventsourcing's insert, for the recorder (tools, eventsourcing's own test cases): no version
# check beyond the unique (originator_id, originator_version) key, as eventsourcing's; the heads
# rows are raised to the new versions so that appends' checks stay exact.
_INSERT_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION {function}(
    ids text[], versions bigint[], topics text[], states bytea[]
) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    row_ids bigint[] := {take_ids}(cardinality(ids));
    tx xid8 := pg_current_xact_id();
BEGIN
    NOTIFY {channel};
    INSERT INTO {heads} AS h (instance_id, version, last_row)
    SELECT b.i, max(b.v), max(b.r) FROM unnest(ids, versions, row_ids) AS b(i, v, r)
    GROUP BY b.i ORDER BY b.i
    ON CONFLICT (instance_id) DO UPDATE SET version = greatest(h.version, EXCLUDED.version),
        last_row = greatest(h.last_row, EXCLUDED.last_row);
    INSERT INTO {table} (notification_id, originator_id, originator_version, topic, state, tx_id)
    SELECT r, i, v, t, s, tx
    FROM unnest(row_ids, ids, versions, topics, states) AS b(r, i, v, t, s);
    RETURN QUERY SELECT unnest(row_ids);
END;
$$
"""
# Run by every create=True open (under the setup lock), changing a store made before issue 10
# once: rows written before have no tx_id (settled), and each stream's heads row starts at its
# version. Checked first, so an up-to-date store takes no ALTER TABLE lock.
_UPGRADE_SQL = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = {table_name}::regclass
                   AND attname = 'tx_id' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN tx_id xid8;  -- no default: no rewrite, old rows NULL
    END IF;
    IF to_regclass({heads_name}) IS NULL THEN
        CREATE TABLE {heads} (
            instance_id text PRIMARY KEY, version bigint NOT NULL, last_row bigint NOT NULL
        );
        INSERT INTO {heads} (instance_id, version, last_row)
        SELECT originator_id, max(originator_version), max(notification_id) FROM {table}
        GROUP BY originator_id;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = {heads_name}::regclass
                   AND attname = 'chain' AND NOT attisdropped) THEN
        ALTER TABLE {heads} ADD COLUMN chain bytea;  -- NULL: no chained row yet
    END IF;
END;
$$
"""

SETTLED = "(tx_id IS NULL OR tx_id < pg_snapshot_xmin(pg_current_snapshot()))"
"""Rows every reader may pass: written by a transaction below the oldest running one (or before
the upgrade). In row-id order they form a prefix of the log (see ``_IDS_FUNCTION_SQL``)."""

_MAX_ID = 2**63 - 1


class PostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL application recorder, without its table lock.

    ``create_table`` also adds steplog's parts (made or upgraded idempotently): the ``tx_id``
    column, the heads table, three functions and a procedure. ``steplog_take_ids`` hands out row
    ids in transaction-id order (see ``_IDS_FUNCTION_SQL``); ``steplog_append`` writes an
    append's rows (a compare-and-set per row on the stream's heads row, any number of rows);
    ``steplog_append_and_notify`` is the store's append (those rows committed, then the
    wake-up);
    ``steplog_insert`` is eventsourcing's insert for this recorder. Reads of the global log
    (``select_notifications``, ``max_notification_id``) return only settled rows, so no reader
    passes a row that a running transaction could still commit below it. Errors are
    eventsourcing's (``IntegrityError`` for a duplicate).
    """

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = self.datastore.schema
        table = sql.Identifier(schema, events_table_name)
        heads = sql.Identifier(schema, HEADS_TABLE)
        take_ids = sql.Identifier(schema, IDS_FUNCTION)
        channel = sql.Identifier(self.channel_name)
        sequence = f'"{schema}"."{events_table_name}_notification_id_seq"'
        # The critical section's lock: one per schema, a fixed number in the function's text.
        key = zlib.crc32(f"steplog row ids {schema}".encode()) - 2**31
        self.sql_create_statements += [
            sql.SQL(_UPGRADE_SQL).format(
                table=table,
                table_name=sql.Literal(f'"{schema}"."{events_table_name}"'),
                heads=heads,
                heads_name=sql.Literal(f'"{schema}"."{HEADS_TABLE}"'),
            ),
            sql.SQL("DROP FUNCTION IF EXISTS {}" + _LEGACY_APPEND_SIGNATURE).format(
                sql.Identifier(schema, WRITE_FUNCTION)
            ),
            sql.SQL("DROP PROCEDURE IF EXISTS {}" + _UNCHAINED_PROCEDURE_SIGNATURE).format(
                sql.Identifier(schema, APPEND_PROCEDURE)
            ),
            sql.SQL("DROP FUNCTION IF EXISTS {}" + _UNCHAINED_SIGNATURE).format(
                sql.Identifier(schema, WRITE_FUNCTION)
            ),
            sql.SQL(_IDS_FUNCTION_SQL).format(
                function=take_ids, key=sql.Literal(key), sequence=sql.Literal(sequence)
            ),
            sql.SQL(_WRITE_FUNCTION_SQL).format(
                function=sql.Identifier(schema, WRITE_FUNCTION),
                take_ids=take_ids,
                heads=heads,
                table=table,
            ),
            sql.SQL(_APPEND_PROCEDURE_SQL).format(
                procedure=sql.Identifier(schema, APPEND_PROCEDURE),
                write=sql.Identifier(schema, WRITE_FUNCTION),
                channel=channel,
            ),
            sql.SQL(_INSERT_FUNCTION_SQL).format(
                function=sql.Identifier(schema, INSERT_FUNCTION),
                take_ids=take_ids,
                heads=heads,
                table=table,
                channel=channel,
            ),
        ]
        self.append_sql = sql.SQL("CALL {}(%s, %s, %s, %s, %s, %s, NULL)").format(
            sql.Identifier(schema, APPEND_PROCEDURE)
        )
        """One call of ``steplog_append_and_notify``: ids, expected versions, versions, topics,
        states, chain heads; in autocommit mode (the procedure commits)."""
        self._insert_sql = sql.SQL("SELECT * FROM {}(%s, %s, %s, %s)").format(
            sql.Identifier(schema, INSERT_FUNCTION)
        )
        self.own_rows = _OwnRows()
        """The rows appended through this recorder (and its store), which their own global
        reads wait to see settled (``PostgresStore._settle_own_rows``)."""
        self.use_settled_filter(True)

    def use_settled_filter(self, on: bool) -> None:
        """Read settled rows only (``on``), or every row: a store made before issue 10 and
        opened with ``create=False`` has no ``tx_id`` column, and its rows were all written under
        the old table lock, in commit order."""
        settled = SETTLED if on else "TRUE"
        table = sql.Identifier(self.datastore.schema, self.events_table_name)
        self.settled_rows_sql = sql.SQL(
            "SELECT notification_id, originator_id, originator_version, topic, state FROM {} "
            "WHERE notification_id > %s AND notification_id <= %s AND (%s OR topic = ANY(%s)) "
            "AND " + settled + " ORDER BY notification_id LIMIT %s"
        ).format(table)
        """Settled rows after an id, up to an id, of some topics (or all), by id, limited."""
        self.last_settled_sql = sql.SQL(
            "SELECT notification_id, originator_id, originator_version, topic FROM {} WHERE "
            + settled
            + " ORDER BY notification_id DESC LIMIT 1"
        ).format(table)
        """The newest settled row (``last_row_id``, then ``_last_row``, read it through
        ``max_notification_id``)."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not stored_events:
            return []
        columns = (
            [str(s.originator_id) for s in stored_events],
            [s.originator_version for s in stored_events],
            [s.topic for s in stored_events],
            [s.state for s in stored_events],
        )
        with self.datastore.get_connection() as conn:
            rows = conn.execute(self._insert_sql, columns, prepare=True).fetchall()
        ids = [row[INSERT_FUNCTION] for row in rows]
        self.own_rows.wrote(max(ids))
        return ids

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """eventsourcing's read of the global log, of settled rows only."""
        after = -1 if start is None else start - 1 if inclusive_of_start else start
        params = (after, _MAX_ID if stop is None else stop, not topics, list(topics), limit)
        with self.datastore.get_connection() as conn:
            rows = conn.execute(self.settled_rows_sql, params, prepare=True).fetchall()
        return [
            Notification(
                id=row["notification_id"],
                originator_id=row["originator_id"],
                originator_version=row["originator_version"],
                topic=row["topic"],
                state=bytes(row["state"]),
            )
            for row in rows
        ]

    def max_notification_id(self) -> int | None:
        """The newest settled row's id (``None`` for an empty log)."""
        with self.datastore.get_connection() as conn:
            row = conn.execute(self.last_settled_sql, prepare=True).fetchone()
        return None if row is None else int(row["notification_id"])


def append_columns(
    rows: Sequence[tuple[str, int, StoredEvent]],
) -> tuple[list[str], list[int], list[int], list[str], list[bytes], list[bytes | None]]:
    """The parallel arrays the append function takes: instance ids, expected versions, the rows'
    last positions, topics, states and chain heads."""
    return (
        [instance_id for instance_id, _, _ in rows],
        [expected for _, expected, _ in rows],
        [row.originator_version for _, _, row in rows],
        [row.topic for _, _, row in rows],
        [row.state for _, _, row in rows],
        [getattr(row, "head", None) or None for _, _, row in rows],
    )


class _OwnRows:
    """The newest row id a store appended, and the newest it has waited to see settled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written = 0
        self._checked = 0

    def wrote(self, row_id: int) -> None:
        with self._lock:
            self._written = max(self._written, row_id)

    def pending(self) -> int:
        """The newest own row not yet waited for (0: none)."""
        with self._lock:
            return self._written if self._written > self._checked else 0

    def settled(self, row_id: int) -> None:
        with self._lock:
            self._checked = max(self._checked, row_id)
