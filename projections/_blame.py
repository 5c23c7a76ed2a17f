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

from kernel._errors import ProjectionError
from kernel._events import EventBase, StateStaged, SuperstepAborted
from projections._tracker import RUN_END_TYPES, SuperstepTracker

__all__ = ["KeyBlame", "WriteRecord", "WriteStatus", "fold_blame"]

_BLAME_TYPES = frozenset(
    {"state_staged", "superstep_started", "superstep_committed", "superstep_aborted"}
    | RUN_END_TYPES
)

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
    """Every write of every key of one instance (see the module docstring).

    With ``keys``, only the writes of those keys are kept, and the writes of other keys are
    skipped before anything else looks at them (the answers for ``keys`` are the same).
    """

    __slots__ = ("_by_superstep", "_current", "_keys", "_only", "_tracker")

    def __init__(self, keys: Iterable[str] | None = None) -> None:
        self._keys: dict[str, list[WriteRecord]] = {}
        # superstep id -> its pending writes, by position
        self._by_superstep: dict[str, dict[int, WriteRecord]] = {}
        # key -> its write that currently counts
        self._current: dict[str, WriteRecord] = {}
        self._only: frozenset[str] | None = None if keys is None else frozenset(keys)
        self._tracker = SuperstepTracker()

    @property
    def only(self) -> frozenset[str] | None:
        """The keys this view is restricted to, or None for every key."""
        return self._only

    # -- record access (a materialized view loads records from its rows here) ----------------

    def _add(self, record: WriteRecord) -> None:
        self._keys.setdefault(record.key, []).append(record)
        if record.status == "pending":
            self._by_superstep.setdefault(record.superstep_id, {})[record.position] = record

    def _take_pending(self, superstep_id: str) -> dict[int, WriteRecord]:
        return self._by_superstep.pop(superstep_id, {})

    def _current_of(self, key: str) -> WriteRecord | None:
        return self._current.get(key)

    def _set_current(self, record: WriteRecord) -> None:
        self._current[record.key] = record

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: EventBase) -> KeyBlame:
        """Fold one event in; return the view."""
        only = self._only
        if only is not None and (
            event.type not in _BLAME_TYPES
            or (isinstance(event, StateStaged) and event.key not in only)
        ):
            return self  # nothing else changes what happens to these keys' writes
        outcome = self._tracker.apply(event)
        kind = outcome.kind
        if isinstance(event, StateStaged):
            self._add(
                WriteRecord.model_construct(
                    key=event.key,
                    position=event.position,
                    run_id=event.run_id,
                    superstep_id=event.superstep_id,
                    executor_id=event.executor_id,
                    timestamp=event.timestamp,
                    op=event.op,
                    value=event.value,
                    status="pending" if kind == "staged" else "late",
                    reason=None,
                    superseded_by=None,
                )
            )
        elif kind == "committed":
            pending = self._take_pending(event.superstep_id)  # type: ignore[attr-defined]
            for write in outcome.writes:
                record = pending[write.position]
                previous = self._current_of(record.key)
                if previous is not None:
                    previous.status = "superseded"
                    previous.superseded_by = record.position
                record.status = "committed"
                self._set_current(record)
        elif kind == "aborted":
            assert isinstance(event, SuperstepAborted)
            for record in self._take_pending(event.superstep_id).values():
                record.status = "aborted"
                record.reason = event.reason
        elif kind == "run_ended":
            for superstep_id in outcome.unmarked:
                for record in self._take_pending(superstep_id).values():
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
        """The view as a JSON tree (one document; the materialized view keeps rows instead)."""
        return {
            "writes": [w.model_dump(mode="json") for ws in self._keys.values() for w in ws],
            **self.tracker_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> KeyBlame:
        """Rebuild the view from ``to_json()``."""
        return cls.from_rows(tree["writes"], tree)

    def tracker_json(self) -> dict[str, Any]:
        """What the fold needs besides its write records, as a JSON tree (see ``from_rows``)."""
        return {
            "tracker": self._tracker.to_json(),
            "only": None if self._only is None else sorted(self._only),
        }

    @classmethod
    def from_rows(cls, writes: Iterable[dict[str, Any]], tracker: dict[str, Any]) -> KeyBlame:
        """Rebuild the view from its write rows (``WriteRecord`` JSON, any order) and
        ``tracker_json()``."""
        only = tracker.get("only")
        view = cls(None if only is None else only)
        records = sorted((WriteRecord.model_validate(raw) for raw in writes), key=_position)
        for record in records:
            view._add(record)
            if record.status == "committed":
                view._current[record.key] = record
        view._tracker = SuperstepTracker.from_json(tracker["tracker"])
        return view

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyBlame):
            return NotImplemented
        return self._keys == other._keys

    def __repr__(self) -> str:
        return f"KeyBlame(keys={len(self._keys)})"


def _position(record: WriteRecord) -> int:
    return record.position


def fold_blame(
    events: Iterable[EventBase],
    view: KeyBlame | None = None,
    *,
    keys: Iterable[str] | None = None,
) -> KeyBlame:
    """Fold one instance's ``events`` (in stream order) into a ``KeyBlame``.

    ``keys`` restricts a new view to those keys: other keys' writes are skipped on sight, which
    makes the blame of one key of a long history much cheaper (see ``blame_keys`` for reading
    only the events blame needs from a store).
    """
    if view is None:
        view = KeyBlame(keys)
    elif keys is not None and view.only != frozenset(keys):
        raise ProjectionError(f"the view is restricted to {view.only}, not to {sorted(keys)}")
    for event in events:
        view.apply(event)
    return view
