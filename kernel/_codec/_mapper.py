"""Events to stored rows and back, built once and whole: ``RowMapper(upcasters, keyring=...)``.

The mapper puts the codec's parts together: the row format (``_codec._rows``), each event's hash
(``_codec._hashing``), old schema versions (``_codec._upcast``), the checks of decoded fields
(``_codec._fieldcheck``) and the seal of a row (``_codec._cipher``). Every event keeps its own
position, so nothing above the store sees rows. Decoding is data only: a row that is not what
this mapper writes is a ``DecodeError`` naming ``instance#position``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from hashlib import blake2b
from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent

from kernel._base._errors import DecodeError, EncodingError, LogIntegrityError, SchemaVersionError
from kernel._codec import _hashing
from kernel._codec._cipher import Keyring, is_sealed, sealed_without_key
from kernel._codec._fieldcheck import build, error_info, problem
from kernel._codec._hashing import (
    CANONICAL,
    CHAIN_BYTES,
    TAG_BYTES,
    ChainedRow,
    RowLink,
    broken,
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
        stamp = first.timestamp
        zone = stamp.tzinfo
        here = stamp.utcoffset()
        offset_us = here // MICROSECOND if here else 0
        uniform = True  # every event in the first event's UTC offset
        since = stamp - EPOCH
        base_us = (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds
        strings: list[str] = []
        interned: dict[str, int] = {}
        offsets: list[int] = []
        tags: list[bytes] = []
        head = previous
        body: list[Any] = [BATCH_FORMAT, base_us, 0, strings, ""]
        link, canonical = _hashing.link, _hashing.canonical
        try:
            for event in events:
                layout = by_name[event.type]
                values = list(layout.stored(event.__dict__))
                end = len(values)
                defaults = layout.defaults
                while end and values[end - 1] == defaults[end - 1]:
                    end -= 1
                if end < len(values):
                    del values[end:]
                stamp = event.timestamp
                if stamp.tzinfo is not zone or type(zone) is not timezone:  # (a fixed offset)
                    zone = stamp.tzinfo
                    here = stamp.utcoffset()
                    event_offset = here // MICROSECOND if here else 0
                    if event_offset != offset_us:
                        uniform = False
                else:
                    event_offset = offsets[-1] if offsets else offset_us
                offsets.append(event_offset)
                since = stamp - EPOCH
                time_us = (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds
                head = link(
                    head,
                    canonical(
                        layout.type_name,
                        layout.version,
                        instance_id,
                        event.position,
                        time_us,
                        event_offset,
                        values,
                    ),
                )
                tags.append(head[:TAG_BYTES])
                for i in layout.interned:
                    if i < end:
                        text = values[i]
                        if text is not None:
                            ref = interned.get(text)
                            if ref is None:
                                ref = interned[text] = len(strings)
                                strings.append(text)
                            values[i] = ref
                body.append([layout.code, time_us - base_us, *values])
            body[2] = offset_us if uniform else offsets
            tags[-1] = head  # the last event's hash is kept whole
            body[4] = base64.b64encode(previous + b"".join(tags)).decode("ascii")
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
        only if given (the others are never built), checked against the row's hashes.

        In a row of batch format 3, building any event checks every event of the row: each
        hash is recomputed from the one before it, and the last compared in full with the
        row's (``_codec._hashing``). In a row of batch format 2, each event built is checked
        alone against its own hash; with ``check_all``, so are the events of the window that
        are not built. With ``check_all``, a row of format 3 is checked even when no event of
        it is built.

        Raises ``DecodeError`` naming the position of what is wrong, ``SchemaVersionError`` for
        a row written by a newer steplog, ``LogIntegrityError`` for an event that does not match
        its hash (the first of its row, in format 3) or a sealed row that does not open, unless
        ``on_broken`` (or the mapper's own) takes it. ``links``, when given, gets the row's
        ``RowLink``, for the caller to check that consecutive rows link up."""
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
        return self._decode_events(
            instance_id,
            first,
            where,
            body,
            chain,
            start,
            stop,
            types,
            check_all,
            on_broken or self._on_broken,
        )

    def _decode_events(
        self,
        instance_id: str,
        first: int,
        where: str,
        body: list[Any],
        chain: bytes | None,
        start: int,
        stop: int,
        types: Collection[str] | None,
        check_all: bool,
        report: Callable[[LogIntegrityError], None] | None,
        hashes: list[bytes | None] | None = None,
    ) -> list[EventBase]:
        """The events at indexes ``start..stop - 1`` of a batch row (``body``, its header
        checked, its ``chain`` parsed), of ``types`` if given, checked against the chain as
        ``decode_row`` says. ``hashes``, when given, gets each recomputed hash of a row of
        format 3 (None once one cannot be computed)."""
        batch_format = body[0]
        header = 4 if batch_format == 1 else 5
        count = len(body) - header
        whole = batch_format != 2 and chain is not None  # format 3: the row is checked whole
        low, high = (0, count) if whole else (start, stop)
        by_code = layouts()[1]
        known_codes = len(by_code)
        hashing = chain is not None
        hash_all = whole or (hashing and check_all)  # every event of low..high is hashed
        if types is not None and not check_all:  # nothing to read in the row: nothing checked
            for i in range(start, stop):
                item = body[header + i]
                if type(item) is not list or not item or type(item[0]) is not int:
                    break  # (malformed: named below)
                code = item[0]
                layout = by_code[code] if 0 <= code < known_codes else None
                if layout is None or layout.type_name in types:
                    break
            else:
                return []
        strings = body[3]
        known = len(strings)
        dumps = orjson.dumps
        stamps = Stamps(where, body[1], body[2], count)
        base, base_us, zones, offset_us = (
            stamps.base,
            stamps.base_us,
            stamps.zones,
            stamps.offset_us,
        )
        # Format 3: the hash the next event follows; ``tag_at`` its tag's offset in the chain.
        head: bytes | None = chain[:CHAIN_BYTES] if whole and chain is not None else None
        tag_at = CHAIN_BYTES
        last_tag = CHAIN_BYTES + TAG_BYTES * (count - 1)
        intact = True
        events: list[EventBase] = []
        for i in range(low, high):
            item = body[header + i]
            position = first + i
            if type(item) is not list or len(item) < 2 or type(item[0]) is not int:
                raise DecodeError(f"event {instance_id!r}#{position} is not [code, time, ...]")
            code = item[0]
            layout = by_code[code] if 0 <= code < known_codes else None
            if layout is None:
                raise _unknown_code(instance_id, position, code, known_codes)
            wanted = start <= i < stop and (types is None or layout.type_name in types)
            if not (wanted or hash_all):
                continue
            values = item[2:]
            given = len(values)
            for k in layout.interned:  # the row's ids, stored once in ``strings``
                if k < given:
                    ref = values[k]
                    if type(ref) is int and 0 <= ref < known:
                        values[k] = strings[ref]
                    elif ref is not None:
                        raise DecodeError(
                            f"{event_where(instance_id, position, layout)} refers to string "
                            f"{ref!r:.20}, not in its row"
                        )
            delta = item[1]
            stored: bytes | None = None
            if hashing:
                if type(delta) is not int:
                    stamps.at(i, delta, position)  # raises, naming the position
                defaults = layout.defaults
                end = given
                if end <= len(defaults):  # (trailing defaults left out, as the writer does)
                    while end and values[end - 1] == defaults[end - 1]:
                        end -= 1
                try:
                    stored = dumps(
                        [
                            layout.type_name,
                            layout.version,
                            instance_id,
                            position,
                            base_us + delta,
                            offset_us if zones is None else zones[i][0],
                            *(values if end == given else values[:end]),
                        ],
                        option=CANONICAL,
                    )
                except TypeError:  # nested deeper than any writer could have written it
                    stored = None
            if wanted:
                if zones is not None or type(delta) is not int:
                    stamp = stamps.at(i, delta, position)
                else:  # (the common case, inlined: one offset)
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
                # (built before its hash is compared: a malformed field is named as such)
                events.append(
                    _build_stored(layout, values, stamp, instance_id, position, to_current)
                )
            if chain is None:
                continue
            if whole:
                if head is not None:  # (``_hashing.link``, inlined)
                    head = (
                        None if stored is None else blake2b(head + stored, digest_size=16).digest()
                    )
                if hashes is not None:
                    hashes.append(head)
                if not intact:
                    continue  # (every later hash of the row differs too: one problem a row)
                if head is None:
                    intact = False
                elif tag_at < last_tag:
                    intact = head[:TAG_BYTES] == chain[tag_at : tag_at + TAG_BYTES]
                    tag_at += TAG_BYTES
                else:
                    intact = head == chain[last_tag:]
                if intact:
                    continue
            else:
                at = i * CHAIN_BYTES
                if (
                    stored is not None
                    and _hashing.link(chain[at : at + CHAIN_BYTES], stored)
                    == chain[at + CHAIN_BYTES : at + 2 * CHAIN_BYTES]
                ):
                    continue
            problem = broken(layout, instance_id, position)
            if report is None:
                raise problem
            report(problem)
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
        """The chain's hash of the event at ``position`` of a row (None: a row without hashes).

        A row of batch format 2 holds it. In a row of format 3 it is recomputed from the hash
        before the row and the row's events up to ``position``, so it is the hash of the events
        the row holds now: it matches a hash taken before only if none of them was changed
        (``b""``, which matches none, when one of them cannot be read or hashed)."""
        count = row_count(instance_id, last_position, topic)
        first = last_position - count + 1
        if not topic.isdigit() or not first <= position <= last_position:
            return None
        where = f"row {instance_id!r}#{first}..{last_position}"
        body, chain = self._load_batch(where, instance_id, last_position, topic, state, count)
        if chain is None:
            return None
        index = position - first
        if body[0] == 2:
            at = (index + 1) * CHAIN_BYTES
            return chain[at : at + CHAIN_BYTES]
        hashes: list[bytes | None] = []
        with contextlib.suppress(DecodeError):  # an event that cannot be read: none from it on
            self._decode_events(
                instance_id, first, where, body, chain, 0, 0, (), True, _ignore, hashes
            )
        return (hashes[index] if index < len(hashes) else None) or b""

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
        if body[0] == 1:  # batch format 1: before the chain
            return body, None
        return body, parse_chain(where, body[4], count, body[0])

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


