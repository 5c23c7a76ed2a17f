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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from kernel import (
    DecodeError,
    DefinitionError,
    EncodingError,
    EventStore,
    ExecutionError,
    Executor,
    Keyring,
    LogIntegrityError,
    RunHooks,
    RunInProgressError,
    StateWriteRejectedError,
    StepInfo,
    StepRecorded,
    StoreBusyError,
    SuperstepInfo,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    fold_committed,
    handler,
    open_store,
    report_usage,
    step,
    step_key,
)
from kernel.testing import LogBuilder
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


def read_elsewhere(url: str, store: EventStore, instance_id: str = "steps") -> list[Any]:
    """The instance's log as another store object reads it (the memory store has no other)."""
    if url == "memory://":
        return store.read(instance_id)
    with open_store(url, create=False) as other:
        return other.read(instance_id)


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


# -- served on a retry -----------------------------------------------------------------------------


@step
async def fetch(query: str) -> dict[str, str]:
    """A lookup that costs money: its answer names how many times it ran."""
    calls["fetch"] += 1
    return {"query": query, "answer": f"answer {calls['fetch']}"}


@step
async def send(text: str) -> str:
    """A side effect (a mail): it must happen once."""
    calls["send"] += 1
    return f"sent {text}"


class Agent(Executor):
    """Fetches, runs ``between`` (if set), sends what it fetched, stages and yields the receipt."""

    def __init__(self, id: str, between: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(id)
        self.between = between

    @handler
    async def handle(self, query: str, ctx: WorkflowContext[str, str]) -> None:
        found = await fetch(query)
        if self.between is not None:
            await self.between()
        receipt = await send(found["answer"])
        ctx.set_state("receipt", receipt)
        await ctx.yield_output(receipt)


def hangs(reached: asyncio.Event) -> Callable[[], Awaitable[None]]:
    async def hang() -> None:
        reached.set()
        await asyncio.Event().wait()

    return hang


def assert_served(first: StepRecorded, served: StepRecorded) -> None:
    """``served`` is the record of a later attempt's call that was served ``first``."""
    assert served.reused == first.position
    assert (served.result, served.error, served.usage, served.duration) == (None, None, None, 0.0)
    assert (served.key, served.step_key, served.call, served.name, served.executor_id) == (
        first.key,
        first.step_key,
        first.call,
        first.name,
        first.executor_id,
    )
    assert served.lineage == first.lineage
    assert served.superstep_id != first.superstep_id


async def test_after_a_cancelled_run_resume_serves_the_completed_step_and_runs_only_the_rest(
    url: str,
) -> None:
    store = open_store(url)
    fetched = asyncio.Event()
    agent = Agent("agent", between=hangs(fetched))
    wf = build(store, agent)
    await cancel_when(fetched, asyncio.create_task(wf.run("weather")))
    (first,) = recorded(wf)
    assert (first.name, first.result) == ("fetch", {"query": "weather", "answer": "answer 1"})

    agent.between = None
    again = build(reopen(url, store), agent)  # another workflow object, on another store object
    result = await again.resume()

    assert result.get_outputs() == ["sent answer 1"]
    assert dict(calls) == {"fetch": 1, "send": 1}
    _, served, sent = recorded(again)
    assert_served(first, served)
    assert served.run_id == result.run_id != first.run_id
    assert (sent.name, sent.reused, sent.result) == ("send", None, "sent answer 1")
    assert again.committed_state() == {"receipt": "sent answer 1"}


async def test_after_a_dropped_stream_the_next_attempt_is_served_the_completed_step(
    url: str,
) -> None:
    store = open_store(url)
    fetched = asyncio.Event()
    agent = Agent("agent", between=hangs(fetched))
    wf = build(store, agent)
    stream = wf.run("weather", stream=True)
    async for event in stream:
        if (event.type, event.executor_id) == ("executor_completed", "fetch"):
            break
    await fetched.wait()
    del stream, event  # dropped: the run is abandoned
    agent.between = None

    result = await wf.resume()

    assert result.get_outputs() == ["sent answer 1"]
    assert dict(calls) == {"fetch": 1, "send": 1}
    aborted = [e for e in wf.events() if e.type == "superstep_aborted"]
    assert [a.reason for a in aborted] == ["abandoned"]
    first, served, _ = recorded(wf)
    assert_served(first, served)


async def test_after_a_lost_lease_the_run_that_takes_over_closes_it_as_crashed_and_is_served(
    url: str,
) -> None:
    """Another process takes the instance's lease over while the handler waits between its two
    steps (this one looked dead): the run stops, appending nothing more. The next run takes the
    expired lease over, closes the superstep as crashed and is served the recorded step."""
    store = open_store(url)

    async def taken_over() -> None:
        lease = store.read_lease("steps")
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)  # already expired
        store.acquire_lease("steps", "far-away-host:9/x", ttl=60.0, now=an_hour_ago, replace=lease)
        await asyncio.sleep(30)  # the heartbeat notices long before this ends

    agent = Agent("agent", between=taken_over)
    leased = WorkflowBuilder(start_executor=agent, store=store, instance_id="steps")
    with pytest.raises(RunInProgressError, match="lost the lease"):
        await leased.with_lease(ttl=0.15).build().run("weather")
    assert calls["fetch"] == 1

    agent.between = None
    again = build(reopen(url, store), agent)
    result = await again.resume()

    assert result.get_outputs() == ["sent answer 1"]
    assert dict(calls) == {"fetch": 1, "send": 1}
    aborted = [e for e in again.events() if e.type == "superstep_aborted"]
    assert [a.reason for a in aborted] == ["crashed"]
    first, served, _ = recorded(again)
    assert_served(first, served)


