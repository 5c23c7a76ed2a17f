"""The hash chain's checks: how rows must link up, and the report of ``EventStore.verify_chain``.

Each event's hash is computed and checked by ``_codec._hashing`` (with what an event's hash
covers). What this module checks is the order around them: an instance's rows hold positions
1, 2, ... without gaps or overlaps, each row's chain begins with the hash its predecessor ended
with (``genesis(instance)`` for the first), no row without hashes follows one with them, and
the log ends where the store's recorded head of the chain says it does.

What the chain proves, and what it does not, is in ``docs/security.md``: an edit, a deletion, an
insertion, a reordering or a truncation is found unless whoever made it also recomputed every
later hash and the recorded head; an exported head (``ChainHead``) held elsewhere catches that too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernel._base._errors import LogIntegrityError, StoreConfigError
from kernel._codec._hashing import RowLink, genesis

__all__ = [
    "ChainHead",
    "ChainProblem",
    "ChainReport",
    "IntegrityMark",
    "form_problem",
    "link_problem",
    "tail_problem",
]


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One thing wrong with an instance's chain: where (the first position it concerns), what
    (``kind``) and in words (``detail``)."""

    instance_id: str
    position: int
    kind: str
    """``edited``, ``marker rewritten``, ``gap``, ``reordered``, ``unchained``, ``unsealed``,
    ``truncated``, ``unrecorded``, ``head mismatch``, ``seal broken``, ``mark altered`` or
    ``malformed``."""
    detail: str

    def error(self) -> LogIntegrityError:
        """The problem as the error a reader raises."""
        return LogIntegrityError(
            self.detail, instance_id=self.instance_id, position=self.position, kind=self.kind
        )

    @classmethod
    def of(cls, error: LogIntegrityError, instance_id: str, position: int) -> ChainProblem:
        """The problem an error describes (its own place when it names one)."""
        return cls(
            error.instance_id or instance_id,
            error.position or position,
            error.kind or "malformed",
            str(error),
        )


