"""ValueCodec: every supported value comes back exactly, alone and through the event store."""

from __future__ import annotations

import enum
import math
import reprlib
import socket
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from kernel import (
    DecodeError,
    DefinitionError,
    EncodingError,
    EventStore,
    Executor,
    MemoryStore,
    RunStarted,
    StateStaged,
    ValueCodec,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    handler,
)
from kernel._codec._mapper import RowMapper
from kernel._codec._values import MAX_DEPTH
from kernel._codec._valuetypes import unstorable_class, value_classes

# -- classes the codec must rebuild (module level: importable by path) ----------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = (0, 0, 255)


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    READ = 1
    WRITE = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Address(BaseModel):
    street: str
    zip_code: str


class Customer(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    since: datetime
    address: Address
    previous: list[Address] = []
    tags: set[str] = set()
    scores: dict[int, Decimal] = {}
    window: tuple[int, ...] = ()
    color: Color = Color.RED
    note: str | None = None


@dataclass
class Point:
    x: float
    y: float


@dataclass(frozen=True)
class Segment:
    start: Point
    end: Point
    label: str = ""
    owner: Customer | None = None


@dataclass
class Counter:
    name: str
    total: int = field(init=False, default=0)


class Shapes:
    @dataclass
    class Circle:
        center: Point
        radius: float


# -- strict comparison: same types, same float signs, nan equal to nan, same zones ----------


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and repr(a) == repr(b))
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime | time):
        return bool(a == b and a.tzinfo == b.tzinfo and a.utcoffset() == b.utcoffset())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set | frozenset):
        return len(a) == len(b) and all(any(same(x, y) for y in b) for x in a)
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    return bool(a == b)


def registered() -> ValueCodec:
    """A codec that may rebuild this module's classes (their field types come along)."""
    codec = ValueCodec()
    codec.register(Color, Priority, Perm, Mode, Customer, Segment, Counter, Shapes.Circle)
    return codec


def round_trip(value: Any, codec: ValueCodec | None = None) -> Any:
    """Encode, write as JSON bytes, read back and decode (with this module's classes)."""
    codec = codec or registered()
    return codec.decode(orjson.loads(orjson.dumps(codec.encode(value))))


def test_same_is_strict() -> None:
    assert same([float("nan"), -0.0], [float("nan"), -0.0])
    assert not same(-0.0, 0.0)
    assert not same(1, True)
    assert not same({1: 2, 3: 4}, {3: 4, 1: 2})
    assert not same(Decimal("1.0"), Decimal("1.00"))
    assert not same(
        datetime(2024, 1, 1, tzinfo=UTC),
        datetime(2024, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
    )


# -- JSON-like trees (hypothesis) -----------------------------------------------------------

INT_EDGES = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**40, -(10**40)]
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.sampled_from(INT_EDGES)
    | st.floats()
    | st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0])
    | st.text()
)
hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=4,
)
trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(), children, max_size=4)
        | st.dictionaries(hashables | st.just("$t"), children, max_size=4)
        | st.builds(tuple, st.lists(children, max_size=3))
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=20,
)


@settings(deadline=None)
@given(trees)
def test_json_like_trees_round_trip_exactly(value: Any) -> None:
    assert same(round_trip(value), value)


@settings(deadline=None, max_examples=50)
@given(trees)
def test_trees_round_trip_through_the_event_mapper(value: Any) -> None:
    codec, mapper = ValueCodec(), RowMapper()
    event = StateStaged(
        instance_id="wf", position=1, timestamp=datetime(2024, 1, 1, tzinfo=UTC), run_id="r",
        superstep_id="s", executor_id="e", key="k", op="set", value=codec.encode(value),
    )  # fmt: skip
    back = mapper.to_event(mapper.to_stored(event))
    assert back == event
    assert same(codec.decode(back.value), value)


