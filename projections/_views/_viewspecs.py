"""How a pure fold becomes a materialized view: load its per-instance state, fold, save.

A ``ViewSpec`` folds the events of one instance at a time. ``Projector`` calls ``load`` for each
instance a page touches, ``apply`` for each of its events, then ``save``, all inside the page's
transaction, so the spec itself never does I/O outside that transaction. Before that it asks
``rows_read`` for the keys a page's events will read, and reads them for every instance of the
page at once (``ViewTx.prefetch``): on SQLite and PostgreSQL, one statement instead of one each.

``state`` keeps one JSON document per instance under the key ``"view"``: the kernel's committed
state (``CommittedState.to_snapshot()``). ``history`` and ``blame`` grow with an instance's
history, so they keep rows, and a page loads and rewrites only the rows its events touch:

``history``
    ``r:<run id>`` per run and ``s:<superstep id>`` per superstep (``RunRecord.to_row()``,
    ``SuperstepRecord.to_row()``), and ``t``: the tracker (``RunHistory.tracker_json()``). A
    fork's ``InstanceForked`` also writes a row under its *origin* instance, ``k:<fork id>``
    (``ForkRecord.to_row()``): that is how the origin's history lists its forks.
``blame``
    ``w:<position>`` per write (``WriteRecord`` JSON, position zero-padded to 12 digits; a value a
    fork started with: ``w:<position of the fork event>/<key>``), and
    ``t``: the tracker (``KeyBlame.tracker_json()``: with the positions of the writes still
    pending, by superstep, and of the write each key's value comes from).
``keyindex``
    where each key's writes are, and the positions of the supersteps' starts and markers, the
    runs' ends and the fork that their verdicts depend on (``projections._folds._keyindex``): what
    ``blame_keys`` reads to fold only those events. It holds positions, never verdicts.

Every view table also holds, per instance, a manifest row ``#`` (``projections._views._manifest``),
written by ``Projector`` with each page: the log its rows reflect, and their count and digest.

The folds do no I/O: a page hands each one a row sink (``HistoryRows``, ``WriteRows``) that loads
the rows the page touches through the page's transaction and writes them back at ``save``.

The tracker row holds the committed-state fold: the committed values, the markers of the runs
still going, and the ids of the runs that have ended (so it grows with the number of runs).

A view whose rows change shape gets a new ``version``: its table is then a new one
(``steplog_view_<name>_v<version>``), which the next catch-up folds from the start of the log, so
rows written by an older version are never read as the new shape. The old table is left as it was
(drop it by hand once nothing older reads it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from kernel import CommittedState, EventBase, InstanceForked, LogIntegrityError
from projections._folds._blame import KeyBlame, WriteRecord
from projections._folds._history import (
    ForkRecord,
    RunHistory,
    RunRecord,
    SuperstepRecord,
    fork_record,
)
from projections._folds._keyindex import KeyIndexFold
from projections._views._backends import ViewTx

__all__ = ["BlameView", "DocumentView", "HistoryView", "KeyIndexView", "StateView", "ViewSpec"]

DOC_KEY = "view"
TRACKER_KEY = "t"
T = TypeVar("T")


class ViewSpec(ABC):
    """A materialized view: its ``name`` and how to fold events into its rows."""

    name: ClassVar[str]
    event_types: ClassVar[frozenset[str]] = frozenset()
    """The event types the view folds; empty for all. Catch-up reads only these."""
    version: ClassVar[int] = 1
    """The shape of the view's rows: a new version is a new table, folded from the start."""

    @property
    def table(self) -> str:
        """The view's table (``steplog_view_<name>``, with ``_v<version>`` after version 1)."""
        suffix = "" if self.version == 1 else f"_v{self.version}"
        return f"steplog_view_{self.name}{suffix}"

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        """The keys of ``instance_id``'s rows that ``load`` and folding ``events`` will likely
        read. ``Projector`` reads them for every instance of a page in one statement first
        (``ViewTx.prefetch``). A hint only, never an answer: a key left out is read when it is
        asked for (one more round trip), and a key never asked for costs only its fetch."""
        del instance_id, events
        return ()

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

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        return (DOC_KEY,)

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
    version = 2  # 2: rows carry a manifest (``projections._views._manifest``)

    def new(self) -> CommittedState:
        return CommittedState()

    def from_json(self, doc: Any) -> CommittedState:
        return CommittedState.from_snapshot(doc)

    def to_json(self, state: Any) -> Any:
        return state.to_snapshot()


