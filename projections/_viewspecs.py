"""How a pure fold becomes a materialized view: load its per-instance state, fold, save.

A ``ViewSpec`` folds the events of one instance at a time. ``Projector`` calls ``load`` for each
instance a page touches, ``apply`` for each of its events, then ``save``, all inside the page's
transaction, so the spec itself never does I/O outside that transaction.

``state`` keeps one JSON document per instance under the key ``"view"``: the kernel's committed
state (``CommittedState.to_snapshot()``). ``history`` and ``blame`` grow with an instance's
history, so they keep rows, and a page loads and rewrites only the rows its events touch:

``history``
    ``r:<run id>`` per run and ``s:<superstep id>`` per superstep (the fold's records, each with
    its start ordinal ``n``), and ``t``: the tracker (``RunHistory.tracker_json()``).
``blame``
    ``w:<position>`` per write (``WriteRecord`` JSON, position zero-padded to 12 digits), and
    ``t``: the tracker (``KeyBlame.tracker_json()``) plus the positions of the writes still
    pending, by superstep, and of the write each key's value comes from.

The tracker grows with the supersteps of the runs still going (the committed-state fold
remembers their markers), not with the instance's whole history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from kernel._events import EventBase
from kernel._fold import CommittedState
from projections._backends import ViewTx
from projections._blame import KeyBlame, WriteRecord
from projections._history import RunHistory, _Run, _Step

__all__ = ["BlameView", "DocumentView", "HistoryView", "StateView", "ViewSpec"]

DOC_KEY = "view"
TRACKER_KEY = "t"


class ViewSpec(ABC):
    """A materialized view: its ``name`` and how to fold events into its rows."""

    name: ClassVar[str]
    event_types: ClassVar[frozenset[str]] = frozenset()
    """The event types the view folds; empty for all. Catch-up reads only these."""

    @property
    def table(self) -> str:
        """The view's table."""
        return f"steplog_view_{self.name}"

    @abstractmethod
    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        """The fold state of ``instance_id`` stored in ``table`` (a fresh one if none)."""

    @abstractmethod
    def apply(self, state: Any, event: EventBase) -> Any:
        """Fold one event in (pure); return the state."""

    @abstractmethod
    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        """Write the rows of ``instance_id``."""


class DocumentView(ViewSpec):
    """A view kept as one JSON document per instance."""

    @abstractmethod
    def new(self) -> Any:
        """An empty fold state."""

    @abstractmethod
    def from_json(self, doc: Any) -> Any:
        """A fold state from its document."""

    @abstractmethod
    def to_json(self, state: Any) -> Any:
        """The document of a fold state."""

    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        doc = tx.get(table, instance_id, DOC_KEY)
        return self.new() if doc is None else self.from_json(doc)

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        tx.put(table, instance_id, DOC_KEY, self.to_json(state))


class StateView(DocumentView):
    """Committed state per instance, by the kernel's own fold."""

    name = "state"
    event_types = CommittedState.EVENT_TYPES

    def new(self) -> CommittedState:
        return CommittedState()

    def from_json(self, doc: Any) -> CommittedState:
        return CommittedState.from_snapshot(doc)

    def to_json(self, state: Any) -> Any:
        return state.to_snapshot()


class _PagedHistory(RunHistory):
    """A ``RunHistory`` that loads the records a page touches from the view's rows."""

    __slots__ = ("_instance", "_missing", "_table", "_tx")

    def __init__(self, tx: ViewTx, table: str, instance_id: str) -> None:
        super().__init__()
        self._tx = tx
        self._table = table
        self._instance = instance_id
        self._missing: set[str] = set()
        doc = tx.get(table, instance_id, TRACKER_KEY)
        if doc is not None:
            self._load_tracker(doc)

    def _row(self, key: str) -> Any:
        if key in self._missing:
            return None
        row = self._tx.get(self._table, self._instance, key)
        if row is None:
            self._missing.add(key)
        return row

    def _get_run(self, run_id: str) -> _Run | None:
        run = self._runs.get(run_id)
        if run is None:
            row = self._row(f"r:{run_id}")
            if row is not None:
                run = self._runs[run_id] = _Run.from_row(row)
        return run

    def _get_step(self, superstep_id: str) -> _Step | None:
        step = self._steps.get(superstep_id)
        if step is None:
            row = self._row(f"s:{superstep_id}")
            if row is not None:
                step = self._steps[superstep_id] = _Step.from_row(row)
        return step

    def save(self) -> None:
        tx, table, instance_id = self._tx, self._table, self._instance
        for run in self._runs.values():
            tx.put(table, instance_id, f"r:{run.run_id}", run.to_row())
        for step in self._steps.values():
            tx.put(table, instance_id, f"s:{step.superstep_id}", step.to_row())
        tx.put(table, instance_id, TRACKER_KEY, self.tracker_json())


