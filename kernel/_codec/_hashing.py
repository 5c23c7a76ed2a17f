"""The hash chain, per event: what each event's hash covers, and the check of a row against it.

Each event's hash is ``blake2b(previous hash + canonical event, 16 bytes)``; the first event of an
instance follows ``genesis(instance)``. The canonical event is the JSON array ``[type, schema
version, instance, position, time (µs since the epoch), UTC offset (µs), field, field, ...]``, its
fields in declaration order with trailing defaults left out, object keys sorted: the logical
event, whatever the row's packing (``_codec._rows``), so a later storage format (or re-encryption)
keeps every hash. What a batch row stores of its chain (its ``chain`` element, base64):

* **batch format 3** (written now): the hash before its first event and the hash of its last
  event, in full, and between them a 2-byte **tag** per event but the last (the first 2 bytes of
  its hash). Decoding any event of the row recomputes every hash of the row from the one before
  it and compares the last with the stored one in full: that comparison is the check, as strong
  as comparing every event with a full hash (an edit anywhere in the row changes the last hash).
  The tags only say *where*: the first event whose recomputed hash does not begin with its tag
  is the one named (the last event when every tag matches), so an edit is named at its position.
  A tag never vouches for an event: a row is accepted only when its last hash matches, whatever
  the tags say, and a row whose tags were altered is refused too.
* **batch format 2** (read, no longer written): the hash before its first event followed by each
  of its events' hashes, each event checked alone against its own hash and its predecessor's.

A mismatch is a ``LogIntegrityError`` naming the position. How rows must link up is
``_codec._chain``'s.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
from eventsourcing.persistence import StoredEvent

from kernel._base._errors import DecodeError, LogIntegrityError
from kernel._codec._rows import STRICT, Layout, nested_model

__all__ = [
    "CANONICAL",
    "CHAIN_BYTES",
    "TAG_BYTES",
    "ChainedRow",
    "RowLink",
    "broken",
    "canonical",
    "chain_size",
    "genesis",
    "link",
    "parse_chain",
]

CANONICAL = STRICT | orjson.OPT_SORT_KEYS
"""orjson's options for an event's canonical bytes: a row's, with object keys sorted."""

CHAIN_BYTES = 16
"""The size of an event's hash (BLAKE2b, 128 bits)."""

TAG_BYTES = 2
"""The size of an event's tag in a row of batch format 3: the first bytes of its hash, which name
the event a mismatch is found at (never a check: the row's last hash, in full, is)."""


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
        option=CANONICAL,
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


def chain_size(batch_format: int, count: int) -> int:
    """How many bytes the ``chain`` of a row of ``batch_format`` holding ``count`` events has."""
    if batch_format == 2:
        return CHAIN_BYTES * (count + 1)
    return 2 * CHAIN_BYTES + TAG_BYTES * (count - 1)


def parse_chain(where: str, text: Any, count: int, batch_format: int) -> bytes:
    """The chain of a batch row of ``count`` events from its stored ``chain`` element (base64 of
    ``chain_size(batch_format, count)`` bytes). Raises ``DecodeError`` naming ``where`` when it is
    malformed."""
    try:
        if type(text) is not str:
            raise ValueError
        chain = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise DecodeError(f"{where} has a malformed hash chain {text!r:.40}") from None
    if len(chain) != chain_size(batch_format, count):
        if batch_format == 2:
            raise DecodeError(
                f"{where} has {len(chain) // CHAIN_BYTES} hashes in its chain; {count} events "
                f"need {count + 1}"
            )
        raise DecodeError(
            f"{where} has a hash chain of {len(chain)} bytes; {count} events need "
            f"{chain_size(batch_format, count)}"
        )
    return chain


def broken(layout: Layout, instance_id: str, position: int) -> LogIntegrityError:
    """The error for the event at ``position`` (of ``layout``) that does not match its hash."""
    marker = layout.type_name in ("superstep_committed", "superstep_aborted")
    return LogIntegrityError(
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
