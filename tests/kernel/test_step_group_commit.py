"""Recorded steps through the store's group commit: a step's record is durable before the step
returns, the event loop is free during its fsync, and records made at once share a commit (the
run's other steps, other instances'), in order, before their superstep's closing."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator

import pytest

from kernel import (
    EventStore,
    Executor,
    StepRecorded,
    StoreUnavailableError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
)
from tests.kernel.helpers import kinds, markers
from tests.kernel.test_group_commit import Gate, until

CALLS: list[int] = []


@step
async def double(n: int) -> int:
    CALLS.append(n)
    return 2 * n


class Gathers(Executor):
    """Calls ``double`` on 1..width at once (``asyncio.gather``), then sets and yields the sum."""

    def __init__(self, width: int) -> None:
        super().__init__("gathers")
        self.width = width

    @handler
    async def run(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        got = await asyncio.gather(*(double(message + i) for i in range(self.width)))
        ctx.set_state("sum", sum(got))
        await ctx.yield_output(sum(got))


def gathering(store: EventStore, instance_id: str, width: int) -> Workflow:
    return WorkflowBuilder(Gathers(width), store=store, instance_id=instance_id).build()


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[EventStore]:
    CALLS.clear()
    with open_store(sqlite_url) as opened:
        yield opened


def records(wf: Workflow) -> list[StepRecorded]:
    return [e for e in wf.events() if isinstance(e, StepRecorded)]


async def test_steps_gathered_in_a_handler_share_a_commit(sqlite_store: EventStore) -> None:
    store = sqlite_store
    gate = Gate(store)
    wf = gathering(store, "g", 5)
    run = asyncio.create_task(wf.run(1))
    await until(gate.entered)  # the first record's commit is held: the loop is free meanwhile
    assert sorted(CALLS) == [1, 2, 3, 4, 5]  # every step ran while it was in flight
    gate.opened.set()
    result = await run
    assert result.get_outputs() == [30]
    # Three commits of one batch each: the first record alone, the other four together
    # (buffered while it was in flight), then the superstep's commit batch.
    assert gate.rounds == [1, 1, 1]
    found = records(wf)
    assert sorted(store.codec.decode(r.result) for r in found) == [2, 4, 6, 8, 10]
    positions = [r.position for r in found]
    assert positions == list(range(positions[0], positions[0] + 5))
    kinds_ = kinds(wf.events())
    assert kinds_.index("superstep_committed") > kinds_.index("step_recorded") + 4
    assert list(markers(wf).values()) == ["committed"]
    assert store.verify_chain("g").ok
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as db:  # durable, in the file
        (rows,) = db.execute("SELECT count(*) FROM steplog_events").fetchone()
    assert rows == 4  # a row per batch: the run's start, the two batches of records, the commit


async def test_steps_of_instances_running_at_once_share_a_commit(sqlite_store: EventStore) -> None:
    store = sqlite_store
    gate = Gate(store)
    workflows = [gathering(store, f"i{k}", 1) for k in range(4)]
    runs = [asyncio.create_task(wf.run(10 * k)) for k, wf in enumerate(workflows)]
    await until(gate.entered)  # the first transaction is held: every record is made meanwhile
    await asyncio.sleep(0.05)
    gate.opened.set()
    results = await asyncio.gather(*runs)
    assert [r.get_outputs() for r in results] == [[0], [20], [40], [60]]
    # Four records and four commit batches: the records went in the first two transactions (the
    # records made while the first was held wait for the next one, together).
    assert sum(gate.rounds) == 8
    assert gate.rounds[0] + gate.rounds[1] >= 4
    assert len(gate.rounds) < 8
    for wf in workflows:
        assert len(records(wf)) == 1
        assert list(markers(wf).values()) == ["committed"]


async def test_a_run_cancelled_while_a_record_is_in_flight_keeps_it_and_resumes_past_it(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    gate = Gate(store)
    wf = gathering(store, "c", 1)
    run = asyncio.create_task(wf.run(7))
    await until(gate.entered)
    run.cancel()
    await asyncio.sleep(0.02)
    assert not run.done()  # waiting for the outcome of the record, which cannot be taken back
    gate.opened.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert kinds(wf.events())[-3:] == ["step_recorded", "superstep_aborted", "run_cancelled"]
    assert list(markers(wf).values()) == ["aborted:cancelled"]
    assert CALLS == [7]
    resumed = await gathering(store, "c", 1).resume()
    assert resumed.get_outputs() == [14]
    assert CALLS == [7]  # served from the log
    assert store.verify_chain("c").ok


async def test_a_record_whose_commit_fails_fails_its_step_and_the_abort_is_recorded(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    gate = Gate(store)
    gate.fail_with = sqlite3.OperationalError("disk I/O error")
    wf = gathering(store, "f", 3)
    run = asyncio.create_task(wf.run(1))
    await until(gate.entered)
    gate.opened.set()
    with pytest.raises(StoreUnavailableError):
        await run
    assert list(markers(wf).values()) == ["aborted:failed"]
    assert kinds(wf.events())[-1] == "run_failed"
    assert records(wf) == []  # nothing of a failed commit is in the log
    assert store.verify_chain("f").ok
    gate.fail_with = None
    assert (await gathering(store, "f", 3).run(1)).get_outputs() == [12]


class Detaches(Executor):
    """Starts ``double`` in a task of its own, lets it reach its record, then fails."""

    def __init__(self) -> None:
        super().__init__("detaches")
        self.task: asyncio.Task[int] | None = None

    @handler
    async def run(self, message: int, ctx: WorkflowContext[int]) -> None:
        self.task = asyncio.create_task(double(message))
        await asyncio.sleep(0)  # the step runs, and its record goes in flight
        raise RuntimeError("the handler fails while the record is in flight")


async def test_a_run_closing_while_a_record_is_in_flight_appends_its_closing_after_it(
    sqlite_store: EventStore,
) -> None:
    store = sqlite_store
    gate = Gate(store)
    detaches = Detaches()
    wf = WorkflowBuilder(detaches, store=store, instance_id="d").build()
    opener = threading.Timer(0.1, gate.opened.set)  # the closing blocks the loop until then
    opener.start()
    with pytest.raises(RuntimeError, match="in flight"):
        await wf.run(3)
    opener.join()
    assert gate.rounds == [1]  # the record's commit; the closing went in after it, at once
    found = kinds(wf.events())
    assert found[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]
    assert found.index("step_recorded") < found.index("executor_failed")
    assert list(markers(wf).values()) == ["aborted:failed"]
    assert detaches.task is not None
    assert await detaches.task == 6  # the step learns its record landed
    assert store.verify_chain("d").ok
