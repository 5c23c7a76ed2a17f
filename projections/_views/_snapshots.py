"""Snapshots of committed state, and time travel that starts from them.

``SnapshotView`` is a materialized view (maintained by ``Projector`` like any other). Per instance
it stores, under sortable keys of one indexed table:

``p:<position>``
    the kernel fold's whole state (``CommittedState.to_snapshot()``, pending writes included) after
    the marker that ended every ``every``-th superstep, with the latest timestamp seen so far;
``t:<timestamp>|<position>``
    the same snapshot's position, by the latest timestamp of the events it covers;
``s:<superstep id>`` and ``r:<run id>|<index>``
    where each superstep started and where its first marker is.

``TimeTravel(store)`` answers ``state(instance_id, point)`` by finding the nearest snapshot at or
before the point (one indexed lookup) and folding only the tail after it, read with
``store.read(instance_id, after=..., upto=...)`` in bounded pages. A snapshot is a cache: with no
snapshots (or ``snapshots=False``) the same answer comes from folding the log from the start.

Example::

    travel = TimeTravel(store)
    print(travel.state("order-42", AtTime(datetime(2025, 1, 1, tzinfo=UTC))).decoded())
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Self

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    CommittedState,
    EventBase,
    EventStore,
    Fold,
    ProjectionError,
    RunEvent,
    SuperstepEvent,
    SuperstepStarted,
    folds,
)
from projections._folds._timetravel import (
    AtPosition,
    AtSuperstep,
    AtTime,
    Locator,
    Point,
    StateAt,
)
from projections._views._backend_for import backend_for
from projections._views._backends import ViewBackend, ViewTx
from projections._views._manifest import MANIFEST_KEY, check_anchor, check_count, check_written_at
from projections._views._viewspecs import ViewSpec

__all__ = ["SnapshotView", "TimeTravel"]

FOLD_KEY = "fold"


def time_key(moment: datetime) -> str:
    """A timestamp as fixed-width UTC text, so that text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


class _SnapshotFold(Fold):
    """The per-instance state of ``SnapshotView`` while a page is folded: the committed-state
    fold, the latest timestamp seen, the supersteps still open, and the rows to write (``out``)."""

    __slots__ = ("at", "every", "max_ts", "open", "out", "since", "state")

    def __init__(self, doc: dict[str, Any] | None, every: int) -> None:
        self.every = every
        self.out: dict[str, Any] = {}
        if doc is None:
            self.state = CommittedState()
            self.since = 0
            self.max_ts: str | None = None
            self.open: dict[str, dict[str, Any]] = {}
            self.at = 0
        else:
            self.state = CommittedState.from_snapshot(doc["state"])
            self.since = int(doc["since"])
            self.max_ts = doc["max_ts"]
            self.open = doc["open"]
            self.at = int(doc["at"])

    def apply(self, event: EventBase) -> Self:
        """Fold any event in: every event moves the committed state and the latest timestamp."""
        self.state.apply(event)
        self.at = max(self.at, event.position)
        stamp = time_key(event.timestamp)
        if self.max_ts is None or stamp > self.max_ts:
            self.max_ts = stamp
        return super().apply(event)

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        if event.superstep_id in self.open:
            return
        entry = {"run_id": event.run_id, "index": event.index, "start": event.position}
        entry["marker"] = None  # the position of its first marker, once there is one
        self.open[event.superstep_id] = entry
        self.out[f"s:{event.superstep_id}"] = entry
        self.out[f"r:{event.run_id}|{event.index:09d}"] = event.superstep_id

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marked(self, event: SuperstepEvent) -> None:
        superstep_id = event.superstep_id
        opened = self.open.pop(superstep_id, None)
        if opened is not None:
            self.out[f"s:{superstep_id}"] = {**opened, "marker": event.position}
        self.since += 1
        if self.since >= self.every:
            self.since = 0
            key = f"{event.position:012d}"
            self.out[f"p:{key}"] = {"state": self.state.to_snapshot(), "max_ts": self.max_ts}
            self.out[f"t:{self.max_ts}|{key}"] = event.position

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        run_id = event.run_id
        for sid in [s for s, entry in self.open.items() if entry["run_id"] == run_id]:
            del self.open[sid]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.to_snapshot(),
            "since": self.since,
            "max_ts": self.max_ts,
            "open": self.open,
            "at": self.at,
        }


class SnapshotView(ViewSpec):
    """Snapshots of committed state every ``every`` supersteps, and a superstep index."""

    name = "snapshots"
    version = 2  # 2: rows carry a manifest (``projections._views._manifest``)

    def __init__(self, every: int = 50) -> None:
        if every < 1:
            raise ProjectionError(f"SnapshotView(every=...) must be >= 1, got {every}")
        self.every = every

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        return (FOLD_KEY,)

    def load(self, tx: ViewTx, table: str, instance_id: str) -> _SnapshotFold:
        fold = _SnapshotFold(tx.get(table, instance_id, FOLD_KEY), self.every)
        # Every later snapshot is folded on from this state: it must be the current one.
        check_written_at(
            "snapshots", instance_id, tx.get(table, instance_id, MANIFEST_KEY), fold.at
        )
        return fold

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        fold: _SnapshotFold = state
        for key, doc in fold.out.items():
            tx.put(table, instance_id, key, doc)
        fold.out = {}
        tx.put(table, instance_id, FOLD_KEY, fold.to_json())


