"""Multi-selection edge groups (``add_multi_selection_edge_group``), as Agent Framework has them:
the selection function gets the message and the group's target ids, and returns the ids that
receive it. Sync or async; checked; recorded in the log, so a continuation never asks it again."""

from __future__ import annotations

import asyncio
from typing import Any, Never

import pytest

from kernel import (
    DefinitionError,
    Executor,
    MessageStaged,
    RoutingError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from tests.kernel.helpers import of_type


class Dispatch(Executor):
    """Sends each number on (to ``target`` if it is set)."""

    def __init__(self, id: str, target: str | None = None) -> None:
        super().__init__(id)
        self.target = target

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n, self.target)


class Worker(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{self.id}:{n}")


class TextWorker(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{self.id}:{text}")


class Calls:
    """A selection function that records what it was asked: picks ``low`` for small numbers,
    both ``high`` and ``audit`` for large ones, and nobody for zero."""

    def __init__(self) -> None:
        self.asked: list[tuple[Any, list[str]]] = []
        self.__name__ = "by_size"

    def __call__(self, n: int, targets: list[str]) -> list[str]:
        self.asked.append((n, list(targets)))
        low, high, audit = targets
        if n == 0:
            return []
        return [low] if n < 10 else [audit, high, audit]


async def async_by_size(n: int, targets: list[str]) -> list[str]:
    await asyncio.sleep(0)
    low, high, audit = targets
    if n == 0:
        return []
    return [low] if n < 10 else [audit, high]


def dispatching(store: Any, selection: Any, **kwargs: Any) -> Any:
    start = Dispatch("dispatch")
    return (
        WorkflowBuilder(start_executor=start, store=store, **kwargs)
        .add_multi_selection_edge_group(
            start, [Worker("low"), Worker("high"), Worker("audit")], selection_func=selection
        )
        .build()
    )


async def test_the_selected_targets_receive_the_message_each_once(store_url: str) -> None:
    calls = Calls()
    wf = dispatching(open_store(store_url), calls)
    small = await wf.run(3)
    large = await wf.run(42)
    assert small.get_outputs() == ["low:3"]
    # ``audit`` was named twice and runs once; both run in the superstep after the send.
    assert sorted(large.get_outputs()) == ["audit:42", "high:42"]
    assert calls.asked == [(3, ["low", "high", "audit"]), (42, ["low", "high", "audit"])]
    staged = of_type(wf.events(), "message_staged")
    assert [m.targets for m in staged] == [["low"], ["audit", "high"]]


async def test_an_async_selection_function_is_awaited(store_url: str) -> None:
    wf = dispatching(open_store(store_url), async_by_size)
    assert (await wf.run(3)).get_outputs() == ["low:3"]
    assert sorted((await wf.run(50)).get_outputs()) == ["audit:50", "high:50"]


async def test_selecting_nobody_delivers_the_message_nowhere(store_url: str) -> None:
    wf = dispatching(open_store(store_url), Calls())
    result = await wf.run(0)
    assert result.status == "completed"
    assert result.get_outputs() == []
    assert result.supersteps == 1
    (staged,) = of_type(wf.events(), "message_staged")
    assert staged.targets == []


@pytest.mark.parametrize(
    ("picked", "says"),
    [
        (["low", "nobody"], "selected ['nobody'], which are not its targets"),
        ("low", "it must return a list of target ids"),
        (None, "it must return a list of target ids"),
        ([1], "selected [1], which are not its targets"),
    ],
)
async def test_a_selection_outside_the_targets_fails_the_superstep(
    store_url: str, picked: Any, says: str
) -> None:
    def bad(n: int, targets: list[str]) -> Any:
        return picked

    wf = dispatching(open_store(store_url), bad)
    with pytest.raises(RoutingError, match=r"selection function .*bad") as raised:
        await wf.run(3)
    assert says in str(raised.value)
    events = wf.events()
    assert of_type(events, "message_staged") == []
    (aborted,) = of_type(events, "superstep_aborted")
    assert aborted.reason == "failed"
    assert of_type(events, "run_failed")[0].executor_id == "dispatch"
    assert of_type(events, "executor_invoked")[-1].executor_id == "dispatch"  # nobody else ran


async def test_a_message_sent_to_one_target_asks_the_selection_only_about_its_group(
    store_url: str,
) -> None:
    calls, others = Calls(), Calls()
    start = Dispatch("dispatch", target="high")
    wf = (
        WorkflowBuilder(start_executor=start, store=open_store(store_url))
        .add_multi_selection_edge_group(
            start, [Worker("low"), Worker("high"), Worker("audit")], selection_func=calls
        )
        .add_multi_selection_edge_group(
            start, [Worker("x"), Worker("y"), Worker("z")], selection_func=others
        )
        .build()
    )
    # 42 to "high": selected (with audit), so only high receives it.
    assert (await wf.run(42)).get_outputs() == ["high:42"]
    assert calls.asked == [(42, ["low", "high", "audit"])]
    assert others.asked == []  # "high" is not one of its targets


async def test_a_target_that_was_not_selected_does_not_get_a_message_sent_to_it(
    store_url: str,
) -> None:
    calls = Calls()
    start = Dispatch("dispatch", target="low")
    wf = (
        WorkflowBuilder(start_executor=start, store=open_store(store_url))
        .add_multi_selection_edge_group(
            start, [Worker("low"), Worker("high"), Worker("audit")], selection_func=calls
        )
        .build()
    )
    result = await wf.run(42)  # the selection picks high and audit, not low
    assert result.get_outputs() == []
    assert of_type(wf.events(), "message_staged")[0].targets == []


async def test_the_selection_is_asked_only_about_a_type_some_target_handles(
    store_url: str,
) -> None:
    asked: list[Any] = []

    def everyone(message: Any, targets: list[str]) -> list[str]:
        asked.append(message)
        return targets

    class Mixed(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[int | str]) -> None:
            await ctx.send_message(n)
            await ctx.send_message(str(n))

    start = Mixed("mixed")
    texts = TextWorker("texts")
    wf = (
        WorkflowBuilder(start_executor=start, store=open_store(store_url))
        .add_multi_selection_edge_group(start, [Worker("n1"), Worker("n2")], everyone)
        .add_edge(start, texts)
        .build()
    )
    result = await wf.run(7)
    assert sorted(result.get_outputs()) == ["n1:7", "n2:7", "texts:7"]
    assert asked == [7]  # never asked about the str, which only the plain edge carries


async def test_a_continuation_delivers_the_selection_recorded_without_asking_again(
    store_url: str,
) -> None:
    calls = Calls()
    crashed = {"once": False}

    class Flaky(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
            if not crashed["once"]:
                crashed["once"] = True
                raise ValueError("flaky")
            await ctx.yield_output(f"{self.id}:{n}")

    store = open_store(store_url)
    start = Dispatch("dispatch")
    wf = (
        WorkflowBuilder(start_executor=start, store=store)
        .add_multi_selection_edge_group(
            start, [Worker("low"), Flaky("high"), Worker("audit")], selection_func=calls
        )
        .build()
    )
    with pytest.raises(ValueError, match="flaky"):
        await wf.run(42)
    result = await wf.resume()
    assert sorted(result.get_outputs()) == ["audit:42", "high:42"]
    assert len(calls.asked) == 1  # superstep 2 was rebuilt from MessageStaged.targets


async def test_the_builder_refuses_a_selection_it_cannot_call_and_bad_targets() -> None:
    start = Dispatch("dispatch")
    a, b = Worker("a"), Worker("b")
    with pytest.raises(DefinitionError, match="selection_func must be a function"):
        WorkflowBuilder(start_executor=start).add_multi_selection_edge_group(
            start,
            [a, b],
            "a",  # type: ignore[arg-type]
        )
    with pytest.raises(DefinitionError, match="multi-selection targets must be distinct"):
        WorkflowBuilder(start_executor=start).add_multi_selection_edge_group(
            start, [a, a], lambda m, t: t
        )
    with pytest.raises(DefinitionError, match="multi-selection targets must not be empty"):
        WorkflowBuilder(start_executor=start).add_multi_selection_edge_group(
            start, [], lambda m, t: t
        )
    with pytest.raises(DefinitionError, match="duplicate edge dispatch->a"):
        WorkflowBuilder(start_executor=start).add_edge(start, a).add_multi_selection_edge_group(
            start, [a, b], lambda m, t: t
        )
    with pytest.raises(DefinitionError, match="can never deliver"):
        WorkflowBuilder(start_executor=start).add_multi_selection_edge_group(
            start, [a, TextWorker("t")], lambda m, t: t
        ).build()


def test_message_staged_records_the_selection_for_audits() -> None:
    wf = dispatching(open_store("memory://"), Calls())
    asyncio.run(wf.run(12))
    (sent,) = [e for e in wf.events() if isinstance(e, MessageStaged)]
    assert (sent.source, sent.targets) == ("dispatch", ["audit", "high"])
