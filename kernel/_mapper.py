"""Events to stored rows and back: pydantic for shape, orjson for bytes.

Two row formats, both in eventsourcing's ``StoredEvent`` columns, and both read:

* **Batch rows** (written since the store schema version 2): one row per appended batch, usually a
  whole superstep. ``originator_id`` is the instance, ``originator_version`` the position of the
  batch's *last* event, ``topic`` the number of events (``"7"``), and ``state`` one compact JSON
  array: ``[format, base_us, offsets, strings, event, event, ...]``. The context every event of a
  superstep repeats is carried once: times are whole microseconds since the Unix epoch, as
  ``base_us`` plus a small delta per event, with the UTC offset (``offsets``: seconds, one for the
  batch or a list with one per event); run and superstep ids are indexes into ``strings``. Each
  event is ``[code, delta_us, field, field, ...]``: a short type code (``BATCH_CODES``, append-only:
  a code is never reused or renumbered) and the type's fields in declaration order, without field
  names, trailing defaults left out.
* **Event rows** (format 1, before version 2): one row per event, ``originator_version`` its
  position, ``topic`` its ``"type@schema_version"``, ``state`` its other fields as a JSON object.

Every event keeps its own position, so nothing above the store sees rows. Decoding is data only:
a row that is not what this mapper writes is a ``DecodeError`` naming ``instance#position``.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta, timezone
from types import UnionType
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

import annotated_types
import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel, ValidationError

from kernel._errors import DecodeError, EncodingError, SchemaVersionError
from kernel._events import EVENT_TYPES, ErrorInfo, EventBase, complete_event, trusted_event

__all__ = ["BATCH_CODES", "BATCH_FORMAT", "EventMapper", "Upcaster", "row_count"]

_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

_ENVELOPE = frozenset({"type", "instance_id", "position", "schema_version"})

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

BATCH_FORMAT = 1
"""The version of the batch row's layout (its ``state[0]``); a newer one is refused."""

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
)
"""Type code -> (event type, schema version) in batch rows. Append-only: a new type or a new
schema version of a type gets the next code; codes are never renumbered or reused. A row's fields
are positional, so when a type's schema version changes, its old code must keep its old field
list: add it here beside the code, with an upcaster (``EventMapper(upcasters=...)``) from the old
version; until then a code whose version is not the type's current one is refused, never misread."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_COUNT_DIGITS = 7
"""The most digits a batch row's count has (an append holds at most 2**20 events)."""
_INTERNED = ("run_id", "superstep_id")
"""Fields whose values (ids repeated by every event of a batch) are stored once per row."""


def row_count(instance_id: str, last_position: int, topic: str) -> int:
    """How many events the row ``(instance_id, last_position, topic)`` holds: a batch row's topic
    is its count; an event row (``type@version``) holds one."""
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


class _Layout(NamedTuple):
    """How one event type is laid out in a batch row."""

    cls: type[EventBase]
    code: int
    names: tuple[str, ...]
    """The stored fields, in order (no envelope, no timestamp)."""
    defaults: tuple[Any, ...]
    """Each field's default (``_REQUIRED`` when it has none), for trimming trailing defaults."""
    interned: tuple[int, ...]
    """Indexes into ``names`` of the fields stored as indexes into the row's strings."""
    type_name: str
    has_error: bool
    """Whether the type has an ``error`` field (an ``ErrorInfo``, stored as an object)."""


_REQUIRED = object()


@functools.cache
def _layouts() -> tuple[dict[str, _Layout], tuple[_Layout | None, ...]]:
    """The layout of every current event type, by type name and by code (None: an old version)."""
    by_name: dict[str, _Layout] = {}
    by_code: list[_Layout | None] = []
    for code, (name, version) in enumerate(BATCH_CODES):
        cls = EVENT_TYPES[name]
        if version != cls.SCHEMA_VERSION:
            by_code.append(None)
            continue
        names = tuple(n for n in cls.model_fields if n not in _ENVELOPE and n != "timestamp")
        defaults = []
        for field_name in names:
            info = cls.model_fields[field_name]
            if info.default_factory is not None:
                defaults.append(info.default_factory())  # type: ignore[call-arg]
            elif info.is_required():
                defaults.append(_REQUIRED)
            else:
                defaults.append(info.default)
        interned = tuple(i for i, n in enumerate(names) if n in _INTERNED)
        layout = _Layout(cls, code, names, tuple(defaults), interned, name, "error" in names)
        by_name[name] = layout
        by_code.append(layout)
    return by_name, tuple(by_code)


