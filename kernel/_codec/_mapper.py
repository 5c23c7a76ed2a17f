"""Events to stored rows and back: pydantic for shape, orjson for bytes.

Two row formats, both in eventsourcing's ``StoredEvent`` columns, and both read:

* **Batch rows** (written since the store schema version 2): one row per appended batch, usually a
  whole superstep. ``originator_id`` is the instance, ``originator_version`` the position of the
  batch's *last* event, ``topic`` the number of events (``"7"``), and ``state`` one compact JSON
  array: ``[format, base_us, offsets, strings, chain, event, event, ...]`` (batch format 2;
  format 1, written before the hash chain, has no ``chain``). The context every event of a
  superstep repeats is carried once: times are whole microseconds since the Unix epoch, as
  ``base_us`` plus a small delta per event, with the UTC offset (``offsets``: seconds, one for the
  batch or a list with one per event); run and superstep ids are indexes into ``strings``. Each
  event is ``[code, delta_us, field, field, ...]``: a short type code (``BATCH_CODES``, append-only:
  a code is never reused or renumbered) and the type's fields in declaration order, without field
  names, trailing defaults left out.
* **Event rows** (format 1, before version 2): one row per event, ``originator_version`` its
  position, ``topic`` its ``"type@schema_version"``, ``state`` its other fields as a JSON object.

**The hash chain** (batch format 2). Each event's hash is ``blake2b(previous hash + canonical
event, 16 bytes)``; the first event of an instance follows ``genesis(instance)``. The canonical
event is the JSON array ``[type, schema version, instance, position, time (µs since the epoch),
UTC offset (µs), field, field, ...]``, its fields in declaration order with trailing defaults left
out, object keys sorted: the logical event, whatever the row's packing, so a later storage
format (or re-encryption) keeps every hash. A row's ``chain`` is base64 of the hash before its
first event followed by each of its events' hashes; decoding checks each event it reads against
its hash (``LogIntegrityError`` naming the position), and the store checks that rows link up.

**Encryption** (``_codec._cipher``). With a keyring, ``state`` is sealed with AES-256-GCM, bound to
the row's instance, last position and count; everything above is inside the seal.

Every event keeps its own position, so nothing above the store sees rows. Decoding is data only:
a row that is not what this mapper writes is a ``DecodeError`` naming ``instance#position``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
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

from kernel._base._errors import DecodeError, EncodingError, LogIntegrityError, SchemaVersionError
from kernel._codec._cipher import Keyring, is_sealed, sealed_without_key
from kernel._log._events import EVENT_TYPES, ErrorInfo, EventBase, complete_event, trusted_event

__all__ = [
    "BATCH_CODES",
    "BATCH_FORMAT",
    "CHAIN_BYTES",
    "KERNEL_UPCASTERS",
    "ChainedRow",
    "EventMapper",
    "RowLink",
    "Upcaster",
    "genesis",
    "row_count",
]

_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_CANONICAL = _STRICT | orjson.OPT_SORT_KEYS

_ENVELOPE = frozenset({"type", "instance_id", "position", "schema_version"})

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

BATCH_FORMAT = 2
"""The version of the batch row's layout (its ``state[0]``): 2 carries the hash chain, 1 (read,
never written) does not; a newer one is refused."""

CHAIN_BYTES = 16
"""The size of an event's hash (BLAKE2b, 128 bits)."""

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
)
"""Type code -> (event type, schema version) in batch rows. Append-only: a new type or a new
schema version of a type gets the next code; codes are never renumbered or reused. A row's fields
are positional, so when a type's schema version changes, its old code keeps its old field list in
``_FROZEN_FIELDS``, and ``KERNEL_UPCASTERS`` brings its events up to the current version; a code
whose version has no frozen field list is refused, never misread. An empty name reserves a code
for a type still to come; nothing is written with it, and a row that uses it is refused."""

_REQUIRED = object()

_FROZEN_FIELDS: dict[tuple[str, int], tuple[tuple[str, Any], ...]] = {
    ("run_started", 1): (
        ("run_id", _REQUIRED),
        ("workflow_name", _REQUIRED),
        ("input", None),
        ("kwargs", {}),
        ("owner", ""),
        ("durability", "superstep"),
        ("continues", None),
        ("checkpoint", None),
    ),
}
"""The stored fields (name, default) of every old schema version still read, in stored order."""


def _run_started_1(payload: dict[str, Any]) -> dict[str, Any]:
    """run_started 1 -> 2: runs before sensitive keys declared none."""
    payload.setdefault("sensitive_keys", [])
    return payload


