"""The stale-write family: every path by which an aborted superstep's writes could leak.

Each test reads committed state through the public API and checks the log's events. They run on
memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from kernel import (
    EncodingError,
    Executor,
    RunInProgressError,
    StateWriteRejectedError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from tests.kernel.helpers import FailsAfter, fate_of, kinds, markers, of_type, staged


class Msg(BaseModel):
    fail: bool = False


class Flaky(Executor):
    """The handler from the original bug report: stage a secret, then raise."""

    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg, str]) -> None:
        if message.fail:
            ctx.set_state("secret", "x")
            raise RuntimeError("boom")
        ctx.set_state("visits", (ctx.get_state("visits") or 0) + 1)
        await ctx.yield_output("ok")


def builder_for(store: Any, start: Executor, **options: Any) -> WorkflowBuilder:
    return WorkflowBuilder(start_executor=start, store=store, instance_id="orders-42", **options)


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_failed_superstep_never_leaks_into_a_later_successful_run(store, durability):
    wf = builder_for(store, Flaky(id="flaky"), durability=durability).build()

    with pytest.raises(RuntimeError, match="boom"):
        await wf.run(Msg(fail=True))
    result = await wf.run(Msg())

    assert result.get_outputs() == ["ok"]
    assert wf.committed_state() == {"visits": 1}
    (write,) = staged(wf, "secret")
    assert write.value == "x"
    assert fate_of(wf, "secret") == ["aborted:failed"]
    aborted = of_type(wf.events(), "superstep_aborted")[0]
    assert aborted.superstep_id == write.superstep_id
    assert aborted.error.message == "boom"
    committed = {e.superstep_id for e in of_type(wf.events(), "superstep_committed")}
    assert write.superstep_id not in committed
    assert of_type(wf.events(), "run_failed")[0].error.type == "RuntimeError"


async def test_a_fresh_workflow_object_on_the_same_instance_sees_no_leak(store):
    wf = builder_for(store, Flaky(id="flaky")).build()
    with pytest.raises(RuntimeError):
        await wf.run(Msg(fail=True))

    again = builder_for(store, Flaky(id="flaky")).build()
    await again.run(Msg())

    assert again.committed_state() == {"visits": 1}
    assert fate_of(again, "secret") == ["aborted:failed"]


class Blocker(Executor):
    """Stages a write, then waits until cancelled; may try to write again while cancelled."""

    def __init__(self, id: str, started: asyncio.Event, write_when_cancelled: bool = False) -> None:
        super().__init__(id)
        self.started = started
        self.write_when_cancelled = write_when_cancelled
        self.refusal: BaseException | None = None

    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
        ctx.set_state("before", 1)
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.write_when_cancelled:
                try:
                    ctx.set_state("after", 2)
                except StateWriteRejectedError as refusal:
                    self.refusal = refusal
            raise


async def log_seen_when_cancelled(
    wf: Workflow, started: asyncio.Event, body: Callable[[], Awaitable[None]]
) -> list[str]:
    """Run ``body`` in a task and cancel it once ``started`` is set. Returns the log's event types
    as they were when the cancellation reached ``body``'s caller, before it propagated further."""
    seen: list[str] = []

    async def guarded() -> None:
        try:
            await body()
        except asyncio.CancelledError:
            seen.extend(kinds(wf.events()))
            raise

    task = asyncio.create_task(guarded())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return seen


async def test_cancelling_the_caller_mid_superstep_aborts_it_before_propagating(store):
    started = asyncio.Event()
    blocker = Blocker("blocker", started, write_when_cancelled=True)
    wf = builder_for(store, blocker).build()

    async def caller() -> None:
        await wf.run(Msg())

    seen = await log_seen_when_cancelled(wf, started, caller)

    assert seen[-2:] == ["superstep_aborted", "run_cancelled"]
    assert fate_of(wf, "before") == ["aborted:cancelled"]
    assert staged(wf, "after") == []
    assert isinstance(blocker.refusal, StateWriteRejectedError)
    assert "aborted (cancelled)" in str(blocker.refusal)
    assert wf.committed_state() == {}


class Source(Executor):
    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
        await ctx.send_message(message)


