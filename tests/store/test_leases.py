"""Leases: the store's compare-and-set lease rows, and ``LeaseKeeper`` on top of them.

The store contract runs on every backend (``store``); the upgrade and reader tests on the durable
ones; the keeper's rules on a memory store with an injected clock and sleep; and real processes
race for one instance on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import pickle
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kernel import (
    EventStore,
    MemoryStore,
    RunInProgressError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
    open_store,
)
from kernel._store._lease import Lease, LeaseKeeper
from kernel._store._owner import process_owner
from kernel._store._postgres import postgres_params

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
WAIT = 10.0  # seconds: the most any wait in this module may take before the test fails
WORKER = Path(__file__).with_name("_lease_worker.py")
LEASES = "steplog_leases"
TOKENS = itertools.count(1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the store contract, on every backend ---------------------------------------------------


def test_a_free_lease_is_acquired_and_read_back(store: EventStore) -> None:
    assert store.read_lease("a") is None
    lease = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    assert lease == Lease("a", "me/1", at(30))
    assert store.read_lease("a") == lease
    assert store.read_lease("b") is None


def test_the_expiry_is_kept_to_the_microsecond_in_utc(store: EventStore) -> None:
    now = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    lease = store.acquire_lease("a", "me/1", ttl=0.5, now=now)
    assert lease is not None
    assert lease.expires == datetime(2024, 5, 1, 12, 0, 0, 623456, tzinfo=UTC)
    assert lease.expires.utcoffset() == timedelta(0)
    assert store.read_lease("a") == lease


def test_the_holder_acquiring_again_renews(store: EventStore) -> None:
    store.acquire_lease("a", "me/1", ttl=30, now=T0)
    again = store.acquire_lease("a", "me/1", ttl=30, now=at(10))
    assert again == Lease("a", "me/1", at(40))
    assert store.read_lease("a") == again


@pytest.mark.parametrize("later", [0, 30, 3600], ids=["live", "just-expired", "long-expired"])
def test_another_holder_is_refused_even_once_expired(store: EventStore, later: float) -> None:
    first = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    assert store.acquire_lease("a", "you/2", ttl=30, now=at(later)) is None
    assert store.read_lease("a") == first


def test_a_takeover_needs_the_exact_stored_lease(store: EventStore) -> None:
    stale = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    assert stale is not None
    wrong_holder = Lease("a", "me/9", stale.expires)
    wrong_expiry = Lease("a", "me/1", stale.expires + timedelta(microseconds=1))
    for replace in (wrong_holder, wrong_expiry):
        assert store.acquire_lease("a", "you/2", ttl=30, now=at(60), replace=replace) is None
        assert store.read_lease("a") == stale
    taken = store.acquire_lease("a", "you/2", ttl=30, now=at(60), replace=stale)
    assert taken == Lease("a", "you/2", at(90))
    assert store.read_lease("a") == taken


def test_a_takeover_of_a_free_lease_acquires_it(store: EventStore) -> None:
    gone = Lease("a", "me/1", T0)  # released since the caller read it
    assert store.acquire_lease("a", "you/2", ttl=30, now=at(60), replace=gone) == Lease(
        "a", "you/2", at(90)
    )


def test_two_takeovers_of_the_same_stale_lease_one_wins(store: EventStore) -> None:
    stale = store.acquire_lease("a", "dead/1", ttl=30, now=T0)
    first = store.acquire_lease("a", "you/2", ttl=30, now=at(60), replace=stale)
    second = store.acquire_lease("a", "them/3", ttl=30, now=at(60), replace=stale)
    assert first is not None
    assert second is None
    assert store.read_lease("a") == first


def test_racing_takeovers_of_the_same_stale_lease_exactly_one_wins(store: EventStore) -> None:
    stale = store.acquire_lease("a", "dead/1", ttl=30, now=T0)
    count = 8
    barrier = threading.Barrier(count)
    outcomes: queue.Queue[tuple[str, Lease | None] | BaseException] = queue.Queue()

    def take_over(holder: str) -> None:
        try:
            barrier.wait(timeout=WAIT)
            outcomes.put(
                (holder, store.acquire_lease("a", holder, ttl=30, now=at(60), replace=stale))
            )
        except BaseException as error:  # reported to the test thread
            outcomes.put(error)

    threads = [threading.Thread(target=take_over, args=(f"p{i}/t",)) for i in range(count)]
    for thread in threads:
        thread.start()
    results = [outcomes.get(timeout=WAIT) for _ in threads]
    for thread in threads:
        thread.join(timeout=WAIT)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    winners = [(h, lease) for h, lease in results if lease is not None]  # type: ignore[misc]
    assert len(winners) == 1
    holder, lease = winners[0]
    assert store.read_lease("a") == lease == Lease("a", holder, at(90))


def test_renewing_extends_only_the_holders_lease(store: EventStore) -> None:
    assert store.renew_lease("a", "me/1", ttl=30, now=T0) is None  # no lease yet
    assert store.read_lease("a") is None  # and renewing created none
    store.acquire_lease("a", "me/1", ttl=30, now=T0)
    assert store.renew_lease("a", "me/1", ttl=30, now=at(20)) == Lease("a", "me/1", at(50))
    assert store.renew_lease("a", "you/2", ttl=30, now=at(20)) is None
    assert store.read_lease("a") == Lease("a", "me/1", at(50))


def test_renewing_after_a_takeover_finds_the_lease_gone(store: EventStore) -> None:
    mine = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    theirs = store.acquire_lease("a", "you/2", ttl=30, now=at(40), replace=mine)
    assert theirs is not None
    assert store.renew_lease("a", "me/1", ttl=30, now=at(41)) is None
    assert store.read_lease("a") == theirs


def test_releasing_deletes_only_the_holders_lease(store: EventStore) -> None:
    mine = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    store.release_lease("a", "you/2")
    assert store.read_lease("a") == mine
    store.release_lease("b", "me/1")  # no lease there: nothing happens
    store.release_lease("a", "me/1")
    assert store.read_lease("a") is None
    store.release_lease("a", "me/1")  # twice is fine
    assert store.acquire_lease("a", "you/2", ttl=30, now=at(1)) == Lease("a", "you/2", at(31))


def test_leases_of_instances_are_independent(store: EventStore) -> None:
    a = store.acquire_lease("a", "me/1", ttl=30, now=T0)
    b = store.acquire_lease("b", "you/2", ttl=10, now=T0)
    assert (a, b) == (Lease("a", "me/1", at(30)), Lease("b", "you/2", at(10)))
    store.release_lease("a", "me/1")
    assert store.read_lease("b") == b


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.acquire_lease("a", "h", ttl=30, now=datetime(2024, 1, 1)),
                     id="naive-now"),
        pytest.param(lambda s: s.acquire_lease("a", "h", ttl=0, now=T0), id="zero-ttl"),
        pytest.param(lambda s: s.renew_lease("a", "h", ttl=float("nan"), now=T0), id="nan-ttl"),
        pytest.param(lambda s: s.acquire_lease("a", "h", ttl=30, now=T0,
                                               replace=Lease("b", "x", T0)), id="other-instance"),
    ],
)  # fmt: skip
def test_wrong_lease_arguments_are_refused(
    store: EventStore, call: Callable[[EventStore], object]
) -> None:
    with pytest.raises(StoreConfigError):
        call(store)
    assert store.read_lease("a") is None


def test_a_closed_store_refuses_lease_calls(store_url: str) -> None:
    store = open_store(store_url)
    store.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        store.acquire_lease("a", "me/1", ttl=30, now=T0)
    with pytest.raises(StoreUnavailableError, match="closed"):
        store.read_lease("a")


def test_a_lease_is_seen_by_another_connection(durable_store_url: str) -> None:
    with open_store(durable_store_url) as one, open_store(durable_store_url) as two:
        lease = one.acquire_lease("a", "me/1", ttl=30, now=T0)
        assert two.read_lease("a") == lease
        assert two.acquire_lease("a", "you/2", ttl=30, now=T0) is None


# -- stores made before leases --------------------------------------------------------------


def lease_tables(url: str) -> list[str]:
    """The leases tables the store at ``url`` holds (read by a separate connection)."""
    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            query = "SELECT name FROM sqlite_master WHERE name = ?"
            return [row[0] for row in db.execute(query, (LEASES,))]
    schema = postgres_params(url)["schema"]
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        query = (
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = %s"
        )
        return [row[0] for row in conn.execute(query, (schema, LEASES))]


def drop_leases_table(url: str) -> None:
    """Make the store at ``url`` look as a steplog from before leases left it."""
    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db, db:
            db.execute(f"DROP TABLE {LEASES}")
        return
    schema = postgres_params(url)["schema"]
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, LEASES)))


@pytest.fixture
def old_store_url(durable_store_url: str) -> str:
    """A store whose leases table is missing, as an older steplog made it."""
    with open_store(durable_store_url):
        assert lease_tables(durable_store_url) == [LEASES]
    drop_leases_table(durable_store_url)
    assert lease_tables(durable_store_url) == []
    return durable_store_url


def test_a_reader_of_an_old_store_reads_no_lease_and_creates_nothing(old_store_url: str) -> None:
    with open_store(old_store_url, create=False) as store:
        assert store.read_lease("a") is None
    assert lease_tables(old_store_url) == []


def test_a_writer_opened_without_create_on_an_old_store_is_told_to_open_with_create(
    old_store_url: str,
) -> None:
    with open_store(old_store_url, create=False) as store:
        with pytest.raises(StoreError, match=r"no leases table .*create=True") as caught:
            store.acquire_lease("a", "me/1", ttl=30, now=T0)
        assert not isinstance(caught.value, StoreUnavailableError)
    assert lease_tables(old_store_url) == []


def test_opening_an_old_store_with_create_adds_the_leases_table(old_store_url: str) -> None:
    with open_store(old_store_url) as store:
        assert lease_tables(old_store_url) == [LEASES]
        lease = store.acquire_lease("a", "me/1", ttl=30, now=T0)
        assert store.read_lease("a") == lease
    with open_store(old_store_url, create=False) as reader:
        assert reader.read_lease("a") == lease


def test_an_old_sqlite_store_is_upgraded_without_a_lock_file_left(sqlite_url: str) -> None:
    open_store(sqlite_url).close()
    drop_leases_table(sqlite_url)
    open_store(sqlite_url).close()
    directory = Path(sqlite_url.removeprefix("sqlite:///")).parent
    assert [p.name for p in directory.iterdir() if p.name.endswith(".lock")] == []
    assert lease_tables(sqlite_url) == [LEASES]


# -- LeaseKeeper ----------------------------------------------------------------------------


class Clock:
    """A settable clock."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Sleeps:
    """An injected ``sleep``: records each pause, advances ``clock`` by it, and runs ``then``
    (if set) after the pause; from call ``block_from`` on, it blocks until cancelled."""

    def __init__(self, clock: Clock, *, block_from: int | None = None) -> None:
        self.clock = clock
        self.calls: list[float] = []
        self.then: Callable[[int], None] | None = None
        self.block_from = block_from
        self.blocked = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.block_from is not None and len(self.calls) >= self.block_from:
            self.blocked.set()
            await asyncio.Event().wait()  # until cancelled
        self.clock.now += timedelta(seconds=seconds)
        await asyncio.sleep(0)
        if self.then is not None:
            self.then(len(self.calls))


