"""Replay and rerun never execute a recorded step: replay shows the steps with their results, rerun
serves them (or calls the ones named live again) and reports where their calls diverge."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    Divergence,
    ExecutionError,
    Executor,
    LogIntegrityError,
    RecordedError,
    StepRecorded,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    WorkflowExecutor,
    handler,
    open_store,
    replay,
    rerun,
    step,
)
from projections.cli import main
from tests.durable.test_replay import fields, live

STEPS = frozenset({"call_model", "lookup", "send_email", "polish"})


class World:
    """What the steps touch, scripted: the model's ``answer``; ``calls`` counts every step's
    executions. ``gate``, when set, holds ``lookup`` until it is opened."""

    def __init__(self, answer: str = "42") -> None:
        self.answer = answer
        self.calls: Counter[str] = Counter()
        self.gate: asyncio.Event | None = None

    def steps(self) -> Steps:
        return Steps(self)


class Steps:
    """The recorded steps of the agent workflow, each counting its calls in its ``World``. The
    model's step resolves an address as a real client would: with sockets disabled, it fails."""

    def __init__(self, world: World) -> None:
        @step
        async def call_model(prompt: str) -> str:
            world.calls["call_model"] += 1
            socket.getaddrinfo("127.0.0.1", 443)  # numeric: nothing leaves the machine
            return f"{world.answer}: {prompt}"

        @step
        async def lookup(text: str) -> int:
            world.calls["lookup"] += 1
            if world.gate is not None:
                await world.gate.wait()
            return len(text)

        @step
        async def send_email(text: str) -> str:
            world.calls["send_email"] += 1
            return f"sent {text!r}"

        @step
        async def polish(text: str) -> str:
            world.calls["polish"] += 1
            return text.upper()

        self.call_model, self.lookup, self.send_email, self.polish = (
            call_model,
            lookup,
            send_email,
            polish,
        )


class Agent(Executor):
    """Asks the model, looks its answer up, stages both and sends them on; today's code may skip
    the lookup or send an email too."""

    def __init__(self, steps: Steps, *, lookup: bool = True, email: bool = False) -> None:
        super().__init__("agent")
        self.steps = steps
        self.lookup = lookup
        self.email = email

    @handler
    async def ask(self, prompt: str, ctx: WorkflowContext[str]) -> None:
        answer = await self.steps.call_model(prompt)
        length = await self.steps.lookup(answer) if self.lookup else -1
        if self.email:
            await self.steps.send_email(answer)
        ctx.set_state("answer", answer)
        await ctx.send_message(f"{answer} ({length})")


