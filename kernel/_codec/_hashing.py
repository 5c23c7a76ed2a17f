"""The hash chain, per event: what each event's hash covers, and the check of an event against it.

Each event's hash is ``blake2b(previous hash + canonical event, 16 bytes)``; the first event of an
instance follows ``genesis(instance)``. The canonical event is the JSON array ``[type, schema
version, instance, position, time (µs since the epoch), UTC offset (µs), field, field, ...]``, its
fields in declaration order with trailing defaults left out, object keys sorted: the logical
event, whatever the row's packing (``_codec._rows``), so a later storage format (or re-encryption)
keeps every hash. A batch row's ``chain`` is base64 of the hash before its first event followed
by each of its events' hashes; decoding checks each event it reads against its hash
(``LogIntegrityError`` naming the position). How rows must link up is ``_codec._chain``'s.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson
from eventsourcing.persistence import StoredEvent

from kernel._base._errors import DecodeError, LogIntegrityError
from kernel._codec._rows import STRICT, Layout, Stamps, nested_model, resolved

__all__ = [
    "CHAIN_BYTES",
    "ChainedRow",
    "RowLink",
    "canonical",
    "check_event",
    "genesis",
    "link",
    "parse_chain",
]

_CANONICAL = STRICT | orjson.OPT_SORT_KEYS

CHAIN_BYTES = 16
"""The size of an event's hash (BLAKE2b, 128 bits)."""


def genesis(instance_id: str) -> bytes:
    """The hash an instance's chain begins from (before its first event)."""
    return hashlib.blake2b(
        instance_id.encode("utf-8", "surrogatepass"),
        digest_size=CHAIN_BYTES,
        person=b"steplog-chain-1",
    ).digest()


def canonical(
    type_name: str,
    version: int,
    instance_id: str,
    position: int,
    time_us: int,
    offset_us: int,
    fields: Sequence[Any],
) -> bytes:
    """The bytes an event's hash covers (see the module's docstring). Raises ``TypeError`` for a
    value that is not a JSON tree."""
    return orjson.dumps(
        [type_name, version, instance_id, position, time_us, offset_us, *fields],
        default=nested_model,
        option=_CANONICAL,
    )


def link(previous: bytes, covered: bytes) -> bytes:
    """The hash of the event whose canonical bytes are ``covered``, following ``previous``."""
    return hashlib.blake2b(previous + covered, digest_size=CHAIN_BYTES).digest()


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

    @classmethod
    def of(cls, first: int, last: int, chain: bytes | None) -> RowLink:
        """The link of the row holding ``first..last`` whose hashes are ``chain`` (None: none)."""
        if chain is None:
            return cls(first, last, None, None)
        return cls(first, last, chain[:CHAIN_BYTES], chain[-CHAIN_BYTES:])


def parse_chain(where: str, text: Any, count: int) -> bytes:
    """The hashes of a batch row of ``count`` events from its stored ``chain`` element (base64 of
    ``count + 1`` hashes). Raises ``DecodeError`` naming ``where`` when it is malformed."""
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
    return chain


def check_event(
    layout: Layout,
    item: list[Any],
    strings: list[str],
    instance_id: str,
    position: int,
    stamps: Stamps,
    index: int,
    chain: bytes,
    report: Callable[[LogIntegrityError], None] | None,
) -> None:
    """Check the event ``item`` at ``index`` of its row (as stored: ``[code, delta, field, ...]``)
    against its hash in ``chain``. A mismatch raises ``LogIntegrityError`` naming the position,
    or is handed to ``report`` when given."""
    fields = item[2:]
    if layout.interned:
        fields = resolved(layout, fields, strings, instance_id, position)
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
        stored = canonical(
            layout.type_name,
            layout.version,
            instance_id,
            position,
            stamps.base_us + delta,
            offset_us,
            fields[:end],
        )
    except TypeError:  # nested deeper than any writer could have written it: not as written
        stored = None
    at = index * CHAIN_BYTES
    if (
        stored is not None
        and link(chain[at : at + CHAIN_BYTES], stored)
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
