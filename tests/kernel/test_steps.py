"""Recorded steps (``@step``) called from graph handlers: what a call records, when a retried
superstep is served it, the identities that find it again (Agent Framework's rules), and the
edges: a result the log cannot store, a call after its superstep closed, a store error while
recording, hooks, the stream, encryption and tampering.

Most tests run on the memory and SQLite stores (``url``); one runs on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from kernel import (
    EventStore,
    Executor,
    StateWriteRejectedError,
    StepRecorded,
    StoreBusyError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
)
from tests.durable.helpers import reopen

calls: collections.Counter[str] = collections.Counter()
"""How many times each step's function ran (the steps below count themselves here)."""


@pytest.fixture(autouse=True)
def _no_calls_yet() -> Iterator[None]:
    calls.clear()
    yield
    calls.clear()


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    """An empty memory or SQLite store's URL."""
    if request.param == "memory":
        return "memory://"
    found: str = request.getfixturevalue("sqlite_url")
    return found


def build(
    store: EventStore, start: Executor, instance_id: str = "steps", **options: Any
) -> Workflow:
    return WorkflowBuilder(
        start_executor=start, store=store, instance_id=instance_id, **options
    ).build()


def recorded(wf: Workflow) -> list[StepRecorded]:
    return [e for e in wf.events() if isinstance(e, StepRecorded)]


