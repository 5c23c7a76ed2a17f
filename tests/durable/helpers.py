"""What the durable-execution tests share: a counting workflow's parts, and reopening a store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel import EventStore, Executor, WorkflowContext, handler, open_store, response_handler


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