async def test_after_a_failed_handler_a_step_is_served_by_default(url: str) -> None:
    """after_failure="reuse" (the default): what the failed attempt did is not done again."""
    store = open_store(url)
    failures = [ConnectionError("the mail relay is down")]

    async def relay_down() -> None:
        if failures:
            raise failures.pop()

    wf = build(store, Agent("agent", between=relay_down))
    with pytest.raises(ConnectionError):
        await wf.run("weather")

    result = await build(reopen(url, store), Agent("agent")).resume()

    assert result.get_outputs() == ["sent answer 1"]
    assert dict(calls) == {"fetch": 1, "send": 1}
    first, served, _ = recorded(wf)
    assert_served(first, served)


async def test_after_a_failed_handler_a_rerun_step_is_called_again(url: str) -> None:
    """after_failure="rerun": the model's answer failed the handler, so a retry asks again."""
    store = open_store(url)
    wf = build(store, Parses("parses"))
    with pytest.raises(ValueError, match="garbled"):
        await wf.run("the answer?")

    result = await build(reopen(url, store), Parses("parses")).resume()

    assert result.get_outputs() == [42]
    assert calls["parse_model"] == 2
    first, again = recorded(wf)
    assert (first.result, again.result, again.reused) == ("garbled", "42", None)
    assert (first.key, first.step_key) == (again.key, again.step_key)


async def test_after_a_cancellation_a_rerun_step_is_still_served(url: str) -> None:
    """ "rerun" concerns failures only: after a cancellation nothing failed, nothing runs twice."""
    store = open_store(url)
    asked = asyncio.Event()
    parses = Parses("parses", between=hangs(asked))
    wf = build(store, parses)
    await cancel_when(asked, asyncio.create_task(wf.run("the answer?")))
    parses.between = None
    with pytest.raises(ValueError, match="garbled"):
        await wf.resume()
    assert calls["parse_model"] == 1


async def test_a_step_that_raised_is_not_served_and_runs_again(url: str) -> None:
    store = open_store(url)

    @step
    async def flaky(query: str) -> str:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise TimeoutError("the service timed out")
        return f"{query}: ok"

    wf = build(store, Calls("c", flaky))
    with pytest.raises(TimeoutError):
        await wf.run("q")

    result = await build(reopen(url, store), Calls("c", flaky)).resume()

    assert result.get_outputs() == ["q: ok"]
    assert calls["flaky"] == 2
    failed, succeeded = recorded(wf)
    assert failed.error is not None
    assert (failed.error.type, failed.error.message) == ("TimeoutError", "the service timed out")
    assert (failed.result, succeeded.result, succeeded.reused) == (None, "q: ok", None)
    assert failed.key == succeeded.key


@dataclass(frozen=True)
class Quote:
    item: str
    cents: int


@step
async def price(item: str) -> Quote | None:
    calls["price"] += 1
    return Quote(item, 120)


async def test_a_served_result_comes_back_as_the_class_the_step_declares(url: str) -> None:
    """The handler's annotations do not name ``Quote``; the step's return annotation does, so
    a served result is a ``Quote`` again, in another process too, not a dict of its fields."""
    store = open_store(url)
    priced = asyncio.Event()

    async def body(item: str) -> int:
        quote = await price(item)
        if not priced.is_set():
            await hangs(priced)()
        assert isinstance(quote, Quote)
        return quote.cents

    await cancel_when(priced, asyncio.create_task(build(store, Calls("c", body)).run("desk")))

    result = await build(reopen(url, store), Calls("c", body)).resume()

    assert result.get_outputs() == [120]
    assert calls["price"] == 1


# -- the retry policy after a failed handler -------------------------------------------------------


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


# -- identities (Agent Framework's rules) ----------------------------------------------------------


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


class Opaque:
    """An argument with no canonical form (a client, a connection)."""

    def __init__(self, name: str) -> None:
        self.name = name


@step
async def greet(name: str, greeting: str = "hello", *, ctx: Any = None) -> str:
    calls["greet"] += 1
    return f"{greeting} {name}"


@step(name="greet")
async def greet_without_context(name: str, greeting: str = "hello") -> str:
    return f"{greeting} {name}"


async def digests_of(*made: Callable[[], Awaitable[Any]]) -> list[str | None]:
    """The digests of the step calls ``made`` makes, one after another in one handler."""

    async def body(_: str) -> None:
        for make in made:
            await make()

    wf = build(open_store("memory://"), Calls("c", body))
    await wf.run("go")
    return [r.digest for r in recorded(wf)]


