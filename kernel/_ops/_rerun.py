"""Rerun: execute a recorded run again with today's executors, and say where it diverges.

``rerun(workflow, run_id)`` seeds a scratch instance in a new memory store with the committed state
the run started from (an ``InstanceForked`` event carrying the fold of the instance's log up to
the run's ``RunStarted``), runs ``workflow``'s graph there on the recorded input and arguments,
and compares the two logs superstep by superstep. The recorded instance is only read.

Recorded steps (``@step``) are served, never executed, as Temporal's replayer serves recorded
activities: the scratch run is given a book of the recorded run's calls (``StepBook``, keyed as
the live run keyed them: superstep index, executor and identity; the ``Run``'s ``steps`` seam), so
the deterministic code around the steps is checked against what they returned then. A call that
returned is served its result. ``live={"call_model"}`` names steps (by name) that are called
again instead, and their new results compared. Any other call the record has no result for (a
new code path, other arguments, or a call the record has only as raised) is refused, never
executed: the step raises ``ExecutionError`` in the handler, the refusal is recorded as the
call's error, and the report names the call. A live step sees the ``step_key()`` of the call it
repeats (the scratch run records under the recorded run's lineage): a service that deduplicates
on it answers as it did then. In the scratch log, a served call's ``reused`` is the position of
the record in the recorded instance.

What is compared, per superstep index: each executor's step calls (in order of executor id; each
executor's calls in the order they were made, by name and identity, and what each returned or
raised), then the outcome (committed, or aborted and why), then per executor its staged state
writes (per key, in order), the messages it sent (message and targets, in order), its outputs and
its requests for input (their data; request ids are fresh in every run), each as a sequence, so
that parallel executors interleaving another way is no divergence. Then the number of supersteps,
and how the run ended. Values are compared as stored (JSON trees) and reported decoded. The step
calls come first: they happened inside the superstep, and a call that differs explains what
follows.

Only fresh runs can be rerun: a run that continues another (resumed, or given responses) depends
on the responses and the failure that led to it, which a rerun with today's executors would not
meet again in the same way; rerun its root run instead (the error names it). A root run that
crashed or failed then reports its last superstep's outcome as a divergence (the record aborted
it; today's executors may not), which is expected; or, first, a step call the record has no
result for (the call in flight when it crashed, or one that raised: errors are not served), which
a rerun refuses unless it is named live.

The handlers really run again, side effects included, in this process (their steps do not, but
for the live ones); their state reads see the scratch instance.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
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
    StepRecorded,
    SuperstepAborted,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._log._fold import SuperstepFold, fold_committed, folds
from kernel._ops._replay import RecordedError
from kernel._ops._workflow import Workflow
from kernel._run._runner import Run
from kernel._run._steps import StepBook, returned
from kernel._store._memory import MemoryStore

__all__ = ["Divergence", "DivergenceKind", "RerunReport", "rerun"]

DivergenceKind = Literal[
    "step", "state", "message", "output", "request", "superstep count", "outcome"
]


class _Marker:
    """A value that is no value: shown by name in reports."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Divergence:
    """Where a rerun first differs from the record.

    ``superstep`` is the superstep index; ``executor_id`` the executor whose step calls, writes,
    messages, outputs or requests differ (for an outcome, the executor that failed, if one did;
    None for a superstep count). ``key`` is the step's name for ``"step"``, the state key for
    ``"state"``, ``"targets"`` for a message routed to other executors (``recorded``/``new`` are
    then the target lists), else None. ``recorded`` and ``new`` are the decoded values (for a
    step, what the call returned, or a ``RecordedError`` for what it raised; for ``"outcome"``,
    descriptions such as ``"committed"`` or ``"aborted (failed: builtins.RuntimeError: boom)"``;
    for ``"superstep count"``, the counts). ``Divergence.NOTHING`` stands for a step call, write,
    message, output or request one side has and the other does not; ``Divergence.DELETED`` for a
    deleted key.
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
        elif self.kind == "step":
            what = f"step {self.key!r}"
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
    live: Collection[str] = (),
) -> RerunReport:
    """Run the recorded input of run ``run_id`` again on ``workflow``'s executors, in a scratch
    memory store seeded with the state the run started from; report the first divergence.

    Recorded steps are served the results the run recorded, not executed; ``live`` names steps
    (by name) that are called again, their new results compared with the recorded ones. A call
    that is neither recorded nor live is refused (it raises ``ExecutionError`` in its handler)
    and reported; see the module's docstring.

    ``instance_id`` is the run's instance (default: ``workflow``'s). ``clock`` and ``id_factory``
    serve the scratch run (defaults: the system clock, ids ``rerun-1``, ``rerun-2``...).
    An exception of the rerun is not raised: it is an outcome, compared with the record's.

    Raises ``ExecutionError`` if the instance has no run ``run_id``, or if that run continues
    another (only fresh runs can be rerun; the message names the run it continues); and, after
    the rerun, if ``live`` names a step that neither the record nor the rerun called (a
    misspelt name would otherwise change nothing, silently). ``TypeError`` if ``live`` is a
    string (one name is ``live={"name"}``).
    """
    if isinstance(live, str):
        raise TypeError(f"live= takes a collection of step names, not one string: {{{live!r}}}")
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
    live_names = frozenset(live)
    scratch = _scratch_workflow(workflow, scratch_store, instance, clock, id_factory, live_names)
    decode = store.codec.decode
    message = decode(started.input, what="the run's input message")
    kwargs = {k: decode(v, what=f"run argument {k!r}") for k, v in started.kwargs.items()}
    recorded = _summarize(events, run_id)
    served = StepBook(run_id).add_all(r for r in recorded.records if r[0].name not in live_names)
    refused: BaseException | None = None
    try:
        await scratch._run_inline(Run(scratch._instance, message, kwargs, steps=served))
    except Exception as error:  # the rerun's failure is an outcome, compared below
        refused = error
    new_events = scratch_store.read(instance)
    new_run = next((e.run_id for e in new_events if isinstance(e, RunStarted)), None)
    if new_run is None:  # refused before it started: nothing was appended
        assert refused is not None
        new = _Summary({}, f"refused ({_describe(ErrorInfo.of(refused))})")
    else:
        new = _summarize(new_events, new_run)
    _check_live(live_names, recorded, scratch_store, run_id)
    results = _Results(events, new_events, live_names, decode)
    divergence = _compare(recorded, new, results)
    return RerunReport(divergence is None, divergence, run_id, tuple(new_events))


def _check_live(
    live: frozenset[str], recorded: _Summary, scratch: MemoryStore, run_id: str
) -> None:
    """Raise ``ExecutionError`` for a live name that neither the recorded run nor the rerun (its
    sub-workflows' children included: every instance of the scratch store) called."""
    if not live:
        return
    called = {event.name for event, _ in recorded.records}
    for instance in scratch.instances():
        for event in scratch.read(instance, types=("step_recorded",)):
            if isinstance(event, StepRecorded):
                called.add(event.name)
    unknown = sorted(live - called)
    if unknown:
        raise ExecutionError(
            f"live= names step(s) that neither run {run_id} nor its rerun called: "
            f"{', '.join(map(repr, unknown))} (steps are named by their name, as in the log)"
        )


def _scratch_workflow(
    workflow: Workflow,
    store: MemoryStore,
    instance_id: str,
    clock: Clock,
    id_factory: IdFactory | None,
    live: frozenset[str],
) -> Workflow:
    """``workflow``'s graph and settings, bound to ``instance_id`` in the scratch ``store``, with
    the rerun's own clock and ids, and no hooks: a rerun checks the past against today's
    executors on a scratch store; it is not a run of the instance, and whatever follows the
    instance's runs (tracing, metrics) must not count it as one. Only the ``live`` steps may be
    called without a record (``live_steps``), there and in the sub-workflows it runs."""
    settings = workflow.settings.replace(
        instance_id=instance_id,
        clock=clock,
        id_factory=id_factory or counter_ids("rerun"),
        hooks=(),
        live_steps=live,
    )
    return Workflow(workflow.graph, store=store, settings=settings)


# -- summaries -----------------------------------------------------------------------------------

_Item = tuple[Any, ...]  # what is compared of one staged event, wire values included


@dataclass
class _Step:
    """What one superstep of a run staged, per executor and kind, the step calls each executor
    made (in log order), and how it closed."""

    outcome: str = "open (no marker)"
    failed: str | None = None  # the executor whose failure aborted it
    items: dict[str, dict[str, list[_Item]]] = field(default_factory=dict)
    calls: dict[str, list[StepRecorded]] = field(default_factory=dict)

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
    records: list[tuple[StepRecorded, int]] = field(default_factory=list)
    """The run's step records in log order, each with its superstep's index."""


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
        self.records: list[tuple[StepRecorded, int]] = []

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        if event.run_id == self.run_id and event.run_id not in self._ended_runs:
            self._index[event.superstep_id] = event.index
            self._open.add(event.superstep_id)
            self.steps[event.index] = _Step()

    @folds("step_recorded")
    def _step_recorded(self, event: StepRecorded) -> None:
        """A step call: provenance, whatever its superstep's verdict (never staged)."""
        index = self._index.get(event.superstep_id)
        if index is not None:
            self.records.append((event, index))
            self.steps[index].calls.setdefault(event.executor_id, []).append(event)

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
        return _Summary(self.steps, self.end or "still open", self.records)


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


class _Results:
    """What each step call of either run returned or raised, as compared and as reported.

    A served call is what the record it reused returned: the recorded instance's (positions in
    the scratch log's ``reused`` are the recorded instance's), but for a live step's call served
    a result the rerun itself recorded (a lineage-scoped executor calling it again)."""

    def __init__(
        self,
        recorded: Sequence[EventBase],
        rerun: Sequence[EventBase],
        live: frozenset[str],
        decode: Callable[..., Any],
    ) -> None:
        self._recorded = _returned(recorded)
        self._rerun = _returned(rerun)
        self._live = live
        self.decode = decode

    def of(self, event: StepRecorded, *, in_rerun: bool) -> tuple[Any, ...]:
        """``("result", wire)`` or ``("raised", ErrorInfo)``."""
        if event.reused is not None:
            own = in_rerun and event.name in self._live
            event = event.origin_in(self._rerun if own else self._recorded)
        if event.error is not None:
            return ("raised", event.error)
        return ("result", event.result)

    def shown(self, event: StepRecorded | None, *, in_rerun: bool) -> Any:
        """What a report shows of a call: its decoded result, or a ``RecordedError``."""
        if event is None:
            return Divergence.NOTHING
        kind, value = self.of(event, in_rerun=in_rerun)
        if kind == "raised":
            return RecordedError(value)
        return self.decode(value, what=f"the result of step {event.name!r}")


def _returned(events: Sequence[EventBase]) -> dict[int, StepRecorded]:
    return {e.position: e for e in events if isinstance(e, StepRecorded) and returned(e)}


def _compare(recorded: _Summary, new: _Summary, results: _Results) -> Divergence | None:
    """The first divergence of ``new`` from ``recorded``, or None."""
    decode = results.decode
    for index in sorted(set(recorded.steps) | set(new.steps)):
        was, now = recorded.steps.get(index), new.steps.get(index)
        if was is None or now is None:
            return Divergence(
                index, None, "superstep count", None, len(recorded.steps), len(new.steps)
            )
        called = _call_divergence(index, was, now, results)
        if called is not None:
            return called
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


def _call_divergence(index: int, was: _Step, now: _Step, results: _Results) -> Divergence | None:
    """The first step call of superstep ``index`` that differs, executor by executor."""
    for executor_id in sorted(set(was.calls) | set(now.calls)):
        mine, theirs = was.calls.get(executor_id, []), now.calls.get(executor_id, [])
        found = _first_call_difference(mine, theirs, results)
        if found is not None:
            name, old_value, new_value = found
            return Divergence(index, executor_id, "step", name, old_value, new_value)
    return None


def _first_call_difference(
    was: list[StepRecorded], now: list[StepRecorded], results: _Results
) -> tuple[str, Any, Any] | None:
    """(step name, recorded, new) of the first call that differs in two executors' sequences of
    step calls, each in the order the calls were made (``call``, stable for equal ones: a
    lineage-scoped executor counts again from 0 when its function is re-executed).

    Calls are matched by name and identity, one after another. Where the sequences part, the
    rerun's call is reported if the record has no such call left (a new code path, or other
    arguments: it was refused, or ran live), else the recorded call the rerun did not make."""
    was = sorted(was, key=lambda event: event.call)
    now = sorted(now, key=lambda event: event.call)
    for position in range(max(len(was), len(now))):
        old = was[position] if position < len(was) else None
        new = now[position] if position < len(now) else None
        if old is not None and new is not None and (old.name, old.key) == (new.name, new.key):
            if results.of(old, in_rerun=False) != results.of(new, in_rerun=True):
                return (
                    old.name,
                    results.shown(old, in_rerun=False),
                    results.shown(new, in_rerun=True),
                )
            continue
        later = {(event.name, event.key) for event in was[position:]}
        if new is not None and (new.name, new.key) not in later:
            return new.name, Divergence.NOTHING, results.shown(new, in_rerun=True)
        assert old is not None
        return old.name, results.shown(old, in_rerun=False), Divergence.NOTHING
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
