"""The step algebra on its own: routing and fan-in delivery, with no store and no run."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import Executor, RoutingError, WorkflowContext, handler
from kernel._define._graph import FanIn, FanOut, Graph, Single, SwitchCase
from kernel._run._algo import Delivery, Position, Router, Sent, deliver


class Ints(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None: ...


class Texts(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[str]) -> None: ...


class Lists(Executor):
    @handler
    async def run(self, items: list[Any], ctx: WorkflowContext[Any]) -> None: ...


def graph(*groups: Any, **executors: Executor) -> Graph:
    return Graph({id: executor for id, executor in executors.items()}, "a", tuple(groups))


JOIN = FanIn(("a", "b"), "j")


def sent(source: str, message: Any, *targets: str, fan_ins: tuple[FanIn, ...] = ()) -> Sent:
    return Sent(source, message, Delivery(targets, fan_ins))


def test_direct_targets_receive_messages_in_send_order():
    inbox, buffers = deliver([sent("a", 1, "x", "y"), sent("b", 2, "x")], {})

    assert inbox == {"x": [1, 2], "y": [1]}
    assert buffers == {}


def test_a_fan_in_buffers_until_every_source_has_sent_and_leaves_its_input_unchanged():
    inbox, buffers = deliver(
        [sent("b", "b1", fan_ins=(JOIN,)), sent("b", "b2", fan_ins=(JOIN,))], {}
    )
    assert inbox == {}
    assert buffers == {JOIN: {"b": ("b1", "b2")}}

    before = {group: dict(got) for group, got in buffers.items()}
    inbox, after = deliver([sent("a", "a1", fan_ins=(JOIN,))], buffers)

    assert inbox == {"j": [["a1", "b1", "b2"]]}  # in the group's source order, not arrival order
    assert after == {}
    assert buffers == before


def test_a_position_moves_on_by_delivering_what_its_superstep_sent():
    start = Position.start("a", "hello")
    assert (start.index, start.inbox, start.buffers) == (1, {"a": ["hello"]}, {})

    second = start.after([sent("a", "b1", fan_ins=(JOIN,)), sent("a", 7, "x")])

    assert (second.index, second.inbox) == (2, {"x": [7]})
    assert second.buffers == {JOIN: {"a": ("b1",)}}
    assert start.after([]).inbox == {}  # nothing sent: the run is done


async def test_type_only_routes_are_cached_and_go_to_the_targets_that_handle_the_type():
    router = Router(graph(FanOut("a", ("i", "t")), a=Ints("a"), i=Ints("i"), t=Texts("t")))

    assert router.cached("a", 1, None) is None
    delivery = await router.route("a", 1, None)

    assert (delivery.targets, delivery.logged) == (("i",), ("i",))
    assert router.cached("a", 2, None) is delivery
    assert (await router.route("a", "x", None)).targets == ("t",)


async def test_conditions_may_be_sync_or_async_and_are_never_cached():
    calls: list[int] = []

    async def big(n: int) -> bool:
        calls.append(n)
        return n >= 10

    router = Router(
        graph(
            Single("a", "big", big),
            SwitchCase("a", ((lambda n: n < 0, "neg"),), "other"),
            a=Ints("a"),
            big=Ints("big"),
            neg=Ints("neg"),
            other=Ints("other"),
        )
    )

    assert (await router.route("a", 30, None)).targets == ("big", "other")
    assert (await router.route("a", -1, None)).targets == ("neg",)
    assert router.cached("a", 5, None) is None
    assert calls == [30, -1]


async def test_fan_in_deliveries_are_logged_after_the_direct_targets():
    router = Router(
        graph(
            Single("a", "i"),
            FanIn(("a", "b"), "j"),
            a=Ints("a"),
            b=Ints("b"),
            i=Ints("i"),
            j=Lists("j"),
        )
    )

    delivery = await router.route("a", 1, None)

    assert delivery.fan_ins == (FanIn(("a", "b"), "j"),)
    assert delivery.logged == ("i", "j")
    assert (await router.route("a", 1, "j")).targets == ()


UNDELIVERABLE = pytest.mark.parametrize(
    ("source", "message", "target", "error", "reason"),
    [
        ("i", 1, None, "has no outgoing edges", "no_edges"),
        ("a", 1, "t", "no edge connects them", "target_mismatch"),
        ("a", 1.5, None, "sent a float, which no target connected to it handles", "type_mismatch"),
    ],
)


def undeliverable_graph(*, strict: bool) -> Graph:
    executors = {"a": Ints("a"), "i": Ints("i"), "t": Texts("t")}
    return Graph(executors, "a", (Single("a", "i"),), strict_routing=strict)


@UNDELIVERABLE
async def test_what_cannot_be_routed_is_refused_with_a_routing_error_when_strict(
    source, message, target, error, reason
):
    router = Router(undeliverable_graph(strict=True))

    with pytest.raises(RoutingError, match=error):
        await router.route(source, message, target)


@UNDELIVERABLE
async def test_what_cannot_be_routed_is_dropped_with_its_reason_by_default(
    source, message, target, error, reason
):
    router = Router(undeliverable_graph(strict=False))

    delivery = await router.route(source, message, target)

    assert (delivery.targets, delivery.fan_ins, delivery.logged) == ((), (), ())
    assert delivery.dropped == reason
    assert router.cached(source, message, target) is delivery  # type-only routes are cached
    inbox, buffers = deliver([Sent(source, message, delivery)], {})
    assert (inbox, buffers) == ({}, {})


async def test_a_message_its_conditions_route_nowhere_is_not_a_drop():
    router = Router(graph(Single("a", "i", condition=lambda n: n > 0), a=Ints("a"), i=Ints("i")))

    delivery = await router.route("a", -1, None)

    assert (delivery.targets, delivery.dropped) == ((), None)