def test_plain_json_is_stored_as_itself() -> None:
    tree = {"a": [1, 2.5, None, True, "x"], "b": {"c": 2**63 - 1}}
    assert ValueCodec().encode(tree) == tree


def test_a_dict_with_a_tag_key_or_other_keys_is_tagged() -> None:
    codec = ValueCodec()
    assert codec.encode({"$t": "int", "v": "1"})["$t"] == "dict"
    assert codec.encode({1: "a"}) == {"$t": "dict", "v": [[1, "a"]]}


# -- other types ----------------------------------------------------------------------------

fixed_offsets = st.builds(
    timezone,
    st.timedeltas(
        min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59)
    ),
)


@settings(deadline=None)
@given(
    st.datetimes(
        timezones=st.none() | st.just(UTC) | fixed_offsets | st.timezones(), allow_imaginary=False
    )
)
def test_datetimes_keep_their_instant_and_zone(value: datetime) -> None:
    assert same(round_trip(value), value)


def test_a_zoneinfo_datetime_keeps_its_zone_and_fold() -> None:
    # 02:30 on 2024-10-27 happens twice in Paris; fold=1 is the second one (UTC+1).
    second = datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris"))
    back = round_trip(second)
    assert back.tzinfo is ZoneInfo("Europe/Paris")
    assert (back.fold, back.utcoffset()) == (1, timedelta(hours=1))


@settings(deadline=None)
@given(
    st.dates()
    | st.times(timezones=st.none() | st.just(UTC) | fixed_offsets)
    | st.timedeltas()
    | st.uuids()
    | st.decimals()
    | st.binary()
)
def test_dates_times_durations_uuids_decimals_and_bytes_round_trip(value: Any) -> None:
    assert same(round_trip(value), value)


@pytest.mark.parametrize(
    "value",
    [Color.RED, Color.BLUE, Priority.HIGH, Perm.READ | Perm.WRITE, Mode.FAST, [Priority.LOW, 1]],
    ids=repr,
)
def test_enum_members_round_trip(value: Any) -> None:
    assert same(round_trip(value), value)


CUSTOMER = Customer(
    name="Ada",
    since=datetime(2020, 2, 29, 9, 0, tzinfo=ZoneInfo("Europe/London")),
    address=Address(street="1 Loop Rd", zip_code="01234"),
    previous=[Address(street="Old St", zip_code="99999")],
    tags={"vip", "beta"},
    scores={1: Decimal("9.50"), 2: Decimal("-0")},
    window=(1, 2, 3),
    color=Color.BLUE,
)


def test_pydantic_models_round_trip() -> None:
    back = round_trip(CUSTOMER)
    assert back == CUSTOMER
    assert same(back.model_dump(), CUSTOMER.model_dump())


@pytest.mark.parametrize(
    "value",
    [
        Point(1.5, -0.0),
        Segment(Point(0, 0), Point(3, 4), label="diag", owner=CUSTOMER),
        Shapes.Circle(center=Point(1, 2), radius=float("inf")),
        {"shapes": [Shapes.Circle(Point(0, 0), 1.0)], "at": Point(2, 2)},
    ],
    ids=["dataclass", "nested-dataclasses-and-model", "nested-class", "inside-json"],
)
def test_dataclasses_round_trip(value: Any) -> None:
    back = round_trip(value)
    assert back == value
    assert same(orjson.loads(orjson.dumps(ValueCodec().encode(back))), ValueCodec().encode(value))


def test_a_dataclass_field_outside_init_round_trips() -> None:
    counter = Counter("visits")
    counter.total = 7
    back = round_trip(counter)
    assert (back.name, back.total) == ("visits", 7)