class Writer(Executor):
    """Polishes what it gets and yields it."""

    def __init__(self, steps: Steps) -> None:
        super().__init__("writer")
        self.steps = steps

    @handler
    async def write(self, text: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(await self.steps.polish(text))


def agent_workflow(store: Any, world: World, **today: bool) -> Any:
    steps = world.steps()
    agent, writer = Agent(steps, **today), Writer(steps)
    return (
        WorkflowBuilder(start_executor=agent, store=store, instance_id="agent")
        .add_edge(agent, writer)
        .build()
    )


def shown(event: WorkflowEvent) -> tuple[Any, ...]:
    """``fields`` of an event, but for a step's ``executor_invoked``, whose arguments (live) the
    log does not hold (replayed: None)."""
    if event.type == "executor_invoked" and event.executor_id in STEPS:
        return (*fields(event)[:5], None, *fields(event)[6:])
    return fields(event)


class NetworkUsed(AssertionError):
    pass


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sockets disabled: creating a socket, connecting one or resolving an address raises
    ``NetworkUsed`` (and is noted, in case something catches it)."""
    attempts: list[str] = []

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            attempts.append(what)
            raise NetworkUsed(f"{what} called with sockets disabled")

        return refused

    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, refuse(name))
    return attempts


@pytest.fixture(params=["memory", "sqlite"])
def local_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue("sqlite_url")
    return url


async def test_replay_and_rerun_of_a_finished_run_execute_no_step(
    local_url: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(local_url)
    world = World()
    seen, error = await live(agent_workflow(store, world).run("why?", stream=True))
    assert error is None
    executed = Counter({"call_model": 1, "lookup": 1, "polish": 1})
    assert world.calls == executed
    run_id = seen[0].run_id
    attempts = request.getfixturevalue("no_sockets")
    with pytest.raises(NetworkUsed):
        socket.getaddrinfo("127.0.0.1", 443)  # the guard holds: a step that ran would fail
    attempts.clear()

    before = store.read("agent")
    replayed = [event async for event in replay(store, run_id)]
    report = await rerun(agent_workflow(store, world), run_id)

    assert world.calls == executed  # not one step more
    assert store.read("agent") == before  # and nothing appended
    assert attempts == []
    assert report.matches, report
    served = [e for e in report.events if isinstance(e, StepRecorded)]
    assert [(e.name, e.reused is not None) for e in served] == [
        ("call_model", True),
        ("lookup", True),
        ("polish", True),
    ]
    assert [shown(e) for e in replayed] == [shown(e) for e in seen]
    steps = [(e.type, e.executor_id, e.data) for e in replayed if e.executor_id in STEPS]
    assert steps == [
        ("executor_invoked", "call_model", None),
        ("executor_completed", "call_model", "42: why?"),
        ("executor_invoked", "lookup", None),
        ("executor_completed", "lookup", 8),
        ("executor_invoked", "polish", None),
        ("executor_completed", "polish", "42: WHY? (8)"),
    ]
    kinds = [(e.type, e.executor_id) for e in replayed if e.type.startswith("executor")]
    assert kinds[:6] == [  # a handler's steps inside its own invocation
        ("executor_invoked", "agent"),
        ("executor_invoked", "call_model"),
        ("executor_completed", "call_model"),
        ("executor_invoked", "lookup"),
        ("executor_completed", "lookup"),
        ("executor_completed", "agent"),
    ]


class Worker(Executor):
    """Calls ``polish`` on what it gets, pausing first as often as its number says, and stages
    the result."""

    def __init__(self, id: str, steps: Steps, pauses: int) -> None:
        super().__init__(id)
        self.steps = steps
        self.pauses = pauses

    @handler
    async def work(self, text: str, ctx: WorkflowContext[None]) -> None:
        for _ in range(self.pauses):
            await asyncio.sleep(0)
        ctx.set_state(self.id, await self.steps.polish(f"{self.id}: {text}"))


class Fan(Executor):
    @handler
    async def fan(self, text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(text)


async def test_steps_of_parallel_executors_keep_every_event_but_their_start_in_place() -> None:
    store = open_store("memory://")
    world = World()
    fan = Fan("fan")
    workers = [Worker(f"w{i}", world.steps(), pauses=2 - i) for i in range(3)]
    wf = (
        WorkflowBuilder(start_executor=fan, store=store, instance_id="fan")
        .add_fan_out_edges(fan, workers)
        .build()
    )
    seen, error = await live(wf.run("go", stream=True))
    assert error is None
    replayed = [event async for event in replay(store, seen[0].run_id)]

    def ends(events: list[WorkflowEvent]) -> list[tuple[Any, ...]]:
        """Every event but a step's start: the log records a call when it returns."""
        return [
            fields(e)
            for e in events
            if not (e.type == "executor_invoked" and e.executor_id in STEPS)
        ]

    assert ends(replayed) == ends(seen)
    assert ends(seen) != [fields(e) for e in seen]  # the steps' starts were among them
    polished = [(e.type, e.data) for e in replayed if e.executor_id == "polish"]
    returned = [
        e.data for e in seen if e.type == "executor_completed" and e.executor_id == "polish"
    ]
    assert sorted(returned) == ["W0: GO", "W1: GO", "W2: GO"]
    # Each start right before its end, in the order the calls returned.
    assert polished == [
        pair
        for data in returned
        for pair in (("executor_invoked", None), ("executor_completed", data))
    ]


async def test_only_step_names_can_be_live() -> None:
    store = open_store("memory://")
    settings = agent_workflow(store, World()).settings
    for wrong in ({"call_model"}, frozenset({""}), ["call_model"]):
        with pytest.raises(DefinitionError, match="live_steps must be"):
            settings.replace(live_steps=wrong)
    assert settings.replace(live_steps=frozenset({"call_model"})).live_steps == {"call_model"}


async def test_a_served_call_replays_bypassed_with_the_result_it_reused(store_url: str) -> None:
    store = open_store(store_url)
    world = World()
    world.gate = asyncio.Event()
    stream = agent_workflow(store, world).run("why?", stream=True)
    async for event in stream:
        if event.type == "executor_invoked" and event.executor_id == "lookup":
            break  # the model answered; the lookup hangs: the run is cancelled in it
    await stream.aclose()
    world.gate.set()
    resumed, error = await live(agent_workflow(store, world).resume(stream=True))
    assert error is None
    assert world.calls == Counter({"call_model": 1, "lookup": 2, "polish": 1})
    bypassed = [(e.type, e.executor_id, e.data) for e in resumed if e.type == "executor_bypassed"]
    assert bypassed == [("executor_bypassed", "call_model", "42: why?")]
    replayed = [event async for event in replay(store, resumed[0].run_id)]
    assert [shown(e) for e in replayed] == [shown(e) for e in resumed]
    assert world.calls == Counter({"call_model": 1, "lookup": 2, "polish": 1})


async def test_replay_refuses_a_served_call_whose_record_is_not_in_the_log() -> None:
    store = open_store("memory://")
    world = World()
    world.gate = asyncio.Event()
    stream = agent_workflow(store, world).run("why?", stream=True)
    async for event in stream:
        if event.executor_id == "lookup":
            break
    await stream.aclose()
    world.gate.set()
    resumed = await agent_workflow(store, world).resume()
    events = store.read("agent")
    (served,) = [e for e in events if isinstance(e, StepRecorded) and e.reused is not None]
    altered = open_store("memory://")
    # A served call pointing at the run's start: the log is chained anew, so only the kernel's
    # own rule can refuse it.
    wrong = served.model_copy(update={"reused": 1})
    altered.append("agent", [wrong if e is served else e for e in events], expected_version=0)
    with pytest.raises(LogIntegrityError, match=r"served the record at position 1") as refused:
        replay(altered, resumed.run_id)
    assert (refused.value.instance_id, refused.value.position) == ("agent", served.position)


async def test_served_results_feed_the_code_around_them_identically(store_url: str) -> None:
    store = open_store(store_url)
    await agent_workflow(store, World()).run("why?")
    run_id = next(e.run_id for e in store.read("agent") if e.type == "run_started")
    today = World(answer="43")  # the model would answer otherwise now: it is not asked
    report = await rerun(agent_workflow(store, today), run_id)
    assert report.matches, report
    assert today.calls == Counter()
    outputs = [e.value for e in report.events if e.type == "output_yielded"]
    assert outputs == ["42: WHY? (8)"]  # as the record: the writer got the served answers


async def test_a_live_step_is_called_again_and_its_new_result_reported(store_url: str) -> None:
    store = open_store(store_url)
    await agent_workflow(store, World()).run("why?")
    run_id = next(e.run_id for e in store.read("agent") if e.type == "run_started")

    same = World()
    report = await rerun(agent_workflow(store, same), run_id, live={"call_model"})
    assert report.matches, report  # called again, answered the same: the rest is served
    assert same.calls == Counter({"call_model": 1})

    today = World(answer="43")
    report = await rerun(agent_workflow(store, today), run_id, live={"call_model"})
    assert report.divergence == Divergence(1, "agent", "step", "call_model", "42: why?", "43: why?")
    assert str(report.divergence) == (
        "superstep 1, executor 'agent': step 'call_model' was '42: why?' in the record, "
        "'43: why?' in the rerun"
    )
    # Its new answer is looked up with other arguments: the record has no such call, so that
    # lookup is refused, not executed.
    assert today.calls == Counter({"call_model": 1})
    refused = [e for e in report.events if isinstance(e, StepRecorded) and e.error is not None]
    assert [(e.name, e.error.type) for e in refused if e.error] == [
        ("lookup", "kernel.ExecutionError")
    ]

    both = World(answer="43")
    await rerun(agent_workflow(store, both), run_id, live={"call_model", "lookup", "polish"})
    assert both.calls == Counter({"call_model": 1, "lookup": 1, "polish": 1})


async def test_a_step_the_record_lacks_is_refused_unless_named_live(store_url: str) -> None:
    store = open_store(store_url)
    await agent_workflow(store, World()).run("why?")
    run_id = next(e.run_id for e in store.read("agent") if e.type == "run_started")

    today = World()
    report = await rerun(agent_workflow(store, today, email=True), run_id)
    assert today.calls == Counter()  # the new code path's email was not sent
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.superstep, divergence.executor_id, divergence.kind, divergence.key) == (
        1,
        "agent",
        "step",
        "send_email",
    )
    assert divergence.recorded is Divergence.NOTHING
    assert isinstance(divergence.new, RecordedError)
    assert divergence.new.info.type == "kernel.ExecutionError"
    assert "was not called" in divergence.new.info.message

    report = await rerun(agent_workflow(store, today, email=True), run_id, live={"send_email"})
    assert today.calls == Counter({"send_email": 1})
    assert report.divergence == Divergence(
        1, "agent", "step", "send_email", Divergence.NOTHING, "sent '42: why?'"
    )