class WritesAroundTheFailure(Executor):
    """Writes once, lets its sibling fail, then tries to write again from its cancellation."""

    def __init__(self, id: str, wrote: asyncio.Event) -> None:
        super().__init__(id)
        self.wrote = wrote
        self.refusal: BaseException | None = None

    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
        ctx.set_state("sibling", "before the failure")
        self.wrote.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # still running after the sibling's failure was recorded
            try:
                ctx.set_state("sibling", "after the failure")
            except StateWriteRejectedError as refusal:
                self.refusal = refusal
            raise


async def test_a_sibling_writing_after_another_failed_never_counts(store):
    wrote = asyncio.Event()
    writer = WritesAroundTheFailure("writer", wrote)
    source = Source("source")
    failer = FailsAfter("failer", wrote, "fast failure")
    wf = builder_for(store, source).add_fan_out_edges(source, [failer, writer]).build()

    with pytest.raises(ValueError, match="fast failure"):
        await wf.run(Msg())

    assert [w.value for w in staged(wf, "sibling")] == ["before the failure"]
    assert fate_of(wf, "sibling") == ["aborted:failed"]
    assert isinstance(writer.refusal, StateWriteRejectedError)
    assert "aborted (failed)" in str(writer.refusal)
    failed = {e.executor_id: e.error.type for e in of_type(wf.events(), "executor_failed")}
    assert failed == {"failer": "ValueError", "writer": "asyncio.CancelledError"}
    assert wf.committed_state() == {}


async def test_consumer_cancelled_while_failure_events_are_yielded(store):
    wf = builder_for(store, Flaky(id="flaky")).build()
    received: list[str] = []

    async def consume() -> None:
        async for event in wf.run(Msg(fail=True), stream=True):
            received.append(event.type)
            if event.type == "executor_failed":
                asyncio.current_task().cancel()  # type: ignore[union-attr]

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(consume())

    assert received[-1] == "executor_failed"
    assert fate_of(wf, "secret") == ["aborted:failed"]
    assert kinds(wf.events())[-1] == "run_failed"
    await wf.run(Msg())
    assert wf.committed_state() == {"visits": 1}


async def test_consumer_cancelled_while_waiting_for_the_next_event(store):
    started = asyncio.Event()
    wf = builder_for(store, Blocker("blocker", started)).build()

    async def consume() -> None:
        async for _ in wf.run(Msg(), stream=True):
            pass

    seen = await log_seen_when_cancelled(wf, started, consume)

    assert seen[-2:] == ["superstep_aborted", "run_cancelled"]
    assert fate_of(wf, "before") == ["aborted:cancelled"]


async def test_stream_dropped_after_executor_failed_then_a_new_run_at_once(store):
    wf = builder_for(store, Flaky(id="flaky")).build()

    stream = wf.run(Msg(fail=True), stream=True)
    async for event in stream:
        if event.type == "executor_failed":
            break
    del stream, event
    gc.collect()
    result = await wf.run(Msg())

    assert result.status == "completed"
    assert wf.committed_state() == {"visits": 1}
    assert fate_of(wf, "secret") == ["aborted:failed"]
    assert len(of_type(wf.events(), "superstep_committed")) == 1


class BlocksOnce(Executor):
    """The first run stages a write and blocks; later runs write another key and finish."""

    def __init__(self, id: str, started: asyncio.Event) -> None:
        super().__init__(id)
        self.started = started

    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
        if not self.started.is_set():
            ctx.set_state("first", 1)
            self.started.set()
            await asyncio.Event().wait()
        ctx.set_state("second", 2)


async def test_stream_dropped_mid_superstep_is_aborted_as_abandoned_before_the_next_run(store):
    started = asyncio.Event()
    wf = builder_for(store, BlocksOnce("blocker", started)).build()

    stream = wf.run(Msg(), stream=True)
    async for event in stream:
        if event.type == "executor_invoked":
            break
    await started.wait()
    del stream, event
    await wf.run(Msg())  # at once: no await in between lets the dropped run finish on its own

    events = wf.events()
    order = kinds(events)
    assert of_type(events, "superstep_aborted")[0].reason == "abandoned"
    assert order.index("run_abandoned") < order.index("run_started", 1)
    assert fate_of(wf, "first") == ["aborted:abandoned"]
    assert wf.committed_state() == {"second": 2}


