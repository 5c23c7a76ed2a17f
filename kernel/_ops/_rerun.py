"""Rerun: execute a recorded run again with today's executors, and say where it diverges.

``rerun(workflow, run_id)`` seeds a scratch instance in a new memory store with the committed state
the run started from (an ``InstanceForked`` event carrying the fold of the instance's log up to
the run's ``RunStarted``), runs ``workflow``'s graph there on the recorded input and arguments,
and compares the two logs superstep by superstep. The recorded instance is only read.

What is compared, per superstep index: the outcome (committed, or aborted and why), then per
executor (in order of executor id) its staged state writes (per key, in order), the messages it
sent (message and targets, in order), its outputs and its requests for input (their data; request
ids are fresh in every run), each as a sequence, so that parallel executors interleaving another
way is no divergence. Then the number of supersteps, and how the run ended. Values are compared as
stored (JSON trees) and reported decoded.

Only fresh runs can be rerun: a run that continues another (resumed, or given responses) depends
on the responses and the failure that led to it, which a rerun with today's executors would not
meet again in the same way; rerun its root run instead (the error names it). A root run that
crashed or failed then reports its last superstep's outcome as a divergence (the record aborted
it; today's executors may not), which is expected.

The handlers really run again, side effects included, in this process; their state reads see the
scratch instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from kernel._base._clock import Clock, IdFactory, counter_ids, system_clock
from kernel._base._errors import ExecutionError
from kernel._log._events import (
    ErrorInfo,
    EventBase,
    ExecutorFailed,
    InfoRequested,
    InstanceForked,
    MessageStaged,
    OutputYielded,
    RunAbandoned,
    RunEvent,
    RunFailed,
    RunStarted,
    StateStaged,
    SuperstepAborted,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._log._fold import SuperstepFold, fold_committed, folds
from kernel._ops._workflow import Workflow
from kernel._store._memory import MemoryStore

__all__ = ["Divergence", "DivergenceKind", "RerunReport", "rerun"]

DivergenceKind = Literal["state", "message", "output", "request", "superstep count", "outcome"]


class _Marker:
    """A value that is no value: shown by name in reports."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Divergence:
    """Where a rerun first differs from the record.

    ``superstep`` is the superstep index; ``executor_id`` the executor whose writes, messages,
    outputs or requests differ (for an outcome, the executor that failed, if one did; None for a
    superstep count). ``key`` is the state key for ``"state"``, ``"targets"`` for a message routed
    to other executors (``recorded``/``new`` are then the target lists), else None.
    ``recorded`` and ``new`` are the decoded values (for ``"outcome"``, descriptions such as
    ``"committed"`` or ``"aborted (failed: builtins.RuntimeError: boom)"``; for
    ``"superstep count"``, the counts). ``Divergence.NOTHING`` stands for a write, message,
    output or request one side has and the other does not; ``Divergence.DELETED`` for a deleted
    key.
    """

    NOTHING: ClassVar[Any] = _Marker("<nothing>")
    DELETED: ClassVar[Any] = _Marker("<deleted>")

    superstep: int
    executor_id: str | None
    kind: DivergenceKind
    key: str | None
    recorded: Any
    new: Any

    def __str__(self) -> str:
        where = f"superstep {self.superstep}"
        if self.executor_id is not None:
            where += f", executor {self.executor_id!r}"
        was, now = _show(self.recorded), _show(self.new)
        if self.kind == "state":
            what = f"state key {self.key!r}"
        elif self.kind == "message" and self.key == "targets":
            what = "message targets"
        elif self.kind == "superstep count":
            return f"{where}: the record has {was} supersteps, the rerun {now}"
        else:
            what = self.kind
        return f"{where}: {what} was {was} in the record, {now} in the rerun"


@dataclass(frozen=True)
class RerunReport:
    """What ``rerun`` found: ``matches`` (no divergence), or the first ``divergence``.

    ``run_id`` is the recorded run; ``events`` the scratch instance's log (its first event is the
    ``InstanceForked`` that seeded it), for a closer look.
    """

    matches: bool
    divergence: Divergence | None
    run_id: str = ""
    events: tuple[EventBase, ...] = field(default=(), repr=False)

    def __str__(self) -> str:
        if self.divergence is None:
            return f"rerun of run {self.run_id} matches the record"
        return f"rerun of run {self.run_id} diverges: {self.divergence}"


