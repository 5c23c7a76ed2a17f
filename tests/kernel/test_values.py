"""Messages, outputs and state must be storable: each kind of value either comes back exactly
from the log (read by a store opened anew), or is refused clearly and early.

"Early" is ``keeping()`` when a handler's annotations name a class the log can never hold, and the
``send_message`` / ``set_state`` / ``yield_output`` call otherwise, before anything is appended
for the value. Nothing is ever pickled.
"""

from __future__ import annotations

import collections
import enum
import pathlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from kernel import (
    DefinitionError,
    EncodingError,
    EventStore,
    Executor,
    MessageStaged,
    OutputYielded,
    StateStaged,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    handler,
    open_store,
)
from tests.kernel.helpers import markers

# -- value classes (module level: the codec names them by module path) ---------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = (0, 255, 0)


class Level(enum.IntEnum):
    LOW = 1


class Point(NamedTuple):
    x: int
    y: Decimal


Pair = collections.namedtuple("Pair", "left right")  # the untyped kind, on purpose


class Inner(BaseModel):
    at: datetime
    tags: set[str]


class Outer(BaseModel):
    inner: Inner
    items: list[Inner]
    color: Color


@dataclass(frozen=True)
class Order:
    id: uuid.UUID
    lines: tuple[Inner, ...]
    point: Point


class Plain:
    def __init__(self, n: int) -> None:
        self.n = n


class Slotted:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class AttrsLike:
    """Shaped like an attrs class (attrs itself is not a dependency)."""

    __attrs_attrs__ = ()

    def __init__(self, n: int) -> None:
        self.n = n


class Tags(dict[str, int]):
    pass


class Shape:
    """A plain base class whose subclasses are dataclasses: storable through them."""


@dataclass
class Square(Shape):
    side: int


WHEN = datetime(2026, 3, 4, 5, 6, 7, 8, tzinfo=UTC)
INNER = Inner(at=WHEN, tags={"a", "b"})

ROUND_TRIPS: dict[str, Any] = {
    "set": {1, "two", (3, 4)},
    "frozenset": frozenset({b"x", 2}),
    "bytes": b"\x00\xffbytes",
    "decimal": Decimal("1.10"),
    "datetime aware": WHEN,
    "datetime zoneinfo": datetime(2026, 1, 1, 12, tzinfo=ZoneInfo("Europe/Paris")),
    "datetime offset": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-3))),
    "datetime naive": datetime(2026, 1, 1, 1, 2, 3),
    "date": date(2026, 2, 28),
    "time": time(23, 59, 1, 5),
    "timedelta": timedelta(days=-1, microseconds=7),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "enum": Color.GREEN,
    "int enum": Level.LOW,
    "typed named tuple": Point(1, Decimal("2.5")),
    "named tuple": Pair("l", [1, 2]),
    "nested models": Outer(inner=INNER, items=[INNER, INNER], color=Color.RED),
    "dataclass of models": Order(uuid.UUID(int=7), (INNER,), Point(0, Decimal(0))),
    "dict with tuple keys": {(1, 2): "pair", (3,): Color.RED},
}


@pytest.fixture(params=["memory", "sqlite"])
def opener(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Any]:
    """Opens the test's store; for SQLite a second call opens the same file anew (a reader that
    only has the log), for memory it is the same store."""
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'v.db'}"
    opened: list[EventStore] = []

    def open_it() -> EventStore:
        if url == "memory://" and opened:
            return opened[0]
        opened.append(open_store(url))
        return opened[-1]

    yield open_it
    for store in opened:
        store.close()


class Keeper(Executor):
    """Stores the message in state, sends it on and yields it: all three paths to the log."""

    @handler
    async def keep(self, message: Any, ctx: WorkflowContext[Any, Any]) -> None:
        ctx.set_state("value", message)
        await ctx.yield_output(message)


def keeping(store: EventStore, instance: str) -> Any:
    keeper = Keeper("keeper")
    return (
        WorkflowBuilder(start_executor=keeper, store=store, instance_id=instance)
        .register_types(Color, Level, Point, Pair, Outer, Order)
        .build()
    )


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
async def test_each_supported_value_comes_back_exactly_from_a_reopened_store(
    opener: Any, name: str
) -> None:
    value = ROUND_TRIPS[name]
    result = await keeping(opener(), "values").run(value)
    assert result.outputs == [value]

    reader = keeping(opener(), "values")  # a new store object on the same file (SQLite)
    back = reader.committed_state()["value"]
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, datetime):
        assert back.tzinfo == value.tzinfo
    output = next(e for e in reader.events() if isinstance(e, OutputYielded))
    assert reader.store.codec.decode(output.value) == value


REFUSED: dict[str, tuple[Any, str]] = {
    "plain class": (Plain(1), "make it a @dataclass or a pydantic BaseModel"),
    "slots class": (Slotted(1), "@dataclass(slots=True) keeps the slots"),
    "attrs class": (AttrsLike(1), "attrs classes are not storable"),
    "dict subclass": (Tags(a=1), "store dict(value) instead"),
    "deque": (collections.deque([1]), "store list(value) instead"),
    "bytearray": (bytearray(b"x"), "store bytes(value) instead"),
    "path": (pathlib.PurePosixPath("/tmp"), "store str(value) instead"),
    "plain class inside a list": ([1, Plain(2)], "[1]: a value of type"),
}


