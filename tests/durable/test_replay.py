"""Replay: a past run's stream rebuilt from the log equals what its live consumer got."""

from __future__ import annotations

import asyncio
from typing import Any, Never

import pytest

from kernel import (
    ErrorInfo,
    ExecutionError,
    Executor,
    RecordedError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    counter_ids,
    handler,
    open_store,
    replay,
    response_handler,
)
from tests.durable.helpers import Approval, Counter, Reviewer, Tick


class Stamper(Reviewer):
    """A ``Reviewer`` that takes any answer: it yields the draft stamped with it."""

    @response_handler
    async def decided(self, request: Approval, answer: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("approved", request.draft)
        await ctx.yield_output(f"{request.draft}: {answer}")


class Source(Executor):
    """Sends its number to every worker."""

    @handler
    async def start(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Worker(Executor):
    """Stages ``<id> = n`` and yields ``"<id>:<n>"``, after yielding to the loop ``pauses``
    times; or fails, if ``failing``."""

    def __init__(self, id: str, *, pauses: int = 0, failing: bool = False) -> None:
        super().__init__(id)
        self.pauses = pauses
        self.failing = failing

    @handler
    async def work(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        for _ in range(self.pauses):
            await asyncio.sleep(0)
        if self.failing:
            raise ValueError(f"{self.id} cannot take {n}")
        ctx.set_state(self.id, n)
        await ctx.yield_output(f"{self.id}:{n}")


def fan_out(store: Any, workers: list[Worker]) -> Any:
    source = Source("source")
    return (
        WorkflowBuilder(start_executor=source, store=store, instance_id="fan")
        .add_fan_out_edges(source, workers)
        .build()
    )


def counter(store: Any, *, fail_at: int | None = None, instance_id: str = "count") -> Any:
    step = Counter("counter", 4, fail_at=fail_at)
    return (
        WorkflowBuilder(start_executor=step, store=store, instance_id=instance_id)
        .add_edge(step, step)
        .build()
    )


def fields(event: WorkflowEvent) -> tuple[Any, ...]:
    """Every field of an event; an exception as its recorded type and message."""
    error = event.error
    if isinstance(error, RecordedError):
        shown: Any = error.info
    elif error is not None:
        shown = ErrorInfo.of(error)
    else:
        shown = None
    return (
        event.type,
        event.run_id,
        event.superstep,
        event.superstep_id,
        event.executor_id,
        event.data,
        shown,
        event.request_id,
        event.state,
        event.details,
        event.origin,
    )


async def live(stream: Any) -> tuple[list[WorkflowEvent], BaseException | None]:
    """The events a consumer of ``stream`` got, and the exception it ended with, if any."""
    seen: list[WorkflowEvent] = []
    try:
        async for event in stream:
            seen.append(event)
    except Exception as error:
        return seen, error
    return seen, None


async def replayed(store: Any, run_id: str, **where: Any) -> list[tuple[Any, ...]]:
    return [fields(event) async for event in replay(store, run_id, **where)]


async def test_a_linear_run_replays_event_for_event(store_url: str) -> None:
    store = open_store(store_url)
    seen, error = await live(counter(store).run(Tick(1), stream=True))
    assert error is None
    assert [e.data for e in seen if e.type == "output"] == [1, 2, 3, 4]
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]


async def test_a_fan_out_replays_its_parallel_executors_in_the_order_they_ran(
    store_url: str,
) -> None:
    store = open_store(store_url)
    workers = [Worker(f"w{i}") for i in range(4)]
    seen, error = await live(fan_out(store, workers).run(7, stream=True))
    assert error is None
    assert sorted(e.data for e in seen if e.type == "output") == [f"w{i}:7" for i in range(4)]
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]


async def test_executors_that_pause_are_replayed_in_the_order_the_consumer_saw() -> None:
    store = open_store("memory://")
    workers = [Worker(f"w{i}", pauses=i) for i in range(4)]
    seen, error = await live(fan_out(store, workers).run(7, stream=True))
    assert error is None
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]


async def test_a_failed_run_replays_its_failure_with_the_recorded_error(store_url: str) -> None:
    store = open_store(store_url)
    seen, error = await live(counter(store, fail_at=3).run(Tick(1), stream=True))
    assert isinstance(error, RuntimeError)
    events = [event async for event in replay(store, seen[0].run_id)]
    assert [fields(e) for e in events] == [fields(e) for e in seen]
    assert [e.type for e in events[-2:]] == ["executor_failed", "failed"]
    failure = events[-1].error
    assert isinstance(failure, RecordedError)
    assert failure.info == ErrorInfo(type="RuntimeError", message="boom at 3")
    assert str(failure) == "RuntimeError: boom at 3"


async def test_a_failure_among_parallel_executors_replays_like_the_live_stream(
    store_url: str,
) -> None:
    store = open_store(store_url)
    workers = [Worker("w0"), Worker("w1"), Worker("w2", failing=True)]
    seen, error = await live(fan_out(store, workers).run(5, stream=True))
    assert isinstance(error, ValueError)
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]
    ends = [(e.type, e.executor_id) for e in seen[-2:]]
    assert ends == [("executor_failed", "w2"), ("failed", "w2")]