class EventMapper:
    """Maps events to stored records and back.

    ``upcasters`` maps ``(type, from_version)`` to a function that rewrites an old payload into the
    next version's shape; they are chained until the payload reaches the current version.
    """

    def __init__(self, upcasters: dict[tuple[str, int], Upcaster] | None = None) -> None:
        self._upcasters = dict(upcasters or {})
        # Topics of the current schema versions: decoded without parsing the topic.
        self._current = {f"{name}@{cls.SCHEMA_VERSION}": cls for name, cls in EVENT_TYPES.items()}

    def to_stored(self, event: EventBase) -> StoredEvent:
        """The stored record of ``event``. Raises ``EncodingError`` if a value is not a JSON tree.

        Fields are written straight from the event with orjson (the event was validated when it
        was made); a datetime, dataclass or set inside a value is refused rather than silently
        turned into a string or list.
        """
        type_name = event.type
        payload = {k: v for k, v in event.__dict__.items() if k not in _ENVELOPE}
        payload["timestamp"] = event.timestamp.isoformat()
        try:
            state = orjson.dumps(payload, default=_nested_model, option=_STRICT)
        except TypeError as error:
            raise EncodingError(
                f"cannot store {type_name} event {event.instance_id!r}#{event.position}: {error}; "
                "values in events must be JSON trees (encode them with ValueCodec first)"
            ) from error
        return StoredEvent(
            originator_id=event.instance_id,
            originator_version=event.position,
            topic=f"{type_name}@{event.schema_version}",
            state=state,
        )

    def to_row(self, events: Sequence[EventBase]) -> StoredEvent:
        """The batch row holding ``events`` (one instance's, at consecutive positions).

        Raises ``EncodingError`` naming the event if a value is not a JSON tree."""
        by_name = _layouts()[0]
        first = events[0]
        offset = first.timestamp.utcoffset()
        base_us = (first.timestamp - _EPOCH) // _MICROSECOND
        strings: list[str] = []
        interned: dict[str, int] = {}
        offsets: list[int] = []
        body: list[Any] = [BATCH_FORMAT, base_us, 0, strings]
        for event in events:
            layout = by_name[event.type]
            fields = event.__dict__
            values = [fields[name] for name in layout.names]
            for i in layout.interned:
                text = values[i]
                if text is not None:
                    ref = interned.get(text)
                    if ref is None:
                        ref = interned[text] = len(strings)
                        strings.append(text)
                    values[i] = ref
            end = len(values)
            defaults = layout.defaults
            while end and values[end - 1] == defaults[end - 1]:
                end -= 1
            stamp = event.timestamp
            here = stamp.utcoffset()
            offsets.append(here // _MICROSECOND if here else 0)
            if here != offset:
                offset = None  # the batch's events are in more than one UTC offset
            body.append([layout.code, (stamp - _EPOCH) // _MICROSECOND - base_us, *values[:end]])
        body[2] = offsets[0] if offset is not None else offsets
        try:
            state = orjson.dumps(body, default=_nested_model, option=_STRICT)
        except TypeError:
            for event in events:  # name the event that cannot be stored
                self.to_stored(event)
            raise
        return StoredEvent(
            originator_id=first.instance_id,
            originator_version=events[-1].position,
            topic=str(len(events)),
            state=state,
        )

    def decode_row(
        self,
        instance_id: str,
        last_position: int,
        topic: str,
        state: bytes,
        *,
        after: int = 0,
        upto: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[EventBase]:
        """The events of one row (either format) with ``after < position <= upto``, of ``types``
        only if given (the others are never built). Raises ``DecodeError`` naming the position
        of what is wrong, ``SchemaVersionError`` for a row written by a newer steplog."""
        count = row_count(instance_id, last_position, topic)
        if not topic.isdigit():  # an event row (format 1)
            if last_position <= after or (upto is not None and last_position > upto):
                return []
            if types is not None and topic.partition("@")[0] not in types:
                return []
            return [self.decode(instance_id, last_position, topic, state)]
        first = last_position - count + 1
        where = f"row {instance_id!r}#{first}..{last_position}"
        body = _load_batch(where, state, count)
        start = max(after - first + 1, 0)
        stop = count if upto is None else min(upto - first + 1, count)
        if start >= stop:
            return []
        strings = body[3]
        stamps = _Stamps(where, body[1], body[2], count)
        base, zoned = stamps.base, stamps.zones is not None
        by_code = _layouts()[1]
        events: list[EventBase] = []
        for i in range(start, stop):
            item = body[4 + i]
            position = first + i
            if type(item) is not list or len(item) < 2 or type(item[0]) is not int:
                raise DecodeError(f"event {instance_id!r}#{position} is not [code, time, ...]")
            code = item[0]
            layout = by_code[code] if 0 <= code < len(by_code) else None
            if layout is None:
                known = 0 <= code < len(by_code)
                raise DecodeError(
                    f"event {instance_id!r}#{position} has "
                    + (
                        f"type code {code}, an old schema version of {BATCH_CODES[code][0]} "
                        "with no field list to read it by"
                        if known
                        else f"unknown type code {code}; it was written by a newer or a "
                        "different program"
                    )
                )
            if types is not None and layout.type_name not in types:
                continue
            delta = item[1]
            if zoned or type(delta) is not int:  # (the common case is inlined: one offset)
                stamp = stamps.at(i, delta, position)
            else:
                try:
                    stamp = base + timedelta(0, 0, delta)
                except OverflowError:
                    stamp = stamps.at(i, delta, position)  # raises, naming the position
            events.append(_build_stored(layout, item, strings, stamp, instance_id, position))
        return events

    def to_event(self, stored: StoredEvent) -> EventBase:
        """The event a stored record holds. Raises ``DecodeError`` or ``SchemaVersionError``."""
        return self.decode(
            str(stored.originator_id), stored.originator_version, stored.topic, stored.state
        )

    def decode(self, instance_id: str, position: int, topic: str, state: bytes) -> EventBase:
        """The event stored as ``(instance_id, position, topic, state)`` columns.

        Raises ``DecodeError`` naming ``instance_id#position`` for a row that is not what the
        mapper writes: bad JSON, a payload that is not an object, a field of the wrong type or
        value, a bad timestamp, an unknown topic; ``SchemaVersionError`` for a newer schema.
        """
        cls = self._current.get(topic)
        if cls is None:  # an unknown type, an old version to upcast, or a newer one to refuse
            return self._decode_other(instance_id, position, topic, state)
        payload = _load(instance_id, position, topic, state)
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = cls.SCHEMA_VERSION
        return _build(cls, payload, instance_id, position, topic)

    def _decode_other(self, instance_id: str, position: int, topic: str, state: bytes) -> EventBase:
        where = f"event {instance_id!r}#{position}"
        type_name, _, version_text = str(topic).partition("@")
        cls = EVENT_TYPES.get(type_name)
        if cls is None:
            raise DecodeError(
                f"{where} has unknown type {type_name!r}; it was written by a newer or a "
                "different program"
            )
        version_text = version_text or "1"
        if not (version_text.isascii() and version_text.isdigit()):
            raise DecodeError(f"{where} has a malformed topic {topic!r} (expected type@version)")
        version = int(version_text)
        payload = _load(instance_id, position, topic, state)
        if version > cls.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where} is {type_name} schema version {version}, newer than this steplog's "
                f"{cls.SCHEMA_VERSION}; upgrade steplog to read this log"
            )
        while version < cls.SCHEMA_VERSION:
            upcast = self._upcasters.get((type_name, version))
            if upcast is None:
                raise DecodeError(
                    f"{where}: no upcaster for {type_name} from schema version {version}"
                )
            try:
                payload = upcast(payload)
            except Exception as error:  # an old payload its upcaster cannot read
                raise DecodeError(
                    f"{where}: the upcaster of {type_name} from schema version {version} failed: "
                    f"{type(error).__name__}: {error}"
                ) from error
            if type(payload) is not dict:
                raise DecodeError(
                    f"{where}: the upcaster of {type_name} from schema version {version} returned "
                    f"a {type(payload).__name__}, not a dict"
                )
            version += 1
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = version
        return _build(cls, payload, instance_id, position, topic)


def _load_batch(where: str, state: bytes, count: int) -> list[Any]:
    """The JSON array of a batch row, its header checked."""
    try:
        body = orjson.loads(state)
    except (orjson.JSONDecodeError, TypeError) as error:
        raise DecodeError(f"{where} is not valid JSON: {error}") from error
    if type(body) is not list or len(body) < 4 or type(body[0]) is not int:
        raise DecodeError(f"{where} is not a batch row [format, time, offsets, strings, ...]")
    if body[0] != BATCH_FORMAT:
        if body[0] > BATCH_FORMAT:
            raise SchemaVersionError(
                f"{where} is in batch format {body[0]}, newer than this steplog's "
                f"{BATCH_FORMAT}; upgrade steplog to read this log"
            )
        raise DecodeError(f"{where} has an unknown batch format {body[0]}")
    if len(body) != 4 + count:
        raise DecodeError(f"{where} holds {len(body) - 4} events, its topic says {count}")
    strings = body[3]
    if type(strings) is not list or not all(type(text) is str for text in strings):
        raise DecodeError(f"{where} has a malformed string table")
    return body


class _Stamps:
    """The timestamps of a batch row's events: a base time plus each event's delta, in the row's
    UTC offset (or each event's own). Times are rebuilt as wall time in their own offset, never
    through UTC, so that every time that could be written reads back (9999-12-31 22:00-05:00 is
    past the last UTC instant a ``datetime`` holds)."""

    def __init__(self, where: str, base_us: Any, offsets: Any, count: int) -> None:
        self.where = where
        if type(base_us) is not int:
            raise DecodeError(f"{where} has a base time {base_us!r:.40} that is not an integer")
        self.base_us = base_us
        if type(offsets) is int:
            self.zones: list[tuple[int, timezone]] | None = None
            zone = self._zone(offsets)
        elif type(offsets) is list and len(offsets) == count:
            self.zones = [(offset, self._zone(offset)) for offset in offsets]
            offsets, zone = self.zones[0]
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


def _build_stored(
    layout: _Layout,
    item: list[Any],
    strings: list[str],
    stamp: datetime,
    instance_id: str,
    position: int,
) -> EventBase:
    """One event of a batch row, its fields checked as an event row's are."""
    cls = layout.cls
    names = layout.names
    values = item[2:]
    given = len(values)

    if given > len(names):
        raise DecodeError(
            f"{_where(instance_id, position, layout)} has {given} fields; its type has {len(names)}"
        )
    payload = dict(zip(names, values, strict=False))  # trailing defaults are left out
    for i in layout.interned:
        if i < given:
            ref = values[i]
            if ref is not None:
                if type(ref) is not int or ref < 0 or ref >= len(strings):
                    raise DecodeError(
                        f"{_where(instance_id, position, layout)} refers to string "
                        f"{ref!r:.20}, not in its row"
                    )
                payload[names[i]] = strings[ref]
    if given < len(names):
        for i in range(given, len(names)):
            default = layout.defaults[i]
            if default is _REQUIRED:
                raise DecodeError(
                    f"{_where(instance_id, position, layout)} lacks its required field {names[i]!r}"
                )
            payload[names[i]] = _fresh(default)
    payload["instance_id"] = instance_id
    payload["position"] = position
    payload["schema_version"] = cls.SCHEMA_VERSION
    problem = _problem(cls, payload)
    if problem is not None:
        raise DecodeError(
            f"{_where(instance_id, position, layout)} does not fit its schema: {problem}"
        )
    if layout.has_error:
        error = payload["error"]
        if error is not None:
            if (
                type(error) is not dict
                or error.keys() != {"type", "message"}
                or not all(type(v) is str for v in error.values())
            ):
                raise DecodeError(
                    f"{_where(instance_id, position, layout)}: field 'error' is {error!r:.80}, not "
                    "{'type': str, 'message': str}"
                )
            payload["error"] = trusted_event_info(error)
    payload["timestamp"] = stamp
    payload["type"] = layout.type_name
    return complete_event(cls, payload)  # every field is set and checked above


def _where(instance_id: str, position: int, layout: _Layout) -> str:
    """How a decoding error names an event (formatted only when something is wrong)."""
    return f"event {instance_id!r}#{position} ({layout.type_name})"


def _fresh(default: Any) -> Any:
    """A default as a field takes it: empty lists and dicts are new objects, never shared."""
    if type(default) is list:
        return []
    if type(default) is dict:
        return {}
    return default


def _load(instance_id: str, position: int, topic: str, state: bytes) -> dict[str, Any]:
    """The JSON object in a row's ``state`` column."""
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


def _build(
    cls: type[EventBase], payload: dict[str, Any], instance_id: str, position: int, topic: str
) -> EventBase:
    built = _construct(cls, payload)
    if type(built) is cls:  # (not isinstance: pydantic's metaclass makes that slow, per event)
        return built
    where = f"event {instance_id!r}#{position} ({topic})"
    if built is not None:
        raise DecodeError(f"{where} does not fit its schema: {built}")
    try:  # fields missing or unknown: pydantic names them
        return cls.model_validate(payload, strict=True)
    except ValidationError as error:
        raise DecodeError(f"{where} does not fit its schema: {error}") from error


def _nested_model(value: Any) -> Any:
    """orjson's fallback: nested pydantic models (``ErrorInfo``) and nothing else."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__qualname__}")


class _Field(NamedTuple):
    """What a stored field must be: one of ``types``, and one of ``values`` or ``>= minimum``
    when those are set; ``items``, the type of every item of a list."""

    name: str
    types: frozenset[type]
    values: frozenset[Any] | None = None
    minimum: int | None = None
    items: type | None = None


_NONE = type(None)


def _field(name: str, annotation: Any, metadata: list[Any]) -> _Field | None:
    """The check for one field, None when any JSON value fits it (``Json`` fields)."""
    if annotation is Any:
        return None
    args = get_args(annotation)
    origin = get_origin(annotation)
    minimum = None
    for constraint in metadata:
        if isinstance(constraint, annotated_types.Ge) and isinstance(constraint.ge, int):
            minimum = constraint.ge
    if origin is Literal:
        return _Field(name, frozenset(type(a) for a in args), values=frozenset(args))
    if origin in (Union, UnionType) and len(args) == 2 and _NONE in args:
        inner = _field(name, next(a for a in args if a is not _NONE), metadata)
        if inner is None:
            return None
        values = None if inner.values is None else inner.values | {None}
        return inner._replace(types=inner.types | {_NONE}, values=values)
    if origin is list and args and args[0] in (str, int):
        return _Field(name, frozenset({list}), items=args[0])
    if origin is list and args and get_origin(args[0]) is dict:
        return _Field(name, frozenset({list}), items=dict)
    if origin is dict and args[:1] == (str,):
        return _Field(name, frozenset({dict}))
    if annotation is ErrorInfo:
        return _Field(name, frozenset({dict}))
    if annotation in (str, int, bool, float):
        return _Field(name, frozenset({annotation}), minimum=minimum)
    raise TypeError(f"the mapper cannot check field {name!r} of type {annotation!r}")


@functools.cache
def _checks(cls: type[EventBase]) -> tuple[_Field, ...]:
    """The checks of ``cls``'s stored fields (all but ``timestamp``, parsed apart)."""
    checks = []
    for name, info in cls.model_fields.items():
        if name == "timestamp":
            continue
        check = _field(name, info.annotation, info.metadata)
        if check is not None:
            checks.append(check)
    return tuple(checks)


@functools.cache
def _fast_checks(
    cls: type[EventBase],
) -> tuple[
    Callable[[dict[str, Any]], Any],
    frozenset[tuple[type, ...]],
    tuple[tuple[str, frozenset[Any]], ...],
    tuple[tuple[str, int], ...],
    tuple[tuple[str, type], ...],
]:
    """``_checks(cls)`` arranged for ``_problem``'s pass over every decoded event: a getter of the
    checked fields, every allowed combination of their types, then allowed values, lower bounds
    and list item types. Every event type has at least two checked fields, so the getter always
    returns a tuple."""
    checks = [c for c in _checks(cls) if c.name != "type"]  # the topic says the type
    return (
        operator.itemgetter(*(c.name for c in checks)),
        frozenset(itertools.product(*(c.types for c in checks))),
        tuple((c.name, c.values) for c in checks if c.values is not None),
        tuple((c.name, c.minimum) for c in checks if c.minimum is not None),
        tuple((c.name, c.items) for c in checks if c.items is not None),
    )


@functools.cache
def _type_of(cls: type[EventBase]) -> str:
    """The ``type`` every event of ``cls`` carries."""
    name: str = cls.model_fields["type"].default
    return name


def _problem(cls: type[EventBase], payload: dict[str, Any]) -> str | None:
    """What is wrong with the fields of ``payload`` (the first problem), or None.

    Runs for every event read, so the common case (every field present and right) costs one
    lookup of the fields' types among the allowed combinations, and a few comparisons; anything
    else is looked at again, field by field, to say what is wrong (or that a field is just
    missing, which its default fills).
    """
    if "type" in payload:  # the mapper never stores it (the topic says it): a tampered row
        return _describe(cls, payload)
    fields, combinations, values, minimums, items = _fast_checks(cls)
    try:
        if tuple(map(type, fields(payload))) not in combinations:
            return _describe(cls, payload)
    except KeyError:  # a field is missing: its default may fill it
        return _describe(cls, payload)
    get = payload.get
    for name, allowed in values:  # the types are right, so the values are hashable
        if get(name) not in allowed:
            return _describe(cls, payload)
    for name, minimum in minimums:
        number = get(name)
        if number is not None and number < minimum:
            return _describe(cls, payload)
    for name, item in items:
        if any(type(one) is not item for one in get(name) or ()):
            return _describe(cls, payload)
    return None


def _describe(cls: type[EventBase], payload: dict[str, Any]) -> str | None:
    """The first problem with the fields of ``payload``, in words."""
    for name, types, values, minimum, items in _checks(cls):
        if name not in payload:
            continue  # a default fills it; a required one missing is reported by the caller
        value = payload[name]
        if type(value) not in types:
            return f"field {name!r} is a {type(value).__name__}: {value!r:.80}"
        if values is not None and value not in values:
            return f"field {name!r} is {value!r:.80}, not one of {sorted(map(repr, values))}"
        if minimum is not None and value < minimum:
            return f"field {name!r} is {value!r}, less than {minimum}"
        if items is not None and any(type(item) is not items for item in value):
            return f"field {name!r} holds an item that is not a {items.__name__}"
    return None


def _construct(cls: type[EventBase], payload: dict[str, Any]) -> EventBase | str | None:
    """Build an event from a stored payload: the event, or what is wrong with a field (a
    string), or None when fields are missing or unknown (the caller validates, to name them).

    Every field is checked against its declared type (exactly: JSON has no ``"5"`` for 5), the
    timestamp parsed and the nested errors rebuilt; then the event is built without pydantic's
    validation, which would check the same things more slowly.
    """
    if "timestamp" not in payload:
        return None
    stamp = payload["timestamp"]
    if type(stamp) is not str:
        return f"timestamp is {stamp!r:.80}, not an ISO 8601 string"
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return f"timestamp {stamp!r:.80} is not an ISO 8601 date and time"
    if when.tzinfo is None:
        return f"timestamp {stamp!r:.80} has no time zone"
    problem = _problem(cls, payload)
    if problem is not None:
        return problem
    payload["timestamp"] = when
    payload["type"] = _type_of(cls)  # every field present: the event is built without merging
    error = payload.get("error")
    if error is not None:
        if (
            type(error) is not dict
            or error.keys() != {"type", "message"}
            or not all(type(v) is str for v in error.values())
        ):
            return f"field 'error' is {error!r:.80}, not {{'type': str, 'message': str}}"
        payload["error"] = trusted_event_info(error)
    return trusted_event(cls, payload)


def trusted_event_info(error: dict[str, Any]) -> ErrorInfo:
    """An ``ErrorInfo`` from its stored form."""
    return ErrorInfo(type=str(error["type"]), message=str(error["message"]))
