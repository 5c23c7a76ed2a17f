"""Run status, stream events and run results as AF 1.23 has them (issue 12)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Never

import pytest

from kernel import (
    FRAMEWORK_EVENT_TYPES,
    DefinitionError,
    EncodingError,
    EventStore,
    ExecutionError,
    Executor,
    RecordedError,
    RunResult,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowErrorDetails,
    WorkflowEvent,
    WorkflowEventSource,
    WorkflowRunState,
    handler,
    open_store,
    replay,
    response_handler,
)
from projections import fold_history

# -- the workflows ------------------------------------------------------------------------------


class ProgressEvent(WorkflowEvent[int]):
    """A custom event class, as AF code declares them."""

    def __init__(self, percent: int) -> None:
        super().__init__("progress", percent)


class Splitter(Executor):
    """Reports progress, then sends ``n`` and ``n + 1`` on."""

    @handler
    async def split(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.add_event(ProgressEvent(50))
        await ctx.send_message(n)
        await ctx.send_message(n + 1)


class Summer(Executor):
    """Yields what it gets, with a warning between two outputs."""

    @handler
    async def total(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(n)
        await ctx.add_event(WorkflowEvent.warning(f"saw {n}"))
        await ctx.yield_output(n * 10)


def pipeline(store: EventStore, instance_id: str = "p") -> Any:
    split, total = Splitter("split"), Summer("sum")
    return (
        WorkflowBuilder(start_executor=split, store=store, instance_id=instance_id)
        .add_edge(split, total)
        .build()
    )


@dataclass(frozen=True)
class Question:
    text: str


class Asker(Executor):
    @handler
    async def ask(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info(Question(text), str)

    @response_handler
    async def answered(self, q: Question, answer: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{q.text}: {answer}")


class Failing(Executor):
    @handler
    async def fail(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.add_event(WorkflowEvent("progress", n))
        await ctx.yield_output(n)
        raise RuntimeError(f"boom at {n}")


def kinds(events: Any) -> list[str]:
    return [e.type for e in events]


def states(events: Any) -> list[WorkflowRunState]:
    return [e.state for e in events if e.type == "status"]


# -- WorkflowEvent ------------------------------------------------------------------------------


def test_workflow_event_has_afs_constructor_factories_and_accessors() -> None:
    output: WorkflowEvent[int] = WorkflowEvent("output", 3, executor_id="a")
    assert (output.type, output.data, output.executor_id) == ("output", 3, "a")
    assert output.origin is WorkflowEventSource.EXECUTOR
    assert (output.run_id, output.request_id, output.error) == (None, None, None)

    status = WorkflowEvent.status(WorkflowRunState.IDLE)
    assert (status.type, status.state) == ("status", WorkflowRunState.IDLE)
    assert WorkflowEvent.started().type == "started"
    assert WorkflowEvent.superstep_started(2).iteration == 2
    assert WorkflowEvent.superstep_completed(2).superstep == 2
    assert WorkflowEvent.executor_invoked("a", 1).data == 1
    assert WorkflowEvent.executor_completed("a", [2]).data == [2]
    assert WorkflowEvent.executor_bypassed("a").type == "executor_bypassed"
    assert WorkflowEvent.warning("low").data == "low"
    assert WorkflowEvent.emit("a", 7).type == "data"
    details = WorkflowErrorDetails.from_exception(ValueError("bad"))
    assert (details.error_type, details.message) == ("ValueError", "bad")
    assert WorkflowEvent.failed(details).details == details
    failed = WorkflowEvent.executor_failed("a", details)
    assert (failed.data, failed.details, failed.executor_id) == (details, details, "a")

    oops = ValueError("x")
    error = WorkflowEvent.error(oops)
    assert (error.type, error.data, error.error) == ("error", oops, None)

    asked = WorkflowEvent.request_info("r1", "a", Question("q"), str)
    assert (asked.request_id, asked.source_executor_id, asked.executor_id) == ("r1", "a", "a")
    assert (asked.request_type, asked.response_type) == (Question, str)
    with pytest.raises(RuntimeError, match="request_info"):
        _ = output.source_executor_id
    with pytest.raises(AttributeError, match="immutable"):
        output.data = 4  # type: ignore[misc]
    assert WorkflowEvent("output", 3, executor_id="a") == output
    assert WorkflowEvent("output", 4, executor_id="a") != output


# -- run status ---------------------------------------------------------------------------------


async def test_a_stream_says_its_status_at_afs_moments(store: EventStore) -> None:
    events = [e async for e in pipeline(store).run(1, stream=True)]

    assert states(events) == [WorkflowRunState.IN_PROGRESS, WorkflowRunState.IDLE]
    assert kinds(events)[:2] == ["started", "status"]
    assert kinds(events)[-2:] == ["status", "completed"]  # steplog's end event stays last
    framework = [e for e in events if e.type not in ("progress", "warning")]
    assert {e.origin for e in framework} == {WorkflowEventSource.FRAMEWORK}
    assert {e.run_id for e in events} == {events[0].run_id}


async def test_requests_make_the_status_pending_then_idle_with_pending_requests(
    store: EventStore,
) -> None:
    wf = WorkflowBuilder(start_executor=Asker("asker"), store=store).build()
    events = [e async for e in wf.run("color?", stream=True)]

    assert states(events) == [
        WorkflowRunState.IN_PROGRESS,
        WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS,
        WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
    ]
    asked = kinds(events).index("request_info")
    assert events[asked + 1].state is WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS
    (request,) = [e for e in events if e.type == "request_info"]
    assert request.source_executor_id == "asker"
    assert (request.request_type, request.response_type) == (Question, "str")

    result = await wf.run(responses={request.request_id: "blue"})
    assert result.get_final_state() is WorkflowRunState.IDLE
    assert states(result.status_timeline()) == [
        WorkflowRunState.IN_PROGRESS,
        WorkflowRunState.IDLE,
    ]


async def test_a_failure_streams_a_failed_status_with_details(store: EventStore) -> None:
    wf = WorkflowBuilder(start_executor=Failing("f"), store=store).build()
    seen: list[WorkflowEvent] = []

    async def consume() -> None:
        async for event in wf.run(2, stream=True):
            seen.append(event)

    with pytest.raises(RuntimeError, match="boom at 2"):
        await consume()

    assert states(seen) == [WorkflowRunState.IN_PROGRESS, WorkflowRunState.FAILED]
    assert kinds(seen)[-3:] == ["status", "executor_failed", "failed"]
    executor_failed, failed = seen[-2:]
    assert executor_failed.data == WorkflowErrorDetails("RuntimeError", "boom at 2")
    assert executor_failed.details == failed.details == executor_failed.data
    assert failed.origin is WorkflowEventSource.FRAMEWORK
    # The failed superstep's output and custom event never reach the consumer.
    assert not {"output", "progress"} & set(kinds(seen))
    (recorded,) = [e for e in wf.events() if e.type == "custom_event_added"]
    assert recorded.data == 2  # it is in the log, inert with its aborted superstep

    replayed = [e async for e in replay(store, seen[0].run_id)]
    assert kinds(replayed) == kinds(seen)
    assert replayed[-1].details == failed.details


# -- executor_invoked / executor_completed --------------------------------------------------------


async def test_executor_events_carry_the_input_and_the_messages_sent(store: EventStore) -> None:
    events = [e async for e in pipeline(store).run(4, stream=True)]
    invoked = [(e.executor_id, e.data) for e in events if e.type == "executor_invoked"]
    completed = [(e.executor_id, e.data) for e in events if e.type == "executor_completed"]

    assert invoked == [("split", 4), ("sum", 4), ("sum", 5)]
    assert completed == [("split", [4, 5]), ("sum", None), ("sum", None)]

    replayed = [e async for e in replay(store, events[0].run_id)]
    assert [(e.executor_id, e.data) for e in replayed if e.type == "executor_completed"] == (
        completed
    )


# -- custom events ------------------------------------------------------------------------------


async def test_custom_events_are_logged_and_streamed_in_order_once_committed(
    store: EventStore,
) -> None:
    wf = pipeline(store)
    events = [e async for e in wf.run(1, stream=True)]

    # Outputs and custom events in the order they were made, after the superstep committed.
    made = [(e.type, e.data) for e in events if e.type in ("output", "warning")]
    assert made == [
        ("output", 1),
        ("warning", "saw 1"),
        ("output", 10),
        ("output", 2),
        ("warning", "saw 2"),
        ("output", 20),
    ]
    assert kinds(events).index("warning") > kinds(events).index("executor_completed", 6)
    (progress,) = [e for e in events if e.type == "progress"]
    assert isinstance(progress, ProgressEvent)  # the live stream keeps the executor's class
    assert (progress.data, progress.executor_id, progress.superstep) == (50, "split", 1)
    assert progress.origin is WorkflowEventSource.EXECUTOR
    assert progress.run_id == events[0].run_id
    warnings = [e.data for e in events if e.type == "warning"]
    assert warnings == ["saw 1", "saw 2"]

    logged = [e for e in wf.events() if e.type == "custom_event_added"]
    assert [(e.executor_id, e.event_type, e.data) for e in logged] == [
        ("split", "progress", 50),
        ("sum", "warning", "saw 1"),
        ("sum", "warning", "saw 2"),
    ]

    replayed = [e async for e in replay(store, events[0].run_id)]
    assert kinds(replayed) == kinds(events)
    again = next(e for e in replayed if e.type == "progress")
    assert type(again) is WorkflowEvent  # data only: the class is not rebuilt
    assert (again.data, again.executor_id, again.superstep_id) == (
        50,
        "split",
        progress.superstep_id,
    )

    (step,) = [s for s in fold_history(wf.events()).supersteps() if s.index == 2]
    assert step.events == ("warning", "warning")


async def test_an_error_event_keeps_the_exception_as_its_recorded_type_and_message(
    store: EventStore,
) -> None:
    class Reporter(Executor):
        @handler
        async def report(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
            await ctx.add_event(WorkflowEvent.error(ValueError(f"odd {n}")))

    wf = WorkflowBuilder(start_executor=Reporter("r"), store=store).build()
    events = [e async for e in wf.run(3, stream=True)]
    (live,) = [e for e in events if e.type == "error"]
    assert isinstance(live.data, ValueError)

    (again,) = [e async for e in replay(store, events[0].run_id) if e.type == "error"]
    assert isinstance(again.data, RecordedError)
    assert str(again.data) == "ValueError: odd 3"


@pytest.mark.parametrize("kind", sorted(FRAMEWORK_EVENT_TYPES))
async def test_add_event_refuses_the_runners_own_types(kind: str) -> None:
    class Pretender(Executor):
        @handler
        async def pretend(self, n: int, ctx: WorkflowContext) -> None:
            await ctx.add_event(WorkflowEvent(kind, n))

    store = open_store("memory://")
    wf = WorkflowBuilder(start_executor=Pretender("x"), store=store).build()
    with pytest.raises(DefinitionError, match=f"added a '{kind}' event"):
        await wf.run(1)
    assert [e.type for e in wf.events() if e.type == "custom_event_added"] == []


async def test_add_event_refuses_what_is_not_an_event_or_not_storable() -> None:
    class Sloppy(Executor):
        @handler
        async def go(self, n: int, ctx: WorkflowContext) -> None:
            if n == 1:
                await ctx.add_event("progress")  # type: ignore[arg-type]
            await ctx.add_event(WorkflowEvent("progress", object()))

    store = open_store("memory://")
    with pytest.raises(DefinitionError, match="takes a WorkflowEvent"):
        await WorkflowBuilder(start_executor=Sloppy("s"), store=store).build().run(1)
    with pytest.raises(EncodingError, match="'progress' event of 's'"):
        await WorkflowBuilder(start_executor=Sloppy("s"), store=store).build().run(2)


# -- RunResult ----------------------------------------------------------------------------------


async def test_a_run_result_is_the_sequence_of_its_events(store: EventStore) -> None:
    wf = pipeline(store)
    result = await wf.run(1)
    streamed = [e async for e in pipeline(store, "q").run(1, stream=True)]

    assert result.get_final_state() is WorkflowRunState.IDLE
    assert result.get_outputs() == [1, 10, 2, 20]
    shown = [e for e in streamed if e.type not in ("started", "status")]
    assert kinds(result) == kinds(shown)
    assert len(result) == len(shown)
    assert result[0].type == "superstep_started"
    assert [e.data for e in result if e.type == "output"] == result.get_outputs()
    assert states(result.status_timeline()) == [
        WorkflowRunState.IN_PROGRESS,
        WorkflowRunState.IDLE,
    ]
    assert result.get_intermediate_outputs() == []
    assert result.status == "completed"  # steplog's own status is still there

    with_status = await wf.run(1, include_status_events=True)
    assert kinds(with_status).count("status") == 2
    started = [e for e in wf.events() if e.type == "run_started"]
    assert started[-1].kwargs == {}  # not taken for a run argument


async def test_a_streams_final_response_is_its_result(store: EventStore) -> None:
    stream = pipeline(store).run(1, stream=True)
    first = await stream.__anext__()
    assert first.type == "started"
    result = await stream.get_final_response()  # reads the rest of the stream
    assert isinstance(result, RunResult)
    assert result.get_outputs() == [1, 10, 2, 20]
    assert kinds(result)[-1] == "completed"


async def test_a_result_not_made_by_a_run_says_where_its_events_are() -> None:
    result = RunResult("r", "completed", 1)
    assert result.get_final_state() is WorkflowRunState.IDLE
    with pytest.raises(ExecutionError, match="replay"):
        list(result)


# -- what each executor received, live and replayed ------------------------------------------------


def facts(events: Any) -> list[tuple[Any, ...]]:
    """What a consumer can compare between a live stream and its replay."""
    return [
        (e.type, e.superstep, e.superstep_id, e.executor_id, e.data, e.state, e.request_id)
        for e in events
        if e.type not in ("failed", "executor_failed")
    ]


class Echo(Executor):
    """Sends what it gets on, ``repeat`` times."""

    def __init__(self, id: str, repeat: int = 1) -> None:
        super().__init__(id)
        self.repeat = repeat

    @handler
    async def echo(self, n: int, ctx: WorkflowContext[int]) -> None:
        for i in range(self.repeat):
            await ctx.send_message(n * 10 + i)


class Late(Executor):
    """Sends on only the second time it is invoked (a fan-in source that is late)."""

    @handler
    async def late(self, n: int, ctx: WorkflowContext[int]) -> None:
        if ctx.get_state("seen"):
            await ctx.send_message(n, target_id="g")
        else:
            ctx.set_state("seen", True)
            await ctx.send_message(n, target_id=self.id)


class Gather(Executor):
    @handler
    async def gather(self, got: list[int], ctx: WorkflowContext[Never, list[int]]) -> None:
        await ctx.yield_output(got)


async def test_a_fan_in_receives_its_sources_messages_live_and_in_replay(
    store: EventStore,
) -> None:
    start, fast, late, gather = Echo("start"), Echo("fast", repeat=2), Late("late"), Gather("g")
    wf = (
        WorkflowBuilder(start_executor=start, store=store)
        .add_fan_out_edges(start, [late, fast])
        .add_edge(late, late)
        .add_fan_in_edges([late, fast], gather)
        .build()
    )
    events = [e async for e in wf.run(1, stream=True)]
    invoked = [(e.superstep, e.executor_id, e.data) for e in events if e.type == "executor_invoked"]

    # late holds the group back a superstep; the list is in the group's source order.
    assert invoked == [
        (1, "start", 1),
        (2, "late", 10),
        (2, "fast", 10),
        (3, "late", 10),
        (4, "g", [10, 100, 101]),
    ]
    assert (await wf.run(1)).get_outputs() == [[10, 100, 101]]
    events_2 = [e async for e in wf.run(2, stream=True)]  # late has "seen": no wait now
    assert [e.data for e in events_2 if e.executor_id == "g" and e.type == "executor_invoked"] == [
        [20, 200, 201]
    ]
    (logged,) = [e for e in wf.events() if e.type == "message_staged" and e.source == "late"][:1]
    assert logged.gathered == {}  # its first message went back to itself, not to the group
    assert [e.gathered for e in wf.events() if e.type == "message_staged" and e.source == "fast"][
        :1
    ] == [{"g": ["late", "fast"]}]

    for run in (events, events_2):
        replayed = [e async for e in replay(store, run[0].run_id)]
        assert facts(replayed) == facts(run)


async def test_a_response_handler_receives_the_response_live_and_in_replay(
    store: EventStore,
) -> None:
    wf = WorkflowBuilder(start_executor=Asker("asker"), store=store).build()
    (request,) = (await wf.run("color?")).pending_requests
    events = [e async for e in wf.run(responses={request.request_id: "blue"}, stream=True)]

    (invoked,) = [e for e in events if e.type == "executor_invoked"]
    assert (invoked.executor_id, invoked.data) == ("asker", "blue")
    replayed = [e async for e in replay(store, events[0].run_id)]
    assert facts(replayed) == facts(events)


async def test_a_fork_resumed_replays_what_its_executors_received(store: EventStore) -> None:
    class Counter(Executor):
        @handler
        async def count(self, n: int, ctx: WorkflowContext[int, int]) -> None:
            if n < 3:
                await ctx.send_message(n + 1)
            else:
                await ctx.yield_output(n)

    step = Counter("c")
    wf = WorkflowBuilder(start_executor=step, store=store, instance_id="o").add_edge(step, step)
    origin = wf.build()
    await origin.run(1)
    fork = origin.fork(at=origin.checkpoints()[0].checkpoint_id, instance_id="o-fork")
    events = [e async for e in fork.resume(stream=True)]

    assert [e.data for e in events if e.type == "executor_invoked"] == [2, 3]
    replayed = [e async for e in replay(store, events[0].run_id, instance_id="o-fork")]
    assert facts(replayed) == facts(events)
    result = await origin.run(1)
    assert [e.data for e in result if e.type == "executor_invoked"] == [1, 2, 3]
