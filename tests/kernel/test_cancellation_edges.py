"""Cancellation edge cases: who cancelled decides what the log records.

* The run's own task was cancelled (its caller, a consumer, a dropped stream): the open superstep
  is aborted as ``cancelled``, ``RunCancelled`` is appended, and ``CancelledError`` propagates.
* A handler raised ``CancelledError`` although nobody cancelled the run (a sub-task it awaited was
  cancelled by someone else): a failure of that executor, recorded the same way whatever the
  width of the superstep, streaming or not; the caller gets an ``ExecutionError``.
* A handler that swallows a cancellation (the caller's, or the runner's after a sibling failed)
  and then writes: the write is refused and never reaches the log, the run ends as it would have,
  and blame and the committed-state fold say the superstep's writes never counted.

Each case runs on memory and SQLite, in "superstep" and "write" durability. A handler that ignores
cancellation delays the close of its superstep until it returns: see
``test_the_abort_waits_for_a_handler_that_swallows_the_cancellation``. No test here waits on the
clock; pytest's timeout (pyproject) turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kernel import (
    EventStore,
    ExecutionError,
    Executor,
    StateWriteRejectedError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    fold_committed,
    handler,
    open_store,
)
from projections import fold_blame, fold_history
from tests.kernel.helpers import of_type, staged

DURABILITIES = ["superstep", "write"]


@pytest.fixture(params=["memory", "sqlite"])
def local_store(request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """An empty store on memory, then on SQLite (a file under the test's ``tmp_path``)."""
    url = "memory://" if request.param == "memory" else request.getfixturevalue("sqlite_url")
    opened = open_store(url)
    try:
        yield opened
    finally:
        opened.close()


# -- executors ------------------------------------------------------------------------------------


class AwaitsSubtask(Executor):
    """Stages ``before``; for a message other than 0, awaits a sub-task of its own, which it hands
    over through ``subtasks`` (for someone else to cancel, or not)."""

    def __init__(self, id: str, subtasks: asyncio.Queue[asyncio.Task[Any]]) -> None:
        super().__init__(id)
        self.subtasks = subtasks

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("before", n)
        if n == 0:
            return
        sub = asyncio.create_task(asyncio.Event().wait())
        self.subtasks.put_nowait(sub)
        await sub
        ctx.set_state("after", n)


class Idle(Executor):
    """Returns at once on 0; otherwise waits until cancelled."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        if n != 0:
            await asyncio.Event().wait()


class Source(Executor):
    """Sends its message on (to a fan-out)."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Swallows(Executor):
    """Stages ``before`` and waits; when cancelled, swallows it and stages ``late``.

    ``refusal`` keeps the ``StateWriteRejectedError`` of the late write. With ``reraise`` it lets
    the refusal out of the handler; without, it returns as if nothing happened. ``hold``, if given,
    is awaited between the swallowed cancellation and the late write (``swallowed`` is set then).
    """

    def __init__(
        self,
        id: str,
        wrote: asyncio.Event,
        *,
        reraise: bool,
        hold: asyncio.Event | None = None,
    ) -> None:
        super().__init__(id)
        self.wrote = wrote
        self.reraise = reraise
        self.hold = hold
        self.swallowed = asyncio.Event()
        self.refusal: StateWriteRejectedError | None = None

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("before", n)
        self.wrote.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.swallowed.set()
            if self.hold is not None:
                await self.hold.wait()
            try:
                ctx.set_state("late", n)
            except StateWriteRejectedError as refusal:
                self.refusal = refusal
                if self.reraise:
                    raise


class FailsOnCue(Executor):
    """Raises ``ValueError("sibling failed")`` once ``cue`` is set."""

    def __init__(self, id: str, cue: asyncio.Event) -> None:
        super().__init__(id)
        self.cue = cue

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await self.cue.wait()
        raise ValueError("sibling failed")


# -- helpers --------------------------------------------------------------------------------------


def workflow(store: EventStore, durability: str, main: Executor, *others: Executor) -> Workflow:
    """``main`` alone (a superstep of width 1, run inline), or fanned out to with ``others``."""
    if not others:
        builder = WorkflowBuilder(start_executor=main, store=store, durability=durability)
    else:
        source = Source("source")
        builder = WorkflowBuilder(start_executor=source, store=store, durability=durability)
        builder.add_fan_out_edges(source, [main, *others])
    return builder.build()


async def run_it(wf: Workflow, n: int, *, stream: bool, seen: list[WorkflowEvent]) -> None:
    """Run ``wf`` on ``n`` to its end, keeping what a stream yields in ``seen``."""
    if stream:
        async for event in wf.run(n, stream=True):
            seen.append(event)
    else:
        await wf.run(n)


async def cancel_when(task: asyncio.Task[None], ready: asyncio.Event) -> None:
    """Cancel ``task`` (the run's caller) once ``ready`` is set; it must end cancelled."""
    await ready.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def ends(wf: Workflow) -> list[tuple[str, Any, Any]]:
    """The log's failure and closing records: (type, executor or reason, error type)."""
    found = []
    for event in wf.events():
        if event.type == "executor_failed":
            found.append((event.type, event.executor_id, event.error.type))
        elif event.type == "superstep_aborted":
            found.append((event.type, event.reason, event.error and event.error.type))
        elif event.type in ("run_failed", "run_cancelled", "run_completed"):
            error = getattr(event, "error", None)
            found.append((event.type, getattr(event, "executor_id", None), error and error.type))
    return found


def verdicts(wf: Workflow, key: str) -> list[tuple[str, str | None]]:
    """What blame says of each write of ``key``: (status, reason)."""
    return [(w.status, w.reason) for w in fold_blame(wf.events()).writes(key)]


# -- a CancelledError nobody asked for ------------------------------------------------------------


@pytest.mark.parametrize("durability", DURABILITIES)
@pytest.mark.parametrize("stream", [False, True], ids=["awaited", "streamed"])
@pytest.mark.parametrize("width", [1, 2, 5])
async def test_a_subtask_cancelled_by_someone_else_is_a_failure_of_its_executor(
    local_store, durability, stream, width
):
    subtasks: asyncio.Queue[asyncio.Task[Any]] = asyncio.Queue()
    culprit = AwaitsSubtask("culprit", subtasks)
    idle = [Idle(f"idle{i}") for i in range(width - 1)]
    wf = workflow(local_store, durability, culprit, *idle)

    async def someone_else() -> None:
        (await subtasks.get()).cancel()

    other = asyncio.create_task(someone_else())
    seen: list[WorkflowEvent] = []
    with pytest.raises(ExecutionError, match=r"'culprit' raised asyncio\.CancelledError") as caught:
        await run_it(wf, 1, stream=stream, seen=seen)
    await other

    assert isinstance(caught.value.__cause__, asyncio.CancelledError)
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0  # the caller was never cancelled
    failure = "kernel.ExecutionError"
    siblings = [("executor_failed", e.id, "asyncio.CancelledError") for e in idle]
    assert ends(wf) == [
        ("executor_failed", "culprit", failure),
        *siblings,
        ("superstep_aborted", "failed", failure),
        ("run_failed", "culprit", failure),
    ]
    for sibling in of_type(wf.events(), "executor_failed")[1:]:
        assert sibling.error.message == "cancelled: 'culprit' failed"
    (run_failed,) = of_type(wf.events(), "run_failed")
    assert run_failed.error.message == str(caught.value)
    if stream:
        assert [(e.type, e.executor_id) for e in seen[-2:]] == [
            ("executor_failed", "culprit"),
            ("failed", "culprit"),
        ]
        assert seen[-1].error is caught.value
    assert verdicts(wf, "before") == [("aborted", "failed")]
    assert staged(wf, "after") == []
    (record,) = fold_history(wf.events()).runs()
    assert (record.status, record.error and record.error.type) == ("failed", failure)
    assert fold_committed(wf.events()).values == {} == wf.committed_state()

    await wf.run(0)  # the instance is usable, and the next run commits
    assert wf.committed_state() == {"before": 0}


@pytest.mark.parametrize("stream", [False, True], ids=["awaited", "streamed"])
@pytest.mark.parametrize("width", [1, 2])
async def test_a_cancelled_caller_is_a_cancellation_even_while_a_handler_awaits_a_subtask(
    local_store, stream, width
):
    # Cancelling the run's task cancels what its handler awaits (inline, the sub-task itself):
    # the handler sees CancelledError just as in the test above, but this time the run was
    # cancelled, and it is recorded and propagated as a cancellation.
    subtasks: asyncio.Queue[asyncio.Task[Any]] = asyncio.Queue()
    culprit = AwaitsSubtask("culprit", subtasks)
    wf = workflow(local_store, "superstep", culprit, *[Idle(f"idle{i}") for i in range(width - 1)])
    awaiting = asyncio.Event()

    async def caller() -> None:
        await run_it(wf, 1, stream=stream, seen=[])

    async def announce() -> None:
        sub = await subtasks.get()
        awaiting.set()
        await asyncio.wait({sub})

    watcher = asyncio.create_task(announce())
    await cancel_when(asyncio.create_task(caller()), awaiting)
    await watcher

    assert ends(wf) == [("superstep_aborted", "cancelled", None), ("run_cancelled", None, None)]
    assert verdicts(wf, "before") == [("aborted", "cancelled")]
    (record,) = fold_history(wf.events()).runs()
    assert record.status == "cancelled"


# -- handlers that swallow a cancellation and write -----------------------------------------------


@pytest.mark.parametrize("durability", DURABILITIES)
@pytest.mark.parametrize("reraise", [False, True], ids=["returns", "raises-the-refusal"])
@pytest.mark.parametrize("stream", [False, True], ids=["awaited", "streamed"])
@pytest.mark.parametrize("width", [1, 2])
async def test_a_handler_that_swallows_the_callers_cancellation_cannot_write(
    local_store, durability, stream, reraise, width
):
    wrote = asyncio.Event()
    swallower = Swallows("swallower", wrote, reraise=reraise)
    wf = workflow(local_store, durability, swallower, *[Idle(f"idle{i}") for i in range(width - 1)])

    async def caller() -> None:
        await run_it(wf, 1, stream=stream, seen=[])

    await cancel_when(asyncio.create_task(caller()), wrote)

    assert isinstance(swallower.refusal, StateWriteRejectedError)
    assert "aborted (cancelled)" in str(swallower.refusal)
    assert [w.value for w in staged(wf, "before")] == [1]
    assert staged(wf, "late") == []
    refused = [("executor_failed", "swallower", "kernel.StateWriteRejectedError")] * reraise
    assert ends(wf) == [
        *refused,
        ("superstep_aborted", "cancelled", None),
        ("run_cancelled", None, None),
    ]
    completed = {e.executor_id for e in of_type(wf.events(), "executor_completed")}
    assert completed == ({"source"} if width == 2 else set())  # the swallower completed nothing
    assert verdicts(wf, "before") == [("aborted", "cancelled")]
    assert fold_committed(wf.events()).values == {} == wf.committed_state()
    (record,) = fold_history(wf.events()).runs()
    assert record.status == "cancelled"


@pytest.mark.parametrize("durability", DURABILITIES)
@pytest.mark.parametrize("reraise", [False, True], ids=["returns", "raises-the-refusal"])
@pytest.mark.parametrize("stream", [False, True], ids=["awaited", "streamed"])
async def test_a_handler_that_swallows_the_runners_cancellation_after_a_sibling_failed(
    local_store, durability, stream, reraise
):
    wrote = asyncio.Event()
    swallower = Swallows("swallower", wrote, reraise=reraise)
    wf = workflow(local_store, durability, swallower, FailsOnCue("failer", wrote))

    with pytest.raises(ValueError, match="sibling failed"):
        await run_it(wf, 1, stream=stream, seen=[])

    assert isinstance(swallower.refusal, StateWriteRejectedError)
    assert "aborted (failed)" in str(swallower.refusal)
    assert staged(wf, "late") == []
    # Either way the swallower is not the cause: RunFailed names the failer.
    swallower_record = "kernel.StateWriteRejectedError" if reraise else "asyncio.CancelledError"
    assert sorted(ends(wf)[:2]) == [
        ("executor_failed", "failer", "ValueError"),
        ("executor_failed", "swallower", swallower_record),
    ]
    assert ends(wf)[2:] == [
        ("superstep_aborted", "failed", "ValueError"),
        ("run_failed", "failer", "ValueError"),
    ]
    completed = {e.executor_id for e in of_type(wf.events(), "executor_completed")}
    assert completed == {"source"}  # the swallower's return is not a completion
    assert verdicts(wf, "before") == [("aborted", "failed")]
    assert fold_committed(wf.events()).values == {} == wf.committed_state()


async def test_the_abort_waits_for_a_handler_that_swallows_the_cancellation(local_store):
    # What steplog does with a handler that ignores the runner's cancellation: its superstep is
    # closed at once (its writes are refused from then on), but the abort marker and the run's
    # end are appended, and the caller answered, only when the handler returns. One that never
    # returns holds its run (and the instance's lease) as long as the process lives.
    wrote, hold = asyncio.Event(), asyncio.Event()
    swallower = Swallows("swallower", wrote, reraise=False, hold=hold)
    wf = workflow(local_store, "write", swallower, FailsOnCue("failer", wrote))

    run = asyncio.create_task(wf.run(1))
    await swallower.swallowed.wait()

    assert not run.done()
    assert [e.type for e in of_type(wf.events(), "executor_failed")] == ["executor_failed"]
    assert of_type(wf.events(), "superstep_aborted") == []
    hold.set()
    with pytest.raises(ValueError, match="sibling failed"):
        await run
    assert "aborted (failed)" in str(swallower.refusal)
    assert [e.type for e in wf.events()][-2:] == ["superstep_aborted", "run_failed"]
    assert staged(wf, "late") == []


# -- a handler that blocks the event loop past its caller's timeout ------------------------------


class Blocks(Executor):
    """Stages ``n`` and counts its calls; on 1 it blocks the event loop (``time.sleep``) for
    ``BLOCK`` seconds, after starting ``hold`` (which keeps the store's write lock, if any, so
    that the superstep's commit is still in flight when the held-back timeout is delivered).
    Sends ``n + 1`` on until ``limit``."""

    def __init__(self, limit: int, hold: Callable[[], None]) -> None:
        super().__init__("blocks")
        self.limit = limit
        self.hold = hold
        self.calls: list[int] = []

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        self.calls.append(n)
        ctx.set_state("n", n)
        if n == 1:
            self.hold()
            time.sleep(BLOCK)  # noqa: ASYNC251 - the point: the loop is blocked
        await ctx.yield_output(n)
        if n < self.limit:
            await ctx.send_message(n + 1)


BLOCK = 0.2  # seconds the handler blocks the loop; the caller's timeout is a quarter of it


def write_lock_holder(store: EventStore, seconds: float) -> Callable[[], None]:
    """A function that takes the SQLite store's write lock from another connection, in a
    thread, for ``seconds`` (the commit that follows waits on it); nothing on memory."""
    if not store.url.startswith("sqlite"):
        return lambda: None
    path = store.url.removeprefix("sqlite:///")
    taken = threading.Event()

    def keep() -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(seconds)
            connection.execute("ROLLBACK")
        finally:
            connection.close()

    def hold() -> None:
        threading.Thread(target=keep, daemon=True).start()
        assert taken.wait(5)

    return hold


@pytest.fixture
def any_store(store_url: str) -> Iterator[EventStore]:
    """An empty store on memory, SQLite and PostgreSQL."""
    with open_store(store_url) as opened:
        yield opened


@pytest.mark.parametrize("durability", DURABILITIES)
@pytest.mark.parametrize("limit", ["wait_for", "timeout"])
async def test_a_caller_whose_timeout_a_blocking_handler_held_back_gets_what_the_log_says(
    any_store: EventStore, durability: str, limit: str
) -> None:
    # The handler blocks the loop past the caller's timeout, so the timeout is delivered only
    # when it returns: in "superstep" durability on SQLite (deterministically: another
    # connection holds the write lock) and PostgreSQL, while the run's last commit (with the
    # run's end) is in flight. The commit lands; the run is over. The caller gets its result, as
    # the log has it, never a TimeoutError for a run the log says completed.
    blocks = Blocks(1, write_lock_holder(any_store, BLOCK * 2))
    wf = workflow(any_store, durability, blocks)

    if limit == "wait_for":
        result = await asyncio.wait_for(wf.run(1), BLOCK / 4)
    else:
        async with asyncio.timeout(BLOCK / 4):
            result = await wf.run(1)

    assert (result.status, result.get_outputs()) == ("completed", [1])
    assert [e.type for e in wf.events()][-2:] == ["superstep_committed", "run_completed"]
    assert wf.events()[-1].run_id == result.run_id
    assert asyncio.current_task().cancelling() == 0  # nothing left pending against the caller
    await asyncio.sleep(0)  # and no cancellation is delivered later


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_a_caller_that_timed_out_after_a_commit_resumes_the_run_it_did_not_see_end(
    local_store: EventStore, durability: str
) -> None:
    # A run of three supersteps whose first blocks the loop past the timeout. Wherever the
    # timeout lands, what the caller sees and the log agree: a result and a completed run, or
    # a TimeoutError and a run cancelled after the supersteps it committed (in "superstep"
    # durability on SQLite: after the first, whose commit was in flight). A retrying caller
    # resumes the run (docs/recovery.md): no committed superstep runs again.
    blocks = Blocks(3, write_lock_holder(local_store, BLOCK * 2))
    builder = WorkflowBuilder(start_executor=blocks, store=local_store, durability=durability)
    wf = builder.add_edge(blocks, blocks).build()

    try:
        result = await asyncio.wait_for(wf.run(1), BLOCK / 4)
    except TimeoutError:
        kinds = [e.type for e in wf.events()]
        assert kinds[-2:] == ["superstep_aborted", "run_cancelled"]
        committed = kinds.count("superstep_committed")
        before = list(blocks.calls)  # the committed supersteps' calls, and the aborted one's
        assert before[:committed] == list(range(1, committed + 1))
        result = await wf.resume()
        assert blocks.calls[len(before) :] == list(range(committed + 1, 4))  # from the abort on
        if local_store.url.startswith("sqlite") and durability == "superstep":
            assert committed == 1
    else:
        assert blocks.calls == [1, 2, 3]
    assert (result.status, result.get_outputs()) == ("completed", [1, 2, 3])
    assert [e.type for e in wf.events()][-1] == "run_completed"
    assert wf.committed_state() == {"n": 3}