async def test_the_identity_is_the_canonical_bound_arguments_preserving_types_and_order() -> None:
    """1, 1.0 and True differ; a list and a tuple differ; a mapping's key order counts (as in
    AF, which keeps insertion order); defaults are applied, so a keyword, a positional and an
    omitted default argument are one identity; the context parameter is no part of it."""
    one, one_float, true, a_list, a_tuple, ab, ba = await digests_of(
        lambda: echo(1),
        lambda: echo(1.0),
        lambda: echo(True),
        lambda: echo([1, 2]),
        lambda: echo((1, 2)),
        lambda: echo({"a": 1, "b": 2}),
        lambda: echo({"b": 2, "a": 1}),
    )
    assert len({one, one_float, true, a_list, a_tuple, ab, ba}) == 7
    assert one == af_digest(["mapping", "builtins.dict", [["value", ["int", 1]]]])
    assert one_float == af_digest(["mapping", "builtins.dict", [["value", ["float", (1.0).hex()]]]])
    assert true == af_digest(["mapping", "builtins.dict", [["value", ["bool", True]]]])

    spelled = await digests_of(
        lambda: greet("ada"),
        lambda: greet("ada", "hello"),
        lambda: greet(name="ada", greeting="hello"),
        lambda: greet_without_context("ada"),
        lambda: greet("ada", "hi"),
    )
    assert len(set(spelled[:4])) == 1
    assert spelled[4] != spelled[0]


async def test_a_handler_may_pass_its_own_context_to_a_step_outside_the_identity() -> None:
    """A graph handler has no ``RunContext`` to inject; it may hand a step its own context, by
    keyword or in its place. The step gets it, and the call's identity is its other arguments.
    Passed none, the step is called without it (not with None)."""

    @step
    async def notify(text: str, ctx: WorkflowContext[Any, Any]) -> str:
        ctx.set_state("notified", text)
        return text

    class Notifies(Executor):
        @handler
        async def handle(self, message: str, ctx: WorkflowContext[str, str]) -> None:
            await notify("positional", ctx)
            await notify(text="keyword", ctx=ctx)
            await notify("injected")

    wf = build(open_store("memory://"), Notifies("n"))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'ctx'"):
        await wf.run("go")  # the third call: a graph handler has no context to inject
    positional, keyword, _ = recorded(wf)
    assert positional.digest == af_digest(
        ["mapping", "builtins.dict", [["text", ["str", "positional"]]]]
    )
    assert keyword.digest == af_digest(["mapping", "builtins.dict", [["text", ["str", "keyword"]]]])


async def test_a_retry_finds_each_call_by_its_arguments_not_by_its_order(url: str) -> None:
    """The retry makes the same calls in another order: each is served its own result."""
    store = open_store(url)
    both = asyncio.Event()
    order = ["ada", "alan"]

    async def body(_: str) -> list[str]:
        got = [await greet(name) for name in order]
        if not both.is_set():
            await hangs(both)()
        return got

    wf = build(store, Calls("c", body))
    await cancel_when(both, asyncio.create_task(wf.run("go")))
    order.reverse()

    result = await build(reopen(url, store), Calls("c", body)).resume()

    assert result.get_outputs() == [["hello alan", "hello ada"]]
    assert calls["greet"] == 2
    ada, alan, served_alan, served_ada = recorded(wf)
    assert (served_alan.reused, served_ada.reused) == (alan.position, ada.position)


async def test_a_replay_key_names_calls_whose_arguments_cannot(url: str) -> None:
    """Opaque arguments with a replay key: served on the retry, though the argument is another
    object; the key is hashed, and the digest is of the arguments (None: they have none)."""
    store = open_store(url)
    loaded = asyncio.Event()

    @step(replay_key=lambda connection, record_id: record_id)
    async def load(connection: Opaque, record_id: str) -> str:
        calls["load"] += 1
        return f"{record_id} from {connection.name}"

    async def body(_: str) -> str:
        got = await load(Opaque("db"), "r-1")
        if not loaded.is_set():
            await hangs(loaded)()
        return got

    wf = build(store, Calls("c", body))
    await cancel_when(loaded, asyncio.create_task(wf.run("go")))

    result = await build(reopen(url, store), Calls("c", body)).resume()

    assert result.get_outputs() == ["r-1 from db"]
    assert calls["load"] == 1
    first, served = recorded(wf)
    assert json.loads(first.key) == ["explicit", "load", hashlib.sha256(b"r-1").hexdigest()]
    assert first.digest is None
    assert_served(first, served)


@pytest.mark.parametrize("bad", ["", 7, None])
async def test_a_replay_key_must_return_a_non_empty_string(bad: Any) -> None:
    @step(replay_key=lambda _: bad)
    async def keyed(value: str) -> str:
        return value

    wf = build(open_store("memory://"), Calls("c", keyed))
    with pytest.raises(ValueError, match=r"^@step 'keyed' replay_key must return a non-empty"):
        await wf.run("go")


async def test_a_replay_key_used_twice_in_one_invocation_is_refused() -> None:
    @step(replay_key=lambda value: "always the same")
    async def keyed(value: str) -> str:
        calls["keyed"] += 1
        return value

    async def body(_: str) -> list[str]:
        return [await keyed("a"), await keyed("b")]

    wf = build(open_store("memory://"), Calls("c", body))
    with pytest.raises(
        ValueError,
        match=r"^@step 'keyed' produced duplicate replay_key values in one workflow run\. "
        r"Each explicit replay key must identify exactly one logical invocation\.$",
    ):
        await wf.run("go")
    assert calls["keyed"] == 1  # refused before it ran


@step
async def describe(thing: Opaque) -> str:
    calls["describe"] += 1
    return f"a {thing.name}"


