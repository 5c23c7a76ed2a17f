"""PostgreSQL writers without a table lock: per-instance compare-and-set, a settled-rows reader.

What must hold (``kernel/_store/_postgres.py`` explains the design):

* a follower racing writer processes never skips an event and never sees one twice, and each
  instance's positions reach it in order;
* a stale ``expected_version`` is a ``ConcurrencyConflictError`` and writes nothing; of
  concurrent appends at one version, exactly one wins;
* row ids are handed out in transaction-id order, so the settled rows are a prefix of the log;
* a store made before (table lock, no ``tx_id``, no heads table) opens: ``create=False`` changes
  nothing, ``create=True`` upgrades it.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql

from kernel import ConcurrencyConflictError, EventStore, Recorded, StoreError, open_store
from kernel._log._events import EventBase
from kernel._store._postgres import (
    EVENTS_TABLE,
    HEADS_TABLE,
    META_TABLE,
    WRITE_FUNCTION,
    postgres_params,
)
from kernel.testing import LogBuilder

LEGACY_APPEND = "steplog_append"
"""The name of the table-locking append function of stores made before issue 10."""

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

WAIT = 60.0


def _batch(instance_id: str, version: int, size: int) -> list[EventBase]:
    """``size`` events continuing ``instance_id`` after ``version``."""
    log = LogBuilder(instance_id, version=version)
    for n in range(size):
        log.write("n", version + n + 1, executor_id="w", superstep=f"s{version}", run="r")
    (batch,) = log.drain()
    return batch


def _server(url: str) -> tuple[str, str]:
    """The server URL without the schema, and the schema."""
    return url.split("?")[0], postgres_params(url)["schema"]


def _seen(recorded: Recorded) -> tuple[int, str, int]:
    return recorded.global_position, recorded.event.instance_id, recorded.event.position


# -- writer processes ---------------------------------------------------------------------------


def _writer(url: str, own: str, shared: str, appends: int, go: Any, out: Any) -> None:
    """Append ``appends`` batches of 1 to 3 events: to ``own``, and every third one to
    ``shared``, which every writer appends to (re-reading its version after a conflict)."""
    conflicts = 0
    with open_store(url) as store:
        go.wait()
        for k in range(appends):
            target = shared if k % 3 == 2 else own
            while True:
                version = store.version(target)
                try:
                    store.append(
                        target, _batch(target, version, 1 + k % 3), expected_version=version
                    )
                    break
                except ConcurrencyConflictError:
                    conflicts += 1
    out.put(conflicts)


class Follower:
    """``store.follow`` in a thread, recording what it yields."""

    def __init__(self, store: EventStore, after: int) -> None:
        self.store = store
        self.seen: list[tuple[int, str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(after,), daemon=True)
        self.thread.start()

    def _run(self, after: int) -> None:
        for recorded in self.store.follow(after=after, stop=self.stop, poll_interval=0.05):
            self.seen.append(_seen(recorded))

    def finish(self) -> list[tuple[int, str, int]]:
        """Wait until the follower has reached the log's last position, then stop it."""
        deadline = time.monotonic() + WAIT
        last = self.store.last_position()
        while (not self.seen or self.seen[-1][0] < last) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.stop.set()
        self.thread.join(WAIT)
        return self.seen


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[EventStore]:
    with open_store(postgres_url) as opened:
        yield opened


@pytest.mark.parametrize("writers", [4])
def test_a_follower_racing_writer_processes_skips_nothing_and_repeats_nothing(
    pg_store: EventStore, postgres_url: str, writers: int
) -> None:
    store = pg_store
    ctx = mp.get_context("spawn")
    position = 0
    conflicts = 0
    for round_ in range(3):
        go, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_writer,
                args=(postgres_url, f"w{i}-r{round_}", f"shared-r{round_}", 30, go, out),
            )
            for i in range(writers)
        ]
        for proc in procs:
            proc.start()
        follower = Follower(store, after=position)
        go.set()
        conflicts += sum(out.get(timeout=WAIT) for _ in procs)
        for proc in procs:
            proc.join(WAIT)
            assert proc.exitcode == 0
        seen = follower.finish()
        final = [_seen(r) for r in store.iter_all(after=position)]
        assert len(final) > 0
        assert seen == final  # no gap, no duplicate, the same order
        by_instance: dict[str, list[int]] = {}
        for _, instance_id, event_position in seen:
            by_instance.setdefault(instance_id, []).append(event_position)
        for instance_id, positions in by_instance.items():
            assert positions == list(range(1, store.version(instance_id) + 1)), instance_id
        position = final[-1][0]
    _assert_row_ids_follow_transaction_ids(postgres_url)
    assert conflicts >= 0  # the shared streams make conflicts likely, never required


