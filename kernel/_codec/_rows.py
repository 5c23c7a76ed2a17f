"""The row format: how events are laid out in eventsourcing's ``StoredEvent`` columns.

Two row formats, both read:

* **Batch rows** (written since the store schema version 2): one row per appended batch, usually a
  whole superstep. ``originator_id`` is the instance, ``originator_version`` the position of the
  batch's *last* event, ``topic`` the number of events (``"7"``), and ``state`` one compact JSON
  array: ``[format, base_us, offsets, strings, chain, event, event, ...]`` (batch format 3;
  format 2 stored a full hash per event in its ``chain``, and format 1, written before the hash
  chain, has no ``chain``; both are read). The context every event of a
  superstep repeats is carried once: times are whole microseconds since the Unix epoch, as
  ``base_us`` plus a small delta per event, with the UTC offset (``offsets``: seconds, one for the
  batch or a list with one per event); run and superstep ids are indexes into ``strings``. Each
  event is ``[code, delta_us, field, field, ...]``: a short type code (``BATCH_CODES``, append-only:
  a code is never reused or renumbered) and the type's fields in declaration order, without field
  names, trailing defaults left out. ``chain`` is the row's hashes (``_codec._hashing``: in format
  3 the hash before the row and its last event's, in full, and a short tag per event).
* **Event rows** (format 1, before version 2): one row per event, ``originator_version`` its
  position, ``topic`` its ``"type@schema_version"``, ``state`` its other fields as a JSON object.

With a keyring, ``state`` is sealed (``_codec._cipher``), bound to the row's ``place``.

This module describes the format and parses its parts, naming ``instance#position`` in every
``DecodeError``; ``_codec._mapper`` puts them together.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel

from kernel._base._errors import DecodeError, SchemaVersionError
from kernel._codec._upcast import FROZEN_FIELDS, REQUIRED
from kernel._log._events import EVENT_TYPES, EventBase

__all__ = [
    "BATCH_CODES",
    "BATCH_FORMAT",
    "ENVELOPE",
    "EPOCH",
    "MICROSECOND",
    "STRICT",
    "Layout",
    "Stamps",
    "event_where",
    "fresh",
    "layouts",
    "load_object",
    "nested_model",
    "parse_batch",
    "place",
    "row_count",
]

STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""orjson's options for a row: a datetime or dataclass inside a value is refused, not converted."""

ENVELOPE = frozenset({"type", "instance_id", "position", "schema_version"})
"""The fields a row's columns carry (not stored among the event's fields)."""

BATCH_FORMAT = 3
"""The version of the batch row's layout (its ``state[0]``): 3 carries the hash before the row and
its last hash in full, with a short tag per event; 2 (read, never written) a full hash per event;
1 (read, never written) no hashes; a newer one is refused."""

BATCH_CODES: tuple[tuple[str, int], ...] = (
    ("run_started", 1),
    ("run_completed", 1),
    ("run_failed", 1),
    ("run_cancelled", 1),
    ("run_abandoned", 1),
    ("run_awaiting_input", 1),
    ("response_received", 1),
    ("superstep_started", 1),
    ("executor_invoked", 1),
    ("executor_completed", 1),
    ("executor_failed", 1),
    ("state_staged", 1),
    ("message_staged", 1),
    ("output_yielded", 1),
    ("info_requested", 1),
    ("superstep_committed", 1),
    ("superstep_aborted", 1),
    ("instance_forked", 1),
    ("run_started", 2),
    ("custom_event_added", 1),  # 19
    ("", 0),  # 20: reserved (custom events)
    ("subworkflow_ran", 1),
    ("subworkflow_started", 1),
    ("step_recorded", 1),  # 23
)
"""Type code -> (event type, schema version) in batch rows. Append-only: a new type or a new
schema version of a type gets the next code; codes are never renumbered or reused. A row's fields
are positional, so when a type's schema version changes, its old code keeps its old field list in
``_codec._upcast.FROZEN_FIELDS``, and the upcasters bring its events up to the current version; a
code whose version has no frozen field list is refused, never misread. An empty name reserves a
code for a type still to come; nothing is written with it, and a row that uses it is refused."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
MICROSECOND = timedelta(microseconds=1)
_COUNT_DIGITS = 7
"""The most digits a batch row's count has (an append holds at most 2**20 events)."""
_INTERNED = ("run_id", "superstep_id")
"""Fields whose values (ids repeated by every event of a batch) are stored once per row."""


