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
from kernel._mapper import EventMapper
from kernel.testing import ticking_clock
from projections import Projector, blame_keys
from tests.store.test_tamper import CLEAN, INSTANCE, SECRET, Checkout

FORGED = "forged-by-someone"


async def _orders(store: EventStore) -> None:
    """The two instances of ``tests/store/test_tamper.py`` (run 1 of ``orders`` stages the
    secret at #3..7 and fails), written to ``store``."""
    for instance in (INSTANCE, CLEAN):
        wf = WorkflowBuilder(
            start_executor=Checkout(id="checkout"),
            store=store,
            instance_id=instance,
            clock=ticking_clock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC)),
            id_factory=counter_ids(instance),
        ).build()
        await asyncio.gather(wf.run("bad"), return_exceptions=True)
        await wf.run("A-1")
        await wf.run("A-2")


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
        e.model_copy(update={"value": FORGED}) if isinstance(e, StateStaged) else e
        for e in events
    ]
    _replace_row(store, url, EventMapper().to_row(forged, previous=previous))
    with open_store(url, keyring=keyring, create=False) as store:
        with pytest.raises(LogIntegrityError) as whole:
            store.read(INSTANCE)
        assert whole.value.position == 8
        with pytest.raises(LogIntegrityError) as caught:
            blame_keys(store, INSTANCE, ["secret"])
        assert (caught.value.instance_id, caught.value.position) == (INSTANCE, 8)
        with pytest.raises(LogIntegrityError):
            blame_keys(store, INSTANCE, ["secret"], index=False)
        assert [w.value for w in blame_keys(store, CLEAN, ["token"]).writes("token")] == [
            "tok-A-1",
            "tok-A-2",
        ]


def _stored(store: EventStore, last: int) -> tuple[str, bytes]:
    (row,) = [r for r in store._select_stream(INSTANCE, last - 1, last) if r[0] == last]
    return row[1], row[2]
