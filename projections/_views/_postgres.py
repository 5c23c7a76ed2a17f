"""View tables in the store's PostgreSQL schema: ``PostgresViewBackend``.

Its statements quote the schema and use ``%s`` placeholders; a swap locks the positions rows
before the tables (``_lock_positions``); a lock (``lock``) is a session advisory lock; psycopg's
contention and lost-connection errors are told apart by SQLSTATE. psycopg is imported only when
one of its errors is looked at, so importing this module never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tenacity import (
    Retrying,
    retry_if_result,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from kernel import Keyring, StoreError
from projections._views._backends import check_table
from projections._views._sqlbackends import _SQLBackend

__all__ = ["PostgresViewBackend"]


class PostgresViewBackend(_SQLBackend):
    """View tables in the store's PostgreSQL schema."""

    mark = "%s"
    sql_claim_insert = "INSERT INTO {p} (name, position) VALUES (%s, 0) ON CONFLICT DO NOTHING"
    sql_claim_select = "SELECT position FROM {p} WHERE name=%s FOR UPDATE"
    sql_exists = "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname=%s AND tablename=%s"

    def __init__(
        self,
        datastore: Any,
        url: str,
        schema: str,
        *,
        keyring: Keyring | None = None,
        classify: Callable[[BaseException], type[StoreError] | None],
    ) -> None:
        super().__init__(datastore, url, keyring=keyring, classify=classify)
        self._schema = schema

    def name(self, table: str) -> str:
        return f'"{self._schema}".{check_table(table)}'

    def _exists_params(self, table: str) -> tuple[str, ...]:
        return (self._schema, table)

    def _lock_positions(self, cursor: Any, tables: Sequence[str]) -> None:
        cursor.execute(
            f"SELECT name FROM {self.positions} WHERE name = ANY(%s) ORDER BY name FOR UPDATE",
            (list(tables),),
        )

    @contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        # A session lock on a connection of its own, taken outside any transaction (the pool's
        # connections are in autocommit), polled until ``timeout``; a lost session frees it.
        key = f"steplog view lock {self._schema}.{check_table(name)}"
        take = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS held"
        attempts = Retrying(
            retry=retry_if_result(lambda held: not held),
            wait=wait_exponential(multiplier=0.02, max=0.5) + wait_random(0, 0.02),
            stop=stop_after_delay(max(timeout, 0)),
            retry_error_callback=lambda _: False,
        )
        with self._errors(f"hold the lock {name!r}"), self._datastore.get_connection() as conn:
            held = bool(attempts(lambda: conn.execute(take, (key,)).fetchone()["held"]))
            try:
                yield held
            finally:
                if held:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

    def _consistent_reads(self, cursor: Any) -> None:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def _rename_constraint(self, cursor: Any, table: str, shadow: str) -> None:
        cursor.execute(
            f"ALTER TABLE {self.name(table)} RENAME CONSTRAINT {shadow}_pk TO {table}_pk"
        )
