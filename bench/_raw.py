"""The physical limit: raw sqlite3 / psycopg writing the same rows as steplog, one transaction
per superstep (or per row, for steplog's ``durability="write"``), and nothing else.

The table has the columns and primary key of steplog's store (eventsourcing's recorder table):
``originator_id, originator_version, topic, state`` (+ PostgreSQL's ``notification_id`` bigserial
with its unique index). SQLite runs in WAL mode with ``synchronous=FULL``, as steplog's store
does; PostgreSQL runs with the server's settings (printed in the report header).
"""

from __future__ import annotations

import sqlite3
import uuid

from bench._core import Config, Measurement, expect
from bench._db import fresh_schema, pg_connect, pg_schema_bytes, remove_sqlite, sqlite_bytes
from bench._rows import RowShape
from bench._timing import timed

__all__ = ["PG_TABLE_DDL", "SQLITE_TABLE_DDL", "raw_psycopg_run", "raw_sqlite_run"]

SQLITE_TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS steplog_events (originator_id TEXT, originator_version INTEGER, "
    "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
)
PG_TABLE_DDL = (
    'CREATE TABLE "{schema}".steplog_events (originator_id text NOT NULL, '
    "originator_version bigint NOT NULL, topic text, state bytea, notification_id bigserial, "
    "PRIMARY KEY (originator_id, originator_version));"
    'CREATE UNIQUE INDEX ON "{schema}".steplog_events (notification_id)'
)


def _batches(
    shape: RowShape, instance: str, supersteps: int
) -> list[list[tuple[str, int, str, bytes]]]:
    """Every superstep's rows, built before the clock starts."""
    version = 0
    batches = []
    for step in range(supersteps):
        batch = []
        for topic, state in shape.rows(step):
            version += 1
            batch.append((instance, version, topic, state))
        batches.append(batch)
    return batches


def raw_sqlite_run(
    cfg: Config, shape: RowShape, supersteps: int, *, txn_per_row: bool
) -> Measurement:
    path = cfg.workdir / f"raw-{uuid.uuid4().hex[:8]}.db"
    instance = "raw-bench"
    batches = _batches(shape, instance, supersteps)
    insert = "INSERT INTO steplog_events VALUES (?, ?, ?, ?)"
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(SQLITE_TABLE_DDL)
            empty = sqlite_bytes(path)

            def work() -> None:
                execute = conn.execute
                if txn_per_row:
                    for batch in batches:
                        for row in batch:
                            execute("BEGIN")
                            execute(insert, row)
                            execute("COMMIT")
                else:
                    executemany = conn.executemany
                    for batch in batches:
                        execute("BEGIN")
                        executemany(insert, batch)
                        execute("COMMIT")

            _, seconds = timed(work)
            count = conn.execute("SELECT COUNT(*) FROM steplog_events").fetchone()[0]
            expect(count, sum(len(b) for b in batches), "raw sqlite3 rows written")
        finally:
            conn.close()
        grown = sqlite_bytes(path) - empty
    finally:
        remove_sqlite(path)
    return Measurement(supersteps / seconds, bytes_per_step=grown / supersteps)


def raw_psycopg_run(cfg: Config, shape: RowShape, supersteps: int) -> Measurement:
    instance = "raw-bench"
    batches = _batches(shape, instance, supersteps)
    with fresh_schema(cfg, "raw") as schema:
        with pg_connect(cfg.pg_url, autocommit=True) as conn:
            conn.execute(PG_TABLE_DDL.format(schema=schema))
        empty = pg_schema_bytes(cfg.pg_url, schema)
        insert = (
            f'INSERT INTO "{schema}".steplog_events '
            "(originator_id, originator_version, topic, state) VALUES (%s, %s, %s, %s)"
        )
        with pg_connect(cfg.pg_url) as conn:

            def work() -> None:
                for batch in batches:
                    with conn.cursor() as cur:
                        cur.executemany(insert, batch)
                    conn.commit()

            _, seconds = timed(work)
            row = conn.execute(f'SELECT COUNT(*) FROM "{schema}".steplog_events').fetchone()
            conn.commit()
            expect(
                row[0] if row else None, sum(len(b) for b in batches), "raw psycopg rows written"
            )
        grown = pg_schema_bytes(cfg.pg_url, schema) - empty
    return Measurement(supersteps / seconds, bytes_per_step=grown / supersteps)