async def cancel_when(event: asyncio.Event, task: asyncio.Task[Any]) -> None:
    """Cancel the run ``task`` once ``event`` is set, and wait until it has recorded its end.
    If the run ends first, it raises what the run raised (or fails the test)."""
    waiting = asyncio.ensure_future(event.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if not event.is_set():
        waiting.cancel()
        await task
        pytest.fail("the run ended before it got there")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Calls(Executor):
    """Runs ``body(message)`` as its handler, and yields what it returns."""

    def __init__(self, id: str, body: Callable[[Any], Awaitable[Any]]) -> None:
        super().__init__(id)
        self.body = body

    @handler
    async def handle(self, message: str, ctx: WorkflowContext[str, Any]) -> None:
        await ctx.yield_output(await self.body(message))


# -- identities -----------------------------------------------------------------------------------


@step
async def echo(value: Any) -> Any:
    calls["echo"] += 1
    return value


@step
async def size(value: Any) -> int:
    calls["size"] += 1
    return len(str(value))


def af_digest(tree: Any) -> str:
    """Agent Framework's identity digest of a canonical tree: SHA-256 of its compact JSON text."""
    text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


async def test_arguments_json_holds_and_orjson_refuses_still_identify_a_call() -> None:
    """An int past 64 bits and a lone surrogate are canonical arguments, as in Agent Framework:
    each call is identified by them (the digest is AF's), not refused with orjson's TypeError."""
    big, odd = 2**70, "half \ud800 a pair"

    async def body(_: str) -> list[Any]:
        return [await echo(big), await echo(big + 1), await size(odd)]

    wf = build(open_store("memory://"), Calls("c", body))
    assert (await wf.run("go")).get_outputs() == [[big, big + 1, len(odd)]]
    assert [(r.digest, json.loads(r.key)[0]) for r in recorded(wf)] == [
        (af_digest(["mapping", "builtins.dict", [["value", ["int", value]]]]), "auto")
        for value in (big, big + 1)
    ] + [(af_digest(["mapping", "builtins.dict", [["value", ["str", odd]]]]), "auto")]


# -- the retry policy after a failed handler ------------------------------------------------------


@step(after_failure="rerun")
async def parse_model(prompt: str) -> str:
    """A model call whose first answer the handler cannot parse."""
    calls["parse_model"] += 1
    return "garbled" if calls["parse_model"] == 1 else "42"


class Parses(Executor):
    """Asks ``parse_model``, then runs ``between`` (if set), then fails on an answer that is no
    number, else yields it."""

    def __init__(self, id: str, between: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(id)
        self.between = between

    @handler
    async def handle(self, prompt: str, ctx: WorkflowContext[str, int]) -> None:
        answer = await parse_model(prompt)
        if self.between is not None:
            await self.between()
        await ctx.yield_output(int(answer))


async def test_rerun_calls_again_a_result_served_to_an_attempt_that_failed(url: str) -> None:
    """The first attempt recorded the model's answer and was cancelled; the next was served it
    and failed parsing it. A step with after_failure="rerun" is called again on the next retry,
    though the superstep that recorded it was only cancelled: the attempt that failed had it."""
    store = open_store(url)
    recorded_once = asyncio.Event()

    async def hang() -> None:
        recorded_once.set()
        await asyncio.Event().wait()

    parses = Parses("parses", between=hang)
    wf = build(store, parses)
    await cancel_when(recorded_once, asyncio.create_task(wf.run("the answer?")))
    parses.between = None
    with pytest.raises(ValueError, match="garbled"):
        await wf.resume()  # served the cancelled attempt's answer, which fails parsing
    assert calls["parse_model"] == 1

    result = await build(reopen(url, store), parses).resume()

    assert result.get_outputs() == [42]
    assert calls["parse_model"] == 2
    first, served, again = recorded(wf)
    assert (first.result, served.reused, again.result) == ("garbled", first.position, "42")
    assert first.key == served.key == again.key


# -- several messages for one executor in one superstep -------------------------------------------


@step(replay_key=lambda: "the one summary")
async def summarize() -> str:
    calls["summarize"] += 1
    return f"summary {calls['summarize']}"


class Forward(Executor):
    @handler
    async def forward(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"{message} via {self.id}")


class Gathers(Executor):
    """For each message: ``summarize()`` (one replay key), ``echo("same")`` (equal arguments),
    ``echo(message)``; then ``between(message)`` if set; yields what the steps returned."""

    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.between: Callable[[str], Awaitable[None]] | None = None

    @handler
    async def gather(self, message: str, ctx: WorkflowContext[str, list[Any]]) -> None:
        got = [await summarize(), await echo("same"), await echo(message)]
        if self.between is not None:
            await self.between(message)
        await ctx.yield_output(got)


def fanned(store: EventStore, gathers: Gathers) -> Workflow:
    """``start`` sends to ``a`` and ``b``, which both send to ``gathers``: it is invoked twice in
    superstep 3."""
    start, a, b = Forward("start"), Forward("a"), Forward("b")
    return (
        WorkflowBuilder(start_executor=start, store=store, instance_id="fan")
        .add_edge(start, a)
        .add_edge(start, b)
        .add_edge(a, gathers)
        .add_edge(b, gathers)
        .build()
    )


async def test_two_invocations_in_one_superstep_keep_distinct_keys_that_a_retry_finds_again(
    url: str,
) -> None:
    """A replay key unique within one invocation is unique per invocation, not refused as a
    duplicate when the executor gets two messages in one superstep; equal arguments in two
    invocations are two calls; each invocation numbers its calls from 0. A retry of the
    superstep is served both invocations' calls, under the same keys."""
    store = open_store(url)
    gathers = Gathers("gathers")
    second_done = asyncio.Event()

    async def hang_at_b(message: str) -> None:
        if message.endswith("via b"):
            second_done.set()
            await asyncio.Event().wait()

    gathers.between = hang_at_b
    wf = fanned(store, gathers)
    await cancel_when(second_done, asyncio.create_task(wf.run("m")))
    first_attempt = recorded(wf)
    assert len({r.key for r in first_attempt}) == len({r.step_key for r in first_attempt}) == 6
    assert [r.call for r in first_attempt] == [0, 1, 2, 0, 1, 2]
    assert dict(calls) == {"summarize": 2, "echo": 4}

    gathers.between = None
    result = await fanned(reopen(url, store), gathers).resume()

    assert result.get_outputs() == [
        ["summary 1", "same", "m via start via a"],
        ["summary 2", "same", "m via start via b"],
    ]
    assert dict(calls) == {"summarize": 2, "echo": 4}  # nothing ran twice
    served = recorded(wf)[6:]
    assert [(r.key, r.step_key, r.reused) for r in served] == [
        (r.key, r.step_key, r.position) for r in first_attempt
    ]


# -- a call the superstep's closing overtakes -----------------------------------------------------


async def test_a_step_that_returns_while_its_superstep_commits_is_refused_and_the_commit_lands(
    durable_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background task's step returns while the superstep's commit batch is with the store's
    group commit: its record would take the commit's positions. It is refused
    (``StateWriteRejectedError``, nothing appended for it); the commit lands."""
    from kernel._run import _instance

    committing = asyncio.Event()
    submit = _instance.InstanceContext.append_commit

    def append_commit(self: Any, batch: Any, *, expected_version: int) -> Any:
        pending = submit(self, batch, expected_version=expected_version)
        if any(event.type == "superstep_committed" for event in batch):
            committing.set()  # the late step returns now, while the batch is in flight
        return pending

    monkeypatch.setattr(_instance.InstanceContext, "append_commit", append_commit)

    @step
    async def late() -> str:
        await committing.wait()
        calls["late"] += 1
        return "late"

    background: list[asyncio.Task[str]] = []

    async def body(_: str) -> str:
        background.append(asyncio.create_task(late()))
        await asyncio.sleep(0)  # the step has started
        return "done"

    store = open_store(durable_store_url)
    wf = build(store, Calls("c", body))
    result = await wf.run("go")
    with pytest.raises(StateWriteRejectedError, match=r"record of step 'late'.*already committed"):
        await background[0]

    assert result.get_outputs() == ["done"]
    assert calls["late"] == 1
    events = open_store(durable_store_url).read("steps")
    assert [e.type for e in events][-2:] == ["superstep_committed", "run_completed"]
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert recorded(wf) == []


# -- a store error while recording ----------------------------------------------------------------


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_a_record_the_store_refuses_loses_none_of_the_writes_staged_before_it(
    url: str, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the append that carries a step's record (busy, say) and the handler
    catches the error. The record is not made; what the superstep staged before it (here a write
    and the executor's invocation) still goes in with the commit, and counts."""
    from kernel._run import _instance

    append = _instance.InstanceContext.append
    refusals = [StoreBusyError("database is locked")]

    def refusing(self: Any, batch: Any, *, expected_version: int) -> None:
        if refusals and any(event.type == "step_recorded" for event in batch):
            raise refusals.pop()
        append(self, batch, expected_version=expected_version)

    monkeypatch.setattr(_instance.InstanceContext, "append", refusing)

    class Careful(Executor):
        @handler
        async def handle(self, message: str, ctx: WorkflowContext[str, str]) -> None:
            ctx.set_state("before", 1)
            with contextlib.suppress(StoreBusyError):
                await echo("x")
            ctx.set_state("after", 2)
            await ctx.yield_output("done")

    wf = build(open_store(url), Careful("careful"), durability=durability)
    result = await wf.run("go")

    assert result.get_outputs() == ["done"]
    assert wf.committed_state() == {"before": 1, "after": 2}
    assert [e.type for e in wf.events()][2:] == [
        "executor_invoked",
        "state_staged",
        "state_staged",
        "output_yielded",
        "executor_completed",
        "superstep_committed",
        "run_completed",
    ]
    assert calls["echo"] == 1


async def test_a_step_whose_superstep_commits_before_it_starts_never_runs() -> None:
    """A background task opens a step call while its superstep is open, then waits its turn on
    the stream (the consumer takes each event in turn); the superstep commits meanwhile. The call
    is refused before its function runs, not after it did its work."""

    @step
    async def late() -> str:
        calls["late"] += 1
        return "late"

    background: list[asyncio.Task[str]] = []

    async def body(_: str) -> str:
        background.append(asyncio.create_task(late()))  # starts once the handler has returned
        return "done"

    wf = build(open_store("memory://"), Calls("c", body))
    seen = [(e.type, e.executor_id) async for e in wf.run("go", stream=True)]
    with pytest.raises(StateWriteRejectedError, match=r"call of step 'late'.*already committed"):
        await background[0]

    assert calls["late"] == 0
    invoked = seen.index(("executor_invoked", "late"))
    assert invoked > seen.index(("executor_completed", "c"))
    assert ("executor_failed", "late") in seen[invoked:]
    assert recorded(wf) == []