class _RowView(ViewSpec):
    """A view kept as rows by a paged fold (``paged``: loads the rows a page touches, folds,
    and ``save()`` writes them back)."""

    paged: ClassVar[type[_PagedHistory | _PagedBlame]]

    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        return self.paged(tx, table, instance_id)

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        state.save()


class HistoryView(_RowView):
    """Run history per instance (``RunHistory``), one row per run and per superstep."""

    name = "history"
    paged = _PagedHistory

    @staticmethod
    def read(docs: dict[str, Any]) -> RunHistory:
        """The ``RunHistory`` of one instance from its rows (``ViewBackend.documents``)."""
        tracker = docs.get(TRACKER_KEY)
        if tracker is None:
            return RunHistory()
        runs = [doc for key, doc in docs.items() if key.startswith("r:")]
        steps = [doc for key, doc in docs.items() if key.startswith("s:")]
        return RunHistory.from_rows(runs, steps, tracker)


class _PagedBlame(KeyBlame):
    """A ``KeyBlame`` that loads the write records a page touches from the view's rows."""

    __slots__ = ("_current_at", "_instance", "_page", "_pending_at", "_table", "_tx")

    def __init__(self, tx: ViewTx, table: str, instance_id: str) -> None:
        super().__init__()
        self._tx = tx
        self._table = table
        self._instance = instance_id
        self._page: dict[int, WriteRecord] = {}
        self._pending_at: dict[str, list[int]] = {}
        self._current_at: dict[str, int] = {}
        doc = tx.get(table, instance_id, TRACKER_KEY)
        if doc is not None:
            restored = KeyBlame.from_rows((), doc)
            self._tracker = restored._tracker
            self._pending_at = {sid: list(at) for sid, at in doc["pending"].items()}
            self._current_at = dict(doc["current"])

    def _record(self, position: int) -> WriteRecord:
        record = self._page.get(position)
        if record is None:
            row = self._tx.get(self._table, self._instance, write_key(position))
            assert row is not None, f"blame row {position} missing"
            record = self._page[position] = WriteRecord.model_validate(row)
        return record

    def _add(self, record: WriteRecord) -> None:
        self._page[record.position] = record
        if record.status == "pending":
            self._pending_at.setdefault(record.superstep_id, []).append(record.position)

    def _take_pending(self, superstep_id: str) -> dict[int, WriteRecord]:
        return {at: self._record(at) for at in self._pending_at.pop(superstep_id, ())}

    def _current_of(self, key: str) -> WriteRecord | None:
        at = self._current_at.get(key)
        return None if at is None else self._record(at)

    def _set_current(self, record: WriteRecord) -> None:
        self._current_at[record.key] = record.position

    def save(self) -> None:
        tx, table, instance_id = self._tx, self._table, self._instance
        for position, record in self._page.items():
            tx.put(table, instance_id, write_key(position), record.model_dump(mode="json"))
        tracker = {**self.tracker_json(), "pending": self._pending_at, "current": self._current_at}
        tx.put(table, instance_id, TRACKER_KEY, tracker)


def write_key(position: int) -> str:
    """The row key of the blame write at stream ``position``."""
    return f"w:{position:012d}"


class BlameView(_RowView):
    """Key provenance per instance (``KeyBlame``), one row per write."""

    name = "blame"
    paged = _PagedBlame

    @staticmethod
    def read(docs: dict[str, Any]) -> KeyBlame:
        """The ``KeyBlame`` of one instance from its rows (``ViewBackend.documents``)."""
        tracker = docs.get(TRACKER_KEY)
        if tracker is None:
            return KeyBlame()
        writes = [doc for key, doc in docs.items() if key.startswith("w:")]
        return KeyBlame.from_rows(writes, tracker)
