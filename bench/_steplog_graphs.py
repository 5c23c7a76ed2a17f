"""steplog workflows for the benchmarks, written against the runner's API.

No ``from __future__ import annotations`` here: handlers' annotations are real types, as the
runner may read them to route messages.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kernel import Executor, WorkflowBuilder, WorkflowContext, handler, step

__all__ = [
    "Advance",
    "LoopStep",
    "advance",
    "advance_recorded",
    "fanout_workflow",
    "gathered_workflow",
    "loop_workflow",
    "steps_workflow",
]

Advance = Callable[[int], Awaitable[int]]


async def advance(count: int) -> int:
    """The work of one step: the next count."""
    return count + 1


advance_recorded = step(name="advance")(advance)
"""``advance`` as a recorded step (``StepRecorded`` in the log, durable at once)."""


class LoopStep(Executor):
    """Each superstep: set two keys, send one message; at ``n`` yield the count and stop.

    The next message is ``message + 1``, or what ``advance(message)`` returns when given (the
    steps benchmark: a recorded step, or the same coroutine unrecorded)."""

    def __init__(self, id: str, n: int, advance: Advance | None = None) -> None:
        super().__init__(id=id)
        self.n = n
        self.advance = advance

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        if message >= self.n:
            await ctx.yield_output(message)
            return
        ctx.set_state("a", message)
        ctx.set_state("b", message)
        await ctx.send_message(message + 1 if self.advance is None else await self.advance(message))


def loop_workflow(
    store: Any,
    instance_id: str,
    n: int,
    durability: str = "superstep",
    advance: Advance | None = None,
) -> Any:
    a, b = LoopStep("a", n, advance), LoopStep("b", n, advance)
    return (
        WorkflowBuilder(
            start_executor=a,
            store=store,
            instance_id=instance_id,
            max_supersteps=n + 10,
            durability=durability,
        )
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )


class FanSource(Executor):
    """Writes ``round`` and sends the round number to every worker, until ``rounds``."""

    def __init__(self, id: str, rounds: int) -> None:
        super().__init__(id=id)
        self.rounds = rounds

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        if message >= self.rounds:
            await ctx.yield_output(message)
            return
        ctx.set_state("round", message)
        await ctx.send_message(message)


class FanWorker(Executor):
    """Writes ``keys`` keys; worker ``w0`` alone sends the next round back to the source."""

    def __init__(self, id: str, keys: int) -> None:
        super().__init__(id=id)
        self.keys = keys

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int]) -> None:
        for k in range(self.keys):
            ctx.set_state(f"{self.id}.k{k}", message)
        if self.id == "w0":
            await ctx.send_message(message + 1)


def fanout_workflow(store: Any, instance_id: str, rounds: int, width: int, keys: int) -> Any:
    source = FanSource("source", rounds)
    workers = [FanWorker(f"w{i}", keys) for i in range(width)]
    builder = WorkflowBuilder(
        start_executor=source,
        store=store,
        instance_id=instance_id,
        max_supersteps=2 * rounds + 10,
        durability="superstep",
    )
    for worker in workers:
        builder = builder.add_edge(source, worker)
    return builder.add_edge(workers[0], source).build()


class Stepper(Executor):
    """One superstep: ``advance`` from the message up to ``n``, one call after the other, then
    set ``count`` and yield it (DBOS's shape: one workflow function calling its steps)."""

    def __init__(self, id: str, n: int, advance: Advance) -> None:
        super().__init__(id=id)
        self.n = n
        self.advance = advance

    @handler
    async def run(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        count = message
        while count < self.n:
            count = await self.advance(count)
        ctx.set_state("count", count)
        await ctx.yield_output(count)


class GatherStepper(Executor):
    """One superstep: ``n`` calls of ``advance`` from the message, ``width`` at a time gathered
    (``asyncio.gather``; the call after a wave starts from its last result), then set ``count``
    and yield it."""

    def __init__(self, id: str, n: int, width: int, advance: Advance) -> None:
        super().__init__(id=id)
        self.n = n
        self.width = width
        self.advance = advance

    @handler
    async def run(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        count = message
        while count < self.n:
            wave = min(self.width, self.n - count)
            got = await asyncio.gather(*(self.advance(count + j) for j in range(wave)))
            count = got[-1]
        ctx.set_state("count", count)
        await ctx.yield_output(count)


def gathered_workflow(
    store: Any, instance_id: str, n: int, width: int, advance: Advance = advance_recorded
) -> Any:
    return WorkflowBuilder(
        start_executor=GatherStepper("stepper", n, width, advance),
        store=store,
        instance_id=instance_id,
        durability="superstep",
    ).build()


def steps_workflow(
    store: Any, instance_id: str, n: int, advance: Advance = advance_recorded
) -> Any:
    return WorkflowBuilder(
        start_executor=Stepper("stepper", n, advance),
        store=store,
        instance_id=instance_id,
        durability="superstep",
    ).build()
