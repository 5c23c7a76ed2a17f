"""Replay: the ``WorkflowEvent`` stream of a past run, rebuilt from the log without running it.

A streaming consumer of a run sees ``started``; per superstep ``superstep_started``, then
``executor_invoked`` / ``executor_completed`` as executors run; for a committed superstep its
``output`` and ``request_info`` events and ``superstep_completed``; and at the end ``completed``
or ``awaiting_input``, or (a failure) ``executor_failed`` and ``failed``. The runner appends each
event's fact to the log (``self.log``) right before it hands the event over, and decides every
other event from facts it has just logged, so the log says what the consumer got. ``replay``
reads it back in that order, decoding values with the store's codec.

What the log cannot say: when a run was cancelled, abandoned or crashed, its consumer saw no end
event (a cancelled consumer may also have stopped reading one or two events before the last one
replay yields); a run that failed outside a handler (the store, say) ended its stream with the
exception itself, not with a ``failed`` event. Replay yields what the run emitted and ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from kernel._emit import WorkflowEvent
from kernel._errors import ExecutionError, StepLogError
from kernel._events import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    ErrorInfo,
    EventBase,
    ExecutorCompleted,
    ExecutorInvoked,
    InfoRequested,
    OutputYielded,
    RunAwaitingInput,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._fold import SuperstepFold, folds
from kernel._store import EventStore

__all__ = ["RecordedError", "find_run", "replay", "replay_events"]

_CONVERGENCE = "kernel.ConvergenceError"
_UNSTORABLE = "kernel.EncodingError"


class RecordedError(StepLogError):
    """An exception as the log recorded it, standing in for the original in a replayed stream.

    ``info`` is the recorded ``ErrorInfo``: the original's type (``module.Qualname``, or the bare
    name of a builtin) and its message. The original object is not in the log, so it is never
    rebuilt: no class named by the log is imported or called.
    """

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(f"{info.type}: {info.message}")
        self.info = info


RecordedError.__module__ = "kernel"


def replay(
    store: EventStore, run_id: str, *, instance_id: str | None = None
) -> AsyncIterator[WorkflowEvent]:
    """The ``WorkflowEvent``s a streaming consumer of run ``run_id`` got, in order, from the log.

    No executor runs and nothing is appended: ``async for event in replay(store, run_id)``.
    Outputs and request data are decoded with ``store.codec`` (instances of classes the codec
    has registered come back as themselves, others as plain data); errors come back as
    ``RecordedError``. ``instance_id`` names the run's instance; without it every instance of
    the store is searched (reading only their ``run_started`` events).

    Raises ``ExecutionError`` now, not when iterated, if no instance (or ``instance_id``) has a
    run ``run_id``, or if several instances do (pass ``instance_id`` then).
    """
    instance = instance_id if instance_id is not None else find_run(store, run_id)
    events = replay_events(store, store.read(instance), run_id)
    if not events:
        raise ExecutionError(f"instance {instance!r} has no run {run_id!r}")
    return _stream(events)


async def _stream(events: list[WorkflowEvent]) -> AsyncIterator[WorkflowEvent]:
    for event in events:
        yield event


def find_run(store: EventStore, run_id: str) -> str:
    """The instance of ``store`` where run ``run_id`` started. Raises ``ExecutionError`` if none
    or several did (run ids from a deterministic id factory can repeat across instances)."""
    found = [
        instance
        for instance in store.instances()
        if any(e.run_id == run_id for e in _starts(store.read(instance, types=("run_started",))))
    ]
    if not found:
        raise ExecutionError(f"no instance of {store.url} has a run {run_id!r}")
    if len(found) > 1:
        raise ExecutionError(
            f"run id {run_id!r} was started in {len(found)} instances of {store.url} "
            f"({', '.join(map(repr, found))}); pass instance_id= to say which"
        )
    return found[0]


def _starts(events: Sequence[EventBase]) -> list[RunStarted]:
    return [e for e in events if isinstance(e, RunStarted)]


def replay_events(
    store: EventStore, instance_events: Sequence[EventBase], run_id: str
) -> list[WorkflowEvent]:
    """The stream of run ``run_id`` rebuilt from its instance's events (empty if it has none)."""
    return _Replayer(store, run_id).feed(instance_events)


