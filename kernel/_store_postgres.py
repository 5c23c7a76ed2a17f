"""The PostgreSQL adapter: eventsourcing's PostgreSQL recorder, for many processes on one database.

Appends take eventsourcing's table lock, so global positions become visible in commit order and a
follower never skips an event that commits later with a lower id. Followers wake on
LISTEN/NOTIFY instead of polling. The one-round-trip append lives in ``PostgresRecorder``, a
subclass of eventsourcing's recorder that passes eventsourcing's own recorder test cases.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql
from psycopg_pool import PoolTimeout

from kernel._errors import (
    SchemaVersionError,
    StoreConfigError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from kernel._store import (
    PERSISTENCE_ERRORS,
    STORE_SCHEMA_VERSION,
    ErrorTable,
    EventStore,
    driver_error,
    error_class,
)

__all__ = ["PostgresRecorder", "PostgresStore", "postgres_params"]

EVENTS_TABLE = "steplog_events"
APPEND_FUNCTION = "steplog_append"

# Appends take the table's EXCLUSIVE lock so that notification ids become visible in commit order
# (readers never skip an id that commits later), wake LISTENing followers, and insert the batch
# from parallel arrays; called in autocommit mode, the whole append is one round trip.
_APPEND_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION {function}(
    ids text[], versions bigint[], topics text[], states bytea[]
) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE {table} IN EXCLUSIVE MODE;
    NOTIFY {channel};
    RETURN QUERY
        INSERT INTO {table} (originator_id, originator_version, topic, state)
        SELECT * FROM unnest(ids, versions, topics, states)
        RETURNING notification_id;
END;
$$
"""
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
    "08": (StoreUnavailableError, _SERVER),  # connection exception
    "57": (StoreUnavailableError, _SERVER),  # operator intervention (server shutting down)
    "53": (StoreUnavailableError, "the server is out of resources (connections, memory, disk)"),
    "28": (StoreUnavailableError, "check the user name and password"),
    "3D000": (StoreNotFoundError, "the database does not exist; create it first"),
    "42501": (StoreUnavailableError, "this user lacks a privilege it needs on the schema"),
    "55P03": (StoreUnavailableError, "another session holds a lock; retry"),
    "40P01": (StoreUnavailableError, "a deadlock was broken; retry"),
}
_TABLES_SQL = (
    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = ANY(%s)"
)