def row_count(instance_id: str, last_position: int, topic: str) -> int:
    """How many events the row ``(instance_id, last_position, topic)`` holds: a batch row's topic
    is its count; an event row (``type@version``) holds one. Raises ``DecodeError`` for a count
    that cannot be, or a topic that is neither."""
    if type(last_position) is not int:
        raise DecodeError(
            f"row {instance_id!r} has a last position {last_position!r:.40} that is not an integer"
        )
    if type(topic) is str and topic.isascii() and topic.isdigit():
        if len(topic) > _COUNT_DIGITS:
            raise DecodeError(f"row {instance_id!r}#{last_position} has a count {topic:.20}...")
        count = int(topic)
        if 1 <= count <= last_position:
            return count
        raise DecodeError(
            f"row {instance_id!r}#{last_position} claims {count} events, which cannot end at "
            f"position {last_position}"
        )
    if type(topic) is str and "@" in topic:
        return 1
    raise DecodeError(f"row {instance_id!r}#{last_position} has a malformed topic {topic!r:.40}")


def place(instance_id: str, last_position: int, topic: str) -> bytes:
    """What a sealed row is bound to: its instance, last position and count."""
    return b"\x00".join(
        (instance_id.encode("utf-8", "surrogatepass"), str(last_position).encode(), topic.encode())
    )


class Layout(NamedTuple):
    """How one event type (at one schema version) is laid out in a batch row."""

    cls: type[EventBase]
    code: int
    version: int
    """The schema version its code stores (the type's current one, or an old one to upcast)."""
    names: tuple[str, ...]
    """The stored fields, in order (no envelope, no timestamp)."""
    defaults: tuple[Any, ...]
    """Each field's default (``REQUIRED`` when it has none), for trimming trailing defaults."""
    interned: tuple[int, ...]
    """Indexes into ``names`` of the fields stored as indexes into the row's strings."""
    type_name: str
    has_error: bool
    """Whether the type has an ``error`` field (an ``ErrorInfo``, stored as an object)."""
    stored: Callable[[dict[str, Any]], tuple[Any, ...]]
    """The stored fields' values, in order, from an event's ``__dict__``."""


@functools.cache
def layouts() -> tuple[dict[str, Layout], tuple[Layout | None, ...]]:
    """The layout of every event type, by type name (current versions, for writing) and by code
    (None: a reserved code, or an old version with no frozen field list)."""
    by_name: dict[str, Layout] = {}
    by_code: list[Layout | None] = []
    for code, (name, version) in enumerate(BATCH_CODES):
        cls = EVENT_TYPES.get(name)
        if cls is None:  # a reserved code: nothing is written with it, and it is refused on read
            by_code.append(None)
            continue
        if version == cls.SCHEMA_VERSION:
            names = tuple(n for n in cls.model_fields if n not in ENVELOPE and n != "timestamp")
            defaults = []
            for field_name in names:
                info = cls.model_fields[field_name]
                if info.default_factory is not None:
                    defaults.append(info.default_factory())  # type: ignore[call-arg]
                elif info.is_required():
                    defaults.append(REQUIRED)
                else:
                    defaults.append(info.default)
        elif (name, version) in FROZEN_FIELDS:
            names = tuple(n for n, _ in FROZEN_FIELDS[name, version])
            defaults = [d for _, d in FROZEN_FIELDS[name, version]]
        else:
            by_code.append(None)
            continue
        interned = tuple(i for i, n in enumerate(names) if n in _INTERNED)
        layout = Layout(
            cls,
            code,
            version,
            names,
            tuple(defaults),
            interned,
            name,
            "error" in names,
            _getter(names),
        )
        if version == cls.SCHEMA_VERSION:
            by_name[name] = layout
        by_code.append(layout)
    return by_name, tuple(by_code)


