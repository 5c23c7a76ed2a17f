"""What the store hands back and takes in beside events: global positions, ``Recorded``,
``Prepared``. Below the store and the group committer, which both use them."""

from __future__ import annotations

from dataclasses import dataclass

from eventsourcing.persistence import StoredEvent

from kernel._log._events import EventBase

__all__ = ["ROW_EVENTS", "ROW_SHIFT", "Prepared", "Recorded", "global_positions"]

ROW_SHIFT = 20
"""A row's events have global positions ``(row id << ROW_SHIFT) + offset in the row``."""
ROW_EVENTS = 1 << ROW_SHIFT
"""The most events one append (one row) may hold."""


def global_positions(row_id: int, count: int) -> list[int]:
    """The global positions of the ``count`` events of row ``row_id``."""
    base = row_id << ROW_SHIFT
    return list(range(base, base + count))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A batch checked and encoded for ``EventStore.append_prepared``: its one row (None for an
    empty batch)."""

    instance_id: str
    expected_version: int
    count: int
    row: StoredEvent | None


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event with its position in the store's global order (ids may have gaps)."""

    global_position: int
    event: EventBase
