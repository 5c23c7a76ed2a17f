"""Key provenance ("blame"): every write of every key, and whether it counted, as a pure fold.

A write's ``status`` is one of:

``committed``
    its superstep committed and no later committed write of the key replaced it: the key's value
    (or, for a ``delete``, its absence) comes from this write.
``superseded``
    it counted, then a later committed write of the same key replaced it (``superseded_by`` is that
    write's stream position).
``aborted``
    its superstep was aborted; ``reason`` says why (``failed``, ``cancelled``, ``abandoned``,
    ``crashed``).
``late``
    it was staged after its superstep's marker, or after its run ended: it never counts.
``unmarked``
    its run ended without a marker for its superstep: it never counts.
``pending``
    its superstep has no marker yet.

Example::

    blame = fold_blame(store.read("order-42"))
    for write in blame.writes("plan"):
        print(write.position, write.executor_id, write.op, write.status, write.reason)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kernel._events import EventBase, StateStaged, SuperstepAborted
from projections._tracker import SuperstepTracker

__all__ = ["KeyBlame", "WriteRecord", "WriteStatus", "fold_blame"]

WriteStatus = Literal["committed", "superseded", "aborted", "late", "unmarked", "pending"]


class WriteRecord(BaseModel):
    """One staged write of a key. ``value`` is the wire JSON tree (None for a delete)."""

    model_config = ConfigDict(extra="forbid")

    key: str
    position: int
    run_id: str
    superstep_id: str
    executor_id: str
    timestamp: datetime
    op: Literal["set", "delete"]
    value: Any = None
    status: WriteStatus = "pending"
    reason: str | None = None
    superseded_by: int | None = None


class KeyBlame:
    """Every write of every key of one instance (see the module docstring)."""

    __slots__ = ("_by_superstep", "_current", "_keys", "_tracker")

    def __init__(self) -> None:
        self._keys: dict[str, list[WriteRecord]] = {}
        # superstep id -> positions of its pending writes, by key then position
        self._by_superstep: dict[str, dict[int, WriteRecord]] = {}
        # key -> its write that currently counts
        self._current: dict[str, WriteRecord] = {}
        self._tracker = SuperstepTracker()

    def apply(self, event: EventBase) -> KeyBlame:
        """Fold one event in; return the view."""
        outcome = self._tracker.apply(event)
        kind = outcome.kind
        if isinstance(event, StateStaged):
            record = WriteRecord(
                key=event.key,
                position=event.position,
                run_id=event.run_id,
                superstep_id=event.superstep_id,
                executor_id=event.executor_id,
                timestamp=event.timestamp,
                op=event.op,
                value=event.value,
                status="pending" if kind == "staged" else "late",
            )
            self._keys.setdefault(event.key, []).append(record)
            if kind == "staged":
                self._by_superstep.setdefault(event.superstep_id, {})[event.position] = record
        elif kind == "committed":
            pending = self._by_superstep.pop(event.superstep_id, {})  # type: ignore[attr-defined]
            for write in outcome.writes:
                record = pending[write.position]
                previous = self._current.get(record.key)
                if previous is not None:
                    previous.status = "superseded"
                    previous.superseded_by = record.position
                record.status = "committed"
                self._current[record.key] = record
        elif kind == "aborted":
            assert isinstance(event, SuperstepAborted)
            for record in self._by_superstep.pop(event.superstep_id, {}).values():
                record.status = "aborted"
                record.reason = event.reason
        elif kind == "run_ended":
            for superstep_id in outcome.unmarked:
                for record in self._by_superstep.pop(superstep_id, {}).values():
                    record.status = "unmarked"
        return self

    # -- reading ------------------------------------------------------------------------------

    def written_keys(self) -> list[str]:
        """Every key ever written, in first-write order."""
        return list(self._keys)

    def writes(self, key: str) -> list[WriteRecord]:
        """Every write of ``key``, in stream order."""
        return list(self._keys.get(key, ()))

    def current(self, key: str) -> WriteRecord | None:
        """The write the key's committed value comes from (a ``delete`` if it was deleted)."""
        return self._current.get(key)

    # -- persistence --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (for materialized views)."""
        return {
            "writes": [w.model_dump(mode="json") for ws in self._keys.values() for w in ws],
            "tracker": self._tracker.to_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> KeyBlame:
        """Rebuild the view from ``to_json()``."""
        view = cls()
        for raw in tree["writes"]:
            record = WriteRecord.model_validate(raw)
            view._keys.setdefault(record.key, []).append(record)
            if record.status == "pending":
                view._by_superstep.setdefault(record.superstep_id, {})[record.position] = record
            elif record.status == "committed":
                view._current[record.key] = record
        view._tracker = SuperstepTracker.from_json(tree["tracker"])
        return view

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyBlame):
            return NotImplemented
        return self._keys == other._keys

    def __repr__(self) -> str:
        return f"KeyBlame(keys={len(self._keys)})"


def fold_blame(events: Iterable[EventBase], view: KeyBlame | None = None) -> KeyBlame:
    """Fold one instance's ``events`` (in stream order) into a ``KeyBlame``."""
    view = KeyBlame() if view is None else view
    for event in events:
        view.apply(event)
    return view
