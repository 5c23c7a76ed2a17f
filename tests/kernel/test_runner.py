"""Ordinary behaviour of the runner: loops, conditions, fan-out/fan-in, switch-case, outputs,
the convergence limit, state across runs, and the public API's errors."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from freezegun import freeze_time

from kernel import (
    Case,
    ConvergenceError,
    Default,
    DefinitionError,
    Executor,
    RoutingError,
    RunInProgressError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    counter_ids,
    executor,
    handler,
)
from tests.kernel.helpers import Router, Sink, kinds, markers, of_type


class Counter(Executor):
    """Counts up to ``limit``, staging the count, then yields it as the output."""

    def __init__(self, id: str, limit: int) -> None:
        super().__init__(id)
        self.limit = limit

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state(f"{self.id}.last", n)
        if n >= self.limit:
            await ctx.yield_output(n)
            return
        await ctx.send_message(n + 1)


async def test_a_two_executor_loop_runs_one_superstep_per_message(store):
    a, b = Counter("a", 6), Counter("b", 6)
    wf = WorkflowBuilder(start_executor=a, store=store).add_edge(a, b).add_edge(b, a).build()

    result = await wf.run(0)

    assert result.get_outputs() == [6]
    assert result.supersteps == 7
    assert wf.committed_state() == {"a.last": 6, "b.last": 5}
    started = of_type(wf.events(), "superstep_started")
    assert [e.index for e in started] == list(range(1, 8))
    assert len({e.superstep_id for e in started}) == 7
    assert set(markers(wf).values()) == {"committed"}
    assert kinds(wf.events())[-1] == "run_completed"


async def test_exceeding_max_supersteps_fails_with_a_recorded_convergence_error(store):
    a, b = Counter("a", 10**6), Counter("b", 10**6)
    wf = (
        WorkflowBuilder(start_executor=a, store=store, max_supersteps=5)
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )

    with pytest.raises(ConvergenceError, match="max_supersteps=5"):
        await wf.run(0)

    failed = of_type(wf.events(), "run_failed")[0]
    assert failed.error.type == "kernel.ConvergenceError"
    assert len(of_type(wf.events(), "superstep_committed")) == 5
    assert wf.committed_state() == {"a.last": 4, "b.last": 3}


async def test_state_persists_across_runs_of_an_instance(store):
    @executor(id="tally")
    async def tally(amount: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("total", ctx.get_state("total", 0) + amount)

    wf = WorkflowBuilder(start_executor=tally, store=store, instance_id="till").build()
    for amount in (5, 7, 30):
        await wf.run(amount)

    reopened = WorkflowBuilder(start_executor=tally, store=store, instance_id="till").build()
    assert reopened.committed_state() == {"total": 42}
    assert len(of_type(reopened.events(), "run_completed")) == 3


async def test_conditional_edges_route_by_the_message(store):
    router, small, big = Router("router"), Sink("small"), Sink("big")
    wf = (
        WorkflowBuilder(start_executor=router, store=store)
        .add_edge(router, small, condition=lambda n: n < 10)
        .add_edge(router, big, condition=lambda n: n >= 10)
        .build()
    )

    assert (await wf.run(3)).get_outputs() == ["small:3"]
    assert (await wf.run(30)).get_outputs() == ["big:30"]
    assert wf.committed_state() == {"small": 3, "big": 30}


async def test_switch_case_takes_the_first_matching_case_else_the_default(store):
    router, neg, even, other = Router("router"), Sink("neg"), Sink("even"), Sink("other")
    wf = (
        WorkflowBuilder(start_executor=router, store=store)
        .add_switch_case_edge_group(
            router,
            [Case(lambda n: n < 0, neg), Case(lambda n: n % 2 == 0, even), Default(other)],
        )
        .build()
    )

    outputs = [(await wf.run(n)).get_outputs() for n in (-4, 4, 5)]

    assert outputs == [["neg:-4"], ["even:4"], ["other:5"]]


class Worker(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await asyncio.sleep(0.01 * (3 - int(self.id[-1])))  # finish in reverse order
        ctx.set_state(self.id, n * 10)
        await ctx.send_message(n * 10 + int(self.id[-1]))


class Join(Executor):
    @handler
    async def run(self, parts: list[int], ctx: WorkflowContext[Any, list[int]]) -> None:
        ctx.set_state("joined", parts)
        await ctx.yield_output(parts)


async def test_fan_out_runs_targets_concurrently_and_fan_in_waits_for_every_source(store):
    source, join = Router("source"), Join("join")
    workers = [Worker(f"w{i}") for i in (1, 2, 3)]
    wf = (
        WorkflowBuilder(start_executor=source, store=store)
        .add_fan_out_edges(source, workers)
        .add_fan_in_edges(workers, join)
        .build()
    )

    result = await wf.run(4)

    assert result.get_outputs() == [[41, 42, 43]]  # in source order, not finishing order
    assert result.supersteps == 3
    assert wf.committed_state() == {"w1": 40, "w2": 40, "w3": 40, "joined": [41, 42, 43]}
    second = of_type(wf.events(), "superstep_started")[1].superstep_id
    invoked = [
        e.executor_id for e in of_type(wf.events(), "executor_invoked") if e.superstep_id == second
    ]
    assert sorted(invoked) == ["w1", "w2", "w3"]


async def test_workers_in_one_superstep_overlap_in_time(store):
    running: list[int] = []
    peak = 0

    class Overlapping(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Any]) -> None:
            nonlocal peak
            running.append(1)
            peak = max(peak, len(running))
            await asyncio.sleep(0.01)
            running.pop()

    source = Router("source")
    wf = (
        WorkflowBuilder(start_executor=source, store=store)
        .add_fan_out_edges(source, [Overlapping(f"o{i}") for i in range(4)])
        .build()
    )
    await wf.run(1)
    assert peak == 4


async def test_messages_on_one_edge_keep_their_send_order(store):
    class Burst(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
            for i in range(5):
                await ctx.send_message(i)

    class Recorder(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Any, int]) -> None:
            ctx.set_state("seen", [*ctx.get_state("seen", []), n])
            await ctx.yield_output(n)

    burst, recorder = Burst("burst"), Recorder("recorder")
    wf = WorkflowBuilder(start_executor=burst, store=store).add_edge(burst, recorder).build()

    result = await wf.run(0)

    assert result.get_outputs() == [0, 1, 2, 3, 4]
    assert wf.committed_state() == {"seen": [0, 1, 2, 3, 4]}


async def test_get_state_overlays_this_supersteps_writes_on_committed_state(store):
    seen: list[Any] = []

    @executor(id="probe")
    async def probe(n: int, ctx: WorkflowContext[Any]) -> None:
        seen.append(ctx.get_state("k", "missing"))
        ctx.set_state("k", n)
        seen.append(ctx.get_state("k"))
        ctx.delete_state("k")
        seen.append(ctx.get_state("k", "deleted"))
        ctx.set_state("k", n + 1)

    wf = WorkflowBuilder(start_executor=probe, store=store).build()
    await wf.run(1)
    await wf.run(10)

    assert seen == ["missing", 1, "deleted", 2, 10, "deleted"]
    assert wf.committed_state() == {"k": 11}


async def test_streaming_yields_the_lifecycle_in_order(store):
    a, b = Counter("a", 1), Counter("b", 1)
    wf = WorkflowBuilder(start_executor=a, store=store).add_edge(a, b).build()

    events = [e async for e in wf.run(0, stream=True)]

    step_1 = ["superstep_started", "executor_invoked", "executor_completed", "superstep_completed"]
    step_2 = [*step_1[:3], "output", "superstep_completed"]
    assert [e.type for e in events] == [
        "started",
        "status",
        *step_1,
        *step_2,
        "status",
        "completed",
    ]
    assert [e.state for e in events if e.type == "status"] == [
        WorkflowRunState.IN_PROGRESS,
        WorkflowRunState.IDLE,
    ]
    output = next(e for e in events if e.type == "output")
    assert (output.data, output.executor_id, output.superstep) == (1, "b", 2)


async def test_a_failed_stream_yields_failure_events_then_raises_the_original_error(store):
    @executor(id="bad")
    async def bad(n: int, ctx: WorkflowContext[Any]) -> None:
        raise KeyError("missing thing")

    wf = WorkflowBuilder(start_executor=bad, store=store).build()
    received: list[str] = []

    async def consume() -> None:
        async for event in wf.run(1, stream=True):
            received.append(event.type)

    with pytest.raises(KeyError, match="missing thing"):
        await consume()

    assert received[-2:] == ["executor_failed", "failed"]


async def test_a_second_concurrent_run_on_one_instance_is_refused(store):
    gate = asyncio.Event()

    @executor(id="slow")
    async def slow(n: int, ctx: WorkflowContext[Any]) -> None:
        await gate.wait()

    wf = WorkflowBuilder(start_executor=slow, store=store).build()
    first = asyncio.create_task(wf.run(1))
    await asyncio.sleep(0)
    with pytest.raises(RunInProgressError, match="still running"):
        await wf.run(2)
    gate.set()
    assert (await first).status == "completed"
    assert (await wf.run(3)).status == "completed"


async def test_run_records_input_kwargs_and_timestamps_from_the_injected_clock(store):
    @executor(id="echo")
    async def echo(n: int, ctx: WorkflowContext[Any, Any]) -> None:
        await ctx.yield_output(ctx.run_kwargs)

    wf = WorkflowBuilder(
        start_executor=echo, store=store, instance_id="clocked", id_factory=counter_ids("x")
    ).build()
    with freeze_time("2026-01-02T03:04:05Z"):
        result = await wf.run(7, user="ada")

    assert result.get_outputs() == [{"user": "ada"}]
    started = of_type(wf.events(), "run_started")[0]
    assert (started.input, started.kwargs, started.run_id) == (7, {"user": "ada"}, "x-1")
    assert {e.timestamp for e in wf.events()} == {datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)}


async def test_a_handler_knows_whether_its_caller_streams_the_run():
    @executor(id="told")
    async def told(n: int, ctx: WorkflowContext[Any, bool]) -> None:
        await ctx.yield_output(ctx.is_streaming())

    wf = WorkflowBuilder(start_executor=told).build()
    assert (await wf.run(1)).get_outputs() == [False]
    streamed = [e.data async for e in wf.run(2, stream=True) if e.type == "output"]
    assert streamed == [True]


def test_defaults_come_from_the_environment_and_fresh_ids(monkeypatch, sqlite_url):
    monkeypatch.setenv("STEPLOG_STORE", sqlite_url)
    wf = WorkflowBuilder(start_executor=Router("r")).build()
    other = WorkflowBuilder(start_executor=Router("r")).build()

    assert wf.store.url == sqlite_url
    assert wf.instance_id != other.instance_id
    assert len(wf.instance_id) == 22


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda b, a, s: b.add_edge(a, "ghost"), "unknown executor 'ghost'"),
        (lambda b, a, s: b.add_edge(a, s).add_edge(a, s), "duplicate edge a->s"),
        (lambda b, a, s: b.add_edge(a, Sink("a")), "two different executors share the id 'a'"),
        (lambda b, a, s: b.add_fan_in_edges([a, a], s), "fan-in sources must be distinct"),
        (lambda b, a, s: b.add_chain([a]), "a chain needs at least two executors"),
    ],
)
def test_builder_rejects_bad_graphs_with_clear_errors(make, message):
    start = Router("a")
    with pytest.raises(DefinitionError, match=message):
        make(WorkflowBuilder(start_executor=start), start, Sink("s")).build()


def test_build_rejects_an_edge_whose_target_never_handles_what_the_source_sends():
    class Texts(Executor):
        @handler
        async def run(self, text: str, ctx: WorkflowContext[Any]) -> None: ...

    with pytest.raises(DefinitionError, match=r"edge 'a' -> 't' can never deliver: 'a' sends int"):
        WorkflowBuilder(start_executor=Router("a")).add_edge("a", Texts("t")).build()


def test_build_rejects_a_fan_in_target_that_does_not_take_a_list():
    with pytest.raises(DefinitionError, match="delivers a list"):
        WorkflowBuilder(start_executor=Router("a")).add_fan_in_edges(
            [Router("b"), Router("c")], Sink("s")
        ).add_edge("a", "b").build()


def test_build_rejects_executors_without_handlers_and_a_missing_start():
    with pytest.raises(DefinitionError, match="has no @handler methods"):
        WorkflowBuilder(start_executor=Executor("bare")).build()
    with pytest.raises(DefinitionError, match="no start executor"):
        WorkflowBuilder().build()
    with pytest.raises(DefinitionError, match="durability"):
        WorkflowBuilder(start_executor=Router("a"), durability="sometimes").build()  # type: ignore[arg-type]


async def test_an_input_no_start_handler_accepts_is_refused_before_anything_is_logged(store):
    wf = WorkflowBuilder(start_executor=Router("a"), store=store).build()
    with pytest.raises(RoutingError, match="no handler for a message of type str"):
        await wf.run("not an int")
    assert wf.events() == []


async def test_sending_without_edges_fails_the_superstep_with_a_routing_error_when_strict(store):
    wf = WorkflowBuilder(start_executor=Router("lonely"), store=store, strict_routing=True).build()
    with pytest.raises(RoutingError, match="has no outgoing edges"):
        await wf.run(1)
    assert set(markers(wf).values()) == {"aborted:failed"}


def test_build_rejects_a_handler_that_no_incoming_edge_can_ever_feed():
    class TwoHandlers(Executor):
        @handler
        async def numbers(self, n: int, ctx: WorkflowContext[Any]) -> None: ...

        @handler
        async def texts(self, text: str, ctx: WorkflowContext[Any]) -> None: ...

    with pytest.raises(DefinitionError, match=r"handler two\.texts accepts str, but no edge"):
        WorkflowBuilder(start_executor=Router("a")).add_edge("a", TwoHandlers("two")).build()