def _ignore(problem: LogIntegrityError) -> None:
    """A report that is not needed (``event_hash`` recomputes hashes, it does not judge)."""


def _unknown_code(instance_id: str, position: int, code: int, known: int) -> DecodeError:
    """The error for an event whose type code this steplog cannot read."""
    if 0 <= code < known and BATCH_CODES[code][0] != "":
        return DecodeError(
            f"event {instance_id!r}#{position} has type code {code}, an old schema version of "
            f"{BATCH_CODES[code][0]} with no field list to read it by"
        )
    return DecodeError(
        f"event {instance_id!r}#{position} has unknown type code {code}; it was written by a "
        "newer or a different program"
    )


def _build_stored(
    layout: Layout,
    values: list[Any],
    stamp: datetime,
    instance_id: str,
    position: int,
    to_current: Upcaster | None = None,
) -> EventBase:
    """One event of a batch row from its stored fields ``values`` (interned ids looked up),
    checked as an event row's are. An event of an old schema version is read by its frozen
    field names, then brought ``to_current`` version (which must give exactly the current
    fields) before the checks."""
    cls = layout.cls
    names = layout.names
    given = len(values)

    if given > len(names):
        raise DecodeError(
            f"{event_where(instance_id, position, layout)} has {given} fields; "
            f"its type has {len(names)}"
        )
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