class _Decided(SuperstepFold):
    """What a superstep yielded and requested, held until its first marker: ``decided`` is
    what a commit made count (None after a marker that decided nothing, or an abort)."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        super().__init__()
        self.decided: list[SuperstepEvent] | None = None

    @folds("output_yielded", "info_requested")
    def _staged(self, event: SuperstepEvent) -> None:
        self._stage(event)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        self.decided = items if committed else None


class _Replayer:
    """Turns one run's log into the events its stream emitted (see the module's docstring)."""

    def __init__(self, store: EventStore, run_id: str) -> None:
        self.decode = store.codec.decode
        self.run_id = run_id
        self.out: list[WorkflowEvent] = []
        self.index: dict[str, int] = {}  # superstep id -> index
        self.marks = _Decided()  # the kernel's marker rule, over outputs and requests
        self.last_index: int | None = None

    def emit(self, type: Any, superstep: int | None = None, **fields: Any) -> None:
        self.out.append(WorkflowEvent(type, self.run_id, superstep, **fields))

    def feed(self, events: Sequence[EventBase]) -> list[WorkflowEvent]:
        for event in events:
            if not isinstance(event, RunEvent) or event.run_id != self.run_id:
                continue
            if self._apply(event):
                break
        return self.out

    def _apply(self, event: RunEvent) -> bool:
        """Emit what ``event`` made the run emit; True once the run has ended."""
        kind = event.type
        if isinstance(event, RunStarted):
            self.emit("started")
        elif isinstance(event, SuperstepStarted):
            self.index[event.superstep_id] = event.index
            self.last_index = event.index
            self.emit("superstep_started", event.index, superstep_id=event.superstep_id)
        elif isinstance(event, ExecutorInvoked | ExecutorCompleted):
            name = "executor_invoked" if kind == "executor_invoked" else "executor_completed"
            self.emit(
                name,
                self.index.get(event.superstep_id),
                superstep_id=event.superstep_id,
                executor_id=event.executor_id,
            )
        elif isinstance(event, OutputYielded | InfoRequested):
            self.marks.apply(event)
        elif kind in SUPERSTEP_MARKER_TYPES and isinstance(event, SuperstepEvent):
            self.marks.decided = None
            self.marks.apply(event)
            if self.marks.decided is not None:
                self._committed(event.superstep_id, self.marks.decided)
        elif isinstance(event, RunCompleted):
            self.emit("completed", event.supersteps)
        elif isinstance(event, RunAwaitingInput):
            self.emit("awaiting_input", event.supersteps)
        elif isinstance(event, RunFailed):
            self._failed(event)
        return kind in RUN_END_TYPES

    def _committed(self, superstep_id: str, items: list[SuperstepEvent]) -> None:
        """A commit's events, in the runner's order: outputs, then requests, then the end."""
        index = self.index.get(superstep_id)
        # Outputs first, then requests, each in log order (a stable sort keeps it).
        for item in sorted(items, key=lambda item: isinstance(item, InfoRequested)):
            if isinstance(item, OutputYielded):
                if item.designation == "hidden":
                    continue  # the live stream showed nobody this yield
                self.emit(
                    item.designation,
                    index,
                    superstep_id=superstep_id,
                    executor_id=item.executor_id,
                    data=self.decode(item.value, what=f"output of {item.executor_id!r}"),
                )
            elif isinstance(item, InfoRequested):
                self.emit(
                    "request_info",
                    index,
                    superstep_id=superstep_id,
                    executor_id=item.executor_id,
                    data=self.decode(item.data, what=f"request of {item.executor_id!r}"),
                    request_id=item.request_id,
                )
        self.emit("superstep_completed", index, superstep_id=superstep_id)

    def _failed(self, event: RunFailed) -> None:
        """The events of a run's failure, as the runner emitted them (see ``_runner``): an
        executor's (``executor_failed``, ``failed``), the convergence limit's after the last
        committed superstep, and a commit batch the store refused; anything else that failed a
        run ended its stream with the exception, not an event."""
        error = RecordedError(event.error)
        superstep_id = event.superstep_id
        index = self.index.get(superstep_id) if superstep_id is not None else None
        if event.executor_id is not None:
            where: dict[str, Any] = {"superstep_id": superstep_id, "executor_id": event.executor_id}
            self.emit("executor_failed", index, error=error, **where)
            self.emit("failed", index, error=error, **where)  # one object, as live
        elif superstep_id is None and event.error.type == _CONVERGENCE:
            self.emit("failed", self.last_index, error=error)
        elif superstep_id is not None and event.error.type == _UNSTORABLE:
            self.emit("failed", index, superstep_id=superstep_id, error=error)