def test_a_class_defined_in_a_function_round_trips_once_registered() -> None:
    @dataclass
    class Local:
        at: date

    codec = ValueCodec()
    tree = codec.encode(Local(date(2024, 1, 2)))
    assert tree["cls"] == f"{__name__}:{Local.__qualname__}"
    assert codec.decode(tree) == {"at": date(2024, 1, 2)}  # encoding it registered nothing
    codec.register(Local)
    assert round_trip(Local(date(2024, 1, 2)), codec) == Local(date(2024, 1, 2))
    assert ValueCodec().decode(tree) == {"at": date(2024, 1, 2)}


@pytest.mark.parametrize(
    ("tag", "inner", "plain"),
    [
        (
            "dataclass",
            {"a": 1, "when": {"$t": "date", "v": "2024-01-02"}},
            {"a": 1, "when": date(2024, 1, 2)},
        ),
        ("model", {"name": "x", "ids": {"$t": "tuple", "v": [1, 2]}}, {"name": "x", "ids": (1, 2)}),
        ("enum", "red", "red"),
    ],
)
def test_an_unimportable_class_decodes_to_plain_fields(tag: str, inner: Any, plain: Any) -> None:
    tree = {"$t": tag, "cls": "nonexistent.module:Thing", "v": inner}
    assert same(ValueCodec().decode(tree), plain)


def test_an_unknown_tag_is_a_decode_error() -> None:
    problem = "cannot decode state key 'k': unknown value tag 'future'"
    with pytest.raises(DecodeError, match=problem):
        ValueCodec().decode({"$t": "future", "v": 1}, what="state key 'k'")


# -- values that cannot be stored -----------------------------------------------------------


@pytest.fixture
def a_socket() -> Any:
    with socket.socket() as sock:
        yield sock


@pytest.mark.parametrize(
    ("make", "where", "type_name"),
    [
        (lambda: object(), "state 'profile'", "builtins.object"),
        (
            lambda: {"user": {"tags": [1, lambda: 0]}},
            "state 'profile'['user']['tags'][1]",
            "builtins.function",
        ),
        (lambda: Point(1, object()), "state 'profile'.y", "builtins.object"),  # type: ignore[arg-type]
        (lambda: {(1, 2): {object()}}, "state 'profile'[(1, 2)][0]", "builtins.object"),
        (lambda: bytearray(b"x"), "state 'profile'", "builtins.bytearray"),
    ],
    ids=["object", "lambda-in-json", "dataclass-field", "dict-key-path", "bytearray"],
)
def test_an_unsupported_value_names_what_where_and_type(
    make: Any, where: str, type_name: str
) -> None:
    with pytest.raises(EncodingError) as caught:
        ValueCodec().encode(make(), what="state 'profile'")
    assert f"cannot encode {where}:" in str(caught.value)
    assert type_name in str(caught.value)


def test_a_socket_is_refused(a_socket: socket.socket) -> None:
    with pytest.raises(EncodingError, match=r"cannot encode message\[0\]: .*socket\.socket"):
        ValueCodec().encode([a_socket], what="message")


# -- the full path: codec, event, store, event, codec --------------------------------------

EVERYTHING = {
    "customer": CUSTOMER,
    "segment": Segment(Point(0, 0), Point(3, 4)),
    "circle": Shapes.Circle(Point(1, 1), 2.0),
    "flags": Perm.READ | Perm.WRITE,
    "when": datetime(2024, 3, 31, 3, 0, tzinfo=ZoneInfo("Europe/Paris")),
    "later": datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
    "on": date(2024, 2, 29),
    "at": time(23, 59, 59, 999999),
    "took": timedelta(days=-1, microseconds=1),
    "id": uuid.UUID(int=2**128 - 1),
    "cost": Decimal("-0.000"),
    "blob": bytes(range(256)),
    "numbers": (2**64, -(2**63) - 1, float("nan"), float("-inf"), -0.0),
    "sets": [{1, 2}, frozenset({"a"})],
    ("tuple", "key"): {"$t": "not a tag"},
    None: "\u2603 snow \U0001f600",
}