def _getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """What reads ``names`` from a dict, as a tuple (``itemgetter`` gives one only for two or
    more)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    return lambda fields: tuple(fields[name] for name in names)


def parse_batch(where: str, state: bytes, count: int) -> list[Any]:
    """The JSON array of a batch row (``state``, opened if it was sealed) of ``count`` events,
    its header checked: ``[format, base_us, offsets, strings, (chain,) event, ...]``. Its
    ``chain`` element, when it has one (``body[0] > 1``), is left as it is stored.

    Raises ``DecodeError`` naming ``where``, or ``SchemaVersionError`` for a newer format."""
    try:
        body = orjson.loads(state)
    except (orjson.JSONDecodeError, TypeError) as error:
        raise DecodeError(f"{where} is not valid JSON: {error}") from error
    if type(body) is not list or len(body) < 4 or type(body[0]) is not int:
        raise DecodeError(f"{where} is not a batch row [format, time, offsets, strings, ...]")
    if body[0] not in (1, 2, BATCH_FORMAT):
        if body[0] > BATCH_FORMAT:
            raise SchemaVersionError(
                f"{where} is in batch format {body[0]}, newer than this steplog's "
                f"{BATCH_FORMAT}; upgrade steplog to read this log"
            )
        raise DecodeError(f"{where} has an unknown batch format {body[0]}")
    header = 4 if body[0] == 1 else 5
    if len(body) != header + count:
        raise DecodeError(f"{where} holds {len(body) - header} events, its topic says {count}")
    strings = body[3]
    if type(strings) is not list or not all([type(text) is str for text in strings]):
        raise DecodeError(f"{where} has a malformed string table")
    return body


def load_object(instance_id: str, position: int, topic: str, state: bytes) -> dict[str, Any]:
    """The JSON object in an event row's ``state`` column; ``DecodeError`` naming the position
    when it is not one."""
    try:
        payload = orjson.loads(state)
    except (orjson.JSONDecodeError, TypeError) as error:
        raise DecodeError(
            f"event {instance_id!r}#{position} ({topic}) is not valid JSON: {error}"
        ) from error
    if type(payload) is not dict:
        raise DecodeError(
            f"event {instance_id!r}#{position} ({topic}) is not a JSON object but a "
            f"{type(payload).__name__}"
        )
    return payload


class Stamps:
    """The timestamps of a batch row's events: a base time plus each event's delta, in the row's
    UTC offset (or each event's own). Times are rebuilt as wall time in their own offset, never
    through UTC, so that every time that could be written reads back (9999-12-31 22:00-05:00 is
    past the last UTC instant a ``datetime`` holds). Raises ``DecodeError`` naming the row (or
    the position) for a time or offset that is malformed or out of range."""

    def __init__(self, where: str, base_us: Any, offsets: Any, count: int) -> None:
        self.where = where
        if type(base_us) is not int:
            raise DecodeError(f"{where} has a base time {base_us!r:.40} that is not an integer")
        self.base_us = base_us
        if type(offsets) is int:
            self.zones: list[tuple[int, timezone]] | None = None
            self.offset_us = offsets
            zone = self._zone(offsets)
        elif type(offsets) is list and len(offsets) == count:
            self.zones = [(offset, self._zone(offset)) for offset in offsets]
            offsets, zone = self.zones[0]
            self.offset_us = offsets
        else:
            raise DecodeError(f"{where} has malformed UTC offsets {offsets!r:.60}")
        self.base = self._wall(base_us + offsets, zone, "its base time")

    def _zone(self, offset: Any) -> timezone:
        if type(offset) is not int:
            raise DecodeError(
                f"{self.where} has a UTC offset {offset!r:.40} that is not an integer"
            )
        if offset == 0:
            return UTC
        try:
            return timezone(timedelta(microseconds=offset))
        except (OverflowError, ValueError) as error:
            raise DecodeError(f"{self.where} has a UTC offset out of range: {error}") from error

    def _wall(self, local_us: int, zone: timezone, what: str) -> datetime:
        """The time ``local_us`` microseconds of wall time after 1970-01-01, in ``zone``."""
        try:
            return (_EPOCH_NAIVE + timedelta(microseconds=local_us)).replace(tzinfo=zone)
        except (OverflowError, ValueError) as error:
            raise DecodeError(f"{what} in {self.where} is out of range: {error}") from error

    def at(self, index: int, delta: Any, position: int) -> datetime:
        """The time of the row's event at ``index`` (its ``position``), ``delta`` after the base."""
        if type(delta) is not int:
            raise DecodeError(
                f"event at position {position} of {self.where} has a time that is "
                f"not an integer: {delta!r:.40}"
            )
        what = f"the time of the event at position {position}"
        if self.zones is not None:
            offset, zone = self.zones[index]
            return self._wall(self.base_us + delta + offset, zone, what)
        try:
            return self.base + timedelta(microseconds=delta)
        except (OverflowError, ValueError) as error:
            raise DecodeError(f"{what} in {self.where} is out of range: {error}") from error


def event_where(instance_id: str, position: int, layout: Layout) -> str:
    """How a decoding error names an event (formatted only when something is wrong)."""
    return f"event {instance_id!r}#{position} ({layout.type_name})"


def fresh(default: Any) -> Any:
    """A default as a field takes it: empty lists and dicts are new objects, never shared."""
    if type(default) is list:
        return []
    if type(default) is dict:
        return {}
    return default


def nested_model(value: Any) -> Any:
    """orjson's fallback: nested pydantic models (``ErrorInfo``) and nothing else."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__qualname__}")