@dataclass(slots=True)
class ChainReport:
    """What ``EventStore.verify_chain`` found: ``ok`` when nothing is wrong."""

    instances: int = 0
    rows: int = 0
    events: int = 0
    unchained_events: int = 0
    """Events in rows written before the hash chain existed: readable, not covered by it."""
    problems: list[ChainProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing found wrong (events without hashes may still be unchecked: ``verified``)."""
        return not self.problems

    @property
    def verified(self) -> bool:
        """Nothing found wrong, and every event was checked against its hash."""
        return not self.problems and not self.unchained_events

    def first_problem(self, instance_id: str) -> ChainProblem | None:
        """The instance's first problem (lowest position), None when it has none."""
        found = [p for p in self.problems if p.instance_id == instance_id]
        return min(found, key=lambda p: p.position) if found else None


@dataclass(frozen=True, slots=True)
class ChainHead:
    """An instance's chain head: the hash of its event at ``position``, which covers every
    event up to it. Held by an auditor, it proves later that nothing up to ``position`` changed
    (``EventStore.verify_chain(heads=[...])``). ``signature`` is an HMAC-SHA256 of the rest
    with a key the user holds (``sign``), empty when unsigned."""

    instance_id: str
    position: int
    hash: str
    """Hex."""
    signature: str = ""

    def _message(self) -> bytes:
        return f"steplog-head-1\x00{self.instance_id}\x00{self.position}\x00{self.hash}".encode(
            "utf-8", "surrogatepass"
        )

    def sign(self, key: bytes) -> ChainHead:
        """This head signed with ``key`` (any length; 32 random bytes is plenty)."""
        if not key:
            raise StoreConfigError("a signing key must not be empty")
        digest = hmac.new(key, self._message(), hashlib.sha256).hexdigest()
        return ChainHead(self.instance_id, self.position, self.hash, digest)

    def signed_by(self, key: bytes) -> bool:
        """Whether ``signature`` is this head's signature with ``key``."""
        return bool(self.signature) and hmac.compare_digest(
            self.sign(key).signature, self.signature
        )

    def to_json(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "position": self.position,
            "hash": self.hash,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, data: object) -> ChainHead:
        """The head in ``data`` (as ``to_json`` writes it); ``StoreConfigError`` naming what is
        wrong otherwise."""
        if not isinstance(data, dict):
            raise StoreConfigError(f"a chain head is a JSON object, not {type(data).__name__}")
        instance_id, position, digest = (
            data.get("instance_id"),
            data.get("position"),
            data.get("hash"),
        )
        signature = data.get("signature", "")
        if not isinstance(instance_id, str) or not instance_id:
            raise StoreConfigError("a chain head needs its instance_id (a string)")
        if type(position) is not int or position < 1:
            raise StoreConfigError("a chain head needs its position (an integer >= 1)")
        if not isinstance(digest, str) or len(digest) != 32:
            raise StoreConfigError("a chain head needs its hash (32 hex digits)")
        try:
            bytes.fromhex(digest)
        except ValueError:
            raise StoreConfigError("a chain head's hash is not hex") from None
        if not isinstance(signature, str):
            raise StoreConfigError("a chain head's signature is a string")
        return cls(instance_id, position, digest, signature)


@dataclass(frozen=True, slots=True)
class IntegrityMark:
    """What a store's rows must be: every row with an id (its place in the order of appends)
    above ``chained_from`` carries hashes; and, in an encrypted store (``plain`` is not None),
    every row is sealed except those written before the store's first key, which ``plain``
    names per instance: the last position of the instance written in plain text. None: no such
    rule.

    The rows that may be plain are named by instance and position, never by row id: row ids are
    in the attacker's hands (renumbered, or a row inserted at id 0), positions are covered by
    the chain. Kept in the store's meta table, as ``to_text`` writes it; in an encrypted store
    with a tag (``Keyring.tag``), so that someone without the key can neither add a plain row
    to ``plain`` nor make a plain store of an encrypted one (``docs/security.md``)."""

    chained_from: int | None = None
    plain: Mapping[str, int] | None = None

    def may_be_plain(self, instance_id: str, last: int) -> bool:
        """Whether the row of ``instance_id`` ending at position ``last`` may be plain."""
        return self.plain is None or last <= self.plain.get(instance_id, 0)

    def message(self) -> bytes:
        """The bytes the tag authenticates."""
        plain = None if self.plain is None else sorted(self.plain.items())
        body = json.dumps([self.chained_from, plain], ensure_ascii=True)
        return f"steplog-integrity-2\x00{body}".encode()

    def to_text(self, tag: str = "") -> str:
        plain = None if self.plain is None else dict(sorted(self.plain.items()))
        return json.dumps(
            {"chained_from": self.chained_from, "plain": plain, "tag": tag}, sort_keys=True
        )

    @classmethod
    def from_text(cls, text: str) -> tuple[IntegrityMark, str] | None:
        """The mark in ``text`` and its tag ("" when untagged); None when it is malformed: a
        bound or position that is not a whole number >= 0 (``true`` and ``1e9`` are not)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.keys() != {"chained_from", "plain", "tag"}:
            return None
        chained, plain, tag = data["chained_from"], data["plain"], data["tag"]
        if not (chained is None or (type(chained) is int and chained >= 0)):
            return None
        if plain is not None and not (
            isinstance(plain, dict) and all(type(v) is int and v >= 0 for v in plain.values())
        ):
            return None
        if not isinstance(tag, str):
            return None
        return cls(chained, plain), tag


def form_problem(
    instance_id: str, row: RowLink, *, chained: bool, sealed: bool
) -> ChainProblem | None:
    """What is wrong with a row that breaks its store's ``IntegrityMark`` (not ``sealed``: a
    plain row in an encrypted store; not ``chained``: a row without hashes in a chained one)."""
    where = f"the row holding {instance_id!r}#{row.first}..{row.last}"
    if not sealed:
        return ChainProblem(
            instance_id,
            row.first,
            "unsealed",
            f"{where} is not encrypted, though every row of this store must be, except the "
            "ones its integrity mark lists as written before its key: it was written or "
            "rewritten by someone without the key",
        )
    if not chained:
        return ChainProblem(
            instance_id,
            row.first,
            "unchained",
            f"{where} carries no hashes, though this store was stamped as chained before it was "
            "written: it was rewritten without them",
        )
    return None


def link_problem(instance_id: str, before: RowLink | None, row: RowLink) -> ChainProblem | None:
    """What is wrong with ``row`` following ``before`` (None: ``row`` is the instance's first),
    or None when it links up."""
    expected = 1 if before is None else before.last + 1
    if row.first > expected:
        return ChainProblem(
            instance_id,
            expected,
            "gap",
            f"positions {expected}..{row.first - 1} of {instance_id!r} are missing: a row was "
            "deleted",
        )
    if row.first < expected:
        return ChainProblem(
            instance_id,
            row.first,
            "reordered",
            f"the row holding {instance_id!r}#{row.first}..{row.last} overlaps the one before it "
            f"(which ends at {expected - 1}): an event was inserted or moved",
        )
    if row.previous is None:
        if before is not None and before.head is not None:
            return ChainProblem(
                instance_id,
                row.first,
                "unchained",
                f"the row holding {instance_id!r}#{row.first}..{row.last} carries no hashes, "
                "though the rows before it do: it was rewritten without them",
            )
        return None
    previous = genesis(instance_id) if before is None or before.head is None else before.head
    if row.previous != previous:
        return ChainProblem(
            instance_id,
            row.first,
            "reordered",
            f"the row holding {instance_id!r}#{row.first}..{row.last} does not follow the event "
            "before it in the chain: an event was inserted, removed or moved",
        )
    return None


def tail_problem(
    instance_id: str, last: RowLink | None, head: tuple[int, bytes] | None
) -> ChainProblem | None:
    """What is wrong with where an instance's log ends (``last``, its last row) given the head
    the store recorded (None: none), or None."""
    if head is None:
        if last is not None and last.head is not None:
            return ChainProblem(
                instance_id,
                last.last,
                "unrecorded",
                f"no chain head is recorded for {instance_id!r}, though its rows are chained: "
                "the head was deleted",
            )
        return None
    position, digest = head
    end = 0 if last is None else last.last
    if end < position:
        return ChainProblem(
            instance_id,
            end + 1,
            "truncated",
            f"the log of {instance_id!r} ends at position {end}, but its chain head is at "
            f"{position}: events {end + 1}..{position} were removed from its end",
        )
    if end > position:
        return ChainProblem(
            instance_id,
            position + 1,
            "unrecorded",
            f"{instance_id!r} holds events {position + 1}..{end} past its recorded chain head: "
            "they were written around steplog, or the head was rolled back",
        )
    assert last is not None
    if last.head != digest:
        return ChainProblem(
            instance_id,
            end,
            "head mismatch",
            f"the last event of {instance_id!r} (#{end}) does not end in the recorded chain "
            "head: the end of the log was rewritten",
        )
    return None