def test_values_survive_the_store_exactly(store: EventStore) -> None:
    codec = ValueCodec()
    event = StateStaged(
        instance_id="wf", position=1, timestamp=datetime(2024, 1, 1, tzinfo=UTC), run_id="r",
        superstep_id="s", executor_id="e", key="k", op="set", value=codec.encode(EVERYTHING),
    )  # fmt: skip
    store.append("wf", [event], expected_version=0)
    (back,) = store.read("wf")
    assert same(registered().decode(back.value), EVERYTHING)  # type: ignore[attr-defined]


def test_the_deepest_values_encode_writes_survive_the_store(store: EventStore) -> None:
    codec, stamp = ValueCodec(), datetime(2024, 1, 1, tzinfo=UTC)
    deepest = [nested(MAX_DEPTH), {"a": nested(MAX_DEPTH - 1)}, (nested(MAX_DEPTH - 2),)]
    started = RunStarted(
        instance_id="wf", position=1, timestamp=stamp, run_id="r", workflow_name="w",
        owner="o", durability="superstep", input=codec.encode(deepest[0]),
        kwargs={"k": codec.encode(deepest[1])},
    )  # fmt: skip
    staged = StateStaged(
        instance_id="wf", position=2, timestamp=stamp, run_id="r", superstep_id="s",
        executor_id="e", key="k", op="set", value=codec.encode(deepest[2]),
    )  # fmt: skip
    store.append("wf", [started, staged], expected_version=0)
    back_started, back_staged = store.read("wf")
    assert codec.decode(back_started.input) == deepest[0]  # type: ignore[attr-defined]
    assert codec.decode(back_started.kwargs["k"]) == deepest[1]  # type: ignore[attr-defined]
    assert codec.decode(back_staged.value) == deepest[2]  # type: ignore[attr-defined]


# -- classes that serialize themselves (to_dict / from_dict, as Agent Framework's do) ---------


