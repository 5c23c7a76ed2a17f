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

A forked instance starts from its origin's committed values (``InstanceForked``). Each of those
keys gets a write record of its own that says where the value came from: ``origin_instance`` and
``origin_position`` (the origin's stream position the fork was taken at), ``position`` the fork
event's, ``run_id`` and ``superstep_id`` the origin's run and checkpoint there (empty if none),
and no executor. Like any write it is ``committed`` until a committed write of the key in the
fork replaces it (``superseded``).

The fold keeps its ``WriteRecord`` objects in a ``WriteRows`` sink: by default ``MemoryWriteRows``;
a materialized view passes one that loads and writes the rows of a view table (``BlameView``).

Example::

    blame = fold_blame(store.read("order-42"))
    for write in blame.writes("plan"):
        print(write.position, write.executor_id, write.op, write.status, write.reason)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from kernel import (
    RUN_END_TYPES,
    EventBase,
    Fold,
    InstanceForked,
    ProjectionError,
    RunEvent,
    StateStaged,
    SuperstepAborted,
    SuperstepEvent,
    SuperstepStarted,
    folds,
)
from projections._folds._runrecords import in_memory
from projections._folds._tracker import Outcome, SuperstepTracker

__all__ = ["KeyBlame", "MemoryWriteRows", "WriteRecord", "WriteRows", "WriteStatus", "fold_blame"]

WriteStatus = Literal["committed", "superseded", "aborted", "late", "unmarked", "pending"]


class WriteRecord(BaseModel):
    """One staged write of a key. ``value`` is the wire JSON tree (None for a delete).

    ``origin_instance`` is set on the record of a value a fork started with: it was written by
    the fork from that instance as of its stream position ``origin_position``.
    """

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
    origin_instance: str | None = None
    origin_position: int | None = None

    @property
    def from_fork(self) -> bool:
        """Whether this is a value the instance was forked with, not a write staged in it."""
        return self.origin_instance is not None


class WriteRows(Protocol):
    """Where a ``KeyBlame`` keeps its write records: the fold adds them, finds them by stream
    position (a fork's values: by the fork event's position and key) and changes them in place."""

    def add(self, record: WriteRecord) -> None:
        """Keep a new write record."""

    def get(self, position: int) -> WriteRecord:
        """The record of the write at stream ``position`` (one that was added)."""

    def get_forked(self, position: int, key: str) -> WriteRecord:
        """The record of ``key``'s value in the fork event at stream ``position``."""


class MemoryWriteRows:
    """``WriteRows`` in dictionaries, by position and by key: what ``KeyBlame`` reads from."""

    __slots__ = ("by_key", "by_position", "forked")

    def __init__(self) -> None:
        self.by_position: dict[int, WriteRecord] = {}
        self.by_key: dict[str, list[WriteRecord]] = {}
        self.forked: dict[str, WriteRecord] = {}  # key -> the value the fork started with

    def add(self, record: WriteRecord) -> None:
        if record.from_fork:
            self.forked[record.key] = record
        else:
            self.by_position[record.position] = record
        self.by_key.setdefault(record.key, []).append(record)

    def get(self, position: int) -> WriteRecord:
        return self.by_position[position]

    def get_forked(self, position: int, key: str) -> WriteRecord:
        return self.forked[key]

    def records(self) -> list[WriteRecord]:
        """Every record, in stream order (a fork's values first, by key)."""
        return [*self.forked.values(), *self.by_position.values()]


class KeyBlame(Fold):
    """Every write of every key of one instance (see the module docstring).

    With ``keys``, only the writes of those keys are kept, and the writes of other keys are
    skipped before anything else looks at them (the answers for ``keys`` are the same).
    ``rows`` is where the records live (a new ``MemoryWriteRows`` by default); ``tracker``
    continues a saved fold (``tracker_json()``).
    """

    __slots__ = ("_current", "_forked_at", "_only", "_pending", "_rows", "_tracker")

    def __init__(
        self,
        keys: Iterable[str] | None = None,
        *,
        rows: WriteRows | None = None,
        tracker: dict[str, Any] | None = None,
    ) -> None:
        self._rows: WriteRows = MemoryWriteRows() if rows is None else rows
        self._only: frozenset[str] | None = None if keys is None else frozenset(keys)
        # superstep id -> the positions of its pending writes; key -> the position of the write
        # its committed value comes from
        self._pending: dict[str, list[int]] = {}
        self._current: dict[str, int] = {}
        # the position of the fork event, if the instance is a fork: a key whose current
        # position is this one has the value the fork started with
        self._forked_at: int | None = None
        self._tracker = SuperstepTracker()
        if tracker is not None:
            self._tracker = SuperstepTracker.from_json(tracker["tracker"])
            self._pending = {sid: list(at) for sid, at in tracker["pending"].items()}
            self._current = dict(tracker["current"])
            self._forked_at = tracker.get("forked_at")

    @property
    def only(self) -> frozenset[str] | None:
        """The keys this view is restricted to, or None for every key."""
        return self._only

    # -- folding ------------------------------------------------------------------------------

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        only = self._only
        if only is not None and event.key not in only:
            return  # nothing else changes what happens to these keys' writes
        pending = self._tracker.track(event).kind == "staged"
        self._rows.add(
            WriteRecord.model_construct(
                key=event.key,
                position=event.position,
                run_id=event.run_id,
                superstep_id=event.superstep_id,
                executor_id=event.executor_id,
                timestamp=event.timestamp,
                op=event.op,
                value=event.value,
                status="pending" if pending else "late",
                reason=None,
                superseded_by=None,
            )
        )
        if pending:
            self._pending.setdefault(event.superstep_id, []).append(event.position)

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        self._tracker.track(event)

    @folds("instance_forked")
    def _forked(self, event: InstanceForked) -> None:
        self._tracker.track(event)
        only = self._only
        self._forked_at = event.position
        self._current = {}  # the fork's values replace whatever came before
        for key, value in event.values.items():
            if only is not None and key not in only:
                continue
            self._rows.add(
                WriteRecord.model_construct(
                    key=key,
                    position=event.position,
                    run_id=event.origin_run or "",
                    superstep_id=event.checkpoint or "",
                    executor_id="",
                    timestamp=event.timestamp,
                    op="set",
                    value=value,
                    status="committed",
                    reason=None,
                    superseded_by=None,
                    origin_instance=event.origin_instance,
                    origin_position=event.origin_position,
                )
            )
            self._current[key] = event.position

    def _record_at(self, position: int, key: str) -> WriteRecord:
        if position == self._forked_at:
            return self._rows.get_forked(position, key)
        return self._rows.get(position)

    @folds("superstep_committed")
    def _committed(self, event: SuperstepEvent) -> None:
        outcome = self._tracker.track(event)
        if outcome.kind != "committed":
            return
        self._pending.pop(event.superstep_id, None)
        rows, current = self._rows, self._current
        for write in outcome.writes:
            record = rows.get(write.position)
            previous = current.get(record.key)
            if previous is not None:
                replaced = self._record_at(previous, record.key)
                replaced.status = "superseded"
                replaced.superseded_by = record.position
            record.status = "committed"
            current[record.key] = record.position

    @folds("superstep_aborted")
    def _aborted(self, event: SuperstepAborted) -> None:
        if self._tracker.track(event).kind != "aborted":
            return
        rows = self._rows
        for position in self._pending.pop(event.superstep_id, ()):
            record = rows.get(position)
            record.status = "aborted"
            record.reason = event.reason

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        outcome = self._tracker.track(event)
        rows = self._rows
        for superstep_id in outcome.unmarked:
            for position in self._pending.pop(superstep_id, ()):
                rows.get(position).status = "unmarked"

    # -- reading ------------------------------------------------------------------------------

    @property
    def last_outcome(self) -> Outcome:
        """What the last marker or run end folded in did (``SuperstepTracker.outcome``): which
        superstep it decided and how, for a reader that follows decisions as it folds (the
        streamed ``steplog log``). Meaningful right after folding one of those events."""
        return self._tracker.outcome

    def _memory(self) -> MemoryWriteRows:
        return in_memory(self._rows, MemoryWriteRows, "blame")

    def written_keys(self) -> list[str]:
        """Every key ever written, in first-write order."""
        return list(self._memory().by_key)

    def writes(self, key: str) -> list[WriteRecord]:
        """Every write of ``key``, in stream order."""
        return list(self._memory().by_key.get(key, ()))

    def current(self, key: str) -> WriteRecord | None:
        """The write the key's committed value comes from (a ``delete`` if it was deleted; for a
        value a fork started with, its record with ``origin_instance`` set)."""
        at = self._current.get(key)
        if at is None:
            return None
        rows = self._memory()
        return rows.get_forked(at, key) if at == self._forked_at else rows.get(at)

    # -- persistence --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (one document; the materialized view keeps rows instead)."""
        records = self._memory().records()
        return {"writes": [w.model_dump(mode="json") for w in records], **self.tracker_json()}

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> KeyBlame:
        """Rebuild the view from ``to_json()``."""
        return cls.from_rows(tree["writes"], tree)

    def tracker_json(self) -> dict[str, Any]:
        """What the fold needs besides its write records, as a JSON tree (see ``from_rows``): the
        tracker, the key restriction, and the positions of the writes still pending (by
        superstep) and of the write each key's value comes from."""
        return {
            "tracker": self._tracker.to_json(),
            "only": None if self._only is None else sorted(self._only),
            "pending": {sid: list(at) for sid, at in self._pending.items()},
            "current": dict(self._current),
            "forked_at": self._forked_at,
        }

    @classmethod
    def from_rows(cls, writes: Iterable[dict[str, Any]], tracker: dict[str, Any]) -> KeyBlame:
        """Rebuild the view from its write rows (``WriteRecord`` JSON, any order) and
        ``tracker_json()``."""
        rows = MemoryWriteRows()
        for record in sorted((WriteRecord.model_validate(raw) for raw in writes), key=_position):
            rows.add(record)
        return cls(tracker["only"], rows=rows, tracker=tracker)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyBlame):
            return NotImplemented
        return self._memory().by_key == other._memory().by_key

    def __repr__(self) -> str:
        rows = self._rows
        if isinstance(rows, MemoryWriteRows):
            return f"KeyBlame(keys={len(rows.by_key)})"
        return f"KeyBlame(rows={type(rows).__name__})"


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
    return view.apply_all(events)