class _Rows:
    """The rows of one instance in a view table, read through a transaction and cached: what a
    page's fold loads, changes in place, and ``save()`` writes back."""

    __slots__ = ("_instance", "_missing", "_table", "_tx", "loaded")

    def __init__(self, tx: ViewTx, table: str, instance_id: str) -> None:
        self._tx = tx
        self._table = table
        self._instance = instance_id
        self._missing: set[str] = set()
        self.loaded: dict[str, Any] = {}

    def row(self, key: str) -> Any:
        """The JSON row under ``key`` (None if there is none)."""
        if key in self._missing:
            return None
        row = self._tx.get(self._table, self._instance, key)
        if row is None:
            self._missing.add(key)
        return row

    def record(self, key: str, from_row: Callable[[Any], Any]) -> Any:
        """The record under ``key``, made from its row by ``from_row`` once (None if no row)."""
        record = self.loaded.get(key)
        if record is None:
            row = self.row(key)
            if row is not None:
                record = self.loaded[key] = from_row(row)
        return record

    def put(self, key: str, record: Any) -> None:
        """Cache ``record`` under ``key``: ``save()`` writes its row."""
        self.loaded[key] = record
        self._missing.discard(key)

    @staticmethod
    def encode(record: Any) -> Any:
        """The JSON row of ``record``."""
        return record.to_row()

    def save(self, tracker: dict[str, Any]) -> None:
        """Write the row of every record loaded or added, and ``tracker``."""
        tx, table, instance_id = self._tx, self._table, self._instance
        for key, record in self.loaded.items():
            tx.put(table, instance_id, key, self.encode(record))
        tx.put(table, instance_id, TRACKER_KEY, tracker)


@dataclass(slots=True)
class _Paged:
    """A fold over rows of a view table, while a page is folded."""

    fold: RunHistory | KeyBlame
    rows: _Rows

    def apply(self, event: EventBase) -> _Paged:
        self.fold.apply(event)
        return self

    def save(self) -> None:
        self.rows.save(self.fold.tracker_json())


class _HistoryRows(_Rows):
    """``HistoryRows`` over a view table: ``r:<run id>`` and ``s:<superstep id>`` rows, and the
    ``k:<fork id>`` rows this instance's fork event writes under its origin."""

    __slots__ = ("forks",)

    def __init__(self, tx: ViewTx, table: str, instance_id: str) -> None:
        super().__init__(tx, table, instance_id)
        self.forks: list[ForkRecord] = []

    def save(self, tracker: dict[str, Any]) -> None:
        super().save(tracker)
        for fork in self.forks:
            self._tx.put(self._table, fork.origin_instance, f"k:{fork.instance_id}", fork.to_row())
        self.forks = []

    def run(self, run_id: str) -> RunRecord | None:
        run: RunRecord | None = self.record(f"r:{run_id}", RunRecord.from_row)
        return run

    def step(self, superstep_id: str) -> SuperstepRecord | None:
        step: SuperstepRecord | None = self.record(f"s:{superstep_id}", SuperstepRecord.from_row)
        return step

    def add_run(self, record: RunRecord) -> None:
        self.put(f"r:{record.run_id}", record)

    def add_step(self, record: SuperstepRecord) -> None:
        self.put(f"s:{record.superstep_id}", record)


class _WriteRows(_Rows):
    """``WriteRows`` over a view table: ``w:<position>`` rows."""

    __slots__ = ()

    @staticmethod
    def encode(record: Any) -> Any:
        return record.model_dump(mode="json")

    def add(self, record: WriteRecord) -> None:
        if record.from_fork:
            self.put(fork_write_key(record.position, record.key), record)
        else:
            self.put(write_key(record.position), record)

    def get(self, position: int) -> WriteRecord:
        return self._get(write_key(position))

    def get_forked(self, position: int, key: str) -> WriteRecord:
        return self._get(fork_write_key(position, key))

    def _get(self, key: str) -> WriteRecord:
        record: WriteRecord | None = self.record(key, WriteRecord.model_validate)
        if record is None:
            raise LogIntegrityError(f"blame row {key} is missing from {self._table}")
        return record


def write_key(position: int) -> str:
    """The row key of the blame write at stream ``position``."""
    return f"w:{position:012d}"


def fork_write_key(position: int, key: str) -> str:
    """The row key of ``key``'s value in the fork event at stream ``position``."""
    return f"{write_key(position)}/{key}"