KERNEL_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("run_started", 1): _run_started_1,
}
"""steplog's own upcasters: ``(type, from_version)`` -> the payload in the next version's shape."""

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
    """How one event type (at one schema version) is laid out in a batch row."""

    cls: type[EventBase]
    code: int
    version: int
    """The schema version its code stores (the type's current one, or an old one to upcast)."""
    names: tuple[str, ...]
    """The stored fields, in order (no envelope, no timestamp)."""
    defaults: tuple[Any, ...]
    """Each field's default (``_REQUIRED`` when it has none), for trimming trailing defaults."""
    interned: tuple[int, ...]
    """Indexes into ``names`` of the fields stored as indexes into the row's strings."""
    type_name: str
    has_error: bool
    """Whether the type has an ``error`` field (an ``ErrorInfo``, stored as an object)."""


@functools.cache
def _layouts() -> tuple[dict[str, _Layout], tuple[_Layout | None, ...]]:
    """The layout of every event type, by type name (current versions, for writing) and by code
    (None: an old version with no frozen field list)."""
    by_name: dict[str, _Layout] = {}
    by_code: list[_Layout | None] = []
    for code, (name, version) in enumerate(BATCH_CODES):
        cls = EVENT_TYPES.get(name)
        if cls is None:  # a reserved code: nothing is written with it, and it is refused on read
            by_code.append(None)
            continue
        if version == cls.SCHEMA_VERSION:
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
        elif (name, version) in _FROZEN_FIELDS:
            names = tuple(n for n, _ in _FROZEN_FIELDS[name, version])
            defaults = [d for _, d in _FROZEN_FIELDS[name, version]]
        else:
            by_code.append(None)
            continue
        interned = tuple(i for i, n in enumerate(names) if n in _INTERNED)
        layout = _Layout(
            cls, code, version, names, tuple(defaults), interned, name, "error" in names
        )
        if version == cls.SCHEMA_VERSION:
            by_name[name] = layout
        by_code.append(layout)
    return by_name, tuple(by_code)


def genesis(instance_id: str) -> bytes:
    """The hash an instance's chain begins from (before its first event)."""
    return hashlib.blake2b(
        instance_id.encode("utf-8", "surrogatepass"),
        digest_size=CHAIN_BYTES,
        person=b"steplog-chain-1",
    ).digest()


def _canonical(
    type_name: str,
    version: int,
    instance_id: str,
    position: int,
    time_us: int,
    offset_us: int,
    fields: Sequence[Any],
) -> bytes:
    """The bytes an event's hash covers (see the module's docstring)."""
    return orjson.dumps(
        [type_name, version, instance_id, position, time_us, offset_us, *fields],
        default=_nested_model,
        option=_CANONICAL,
    )


def _link(previous: bytes, canonical: bytes) -> bytes:
    return hashlib.blake2b(previous + canonical, digest_size=CHAIN_BYTES).digest()


@dataclasses.dataclass(frozen=True)
class ChainedRow(StoredEvent):
    """A batch row with its chain's new head: the hash of its last event, which the store keeps
    as the instance's head."""

    head: bytes = b""


class RowLink(NamedTuple):
    """Where a row sits in its instance's chain: its positions and the hashes before and after
    it (None for a row written before the chain)."""

    first: int
    last: int
    previous: bytes | None
    head: bytes | None


