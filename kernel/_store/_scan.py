"""Helpers of the store's reads: ``Scan`` (where a scan of the global log is), looking at a row's
bytes before decoding it (``codes_pattern``, ``row_may_hold``), and ``bulk`` (no garbage collection
during a long read)."""

from __future__ import annotations

import gc
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from kernel._base._errors import StepLogError
from kernel._codec._cipher import Keyring, is_sealed
from kernel._codec._hashing import RowLink
from kernel._codec._rows import BATCH_CODES, place

__all__ = ["Scan", "bulk", "codes_pattern", "row_may_hold"]


class Scan:
    """Where a scan of the global log is: the global position its last page ended at (where the
    next page begins), the newest row it entered (rows after the last event returned may have
    been passed already: a ``types`` filter keeps none of their events), and the last row it
    entered of each instance (``from_start``: it began at the log's start, so an instance's
    first row must begin its stream)."""

    __slots__ = ("end", "entered", "from_start", "links")

    def __init__(self, end: int, links: dict[str, RowLink], *, from_start: bool) -> None:
        self.end = end
        self.entered = 0
        self.links = links
        self.from_start = from_start


ROWS_PER_LOOK = 4096  # rows per query of ``find_events``: most are looked at and dropped
_JSON_SPACE = rb"[ \t\n\r]*"


def codes_pattern(types: Collection[str]) -> re.Pattern[bytes]:
    """What a batch row's JSON must contain to hold an event of ``types``: an array opening with
    one of their type codes (every schema version's), JSON whitespace allowed where JSON allows
    it, and ``-0`` for ``0`` (JSON reads it as the integer 0)."""
    codes = sorted(str(code) for code, (name, _) in enumerate(BATCH_CODES) if name in types)
    if not codes:
        return re.compile(rb"(?!)")  # matches nothing: no row holds such an event
    alternatives = b"|".join(c.encode() for c in codes)
    return re.compile(
        rb"\[" + _JSON_SPACE + rb"-?(?:" + alternatives + rb")" + _JSON_SPACE + rb"[,\]]"
    )


def row_may_hold(
    instance_id: str,
    last: int,
    topic: str,
    state: bytes,
    types: Collection[str],
    needle: re.Pattern[bytes],
    keyring: Keyring | None,
) -> bool:
    """Whether the row ``(instance_id, last, topic, state)`` may hold an event of ``types``
    (``needle``: their ``codes_pattern``), by its bytes: False only if it holds none. A row
    that cannot be looked at so (an event row, a sealed row that does not open, not bytes) may
    hold one: decoding it tells, or says what is wrong with it."""
    if type(topic) is not str or not topic.isdigit():
        return type(topic) is not str or topic.partition("@")[0] in types
    if type(state) is not bytes:
        if not isinstance(state, bytes | bytearray | memoryview):
            return True
        state = bytes(state)
    if is_sealed(state):
        if keyring is None:
            return True
        try:
            state = keyring.open(state, place(instance_id, last, topic), f"row {instance_id!r}")
        except (StepLogError, ValueError):  # decoding the row raises the right error
            return True
    return needle.search(state) is not None


@contextmanager
def bulk() -> Iterator[None]:
    """Hold the cyclic garbage collector off while a read builds many objects at once.

    Decoded events hold no reference cycles, but every allocation of a long read counts towards
    the collector's thresholds, and its full passes over a growing heap made reading 700,000
    events 40 % slower. Collection resumes, as it was, when the read ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