async def test_a_live_run_holds_the_instance_against_any_other_workflow_object(store):
    started = asyncio.Event()
    first = builder_for(store, Blocker("blocker", started), durability="write").build()
    stream = first.run(Msg(), stream=True)
    while (await anext(stream)).type != "executor_invoked":
        pass  # the run hands over one event at a time
    await started.wait()

    other = builder_for(store, Flaky(id="flaky")).build()  # knows nothing of the first object's run
    before = kinds(other.events())
    with pytest.raises(RunInProgressError, match=r"is being run by .*lease expires") as refused:
        await other.run(Msg())
    assert refused.value.holder is not None
    assert kinds(other.events()) == before  # the refused run appended nothing

    await stream.aclose()  # the first run ends (cancelled) and gives the lease up
    await other.run(Msg())
    assert fate_of(other, "before") == ["aborted:cancelled"]
    assert other.committed_state() == {"visits": 1}


async def test_an_unfinished_run_whose_lease_was_released_is_closed_by_the_next_run(store):
    started = asyncio.Event()
    first = builder_for(store, Blocker("blocker", started), durability="write").build()
    stream = first.run(Msg(), stream=True)
    while (await anext(stream)).type != "executor_invoked":
        pass
    await started.wait()
    store.release_lease(first.instance_id, store.read_lease(first.instance_id).holder)

    other = builder_for(store, Flaky(id="flaky")).build()
    await other.run(Msg())

    assert fate_of(other, "before") == ["aborted:abandoned"]
    closed = of_type(other.events(), "run_abandoned")[0]
    assert closed.closed_by == of_type(other.events(), "run_started")[1].run_id
    settled = kinds(other.events())
    await stream.aclose()  # the first run's own abort now conflicts with the log: not appended
    assert kinds(other.events()) == settled
    assert other.committed_state() == {"visits": 1}


async def test_delete_staged_in_an_aborted_superstep_leaves_the_committed_value(store):
    class Deleter(Executor):
        @handler
        async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
            if message.fail:
                ctx.delete_state("keep")
                assert ctx.get_state("keep") is None  # the superstep sees its own delete
                raise RuntimeError("after delete")
            ctx.set_state("keep", {"v": 1})

    wf = builder_for(store, Deleter("deleter")).build()
    await wf.run(Msg())
    with pytest.raises(RuntimeError):
        await wf.run(Msg(fail=True))

    assert wf.committed_state() == {"keep": {"v": 1}}
    deletes = [e for e in staged(wf, "keep") if e.op == "delete"]
    assert len(deletes) == 1
    assert markers(wf)[deletes[0].superstep_id] == "aborted:failed"


class Unencodable(Executor):
    @handler
    async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
        ctx.set_state("fine", 1)
        if message.fail:
            ctx.set_state("handle", object())
        ctx.set_state("done", True)


async def test_a_value_that_cannot_be_encoded_aborts_the_superstep_and_the_next_run_works(store):
    wf = builder_for(store, Unencodable("enc")).build()

    with pytest.raises(EncodingError) as caught:
        await wf.run(Msg(fail=True))

    assert "state key 'handle'" in str(caught.value)
    assert "builtins.object" in str(caught.value)
    assert staged(wf, "handle") == []  # refused before anything was appended for it
    assert fate_of(wf, "fine") == ["aborted:failed"]
    await wf.run(Msg())
    assert wf.committed_state() == {"fine": 1, "done": True}


async def test_writes_from_a_task_that_outlives_its_superstep_are_refused(store):
    leaked: list[asyncio.Task[None]] = []

    class Spawner(Executor):
        @handler
        async def run(self, message: Msg, ctx: WorkflowContext[Msg]) -> None:
            async def later() -> None:
                await asyncio.sleep(0.01)
                ctx.set_state("late", 1)

            leaked.append(asyncio.create_task(later()))

    wf = builder_for(store, Spawner("spawner")).build()
    await wf.run(Msg())
    with pytest.raises(StateWriteRejectedError, match="already committed"):
        await leaked[0]
    assert staged(wf, "late") == []
    assert wf.committed_state() == {}
