"""Issue 21: materialized views are never trusted beyond what the log supports.

Each test performs an attack on a real store (SQLite, and PostgreSQL where the store differs):
rows of the log or of a view are altered directly, the way someone with write access to the
database would, and a reader that goes through the view must refuse the answer, or recompute it
from the log, never show what the log does not say.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from kernel import (
    EventStore,
    Keyring,
    LogIntegrityError,
    StateStaged,
    WorkflowBuilder,
    counter_ids,
    open_store,
)
from kernel._codec._mapper import RowMapper
from kernel.testing import ticking_clock
from projections import AtPosition, Projector, TimeTravel, blame_keys
from tests.store.test_tamper import CLEAN, INSTANCE, SECRET, Checkout, write_orders

FORGED = "forged-by-someone"


async def _orders(store: EventStore) -> None:
    """The two instances of ``tests/store/test_tamper.py`` (run 1 of ``orders`` stages the
    secret at #3..7 and fails), written to ``store``."""
    await write_orders(store)


def _keyring(encrypted: bool) -> Keyring | None:
    return Keyring.from_text(Keyring.generate()) if encrypted else None


def _replace_row(store: EventStore, url: str, row: object) -> None:
    """Put ``row`` (a ``ChainedRow``) in the place of the stored row that ends where it ends."""
    from tests.store.test_tamper import PostgresRows, SQLiteRows

    rows = SQLiteRows(url) if url.startswith("sqlite") else PostgresRows(url)
    rows.put(row.originator_version, bytes(row.state))  # type: ignore[attr-defined]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_blame_through_the_key_index_refuses_a_forged_row_the_log_refuses(
    durable_store_url: str, encrypted: bool
) -> None:
    # The attack: run 1's row (#3..7, holding the aborted write of the secret) is replaced by a
    # row whose write says something else, each event hashed by steplog's own mapper and the
    # row chained to #2: every event matches its own hash (what read_ranges checked), but the
    # row after it (#8..9) no longer follows it. On an encrypted store the forged row is plain
    # text, written without the key. A read of the whole stream refuses it; blame through the
    # key index showed the forged value.
    url = durable_store_url
    keyring = _keyring(encrypted)
    with open_store(url, keyring=keyring) as store:
        asyncio.run(_orders(store))
        Projector(store, ["keyindex"]).catch_up()
        assert [w.value for w in blame_keys(store, INSTANCE, ["secret"]).writes("secret")] == [
            SECRET
        ]
        events = store.read(INSTANCE, after=2, upto=7)
        previous = store._mapper.event_hash(INSTANCE, 2, *_stored(store, 2), 2)
    forged = [
        e.model_copy(update={"value": FORGED}) if isinstance(e, StateStaged) else e for e in events
    ]
    _replace_row(store, url, RowMapper().to_row(forged, previous=previous))
    # On a plain store the row after it no longer follows it (#8); on an encrypted one the forged
    # row itself is refused first: it is plain text, where every row must be sealed (#3).
    refused_at = (3, "unsealed") if encrypted else (8, "reordered")
    with open_store(url, keyring=keyring, create=False) as store:
        with pytest.raises(LogIntegrityError) as whole:
            store.read(INSTANCE)
        assert (whole.value.position, whole.value.kind) == refused_at
        with pytest.raises(LogIntegrityError) as caught:
            blame_keys(store, INSTANCE, ["secret"])
        assert (caught.value.instance_id, caught.value.position) == (INSTANCE, refused_at[0])
        with pytest.raises(LogIntegrityError):
            blame_keys(store, INSTANCE, ["secret"], index=False)
        assert [w.value for w in blame_keys(store, CLEAN, ["token"]).writes("token")] == [
            "tok-A-1",
            "tok-A-2",
        ]


def _stored(store: EventStore, last: int) -> tuple[str, bytes]:
    (row,) = [
        r for r in store.backend.select_stream(INSTANCE, after=last - 1, upto=last) if r[0] == last
    ]
    return row[1], row[2]