def _assert_row_ids_follow_transaction_ids(url: str) -> None:
    """In row-id order, transaction ids never go down: the settled rows are a prefix."""
    server, schema = _server(url)
    with psycopg.connect(server) as conn:
        rows = conn.execute(
            sql.SQL("SELECT tx_id::text FROM {} ORDER BY notification_id").format(
                sql.Identifier(schema, EVENTS_TABLE)
            )
        ).fetchall()
    tx_ids = [int(row[0]) for row in rows]
    assert tx_ids == sorted(tx_ids)


# -- versions -----------------------------------------------------------------------------------


def test_a_stale_expected_version_is_a_conflict_and_writes_nothing(pg_store: EventStore) -> None:
    store = pg_store
    store.append("a", _batch("a", 0, 3), expected_version=0)
    before = [_seen(r) for r in store.read_all()]
    for stale in (0, 1, 2):  # behind, inside the last batch: no position clash for 1 and 2
        with pytest.raises(ConcurrencyConflictError) as caught:
            store.append("a", _batch("a", stale, 2), expected_version=stale)
        assert caught.value.actual_version == 3
    with pytest.raises(ConcurrencyConflictError):
        store.append("a", _batch("a", 5, 1), expected_version=5)  # ahead: a gap
    with pytest.raises(ConcurrencyConflictError):
        store.append("new", _batch("new", 2, 1), expected_version=2)  # no such stream yet
    assert [_seen(r) for r in store.read_all()] == before
    assert store.version("a") == 3
    assert store.version("new") == 0
    store.append("a", _batch("a", 3, 1), expected_version=3)
    assert store.version("a") == 4


def test_concurrent_appends_at_one_version_have_exactly_one_winner(postgres_url: str) -> None:
    stores = [open_store(postgres_url) for _ in range(4)]
    try:
        for version in range(0, 40, 4):
            barrier = threading.Barrier(len(stores))
            won: list[int] = []

            def append(
                k: int,
                store: EventStore,
                version: int = version,
                barrier: threading.Barrier = barrier,
                won: list[int] = won,
            ) -> None:
                batch = _batch("one", version, 1 + k)  # different sizes: no position clash
                barrier.wait()
                try:
                    store.append("one", batch, expected_version=version)
                    won.append(k)
                except ConcurrencyConflictError:
                    pass

            threads = [threading.Thread(target=append, args=(k, s)) for k, s in enumerate(stores)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
            assert len(won) == 1
            # the winner's batch is the stream now; the next round must start at its version
            grown = stores[0].version("one")
            assert grown == version + 1 + won[0]
            if grown != version + 4:
                stores[0].append(
                    "one", _batch("one", grown, version + 4 - grown), expected_version=grown
                )
        events = stores[0].read("one")
        assert [e.position for e in events] == list(range(1, 41))
    finally:
        for s in stores:
            s.close()


def test_a_group_commit_writes_every_batch_but_the_conflicting_one(pg_store: EventStore) -> None:
    store = pg_store
    store.append("b", _batch("b", 0, 2), expected_version=0)
    results = store.append_many(
        [
            ("a", _batch("a", 0, 2), 0),
            ("b", _batch("b", 0, 1), 0),  # stale: b is at 2
            ("a", _batch("a", 2, 1), 2),  # follows the first batch, in the same transaction
            ("c", _batch("c", 0, 3), 0),
        ]
    )
    assert isinstance(results[1], ConcurrencyConflictError)
    assert results[1].actual_version == 2
    assert [len(r) for r in results if isinstance(r, list)] == [2, 1, 3]
    assert (store.version("a"), store.version("b"), store.version("c")) == (3, 2, 3)
    log = [(r.event.instance_id, r.event.position) for r in store.read_all()]
    assert log == [("b", 1), ("b", 2), ("a", 1), ("a", 2), ("a", 3), ("c", 1), ("c", 2), ("c", 3)]


def test_a_row_taking_its_id_before_the_streams_last_row_is_refused(
    pg_store: EventStore, postgres_url: str
) -> None:
    store = pg_store
    """An append sent before the previous one of its stream committed can hold a smaller row id
    than that one: written, the stream's positions would go backwards in the global log. The
    heads row's last row id refuses it (here the race is staged by raising that id)."""
    store.append("a", _batch("a", 0, 1), expected_version=0)
    server, schema = _server(postgres_url)
    with psycopg.connect(server) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET last_row = last_row + 1000").format(
                sql.Identifier(schema, HEADS_TABLE)
            )
        )
    with pytest.raises(ConcurrencyConflictError):
        store.append("a", _batch("a", 1, 1), expected_version=1)
    assert store.version("a") == 1


