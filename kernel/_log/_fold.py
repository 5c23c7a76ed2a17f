"""Committed state as a pure fold of an instance's events: the only way it is ever computed.

The rule: a ``StateStaged`` write counts if and only if it was staged before its superstep's
``SuperstepCommitted`` marker, and that superstep was not aborted first. Writes of a superstep that
is aborted, or that never gets a marker, or that arrive after the superstep's marker, never count.
The order in which runs interleave does not matter: writes are grouped by superstep id, which is
unique across all runs, so one run's commit can never pick up another superstep's writes.

``apply(view, event)`` does no I/O and reads no clock. It returns the updated view (it updates the
view in place: a view belongs to one folder at a time; use ``copy()`` to branch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Self, TypeVar

from kernel._log._events import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    InstanceForked,
    RunEvent,
    RunStarted,
    StateStaged,
    SuperstepEvent,
    SuperstepStarted,
)

__all__ = [
    "CommittedState",
    "Fold",
    "OpenRun",
    "SuperstepFold",
    "apply_committed",
    "fold_committed",
    "folds",
]

F = TypeVar("F", bound=Callable[..., object])


def folds(*types: str) -> Callable[[F], F]:
    """Mark a method of a ``Fold`` as the one that applies events of ``types``."""

    def mark(method: F) -> F:
        method.__steplog_folds__ = types  # type: ignore[attr-defined]
        return method

    return mark


class Fold:
    """Base of the pure folds: ``apply(event)`` hands the event to the method marked for its type.

    Subclasses mark one method per event type with ``@folds("state_staged", ...)``; events of
    other types are ignored. ``EVENT_TYPES`` is the set of types some method applies, so reading
    only those types from a store gives the same view as reading everything. Every fold in the
    kernel and in ``projections`` dispatches this way. ``apply`` ignores what a marked method
    returns: a public one may answer a caller that hands it an event of its type directly.
    """

    __slots__ = ()

    EVENT_TYPES: ClassVar[frozenset[str]] = frozenset()
    _DISPATCH: ClassVar[dict[str, Callable[[Any, Any], object]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names: dict[str, str] = {}  # event type -> name of the method marked for it
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                for kind in getattr(member, "__steplog_folds__", ()):
                    names[kind] = name
        # Resolved by name on this class, so a subclass that overrides a marked method (without
        # marking it again) has its own method called.
        cls._DISPATCH = {kind: getattr(cls, name) for kind, name in names.items()}
        cls.EVENT_TYPES = frozenset(names)

    def apply(self, event: EventBase) -> Self:
        """Fold one event in; return the fold (updated in place)."""
        method = self._DISPATCH.get(event.type)
        if method is not None:
            method(self, event)
        return self

    def apply_all(self, events: Iterable[EventBase]) -> Self:
        """Fold ``events`` (one instance's, in stream order) in; return the fold."""
        dispatch = self._DISPATCH
        for event in events:
            method = dispatch.get(event.type)
            if method is not None:
                method(self, event)
        return self


class SuperstepFold(Fold):
    """The marker rule, in one place, for every fold that cares what a superstep staged.

    Subclasses hand what a superstep stages to ``_stage``; it is held until the superstep's first
    marker, and ``_decided(marker, committed, items)`` is called then, with the items if it
    committed. Items staged after their superstep's marker, and anything of a run that has ended,
    are inert: they never reach ``_decided``. ``position`` is the stream position of the last event
    of ``EVENT_TYPES`` applied. ``apply_marker`` is the marker's own method, for a caller that
    wants to know what the marker decided (``apply`` does the same and says nothing).
    """

    __slots__ = ("_closed", "_ended_runs", "_pending", "position")

    def __init__(self) -> None:
        self.position = 0
        # What supersteps that have no marker yet staged, by superstep id.
        self._pending: dict[str, list[Any]] = {}
        # Markers seen in runs that have not ended, by run id: superstep id -> committed?
        self._closed: dict[str, dict[str, bool]] = {}
        # Runs that have ended: anything arriving for them later is inert.
        self._ended_runs: set[str] = set()

    def _stage(self, event: SuperstepEvent) -> bool:
        """Hold ``event`` for its superstep's marker; whether it is held (it is inert if not)."""
        # On the hot path of every rebuild: plain comparisons and one dictionary probe each,
        # no max() or setdefault() (each a call, and setdefault builds a list every time).
        position = event.position
        if position > self.position:
            self.position = position
        run_id = event.run_id
        if run_id in self._ended_runs:
            return False
        superstep_id = event.superstep_id
        closed = self._closed.get(run_id)
        if closed is not None and superstep_id in closed:
            return False  # staged after its superstep's marker: never counts
        held = self._pending.get(superstep_id)
        if held is None:
            self._pending[superstep_id] = [event]
        else:
            held.append(event)
        return True

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        position = event.position
        if position > self.position:
            self.position = position
        self._ended_runs.add(event.run_id)
        for superstep_id in self._closed.pop(event.run_id, {}):
            self._pending.pop(superstep_id, None)

    @folds(*SUPERSTEP_MARKER_TYPES)
    def apply_marker(self, event: SuperstepEvent) -> list[Any] | None:
        """Fold a ``SuperstepCommitted`` or ``SuperstepAborted`` in, like ``apply``.

        Returns what its superstep staged (made to count by a commit, inert by an abort) when it
        is the superstep's first marker in a run that has not ended; None when it changes nothing
        (a second marker, or one after its run ended).
        """
        position = event.position
        if position > self.position:
            self.position = position
        run_id = event.run_id
        if run_id in self._ended_runs:
            return None
        superstep_id = event.superstep_id
        closed = self._closed.get(run_id)
        if closed is None:
            closed = self._closed[run_id] = {}
        elif superstep_id in closed:
            return None  # the first marker is final
        committed = event.type == "superstep_committed"
        closed[superstep_id] = committed
        items = self._pending.pop(superstep_id, None)
        if items is None:
            items = []
        self._decided(event, committed, items if committed else [])
        return items

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        """A superstep got its (first) marker; ``items`` is what it staged, if it committed."""

    def _pending_of(self, superstep_id: str) -> list[Any]:
        """What ``superstep_id`` staged that counts if its next marker is a commit (a live list:
        do not change it). Empty once it has a marker or its run has ended."""
        items = self._pending.get(superstep_id)
        if not items or items[0].run_id in self._ended_runs:
            return []
        return items


class CommittedState(SuperstepFold):
    """The committed user state of one workflow instance, as JSON trees (see ``ValueCodec``).

    ``values`` maps keys to their committed wire values; ``position`` is the stream position of
    the last event of ``EVENT_TYPES`` applied (so reading only those types gives an identical
    view); ``last_committed`` the id of the last committed superstep (for a forked instance that
    has committed nothing yet, the origin's superstep it was forked after).
    """

    __slots__ = ("last_committed", "values")

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, Any] = {}
        self.last_committed: str | None = None

    @folds("state_staged")
    def apply_write(self, write: StateStaged) -> bool:
        """Fold a ``StateStaged`` in, like ``apply``; whether it will count if its superstep's
        next marker is a commit (``is_pending(write)`` afterwards)."""
        return self._stage(write)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        if committed:
            values = self.values
            for write in items:  # _apply_writes, inlined: once per superstep of every rebuild
                if write.op == "set":
                    values[write.key] = write.value
                else:
                    values.pop(write.key, None)
            self.last_committed = marker.superstep_id

    @folds("instance_forked")
    def _forked(self, event: InstanceForked) -> None:
        self.position = max(self.position, event.position)
        self.values = dict(event.values)
        self.last_committed = event.checkpoint

    def staged(self, superstep_id: str) -> tuple[StateStaged, ...]:
        """The writes staged in ``superstep_id`` that will count if its next marker is a commit.

        Empty once the superstep has a marker or its run has ended. This is what an executor of an
        open superstep sees on top of ``values``; it reads the view and changes nothing.
        """
        return tuple(self._pending_of(superstep_id))

    def is_pending(self, write: StateStaged) -> bool:
        """Whether ``write`` (folded in) is among the writes that will count if its superstep's
        next marker is a commit: the cheap form of ``write in staged(write.superstep_id)``."""
        writes = self._pending.get(write.superstep_id)
        return writes is not None and writes[-1] is write and write.run_id not in self._ended_runs

    def overlay(self, superstep_id: str) -> dict[str, Any]:
        """What an executor inside ``superstep_id`` sees: the committed values with the
        superstep's staged writes (``staged``) applied in order. The view is not changed."""
        return _apply_writes(dict(self.values), self.staged(superstep_id))

    def to_snapshot(self) -> dict[str, Any]:
        """The whole view, pending writes included, as a JSON tree (see ``from_snapshot``)."""
        return {
            "values": dict(self.values),
            "position": self.position,
            "last_committed": self.last_committed,
            "pending": {
                superstep_id: [write.model_dump(mode="json") for write in writes]
                for superstep_id, writes in self._pending.items()
            },
            "closed": {run_id: dict(markers) for run_id, markers in self._closed.items()},
            "ended_runs": sorted(self._ended_runs),
        }

    @classmethod
    def from_snapshot(cls, tree: dict[str, Any]) -> CommittedState:
        """Rebuild a view from ``to_snapshot()``: folding on from it gives the same answers."""
        view = cls()
        view.values = dict(tree["values"])
        view.position = int(tree["position"])
        view.last_committed = tree["last_committed"]
        view._pending = {
            superstep_id: [StateStaged.model_validate(write) for write in writes]
            for superstep_id, writes in tree["pending"].items()
        }
        view._closed = {run_id: dict(markers) for run_id, markers in tree["closed"].items()}
        view._ended_runs = set(tree["ended_runs"])
        return view

    def copy(self) -> CommittedState:
        """An independent copy (values are shared: JSON trees are never mutated)."""
        other = CommittedState()
        other.values = dict(self.values)
        other.position = self.position
        other.last_committed = self.last_committed
        other._pending = {k: list(v) for k, v in self._pending.items()}
        other._closed = {k: dict(v) for k, v in self._closed.items()}
        other._ended_runs = set(self._ended_runs)
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommittedState):
            return NotImplemented
        return self.values == other.values and self.position == other.position

    def __repr__(self) -> str:
        return f"CommittedState(position={self.position}, keys={sorted(self.values)})"


