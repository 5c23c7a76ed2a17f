"""Replay: the ``WorkflowEvent`` stream of a past run, rebuilt from the log without running it.

A streaming consumer of a run sees ``started`` and a ``status`` (in progress); per superstep
``superstep_started``, then ``executor_invoked`` (with the message received) and
``executor_completed`` (with the messages sent) as executors run; for a committed superstep
its ``output`` and custom events (in the order made), its ``request_info`` events (after the
run's first, a ``status``) and ``superstep_completed``; and at the end the final ``status``
and ``completed`` or ``awaiting_input``, or (a failure) a ``status``, ``executor_failed`` and
``failed``. The runner appends each event's fact to the log (``self.log``) right before it
hands the event over, and decides every other event from facts it has just logged, so the log
says what the consumer got. ``replay`` reads it back in that order, decoding values with the
store's codec. What each invocation received is rebuilt as a resume rebuilds a run's standing
(``Ledger.standing``), over the routes the log recorded (``MessageStaged.targets`` and
``gathered``).

Recorded steps (``@step``) are in the stream as the run emitted them, with their ``executor_id``
the step's name, inside the invocation of the executor whose handler called them (after its
``executor_invoked``, before its ``executor_completed``): for each ``StepRecorded`` of the run, in
log order, a call that returned gives ``executor_invoked`` then ``executor_completed`` (its
result), a call that raised ``executor_invoked`` then ``executor_failed`` (a ``RecordedError``),
and a call served from the log ``executor_bypassed`` with the result of the record it reused
(``StepRecorded.reused``, found in the instance's log; ``LogIntegrityError`` if it is not there).
No step runs. Two things the log may not say: a step's arguments (only their digest is
recorded, unless the step records them: ``record_arguments``), so its replayed
``executor_invoked`` carries None; and when a call began: its record
is appended when it returns, so its ``executor_invoked`` is replayed right before its end. Where
calls overlap (steps gathered concurrently, parallel executors), the live consumer got that
``executor_invoked`` earlier; every other event keeps its place, so a handler that awaits its
steps one after another, alone in its superstep, replays event for event. A call whose superstep
had closed when it returned (its record was refused) is not in the log, nor in the replay.

What the log cannot say: when a run was cancelled, abandoned or crashed, its consumer saw no end
event (a cancelled consumer may also have stopped reading one or two events before the last one
replay yields); a run that failed outside a handler (the store, say) ended its stream with the
exception itself, not with a ``failed`` event. Replay yields what the run emitted and ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from kernel._base._errors import ExecutionError, ResumeError, StepLogError
from kernel._define._graph import FanIn
from kernel._log._events import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    CustomEventAdded,
    ErrorInfo,
    EventBase,
    ExecutorCompleted,
    ExecutorInvoked,
    InfoRequested,
    MessageStaged,
    OutputYielded,
    RunAwaitingInput,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StepRecorded,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._log._fold import SuperstepFold, folds
from kernel._log._requests import Response
from kernel._run._algo import Delivery
from kernel._run._emit import WorkflowEvent, WorkflowEventSource, WorkflowRunState, framework_event
from kernel._run._instance import read_ledger
from kernel._run._ledger import Ledger, Standing, _Rebuild
from kernel._run._steps import returned
from kernel._store._eventstore import EventStore

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

    @folds("output_yielded", "info_requested", "custom_event_added")
    def _staged(self, event: SuperstepEvent) -> None:
        self._stage(event)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        self.decided = items if committed else None


class _LoggedGraph:
    """The one thing of a graph the rebuild of a fresh run's start asks: its start executor,
    unknown to the log (the executor invoked first takes the run's input)."""

    start = ""


class _LoggedRoutes:
    """A stand-in for the workflow's ``Router`` where only the log is at hand: a message went to
    each of its recorded ``targets`` directly, but to those ``gathered`` names through a fan-in
    group of the sources named there (``MessageStaged.gathered``)."""

    graph = _LoggedGraph()

    def __init__(self) -> None:
        self.fan_ins: dict[tuple[str, str], FanIn] = {}
        self.sound = True  # False once a ``gathered`` was not what the runner writes

    def learn(self, ledger: Ledger) -> Ledger:
        for step in ledger.checkpoints:
            for item in step.items:
                if isinstance(item, MessageStaged):
                    for target, sources in item.gathered.items():
                        if not isinstance(sources, list) or not all(
                            isinstance(source, str) for source in sources
                        ):
                            self.sound = False
                            continue
                        self.fan_ins[item.source, target] = FanIn(tuple(sources), target)
        return ledger

    def delivery_of(self, source: str, logged: Sequence[str]) -> Delivery:
        targets: list[str] = []
        fan_ins: list[FanIn] = []
        for target in logged:
            group = self.fan_ins.get((source, target))
            if group is None:
                targets.append(target)
            else:
                fan_ins.append(group)
        return Delivery(tuple(targets), tuple(fan_ins))


class _Inputs:
    """What each invocation of a run received, rebuilt as a resume rebuilds a run's standing
    (``Ledger.standing`` and the step algebra), over the routes the log recorded.

    ``take(executor_id)`` gives the next message the executor received in the open superstep
    (a response handler's: the response), or None when the log does not say."""

    def __init__(self, store: EventStore, instance_id: str, run_id: str) -> None:
        routes = _LoggedRoutes()
        self._standing: Standing | None = None
        self._inbox: dict[str, list[Any]] = {}
        try:
            ledger = routes.learn(read_ledger(store, instance_id))
            line = ledger.runs.get(run_id)
            if line is None:
                return

            def origin(forked: Any) -> Ledger:
                upto = forked.origin_position
                return routes.learn(read_ledger(store, forked.origin_instance, upto=upto))

            router: Any = routes
            standing = ledger.standing(
                run_id, None, router=router, codec=store.codec, origin=origin
            )
        except ResumeError:
            return
        if not routes.sound:
            return
        self._rebuild = _Rebuild(router, store.codec, instance_id)
        self._steps = {step.superstep_id: step for step in line.steps}
        self._standing = standing

    def open(self) -> None:
        """A superstep opened: its inbox is where the run stands."""
        standing = self._standing
        inbox = {} if standing is None else standing.position.inbox
        self._inbox = {target: list(messages) for target, messages in inbox.items()}

    def take(self, executor_id: str) -> Any:
        inbox = self._inbox
        queue = inbox.get(executor_id) or inbox.get(_LoggedGraph.start)
        if not queue:
            return None
        message = queue.pop(0)
        return message.value if isinstance(message, Response) else message

    def committed(self, superstep_id: str) -> None:
        """Superstep ``superstep_id`` committed: the run moves on past it."""
        standing = self._standing
        if standing is None:
            return
        step = self._steps.get(superstep_id)
        if step is None:
            self._standing = None  # the log and its ledger disagree: say nothing more
            return
        try:
            self._standing = self._rebuild.after(standing, step)
        except ResumeError:
            self._standing = None


class _Replayer:
    """Turns one run's log into the events its stream emitted (see the module's docstring)."""

    def __init__(self, store: EventStore, run_id: str) -> None:
        self.decode = store.codec.decode
        self.run_id = run_id
        self.out: list[WorkflowEvent] = []
        self.index: dict[str, int] = {}  # superstep id -> index
        self.marks = _Decided()  # the kernel's marker rule, over outputs and requests
        self.last_index: int | None = None
        self.asked = False  # a request_info was emitted (then a status said so)
        # executor id -> the messages it has sent since its latest ExecutorInvoked
        self.sending: dict[str, list[Any]] = {}
        self.store = store
        self.inputs: _Inputs | None = None
        self.returned: dict[int, StepRecorded] = {}  # the instance's calls that returned, so far

    def emit(self, type: Any, superstep: int | None = None, **fields: Any) -> None:
        self.out.append(framework_event(type, self.run_id, superstep, **fields))

    def status(self, state: WorkflowRunState) -> None:
        self.emit("status", state=state)

    def feed(self, events: Sequence[EventBase]) -> list[WorkflowEvent]:
        for event in events:
            if isinstance(event, StepRecorded) and returned(event):
                self.returned[event.position] = event  # any run's: a later one may be served it
            if not isinstance(event, RunEvent) or event.run_id != self.run_id:
                continue
            if self._apply(event):
                break
        return self.out

    def _apply(self, event: RunEvent) -> bool:
        """Emit what ``event`` made the run emit; True once the run has ended."""
        kind = event.type
        if isinstance(event, RunStarted):
            self.inputs = _Inputs(self.store, event.instance_id, self.run_id)
            self.emit("started")
            self.status(WorkflowRunState.IN_PROGRESS)
        elif isinstance(event, SuperstepStarted):
            self.index[event.superstep_id] = event.index
            self.last_index = event.index
            if self.inputs is not None:
                self.inputs.open()
            self.emit("superstep_started", event.index, superstep_id=event.superstep_id)
        elif isinstance(event, ExecutorInvoked):
            self.sending[event.executor_id] = []
            given = None if self.inputs is None else self.inputs.take(event.executor_id)
            self.emit(
                "executor_invoked",
                self.index.get(event.superstep_id),
                superstep_id=event.superstep_id,
                executor_id=event.executor_id,
                data=given,
            )
        elif isinstance(event, ExecutorCompleted):
            sent = self.sending.pop(event.executor_id, None)
            self.emit(
                "executor_completed",
                self.index.get(event.superstep_id),
                superstep_id=event.superstep_id,
                executor_id=event.executor_id,
                data=sent or None,
            )
        elif isinstance(event, StepRecorded):
            self._step(event)
        elif isinstance(event, MessageStaged):
            sending = self.sending.get(event.source)
            if sending is not None:
                sending.append(self.decode(event.message, what=f"message from {event.source!r}"))
        elif isinstance(event, OutputYielded | InfoRequested | CustomEventAdded):
            self.marks.apply(event)
        elif kind in SUPERSTEP_MARKER_TYPES and isinstance(event, SuperstepEvent):
            self.marks.decided = None
            self.marks.apply(event)
            if self.marks.decided is not None:
                if self.inputs is not None:
                    self.inputs.committed(event.superstep_id)
                self._committed(event.superstep_id, self.marks.decided)
        elif isinstance(event, RunCompleted):
            self.status(WorkflowRunState.IDLE)
            self.emit("completed", event.supersteps)
        elif isinstance(event, RunAwaitingInput):
            self.status(WorkflowRunState.IDLE_WITH_PENDING_REQUESTS)
            self.emit("awaiting_input", event.supersteps)
        elif isinstance(event, RunFailed):
            self._failed(event)
        return kind in RUN_END_TYPES

    def _step(self, event: StepRecorded) -> None:
        """A recorded step's events, as its call emitted them (see the module's docstring)."""
        where = {"superstep_id": event.superstep_id, "executor_id": event.name}
        index = self.index.get(event.superstep_id)
        what = f"the result of step {event.name!r}"
        if event.reused is not None:
            found = event.origin_in(self.returned)
            self.emit(
                "executor_bypassed", index, data=self.decode(found.result, what=what), **where
            )
            return
        self.emit("executor_invoked", index, **where)
        if event.error is None:
            self.emit(
                "executor_completed", index, data=self.decode(event.result, what=what), **where
            )
        else:
            error = RecordedError(event.error)
            self.emit("executor_failed", index, error=error, info=event.error, **where)

    def _committed(self, superstep_id: str, items: list[SuperstepEvent]) -> None:
        """A commit's events, in the runner's order: outputs and custom events, then requests,
        then the end (after the run's first request, a status saying requests are pending)."""
        index = self.index.get(superstep_id)
        # Outputs and custom events first, then requests, each in log order (a stable sort).
        for item in sorted(items, key=lambda item: isinstance(item, InfoRequested)):
            if isinstance(item, CustomEventAdded):
                self.out.append(self._custom(item, index))
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
                    response_type=item.response_type or None,
                )
        if not self.asked and any(isinstance(item, InfoRequested) for item in items):
            self.asked = True
            self.status(WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS)
        self.emit("superstep_completed", index, superstep_id=superstep_id)

    def _custom(self, item: CustomEventAdded, index: int | None) -> WorkflowEvent:
        """A custom event as its live consumer got it, its data decoded (data only: the event's
        own class, if it was a subclass, is not rebuilt)."""
        if item.error is not None:
            data: Any = RecordedError(item.error)
        else:
            data = self.decode(item.data, what=f"the {item.event_type!r} event")
        return WorkflowEvent(
            item.event_type,
            data,
            origin=WorkflowEventSource.EXECUTOR,
            executor_id=item.executor_id,
            run_id=self.run_id,
            superstep=index,
            superstep_id=item.superstep_id,
        )

    def _failed(self, event: RunFailed) -> None:
        """The events of a run's failure, as the runner emitted them (see ``_runner``): an
        executor's (``executor_failed``, ``failed``), the convergence limit's after the last
        committed superstep, and a commit batch the store refused; anything else that failed a
        run ended its stream with the exception, not an event."""
        error = RecordedError(event.error)
        info = event.error
        superstep_id = event.superstep_id
        index = self.index.get(superstep_id) if superstep_id is not None else None
        executor_id = event.executor_id
        convergence = superstep_id is None and info.type == _CONVERGENCE
        unstorable = superstep_id is not None and info.type == _UNSTORABLE
        if executor_id is None and not convergence and not unstorable:
            return
        self.status(WorkflowRunState.FAILED)
        if executor_id is not None:
            where: dict[str, Any] = {"superstep_id": superstep_id, "executor_id": executor_id}
            self.emit("executor_failed", index, error=error, info=info, **where)
            self.emit("failed", index, error=error, info=info, **where)  # one object, as live
        elif convergence:
            self.emit("failed", self.last_index, error=error, info=info)
        else:
            self.emit("failed", index, superstep_id=superstep_id, error=error, info=info)
