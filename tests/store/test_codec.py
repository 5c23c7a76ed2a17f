"""ValueCodec: every supported value comes back exactly, alone and through the event store."""

from __future__ import annotations

import enum
import math
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from kernel import EncodingError, EventStore, StateStaged, ValueCodec
from kernel._mapper import EventMapper

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


def round_trip(value: Any, codec: ValueCodec | None = None) -> Any:
    """Encode, write as JSON bytes, read back and decode."""
    codec = codec or ValueCodec()
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
    codec, mapper = ValueCodec(), EventMapper()
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


def test_a_class_defined_in_a_function_round_trips_within_one_codec() -> None:
    @dataclass
    class Local:
        at: date

    codec = ValueCodec()
    assert round_trip(Local(date(2024, 1, 2)), codec) == Local(date(2024, 1, 2))
    assert ValueCodec().decode(codec.encode(Local(date(2024, 1, 2)))) == {"at": date(2024, 1, 2)}


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


def test_an_unknown_tag_is_an_encoding_error() -> None:
    with pytest.raises(EncodingError, match="'future'"):
        ValueCodec().decode({"$t": "future", "v": 1})


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
    assert same(ValueCodec().decode(back.value), EVERYTHING)  # type: ignore[attr-defined]