async def test_calls_without_identity_are_keyed_by_their_order(url: str) -> None:
    store = open_store(url)
    done = asyncio.Event()

    async def body(_: str) -> list[str]:
        got = [await describe(Opaque("cup")), await describe(Opaque("pot"))]
        if not done.is_set():
            await hangs(done)()
        return got

    wf = build(store, Calls("c", body))
    await cancel_when(done, asyncio.create_task(wf.run("go")))

    result = await build(reopen(url, store), Calls("c", body)).resume()

    assert result.get_outputs() == [["a cup", "a pot"]]
    assert calls["describe"] == 2
    cup, pot, _, _ = recorded(wf)
    assert [json.loads(r.key) for r in (cup, pot)] == [
        ["order", "describe", "", 0],
        ["order", "describe", "", 1],
    ]
    assert (cup.digest, pot.digest) == (None, None)


async def test_concurrent_calls_need_an_identity_their_order_cannot_give() -> None:
    """In tasks of their own (``asyncio.gather``) calls with canonical arguments are recorded;
    a call whose arguments have no identity is refused, with AF's error, before it runs."""

    async def with_identity(_: str) -> list[str]:
        return list(await asyncio.gather(greet("ada"), greet("alan")))

    wf = build(open_store("memory://"), Calls("c", with_identity))
    assert (await wf.run("go")).get_outputs() == [["hello ada", "hello alan"]]
    assert len({r.key for r in recorded(wf)}) == 2

    async def without(_: str) -> list[str]:
        return list(await asyncio.gather(describe(Opaque("cup")), describe(Opaque("pot"))))

    wf = build(open_store("memory://"), Calls("c", without), instance_id="without")
    with pytest.raises(
        ValueError,
        match=r"^Cannot derive a stable replay identity for concurrent @step 'describe'\. "
        r"Use @step\(replay_key=\.\.\.\) to identify each logical invocation\.$",
    ):
        await wf.run("go")
    assert calls["describe"] == 0


class Client:
    """A client whose method is a step: its ``self`` has no canonical form."""

    def __init__(self, name: str) -> None:
        self.name = name

    @step
    async def ask(self, question: str) -> str:
        calls["ask"] += 1
        return f"{self.name}: {question}"

    @step(name="ask_keyed", replay_key=lambda self, question: f"{self.name}/{question}")
    async def ask_keyed(self, question: str) -> str:
        calls["ask_keyed"] += 1
        return f"{self.name}: {question}"


async def test_a_method_step_is_keyed_by_order_unless_it_has_a_replay_key() -> None:
    """A method's calls are identified by their order (``self`` has none): refused when
    concurrent, unless a replay key names each call."""
    a, b = Client("a"), Client("b")

    async def in_order(_: str) -> list[str]:
        return [await a.ask("q"), await b.ask("q")]

    wf = build(open_store("memory://"), Calls("c", in_order))
    assert (await wf.run("go")).get_outputs() == [["a: q", "b: q"]]
    assert [json.loads(r.key)[0] for r in recorded(wf)] == ["order", "order"]

    async def together(_: str) -> list[str]:
        return list(await asyncio.gather(a.ask("q"), b.ask("q")))

    wf = build(open_store("memory://"), Calls("c", together), instance_id="together")
    with pytest.raises(ValueError, match="Cannot derive a stable replay identity"):
        await wf.run("go")

    async def keyed(_: str) -> list[str]:
        return list(await asyncio.gather(a.ask_keyed("q"), b.ask_keyed("q")))

    wf = build(open_store("memory://"), Calls("c", keyed), instance_id="keyed")
    assert (await wf.run("go")).get_outputs() == [["a: q", "b: q"]]


async def test_outside_a_run_a_step_is_its_plain_function() -> None:
    assert await fetch("weather") == {"query": "weather", "answer": "answer 1"}
    assert await describe(Opaque("cup")) == "a cup"  # no identity needed either
    assert calls == {"fetch": 1, "describe": 1}

    @step
    async def asks_its_key() -> str:
        return step_key()

    with pytest.raises(RuntimeError, match="only inside a @step called in a running workflow"):
        await asks_its_key()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": 7}, "name must be a non-empty string"),
        ({"name": "half \ud800 a pair"}, "a @step name must be valid Unicode text"),
        ({"after_failure": "sometimes"}, "after_failure must be 'reuse' or 'rerun'"),
    ],
)
def test_a_step_the_log_could_not_name_or_retry_is_refused_when_defined(
    options: dict[str, Any], match: str
) -> None:
    async def lookup() -> None:
        return None

    with pytest.raises(DefinitionError, match=match):
        step(**options)(lookup)


def test_only_an_async_function_can_be_a_step() -> None:
    def plain(x: int) -> int:
        return x

    with pytest.raises(
        TypeError,
        match=r"^@step can only decorate async functions, but 'plain' is not a coroutine "
        r"function\.$",
    ):
        step(plain)  # type: ignore[arg-type]


# -- several messages for one executor in one superstep --------------------------------------------


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


# -- the idempotency key ---------------------------------------------------------------------------