class EventMapper:
    """Maps events to stored records and back.

    ``upcasters`` maps ``(type, from_version)`` to a function that rewrites an old payload into the
    next version's shape; they are chained until the payload reaches the current version (after
    steplog's own, ``KERNEL_UPCASTERS``). With a ``keyring``, rows are sealed when written and
    opened when read. ``on_broken``, when given, is told of each event that does not match its
    hash (a ``LogIntegrityError``) and decoding goes on; without it, decoding raises the error.
    """

    def __init__(
        self,
        upcasters: dict[tuple[str, int], Upcaster] | None = None,
        *,
        keyring: Keyring | None = None,
        on_broken: Callable[[LogIntegrityError], None] | None = None,
    ) -> None:
        self._upcasters = {**KERNEL_UPCASTERS, **(upcasters or {})}
        self.keyring = keyring
        self.on_broken = on_broken
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

    def to_row(self, events: Sequence[EventBase], previous: bytes | None = None) -> ChainedRow:
        """The batch row holding ``events`` (one instance's, at consecutive positions), chained
        to ``previous``: the hash of the event before the first (None: ``genesis``, for a row
        that begins its stream).

        Raises ``EncodingError`` naming the event if a value is not a JSON tree."""
        by_name = _layouts()[0]
        first = events[0]
        instance_id = first.instance_id
        if previous is None:
            previous = genesis(instance_id)
        offset = first.timestamp.utcoffset()
        base_us = (first.timestamp - _EPOCH) // _MICROSECOND
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
                offset_us = here // _MICROSECOND if here else 0
                offsets.append(offset_us)
                if here != offset:
                    offset = None  # the batch's events are in more than one UTC offset
                time_us = (stamp - _EPOCH) // _MICROSECOND
                head = _link(
                    head,
                    _canonical(
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
            state = orjson.dumps(body, default=_nested_model, option=_STRICT)
        except TypeError:
            for event in events:  # name the event that cannot be stored
                self.to_stored(event)
            raise
        last = events[-1].position
        topic = str(len(events))
        if self.keyring is not None:
            state = self.keyring.seal(state, _place(instance_id, last, topic))
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
            links.append(
                RowLink(
                    first,
                    last_position,
                    *(
                        (chain[:CHAIN_BYTES], chain[-CHAIN_BYTES:])
                        if chain is not None
                        else (None, None)
                    ),
                )
            )
        start = max(after - first + 1, 0)
        stop = count if upto is None else min(upto - first + 1, count)
        if start >= stop:
            return []
        strings = body[3]
        stamps = _Stamps(where, body[1], body[2], count)
        base, zoned = stamps.base, stamps.zones is not None
        by_code = _layouts()[1]
        header = 4 if chain is None else 5
        report = on_broken or self.on_broken
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
                    _check_event(
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
            upcast = None
            if layout.version != layout.cls.SCHEMA_VERSION:  # an old schema version
                upcast = functools.partial(
                    self._upcast,
                    _where(instance_id, position, layout),
                    layout.type_name,
                    layout.version,
                )
            event = _build_stored(layout, item, strings, stamp, instance_id, position, upcast)
            if chain is not None:  # (after building: a malformed field is named as such)
                _check_event(layout, item, strings, instance_id, position, stamps, i, chain, report)
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
        if chain is None:
            return RowLink(first, last_position, None, None)
        return RowLink(first, last_position, chain[:CHAIN_BYTES], chain[-CHAIN_BYTES:])

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
            if self.keyring is None:
                raise sealed_without_key(where, state)
            try:
                state = self.keyring.open(state, _place(instance_id, last_position, topic), where)
            except LogIntegrityError as error:
                raise LogIntegrityError(
                    str(error),
                    instance_id=instance_id,
                    position=last_position - count + 1,
                    kind="seal broken",
                ) from None
        try:
            body = orjson.loads(state)
        except (orjson.JSONDecodeError, TypeError) as error:
            raise DecodeError(f"{where} is not valid JSON: {error}") from error
        if type(body) is not list or len(body) < 4 or type(body[0]) is not int:
            raise DecodeError(f"{where} is not a batch row [format, time, offsets, strings, ...]")
        if body[0] not in (1, BATCH_FORMAT):
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
        if type(strings) is not list or not all(type(text) is str for text in strings):
            raise DecodeError(f"{where} has a malformed string table")
        if header == 4:
            return body, None
        text = body[4]
        try:
            if type(text) is not str:
                raise ValueError
            chain = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise DecodeError(f"{where} has a malformed hash chain {text!r:.40}") from None
        if len(chain) != CHAIN_BYTES * (count + 1):
            raise DecodeError(
                f"{where} has {len(chain) // CHAIN_BYTES} hashes in its chain; {count} events "
                f"need {count + 1}"
            )
        return body, chain

    def _upcast(
        self, where: str, type_name: str, version: int, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """``payload`` of ``type_name`` at ``version`` brought up to the type's current version."""
        current = EVENT_TYPES[type_name].SCHEMA_VERSION
        while version < current:
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
        return payload

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
        payload = self._upcast(where, type_name, version, payload)
        version = cls.SCHEMA_VERSION
        payload["instance_id"] = instance_id
        payload["position"] = position
        payload["schema_version"] = version
        return _build(cls, payload, instance_id, position, topic)


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
    upcast: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> EventBase:
    """One event of a batch row, its fields checked as an event row's are. An event of an old
    schema version is read by its frozen field names, then ``upcast`` to the current version
    (which must give exactly the current fields) before the checks."""
    cls = layout.cls
    names = layout.names
    values = item[2:]
    given = len(values)

    if given > len(names):
        raise DecodeError(
            f"{_where(instance_id, position, layout)} has {given} fields; its type has {len(names)}"
        )
    if layout.interned:
        values = _resolved(layout, values, strings, instance_id, position)
    payload = dict(zip(names, values, strict=False))  # trailing defaults are left out
    if given < len(names):
        for i in range(given, len(names)):
            default = layout.defaults[i]
            if default is _REQUIRED:
                raise DecodeError(
                    f"{_where(instance_id, position, layout)} lacks its required field {names[i]!r}"
                )
            payload[names[i]] = _fresh(default)
    if upcast is not None:
        payload = upcast(payload)
        current = _layouts()[0][layout.type_name].names
        if payload.keys() != set(current):
            raise DecodeError(
                f"{_where(instance_id, position, layout)} once upcast has fields "
                f"{sorted(payload)}, not {sorted(current)}"
            )
    payload["instance_id"] = instance_id
    payload["position"] = position
    payload["schema_version"] = cls.SCHEMA_VERSION
    problem = _problem(cls, payload)
    if problem is not None:
        raise DecodeError(
            f"{_where(instance_id, position, layout)} does not fit its schema: {problem}"
        )
    if layout.has_error and payload["error"] is not None:
        payload["error"] = _error_info(_where(instance_id, position, layout), payload["error"])
    payload["timestamp"] = stamp
    payload["type"] = layout.type_name
    return complete_event(cls, payload)  # every field is set and checked above


def _check_event(
    layout: _Layout,
    item: list[Any],
    strings: list[str],
    instance_id: str,
    position: int,
    stamps: _Stamps,
    index: int,
    chain: bytes,
    report: Callable[[LogIntegrityError], None] | None,
) -> None:
    """Check the event at ``index`` of its row against its hash in ``chain``."""
    fields = item[2:]
    if layout.interned:
        fields = _resolved(layout, fields, strings, instance_id, position)
    end = min(len(fields), len(layout.defaults))
    defaults = layout.defaults
    while end and fields[end - 1] == defaults[end - 1]:
        end -= 1
    if end < len(fields) and len(fields) > len(defaults):
        end = len(fields)  # more fields than the type has: hashed as they are (and refused)
    delta = item[1]
    if type(delta) is not int:
        stamps.at(index, delta, position)  # raises, naming the position
    offsets = stamps.zones
    offset_us = stamps.offset_us if offsets is None else offsets[index][0]
    try:
        canonical = _canonical(
            layout.type_name,
            layout.version,
            instance_id,
            position,
            stamps.base_us + delta,
            offset_us,
            fields[:end],
        )
    except TypeError:  # nested deeper than any writer could have written it: not as written
        canonical = None
    at = index * CHAIN_BYTES
    if (
        canonical is not None
        and _link(chain[at : at + CHAIN_BYTES], canonical)
        == chain[at + CHAIN_BYTES : at + 2 * CHAIN_BYTES]
    ):
        return
    marker = layout.type_name in ("superstep_committed", "superstep_aborted")
    problem = LogIntegrityError(
        f"event {instance_id!r}#{position} ({layout.type_name}) does not match its hash: "
        + (
            "a superstep marker was rewritten (an abort turned into a commit, or the "
            "reverse) after it was written"
            if marker
            else "it was edited after it was written"
        ),
        instance_id=instance_id,
        position=position,
        kind="marker rewritten" if marker else "edited",
    )
    if report is None:
        raise problem
    report(problem)


def _resolved(
    layout: _Layout, values: list[Any], strings: list[str], instance_id: str, position: int
) -> list[Any]:
    """``values`` (a fresh copy of a batch row's stored fields) with their interned ids looked up
    in ``strings``, in place."""
    for i in layout.interned:
        if i < len(values):
            ref = values[i]
            if ref is not None:
                if type(ref) is not int or ref < 0 or ref >= len(strings):
                    raise DecodeError(
                        f"{_where(instance_id, position, layout)} refers to string "
                        f"{ref!r:.20}, not in its row"
                    )
                values[i] = strings[ref]
    return values


def _error_info(where: str, error: Any) -> ErrorInfo:
    """A stored ``error`` field as an ``ErrorInfo``, its shape checked."""
    if (
        type(error) is not dict
        or error.keys() != {"type", "message"}
        or not all(type(v) is str for v in error.values())
    ):
        raise DecodeError(
            f"{where}: field 'error' is {error!r:.80}, not {{'type': str, 'message': str}}"
        )
    return trusted_event_info(error)


def _place(instance_id: str, last_position: int, topic: str) -> bytes:
    """What a sealed row is bound to: its instance, last position and count."""
    return b"\x00".join(
        (instance_id.encode("utf-8", "surrogatepass"), str(last_position).encode(), topic.encode())
    )


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
