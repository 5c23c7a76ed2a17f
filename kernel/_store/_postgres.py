"""The PostgreSQL adapter: eventsourcing's PostgreSQL recorder, for many processes on one database.

Writers of different instances commit in parallel: no table lock. An append is one CALL (one
round trip) that compares and sets the stream's version on its heads row (only writers of the
same instance wait, on that row) and inserts the batch's row, tagged with its transaction id.
Row ids are handed out in transaction-id order, so the rows of transactions older than the
oldest one still running (``pg_snapshot_xmin``) are a prefix of the log: global reads return
only those ("settled"), and a follower never passes a row that could still commit below it.
Followers wake on LISTEN/NOTIFY instead of polling. ``docs/scaling.md`` has the whole argument.
``PostgresRecorder`` (``_pgrecorder``), a subclass of eventsourcing's recorder, holds the SQL and
passes eventsourcing's own recorder test cases.

Longer than 600 lines because ``PostgresBackend`` is one class: its setup, rows, chain heads, meta
values, leases and followers share one connection pool and one schema, and each part is short.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote

import psycopg
from eventsourcing.postgres import PostgresDatastore
from psycopg import sql
from psycopg_pool import PoolTimeout

from kernel._base._errors import (
    ConcurrencyConflictError,
    SchemaVersionError,
    StoreBusyError,
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
from kernel._store._core import STORE_SCHEMA_VERSION, newer_schema
from kernel._store._eventstore import EventStore
from kernel._store._pgrecorder import (
    _MAX_ID,
    EVENTS_TABLE,
    HEADS_TABLE,
    WRITE_FUNCTION,
    PostgresRecorder,
    append_columns,
)

__all__ = [
    "EVENTS_TABLE",
    "HEADS_TABLE",
    "META_TABLE",
    "WRITE_FUNCTION",
    "PostgresBackend",
    "PostgresRecorder",
    "PostgresStore",
    "append_columns",
    "postgres_params",
]

OWN_ROWS_WAIT = 1.0
"""Seconds a store's global read waits for its own appended rows to settle (see
``PostgresStore._settle_own_rows``)."""
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
    "08": (StoreBusyError, _SERVER),  # connection exception: lost, or not made
    "57": (StoreUnavailableError, _SERVER),  # operator intervention (server shutting down)
    "53": (StoreUnavailableError, "the server is out of resources (connections, memory, disk)"),
    "28": (StoreUnavailableError, "check the user name and password"),
    "3D000": (StoreNotFoundError, "the database does not exist; create it first"),
    "42501": (StoreUnavailableError, "this user lacks a privilege it needs on the schema"),
    "55P03": (StoreBusyError, "another session holds a lock; retry"),
    "40P01": (StoreBusyError, "a deadlock was broken; retry"),
    "40001": (StoreBusyError, "a serialization failure; retry"),
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
        if newer() or stop.is_set():
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
            return StoreBusyError, f"no connection within the timeout; {_SERVER}"
        cause = driver_error(error, psycopg.Error)
        state = getattr(cause, "sqlstate", None)
        if cause is not None and StoreDamagedError.detects(cause):
            return StoreDamagedError, (
                f"PostgreSQL reports the data of {self.url} damaged; waiting will not help: "
                "restore it from a backup"
            )
        if not isinstance(state, str):  # no answer from the server: the connection was lost
            return (StoreBusyError, _SERVER) if kind is StoreUnavailableError else (kind, "")
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