async def test_step_key_is_the_same_on_every_attempt_and_in_another_process_and_new_per_call(
    url: str,
) -> None:
    """A charge that was cut off after the provider saw it (before it returned, so nothing is
    recorded) runs again with the same key: the provider deduplicates on it."""
    store = open_store(url)
    keys: list[str] = []
    provider_saw = asyncio.Event()

    @step
    async def charge(order: str, cents: int) -> str:
        keys.append(step_key())
        if len(keys) == 1:
            await hangs(provider_saw)()  # cut off after the provider saw the key
        return f"charged {order}"

    async def body(order: str) -> list[str]:
        return [await charge(order, 500), await charge(order, 500), await charge("other", 500)]

    await cancel_when(provider_saw, asyncio.create_task(build(store, Calls("c", body)).run("o-1")))

    again = build(reopen(url, store), Calls("c", body))
    await again.resume()

    first_try, retried, second_call, other_order = keys
    assert retried == first_try  # the same call, another attempt, another store object
    assert len({first_try, second_call, other_order}) == 3  # each call its own
    assert [r.step_key for r in recorded(again)] == [retried, second_call, other_order]
    # another instance's calls, however alike, have keys of their own
    elsewhere = build(open_store("memory://"), Calls("c", body), instance_id="elsewhere")
    await elsewhere.run("o-1")
    assert not set(keys[4:]) & set(keys[:4])


async def test_step_key_outside_a_step_is_a_runtime_error() -> None:
    async def body(_: str) -> str:
        return step_key()  # in a handler, not in a step

    with pytest.raises(RuntimeError, match=r"^step_key\(\) is known only inside a @step"):
        await build(open_store("memory://"), Calls("c", body)).run("go")
    with pytest.raises(RuntimeError, match=r"^step_key\(\) is known only inside a @step"):
        step_key()


# -- the record ------------------------------------------------------------------------------------


@step(name="model")
async def classify(text: str, *, labels: tuple[str, ...] = ("spam", "ham")) -> str:
    calls["model"] += 1
    report_usage(input_tokens=len(text), output_tokens=1)
    report_usage(output_tokens=2)  # counts add up
    if text == "???":
        raise ValueError("cannot classify '???'")
    return labels[1]


async def test_the_record_names_where_which_call_its_arguments_duration_usage_and_error() -> None:
    async def body(_: str) -> str:
        label = await classify("hello")
        with contextlib.suppress(ValueError):
            await classify("???")
        return label

    wf = build(open_store("memory://"), Calls("classifier", body))
    result = await wf.run("go")

    started = next(e for e in wf.events() if e.type == "superstep_started")
    ok, failed = recorded(wf)
    for record, call in ((ok, 0), (failed, 1)):
        assert (record.run_id, record.superstep_id) == (result.run_id, started.superstep_id)
        assert (record.executor_id, record.name, record.call) == ("classifier", "model", call)
        assert record.lineage == result.run_id  # a run started with a message begins a lineage
        assert record.reused is None
        assert record.duration >= 0.0
    assert json.loads(ok.key)[:2] == ["auto", "model"]
    assert ok.digest == af_digest(
        [
            "mapping",
            "builtins.dict",
            [["text", ["str", "hello"]], ["labels", ["tuple", [["str", "spam"], ["str", "ham"]]]]],
        ]
    )
    assert (ok.result, ok.error) == ("ham", None)
    assert ok.usage == {"input_tokens": 5, "output_tokens": 3}
    assert failed.result is None
    assert failed.error is not None
    assert (failed.error.type, failed.error.message) == ("ValueError", "cannot classify '???'")
    assert failed.usage == {"input_tokens": 3, "output_tokens": 3}
    assert ok.position < failed.position


