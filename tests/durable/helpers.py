"""What the durable-execution tests (and the CLI and history tests built on them) share: a counting
workflow, a reviewing workflow that asks for input, and reopening a store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel import (
    EventStore,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    response_handler,
)


@dataclass
class Tick:
    n: int


@dataclass
class Approval:
    draft: str


class Counter(Executor):
    """Counts to ``limit``, one superstep per tick: stages ``count`` (``n``, times ``scale`` from
    3 on), yields ``n`` and sends the next tick; fails at ``fail_at`` if set."""

    def __init__(self, id: str, limit: int, *, fail_at: int | None = None, scale: int = 1) -> None:
        super().__init__(id)
        self.limit = limit
        self.fail_at = fail_at
        self.scale = scale

    @handler
    async def tick(self, tick: Tick, ctx: WorkflowContext[Tick, int]) -> None:
        if tick.n == self.fail_at:
            raise RuntimeError(f"boom at {tick.n}")
        ctx.set_state("count", tick.n if tick.n < 3 else tick.n * self.scale)
        await ctx.yield_output(tick.n)
        if tick.n < self.limit:
            await ctx.send_message(Tick(tick.n + 1))


class Reviewer(Executor):
    """Stages the ``draft`` and asks for its approval; ``"approve"`` yields the draft, any other
    answer asks again about the draft with the answer appended."""

    @handler
    async def draft(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("draft", text)
        await ctx.request_info(Approval(text), str)

    @response_handler
    async def decided(self, request: Approval, answer: str, ctx: WorkflowContext[str, str]) -> None:
        if answer == "approve":
            ctx.set_state("approved", request.draft)
            await ctx.yield_output(request.draft)
        else:
            await ctx.request_info(Approval(f"{request.draft} ({answer})"), str)


class AsksThenFails(Executor):
    """Asks for input, then fails: its superstep is aborted with the request in it."""

    @handler
    async def draft(self, text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.request_info(Approval(text), str)
        raise RuntimeError("after the request")

    @response_handler
    async def decided(self, request: Approval, answer: str, ctx: WorkflowContext) -> None:
        raise AssertionError("never delivered")


def reopen(url: str, store: Any) -> EventStore:
    """The store as another process would open it (the memory store has no other process)."""
    opened: EventStore = store if url.startswith("memory") else open_store(url)
    return opened


def counting(
    store: EventStore,
    instance_id: str = "count",
    *,
    fail_at: int | None = None,
    limit: int = 5,
    **options: Any,
) -> Workflow:
    """A ``Counter`` sending ticks to itself up to ``limit`` on ``store``'s instance
    ``instance_id``; ``options`` (a clock, an id factory...) go to the ``WorkflowBuilder``."""
    counter = Counter("counter", limit, fail_at=fail_at)
    return (
        WorkflowBuilder(start_executor=counter, store=store, instance_id=instance_id, **options)
        .add_edge(counter, counter)
        .build()
    )


def reviewing(store: EventStore, instance_id: str = "r", **options: Any) -> Workflow:
    """A ``Reviewer`` alone on ``store``'s instance ``instance_id``; ``options`` go to the
    ``WorkflowBuilder``."""
    return WorkflowBuilder(
        start_executor=Reviewer("reviewer"), store=store, instance_id=instance_id, **options
    ).build()
