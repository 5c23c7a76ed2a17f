"""The PostgreSQL adapter: eventsourcing's PostgreSQL recorder, for many processes on one database.

Writers of different instances commit in parallel: no table lock. An append is one CALL (one
round trip) that compares and sets the stream's version on its heads row (only writers of the
same instance wait, on that row) and inserts the batch's row, tagged with its transaction id.
Row ids are handed out in transaction-id order, so the rows of transactions older than the
oldest one still running (``pg_snapshot_xmin``) are a prefix of the log: global reads return
only those ("settled"), and a follower never passes a row that could still commit below it.
Followers wake on LISTEN/NOTIFY instead of polling. ``docs/scaling.md`` has the whole argument.
``PostgresRecorder``, a subclass of eventsourcing's recorder, holds the SQL and passes
eventsourcing's own recorder test cases.
"""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote

import psycopg
from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql
from psycopg_pool import PoolTimeout

from kernel._base._errors import (
    ConcurrencyConflictError,
    SchemaVersionError,
    StoreConfigError,
    StoreDamagedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from kernel._base._urls import hide, mask_url, split_url, url_secrets
from kernel._codec._cipher import MAGIC
from kernel._store._backend import (
    PERSISTENCE_ERRORS,
    ErrorTable,
    Insert,
    LogRow,
    RowBackend,
    RowChange,
    StreamRow,
    driver_error,
    error_class,
)
from kernel._store._eventstore import STORE_SCHEMA_VERSION, EventStore, newer_schema

__all__ = ["PostgresBackend", "PostgresRecorder", "PostgresStore", "postgres_params"]

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
OWN_ROWS_WAIT = 1.0
"""Seconds a store's global read waits for its own appended rows to settle (see
``PostgresStore._settle_own_rows``)."""
SETTLED = "(tx_id IS NULL OR tx_id < pg_snapshot_xmin(pg_current_snapshot()))"
"""Rows every reader may pass: written by a transaction below the oldest running one (or before
the upgrade). In row-id order they form a prefix of the log (see ``_IDS_FUNCTION_SQL``)."""
META_TABLE = "steplog_meta"
LEASES_TABLE = "steplog_leases"
"""One row per leased instance: holder, and expires in whole microseconds since the Unix epoch
(UTC). Added to stores made before leases by their next ``create=True`` open."""
# Take the lease if it is free, ours, or exactly the stale one named (holder, expires). A
# concurrent takeover of the same row waits for the first one's commit, then re-checks the WHERE
# against the new row and updates nothing: no row comes back.
_ACQUIRE_SQL = """
INSERT INTO {table} AS lease (instance_id, holder, expires) VALUES (%s, %s, %s)
ON CONFLICT (instance_id) DO UPDATE SET holder = EXCLUDED.holder, expires = EXCLUDED.expires
WHERE lease.holder = EXCLUDED.holder
   OR (lease.holder = %s::text AND lease.expires = %s::bigint)
RETURNING holder
"""
_MAX_ID = 2**63 - 1
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

POSTGRES_ERRORS: ErrorTable = (
    (psycopg.OperationalError, StoreUnavailableError),  # PoolTimeout is one
    (psycopg.InterfaceError, StoreUnavailableError),
    (psycopg.Error, StoreError),
    *PERSISTENCE_ERRORS,
)
"""psycopg's classes, then eventsourcing's (which wrap psycopg's inside its datastore)."""

_SERVER = (
    "check that the server is running, the host, port, user and database are right, and that "
    "this user may connect"
)
# Hints by SQLSTATE class (first two characters) or code: https://www.postgresql.org/docs/current/errcodes-appendix.html
_SQLSTATE_HINTS: dict[str, tuple[type[StoreError], str]] = {
    "08": (StoreUnavailableError, _SERVER),  # connection exception
    "57": (StoreUnavailableError, _SERVER),  # operator intervention (server shutting down)
    "53": (StoreUnavailableError, "the server is out of resources (connections, memory, disk)"),
    "28": (StoreUnavailableError, "check the user name and password"),
    "3D000": (StoreNotFoundError, "the database does not exist; create it first"),
    "42501": (StoreUnavailableError, "this user lacks a privilege it needs on the schema"),
    "55P03": (StoreUnavailableError, "another session holds a lock; retry"),
    "40P01": (StoreUnavailableError, "a deadlock was broken; retry"),
    "42883": (
        StoreError,
        "the store was made by an older steplog; open it once with create=True to upgrade it",
    ),  # undefined function: steplog_append of an old store opened with create=False
}
_TABLES_SQL = (
    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = ANY(%s)"
)


def postgres_params(url: str) -> dict[str, Any]:
    """Connection parameters from ``postgresql://user[:password]@host[:port]/db[?schema=name]``."""
    parts = split_url(url)  # a malformed URL, or a bad port, is refused here
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise StoreConfigError(
            f"PostgreSQL URL {mask_url(url)!r} names no database; use "
            "postgresql://user@host:5432/db"
        )
    port = parts.port or 5432
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    schema = query.pop("schema", "public")
    if not _IDENTIFIER.match(schema):
        raise StoreConfigError(f"schema {schema!r} is not a plain SQL identifier")
    if query:
        raise StoreConfigError(f"unknown PostgreSQL URL parameters: {sorted(query)} (only schema)")
    return {
        "dbname": dbname,
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": unquote(parts.username or "postgres"),
        "password": unquote(parts.password or ""),
        "schema": schema,
    }


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


class PostgresBackend(RowBackend):
    """Rows in a PostgreSQL schema (``PostgresStore`` says how it is opened). Appends of
    different instances commit in parallel; reads of the global log see settled rows only."""

    errors = POSTGRES_ERRORS
    shares_commits = True

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        pool_size: int = 2,
        max_overflow: int = 4,
        connect_timeout: float = 5.0,
    ) -> None:
        params = postgres_params(url)
        self._params = params
        self._local = threading.local()  # each following thread's LISTEN connection
        self._listeners: list[psycopg.Connection[Any]] = []
        self._listeners_lock = threading.Lock()
        self.schema: str = params["schema"]
        self.url = mask_url(url)
        self.where = self.url
        self.secrets = url_secrets(url)
        with self._setup_turn(connect_timeout, create=create):
            self._open(pool_size, max_overflow, connect_timeout, create=create)

    def _open(
        self, pool_size: int, max_overflow: int, connect_timeout: float, *, create: bool
    ) -> None:
        params = self._params
        self.datastore = self._ds = PostgresDatastore(
            dbname=params["dbname"],
            host=params["host"],
            port=params["port"],
            user=params["user"],
            password=params["password"],
            schema=self.schema,
            pool_size=pool_size,
            max_overflow=max_overflow,
            connect_timeout=connect_timeout,
            originator_id_type="text",
        )
        try:
            with self.translated("open the store"):
                recorder = PostgresRecorder(self._ds, events_table_name=EVENTS_TABLE)
            self.recorder: PostgresRecorder = recorder
            self._channel = recorder.channel_name
            with self.translated("create the tables" if create else "open the store"):
                if create:
                    recorder.create_table()
                    self._stamp_schema_version()
                    self._create_leases_table()  # also in stores made before leases
                else:
                    recorder.use_settled_filter(self._has_tx_ids())
                self._check_schema_version()
        except BaseException:
            self._ds.close()
            raise

    def _connect_params(self, connect_timeout: float) -> dict[str, Any]:
        p = self._params
        return {
            "dbname": p["dbname"],
            "host": p["host"],
            "port": p["port"],
            "user": p["user"],
            "password": p["password"] or None,
            "connect_timeout": max(1, int(connect_timeout)),
            "autocommit": True,
        }

    def _connect(self, connect_timeout: float) -> psycopg.Connection[Any]:
        return psycopg.connect(**self._connect_params(connect_timeout))

    @contextmanager
    def _setup_turn(self, connect_timeout: float, *, create: bool) -> Iterator[None]:
        """Reach the server; then, with ``create``, create the schema and tables while no other
        process does, or, without it, check that they exist.

        ``CREATE ... IF NOT EXISTS`` is not safe against the same statement running concurrently
        (it fails with a duplicate key or "tuple concurrently updated"), so processes opening a
        new store at once take turns on an advisory lock named after the schema. The lock is
        released when its connection closes.
        """
        try:
            conn = self._connect(connect_timeout)
        except psycopg.Error as error:
            kind = error_class(error, self.errors) or StoreUnavailableError
            kind, hint = self.refine(error, kind)
            if self._database_is_missing(connect_timeout):
                kind, hint = _SQLSTATE_HINTS["3D000"]
            text = hide(" ".join(str(error).split()), self.secrets)
            raise kind(
                f"cannot reach PostgreSQL for {self.url}: {text}; {hint or _SERVER}"
            ) from error
        with conn:
            try:
                if create:
                    conn.execute(
                        "SELECT pg_advisory_lock(hashtext(%s))", (f"steplog setup {self.schema}",)
                    )
                    conn.execute(
                        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            sql.Identifier(self.schema)
                        )
                    )
                else:
                    found = {
                        row[0]
                        for row in conn.execute(
                            _TABLES_SQL, (self.schema, [EVENTS_TABLE, META_TABLE])
                        )
                    }
            except psycopg.Error as error:
                kind, hint = self.refine(error, error_class(error, self.errors) or StoreError)
                text = hide(" ".join(str(error).split()), self.secrets)
                raise kind(
                    f"cannot prepare schema {self.schema!r} in {self.url}: {text}"
                    + (f"; {hint}" if hint else "")
                ) from error
            if not create and found != {EVENTS_TABLE, META_TABLE}:
                raise StoreNotFoundError(
                    f"{self.url} holds no steplog store in schema {self.schema!r} (no "
                    f"{EVENTS_TABLE} and {META_TABLE} tables); nothing was created"
                )
            yield

    def _database_is_missing(self, connect_timeout: float) -> bool:
        """Whether the server answers, without the database (libpq gives a failed connection no
        SQLSTATE, so ask the maintenance database rather than read the message)."""
        try:
            with psycopg.connect(
                **{**self._connect_params(connect_timeout), "dbname": "postgres"}
            ) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_database WHERE datname = %s", (self._params["dbname"],)
                ).fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0] == 0

    def _has_tx_ids(self) -> bool:
        """Whether the events table has its ``tx_id`` column (stores made before issue 10 get it
        from their next ``create=True`` open)."""
        with self._ds.get_connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attname = 'tx_id' AND NOT attisdropped",
                (f'"{self.schema}"."{EVENTS_TABLE}"',),
            ).fetchone()
        return row is not None and int(row["n"]) > 0

    def _stamp_schema_version(self) -> None:
        table = sql.Identifier(self.schema, META_TABLE)
        with self._ds.transaction(commit=True) as cursor:
            cursor.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)"
                ).format(table)
            )
            cursor.execute(
                sql.SQL(
                    # An older stamp is raised to this steplog's (its batch rows and settled
                    # reads are not for older steplogs); a newer one is left, and refused below.
                    "INSERT INTO {0} AS meta VALUES ('schema_version', %s) ON CONFLICT (key) DO "
                    "UPDATE SET value = EXCLUDED.value WHERE meta.value ~ '^[0-9]{{1,9}}$' "
                    "AND meta.value::int < EXCLUDED.value::int"
                ).format(table),
                (str(STORE_SCHEMA_VERSION),),
            )

    def _check_schema_version(self) -> None:
        table = sql.Identifier(self.schema, META_TABLE)
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(sql.SQL("SELECT value FROM {} WHERE key='schema_version'").format(table))
            row = cursor.fetchone()
        if row is not None and newer_schema(row["value"], where=self.url):
            raise SchemaVersionError(
                f"PostgreSQL store {self.url} was written by a newer steplog (store schema version "
                f"{row['value']}; this steplog knows up to {STORE_SCHEMA_VERSION}); upgrade steplog"
            )

    def instances(self) -> list[str]:
        statement = sql.SQL("SELECT DISTINCT originator_id FROM {} ORDER BY 1").format(
            sql.Identifier(self.schema, EVENTS_TABLE)
        )
        with self._ds.transaction() as cursor:
            cursor.execute(statement)
            return [row["originator_id"] for row in cursor.fetchall()]

    def select_stream(
        self,
        instance_id: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
    ) -> list[StreamRow]:
        """By the primary key (instance, last position): the first row past ``after`` up to the
        first one that reaches ``upto``. No settled filter: a stream's order is its positions,
        and a row is read only once committed."""
        table = sql.Identifier(self.schema, EVENTS_TABLE)
        statement = sql.SQL(
            "SELECT originator_version, topic, state FROM {} "
            "WHERE originator_id = %s AND originator_version > %s"
        ).format(table)
        params: list[Any] = [instance_id, after or 0]
        if upto is not None:
            statement += sql.SQL(
                " AND originator_version <= coalesce((SELECT min(originator_version) FROM {} "
                "WHERE originator_id = %s AND originator_version >= %s), %s)"
            ).format(table)
            params += [instance_id, upto, upto]
        statement += sql.SQL(" ORDER BY originator_version")
        if limit is not None:
            statement += sql.SQL(" LIMIT %s")
            params.append(limit)
        with self._ds.get_connection() as conn:
            found = conn.execute(statement, params, prepare=True).fetchall()
        return [(row["originator_version"], row["topic"], bytes(row["state"])) for row in found]

    def stream_version(self, instance_id: str) -> int:
        statement = sql.SQL(
            "SELECT max(originator_version) AS version FROM {} WHERE originator_id = %s"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE))
        with self._ds.get_connection() as conn:
            row = conn.execute(statement, (instance_id,), prepare=True).fetchone()
        return 0 if row is None or row["version"] is None else int(row["version"])

    # -- meta and chain heads ---------------------------------------------------------------

    def read_meta(self, key: str) -> str | None:
        statement = sql.SQL("SELECT value FROM {} WHERE key = %s").format(
            sql.Identifier(self.schema, META_TABLE)
        )
        with self._ds.get_connection() as conn:
            row = conn.execute(statement, (key,)).fetchone()
        return None if row is None else str(row["value"])

    def write_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        conflict = "DO UPDATE SET value = EXCLUDED.value" if replace else "DO NOTHING"
        statement = sql.SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) " + conflict).format(
            sql.Identifier(self.schema, META_TABLE)
        )
        with self._ds.get_connection() as conn:
            conn.execute(statement, (key, value))

    def first_sealed_row(self) -> int | None:
        statement = sql.SQL(
            "SELECT min(notification_id) AS found FROM {} WHERE substring(state from 1 for 4) = %s"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE))
        with self._ds.get_connection() as conn:
            row = conn.execute(statement, (MAGIC,)).fetchone()
        return None if row is None or row["found"] is None else int(row["found"])

    def newest_row_id(self) -> int:
        # Not the settled prefix (``last_row_id``): a row committed while an older transaction
        # elsewhere on the server is still open was written before the key all the same.
        statement = sql.SQL("SELECT coalesce(max(notification_id), 0) AS last FROM {}").format(
            sql.Identifier(self.schema, EVENTS_TABLE)
        )
        with self._ds.get_connection() as conn:
            row = conn.execute(statement).fetchone()
        return 0 if row is None else int(row["last"])

    def last_positions(self) -> dict[str, int]:
        statement = sql.SQL(
            "SELECT originator_id, max(originator_version) AS last FROM {} GROUP BY originator_id"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE))
        with self._ds.get_connection() as conn:
            rows = conn.execute(statement).fetchall()
        return {str(row["originator_id"]): int(row["last"]) for row in rows}

    def row_id(self, instance_id: str, last_position: int) -> int | None:
        statement = sql.SQL(
            "SELECT notification_id FROM {} WHERE originator_id = %s AND originator_version = %s"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE))
        with self._ds.get_connection() as conn:
            row = conn.execute(statement, (instance_id, last_position)).fetchone()
        return None if row is None else int(row["notification_id"])

    def select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        heads = sql.Identifier(self.schema, HEADS_TABLE)
        with self._ds.get_connection() as conn:
            found = conn.execute(
                "SELECT 1 AS found FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attname = 'chain' AND NOT attisdropped",
                (f'"{self.schema}"."{HEADS_TABLE}"',),
            ).fetchone()
            if found is None:  # a store made before the chain (read, never changed)
                return {}
            statement = sql.SQL(
                "SELECT instance_id, version, chain FROM {} WHERE chain IS NOT NULL"
            ).format(heads)
            if instance_id is None:
                rows = conn.execute(statement).fetchall()
            else:
                rows = conn.execute(
                    statement + sql.SQL(" AND instance_id = %s"), (instance_id,)
                ).fetchall()
        return {str(r["instance_id"]): (int(r["version"]), bytes(r["chain"])) for r in rows}

    # -- appends ------------------------------------------------------------------------------

    def insert_rows(self, rows: Sequence[Insert]) -> list[int | ConcurrencyConflictError]:
        """Every row in one call of ``steplog_append``: one transaction, one commit. A row whose
        stream has moved comes back ``NULL`` (nothing of it written) and becomes its conflict,
        with the stream's version read afterwards."""
        columns = append_columns(rows)
        recorder = self.recorder
        with self._ds.get_connection() as conn:  # autocommit: the call is the transaction
            found = conn.execute(recorder.append_sql, columns, prepare=True).fetchone()
        written: list[int | None] = [] if found is None else found["written"]
        outcomes: list[int | ConcurrencyConflictError] = []
        for (instance_id, expected, _), row_id in zip(rows, written, strict=True):
            if row_id is None:
                try:
                    actual: int | None = self.stream_version(instance_id)
                except Exception:  # the conflict is the answer; its version is a courtesy
                    actual = None
                outcomes.append(ConcurrencyConflictError(instance_id, expected, actual))
            else:
                outcomes.append(int(row_id))
        recorder.own_rows.wrote(max((o for o in outcomes if isinstance(o, int)), default=0))
        return outcomes

    # -- the global log -----------------------------------------------------------------------

    def select_rows(self, *, after: int = 0, limit: int, upto: int | None = None) -> list[LogRow]:
        """Settled rows only (``SETTLED``): a prefix of the log by row id, so a reader that
        moves past a row never misses one committed later below it."""
        self._settle_own_rows()
        recorder = self.recorder
        params: tuple[Any, ...] = (
            after,
            _MAX_ID if upto is None else upto,
            True,
            [],
            limit,
        )
        with self._ds.get_connection() as conn:
            rows = conn.execute(recorder.settled_rows_sql, params, prepare=True).fetchall()
        return [
            (
                row["notification_id"],
                row["originator_id"],
                row["originator_version"],
                row["topic"],
                bytes(row["state"]),
            )
            for row in rows
        ]

    def last_row_id(self) -> int:
        self._settle_own_rows()
        return int(self.recorder.max_notification_id() or 0)

    def _settle_own_rows(self) -> None:
        """Wait (briefly) until the rows this store appended are settled, so that its own global
        reads see its own appends, as on the other backends.

        A committed row is settled once every transaction older than it has ended, anywhere on
        the server (transaction ids are server-wide): usually within a commit's time, but a
        long transaction holds it back. So the wait is bounded by ``OWN_ROWS_WAIT``, once per
        appended row; past it, reads return the settled prefix without the row, which readers
        get later, in order. No query at all when nothing was appended since the last check."""
        recorder = self.recorder
        written = recorder.own_rows.pending()
        if not written:
            return
        deadline = time.monotonic() + OWN_ROWS_WAIT
        while True:
            settled = int(recorder.max_notification_id() or 0)
            if settled >= written or time.monotonic() >= deadline:
                recorder.own_rows.settled(written)
                return
            time.sleep(0.001)

    def wait_for_appends(
        self, *, newer: Callable[[], bool], timeout: float, stop: threading.Event
    ) -> None:
        listener = getattr(self._local, "listener", None)
        if listener is None:
            try:
                listener = self._connect(5.0)
                listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            except psycopg.Error:
                stop.wait(timeout)
                return
            self._local.listener = listener
            with self._listeners_lock:
                self._listeners.append(listener)
        if newer():
            return
        try:
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                break
        except psycopg.Error:
            self._local.listener = None
            stop.wait(timeout)

    # -- leases -------------------------------------------------------------------------------

    def _create_leases_table(self) -> None:
        """Create the leases table if missing (run by create=True opens, under the setup lock)."""
        with self._ds.get_connection() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (instance_id text PRIMARY KEY, "
                    "holder text NOT NULL, expires bigint NOT NULL)"
                ).format(self._leases)
            )

    @property
    def _leases(self) -> sql.Identifier:
        return sql.Identifier(self.schema, LEASES_TABLE)

    def acquire_lease(
        self, instance_id: str, holder: str, *, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        stale_holder, stale_expires = replace if replace is not None else (None, None)
        statement = sql.SQL(_ACQUIRE_SQL).format(table=self._leases)
        params = (instance_id, holder, expires, stale_holder, stale_expires)
        with self._ds.get_connection() as conn:  # autocommit: one statement, one transaction
            return conn.execute(statement, params).fetchone() is not None

    def renew_lease(self, instance_id: str, holder: str, *, expires: int) -> bool:
        statement = sql.SQL(
            "UPDATE {} SET expires = %s WHERE instance_id = %s AND holder = %s RETURNING holder"
        ).format(self._leases)
        with self._ds.get_connection() as conn:
            return conn.execute(statement, (expires, instance_id, holder)).fetchone() is not None

    def release_lease(self, instance_id: str, holder: str) -> None:
        statement = sql.SQL("DELETE FROM {} WHERE instance_id = %s AND holder = %s").format(
            self._leases
        )
        with self._ds.get_connection() as conn:
            conn.execute(statement, (instance_id, holder))

    def read_lease(self, instance_id: str) -> tuple[str, int] | None:
        statement = sql.SQL("SELECT holder, expires FROM {} WHERE instance_id = %s").format(
            self._leases
        )
        with self._ds.get_connection() as conn:
            # A reader of a store made before leases has no such table: that is no lease.
            if not conn.execute(_TABLES_SQL, (self.schema, [LEASES_TABLE])).fetchall():
                return None
            row = conn.execute(statement, (instance_id,)).fetchone()
        return None if row is None else (str(row["holder"]), int(row["expires"]))

    def leases_missing(self) -> bool:
        with self._ds.get_connection() as conn:
            return not conn.execute(_TABLES_SQL, (self.schema, [LEASES_TABLE])).fetchall()

    def rewrite_rows(self, changes: Sequence[RowChange]) -> list[bool]:
        update = sql.SQL(
            "UPDATE {} SET topic = %s, state = %s "
            "WHERE originator_id = %s AND originator_version = %s AND state = %s"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE))
        with self._ds.get_connection() as conn, conn.transaction():
            return [conn.execute(update, change).rowcount == 1 for change in changes]

    def compact(self, *, tables: Sequence[str] = ()) -> None:
        """``VACUUM FULL`` of the events table and of ``tables`` (of the store's schema), which
        drops the old row versions an ``UPDATE`` leaves behind."""
        with self._ds.get_connection() as conn:
            for name in [EVENTS_TABLE, *tables]:
                conn.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(self.schema, name)))

    def close(self) -> None:
        with self._listeners_lock:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.close()
        self._ds.close()

    def refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
        if isinstance(driver_error(error, PoolTimeout), PoolTimeout):
            return StoreUnavailableError, f"no connection within the timeout; {_SERVER}"
        cause = driver_error(error, psycopg.Error)
        state = getattr(cause, "sqlstate", None)
        if cause is not None and StoreDamagedError.detects(cause):
            return StoreDamagedError, (
                f"PostgreSQL reports the data of {self.url} damaged; waiting will not help: "
                "restore it from a backup"
            )
        if not isinstance(state, str):
            return kind, _SERVER if kind is StoreUnavailableError else ""
        return _SQLSTATE_HINTS.get(state) or _SQLSTATE_HINTS.get(state[:2]) or (kind, "")


class PostgresStore(EventStore):
    """Events in a PostgreSQL schema, shared by any number of processes.

    With ``create=True`` the schema, tables and append function are created when missing (processes
    take turns on an advisory lock). With ``create=False`` the server is only asked whether the
    schema holds steplog's tables: no DDL, no lock, no row; ``StoreNotFoundError`` when it does not.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        pool_size: int = 2,
        max_overflow: int = 4,
        connect_timeout: float = 5.0,
        **options: Any,
    ) -> None:
        if options:
            raise StoreConfigError(f"unknown PostgreSQL store options: {sorted(options)}")
        backend = PostgresBackend(
            url,
            create=create,
            pool_size=pool_size,
            max_overflow=max_overflow,
            connect_timeout=connect_timeout,
        )
        self._postgres = backend
        self.schema: str = backend.schema
        """The PostgreSQL schema the store's tables are in."""
        super().__init__(backend, url=backend.url)

    @property
    def datastore(self) -> PostgresDatastore:
        """eventsourcing's datastore behind this store: its connections and transactions, for
        programs (such as materialized views) that keep their own tables in the same database."""
        return self._postgres.datastore