def test_report_usage_takes_non_negative_ints_and_outside_a_step_does_nothing() -> None:
    report_usage(input_tokens=3)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(TypeError, match="must be a non-negative int"):
            report_usage(input_tokens=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_a_record_is_durable_at_once_while_its_superstep_is_still_open(
    url: str, durability: str
) -> None:
    """While the handler is inside its second step, another store object (SQLite; the memory
    store has no other) reads the first step's record, with what the superstep staged before
    it, though the superstep is open: its marker is not in the log."""
    store = open_store(url)
    seen: list[list[str]] = []

    @step
    async def look() -> None:
        seen.append([e.type for e in read_elsewhere(url, store)])

    class Looks(Executor):
        @handler
        async def handle(self, message: str, ctx: WorkflowContext[str, str]) -> None:
            ctx.set_state("before", 1)
            await fetch("weather")
            await look()
            await ctx.yield_output("done")

    wf = build(store, Looks("looks"), durability=durability)
    await wf.run("go")

    assert seen == [
        ["run_started", "superstep_started", "executor_invoked", "state_staged", "step_recorded"]
    ]
    assert [e.type for e in wf.events()].count("step_recorded") == 2


# -- provenance, never state -----------------------------------------------------------------------


async def test_recording_a_step_makes_none_of_its_superstep_s_writes_count(url: str) -> None:
    """The write staged before the step went into the log with the step's record, and the
    superstep then failed: the write is aborted, for the fold, blame and a reader alike."""
    from projections import fold_blame

    store = open_store(url)
    failures = [ConnectionError("down")]

    class Drafts(Executor):
        @handler
        async def handle(self, message: str, ctx: WorkflowContext[str, str]) -> None:
            ctx.set_state("draft", message)
            await fetch(message)
            ctx.set_state("after", 1)
            if failures:
                raise failures.pop()

    wf = build(store, Drafts("drafts"))
    with pytest.raises(ConnectionError):
        await wf.run("v1")

    assert wf.committed_state() == {}
    assert fold_committed(read_elsewhere(url, store)).values == {}
    assert [w.status for w in fold_blame(wf.events()).writes("draft")] == ["aborted"]
    kinds = [e.type for e in wf.events()]
    assert (
        kinds.index("state_staged")
        < kinds.index("step_recorded")
        < kinds.index("superstep_aborted")
    )

    await wf.resume()  # served: the retry's writes commit, the first attempt's stay aborted
    assert wf.committed_state() == {"draft": "v1", "after": 1}
    assert [w.status for w in fold_blame(wf.events()).writes("draft")] == ["aborted", "committed"]


# -- what is not recorded: an unstorable result, a call after its superstep closed, a store error --


class Unstorable:
    """A plain class: the codec stores no such value."""

    def __init__(self, text: str) -> None:
        self.text = text


async def test_a_result_the_log_cannot_store_is_recorded_as_an_error_and_runs_again(
    url: str,
) -> None:
    store = open_store(url)

    @step
    async def make() -> Unstorable:
        calls["make"] += 1
        return Unstorable(f"made {calls['make']}")

    async def body(_: str) -> str:
        return (await make()).text

    wf = build(store, Calls("c", body))
    with pytest.raises(EncodingError, match=r"the result of step 'make'.*Unstorable"):
        await wf.run("go")
    (refused,) = recorded(wf)
    assert refused.error is not None
    assert (refused.error.type, refused.result) == ("kernel.EncodingError", None)

    with pytest.raises(EncodingError):
        await build(reopen(url, store), Calls("c", body)).resume()
    assert calls["make"] == 2  # nothing was served: the call ran again


async def test_a_step_called_after_its_superstep_closed_is_refused_before_it_runs() -> None:
    committed = asyncio.Event()
    background: list[asyncio.Task[Any]] = []

    async def later() -> dict[str, str]:
        await committed.wait()
        return await fetch("too late")

    async def body(_: str) -> str:
        background.append(asyncio.create_task(later()))
        return "done"

    wf = build(open_store("memory://"), Calls("c", body))
    assert (await wf.run("go")).get_outputs() == ["done"]
    committed.set()
    with pytest.raises(StateWriteRejectedError, match=r"call of step 'fetch'.*already committed"):
        await background[0]
    assert calls["fetch"] == 0
    assert recorded(wf) == []


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
    events = read_elsewhere(durable_store_url, store)
    assert [e.type for e in events][-2:] == ["superstep_committed", "run_completed"]
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert recorded(wf) == []


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

    append_commit = _instance.InstanceContext.append_commit

    def refusing_commit(self: Any, batch: Any, *, expected_version: int) -> Any:
        if refusals and any(event.type == "step_recorded" for event in batch):
            raise refusals.pop()  # a record goes through the group commit where there is one
        return append_commit(self, batch, expected_version=expected_version)

    monkeypatch.setattr(_instance.InstanceContext, "append", refusing)
    monkeypatch.setattr(_instance.InstanceContext, "append_commit", refusing_commit)

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


# -- hooks -----------------------------------------------------------------------------------------


class StepHooks(RunHooks):
    def __init__(self, fail_on: str | None = None) -> None:
        self.heard: list[tuple[int, StepInfo]] = []
        self.fail_on = fail_on

    def step_finished(self, step: SuperstepInfo, call: StepInfo) -> None:
        self.heard.append((step.index, call))
        if call.name == self.fail_on:
            raise RuntimeError(f"the hook refused {call.name}")


async def test_step_finished_hears_every_call_served_or_run(url: str) -> None:
    store = open_store(url)
    fetched = asyncio.Event()
    agent = Agent("agent", between=hangs(fetched))
    hooks = StepHooks()
    wf = WorkflowBuilder(start_executor=agent, store=store, instance_id="steps")
    await cancel_when(fetched, asyncio.create_task(wf.with_hooks(hooks).build().run("weather")))
    agent.between = None
    again = (
        WorkflowBuilder(start_executor=agent, store=reopen(url, store), instance_id="steps")
        .with_hooks(hooks)
        .build()
    )
    await again.resume()

    first, served, sent = recorded(again)
    assert [(index, info.name, info.reused, info.position) for index, info in hooks.heard] == [
        (1, "fetch", False, first.position),
        (1, "fetch", True, first.position),
        (1, "send", False, sent.position),
    ]
    ran = hooks.heard[0][1]
    assert (ran.executor_id, ran.key, ran.step_key, ran.call) == (
        "agent",
        first.key,
        first.step_key,
        0,
    )
    assert (ran.error, ran.usage) == (None, None)
    assert hooks.heard[1][1].duration == 0.0
    assert served.reused == first.position


async def test_a_step_finished_hook_that_raises_fails_the_executor_after_the_record() -> None:
    hooks = StepHooks(fail_on="fetch")
    wf = (
        WorkflowBuilder(start_executor=Agent("agent"), store=open_store("memory://"))
        .with_hooks(hooks)
        .build()
    )
    with pytest.raises(RuntimeError, match="the hook refused fetch"):
        await wf.run("weather")
    assert [r.name for r in recorded(wf)] == ["fetch", "send"]  # the handler went on
    failed = [e for e in wf.events() if e.type == "executor_failed"]
    assert [e.executor_id for e in failed] == ["agent"]
    assert "the hook refused fetch" in failed[0].error.message
    assert wf.committed_state() == {}


# -- the log's guarantees cover step records -------------------------------------------------------


SECRET = "zq7-step-SECRET-4111"


@step
async def lookup_card(customer: str) -> dict[str, str]:
    calls["lookup_card"] += 1
    return {"customer": customer, "card": SECRET}


class Pays(Executor):
    """Looks the card up, runs ``between`` (if set), then yields the card's last digits."""

    def __init__(self, id: str, between: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(id)
        self.between = between

    @handler
    async def handle(self, customer: str, ctx: WorkflowContext[str, str]) -> None:
        found = await lookup_card(customer)
        if self.between is not None:
            await self.between()
        await ctx.yield_output(found["card"][-4:])


async def test_an_encrypted_store_seals_step_results_and_serves_them_back(
    sqlite_url: str,
) -> None:
    ring = Keyring.from_text(Keyring.generate())
    store = open_store(sqlite_url, keyring=ring)
    looked_up = asyncio.Event()
    pays = Pays("pays", between=hangs(looked_up))
    await cancel_when(looked_up, asyncio.create_task(build(store, pays).run("ada")))
    rows = store.backend.select_stream("steps")
    assert rows
    assert all(SECRET.encode() not in state for _, _, state in rows)

    pays.between = None
    with open_store(sqlite_url, keyring=ring) as reopened:
        result = await build(reopened, pays).resume()
        assert result.get_outputs() == ["4111"]
        assert calls["lookup_card"] == 1
        assert recorded(build(reopened, pays))[0].result == {"customer": "ada", "card": SECRET}
        assert reopened.verify_chain().ok
    with (
        open_store(sqlite_url, create=False) as keyless,
        pytest.raises(DecodeError, match="encrypted"),
    ):
        keyless.read("steps")


async def test_a_tampered_step_record_is_refused_by_every_reader(sqlite_url: str) -> None:
    """Someone with write access to the database changes a recorded result (what a retry would
    be served): every reader refuses the row, verify names it, and resume serves nothing."""
    from tests.store.test_tamper import CODE, HEADER, SQLiteRows

    store = open_store(sqlite_url)
    looked_up = asyncio.Event()
    pays = Pays("pays", between=hangs(looked_up))
    await cancel_when(looked_up, asyncio.create_task(build(store, pays, "orders").run("ada")))
    (record,) = [e for e in store.read("orders") if isinstance(e, StepRecorded)]
    store.close()

    rows = SQLiteRows(sqlite_url)
    row = next(r for r in rows.all() if any(e[0] == CODE["step_recorded"] for e in r.body[HEADER:]))
    text = orjson.dumps(row.body).replace(SECRET.encode(), b"zq7-step-FORGED-0000")
    assert text != orjson.dumps(row.body)
    rows.put(row.last, text)

    with open_store(sqlite_url, create=False) as reader:
        with pytest.raises(
            LogIntegrityError, match=rf"'orders'#{record.position} \(step_recorded\)"
        ):
            reader.read("orders")
        problems = reader.verify_chain().problems
        assert [(p.instance_id, p.position, p.kind) for p in problems] == [
            ("orders", record.position, "edited")
        ]
        pays.between = None
        # Folded from the log (snapshots off), the resume reads the row and refuses it.
        builder = WorkflowBuilder(start_executor=pays, store=reader, instance_id="orders")
        unsnapshotted = builder.with_snapshots(every=0).build()
        with pytest.raises(LogIntegrityError):
            await unsnapshotted.resume()
    assert calls["lookup_card"] == 1
    # With the snapshot the cancelled run kept, an open reads only the log after it: the record
    # is served as the run wrote it (and verified it) before the edit, never the forged value;
    # finding the edit is verify's (above), as for any row before a snapshot.
    with open_store(sqlite_url, create=False) as reader:
        result = await build(reader, pays, "orders").resume()
        assert result.get_outputs() == [SECRET[-4:]]  # what the recorded lookup returned
    assert calls["lookup_card"] == 1


# -- lineages: what a call may be served -----------------------------------------------------------


async def test_a_fork_is_not_served_the_origins_steps_and_the_origin_still_is(url: str) -> None:
    """The origin recorded a step in a superstep that then failed; a fork of the checkpoint
    before it is a new instance: its retry of that superstep calls the step again. The origin's
    own retry is still served."""
    store = open_store(url)
    failures = [ConnectionError("down")]

    async def relay_down() -> None:
        if failures:
            raise failures.pop()

    start = Forward("start")
    agent = Agent("agent", between=relay_down)

    def two_steps(store: EventStore, instance_id: str = "origin") -> Workflow:
        return (
            WorkflowBuilder(start_executor=start, store=store, instance_id=instance_id)
            .add_edge(start, agent)
            .build()
        )

    origin = two_steps(store)
    with pytest.raises(ConnectionError):
        await origin.run("weather")
    assert calls["fetch"] == 1

    fork = origin.fork(at=origin.checkpoints()[-1].checkpoint_id, instance_id="fork")
    assert (await fork.resume()).get_outputs() == ["sent answer 2"]
    assert calls["fetch"] == 2  # the fork called it
    fork_record = recorded(fork)[0]
    assert fork_record.reused is None
    assert fork_record.step_key != recorded(origin)[0].step_key

    assert (await two_steps(store).resume()).get_outputs() == ["sent answer 1"]
    assert calls["fetch"] == 2  # the origin was served its own


async def test_a_new_run_with_a_message_is_not_served_the_previous_lineages_steps(
    url: str,
) -> None:
    store = open_store(url)
    failures = [ConnectionError("down")]

    async def relay_down() -> None:
        if failures:
            raise failures.pop()

    wf = build(store, Agent("agent", between=relay_down))
    with pytest.raises(ConnectionError):
        await wf.run("weather")

    result = await wf.run("weather")  # the same message, but a new run: a new lineage

    assert result.get_outputs() == ["sent answer 2"]
    assert calls["fetch"] == 2
    first, second, _ = recorded(wf)
    assert (first.lineage, second.lineage) == (first.run_id, result.run_id)
    assert second.reused is None
    assert second.key == first.key
    assert second.step_key != first.step_key


# -- the stream ------------------------------------------------------------------------------------


async def test_the_stream_shows_each_step_invoked_completed_failed_or_bypassed(url: str) -> None:
    """As AF's functional steps: executor_invoked (with the arguments), executor_completed (with
    the result), executor_failed, and executor_bypassed (with the served result) on a retry."""
    store = open_store(url)
    fetched = asyncio.Event()
    agent = Agent("agent", between=hangs(fetched))
    wf = build(store, agent)
    live: list[tuple[str, Any]] = []

    async def watch() -> None:
        async for event in wf.run("weather", stream=True):
            if event.executor_id in ("fetch", "send"):
                live.append((f"{event.type} {event.executor_id}", event.data))

    await cancel_when(fetched, asyncio.create_task(watch()))
    agent.between = None
    async for event in wf.resume(stream=True):
        if event.executor_id in ("fetch", "send"):
            live.append((f"{event.type} {event.executor_id}", event.data))

    answer = {"query": "weather", "answer": "answer 1"}
    assert live == [
        ("executor_invoked fetch", {"args": ("weather",), "kwargs": {}}),
        ("executor_completed fetch", answer),
        ("executor_bypassed fetch", answer),
        ("executor_invoked send", {"args": ("answer 1",), "kwargs": {}}),
        ("executor_completed send", "sent answer 1"),
    ]


async def test_the_stream_shows_a_step_that_raised_as_failed() -> None:
    @step
    async def broken() -> None:
        raise ValueError("broken")

    async def body(_: str) -> None:
        with contextlib.suppress(ValueError):
            await broken()

    seen = [
        (e.type, e.executor_id)
        async for e in build(open_store("memory://"), Calls("c", body)).run("go", stream=True)
        if e.executor_id == "broken"
    ]
    assert seen == [("executor_invoked", "broken"), ("executor_failed", "broken")]


# -- PostgreSQL ------------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_on_postgresql_a_retried_superstep_is_served_its_completed_steps(
    postgres_url: str,
) -> None:
    store = open_store(postgres_url)
    fetched = asyncio.Event()
    agent = Agent("agent", between=hangs(fetched))
    wf = build(store, agent)
    await cancel_when(fetched, asyncio.create_task(wf.run("weather")))

    agent.between = None
    with open_store(postgres_url) as other:
        result = await build(other, agent).resume()
        first, served, _ = recorded(build(other, agent))
    store.close()

    assert result.get_outputs() == ["sent answer 1"]
    assert dict(calls) == {"fetch": 1, "send": 1}
    assert_served(first, served)


# -- review: threads, hostile replay keys, forged provenance ---------------------------------------


async def test_a_step_called_from_another_thread_with_the_handlers_context_is_refused() -> None:
    """``asyncio.to_thread`` copies the handler's context into a thread with its own loop: the
    step is refused before it runs, never recorded from a foreign thread."""

    @step
    async def elsewhere(value: str) -> str:
        calls["elsewhere"] += 1
        return value

    async def body(message: str) -> str:
        return await asyncio.to_thread(lambda: asyncio.run(elsewhere(message)))

    store = open_store("memory://")
    wf = build(store, Calls("c", body))
    with pytest.raises(ExecutionError, match=r"from another thread or event loop"):
        await wf.run("go")
    assert calls["elsewhere"] == 0
    assert recorded(wf) == []


async def test_a_replay_key_that_is_not_valid_unicode_names_the_step() -> None:
    @step(replay_key=lambda _: "\ud800")
    async def keyed(value: str) -> str:
        return value

    wf = build(open_store("memory://"), Calls("c", keyed))
    with pytest.raises(ValueError, match=r"^@step 'keyed' replay_key returned '\\ud800'"):
        await wf.run("go")


def test_a_served_record_must_point_at_a_recorded_result_of_the_same_call() -> None:
    """``StepRecorded.origin_in``, the rule the runner, replay and every reader keep: a served
    call's ``reused`` names a record of the same executor and identity that returned."""
    log = LogBuilder("forged")
    log.start_run("go", run_id="r1")
    log.start_superstep(superstep_id="s1")
    log.invoke("agent")
    a = log.record_step("call_a", "A")
    b_failed = log.record_step("call_b", error=RuntimeError("no"), call=1)
    b_served_a = log.record_step("call_b", reused=a.position, call=1)
    b_served_failed = log.record_step("call_b", reused=b_failed.position, call=1)
    a_served = log.record_step("call_a", reused=a.position)
    records = {e.position: e for e in log.events() if isinstance(e, StepRecorded)}
    assert a_served.origin_in(records) == a
    for forged in (b_served_a, b_served_failed, a):  # another call's; one that raised; unserved
        with pytest.raises(LogIntegrityError, match=r"holds no recorded result of that call") as e:
            forged.origin_in(records)
        assert (e.value.position, e.value.kind) == (forged.position, "reused")