def _apply_writes(values: dict[str, Any], writes: Iterable[StateStaged]) -> dict[str, Any]:
    """Apply staged writes to ``values`` in order; return ``values``."""
    for write in writes:
        if write.op == "set":
            values[write.key] = write.value
        else:
            values.pop(write.key, None)
    return values


def apply_committed(view: CommittedState, event: EventBase) -> CommittedState:
    """``apply(view, event) -> view`` for committed state."""
    return view.apply(event)


def fold_committed(
    events: Iterable[EventBase], view: CommittedState | None = None
) -> CommittedState:
    """Fold ``events`` (one instance's, in stream order) into committed state."""
    return (CommittedState() if view is None else view).apply_all(events)


class OpenRun(Fold):
    """Which run of an instance is unfinished, and which of its supersteps is open: a pure fold.

    The runner reads it before starting a run, to close a run whose stream was dropped or whose
    process died (``RunAbandoned``) before appending anything of its own. ``version`` is the
    position of the last event seen, of any type. ``requests_may_wait`` is False when no request
    can be waiting for a response (no run yet, or the last run completed), so a run with a new
    message need not look for them in the ledger.
    """

    __slots__ = ("index", "owner", "requests_may_wait", "run_id", "superstep_id", "version")

    def __init__(self) -> None:
        self.version = 0
        self.run_id: str | None = None
        self.owner = ""
        self.superstep_id: str | None = None
        self.index = 0
        self.requests_may_wait = False

    def apply(self, event: EventBase) -> Self:
        self.version = max(self.version, event.position)
        return super().apply(event)

    def apply_all(self, events: Iterable[EventBase]) -> Self:
        for event in events:
            self.apply(event)
        return self

    @folds("run_started")
    def _started(self, event: RunStarted) -> None:
        self.run_id, self.owner = event.run_id, event.owner
        self.superstep_id, self.index = None, 0
        self.requests_may_wait = True

    @folds("instance_forked")
    def _forked(self, event: InstanceForked) -> None:
        self.requests_may_wait = bool(event.requests)

    @folds("superstep_started")
    def _superstep_started(self, event: SuperstepStarted) -> None:
        if event.run_id == self.run_id:
            self.superstep_id, self.index = event.superstep_id, event.index

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marked(self, event: SuperstepEvent) -> None:
        if event.run_id == self.run_id and event.superstep_id == self.superstep_id:
            self.superstep_id = None

    @folds(*RUN_END_TYPES)
    def _ended(self, event: RunEvent) -> None:
        if event.run_id == self.run_id:
            self.run_id, self.owner, self.superstep_id, self.index = None, "", None, 0
            # a run completes only when no request of its lineage is left waiting
            self.requests_may_wait = event.type != "run_completed"
