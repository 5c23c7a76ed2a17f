"""The PostgreSQL adapter: eventsourcing's PostgreSQL recorder, for many processes on one database.

Appends take eventsourcing's table lock, so global positions become visible in commit order and a
follower never skips an event that commits later with a lower id. Followers wake on
LISTEN/NOTIFY instead of polling.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql

from kernel._errors import SchemaVersionError, StoreConfigError, StoreError, StoreUnavailableError
from kernel._store import STORE_SCHEMA_VERSION, EventStore

__all__ = ["PostgresStore", "postgres_params"]

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
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


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


class PostgresStore(EventStore):
    """Events in a PostgreSQL schema, shared by any number of processes."""

    def __init__(
        self,
        url: str,
        *,
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
        with self._setup_turn(url, connect_timeout):
            self._open(url, pool_size, max_overflow, connect_timeout)

    def _open(self, url: str, pool_size: int, max_overflow: int, connect_timeout: float) -> None:
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
        recorder = PostgresApplicationRecorder(self._ds, events_table_name=EVENTS_TABLE)
        super().__init__(recorder, url=_redact(url))
        self._channel = recorder.channel_name
        table = sql.Identifier(self.schema, EVENTS_TABLE)
        function = sql.Identifier(self.schema, APPEND_FUNCTION)
        self._append_sql = sql.SQL("SELECT * FROM {}(%s, %s, %s, %s)").format(function)
        self._create_append_sql = sql.SQL(_APPEND_FUNCTION_SQL).format(
            function=function, table=table, channel=sql.Identifier(self._channel)
        )
        try:
            with self._translated("create the tables"):
                recorder.create_table()
                self._stamp_schema_version()
                with self._ds.transaction(commit=True) as cursor:
                    cursor.execute(self._create_append_sql)
        except BaseException:
            self._ds.close()
            raise

    def _insert(self, stored: list[StoredEvent]) -> list[int]:
        """One round trip: the append function locks, notifies and inserts; autocommit commits."""
        columns = (
            [str(s.originator_id) for s in stored],
            [s.originator_version for s in stored],
            [s.topic for s in stored],
            [s.state for s in stored],
        )
        try:
            with self._ds.get_connection() as conn:
                rows = conn.execute(self._append_sql, columns, prepare=True).fetchall()
        except IntegrityError:  # the datastore translated psycopg's UniqueViolation
            raise
        return [row[APPEND_FUNCTION] for row in rows]

    def _connect(self, connect_timeout: float) -> psycopg.Connection[Any]:
        p = self._params
        return psycopg.connect(
            dbname=p["dbname"],
            host=p["host"],
            port=p["port"],
            user=p["user"],
            password=p["password"] or None,
            connect_timeout=max(1, int(connect_timeout)),
            autocommit=True,
        )

    @contextmanager
    def _setup_turn(self, url: str, connect_timeout: float) -> Iterator[None]:
        """Reach the server, then create the schema and tables while no other process does.

        ``CREATE ... IF NOT EXISTS`` is not safe against the same statement running concurrently
        (it fails with a duplicate key or "tuple concurrently updated"), so processes opening a
        new store at once take turns on an advisory lock named after the schema. The lock is
        released when its connection closes.
        """
        try:
            conn = self._connect(connect_timeout)
        except psycopg.OperationalError as error:
            raise StoreUnavailableError(
                f"cannot reach PostgreSQL for {_redact(url)}: {str(error).strip()}; check that "
                "the server is running, the host, port, user and database are right, and that "
                "this user may connect"
            ) from error
        with conn:
            try:
                conn.execute(
                    "SELECT pg_advisory_lock(hashtext(%s))", (f"steplog setup {self.schema}",)
                )
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                )
            except psycopg.Error as error:
                raise StoreUnavailableError(
                    f"cannot prepare schema {self.schema!r} in {_redact(url)}: {error}"
                ) from error
            yield

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
            cursor.execute(sql.SQL("SELECT value FROM {} WHERE key='schema_version'").format(table))
            row = cursor.fetchone()
        if row is not None and int(row["value"]) > STORE_SCHEMA_VERSION:
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

    def close(self) -> None:
        if not self._closed:
            with self._listeners_lock:
                listeners, self._listeners = self._listeners, []
            for listener in listeners:
                listener.close()
            self._ds.close()
        super().close()

    def _translate(self, error: PersistenceError, action: str) -> StoreError:
        text = str(error).strip()
        if "connection" in text.lower() or "timeout" in text.lower():
            return StoreUnavailableError(
                f"cannot {action} in {self.url}: {text}; is the PostgreSQL server still running?"
            )
        return StoreError(f"cannot {action} in {self.url}: {text}")

    def _translate_driver(self, error: Exception, action: str) -> StoreError | None:
        if isinstance(error, psycopg.OperationalError):
            return StoreUnavailableError(f"cannot {action} in {self.url}: {error}")
        if isinstance(error, psycopg.Error):
            return StoreError(f"cannot {action} in {self.url}: {error}")
        try:
            from psycopg_pool import PoolTimeout
        except ImportError:  # pragma: no cover - psycopg_pool is a dependency
            return None
        if isinstance(error, PoolTimeout):
            return StoreUnavailableError(
                f"cannot {action} in {self.url}: no connection within the timeout ({error}); "
                "is the PostgreSQL server running?"
            )
        return None
