"""``StoreBusyError``: the one kind of unavailability that waiting may cure, told apart from a
store that cannot be used as asked (issue 22 review: a view follower on a read-only store retried
forever, saying another process held a lock)."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from kernel import (
    ProjectionError,
    StoreBusyError,
    StoreUnavailableError,
    open_store,
)
from projections import VIEW_NAMES, Projector
from tests.durable.helpers import Tick, counting


async def write_some(url: str) -> None:
    with open_store(url) as store:
        await counting(store, "c", limit=2).run(Tick(1))


async def test_a_write_that_waits_out_the_lock_is_busy(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    await write_some(url)
    holder = sqlite3.connect(tmp_path / "busy.db")
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the wait
    waiter = sqlite3.connect(tmp_path / "busy.db", timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError) as raised:
            waiter.execute("BEGIN IMMEDIATE")
        with open_store(url) as store:
            assert store.classify_error(raised.value) is StoreBusyError
            assert store.classify_error(sqlite3.OperationalError("no such table: x")) is not None
            assert store.classify_error(ValueError("not a driver's")) is None
    finally:
        waiter.close()
        holder.rollback()
        holder.close()


async def test_a_read_only_store_is_unavailable_but_not_busy(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    await write_some(url)
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreUnavailableError, match="read-only") as raised:
            await counting(store, "e", limit=1).run(Tick(1))
        assert not isinstance(raised.value, StoreBusyError)


async def test_a_view_follower_on_a_read_only_store_stops_instead_of_retrying(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'views.db'}"
    await write_some(url)
    with open_store(f"{url}?mode=ro") as store:
        projector = Projector(store, list(VIEW_NAMES)[:1])
        with pytest.raises(ProjectionError) as raised:
            projector.catch_up()
        assert not isinstance(raised.value, StoreUnavailableError)
        retries: list[float] = []
        stop = threading.Event()

        def on_retry(error: BaseException, delay: float) -> None:
            retries.append(delay)
            stop.set()

        with pytest.raises(ProjectionError):
            projector.follow(stop, poll_interval=0.01, max_backoff=0.02, on_retry=on_retry)
        assert retries == []


def test_a_write_transaction_on_a_closed_store_is_a_store_error(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'closed.db'}")
    store.close()
    with pytest.raises(StoreUnavailableError, match="is closed"), store.write_transaction():
        pass