def postgres_params(url: str) -> dict[str, Any]:
    """Connection parameters from ``postgresql://user[:password]@host[:port]/db[?schema=name]``."""
    parts = urlsplit(url)
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise StoreConfigError(
            f"PostgreSQL URL {_redact(url)!r} names no database; use postgresql://user@host:5432/db"
        )
    try:
        port = parts.port or 5432
    except ValueError as error:
        raise StoreConfigError(
            f"PostgreSQL URL {_redact(url)!r} has a bad port: {error}"
        ) from error
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


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class PostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL application recorder, with steplog's one-round-trip append.

    ``create_table`` also creates the append function (``steplog_append``): it takes the table's
    EXCLUSIVE lock (as eventsourcing's insert does, so ids become visible in commit order),
    notifies the channel, and inserts the batch from parallel arrays. ``insert_events`` calls it
    once, in autocommit mode. Errors are eventsourcing's (``IntegrityError`` for a duplicate).
    """

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = self.datastore.schema
        function = sql.Identifier(schema, APPEND_FUNCTION)
        self.sql_create_statements.append(
            sql.SQL(_APPEND_FUNCTION_SQL).format(
                function=function,
                table=sql.Identifier(schema, events_table_name),
                channel=sql.Identifier(self.channel_name),
            )
        )
        self._append_sql = sql.SQL("SELECT * FROM {}(%s, %s, %s, %s)").format(function)

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
            rows = conn.execute(self._append_sql, columns, prepare=True).fetchall()
        return [row[APPEND_FUNCTION] for row in rows]


class PostgresStore(EventStore):
    """Events in a PostgreSQL schema, shared by any number of processes.

    With ``create=True`` the schema, tables and append function are created when missing (processes
    take turns on an advisory lock). With ``create=False`` the server is only asked whether the
    schema holds steplog's tables: no DDL, no lock, no row; ``StoreNotFoundError`` when it does not.
    """

    _errors = POSTGRES_ERRORS

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
        params = postgres_params(url)
        self._params = params
        self._local = threading.local()  # each following thread's LISTEN connection
        self._listeners: list[psycopg.Connection[Any]] = []
        self._listeners_lock = threading.Lock()
        self.schema: str = params["schema"]
        self.url = _redact(url)
        with self._setup_turn(connect_timeout, create=create):
            self._open(pool_size, max_overflow, connect_timeout, create=create)

    def _open(
        self, pool_size: int, max_overflow: int, connect_timeout: float, *, create: bool
    ) -> None:
        params = self._params
        self._ds = PostgresDatastore(
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
            with self._translated("open the store"):
                recorder = PostgresRecorder(self._ds, events_table_name=EVENTS_TABLE)
            super().__init__(recorder, url=self.url)
            self._channel = recorder.channel_name
            with self._translated("create the tables" if create else "open the store"):
                if create:
                    recorder.create_table()
                    self._stamp_schema_version()
                    self._create_leases_table()  # also in stores made before leases
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
            kind = error_class(error, self._errors) or StoreUnavailableError
            kind, hint = self._refine(error, kind)
            if self._database_is_missing(connect_timeout):
                kind, hint = _SQLSTATE_HINTS["3D000"]
            raise kind(
                f"cannot reach PostgreSQL for {self.url}: {' '.join(str(error).split())}; "
                f"{hint or _SERVER}"
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
                kind, hint = self._refine(error, error_class(error, self._errors) or StoreError)
                text = " ".join(str(error).split())
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
                    "INSERT INTO {} VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING"
                ).format(table),
                (str(STORE_SCHEMA_VERSION),),
            )

    def _check_schema_version(self) -> None:
        table = sql.Identifier(self.schema, META_TABLE)
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(sql.SQL("SELECT value FROM {} WHERE key='schema_version'").format(table))
            row = cursor.fetchone()
        if row is not None and self._newer_schema(row["value"]):
            raise SchemaVersionError(
                f"PostgreSQL store {self.url} was written by a newer steplog (store schema version "
                f"{row['value']}; this steplog knows up to {STORE_SCHEMA_VERSION}); upgrade steplog"
            )

    @property
    def datastore(self) -> PostgresDatastore:
        """eventsourcing's datastore behind this store: its connections and transactions, for
        programs (such as materialized views) that keep their own tables in the same database."""
        return self._ds

    def instances(self) -> list[str]:
        statement = sql.SQL("SELECT DISTINCT originator_id FROM {} ORDER BY 1").format(
            sql.Identifier(self.schema, EVENTS_TABLE)
        )
        with self._translated("list instances"), self._ds.transaction() as cursor:
            cursor.execute(statement)
            return [row["originator_id"] for row in cursor.fetchall()]

    def _select_stream(
        self,
        instance_id: str,
        after: int | None,
        upto: int | None,
        limit: int | None,
        topics: list[str],
    ) -> list[tuple[int, str, bytes]]:
        """A stream read as plain rows, filtered by topic in SQL when no ``limit`` counts them."""
        conditions = [sql.SQL("originator_id = %s")]
        params: list[Any] = [instance_id]
        if after is not None:
            conditions.append(sql.SQL("originator_version > %s"))
            params.append(after)
        if upto is not None:
            conditions.append(sql.SQL("originator_version <= %s"))
            params.append(upto)
        if topics and limit is None:
            conditions.append(sql.SQL("topic = ANY(%s)"))
            params.append(topics)
        statement = sql.SQL(
            "SELECT originator_version, topic, state FROM {} WHERE {} ORDER BY originator_version"
        ).format(sql.Identifier(self.schema, EVENTS_TABLE), sql.SQL(" AND ").join(conditions))
        if limit is not None:
            statement += sql.SQL(" LIMIT %s")
            params.append(limit)
        with self._ds.transaction(commit=False) as cursor:
            cursor.execute(statement, params)
            found = cursor.fetchall()
        wanted = set(topics) if topics and limit is not None else None
        return [
            (row["originator_version"], row["topic"], bytes(row["state"]))
            for row in found
            if wanted is None or row["topic"] in wanted
        ]

    def _wait_for_appends(self, position: int, timeout: float, stop: threading.Event) -> None:
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
        if self.last_position() > position:
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

    def _acquire_lease(
        self, instance_id: str, holder: str, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        stale_holder, stale_expires = replace if replace is not None else (None, None)
        statement = sql.SQL(_ACQUIRE_SQL).format(table=self._leases)
        params = (instance_id, holder, expires, stale_holder, stale_expires)
        with self._ds.get_connection() as conn:  # autocommit: one statement, one transaction
            return conn.execute(statement, params).fetchone() is not None

    def _renew_lease(self, instance_id: str, holder: str, expires: int) -> bool:
        statement = sql.SQL(
            "UPDATE {} SET expires = %s WHERE instance_id = %s AND holder = %s RETURNING holder"
        ).format(self._leases)
        with self._ds.get_connection() as conn:
            return conn.execute(statement, (expires, instance_id, holder)).fetchone() is not None

    def _release_lease(self, instance_id: str, holder: str) -> None:
        statement = sql.SQL("DELETE FROM {} WHERE instance_id = %s AND holder = %s").format(
            self._leases
        )
        with self._ds.get_connection() as conn:
            conn.execute(statement, (instance_id, holder))

    def _read_lease(self, instance_id: str) -> tuple[str, int] | None:
        statement = sql.SQL("SELECT holder, expires FROM {} WHERE instance_id = %s").format(
            self._leases
        )
        with self._ds.get_connection() as conn:
            # A reader of a store made before leases has no such table: that is no lease.
            if not conn.execute(_TABLES_SQL, (self.schema, [LEASES_TABLE])).fetchall():
                return None
            row = conn.execute(statement, (instance_id,)).fetchone()
        return None if row is None else (str(row["holder"]), int(row["expires"]))

    def _leases_missing(self) -> bool:
        with self._ds.get_connection() as conn:
            return not conn.execute(_TABLES_SQL, (self.schema, [LEASES_TABLE])).fetchall()

    def close(self) -> None:
        if not self._closed:
            with self._listeners_lock:
                listeners, self._listeners = self._listeners, []
            for listener in listeners:
                listener.close()
            self._ds.close()
        super().close()

    def _refine(self, error: BaseException, kind: type[StoreError]) -> tuple[type[StoreError], str]:
        if isinstance(driver_error(error, PoolTimeout), PoolTimeout):
            return StoreUnavailableError, f"no connection within the timeout; {_SERVER}"
        cause = driver_error(error, psycopg.Error)
        state = getattr(cause, "sqlstate", None)
        if not isinstance(state, str):
            return kind, _SERVER if kind is StoreUnavailableError else ""
        return _SQLSTATE_HINTS.get(state) or _SQLSTATE_HINTS.get(state[:2]) or (kind, "")
