"""Events to stored rows and back, built once and whole: ``RowMapper(upcasters, keyring=...)``.

The mapper puts the codec's parts together: the row format (``_codec._rows``), each event's hash
(``_codec._hashing``), old schema versions (``_codec._upcast``), the checks of decoded fields
(``_codec._fieldcheck``) and the seal of a row (``_codec._cipher``). Every event keeps its own
position, so nothing above the store sees rows. Decoding is data only: a row that is not what
this mapper writes is a ``DecodeError`` naming ``instance#position``.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent

from kernel._base._errors import DecodeError, EncodingError, LogIntegrityError, SchemaVersionError
from kernel._codec import _hashing
from kernel._codec._cipher import Keyring, is_sealed, sealed_without_key
from kernel._codec._fieldcheck import build, error_info, problem
from kernel._codec._hashing import (
    CHAIN_BYTES,
    ChainedRow,
    RowLink,
    check_event,
    genesis,
    parse_chain,
)
from kernel._codec._rows import (
    BATCH_CODES,
    BATCH_FORMAT,
    ENVELOPE,
    EPOCH,
    MICROSECOND,
    STRICT,
    Layout,
    Stamps,
    event_where,
    fresh,
    layouts,
    load_object,
    nested_model,
    parse_batch,
    place,
    resolved,
    row_count,
)
from kernel._codec._upcast import KERNEL_UPCASTERS, REQUIRED, Upcaster, upcast
from kernel._log._events import EVENT_TYPES, EventBase, complete_event

__all__ = ["RowMapper"]


class RowMapper:
    """Maps events to stored rows and back; built once, whole, and never changed after.

    ``upcasters`` maps ``(type, from_version)`` to a function that rewrites an old payload into the
    next version's shape; they are chained until the payload reaches the current version (after
    steplog's own, ``KERNEL_UPCASTERS``). With a ``keyring``, rows are sealed when written and
    opened when read. ``on_broken``, when given, is told of each event that does not match its
    hash (a ``LogIntegrityError``) and decoding goes on; without it, decoding raises the error.
    A store whose keys or trust options change builds a new mapper.
    """

    __slots__ = ("_current", "_keyring", "_on_broken", "_upcasters")

    def __init__(
        self,
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
        *,
        keyring: Keyring | None = None,
        on_broken: Callable[[LogIntegrityError], None] | None = None,
    ) -> None:
        self._upcasters: Mapping[tuple[str, int], Upcaster] = {
            **KERNEL_UPCASTERS,
            **(upcasters or {}),
        }
        self._keyring = keyring
        self._on_broken = on_broken
        # Topics of the current schema versions: decoded without parsing the topic.
        self._current = {f"{name}@{cls.SCHEMA_VERSION}": cls for name, cls in EVENT_TYPES.items()}

    @property
    def upcasters(self) -> Mapping[tuple[str, int], Upcaster]:
        """Every upcaster this mapper applies (steplog's own, then those it was given)."""
        return self._upcasters

    @property
    def keyring(self) -> Keyring | None:
        """The keys rows are sealed and opened with (None: rows are plain JSON)."""
        return self._keyring

    @property
    def on_broken(self) -> Callable[[LogIntegrityError], None] | None:
        """Told of each event that does not match its hash (None: decoding raises instead)."""
        return self._on_broken

    def to_stored(self, event: EventBase) -> StoredEvent:
        """The stored record of ``event``. Raises ``EncodingError`` if a value is not a JSON tree.

        Fields are written straight from the event with orjson (the event was validated when it
        was made); a datetime, dataclass or set inside a value is refused rather than silently
        turned into a string or list.
        """
        type_name = event.type
        payload = {k: v for k, v in event.__dict__.items() if k not in ENVELOPE}
        payload["timestamp"] = event.timestamp.isoformat()
        try:
            state = orjson.dumps(payload, default=nested_model, option=STRICT)
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

    def to_row(self, events: Sequence[EventBase], previous: bytes | None = None) -> ChainedRow:
        """The batch row holding ``events`` (one instance's, at consecutive positions), chained
        to ``previous``: the hash of the event before the first (None: ``genesis``, for a row
        that begins its stream).

        Raises ``EncodingError`` naming the event if a value is not a JSON tree."""
        by_name = layouts()[0]
        first = events[0]
        instance_id = first.instance_id
        if previous is None:
            previous = genesis(instance_id)
        offset = first.timestamp.utcoffset()
        base_us = (first.timestamp - EPOCH) // MICROSECOND
        strings: list[str] = []
        interned: dict[str, int] = {}
        offsets: list[int] = []
        hashes = [previous]
        head = previous
        body: list[Any] = [BATCH_FORMAT, base_us, 0, strings, ""]
        try:
            for event in events:
                layout = by_name[event.type]
                fields = event.__dict__
                values = [fields[name] for name in layout.names]
                end = len(values)
                defaults = layout.defaults
                while end and values[end - 1] == defaults[end - 1]:
                    end -= 1
                stamp = event.timestamp
                here = stamp.utcoffset()
                offset_us = here // MICROSECOND if here else 0
                offsets.append(offset_us)
                if here != offset:
                    offset = None  # the batch's events are in more than one UTC offset
                time_us = (stamp - EPOCH) // MICROSECOND
                head = _hashing.link(
                    head,
                    _hashing.canonical(
                        layout.type_name,
                        layout.version,
                        instance_id,
                        event.position,
                        time_us,
                        offset_us,
                        values[:end],
                    ),
                )
                hashes.append(head)
                for i in layout.interned:
                    text = values[i]
                    if text is not None:
                        ref = interned.get(text)
                        if ref is None:
                            ref = interned[text] = len(strings)
                            strings.append(text)
                        values[i] = ref
                body.append([layout.code, time_us - base_us, *values[:end]])
            body[2] = offsets[0] if offset is not None else offsets
            body[4] = base64.b64encode(b"".join(hashes)).decode("ascii")
            state = orjson.dumps(body, default=nested_model, option=STRICT)
        except TypeError:
            for event in events:  # name the event that cannot be stored
                self.to_stored(event)
            raise
        last = events[-1].position
        topic = str(len(events))
        if self._keyring is not None:
            state = self._keyring.seal(state, place(instance_id, last, topic))
        return ChainedRow(
            originator_id=instance_id,
            originator_version=last,
            topic=topic,
            state=state,
            head=head,
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
        links: list[RowLink] | None = None,
        on_broken: Callable[[LogIntegrityError], None] | None = None,
        check_all: bool = False,
    ) -> list[EventBase]:
        """The events of one row (either format) with ``after < position <= upto``, of ``types``
        only if given (the others are never built). Each event built is checked against its
        hash (each check stands alone: an event's hash and its predecessor's are both in the
        row); with ``check_all``, so are the events of the window that are not built.

        Raises ``DecodeError`` naming the position of what is wrong, ``SchemaVersionError`` for
        a row written by a newer steplog, ``LogIntegrityError`` for an event that does not match
        its hash or a sealed row that does not open, unless ``on_broken`` (or the mapper's own)
        takes it. ``links``, when given, gets the row's ``RowLink``, for the caller to check
        that consecutive rows link up."""
        count = row_count(instance_id, last_position, topic)
        if not topic.isdigit():  # an event row (format 1)
            if links is not None:
                links.append(RowLink(last_position, last_position, None, None))
            if last_position <= after or (upto is not None and last_position > upto):
                return []
            if types is not None and topic.partition("@")[0] not in types:
                return []
            return [self.decode(instance_id, last_position, topic, state)]
        first = last_position - count + 1
        where = f"row {instance_id!r}#{first}..{last_position}"
        body, chain = self._load_batch(where, instance_id, last_position, topic, state, count)
        if links is not None:
            links.append(RowLink.of(first, last_position, chain))
        start = max(after - first + 1, 0)
        stop = count if upto is None else min(upto - first + 1, count)
        if start >= stop:
            return []
        strings = body[3]
        stamps = Stamps(where, body[1], body[2], count)
        base, zoned = stamps.base, stamps.zones is not None
        by_code = layouts()[1]
        header = 4 if chain is None else 5
        report = on_broken or self._on_broken
        events: list[EventBase] = []
        for i in range(start, stop):
            item = body[header + i]
            position = first + i
            if type(item) is not list or len(item) < 2 or type(item[0]) is not int:
                raise DecodeError(f"event {instance_id!r}#{position} is not [code, time, ...]")
            code = item[0]
            layout = by_code[code] if 0 <= code < len(by_code) else None
            if layout is None:
                known = 0 <= code < len(by_code) and BATCH_CODES[code][0] != ""
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
            delta = item[1]
            if types is not None and layout.type_name not in types:
                if chain is not None and check_all:
                    check_event(
                        layout, item, strings, instance_id, position, stamps, i, chain, report
                    )
                continue
            if zoned or type(delta) is not int:  # (the common case is inlined: one offset)
                stamp = stamps.at(i, delta, position)
            else:
                try:
                    stamp = base + timedelta(0, 0, delta)
                except OverflowError:
                    stamp = stamps.at(i, delta, position)  # raises, naming the position
            to_current = None
            if layout.version != layout.cls.SCHEMA_VERSION:  # an old schema version
                to_current = functools.partial(
                    upcast,
                    self._upcasters,
                    event_where(instance_id, position, layout),
                    layout.type_name,
                    layout.version,
                )
            event = _build_stored(layout, item, strings, stamp, instance_id, position, to_current)
            if chain is not None:  # (after building: a malformed field is named as such)
                check_event(layout, item, strings, instance_id, position, stamps, i, chain, report)
            events.append(event)
        return events

    def row_link(self, instance_id: str, last_position: int, topic: str, state: bytes) -> RowLink:
        """The ``RowLink`` of a row, its events neither checked nor built."""
        count = row_count(instance_id, last_position, topic)
        first = last_position - count + 1
        if not topic.isdigit():
            return RowLink(first, last_position, None, None)
        where = f"row {instance_id!r}#{first}..{last_position}"
        _, chain = self._load_batch(where, instance_id, last_position, topic, state, count)
        return RowLink.of(first, last_position, chain)

    def event_hash(
        self, instance_id: str, last_position: int, topic: str, state: bytes, position: int
    ) -> bytes | None:
        """The stored hash of the event at ``position`` of a row (None: a row without hashes)."""
        count = row_count(instance_id, last_position, topic)
        first = last_position - count + 1
        if not topic.isdigit() or not first <= position <= last_position:
            return None
        where = f"row {instance_id!r}#{first}..{last_position}"
        _, chain = self._load_batch(where, instance_id, last_position, topic, state, count)
        if chain is None:
            return None
        at = (position - first + 1) * CHAIN_BYTES
        return chain[at : at + CHAIN_BYTES]

    def _load_batch(
        self, where: str, instance_id: str, last_position: int, topic: str, state: bytes, count: int
    ) -> tuple[list[Any], bytes | None]:
        """The JSON array of a batch row (opened first if sealed), its header checked, and its
        chain (None for a row of batch format 1)."""
        if is_sealed(state):
            if self._keyring is None:
                raise sealed_without_key(where, state)
            try:
                state = self._keyring.open(state, place(instance_id, last_position, topic), where)
            except LogIntegrityError as error:
                raise LogIntegrityError(
                    str(error),
                    instance_id=instance_id,
                    position=last_position - count + 1,
                    kind="seal broken",
                ) from None
        body = parse_batch(where, state, count)
        if body[0] != BATCH_FORMAT:  # batch format 1: before the chain
            return body, None
        return body, parse_chain(where, body[4], count)

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
        payload = load_object(instance_id, position, topic, state)
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = cls.SCHEMA_VERSION
        return build(cls, payload, f"event {instance_id!r}#{position} ({topic})")

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
        payload = load_object(instance_id, position, topic, state)
        if version > cls.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where} is {type_name} schema version {version}, newer than this steplog's "
                f"{cls.SCHEMA_VERSION}; upgrade steplog to read this log"
            )
        payload = upcast(self._upcasters, where, type_name, version, payload)
        version = cls.SCHEMA_VERSION
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = version
        return build(cls, payload, f"event {instance_id!r}#{position} ({topic})")