class Memo:
    """Neither a model nor a dataclass: it says what it is with to_dict() and from_dict."""

    rebuilt = 0  # how many times from_dict ran, in this process

    def __init__(self, text: str, when: date | None = None) -> None:
        self.text, self.when = text, when

    def to_dict(self) -> dict[str, Any]:
        return {"type": "memo", "text": self.text, "when": self.when}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Memo:
        if value.get("type") != "memo":
            raise ValueError(f"not a memo: {value.get('type')!r}")
        Memo.rebuilt += 1
        return cls(value["text"], value["when"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Memo) and (self.text, self.when) == (other.text, other.when)

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Pinned:
    note: Memo
    notes: list[Memo]


def test_a_self_serializing_value_is_stored_as_its_to_dict_and_rebuilt_once_registered() -> None:
    note = Memo("hello", date(2024, 1, 2))
    codec = ValueCodec()
    tree = orjson.loads(orjson.dumps(codec.encode(note)))
    assert tree == {
        "$t": "object",
        "cls": f"{__name__}:Memo",
        "v": {"type": "memo", "text": "hello", "when": {"$t": "date", "v": "2024-01-02"}},
    }
    before = Memo.rebuilt
    assert codec.decode(tree) == {"type": "memo", "text": "hello", "when": date(2024, 1, 2)}
    assert Memo.rebuilt == before  # not registered: from_dict is never called
    codec.register(Memo)
    assert codec.decode(tree) == note
    assert Memo.rebuilt == before + 1


def test_a_self_serializing_class_is_found_in_annotations_and_fields_and_is_storable() -> None:
    assert value_classes(list[Pinned] | None) == [Pinned, Memo]
    assert unstorable_class(Pinned, dict[str, Memo]) is None
    codec = ValueCodec()
    codec.register(Pinned)
    pinned = Pinned(Memo("a"), [Memo("b"), Memo("c", date(2025, 5, 6))])
    assert round_trip(pinned, codec) == pinned


@pytest.mark.parametrize(
    ("to_dict", "problem"),
    [
        (lambda self: [self.text], "its to_dict() returned a list, not a dict"),
        (lambda self: {"text": socket.socket}, "['text']"),
        (lambda self: 1 / 0, "its to_dict() raised ZeroDivisionError"),
    ],
    ids=["not-a-dict", "unstorable-inside", "raises"],
)
def test_a_to_dict_that_gives_no_storable_dict_is_an_encoding_error(
    to_dict: Any, problem: str
) -> None:
    odd = type("Odd", (Memo,), {"to_dict": to_dict})
    with pytest.raises(EncodingError) as caught:
        ValueCodec().encode(odd("x"), what="state key 'k'")
    assert str(caught.value).startswith("cannot encode state key 'k'")
    assert problem in str(caught.value)


def test_fields_a_registered_from_dict_refuses_are_a_decode_error() -> None:
    codec = ValueCodec()
    codec.register(Memo)
    tree = {"$t": "object", "cls": f"{__name__}:Memo", "v": {"type": "letter", "text": "x"}}
    with pytest.raises(DecodeError, match=f"does not fit the registered class {__name__}:Memo"):
        codec.decode(tree)


# -- decoding is data only: an allow-list, never an import -----------------------------------


@pytest.mark.parametrize("tag", ["enum", "model", "dataclass", "object"])
def test_decoding_never_imports_the_module_a_value_names(trap: Path, tag: str) -> None:
    inner = {"v": 1} if tag != "enum" else "x"
    tree = {"$t": tag, "cls": "steplog_trap:Box" if tag != "enum" else "steplog_trap:Evil"}
    assert ValueCodec().decode({**tree, "v": inner}) == inner
    assert "steplog_trap" not in sys.modules
    assert not trap.exists()


def test_decoding_never_calls_a_class_that_was_not_registered(tmp_path: Path) -> None:
    marker = tmp_path / "popen-ran"
    hostile = {"$t": "enum", "cls": "subprocess:Popen", "v": ["touch", str(marker)]}
    assert ValueCodec().decode(hostile) == ["touch", str(marker)]
    assert ValueCodec().decode({**hostile, "$t": "dataclass", "v": {"args": "x"}}) == {"args": "x"}
    assert ValueCodec().decode({**hostile, "$t": "object", "v": {"args": "x"}}) == {"args": "x"}
    assert not marker.exists()
    # A class this process has imported, even one this codec encodes, is not rebuilt either.
    codec = ValueCodec()
    tree = codec.encode(CUSTOMER)
    assert type(codec.decode(tree)) is dict


def test_register_takes_annotations_and_the_field_types_of_what_it_finds() -> None:
    codec = ValueCodec()
    codec.register(list[Segment] | None)
    expected = {Segment, Point, Customer, Address, Color}
    assert set(codec.registered.values()) == expected
    assert codec.registered[f"{__name__}:Segment"] is Segment
    segment = Segment(Point(0, 1), Point(2, 3), owner=CUSTOMER)
    assert codec.decode(orjson.loads(orjson.dumps(codec.encode(segment)))) == segment


@pytest.mark.parametrize(
    ("annotation", "names"),
    [
        (dict[str, tuple[Point, ...]], {"Point"}),
        (Annotated[Address, "meta"], {"Address"}),
        (Literal[Priority.LOW, "x"], {"Priority"}),
        ((Mode, Perm), {"Mode", "Perm"}),
        (Any, set()),
        (int | str, set()),
    ],
    ids=["generic", "annotated", "literal", "tuple", "any", "plain"],
)
def test_value_classes_look_inside_annotations(annotation: Any, names: set[str]) -> None:
    assert {cls.__name__ for cls in value_classes(annotation)} == names


@pytest.mark.parametrize("not_a_value_class", [int, dict[str, int], "tests.store:Point", 42])
def test_registering_what_holds_no_value_class_is_refused(not_a_value_class: Any) -> None:
    with pytest.raises(DefinitionError, match="holds no enum, pydantic model, dataclass or named"):
        ValueCodec().register(not_a_value_class)


def test_a_class_registered_under_the_same_name_replaces_the_earlier_one() -> None:
    def make() -> type:
        @dataclass
        class Local:
            n: int

        return Local

    first, second = make(), make()
    codec = ValueCodec()
    codec.register(first)
    codec.register(second)
    assert type(codec.decode(codec.encode(first(1)))) is second


# -- malformed trees are DecodeError, and nothing else ---------------------------------------


def nested(depth: int, leaf: Any = 1) -> Any:
    tree = leaf
    for _ in range(depth):
        tree = [tree]
    return tree


def nested_tags(depth: int) -> Any:
    tree: Any = 1
    for _ in range(depth):
        tree = {"$t": "tuple", "v": [tree]}
    return tree


@pytest.mark.parametrize(
    ("tree", "problem"),
    [
        ({"$t": "future", "v": 1}, "unknown value tag 'future'"),
        ({"$t": ["list"], "v": 1}, "unknown value tag"),
        ({"$t": None}, "unknown value tag None"),
        ({"$t": "date"}, "has no 'v'"),
        ({"$t": "int", "v": "twelve"}, "not a valid int"),
        ({"$t": "int", "v": 12}, "'v' must be text"),
        ({"$t": "date", "v": 20240102}, "'v' must be text"),
        ({"$t": "datetime", "v": "2024-01-02T00:00:00+00:00", "tz": "../../etc/passwd"}, "valid"),
        ({"$t": "datetime", "v": "2024-01-02T00:00:00+00:00", "tz": 5}, "'v' must be text"),
        ({"$t": "timedelta", "v": [1, 2]}, "a list of days, seconds and microseconds"),
        ({"$t": "timedelta", "v": [10**10, 0, 0]}, "not a valid timedelta"),
        ({"$t": "decimal", "v": "one"}, "not a valid decimal"),
        ({"$t": "uuid", "v": "not-a-uuid"}, "not a valid uuid"),
        ({"$t": "bytes", "v": "**"}, "not a valid bytes"),
        ({"$t": "int", "v": "9" * 5000}, "not a valid int"),
        ({"$t": "dict", "v": {"a": 1}}, "'v' must be a list"),
        ({"$t": "dict", "v": [[1, 2, 3]]}, "[key, value] pair"),
        ({"$t": "dict", "v": [[[1], 2]]}, "a key that cannot be one"),
        ({"$t": "set", "v": [[1]]}, "an item that cannot be one"),
        ({"$t": "tuple"}, "'v' must be a list"),
        ({"$t": "enum", "v": 1}, "needs 'cls' (text) and 'v'"),
        ({"$t": "model", "cls": 7, "v": {}}, "needs 'cls' (text) and 'v'"),
        ({"$t": "dataclass", "cls": "m:C"}, "needs 'cls' (text) and 'v'"),
        ({"$t": "dataclass", "cls": "m:C", "v": [1]}, "must be an object"),
        ({"$t": "enum", "cls": f"{__name__}:Color", "v": "purple"}, "does not fit"),
        ({"$t": "model", "cls": f"{__name__}:Address", "v": {"street": 1}}, "does not fit"),
        ({"$t": "dataclass", "cls": f"{__name__}:Point", "v": {"x": 1}}, "does not fit"),
        ({"$t": "model", "cls": f"{__name__}:Color", "v": {}}, "is not a model"),
        (nested(5_000), "more than 200 levels deep"),
        (nested_tags(5_000), "more than 200 levels deep"),
        ({"a": [nested(MAX_DEPTH - 1)]}, "more than 200 levels deep"),
    ],
    ids=reprlib.repr,
)
def test_a_malformed_tree_is_a_decode_error_naming_the_problem(tree: Any, problem: str) -> None:
    codec = ValueCodec()
    codec.register(Color, Address, Point)
    with pytest.raises(DecodeError) as caught:
        codec.decode(tree, what="state key 'k'")
    assert str(caught.value).startswith("cannot decode state key 'k': ")
    assert problem in str(caught.value)


def test_the_deepest_tree_encode_writes_decodes() -> None:
    for value in (nested(MAX_DEPTH), {"a": nested(MAX_DEPTH - 1)}, (nested(MAX_DEPTH - 2),)):
        assert round_trip(value) == value


# -- encode refuses what orjson cannot write -------------------------------------------------


def self_containing() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


LONE = "\ud800"
DEEP = "[0][0][0][0]<192 more steps>[0][0][0][0]"


@pytest.mark.parametrize(
    ("make", "where", "problem"),
    [
        # A long path is shown by its first four and last four steps.
        (lambda: nested(MAX_DEPTH + 1), "state key 'k'" + DEEP, "levels deep"),
        (lambda: nested(254), "state key 'k'" + DEEP, "levels deep"),
        (lambda: {"a": nested(MAX_DEPTH)}, "state key 'k'['a'][0][0][0]<192 more steps>"
         "[0][0][0][0]", "levels deep"),
        (lambda: (nested(MAX_DEPTH - 1),), "state key 'k'[0][0][0][0]<191 more steps>"
         "[0][0][0][0]", "levels deep"),
        (self_containing, "state key 'k'[1][1][1][1]<192 more steps>[1][1][1][1]",
         "or contains itself"),
        (lambda: LONE, "state key 'k'", "a lone surrogate '\\ud800' at index 0"),
        (lambda: ["ok", f"caf\u00e9 {LONE}"], "state key 'k'[1]", "at index 5"),
        (lambda: {"ok": 1, f"k{LONE}": 2}, "state key 'k'['k\\ud800']", "the key"),
        (lambda: {(1, LONE): 2}, "state key 'k'<key>[1]", "lone surrogate"),
        (lambda: Address(street=LONE, zip_code="1"), "state key 'k'['street']", "surrogate"),
        (lambda: Point(1, [LONE]), "state key 'k'.y[0]", "surrogate"),  # type: ignore[arg-type]
        (lambda: 10**5000, "state key 'k'", "an int of more than 4300 digits"),
    ],
    ids=[
        "too-deep", "orjson-limit", "deep-in-dict", "deep-in-tuple", "contains-itself",
        "lone-surrogate", "surrogate-in-list", "surrogate-key", "surrogate-in-tagged-key",
        "surrogate-in-model", "surrogate-in-dataclass", "huge-int",
    ],
)  # fmt: skip
def test_encode_refuses_what_orjson_cannot_write(make: Any, where: str, problem: str) -> None:
    with pytest.raises(EncodingError) as caught:
        ValueCodec().encode(make(), what="state key 'k'")
    message = str(caught.value)
    assert message.startswith(f"cannot encode {where}: ")
    assert problem in message
    message.encode("utf-8")  # the message itself is valid text


storable_text = st.text(st.characters(codec=None, exclude_categories=()))  # surrogates included
deep_trees = st.recursive(
    st.none() | st.integers() | storable_text,
    lambda children: (
        st.lists(children, max_size=2)
        | st.dictionaries(storable_text, children, max_size=2)
        | st.dictionaries(st.integers() | storable_text, children, max_size=2).map(
            lambda d: {**d, "$t": 0}
        )
        | st.builds(tuple, st.lists(children, max_size=2))
    ),
    max_leaves=6,
).map(lambda tree: nested(MAX_DEPTH - 8, tree))


@settings(deadline=None, max_examples=200)
@given(deep_trees)
@example(nested(MAX_DEPTH - 8, {0: {0: (-9223372036854775809,), "$t": 0}, "$t": 0}))
def test_whatever_encode_returns_orjson_writes_inside_an_event(value: Any) -> None:
    try:
        tree = ValueCodec().encode(value, what="v")
    except EncodingError:
        return
    # The deepest a value sits in a stored document: run kwargs inside an event, and a write
    # inside a materialized view's tracker (tracker > state > pending > superstep > write).
    orjson.dumps({"kwargs": {"k": tree}})
    orjson.dumps({"tracker": {"state": {"pending": {"s": [{"value": tree}]}}}})
    assert same(round_trip(value), value)


@pytest.mark.parametrize("leaf", [10**30, -(2**63) - 1, float("nan"), float("inf")])
def test_a_tagged_number_at_the_depth_limit_is_refused_or_read_back(leaf: Any) -> None:
    """A big int or a non-finite float is written as a tagged object, one level deeper than the
    number: encode refuses it where decode would find the tree too deep."""
    for depth in (MAX_DEPTH - 1, MAX_DEPTH):
        value = nested(depth, leaf)
        try:
            tree = ValueCodec().encode(value)
        except EncodingError:
            assert depth == MAX_DEPTH
            continue
        assert same(ValueCodec().decode(orjson.loads(orjson.dumps(tree))), value)


def test_valid_text_of_every_plane_is_stored_as_itself() -> None:
    text = "caf\u00e9 \u2603 \U0001f600 \uffff \U0010ffff"
    assert ValueCodec().encode(text) is text
    assert ValueCodec().encode({text: [text]}) == {text: [text]}


# -- the allow-list a workflow builds ---------------------------------------------------------


class Order(BaseModel):
    lines: list[Address]


@dataclass
class Shipment:
    order: Order
    mode: Mode


class Receipt(enum.Enum):
    SENT = "sent"


@dataclass
class Note:
    text: str


class Shipper(Executor):
    @handler
    async def ship(
        self, message: list[Order] | None, ctx: WorkflowContext[Shipment, Receipt]
    ) -> None:
        ctx.set_state("note", Note("kept"))
        ctx.set_state("point", Point(1, 2))
        ctx.set_state("order", (message or [])[0])
        await ctx.yield_output(Receipt.SENT)


@executor
async def counter(message: Annotated[Counter, "meta"], ctx: WorkflowContext) -> None:
    pass


@handler(input=Perm)
async def flags(self: Any, message: Any, ctx: WorkflowContext) -> None:
    pass


class Flags(Executor):
    on = flags


def test_build_registers_what_handlers_accept_send_and_yield_and_their_field_types() -> None:
    store = MemoryStore()
    WorkflowBuilder(start_executor=Shipper("ship"), store=store).build()
    WorkflowBuilder(start_executor=counter, store=store).build()  # unconnected: a graph of its own
    declared = {Order, Address, Shipment, Mode, Receipt, Counter}
    assert set(store.codec.registered.values()) == declared
    WorkflowBuilder(start_executor=Flags("flags"), store=store).build()
    assert Perm in store.codec.registered.values()


async def test_declared_and_registered_classes_read_back_as_themselves_others_as_data() -> None:
    store = MemoryStore()
    order = Order(lines=[Address(street="1 Loop Rd", zip_code="1")])
    builder = WorkflowBuilder(start_executor=Shipper("ship"), store=store, instance_id="i")
    wf = builder.register_types(Note).build()
    result = await wf.run([order])
    assert result.get_outputs() == [Receipt.SENT]
    assert wf.committed_state() == {"note": Note("kept"), "point": {"x": 1, "y": 2}, "order": order}


@pytest.mark.parametrize("not_a_value_class", [int, "tests.store:Note"])
def test_register_types_refuses_what_holds_no_value_class(not_a_value_class: Any) -> None:
    with pytest.raises(DefinitionError, match="holds no enum, pydantic model or dataclass"):
        WorkflowBuilder(start_executor=Shipper("ship")).register_types(not_a_value_class)
