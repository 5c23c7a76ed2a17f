"""Recorded steps (``@step``) called from graph handlers: what a call records, when a retried
superstep is served it, the identities that find it again (Agent Framework's rules), and the
edges: a result the log cannot store, a call after its superstep closed, a store error while
recording, hooks, the stream, encryption and tampering.

Most tests run on the memory and SQLite stores (``url``); one runs on PostgreSQL.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from kernel import (
    EventStore,
    Executor,
    StepRecorded,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
)

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