async def test_a_sibling_cancelled_by_a_failure_is_replayed_as_the_consumer_saw_it() -> None:
    store = open_store("memory://")
    workers = [Worker("w0"), Worker("w1", failing=True), Worker("w2")]
    seen, error = await live(fan_out(store, workers).run(5, stream=True))
    assert isinstance(error, ValueError)
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]


async def test_a_run_that_does_not_converge_replays_its_failed_event() -> None:
    store = open_store("memory://")
    step = Counter("counter", 10)
    wf = (
        WorkflowBuilder(start_executor=step, store=store, instance_id="c", max_supersteps=2)
        .add_edge(step, step)
        .build()
    )
    seen, error = await live(wf.run(Tick(1), stream=True))
    assert error is not None
    assert type(error).__name__ == "ConvergenceError"
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]
    assert (seen[-1].type, seen[-1].superstep) == ("failed", 2)


async def test_requests_and_the_run_that_answers_them_replay(store_url: str) -> None:
    store = open_store(store_url)
    wf = WorkflowBuilder(start_executor=Stamper("reviewer"), store=store, instance_id="r").build()
    asking, _ = await live(wf.run("v1", stream=True))
    (request,) = [e for e in asking if e.type == "request_info"]
    assert request.data == Approval("v1")
    assert asking[-1].type == "awaiting_input"
    answering, _ = await live(wf.run(responses={request.request_id: "yes"}, stream=True))
    assert [e.data for e in answering if e.type == "output"] == ["v1: yes"]
    assert await replayed(store, asking[0].run_id) == [fields(e) for e in asking]
    assert await replayed(store, answering[0].run_id) == [fields(e) for e in answering]


async def test_a_resumed_run_replays_only_its_own_events(store_url: str) -> None:
    store = open_store(store_url)
    failed, _ = await live(counter(store, fail_at=3).run(Tick(1), stream=True))
    resumed, error = await live(counter(store).resume(stream=True))
    assert error is None
    assert [e.superstep for e in resumed if e.type == "superstep_started"] == [3, 4]
    assert await replayed(store, resumed[0].run_id) == [fields(e) for e in resumed]
    assert await replayed(store, failed[0].run_id) == [fields(e) for e in failed]


async def test_a_cancelled_run_replays_what_it_emitted_and_no_end() -> None:
    store = open_store("memory://")
    stream = counter(store).run(Tick(1), stream=True)
    seen = [await stream.__anext__() for _ in range(3)]
    await stream.aclose()
    events = [e async for e in replay(store, seen[0].run_id)]
    assert [fields(e) for e in events[:3]] == [fields(e) for e in seen]
    assert events[-1].type not in {"completed", "failed", "awaiting_input", "superstep_completed"}
    assert [e.type for e in store.read("count")][-1] == "run_cancelled"


async def test_replay_finds_the_instance_or_says_why_it_cannot() -> None:
    store = open_store("memory://")
    ids = counter_ids("same")
    for instance in ("a", "b"):
        step = Counter("counter", 1)
        await (
            WorkflowBuilder(start_executor=step, store=store, instance_id=instance, id_factory=ids)
            .build()
            .run(Tick(1))
        )
    first_run = next(e.run_id for e in store.read("a") if e.type == "run_started")
    assert (await replayed(store, first_run))[-1][0] == "completed"  # found in "a" only
    twice = counter_ids("twin")
    for instance in ("c", "d"):
        step = Counter("counter", 1)
        await (
            WorkflowBuilder(
                start_executor=step, store=store, instance_id=instance, id_factory=twice
            )
            .build()
            .run(Tick(1))
        )
        twice = counter_ids("twin")  # the same ids again in the next instance
    before = store.last_position()
    with pytest.raises(ExecutionError, match=r"'twin-1' was started in 2 instances.*instance_id="):
        replay(store, "twin-1")
    assert (await replayed(store, "twin-1", instance_id="d"))[-1][0] == "completed"
    with pytest.raises(ExecutionError, match="has a run 'nope'"):
        replay(store, "nope")
    with pytest.raises(ExecutionError, match="instance 'a' has no run 'nope'"):
        replay(store, "nope", instance_id="a")
    assert store.last_position() == before  # replay appends nothing


async def test_a_superstep_that_requests_then_yields_replays_in_the_live_order() -> None:
    class AsksAndTells(Executor):
        @handler
        async def start(self, text: str, ctx: WorkflowContext[str, str]) -> None:
            await ctx.request_info(Approval(text), str)
            await ctx.yield_output(f"asked about {text}")

        @response_handler
        async def answered(self, request: Approval, answer: str, ctx: WorkflowContext) -> None:
            pass

    store = open_store("memory://")
    wf = WorkflowBuilder(start_executor=AsksAndTells("asker"), store=store).build()
    seen, error = await live(wf.run("v1", stream=True))
    assert error is None
    kinds = [e.type for e in seen]
    assert kinds.index("output") < kinds.index("request_info")  # the runner's order
    assert await replayed(store, seen[0].run_id) == [fields(e) for e in seen]
