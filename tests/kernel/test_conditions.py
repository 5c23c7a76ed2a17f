"""Edge conditions and switch-case predicates may be sync or async; an async one is awaited."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kernel import (
    Case,
    Default,
    Executor,
    StateWriteRejectedError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from tests.kernel.helpers import FailsAfter, Router, Sink, of_type


def small_sync(n: int) -> bool:
    return n < 10


def big_sync(n: int) -> bool:
    return n >= 10


async def small_async(n: int) -> bool:
    await asyncio.sleep(0)
    return n < 10


async def big_async(n: int) -> bool:
    await asyncio.sleep(0)
    return n >= 10


Predicates = tuple[Callable[[int], bool | Awaitable[bool]], Callable[[int], bool | Awaitable[bool]]]
BOTH: list[Any] = [
    pytest.param((small_sync, big_sync), id="sync"),
    pytest.param((small_async, big_async), id="async"),
    pytest.param((small_async, big_sync), id="mixed"),
]


async def outputs_without_unawaited_coroutines(wf: Any, inputs: list[int]) -> list[list[Any]]:
    """Run once per input; fail if any coroutine was left un-awaited along the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [(await wf.run(n)).get_outputs() for n in inputs]
        gc.collect()
    unawaited = [w for w in caught if "never awaited" in str(w.message)]
    assert unawaited == []
    return outputs


@pytest.mark.parametrize("predicates", BOTH)
async def test_edge_conditions_decide_the_delivery(store, predicates: Predicates):
    small_if, big_if = predicates
    router, small, big = Router("router"), Sink("small"), Sink("big")
    wf = (
        WorkflowBuilder(start_executor=router, store=store)
        .add_edge(router, small, condition=small_if)
        .add_edge(router, big, condition=big_if)
        .build()
    )

    outputs = await outputs_without_unawaited_coroutines(wf, [3, 30])

    assert outputs == [["small:3"], ["big:30"]]
    assert [e.targets for e in of_type(wf.events(), "message_staged")] == [["small"], ["big"]]


@pytest.mark.parametrize("predicates", BOTH)
async def test_switch_case_predicates_pick_the_first_true_case(store, predicates: Predicates):
    small_if, big_if = predicates
    router, small, big, other = Router("router"), Sink("small"), Sink("big"), Sink("other")
    wf = (
        WorkflowBuilder(start_executor=router, store=store)
        .add_switch_case_edge_group(
            router, [Case(big_if, big), Case(small_if, small), Default(other)]
        )
        .build()
    )

    outputs = await outputs_without_unawaited_coroutines(wf, [3, 30])

    assert outputs == [["small:3"], ["big:30"]]


async def test_an_async_condition_that_is_false_for_every_edge_delivers_nothing(store):
    async def never(n: int) -> bool:
        return False

    router, sink = Router("router"), Sink("sink")
    wf = WorkflowBuilder(start_executor=router, store=store).add_edge(router, sink, never).build()

    outputs = await outputs_without_unawaited_coroutines(wf, [1])

    assert outputs == [[]]
    assert of_type(wf.events(), "message_staged")[0].targets == []


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_a_send_whose_async_condition_outlives_its_superstep_is_refused(store, durability):
    routing = asyncio.Event()
    refusals: list[BaseException] = []

    async def stubborn(n: int) -> bool:
        routing.set()
        with contextlib.suppress(asyncio.CancelledError):  # so the send would go on, unchecked
            await asyncio.sleep(3600)
        return True

    class Sender(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
            try:
                await ctx.send_message(n)
            except StateWriteRejectedError as refusal:
                refusals.append(refusal)
                raise

    source, sender, failer, sink = (
        Router("source"),
        Sender("sender"),
        FailsAfter("failer", routing, "sibling failed while a condition was awaited"),
        Sink("sink"),
    )
    wf = (
        WorkflowBuilder(start_executor=source, store=store, durability=durability)
        .add_fan_out_edges(source, [sender, failer])
        .add_edge(sender, sink, condition=stubborn)
        .build()
    )

    with pytest.raises(ValueError, match="sibling failed"):
        async with asyncio.timeout(10):  # a condition that is never awaited never lets it fail
            await wf.run(1)

    assert [e.source for e in of_type(wf.events(), "message_staged")] == ["source"]
    assert len(refusals) == 1
    assert "aborted (failed)" in str(refusals[0])
    assert wf.events()[-1].type == "run_failed"
