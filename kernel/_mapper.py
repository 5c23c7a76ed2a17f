"""Events to eventsourcing ``StoredEvent`` records and back: pydantic for shape, orjson for bytes.

A stored record keeps the instance id and the position in its own columns (``originator_id`` and
``originator_version``), the type and schema version in ``topic`` as ``"state_staged@1"``, and the
remaining fields as compact JSON in ``state``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

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
        """The event stored as ``(instance_id, position, topic, state)`` columns."""
        cls = self._current.get(topic)
        if cls is None:  # an unknown type, an old version to upcast, or a newer one to refuse
            return self._decode_other(instance_id, position, topic, state)
        try:
            payload = orjson.loads(state)
        except orjson.JSONDecodeError as error:
            raise DecodeError(
                f"event {instance_id!r}#{position} ({topic}) is not valid JSON: {error}"
            ) from error
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = cls.SCHEMA_VERSION
        return self._build(cls, payload, _Columns(instance_id, position, topic, state))

    def _decode_other(self, instance_id: str, position: int, topic: str, state: bytes) -> EventBase:
        stored = _Columns(instance_id, position, topic, state)
        type_name, _, version_text = topic.partition("@")
        cls = EVENT_TYPES.get(type_name)
        if cls is None:
            raise DecodeError(
                f"event {stored.originator_id!r}#{stored.originator_version} has unknown type "
                f"{type_name!r}; it was written by a newer or a different program"
            )
        try:
            version = int(version_text or 1)
            payload = orjson.loads(stored.state)
        except (ValueError, orjson.JSONDecodeError) as error:
            raise DecodeError(
                f"event {stored.originator_id!r}#{stored.originator_version} ({stored.topic}) "
                f"is not valid JSON: {error}"
            ) from error
        if version > cls.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"event {stored.originator_id!r}#{stored.originator_version} is {type_name} "
                f"schema version {version}, newer than this steplog's {cls.SCHEMA_VERSION}; "
                "upgrade steplog to read this log"
            )
        while version < cls.SCHEMA_VERSION:
            upcast = self._upcasters.get((type_name, version))
            if upcast is None:
                raise DecodeError(f"no upcaster for {type_name} from schema version {version}")
            payload = upcast(payload)
            version += 1
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = version
        return self._build(cls, payload, stored)

    @staticmethod
    def _build(cls: type[EventBase], payload: dict[str, Any], stored: _Columns) -> EventBase:
        fast = _construct(cls, payload)
        if fast is not None:
            return fast
        try:
            return cls.model_validate(payload)
        except ValidationError as error:
            raise DecodeError(
                f"event {stored.originator_id!r}#{stored.originator_version} ({stored.topic}) "
                f"does not fit its schema: {error}"
            ) from error


def _nested_model(value: Any) -> Any:
    """orjson's fallback: nested pydantic models (``ErrorInfo``) and nothing else."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__qualname__}")


class _Columns:
    """The stored columns, named as in eventsourcing's ``StoredEvent`` for error messages."""

    __slots__ = ("originator_id", "originator_version", "state", "topic")

    def __init__(self, instance_id: str, position: int, topic: str, state: bytes) -> None:
        self.originator_id = instance_id
        self.originator_version = position
        self.topic = topic
        self.state = state


def _construct(cls: type[EventBase], payload: dict[str, Any]) -> EventBase | None:
    """Build an event from a payload the mapper wrote; None when its shape is off.

    The timestamp and nested errors are parsed here; every other field is taken as written.
    Anything unexpected returns None, and the caller validates in full (and reports the problem).
    """
    stamp = payload.get("timestamp")
    if type(stamp) is not str or type(payload["position"]) is not int:
        return None
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    payload["timestamp"] = when
    error = payload.get("error")
    if error is not None:
        if type(error) is not dict or error.keys() != {"type", "message"}:
            return None
        payload["error"] = trusted_event_info(error)
    return trusted_event(cls, payload)


def trusted_event_info(error: dict[str, Any]) -> ErrorInfo:
    """An ``ErrorInfo`` from its stored form."""
    return ErrorInfo(type=str(error["type"]), message=str(error["message"]))