async def rerun(
    workflow: Workflow,
    run_id: str,
    *,
    instance_id: str | None = None,
    clock: Clock | None = None,
    id_factory: IdFactory | None = None,
) -> RerunReport:
    """Run the recorded input of run ``run_id`` again on ``workflow``'s executors, in a scratch
    memory store seeded with the state the run started from; report the first divergence.

    ``instance_id`` is the run's instance (default: ``workflow``'s). ``clock`` and ``id_factory``
    serve the scratch run (defaults: the system clock, ids ``rerun-1``, ``rerun-2``...).
    An exception of the rerun is not raised: it is an outcome, compared with the record's.

    Raises ``ExecutionError`` if the instance has no run ``run_id``, or if that run continues
    another (only fresh runs can be rerun; the message names the run it continues).
    """
    instance = instance_id if instance_id is not None else workflow.instance_id
    store = workflow.store
    events = store.read(instance)
    started = next((e for e in events if isinstance(e, RunStarted) and e.run_id == run_id), None)
    if started is None:
        raise ExecutionError(f"instance {instance!r} has no run {run_id!r} to rerun")
    if started.continues is not None:
        raise ExecutionError(
            f"run {run_id} of {instance!r} continues run {started.continues} (it was resumed or "
            "given responses); only fresh runs can be rerun: rerun the run its lineage started with"
        )
    clock = clock or system_clock
    before = [e for e in events if e.position < started.position]
    scratch_store = MemoryStore()
    scratch_store.codec.register(*store.codec.registered.values())
    scratch_store.append(
        instance,
        [
            InstanceForked(
                instance_id=instance,
                position=1,
                timestamp=clock(),
                origin_instance=instance,
                origin_position=started.position - 1,
                values=dict(fold_committed(before).values),
            )
        ],
        expected_version=0,
    )
    scratch = _scratch_workflow(workflow, scratch_store, instance, clock, id_factory)
    decode = store.codec.decode
    message = decode(started.input, what="the run's input message")
    kwargs = {k: decode(v, what=f"run argument {k!r}") for k, v in started.kwargs.items()}
    refused: BaseException | None = None
    try:
        await scratch.run(message, **kwargs)
    except Exception as error:  # the rerun's failure is an outcome, compared below
        refused = error
    new_events = scratch_store.read(instance)
    recorded = _summarize(events, run_id)
    new_run = next((e.run_id for e in new_events if isinstance(e, RunStarted)), None)
    if new_run is None:  # refused before it started: nothing was appended
        assert refused is not None
        new = _Summary({}, f"refused ({_describe(ErrorInfo.of(refused))})")
    else:
        new = _summarize(new_events, new_run)
    divergence = _compare(recorded, new, decode)
    return RerunReport(divergence is None, divergence, run_id, tuple(new_events))


def _scratch_workflow(
    workflow: Workflow,
    store: MemoryStore,
    instance_id: str,
    clock: Clock,
    id_factory: IdFactory | None,
) -> Workflow:
    """``workflow``'s graph and settings, bound to ``instance_id`` in the scratch ``store``, with
    the rerun's own clock and ids, and no hooks: a rerun checks the past against today's
    executors on a scratch store; it is not a run of the instance, and whatever follows the
    instance's runs (tracing, metrics) must not count it as one."""
    settings = workflow.settings.replace(
        instance_id=instance_id,
        clock=clock,
        id_factory=id_factory or counter_ids("rerun"),
        hooks=(),
    )
    return Workflow(workflow.graph, store=store, settings=settings)


# -- summaries -----------------------------------------------------------------------------------

_Item = tuple[Any, ...]  # what is compared of one staged event, wire values included


@dataclass
class _Step:
    """What one superstep of a run staged, per executor and kind, and how it closed."""

    outcome: str = "open (no marker)"
    failed: str | None = None  # the executor whose failure aborted it
    items: dict[str, dict[str, list[_Item]]] = field(default_factory=dict)

    def take(self, staged: Sequence[SuperstepEvent]) -> None:
        """Add what the superstep staged (in stream order), each under its executor and kind."""
        for event in staged:
            if isinstance(event, ExecutorFailed):
                self.failed = self.failed or event.executor_id
            elif isinstance(event, StateStaged):
                self._add(event.executor_id, "state", (event.key, event.op, event.value))
            elif isinstance(event, MessageStaged):
                self._add(event.source, "message", (event.message, tuple(event.targets)))
            elif isinstance(event, OutputYielded):
                self._add(event.executor_id, "output", (event.value,))
            elif isinstance(event, InfoRequested):
                self._add(event.executor_id, "request", (event.data, event.response_type))

    def _add(self, executor_id: str, kind: str, item: _Item) -> None:
        self.items.setdefault(executor_id, {}).setdefault(kind, []).append(item)


@dataclass
class _Summary:
    steps: dict[int, _Step]
    end: str