def keeper(
    store: EventStore,
    clock: Clock,
    sleeps: Sleeps | None = None,
    *,
    owner: str | None = None,
    **options: Any,
) -> LeaseKeeper:
    return LeaseKeeper(
        store,
        "a",
        owner=owner or process_owner(),
        clock=clock,
        sleep=sleeps or Sleeps(clock),
        token=lambda: f"t{next(TOKENS)}",
        **options,
    )


def dead_owner() -> str:
    """``host:pid`` of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=WAIT)
    return f"{socket.gethostname()}:{child.pid}"


async def test_a_keeper_takes_a_free_lease() -> None:
    store, clock = MemoryStore(), Clock()
    first = keeper(store, clock, ttl=20)
    owner, _, token = first.holder.rpartition("/")
    assert (owner, token[0]) == (process_owner(), "t")
    assert await first.acquire() is False
    assert first.taken_over is None
    assert store.read_lease("a") == first.lease == Lease("a", first.holder, at(20))
    assert await first.acquire() is False  # its own lease: renewed
    await first.release()
    assert store.read_lease("a") is None
    assert first.lease is None


def test_every_keeper_has_its_own_holder() -> None:
    store = MemoryStore()
    holders = {LeaseKeeper(store, "a", owner="h:1").holder for _ in range(3)}
    assert len(holders) == 3
    assert all(h.startswith("h:1/") for h in holders)


async def test_a_live_holder_is_refused_at_once_naming_holder_and_expiry() -> None:
    store, clock = MemoryStore(), Clock()
    sleeps = Sleeps(clock)
    first = keeper(store, clock, ttl=30)
    await first.acquire()
    second = keeper(store, clock, sleeps, ttl=30)
    with pytest.raises(RunInProgressError) as caught:
        await second.acquire()
    error = caught.value
    assert (error.holder, error.expires) == (first.holder, at(30))
    text = str(error)
    for part in ("'a'", first.holder, at(30).isoformat(), "wait"):
        assert part in text
    assert sleeps.calls == []  # wait=0: no polling at all
    assert store.read_lease("a") == first.lease


async def test_a_foreign_live_owner_is_not_taken_over_before_expiry() -> None:
    store, clock = MemoryStore(), Clock()
    store.acquire_lease("a", "elsewhere.example:1/x", ttl=30, now=T0)
    clock.now = at(29.999)
    with pytest.raises(RunInProgressError, match=r"elsewhere\.example:1/x"):
        await keeper(store, clock).acquire()


async def test_waiting_polls_until_the_holder_releases() -> None:
    store, clock = MemoryStore(), Clock()
    first = keeper(store, clock, ttl=30)
    await first.acquire()
    sleeps = Sleeps(clock)
    sleeps.then = lambda n: store.release_lease("a", first.holder) if n == 3 else None
    second = keeper(store, clock, sleeps, ttl=30, wait=5.0, poll=0.5)
    assert await second.acquire() is False
    assert sleeps.calls == [0.5, 0.5, 0.5]
    assert store.read_lease("a") == second.lease
    assert second.lease is not None
    assert second.lease.holder == second.holder


async def test_waiting_gives_up_after_the_wait() -> None:
    store, clock = MemoryStore(), Clock()
    first = keeper(store, clock, ttl=60)
    await first.acquire()
    sleeps = Sleeps(clock)
    second = keeper(store, clock, sleeps, ttl=60, wait=1.0, poll=0.3)
    with pytest.raises(RunInProgressError, match="waited 1 s") as caught:
        await second.acquire()
    assert caught.value.holder == first.holder
    assert sum(sleeps.calls) == pytest.approx(1.0)
    assert all(0 < pause <= 0.3 for pause in sleeps.calls)


async def test_an_expired_lease_is_taken_over() -> None:
    store, clock = MemoryStore(), Clock()
    first = keeper(store, clock, ttl=10)
    await first.acquire()
    stale = first.lease
    second = keeper(store, clock, ttl=10)
    clock.now = at(9.999)
    with pytest.raises(RunInProgressError):
        await second.acquire()
    clock.now = at(10)
    assert await second.acquire() is True
    assert second.taken_over == stale
    assert store.read_lease("a") == Lease("a", second.holder, at(20))
    await first.release()  # no longer the holder: changes nothing
    assert store.read_lease("a") == second.lease


async def test_a_dead_owners_live_lease_is_taken_over() -> None:
    store, clock = MemoryStore(), Clock()
    gone = keeper(store, clock, owner=dead_owner(), ttl=3600)
    await gone.acquire()
    live = keeper(store, clock)
    assert await live.acquire() is True
    assert live.taken_over == gone.lease
    stored = store.read_lease("a")
    assert stored is not None
    assert stored.holder == live.holder


async def test_losing_a_takeover_race_is_refused_naming_the_winner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, clock = MemoryStore(), Clock(at(100))
    stale = store.acquire_lease("a", "elsewhere:1/old", ttl=10, now=T0)
    read = store.read_lease
    rival = store.acquire_lease("a", "elsewhere:2/rival", ttl=30, now=at(100), replace=stale)
    reads = iter([stale])  # this keeper read the stale lease just before the rival took over
    monkeypatch.setattr(store, "read_lease", lambda i: next(reads, None) or read(i))
    with pytest.raises(RunInProgressError) as caught:
        await keeper(store, clock).acquire()
    assert caught.value.holder == "elsewhere:2/rival"
    assert store.read_lease("a") == rival


async def test_the_heartbeat_renews_every_third_of_the_ttl() -> None:
    store, clock = MemoryStore(), Clock()
    sleeps = Sleeps(clock, block_from=4)  # three renewals, then it waits until released
    mine = keeper(store, clock, sleeps, ttl=30)
    await mine.acquire()
    lost: list[str] = []
    mine.start_heartbeat(lambda: lost.append("lost"))
    await asyncio.wait_for(sleeps.blocked.wait(), WAIT)
    assert sleeps.calls == [10.0] * 4
    assert store.read_lease("a") == mine.lease == Lease("a", mine.holder, at(30 + 30))
    assert lost == []
    await mine.release()
    assert store.read_lease("a") is None


async def test_on_lost_fires_once_when_the_lease_is_taken_over() -> None:
    store, clock = MemoryStore(), Clock()
    sleeps = Sleeps(clock)
    mine = keeper(store, clock, sleeps, ttl=30)
    await mine.acquire()
    theirs = store.acquire_lease("a", "elsewhere:1/x", ttl=30, now=at(31), replace=mine.lease)
    lost = asyncio.Event()
    calls: list[int] = []

    def on_lost() -> None:
        calls.append(len(sleeps.calls))
        lost.set()

    mine.start_heartbeat(on_lost)
    await asyncio.wait_for(lost.wait(), WAIT)
    for _ in range(5):  # give a wrongly continuing heartbeat the chance to beat again
        await asyncio.sleep(0)
    assert calls == [1]
    assert sleeps.calls == [10.0]
    assert mine.lease is None
    await mine.release()
    assert store.read_lease("a") == theirs  # releasing does not touch the new holder's lease


async def test_releasing_never_raises_a_store_error() -> None:
    store, clock = MemoryStore(), Clock()
    mine = keeper(store, clock)
    await mine.acquire()
    store.close()
    await mine.release()  # logged; the lease would expire by itself
    assert mine.lease is None


def test_a_keeper_refuses_a_bad_ttl_or_wait() -> None:
    with pytest.raises(StoreConfigError, match="ttl"):
        LeaseKeeper(MemoryStore(), "a", owner="h:1", ttl=0)
    with pytest.raises(StoreConfigError, match="wait"):
        LeaseKeeper(MemoryStore(), "a", owner="h:1", wait=-1)


def test_run_in_progress_keeps_holder_and_expiry_through_pickling() -> None:
    error = RunInProgressError("busy", holder="h:1/t", expires=T0)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.holder, copy.expires) == ("busy", "h:1/t", T0)
    assert RunInProgressError("plain").holder is None  # the existing uses still work


# -- real processes -------------------------------------------------------------------------


class LeaseWorker:
    """``_lease_worker.py`` in a child process, on the store at ``url``."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self.readline()
        if ready != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=WAIT)
            pytest.fail(f"lease worker did not start: {ready!r}\n{err}")

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        line = self.readline()
        if not line:
            _, err = self.proc.communicate(timeout=WAIT)
            pytest.fail(f"lease worker stopped: {err}")
        outcome: dict[str, Any] = json.loads(line)
        return outcome

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT)
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def workers(durable_store_url: str) -> Iterator[Callable[[int], list[LeaseWorker]]]:
    open_store(durable_store_url).close()  # created once, so workers race for leases, not setup
    started: list[LeaseWorker] = []

    def start(count: int) -> list[LeaseWorker]:
        new = [LeaseWorker(durable_store_url) for _ in range(count)]
        started.extend(new)
        return new

    yield start
    for worker in started:
        worker.stop()