# -- settled rows -------------------------------------------------------------------------------


def test_readers_do_not_pass_a_row_while_an_older_transaction_is_open(
    pg_store: EventStore, postgres_url: str
) -> None:
    store = pg_store
    """U takes its row id and stays open; T appends after it and commits. A reader must not
    return T's row (it would move past U's lower id) until U has committed."""
    server, schema = _server(postgres_url)
    row = _batch("u", 0, 1)
    stored = store._mapper.to_row(row)  # the row the store would write
    with psycopg.connect(server) as u:
        u.execute(
            sql.SQL("SELECT {}(%s, %s, %s, %s, %s, %s)").format(
                sql.Identifier(schema, WRITE_FUNCTION)
            ),
            (
                ["u"],
                [0],
                [stored.originator_version],
                [stored.topic],
                [stored.state],
                [stored.head],
            ),
        )  # not committed yet
        store.append("t", _batch("t", 0, 2), expected_version=0)
        assert store.read_all() == []
        assert store.last_position() == 0
        assert store.version("t") == 2  # a stream read needs no settling
        u.commit()
    assert [(r.event.instance_id, r.event.position) for r in store.read_all()] == [
        ("u", 1),
        ("t", 1),
        ("t", 2),
    ]
    assert store.last_position() == store.read_all()[-1].global_position


def test_a_store_reads_its_own_appends_once_an_older_transaction_ends(
    pg_store: EventStore, postgres_url: str
) -> None:
    store = pg_store
    """Transaction ids are server-wide: any older open transaction holds a new row back. A
    store's own global reads wait (briefly) for its own rows, so it reads its own appends."""
    server, _ = _server(postgres_url)
    with psycopg.connect(server) as older:
        older.execute("SELECT pg_current_xact_id()")  # an unrelated, older writer, still open
        store.append("a", _batch("a", 0, 1), expected_version=0)
        timer = threading.Timer(0.2, older.commit)
        timer.start()
        try:
            assert [(r.event.instance_id, r.event.position) for r in store.read_all()] == [("a", 1)]
        finally:
            timer.join()


def test_row_ids_are_refused_to_a_transaction_that_already_wrote(
    pg_store: EventStore, postgres_url: str
) -> None:
    store = pg_store
    """The xid-order of row ids holds only if the append is the transaction's first write."""
    server, schema = _server(postgres_url)
    stored = store._mapper.to_row(_batch("x", 0, 1))
    with psycopg.connect(server) as conn:
        conn.execute("SELECT pg_current_xact_id()")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            conn.execute(
                sql.SQL("SELECT {}(%s, %s, %s, %s, %s, %s)").format(
                    sql.Identifier(schema, WRITE_FUNCTION)
                ),
                (
                    ["x"],
                    [0],
                    [stored.originator_version],
                    [stored.topic],
                    [stored.state],
                    [stored.head],
                ),
            )
        conn.rollback()
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
    assert held is not None
    assert held[0] == 0


# -- stores made before -------------------------------------------------------------------------

_LEGACY_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}(
    ids text[], versions bigint[], topics text[], states bytea[]
) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE {table} IN EXCLUSIVE MODE;
    RETURN QUERY
        INSERT INTO {table} (originator_id, originator_version, topic, state)
        SELECT * FROM unnest(ids, versions, topics, states)
        RETURNING notification_id;