async def test_a_recorded_step_the_rerun_does_not_call_is_a_divergence(store_url: str) -> None:
    store = open_store(store_url)
    await agent_workflow(store, World()).run("why?")
    run_id = next(e.run_id for e in store.read("agent") if e.type == "run_started")
    today = World()
    report = await rerun(agent_workflow(store, today, lookup=False), run_id)
    assert report.divergence == Divergence(1, "agent", "step", "lookup", 8, Divergence.NOTHING)
    assert str(report.divergence) == (
        "superstep 1, executor 'agent': step 'lookup' was 8 in the record, <nothing> in the rerun"
    )
    assert today.calls == Counter()


class Inner(Executor):
    """A sub-workflow's executor: polishes what it gets (a recorded step) and yields it."""

    def __init__(self, steps: Steps) -> None:
        super().__init__("inner")
        self.steps = steps

    @handler
    async def polish(self, text: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(await self.steps.polish(text))


def nesting_workflow(store: Any, world: World) -> Any:
    inner = WorkflowBuilder(start_executor=Inner(world.steps()), store=open_store("memory://"))
    child = WorkflowExecutor(inner.build(), id="child")
    return WorkflowBuilder(start_executor=child, store=store, instance_id="outer").build()


async def test_a_sub_workflows_steps_are_refused_by_a_rerun_unless_named_live() -> None:
    store = open_store("memory://")
    world = World()
    recorded = await nesting_workflow(store, world).run("why?")
    assert world.calls == Counter({"polish": 1})
    # The child's record is in its own instance: its calls are not served, and not executed.
    report = await rerun(nesting_workflow(store, world), recorded.run_id)
    assert world.calls == Counter({"polish": 1})
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.kind, divergence.recorded) == ("outcome", "committed")
    assert "step 'polish' of executor 'inner' was not called" in divergence.new
    report = await rerun(nesting_workflow(store, world), recorded.run_id, live={"polish"})
    assert report.matches, report
    assert world.calls == Counter({"polish": 2})