def _build_stored(
    layout: Layout,
    item: list[Any],
    strings: list[str],
    stamp: datetime,
    instance_id: str,
    position: int,
    to_current: Upcaster | None = None,
) -> EventBase:
    """One event of a batch row, its fields checked as an event row's are. An event of an old
    schema version is read by its frozen field names, then brought ``to_current`` version
    (which must give exactly the current fields) before the checks."""
    cls = layout.cls
    names = layout.names
    values = item[2:]
    given = len(values)

    if given > len(names):
        raise DecodeError(
            f"{event_where(instance_id, position, layout)} has {given} fields; "
            f"its type has {len(names)}"
        )
    if layout.interned:
        values = resolved(layout, values, strings, instance_id, position)
    payload = dict(zip(names, values, strict=False))  # trailing defaults are left out
    if given < len(names):
        for i in range(given, len(names)):
            default = layout.defaults[i]
            if default is REQUIRED:
                raise DecodeError(
                    f"{event_where(instance_id, position, layout)} lacks its required field "
                    f"{names[i]!r}"
                )
            payload[names[i]] = fresh(default)
    if to_current is not None:
        payload = to_current(payload)
        current = layouts()[0][layout.type_name].names
        if payload.keys() != set(current):
            raise DecodeError(
                f"{event_where(instance_id, position, layout)} once upcast has fields "
                f"{sorted(payload)}, not {sorted(current)}"
            )
    payload["instance_id"] = instance_id
    payload["position"] = position
    payload["schema_version"] = cls.SCHEMA_VERSION
    wrong = problem(cls, payload)
    if wrong is not None:
        raise DecodeError(
            f"{event_where(instance_id, position, layout)} does not fit its schema: {wrong}"
        )
    if layout.has_error and payload["error"] is not None:
        payload["error"] = error_info(event_where(instance_id, position, layout), payload["error"])
    payload["timestamp"] = stamp
    payload["type"] = layout.type_name
    return complete_event(cls, payload)  # every field is set and checked above