class _RunSummary(SuperstepFold):
    """The supersteps and end of run ``run_id``, by the marker rule every fold of the log follows
    (``SuperstepFold``): a superstep's first marker decides its outcome, and what it staged
    before that marker is what it staged, whether it committed or aborted; anything staged after
    the marker, or after the run's end, is inert. A superstep with no marker keeps what it had
    staged when its run ended (or when the log stops)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.steps: dict[int, _Step] = {}
        self.end: str | None = None
        self._index: dict[str, int] = {}  # superstep id -> index, of this run's supersteps
        self._open: set[str] = set()  # this run's supersteps with no marker yet

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        if event.run_id == self.run_id and event.run_id not in self._ended_runs:
            self._index[event.superstep_id] = event.index
            self._open.add(event.superstep_id)
            self.steps[event.index] = _Step()

    @folds("executor_failed", "state_staged", "message_staged", "output_yielded", "info_requested")
    def _staged(self, event: SuperstepEvent) -> None:
        if event.superstep_id in self._index:
            self._stage(event)

    def apply_marker(self, event: SuperstepEvent) -> list[Any] | None:
        items = super().apply_marker(event)
        index = self._index.get(event.superstep_id)
        if items is None or index is None:
            return items  # not this run's, or not the superstep's first marker
        self._open.discard(event.superstep_id)
        step = self.steps[index]
        if isinstance(event, SuperstepAborted):
            why = (
                event.reason if event.error is None else f"{event.reason}: {_describe(event.error)}"
            )
            step.outcome = f"aborted ({why})"
        else:
            step.outcome = "committed"
        step.take(items)
        return items

    def _run_ended(self, event: RunEvent) -> None:
        if event.run_id == self.run_id and self.end is None:
            self._close_open()
            self.end = _end_of(event)
        super()._run_ended(event)

    def _close_open(self) -> None:
        """Take what the supersteps left with no marker had staged (they stay open)."""
        for superstep_id in sorted(self._open, key=self._index.__getitem__):
            self.steps[self._index[superstep_id]].take(self._pending_of(superstep_id))
        self._open.clear()

    def summary(self) -> _Summary:
        """The run as folded so far (``"still open"`` if its end is not in the log)."""
        if self.end is None:
            self._close_open()
        return _Summary(self.steps, self.end or "still open")


def _summarize(events: Sequence[EventBase], run_id: str) -> _Summary:
    """The supersteps and end of run ``run_id``, from its instance's events in stream order."""
    return _RunSummary(run_id).apply_all(events).summary()


def _end_of(event: RunEvent) -> str:
    if isinstance(event, RunFailed):
        return f"failed ({event.error.type})"  # messages may name run ids: compared by type
    if isinstance(event, RunAbandoned):
        return event.reason
    return {
        "run_completed": "completed",
        "run_awaiting_input": "awaiting input",
        "run_cancelled": "cancelled",
    }.get(event.type, event.type)


def _describe(info: ErrorInfo) -> str:
    return f"{info.type}: {info.message}"


# -- comparing -----------------------------------------------------------------------------------

_KINDS: tuple[Literal["state", "message", "output", "request"], ...] = (
    "state",
    "message",
    "output",
    "request",
)


def _compare(recorded: _Summary, new: _Summary, decode: Callable[..., Any]) -> Divergence | None:
    """The first divergence of ``new`` from ``recorded``, or None."""
    for index in sorted(set(recorded.steps) | set(new.steps)):
        was, now = recorded.steps.get(index), new.steps.get(index)
        if was is None or now is None:
            return Divergence(
                index, None, "superstep count", None, len(recorded.steps), len(new.steps)
            )
        if was.outcome != now.outcome:
            return Divergence(
                index, was.failed or now.failed, "outcome", None, was.outcome, now.outcome
            )
        for executor_id in sorted(set(was.items) | set(now.items)):
            mine, theirs = was.items.get(executor_id, {}), now.items.get(executor_id, {})
            for kind in _KINDS:
                found = _first_difference(kind, mine.get(kind, []), theirs.get(kind, []), decode)
                if found is not None:
                    key, old_value, new_value = found
                    return Divergence(index, executor_id, kind, key, old_value, new_value)
    if recorded.end != new.end:
        last = max([*recorded.steps, *new.steps], default=1)
        return Divergence(last, None, "outcome", None, recorded.end, new.end)
    return None


def _first_difference(
    kind: str, was: list[_Item], now: list[_Item], decode: Callable[..., Any]
) -> tuple[str | None, Any, Any] | None:
    """(key, recorded, new) of the first item that differs in two sequences of one kind."""
    if kind == "state":
        keys = list(dict.fromkeys([item[0] for item in was] + [item[0] for item in now]))
        for key in keys:
            found = _first_difference(
                "value",
                [item[1:] for item in was if item[0] == key],
                [item[1:] for item in now if item[0] == key],
                decode,
            )
            if found is not None:
                return key, found[1], found[2]
        return None
    for position in range(max(len(was), len(now))):
        old = was[position] if position < len(was) else None
        new = now[position] if position < len(now) else None
        if old == new:
            continue
        if kind == "message" and old is not None and new is not None and old[0] == new[0]:
            return "targets", list(old[1]), list(new[1])
        return None, _value(kind, old, decode), _value(kind, new, decode)
    return None


def _value(kind: str, item: _Item | None, decode: Callable[..., Any]) -> Any:
    """What a report shows of a compared item: its decoded value."""
    if item is None:
        return Divergence.NOTHING
    if kind == "value" and item[0] == "delete":
        return Divergence.DELETED
    wire = item[1] if kind == "value" else item[0]
    return decode(wire)


def _show(value: Any) -> str:
    return repr(value)