class _RowsView(ViewSpec):
    """A view kept as rows: ``load`` returns a ``_Paged`` fold, which saves its own rows."""

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        state.save()


def _read(
    docs: dict[str, Any], empty: Callable[[], T], from_rows: Callable[..., T], *prefixes: str
) -> T:
    """The fold of one instance's rows ``docs``: ``from_rows`` of the rows under each key prefix
    (in ``prefixes`` order) and the tracker, or ``empty()`` when there is no tracker row."""
    tracker = docs.get(TRACKER_KEY)
    if tracker is None:
        return empty()
    rows = ([doc for key, doc in docs.items() if key.startswith(prefix)] for prefix in prefixes)
    return from_rows(*rows, tracker)


class HistoryView(_RowsView):
    """Run history per instance (``RunHistory``), one row per run and per superstep; a fork's
    record is also kept under its origin (``k:<fork id>``), so the origin lists its forks.

    Version 2: runs gained lineage and requests, supersteps their requests, and forks their rows.
    Version 3: rows carry a manifest (``_views._manifest``), and a run continued by another
    says so (``continued_by``; no longer ``awaiting_input``).
    """

    name = "history"
    event_types = RunHistory.EVENT_TYPES
    version = 3

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        keys = {TRACKER_KEY}
        for event in events:
            for run_id in (getattr(event, "run_id", None), getattr(event, "continues", None)):
                if isinstance(run_id, str):
                    keys.add(f"r:{run_id}")
            superstep_id = getattr(event, "superstep_id", None)
            if isinstance(superstep_id, str):
                keys.add(f"s:{superstep_id}")
        return keys

    def load(self, tx: ViewTx, table: str, instance_id: str) -> _Paged:
        rows = _HistoryRows(tx, table, instance_id)
        return _Paged(RunHistory(rows, tracker=tx.get(table, instance_id, TRACKER_KEY)), rows)

    def apply(self, state: Any, event: EventBase) -> Any:
        if event.type == "instance_forked":
            assert isinstance(event, InstanceForked)
            paged: _Paged = state
            assert isinstance(paged.rows, _HistoryRows)
            paged.rows.forks.append(fork_record(event))
        return state.apply(event)

    @staticmethod
    def read(docs: dict[str, Any]) -> RunHistory:
        """The ``RunHistory`` of one instance from its rows (``ViewBackend.documents``), with
        the forks recorded under it."""
        forks = [ForkRecord.from_row(doc) for key, doc in docs.items() if key.startswith("k:")]
        if TRACKER_KEY not in docs:
            return RunHistory(forks=forks)  # an origin known only through its forks

        def from_rows(runs: Any, steps: Any, tracker: dict[str, Any]) -> RunHistory:
            return RunHistory.from_rows(runs, steps, tracker, forks=forks)

        return _read(docs, RunHistory, from_rows, "r:", "s:")


class BlameView(_RowsView):
    """Key provenance per instance (``KeyBlame``), one row per write."""

    name = "blame"
    event_types = KeyBlame.EVENT_TYPES
    version = 2  # 2: rows carry a manifest (``projections._views._manifest``)
    write_key = staticmethod(write_key)

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        # The writes a marker settles were staged in the same page, mostly: put, never read.
        return (TRACKER_KEY,)

    def load(self, tx: ViewTx, table: str, instance_id: str) -> _Paged:
        rows = _WriteRows(tx, table, instance_id)
        return _Paged(KeyBlame(rows=rows, tracker=tx.get(table, instance_id, TRACKER_KEY)), rows)

    @staticmethod
    def read(docs: dict[str, Any]) -> KeyBlame:
        """The ``KeyBlame`` of one instance from its rows (``ViewBackend.documents``)."""
        return _read(docs, KeyBlame, KeyBlame.from_rows, "w:")


class KeyIndexView(ViewSpec):
    """Where each key's writes are, per instance (``KeyIndexFold``): positions only, so that
    ``blame_keys`` folds a key's writes and what they depend on instead of the whole log."""

    name = "keyindex"
    event_types = KeyIndexFold.EVENT_TYPES
    version = 2  # 2: rows carry a manifest (``projections._views._manifest``)

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        return KeyIndexFold.rows_read(events)

    def load(self, tx: ViewTx, table: str, instance_id: str) -> KeyIndexFold:
        return KeyIndexFold(lambda key: tx.get(table, instance_id, key))

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        fold: KeyIndexFold = state
        for key, row in fold.flush().items():
            tx.put(table, instance_id, key, row)