END;
$$
"""


def _legacy_store(url: str, rows: list[StoredEvent]) -> None:
    """A schema as steplog made it before issue 10: eventsourcing's table (no tx_id), the
    table-locking append function, no heads table, stamped schema version 1; and ``rows``."""
    server, schema = _server(url)
    params = postgres_params(url)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    datastore = PostgresDatastore(
        dbname=params["dbname"],
        host=params["host"],
        port=params["port"],
        user=params["user"],
        password=params["password"],
        schema=schema,
        originator_id_type="text",
    )
    try:
        recorder = PostgresApplicationRecorder(datastore, events_table_name=EVENTS_TABLE)
        recorder.create_table()
        recorder.insert_events(rows)
    finally:
        datastore.close()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL(_LEGACY_FUNCTION).format(
                function=sql.Identifier(schema, LEGACY_APPEND),
                table=sql.Identifier(schema, EVENTS_TABLE),
            )
        )
        conn.execute(
            sql.SQL("CREATE TABLE {} (key text PRIMARY KEY, value text NOT NULL)").format(
                sql.Identifier(schema, META_TABLE)
            )
        )
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES ('schema_version', '1')").format(
                sql.Identifier(schema, META_TABLE)
            )
        )


def _layout(url: str) -> dict[str, Any]:
    server, schema = _server(url)
    with psycopg.connect(server) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = %s ORDER BY column_name",
                (schema, EVENTS_TABLE),
            )
        ]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "ORDER BY 1",
                (schema,),
            )
        ]
        functions = [
            r[0]
            for r in conn.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1",
                (schema,),
            )
        ]
        heads = (
            {
                instance_id: (version, last_row)
                for instance_id, version, last_row in conn.execute(
                    sql.SQL("SELECT instance_id, version, last_row FROM {}").format(
                        sql.Identifier(schema, HEADS_TABLE)
                    )
                )
            }
            if HEADS_TABLE in tables
            else None
        )
    return {"columns": columns, "tables": tables, "functions": functions, "heads": heads}


def _v1_rows(instance_id: str, count: int) -> list[StoredEvent]:
    """Rows in the format of stores made before issue 10: one per event."""
    mapper = open_store("memory://")._mapper
    return [mapper.to_stored(event) for event in _batch(instance_id, 0, count)]


def test_a_store_made_before_opens_unchanged_with_create_false(postgres_url: str) -> None:
    _legacy_store(postgres_url, _v1_rows("old", 3))
    before = _layout(postgres_url)
    assert "tx_id" not in before["columns"]
    with open_store(postgres_url, create=False) as store:
        assert [(r.event.instance_id, r.event.position) for r in store.read_all()] == [
            ("old", 1),
            ("old", 2),
            ("old", 3),
        ]
        assert store.last_position() == store.read_all()[-1].global_position
        assert store.version("old") == 3
        with pytest.raises(StoreError, match="create=True to upgrade"):
            store.append("old", _batch("old", 3, 1), expected_version=3)
    assert _layout(postgres_url) == before


def test_a_store_made_before_is_upgraded_by_create_true(postgres_url: str) -> None:
    _legacy_store(postgres_url, _v1_rows("old", 3) + _v1_rows("other", 1))
    before = _layout(postgres_url)
    with open_store(postgres_url) as store:
        layout = _layout(postgres_url)
        assert "tx_id" in layout["columns"]
        assert {i: v for i, (v, _) in layout["heads"].items()} == {"old": 3, "other": 1}
        legacy = f"{LEGACY_APPEND}(text[],bigint[],text[],bytea[])"
        assert any(f.endswith(legacy) for f in before["functions"])
        assert not any(f.endswith(legacy) for f in layout["functions"])  # no table lock left
        with pytest.raises(ConcurrencyConflictError):
            store.append("old", _batch("old", 1, 1), expected_version=1)
        follower = Follower(store, after=0)
        store.append("old", _batch("old", 3, 2), expected_version=3)
        store.append("new", _batch("new", 0, 1), expected_version=0)
        seen = follower.finish()
        log = [(i, p) for _, i, p in seen]
        old = [("old", 1), ("old", 2), ("old", 3), ("other", 1)]
        assert log == [*old, ("old", 4), ("old", 5), ("new", 1)]
        assert seen == [_seen(r) for r in store.read_all()]
    with open_store(postgres_url) as again:  # a second upgrade changes nothing
        heads = _layout(postgres_url)["heads"]
        assert {i: v for i, (v, _) in heads.items()} == {"old": 5, "other": 1, "new": 1}
        last_rows = {r.event.instance_id: r.global_position >> 20 for r in again.read_all()}
        assert {i: row for i, (_, row) in heads.items()} == last_rows
        assert again.version("old") == 5