class TimeTravel:
    """Committed state at any point of an instance, read from ``store`` (see the module docstring).

    ``snapshots=False`` ignores snapshots; ``backend`` and ``table`` locate them (by default the
    store's own database and ``SnapshotView``'s table). ``page_size`` bounds each tail read.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        snapshots: bool = True,
        backend: ViewBackend | None = None,
        table: str | None = None,
        page_size: int = 256,
    ) -> None:
        self._store = store
        self._backend = (backend or backend_for(store)) if snapshots else None
        self._table = table or SnapshotView().table
        self._page_size = page_size
        if self._backend is not None:
            self._backend.ensure(self._table)

    def state(self, instance_id: str, point: Point) -> StateAt:
        """The state of ``instance_id`` at ``point``; raises ``ProjectionError`` for an unknown
        superstep."""
        start, locator, position_for = self._plan(instance_id, point)
        if position_for is not None:
            # The superstep's marker position is known: fold exactly up to it.
            result = self._fold(instance_id, start, Locator(AtPosition(position_for)))
            assert isinstance(point, AtSuperstep)
            return replace(
                result,
                point=point,
                label=f"committed state after superstep {locator.superstep_id} "
                f"(position {result.position})",
                superstep_id=locator.superstep_id,
                run_id=locator.run_id,
            )
        return self._fold(instance_id, start, locator)

    def _plan(
        self, instance_id: str, point: Point
    ) -> tuple[CommittedState | None, Locator, int | None]:
        """The snapshot to start from, the locator to scan with, and a known marker position."""
        locator = Locator(point)
        if self._backend is None:
            return None, locator, None
        self._check(instance_id)
        if isinstance(point, AtPosition):
            return self._snapshot_upto(instance_id, point.position), locator, None
        if isinstance(point, AtTime):
            return self._snapshot_by_time(instance_id, point.when), locator, None
        superstep_id = point.superstep_id
        if superstep_id is None:
            assert isinstance(point, AtSuperstep)
            found = self._get(instance_id, f"r:{point.run_id}|{point.index:09d}")
            if found is None:
                return None, locator, None
            superstep_id = str(found)
        entry = self._get(instance_id, f"s:{superstep_id}")
        if entry is None:
            return None, locator, None
        hinted = Locator(point, superstep_id=superstep_id, run_id=entry["run_id"])
        marker: int | None = entry["marker"]
        if isinstance(point, AtSuperstep):
            if marker is None:
                return None, hinted, None  # not closed (as far as the index knows): scan
            return self._snapshot_upto(instance_id, marker), hinted, marker
        bound = entry["start"] if marker is None else marker - 1
        return self._snapshot_upto(instance_id, bound), hinted, None

    def _check(self, instance_id: str) -> None:
        """Check the instance's snapshot rows against their manifest by counting them (a row
        deleted or added) and the event it was folded up to against the log (a log cut or
        rewritten since): ``LogIntegrityError`` when they no longer match. Each snapshot row is
        written once (sealed, on a store with keys, to its place); an older copy of a
        superstep's row only makes the answer fold more of the log."""
        assert self._backend is not None
        manifest = self._get(instance_id, MANIFEST_KEY)
        check_count(self._backend, self._table, "snapshots", instance_id, manifest)
        check_anchor(self._store, "snapshots", instance_id, manifest)

    def _get(self, instance_id: str, key: str) -> Any:
        assert self._backend is not None
        return self._backend.get(self._table, instance_id, key)

    def _snapshot_upto(self, instance_id: str, position: int) -> CommittedState | None:
        assert self._backend is not None
        found = self._backend.floor(self._table, instance_id, "p:", f"p:{position:012d}")
        return None if found is None else CommittedState.from_snapshot(found[1]["state"])

    def _snapshot_by_time(self, instance_id: str, when: datetime) -> CommittedState | None:
        assert self._backend is not None
        found = self._backend.floor(self._table, instance_id, "t:", f"t:{time_key(when)}|~")
        if found is None:
            return None
        return self._snapshot_upto(instance_id, int(found[1]))

    def _fold(self, instance_id: str, start: CommittedState | None, locator: Locator) -> StateAt:
        state = CommittedState() if start is None else start
        after = state.position
        upto = locator.point.position if isinstance(locator.point, AtPosition) else None
        while not locator.done:
            page = self._store.read(instance_id, after=after, upto=upto, limit=self._page_size)
            for event in page:
                if not locator.accept(event):
                    break
                state.apply(event)
                if locator.done:
                    break
            if len(page) < self._page_size:
                break
            after = page[-1].position
        return locator.result(state, instance_id)