def _view_sql(url: str, statement: str, params: tuple[object, ...] = ()) -> int:
    """Run ``statement`` on the store's database directly (``{t}``: the table, schema-qualified
    on PostgreSQL); the rows it changed."""
    import sqlite3
    from contextlib import closing

    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db, db:
            return db.execute(statement.replace("%s", "?"), params).rowcount
    import psycopg

    from tests.store.test_tamper import PostgresRows

    rows = PostgresRows(url)
    with psycopg.connect(rows.server, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{rows.schema}"')
        return conn.execute(statement, params).rowcount


def _written(url: str, keyring: Keyring | None, views: list[str]) -> None:
    with open_store(url, keyring=keyring) as store:
        asyncio.run(_orders(store))
        Projector(store, views).catch_up()


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_key_index_row_deleted_never_makes_blame_say_never_written(
    durable_store_url: str, encrypted: bool
) -> None:
    # Issue 21: deleting the key index's row of ``secret`` made blame say "key 'secret' was
    # never written", hiding the aborted write. The instance's rows are counted against its
    # manifest (sealed on an encrypted store), so the answer is refused.
    url, keyring = durable_store_url, _keyring(encrypted)
    _written(url, keyring, ["keyindex"])
    deleted = _view_sql(
        url,
        "DELETE FROM steplog_view_keyindex_v2 WHERE instance_id = %s AND key = %s",
        (INSTANCE, "k:secret"),
    )
    assert deleted == 1
    with open_store(url, keyring=keyring, create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            blame_keys(store, INSTANCE, ["secret"])
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        assert "keyindex view of 'orders'" in str(caught.value)
        assert "steplog rebuild keyindex" in str(caught.value)
        # Without the index, the log answers; the other instance's index is untouched.
        assert [
            w.value for w in blame_keys(store, INSTANCE, ["secret"], index=False).writes("secret")
        ] == [SECRET]
        assert len(blame_keys(store, CLEAN, ["token"]).writes("token")) == 2
        Projector(store, ["keyindex"]).rebuild("keyindex")
        assert [w.value for w in blame_keys(store, INSTANCE, ["secret"]).writes("secret")] == [
            SECRET
        ]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_history_row_edited_or_deleted_is_refused_not_shown(
    durable_store_url: str, encrypted: bool
) -> None:
    # Issue 21: editing the history view made the UI show a failed run as completed. On a
    # plain store the edit is a text replacement; on an encrypted one (where the row cannot be
    # edited without the key) the row of the failed superstep is deleted.
    from projections.ui._data import Reader

    url, keyring = durable_store_url, _keyring(encrypted)
    _written(url, keyring, ["history"])
    table = "steplog_view_history_v3"
    if encrypted:
        changed = _view_sql(
            url,
            f"DELETE FROM {table} WHERE instance_id = %s AND key LIKE %s AND doc NOT LIKE %s",
            (INSTANCE, "s:%", "%committed%"),
        )
    else:
        changed = _view_sql(
            url,
            f"UPDATE {table} SET doc = replace(replace(doc, %s, %s), %s, %s) "
            "WHERE instance_id = %s AND doc LIKE %s",
            (
                '"status":"failed"',
                '"status":"completed"',
                '"status":"aborted"',
                '"status":"committed"',
                INSTANCE,
                '%"failed"%',
            ),
        )
    assert changed >= 1
    with open_store(url, keyring=keyring, create=False) as store:
        projector = Projector(store, ["history"])
        with pytest.raises(LogIntegrityError) as caught:
            projector.history(INSTANCE)
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        with pytest.raises(LogIntegrityError):
            Reader(store).history(INSTANCE)  # the UI reads the same rows: refused too
        assert [r.status for r in projector.history(CLEAN).runs()] == [
            "failed",
            "completed",
            "completed",
        ]


def test_a_view_folded_from_a_log_since_cut_is_refused(sqlite_url: str) -> None:
    # The log's tail is cut and its head rolled back: the state view still holds what the cut
    # events committed. Its manifest names the event it was folded up to, and the log now
    # holds none there.
    _written(sqlite_url, None, ["state", "blame"])
    with open_store(sqlite_url, create=False) as store:
        assert Projector(store, ["state"]).state(INSTANCE) == {"token": "tok-A-2"}
        (row,) = [r for r in store.backend.select_stream(INSTANCE, after=14, upto=15) if r[0] == 15]
        head = store._mapper.row_link(INSTANCE, *row).head
    _view_sql(
        sqlite_url,
        "DELETE FROM steplog_events WHERE originator_id = %s AND originator_version > 15",
        (INSTANCE,),
    )
    _view_sql(
        sqlite_url,
        "UPDATE steplog_chain SET position = 15, head = %s WHERE instance_id = %s",
        (head, INSTANCE),
    )
    with open_store(sqlite_url, create=False) as store:
        assert store.verify_chain(INSTANCE).ok  # the cut cannot be seen in the chain alone
        projector = Projector(store, ["state", "blame"])
        for read in (projector.state, projector.blame):
            with pytest.raises(LogIntegrityError) as caught:
                read(INSTANCE)
            assert (caught.value.position, caught.value.kind) == (23, "view mismatch")
            assert "'orders'#23" in str(caught.value)
        assert projector.state(CLEAN) == {"token": "tok-A-2"}


async def _runs(store: EventStore, orders: list[str], first: int = 0) -> None:
    """Runs of ``Checkout`` on ``INSTANCE``, one per order (``token`` written by each)."""
    wf = WorkflowBuilder(
        start_executor=Checkout(id="checkout"),
        store=store,
        instance_id=INSTANCE,
        clock=ticking_clock(datetime(2026, 12, 1, 9, first, tzinfo=UTC)),
        id_factory=counter_ids(f"{INSTANCE}-{first}"),
    ).build()
    for order in orders:
        await wf.run(order)


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_an_older_copy_of_one_key_index_row_never_makes_blame_lie(
    durable_store_url: str, encrypted: bool
) -> None:
    # Review of issue 21: an early (sealed) copy of the key index's row of ``token``, written
    # back after two later writes, kept the row count and the anchor: blame through the index
    # said the first write was the current one, while the state said the last. Every index row
    # of the instance is checked against the manifest's digest, so the answer is refused.
    url, keyring = durable_store_url, _keyring(encrypted)
    table = "steplog_view_keyindex_v2"
    with open_store(url, keyring=keyring) as store:
        asyncio.run(_runs(store, ["A-1"]))
        Projector(store, ["keyindex"]).catch_up()
        asyncio.run(_runs(store, ["A-2", "A-3"], first=1))
        saved = _view_doc(url, table, "k:token")
        Projector(store, ["keyindex"]).catch_up()
    assert _view_sql(
        url,
        f"UPDATE {table} SET doc = %s WHERE instance_id = %s AND key = %s",
        (saved, INSTANCE, "k:token"),
    )
    with open_store(url, keyring=keyring, create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            blame_keys(store, INSTANCE, ["token"])
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        assert "keyindex view of 'orders'" in str(caught.value)
        writes = blame_keys(store, INSTANCE, ["token"], index=False).writes("token")
        assert [w.value for w in writes] == ["tok-A-1", "tok-A-2", "tok-A-3"]


def _view_doc(url: str, table: str, key: str) -> str:
    """The stored document of ``INSTANCE``'s row ``key`` in ``table``, as stored."""
    import sqlite3
    from contextlib import closing

    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            (doc,) = db.execute(
                f"SELECT doc FROM {table} WHERE instance_id = ? AND key = ?", (INSTANCE, key)
            ).fetchone()
            return str(doc)
    import psycopg

    from tests.store.test_tamper import PostgresRows

    rows = PostgresRows(url)
    with psycopg.connect(rows.server, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{rows.schema}"')
        found = conn.execute(
            f"SELECT doc FROM {table} WHERE instance_id = %s AND key = %s", (INSTANCE, key)
        ).fetchone()
        assert found is not None
        return str(found[0])


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_view_position_moved_forward_never_hides_the_runs_after_it(
    durable_store_url: str, encrypted: bool
) -> None:
    # Review of issue 21: one edit of the plain table of view positions (no key needed) moved
    # the history view's position past the log's end, and the UI folded no tail after it: a
    # run appended since the last catch-up vanished from the run list and the instance page.
    # Where an instance's tail starts is its manifest's ``at`` (anchored and sealed).
    from projections.ui._data import Reader

    url, keyring = durable_store_url, _keyring(encrypted)
    with open_store(url, keyring=keyring) as store:
        asyncio.run(_runs(store, ["A-1", "A-2"]))
        Projector(store, ["history", "snapshots"]).catch_up()
        asyncio.run(_runs(store, ["A-3"], first=1))  # not folded yet
    assert _view_sql(url, "UPDATE steplog_view_positions SET position = position * 1000")
    with open_store(url, keyring=keyring, create=False) as store:
        runs = Reader(store).history(INSTANCE).runs()
        assert [(r.run_id, r.status) for r in runs] == [
            (f"{INSTANCE}-0-1", "completed"),
            (f"{INSTANCE}-0-3", "completed"),
            (f"{INSTANCE}-1-1", "completed"),
        ]
        # Time travel starts from a snapshot and folds the instance's stream after it.
        now = TimeTravel(store).state(INSTANCE, AtPosition(store.version(INSTANCE)))
        assert now.decoded() == {"token": "tok-A-3"}


def test_a_view_position_moved_back_never_folds_an_event_twice(sqlite_url: str) -> None:
    # The other way round: a position moved back made the next catch-up fold events its rows
    # already held (and, on a store with keys, seal the result). Events up to an instance's
    # manifest ``at`` are skipped.
    _written(sqlite_url, None, ["state", "history", "blame", "keyindex", "snapshots"])
    assert _view_sql(sqlite_url, "UPDATE steplog_view_positions SET position = 0")
    with open_store(sqlite_url, create=False) as store:
        projector = Projector(store)
        projector.catch_up()
        for name in ("state", "history", "blame", "keyindex", "snapshots"):
            assert projector.verify(name).ok, name
        assert [r.status for r in projector.history(INSTANCE).runs()] == [
            "failed",
            "completed",
            "completed",
        ]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_snapshots_are_checked_and_never_folded_on_from_an_older_fold_state(
    durable_store_url: str, encrypted: bool
) -> None:
    # Review of issue 21: TimeTravel read snapshot rows without their manifest, and the
    # snapshot view's fold state, put back from an older (sealed) copy, made the next catch-up
    # fold on from it: every later snapshot would miss the writes in between.
    url, keyring = durable_store_url, _keyring(encrypted)
    table = "steplog_view_snapshots_v2"
    with open_store(url, keyring=keyring) as store:
        projector = Projector(store, ["snapshots"], snapshot_every=1)
        asyncio.run(_runs(store, ["A-1"]))
        projector.catch_up()
        saved = _view_doc(url, table, "fold")
        asyncio.run(_runs(store, ["A-2"], first=1))
        projector.catch_up()
    assert _view_sql(
        url,
        f"DELETE FROM {table} WHERE instance_id = %s AND key = "
        f"(SELECT min(key) FROM {table} WHERE instance_id = %s AND key LIKE %s)",
        (INSTANCE, INSTANCE, "p:%"),
    )
    with open_store(url, keyring=keyring, create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            TimeTravel(store).state(INSTANCE, AtPosition(store.version(INSTANCE)))
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        Projector(store, ["snapshots"], snapshot_every=1).rebuild("snapshots")
    assert _view_sql(
        url,
        f"UPDATE {table} SET doc = %s WHERE instance_id = %s AND key = %s",
        (saved, INSTANCE, "fold"),
    )
    with open_store(url, keyring=keyring, create=False) as store:
        asyncio.run(_runs(store, ["A-3"], first=2))
        with pytest.raises(LogIntegrityError) as caught:
            Projector(store, ["snapshots"], snapshot_every=1).catch_up()
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        assert "an older copy was put back" in str(caught.value)


@pytest.mark.parametrize("doc", ["not json", '{"rows": '])
def test_a_view_document_that_is_not_json_is_reported_not_a_crash(
    sqlite_url: str, doc: str
) -> None:
    # Review of issue 21: a view document that is not JSON made every reader (and 'steplog
    # verify') crash with JSONDecodeError. It is a view that does not match the log: readers
    # refuse it naming the view, instance and row, and verify reports it.
    _written(sqlite_url, None, ["state"])
    assert _view_sql(
        sqlite_url,
        "UPDATE steplog_view_state_v2 SET doc = %s WHERE instance_id = %s AND key != '#'",
        (doc, INSTANCE),
    )
    with open_store(sqlite_url, create=False) as store:
        projector = Projector(store, ["state"])
        with pytest.raises(LogIntegrityError) as caught:
            projector.state(INSTANCE)
        assert (caught.value.instance_id, caught.value.kind) == (INSTANCE, "view mismatch")
        assert "steplog_view_state_v2" in str(caught.value)
        assert projector.state(CLEAN) == {"token": "tok-A-2"}
        report = projector.verify("state")
        assert not report.ok
        assert list(report.different) == [(INSTANCE, "view")]
        assert "is not JSON" in str(report.different[INSTANCE, "view"][0])
        # A catch-up refuses to fold the instance's new events on top of it.
        asyncio.run(_runs(store, ["A-3"], first=5))
        with pytest.raises(LogIntegrityError) as caught:
            projector.catch_up()
        assert "steplog_view_state_v2 'orders'/'view' is not JSON" in str(caught.value)
