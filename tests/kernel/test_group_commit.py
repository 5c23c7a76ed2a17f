"""Group commit: concurrent runs on one store share transactions, and every guarantee holds.

The committer's first transaction is held open (a gate in the store's ``_insert_rows``) so that
the other runs' batches are queued behind it: what is shared, and when, is then deterministic.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from kernel import (
    EventStore,
    Executor,
    RunCancelled,
    StoreUnavailableError,
    SuperstepAborted,
    SuperstepCommitted,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel.testing import LogBuilder, ticking_clock
from tests.kernel.helpers import kinds, markers


class Count(Executor):
    """Stages ``n`` and sends ``n + 1`` to itself until ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__("count")
        self.limit = limit

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("n", n)
        if n < self.limit:
            await ctx.send_message(n + 1)


def count_to(store: EventStore, instance_id: str, limit: int) -> Workflow:
    start = Count(limit)
    return (
        WorkflowBuilder(start, store=store, instance_id=instance_id).add_edge(start, start).build()
    )


class Gate:
    """Holds the committer thread's transactions until opened; counts the batches of each round.
    Every round goes to the thread (``GroupCommitter.inline`` off), so the loop runs meanwhile."""

    def __init__(self, store: EventStore) -> None:
        store.group_committer().inline = False
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.rounds: list[int] = []
        self.fail_with: BaseException | None = None
        insert = store.backend.insert_rows

        def gated(rows: Sequence[Any]) -> Any:
            if threading.current_thread().name != "steplog-group-commit":
                return insert(rows)  # a run's own append (its start, its end): not a round
            self.entered.set()
            self.opened.wait(10)
            self.rounds.append(len(rows))
            if self.fail_with is not None:
                raise self.fail_with
            return insert(rows)

        store.backend.insert_rows = gated  # type: ignore[method-assign]


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[EventStore]:
    with open_store(sqlite_url) as opened:
        yield opened


async def queued(store: EventStore, count: int) -> None:
    """Wait until ``count`` batches wait in the store's group committer."""
    committer = store.group_committer()
    for _ in range(2000):
        with committer._ready:
            if len(committer._queue) >= count:
                return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{count} batches never queued")


async def until(condition: threading.Event) -> None:
    for _ in range(1000):
        if condition.is_set():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out")


async def test_runs_that_are_ready_together_share_one_commit(sqlite_store: EventStore) -> None:
    store = sqlite_store
    gate = Gate(store)
    workflows = [count_to(store, f"w{i}", 3) for i in range(8)]
    runs = [asyncio.create_task(wf.run(1)) for wf in workflows]
    await until(gate.entered)
    await queued(store, 7)  # the other runs reach their commit and queue behind the first
    gate.opened.set()
    results = await asyncio.gather(*runs)
    assert [r.status for r in results] == ["completed"] * 8
    assert gate.rounds[0] == 1
    # The 7 batches queued behind the first go in one transaction; the first run's next batch
    # joins them when it is ready before the committer takes the queue (a loaded machine).
    assert gate.rounds[1] in (7, 8)
    assert sum(gate.rounds) == 8 * 3
    assert len(gate.rounds) < 8 * 3
    committer = store.group_committer()
    assert (committer.rounds, committer.batches) == (len(gate.rounds), 8 * 3)
    for wf in workflows:
        assert wf.committed_state() == {"n": 3}
        assert list(markers(wf).values()) == ["committed"] * 3
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as db:  # durable, in the file
        (rows,) = db.execute("SELECT count(*) FROM steplog_events").fetchone()
    assert rows == 8 + 8 * 3  # each run's start, then one row per superstep