@pytest.mark.timeout(60)
def test_processes_racing_for_an_instance_exactly_one_wins_each_round(
    workers: Callable[[int], list[LeaseWorker]], durable_store_url: str
) -> None:
    racers = workers(4)
    with open_store(durable_store_url, create=False) as store:
        for round_ in range(5):
            instance_id = f"race-{round_}"
            for racer in racers:  # all released at once, by one line each
                racer.send(f"try {instance_id}")
            outcomes = [racer.result() for racer in racers]
            winners = [o for o in outcomes if o["won"]]
            assert len(winners) == 1, outcomes
            winner = winners[0]
            assert winner["taken_over"] is False
            for loser in outcomes:
                if loser is not winner:
                    assert loser["error_holder"] == winner["holder"]
            stored = store.read_lease(instance_id)
            assert stored is not None
            assert stored.holder == winner["holder"]


@pytest.mark.timeout(60)
async def test_a_lease_left_by_an_exited_process_is_taken_over(
    workers: Callable[[int], list[LeaseWorker]], durable_store_url: str
) -> None:
    (holder,) = workers(1)
    holder.send("try crashed")
    won = holder.result()
    assert won["won"] is True
    holder.stop()  # it exits without releasing its lease (ttl 60 s: far from expired)
    with open_store(durable_store_url) as store:
        stale = store.read_lease("crashed")
        assert stale is not None
        assert stale.holder == won["holder"]
        assert stale.expires > datetime.now(UTC)
        mine = LeaseKeeper(store, "crashed", owner=process_owner())
        assert await mine.acquire() is True
        assert mine.taken_over == stale
        await mine.release()
