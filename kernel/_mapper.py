"""Events to eventsourcing ``StoredEvent`` records and back: pydantic for shape, orjson for bytes.

A stored record keeps the instance id and the position in its own columns (``originator_id`` and
``originator_version``), the type and schema version in ``topic`` as ``"state_staged@1"``, and the
remaining fields as compact JSON in ``state``.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from datetime import datetime
from types import UnionType
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

import annotated_types
import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel, ValidationError

from kernel._errors import DecodeError, EncodingError, SchemaVersionError
from kernel._events import EVENT_TYPES, ErrorInfo, EventBase, trusted_event

__all__ = ["EventMapper", "Upcaster"]

_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

_ENVELOPE = frozenset({"type", "instance_id", "position", "schema_version"})

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


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