class Writer(Executor):
    """Writes ``fine``, then the bad value through ``how``."""

    def __init__(self, id: str, bad: Any, how: str) -> None:
        super().__init__(id)
        self.bad = bad
        self.how = how

    @handler
    async def run(self, message: int, ctx: WorkflowContext[Any, Any]) -> None:
        ctx.set_state("fine", message)
        if self.how == "set_state":
            ctx.set_state("bad", self.bad)
        elif self.how == "send_message":
            await ctx.send_message(self.bad)
        else:
            await ctx.yield_output(self.bad)


@executor(id="sink")
async def sink(message: Any, ctx: WorkflowContext) -> None:
    pass


@pytest.mark.parametrize("how", ["set_state", "send_message", "yield_output"])
@pytest.mark.parametrize("name", list(REFUSED))
async def test_an_unstorable_value_is_refused_at_the_call_before_anything_is_appended(
    opener: Any, name: str, how: str
) -> None:
    bad, hint = REFUSED[name]
    writer = Writer("writer", bad, how)
    wf = WorkflowBuilder(start_executor=writer, store=opener()).add_edge(writer, sink).build()

    with pytest.raises(EncodingError) as caught:
        await wf.run(1)

    message = str(caught.value)
    assert f"{type(bad).__module__}.{type(bad).__qualname__} is not storable" in message or (
        "Plain is not storable" in message
    )
    assert hint in message
    assert "nothing is pickled" in message
    assert isinstance(caught.value, TypeError)
    events = wf.events()
    assert [e.key for e in events if isinstance(e, StateStaged)] == ["fine"]
    assert not [e for e in events if isinstance(e, MessageStaged | OutputYielded)]
    assert set(markers(wf).values()) == {"aborted:failed"}
    assert wf.committed_state() == {}


async def test_the_run_input_is_refused_before_anything_is_appended(opener: Any) -> None:
    wf = WorkflowBuilder(start_executor=sink, store=opener()).build()
    with pytest.raises(EncodingError, match="Plain is not storable"):
        await wf.run(Plain(1))
    assert wf.events() == []


# -- refused by keeping() --------------------------------------------------------------------------


@dataclass
class HoldsPlain:
    inner: Plain


class AcceptsPlain(Executor):
    @handler
    async def run(self, message: Plain, ctx: WorkflowContext) -> None:
        pass


class SendsPlainList(Executor):
    @handler
    async def run(self, message: int, ctx: WorkflowContext[list[Plain]]) -> None:
        pass


class YieldsSlotted(Executor):
    @handler
    async def run(self, message: int, ctx: WorkflowContext[Any, Slotted | None]) -> None:
        pass


class AcceptsAPlainField(Executor):
    @handler
    async def run(self, message: HoldsPlain, ctx: WorkflowContext) -> None:
        pass


class ExplicitPlain(Executor):
    @handler(input=int, output=Plain)
    async def run(self, message, ctx) -> None:  # type: ignore[no-untyped-def]
        pass


BUILD_REFUSES = [
    (AcceptsPlain, "handler x.run accepts Plain, but values of tests.kernel.test_values.Plain"),
    (SendsPlainList, "handler x.run sends list[tests.kernel.test_values.Plain]"),
    (YieldsSlotted, "@dataclass(slots=True)"),
    (AcceptsAPlainField, "accepts HoldsPlain, but values of tests.kernel.test_values.Plain"),
    (ExplicitPlain, "sends Plain"),
]


@pytest.mark.parametrize(
    ("cls", "says"), BUILD_REFUSES, ids=[cls.__name__ for cls, _ in BUILD_REFUSES]
)
def test_build_refuses_a_handler_that_declares_an_unstorable_class(
    opener: Any, cls: type[Executor], says: str
) -> None:
    store = opener()
    with pytest.raises(DefinitionError) as caught:
        WorkflowBuilder(start_executor=cls("x"), store=store, instance_id="refused").build()
    assert says in str(caught.value)
    assert "cannot be stored in the log" in str(caught.value)
    assert store.read("refused") == []


async def test_abstract_and_base_classes_with_storable_members_are_accepted(opener: Any) -> None:
    class Broad(Executor):
        @handler
        async def shapes(self, message: Shape, ctx: WorkflowContext[Sequence[int], Any]) -> None:
            ctx.set_state("shape", message)
            await ctx.yield_output([1, 2])

    store = opener()
    wf = WorkflowBuilder(start_executor=Broad("broad"), store=store, instance_id="broad")
    result = await wf.register_types(Square).build().run(Square(3))
    assert result.outputs == [[1, 2]]
    reader = WorkflowBuilder(start_executor=Broad("broad"), store=opener(), instance_id="broad")
    assert reader.register_types(Square).build().committed_state() == {"shape": Square(3)}