async def test_live_names_a_step_that_some_run_called() -> None:
    store = open_store("memory://")
    await agent_workflow(store, World()).run("why?")
    run_id = next(e.run_id for e in store.read("agent") if e.type == "run_started")
    with pytest.raises(ExecutionError, match=r"neither run .* nor its rerun called: 'call_modle'"):
        await rerun(agent_workflow(store, World()), run_id, live={"call_modle"})
    with pytest.raises(TypeError, match="not one string"):
        await rerun(agent_workflow(store, World()), run_id, live="call_model")


async def test_steplog_replay_shows_the_steps_and_their_results(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(sqlite_url)
    world = World()
    result = await agent_workflow(store, world).run("why?")
    store.close()
    code = await asyncio.to_thread(main, ["--store", sqlite_url, "replay", "--", result.run_id])
    assert code == 0
    out = capsys.readouterr().out
    assert "call_model" in out
    assert "42: why?" in out
    code = await asyncio.to_thread(
        main, ["--store", sqlite_url, "replay", "--json", "--", result.run_id]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps = [(d["type"], d["executor_id"], d["data"]) for d in lines if d["executor_id"] in STEPS]
    assert steps[:2] == [
        ("executor_invoked", "call_model", None),
        ("executor_completed", "call_model", "42: why?"),
    ]
    assert world.calls == Counter({"call_model": 1, "lookup": 1, "polish": 1})
