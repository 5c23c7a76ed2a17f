"""Time travel: the committed state of an instance at a point of its log, as a pure fold.

A point is one of:

``AtPosition(position)``
    after the event at that stream position (0 is the empty state).
``AtSuperstep(superstep_id)`` or ``AtSuperstep(run_id=..., index=k)``
    just after the superstep's marker: its writes are in if it committed, not if it aborted.
``AtTime(when)``
    after the last event stamped at or before ``when`` (the stream's prefix up to the first event
    stamped later; the kernel stamps a stream's events in order).
``InsideSuperstep(superstep_id)``
    what an executor of that superstep saw: the committed state before its marker plus the writes
    it had staged. For an aborted superstep this is a state that never was committed, and the
    result says so (``inside=True``, ``label``).

``state_at(events, point)`` folds a list of one instance's events with the kernel's fold
(``kernel.CommittedState``). ``projections.TimeTravel`` answers the same questions from a
store, starting from a snapshot when one is available.

Example::

    events = store.read("order-42")
    before = state_at(events, AtSuperstep(run_id="run-2", index=3))
    seen = state_at(events, InsideSuperstep("step-17"))
    print(seen.label, seen.decoded())
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    CommittedState,
    EventBase,
    Fold,
    ProjectionError,
    RunEvent,
    SuperstepAborted,
    SuperstepEvent,
    SuperstepStarted,
    ValueCodec,
    folds,
)

__all__ = [
    "AtPosition",
    "AtSuperstep",
    "AtTime",
    "InsideSuperstep",
    "Locator",
    "Point",
    "StateAt",
    "state_at",
]


@dataclass(frozen=True, slots=True)
class AtPosition:
    """After the event at stream ``position`` (0: before any event)."""

    position: int


@dataclass(frozen=True, slots=True)
class AtSuperstep:
    """Just after a superstep's marker, named by id or by ``run_id`` and ``index``."""

    superstep_id: str | None = None
    run_id: str | None = None
    index: int | None = None

    def __post_init__(self) -> None:
        if (self.superstep_id is None) == (self.run_id is None or self.index is None):
            raise ProjectionError(
                "AtSuperstep takes a superstep_id, or a run_id and an index, not both"
            )


@dataclass(frozen=True, slots=True)
class AtTime:
    """After the last event stamped at or before ``when`` (timezone-aware)."""

    when: datetime

    def __post_init__(self) -> None:
        if self.when.tzinfo is None:
            raise ProjectionError(f"AtTime needs a timezone-aware datetime, got {self.when!r}")


@dataclass(frozen=True, slots=True)
class InsideSuperstep:
    """The state as seen inside a superstep: committed state before it plus its staged writes."""

    superstep_id: str


Point = AtPosition | AtSuperstep | AtTime | InsideSuperstep


@dataclass(frozen=True, slots=True)
class StateAt:
    """The state at a point.

    ``values`` maps keys to wire JSON trees (``decoded()`` rebuilds Python values); ``position``
    is the last stream position folded in. ``inside`` is True for an ``InsideSuperstep`` view, whose
    ``status`` is the superstep's (``committed``, ``aborted: <reason>``, ``open`` or ``unmarked``):
    such a view is not a committed state unless the superstep committed.
    """

    point: Point
    values: dict[str, Any]
    position: int
    label: str
    inside: bool = False
    status: str | None = None
    superstep_id: str | None = None
    run_id: str | None = None
    timestamp: datetime | None = field(default=None, compare=False)

    def decoded(self, codec: ValueCodec | None = None) -> dict[str, Any]:
        """``values`` with every wire tree decoded to its Python value."""
        codec = codec or ValueCodec()
        return {key: codec.decode(tree) for key, tree in self.values.items()}