async def test_a_run_cancelled_while_its_commit_is_in_flight_records_the_commit_first(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    gate = Gate(store)
    wf = count_to(store, "w", 3)
    run = asyncio.create_task(wf.run(1))
    await until(gate.entered)
    run.cancel()
    await asyncio.sleep(0.02)
    assert not run.done()  # waiting for the outcome of its batch, which cannot be taken back
    gate.opened.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    events = wf.events()
    assert list(markers(wf).values()) == ["committed", "aborted:cancelled"]
    assert kinds(events)[-2:] == ["superstep_aborted", "run_cancelled"]
    aborted = next(e for e in events if isinstance(e, SuperstepAborted))
    committed = next(e for e in events if isinstance(e, SuperstepCommitted))
    assert aborted.superstep_id != committed.superstep_id  # the next one, never the landed one
    assert isinstance(events[-1], RunCancelled)
    assert wf.committed_state() == {"n": 1}
    result = await count_to(store, "w", 3).run(1)  # the instance goes on as usual
    assert result.status == "completed"


async def test_a_failed_transaction_fails_every_run_in_it_and_each_records_its_abort(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    gate = Gate(store)
    gate.fail_with = sqlite3.OperationalError("disk I/O error")
    workflows = [count_to(store, f"w{i}", 3) for i in range(3)]
    runs = [asyncio.create_task(wf.run(1)) for wf in workflows]
    await until(gate.entered)
    await queued(store, 2)
    gate.opened.set()
    outcomes = await asyncio.gather(*runs, return_exceptions=True)
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
    for wf in workflows:
        assert list(markers(wf).values()) == ["aborted:failed"]
        assert wf.committed_state() == {}
        assert kinds(wf.events())[-1] == "run_failed"
    gate.fail_with = None
    assert (await count_to(store, "w0", 3).run(1)).status == "completed"


async def test_closing_the_store_commits_what_is_queued(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    result = await count_to(store, "w", 2).run(1)
    assert result.status == "completed"
    store.close()
    with open_store(sqlite_url, create=False) as reopened:
        assert [e.type for e in reopened.read("w")].count("superstep_committed") == 2


async def test_a_batch_queued_as_the_idle_committer_stops_is_still_committed(
    sqlite_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    monkeypatch.setattr("kernel._store._group.IDLE_SECONDS", 0.05)
    committer = store.group_committer()
    first = count_to(store, "w", 1)
    assert (await first.run(1)).status == "completed"
    log = LogBuilder("v", clock=ticking_clock())
    log.start_run()
    with committer._ready:  # the idle wait times out while this thread holds the lock
        time.sleep(0.2)  # noqa: ASYNC251 - blocking on purpose, holding the committer's lock
        future = committer.submit(store.prepare("v", log.events(), expected_version=0))
    assert len(await asyncio.wait_for(future, 5)) == 1
    assert store.version("v") == 1


# -- rounds led inline by the caller's loop ------------------------------------------------------


def inline_rounds(store: EventStore) -> list[tuple[str, int]]:
    """Record each round's thread and batch count (``insert_rows`` calls of more than the run's
    own appends are told apart by the caller: every call is recorded)."""
    calls: list[tuple[str, int]] = []
    insert = store.backend.insert_rows

    def counted(rows: Sequence[Any]) -> Any:
        calls.append((threading.current_thread().name, len(rows)))
        return insert(rows)

    store.backend.insert_rows = counted  # type: ignore[method-assign]
    return calls


async def test_a_lone_run_commits_on_its_own_loop_without_the_thread(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    calls = inline_rounds(store)
    wf = count_to(store, "w", 5)
    assert (await wf.run(1)).status == "completed"
    committer = store.group_committer()
    assert (committer.rounds, committer.inline_rounds, committer.batches) == (5, 5, 5)
    assert committer._thread is None  # never started
    assert {name for name, _ in calls} == {threading.current_thread().name}
    assert list(markers(wf).values()) == ["committed"] * 5
    assert wf.committed_state() == {"n": 5}


async def test_runs_of_one_loop_ready_together_share_an_inline_round(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    workflows = [count_to(store, f"w{i}", 3) for i in range(8)]
    results = await asyncio.gather(*(wf.run(1) for wf in workflows))
    assert [r.status for r in results] == ["completed"] * 8
    committer = store.group_committer()
    assert committer.batches == 8 * 3
    assert committer.rounds == committer.inline_rounds == 3  # the 8 runs step together
    assert committer._thread is None
    for wf in workflows:
        assert wf.committed_state() == {"n": 3}


async def test_a_failed_inline_round_fails_only_its_runs_and_each_records_its_abort(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    insert = store.backend.insert_rows
    failing = {"rounds": 1}

    def fails_once(rows: Sequence[Any]) -> Any:
        if len(rows) == 2 and failing["rounds"]:  # the two runs' first commit batches
            failing["rounds"] -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return insert(rows)

    store.backend.insert_rows = fails_once  # type: ignore[method-assign]
    workflows = [count_to(store, f"w{i}", 3) for i in range(2)]
    outcomes = await asyncio.gather(*(wf.run(1) for wf in workflows), return_exceptions=True)
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
    for wf in workflows:
        assert list(markers(wf).values()) == ["aborted:failed"]
        assert kinds(wf.events())[-1] == "run_failed"
    assert (await count_to(store, "w2", 2).run(1)).status == "completed"  # a later run is fine


async def test_a_batch_queued_from_another_loop_during_an_inline_round_goes_to_the_thread(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    calls = inline_rounds(store)
    insert = store.backend.insert_rows
    entered, release = threading.Event(), threading.Event()

    def held(rows: Sequence[Any]) -> Any:
        in_round = store.group_committer()._busy  # the run's first commit, not its start
        if threading.current_thread().name == "held" and in_round and not entered.is_set():
            entered.set()
            release.wait(10)
        return insert(rows)

    store.backend.insert_rows = held  # type: ignore[method-assign]
    outcome: list[Any] = []

    def other_loop() -> None:  # an inline round on its own loop, held in its transaction
        outcome.append(asyncio.run(count_to(store, "other", 2).run(1)).status)

    thread = threading.Thread(target=other_loop, name="held")
    thread.start()
    assert entered.wait(10)
    log = LogBuilder("v", clock=ticking_clock())
    log.start_run()
    future = store.group_committer().submit(store.prepare("v", log.events(), expected_version=0))
    await asyncio.sleep(0.05)
    assert not future.done()  # queued behind the round in flight
    release.set()
    assert len(await asyncio.wait_for(future, 5)) == 1
    thread.join(10)
    assert outcome == ["completed"]
    assert "steplog-group-commit" in {name for name, _ in calls}  # the thread took it, after
    assert store.version("v") == 1


async def test_slow_inline_rounds_send_the_next_rounds_to_the_thread(
    sqlite_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernel._store._group.INLINE_LIMIT", 0.0)
    store = sqlite_store
    calls = inline_rounds(store)
    wf = count_to(store, "w", 4)
    assert (await wf.run(1)).status == "completed"
    committer = store.group_committer()
    assert (committer.rounds, committer.inline_rounds) == (4, 1)  # then the thread's
    assert [name for name, _ in calls].count("steplog-group-commit") == 3
    assert list(markers(wf).values()) == ["committed"] * 4


async def test_a_synchronous_flush_leads_the_round_of_a_batch_still_queued(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    committer = store.group_committer()
    log = LogBuilder("v", clock=ticking_clock())
    log.start_run()
    pending = committer.enqueue(store.prepare("v", log.events(), expected_version=0))
    pending.settle_now()  # its leader has not run yet: the caller leads the round
    assert len(pending.future.result()) == 1
    assert store.version("v") == 1
    assert (committer.rounds, committer.inline_rounds) == (1, 0)
    assert committer._thread is None
    await asyncio.sleep(0)  # the leader scheduled for it finds nothing to do
    assert committer.rounds == 1


async def test_a_lone_run_appends_alone_without_a_leader_and_a_batch_with_company_is_queued(
    sqlite_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    committer = store.group_committer()
    leads: list[object] = []
    lead = committer._lead
    monkeypatch.setattr(committer, "_lead", lambda loop: (leads.append(loop), lead(loop)))
    wf = count_to(store, "w", 4)
    assert (await wf.run(1)).status == "completed"
    # Nothing else was ready on the loop: the batches went alone (but the first, perhaps: the
    # lease's heartbeat task, just made, takes its first turn then).
    assert len(leads) <= 1
    assert (committer.rounds, committer.inline_rounds) == (4, 4)
    log = LogBuilder("v", clock=ticking_clock())
    log.start_run()
    prepared = store.prepare("v", log.events(), expected_version=0)
    asyncio.get_running_loop().call_soon(lambda: None)  # something else is ready to run
    assert committer.commit_alone(prepared) is None  # it would have company: queue it
    assert store.version("v") == 0
    before = len(leads)
    assert len(await committer.submit(prepared)) == 1
    assert len(leads) == before + 1  # a leader took it