class Locator(Fold):
    """Decides, event by event, where a point lies in a stream (used by ``state_at``).

    ``accept(event)`` returns True to fold the event in, False to stop before it; ``done`` turns
    True when the point has been passed (the event accepted last was its final one). Hints
    (``superstep_id``, ``run_id``) let a scan that starts after a snapshot find a superstep whose
    start it will not see.
    """

    def __init__(
        self, point: Point, *, superstep_id: str | None = None, run_id: str | None = None
    ) -> None:
        self.point = point
        self.done = False
        self.found = False
        self.superstep_id = superstep_id
        self.run_id = run_id
        self.stop_event: EventBase | None = None
        self.last = 0  # the position of the last event accepted
        self._accepted = True
        if isinstance(point, AtSuperstep | InsideSuperstep) and point.superstep_id is not None:
            self.superstep_id = point.superstep_id
        if isinstance(point, AtSuperstep) and point.run_id is not None:
            self.run_id = point.run_id

    def accept(self, event: EventBase) -> bool:
        """Whether to fold ``event`` in (False: stop before it)."""
        accepted = self._accept(event)
        if accepted:
            self.last = event.position
        return accepted

    def _accept(self, event: EventBase) -> bool:
        point = self.point
        if isinstance(point, AtPosition):
            if event.position > point.position:
                self.done = True
                return False
            return True
        if isinstance(point, AtTime):
            if event.timestamp > point.when:
                self.done = True
                return False
            return True
        self._accepted = True
        self.apply(event)
        return self._accepted

    def _stop(self, event: EventBase, *, accept: bool) -> None:
        self.found = True
        self.stop_event = event
        self.done = True
        self._accepted = accept

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marker(self, event: SuperstepEvent) -> None:
        if event.superstep_id == self.superstep_id:
            self._stop(event, accept=isinstance(self.point, AtSuperstep))

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        if (
            isinstance(self.point, InsideSuperstep)
            and self.run_id is not None
            and event.run_id == self.run_id
        ):
            self._stop(event, accept=False)

    @folds("superstep_started")
    def _learn(self, event: SuperstepStarted) -> None:
        point = self.point
        if isinstance(point, AtSuperstep) and point.superstep_id is None:
            if event.run_id == point.run_id and event.index == point.index:
                self.superstep_id = event.superstep_id
        elif event.superstep_id == self.superstep_id:
            self.run_id = event.run_id

    def result(self, state: CommittedState, instance_id: str) -> StateAt:
        """The answer once the scan has stopped (or the events ran out)."""
        point = self.point
        last = max(state.position, self.last)

        def committed(
            where: str, superstep_id: str | None = None, run_id: str | None = None
        ) -> StateAt:
            return StateAt(
                point,
                dict(state.values),
                last,
                f"committed state {where}",
                superstep_id=superstep_id,
                run_id=run_id,
            )

        if isinstance(point, AtPosition):
            return committed(f"at position {last}")
        if isinstance(point, AtTime):
            return committed(f"at {point.when.isoformat()} (position {last})")
        if self.superstep_id is None or (isinstance(point, AtSuperstep) and not self.found):
            raise ProjectionError(
                f"instance {instance_id!r} has no marker for superstep {_name(point)}: it is "
                "unknown or still open (use InsideSuperstep to see an open superstep)"
            )
        if isinstance(point, AtSuperstep):
            where = f"after superstep {self.superstep_id} (position {last})"
            return committed(where, self.superstep_id, self.run_id)
        if self.run_id is None:
            raise ProjectionError(
                f"instance {instance_id!r} has no superstep {point.superstep_id!r}"
            )
        status = self._status()
        staged = len(state.staged(self.superstep_id))
        return StateAt(
            point,
            state.overlay(self.superstep_id),
            last,
            f"inside superstep {self.superstep_id} ({status}): committed state at position "
            f"{last} plus the {staged} write(s) it staged; not a committed state"
            + ("" if status == "committed" else " and never was"),
            inside=True,
            status=status,
            superstep_id=self.superstep_id,
            run_id=self.run_id,
        )

    def _status(self) -> str:
        stop = self.stop_event
        if stop is None:
            return "open"
        if isinstance(stop, SuperstepAborted):
            return f"aborted: {stop.reason}"
        if stop.type == "superstep_committed":
            return "committed"
        return "unmarked"


def _name(point: Point) -> str:
    if isinstance(point, AtSuperstep) and point.superstep_id is None:
        return f"{point.index} of run {point.run_id!r}"
    return repr(getattr(point, "superstep_id", None))


def state_at(
    events: Iterable[EventBase], point: Point, *, start: CommittedState | None = None
) -> StateAt:
    """The state of one instance at ``point``, folding ``events`` (in stream order).

    ``start`` is a fold state to continue from (a snapshot): ``events`` are then the ones after it.
    Raises ``ProjectionError`` when the point names a superstep the events do not close.
    """
    state = CommittedState() if start is None else start.copy()
    locator = Locator(point)
    instance_id = ""
    for event in events:
        instance_id = event.instance_id
        if not locator.accept(event):
            break
        state.apply(event)
        if locator.done:
            break
    return locator.result(state, instance_id)
