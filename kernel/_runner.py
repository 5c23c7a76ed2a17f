"""The superstep runner: drives one run of a workflow and writes its facts to the log.

The rules it keeps, by construction:

* Every superstep ends with exactly one marker, ``SuperstepCommitted`` or ``SuperstepAborted``.
  The superstep's id is fresh for every superstep of every run, so a marker can only ever decide
  the writes staged in its own superstep.
* A superstep is *closed* the moment its outcome is decided (the first executor failure, a
  cancellation, the commit). From then on ``set_state``, ``send_message`` and ``yield_output``
  raise ``StateWriteRejectedError``; nothing reaches the log for it except its marker.
* The abort is appended before the caller sees the failure or the cancellation.
* Committed state is never computed here: after each append the appended events are folded into
  the workflow's ``CommittedState`` (the same fold projections use).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kernel._context import WorkflowContext
from kernel._errors import (
    ConvergenceError,
    ExecutionError,
    RoutingError,
    StateWriteRejectedError,
    StoreError,
)
from kernel._events import (
    AbortReason,
    ErrorInfo,
    EventBase,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    MessageStaged,
    OutputYielded,
    RunAbandoned,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    SuperstepStarted,
    trusted_event,
)
from kernel._graph import Delivery, FanIn

if TYPE_CHECKING:
    from kernel._workflow import Workflow

__all__ = ["RunResult", "Superstep", "WorkflowEvent"]

WorkflowEventType = Literal[
    "started",
    "superstep_started",
    "executor_invoked",
    "executor_completed",
    "executor_failed",
    "output",
    "superstep_completed",
    "failed",
    "cancelled",
    "completed",
]


@dataclass(frozen=True)
class WorkflowEvent:
    """What a streaming run yields. ``type`` says what happened; the other fields say where.

    ``data`` holds the output for ``output`` events; ``error`` the exception for ``executor_failed``
    and ``failed``.
    """

    type: WorkflowEventType
    run_id: str
    superstep: int | None = None
    superstep_id: str | None = None
    executor_id: str | None = None
    data: Any = None
    error: BaseException | None = None


@dataclass
class RunResult:
    """The outcome of a run that completed."""

    run_id: str
    status: Literal["completed"]
    supersteps: int
    outputs: list[Any] = field(default_factory=list)

    def get_outputs(self) -> list[Any]:
        """The outputs yielded in committed supersteps, in order."""
        return list(self.outputs)


Emit = Callable[[WorkflowEvent], Awaitable[None]] | None


@dataclass
class _Sent:
    source: str
    message: Any
    delivery: Delivery


class Superstep:
    """One superstep of a run: its staged writes, messages and outputs, and whether it is closed."""

    def __init__(self, run: Run, index: int, superstep_id: str) -> None:
        self._run = run
        self.index = index
        self.superstep_id = superstep_id
        self.closed: str | None = None  # None while open; then "committed" or "aborted (why)"
        self.staged: dict[str, tuple[str, Any]] = {}
        self.sent: list[_Sent] = []
        self.outputs: list[tuple[str, Any]] = []
        self.failure: tuple[str, BaseException] | None = None
        self.in_flight: set[str] = set()
        self.cancelling = False
        self.inline_task: asyncio.Task[Any] | None = None

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def instance_id(self) -> str:
        return self._run.workflow.instance_id

    @property
    def run_kwargs(self) -> dict[str, Any]:
        return self._run.kwargs

    def _refuse_if_closed(self, executor_id: str, what: str) -> None:
        if self.closed is None and self.inline_task is not None and self.inline_task.cancelling():
            # The handler runs in the run's own task, and that task is being cancelled.
            self.closed = f"aborted ({self._run.cancel_reason or 'cancelled'})"
        if self.closed is not None:
            raise StateWriteRejectedError(
                f"{what} by executor {executor_id!r} refused: superstep {self.index} "
                f"({self.superstep_id}) of run {self.run_id} is already {self.closed}; "
                "it will never count"
            )

    def stage(self, executor_id: str, key: str, op: Literal["set", "delete"], value: Any) -> None:
        self._refuse_if_closed(executor_id, f"write of state key {key!r}")
        if not isinstance(key, str) or not key:
            raise TypeError(f"state keys must be non-empty strings, got {key!r}")
        wire = None if op == "delete" else self._run.codec.encode(value, what=f"state key {key!r}")
        self._run.log(
            StateStaged,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            key=key,
            op=op,
            value=wire,
        )
        self.staged[key] = (op, value)

    def read(self, key: str, default: Any) -> Any:
        staged = self.staged.get(key)
        if staged is not None:
            return default if staged[0] == "delete" else staged[1]
        wire = self._run.workflow._committed.values.get(key, _MISSING)
        return default if wire is _MISSING else self._run.codec.decode(wire)

    def send(self, source: str, message: Any, target_id: str | None) -> None:
        self._refuse_if_closed(source, "message")
        delivery = self._run.workflow.graph.route(source, message, target_id)
        wire = self._run.codec.encode(message, what=f"message from {source!r}")
        targets = list(delivery.targets) + [g.target for g in delivery.fan_ins]
        self._run.log(
            MessageStaged,
            superstep_id=self.superstep_id,
            source=source,
            target=target_id,
            targets=targets,
            message=wire,
        )
        self.sent.append(_Sent(source, message, delivery))

    def output(self, executor_id: str, value: Any) -> None:
        self._refuse_if_closed(executor_id, "output")
        wire = self._run.codec.encode(value, what=f"output of {executor_id!r}")
        self._run.log(
            OutputYielded, superstep_id=self.superstep_id, executor_id=executor_id, value=wire
        )
        self.outputs.append((executor_id, value))

    def fail(self, executor_id: str, error: BaseException) -> None:
        """Record an executor's failure; the first one closes the superstep."""
        self.in_flight.discard(executor_id)
        self._run.log(
            ExecutorFailed,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            error=ErrorInfo.of(error),
        )
        if self.failure is None:
            self.failure = (executor_id, error)
            self.closed = "aborted (failed)"


_MISSING = object()


class Run:
    """One run of a workflow. ``drive`` executes it; ``log`` and ``flush`` write the log."""

    def __init__(self, workflow: Workflow, message: Any, kwargs: dict[str, Any]) -> None:
        self.workflow = workflow
        self.message = message
        self.kwargs = kwargs
        self.codec = workflow.store.codec
        self.run_id = workflow._ids()
        self.finished = False
        self.cancel_reason: AbortReason | None = None
        self.task: asyncio.Task[Any] | None = None
        self.previous: Run | None = None  # the run this one replaced on its workflow object
        self._emit: Emit = None
        self._buffer: list[EventBase] = []
        self._version = 0
        self._open_superstep: Superstep | None = None
        self._open_superstep_id: str | None = None
        self._fan_in: dict[FanIn, dict[str, list[Any]]] = {}
        self._write_through = workflow.durability == "write"

    # -- the log ------------------------------------------------------------------------------

    def log(self, cls: type[EventBase], **fields: Any) -> None:
        """Create the next event of this run; append it now in "write" durability."""
        fields["run_id"] = self.run_id
        self._log_for(cls, **fields)
        if self._write_through:
            self.flush()

    def flush(self) -> None:
        """Append the buffered events as one atomic batch and fold them into the workflow's view."""
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        try:
            self.workflow.store.append(
                self.workflow.instance_id, batch, expected_version=self._version
            )
        except BaseException:
            self.workflow._forget_view()
            raise
        self._version += len(batch)
        self.workflow._fold(batch)

    # -- driving ------------------------------------------------------------------------------

    async def drive(self, emit: Emit) -> RunResult:
        """Execute the run to its end. Raises what the run raised, after the log records it."""
        self._emit = emit
        workflow = self.workflow
        start = workflow.graph.executors[workflow.graph.start]
        if not start.can_handle(self.message):
            raise RoutingError(
                f"start executor {start.id!r} has no handler for a message of type "
                f"{type(self.message).__qualname__}"
            )
        wire_input = self.codec.encode(self.message, what="the run's input message")
        wire_kwargs = {
            k: self.codec.encode(v, what=f"run argument {k!r}") for k, v in self.kwargs.items()
        }
        await workflow._settle_previous(self)
        head = workflow._catch_up()
        self._version = head.version
        if head.run_id is not None:
            self._close_unfinished(
                head.run_id, head.superstep_id, workflow._presumed_reason(head.owner)
            )
        self.log(
            RunStarted,
            workflow_name=workflow.name,
            input=wire_input,
            kwargs=wire_kwargs,
            owner=workflow._owner,
            durability=workflow.durability,
        )
        self._open_superstep_id = workflow._ids()
        self.log(SuperstepStarted, superstep_id=self._open_superstep_id, index=1)
        self.flush()
        try:
            return await self._supersteps(start.id)
        except asyncio.CancelledError:
            if not self.finished:
                self._record_cancellation(self.cancel_reason or "cancelled")
            raise
        finally:
            self.finished = True

    async def _supersteps(self, start_id: str) -> RunResult:
        emit = self._emit
        if emit is not None:
            await emit(WorkflowEvent("started", self.run_id))
        inbox: dict[str, list[Any]] = {start_id: [self.message]}
        outputs: list[Any] = []
        index = 1
        while True:
            assert self._open_superstep_id is not None
            step = Superstep(self, index, self._open_superstep_id)
            self._open_superstep = step
            if emit is not None:
                await emit(
                    WorkflowEvent("superstep_started", self.run_id, index, step.superstep_id)
                )
            await self._execute(step, inbox)
            inbox = self._commit(step)
            outputs.extend(value for _, value in step.outputs)
            if emit is not None:
                for source, value in step.outputs:
                    await emit(
                        WorkflowEvent(
                            "output", self.run_id, index, step.superstep_id, source, data=value
                        )
                    )
                await emit(
                    WorkflowEvent("superstep_completed", self.run_id, index, step.superstep_id)
                )
            if not inbox:
                self.finished = True
                if emit is not None:
                    await emit(WorkflowEvent("completed", self.run_id, index))
                return RunResult(self.run_id, "completed", index, outputs)
            if index >= self.workflow.max_supersteps:
                error = self._convergence_error(index, inbox)
                if emit is not None:
                    await emit(WorkflowEvent("failed", self.run_id, index, error=error))
                raise error
            index += 1

    async def _execute(self, step: Superstep, inbox: dict[str, list[Any]]) -> None:
        if len(inbox) == 1:
            ((executor_id, messages),) = inbox.items()
            step.inline_task = task = asyncio.current_task()
            await self._invoke_all(step, executor_id, messages, inline=True)
            if task is not None and task.cancelling() and step.failure is None:
                raise asyncio.CancelledError  # the handler swallowed a cancellation of the run
        else:
            tasks = {
                asyncio.create_task(
                    self._invoke_all(step, eid, msgs, inline=False), name=f"steplog:{eid}"
                )
                for eid, msgs in inbox.items()
            }
            pending = tasks
            try:
                while pending and step.failure is None:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                step.closed = step.closed or f"aborted ({self.cancel_reason or 'cancelled'})"
                await _cancel_and_wait(step, pending)
                raise
            if pending:
                await _cancel_and_wait(step, pending)
        if step.failure is not None:
            await self._abort_failed(step)

    async def _invoke_all(
        self, step: Superstep, executor_id: str, messages: list[Any], *, inline: bool
    ) -> None:
        executor = self.workflow.graph.executors[executor_id]
        emit = self._emit
        for message in messages:
            if step.closed is not None:
                return
            self.log(ExecutorInvoked, superstep_id=step.superstep_id, executor_id=executor_id)
            step.in_flight.add(executor_id)
            if emit is not None:
                await emit(
                    WorkflowEvent(
                        "executor_invoked", self.run_id, step.index, step.superstep_id, executor_id
                    )
                )
            try:
                await executor.execute(message, WorkflowContext(step, executor_id))
            except asyncio.CancelledError as error:
                if inline or step.cancelling:
                    raise
                step.fail(executor_id, error)  # the handler cancelled itself: a failure
                return
            except Exception as error:
                step.fail(executor_id, error)
                return
            step.in_flight.discard(executor_id)
            self.log(ExecutorCompleted, superstep_id=step.superstep_id, executor_id=executor_id)
            if emit is not None:
                await emit(
                    WorkflowEvent(
                        "executor_completed",
                        self.run_id,
                        step.index,
                        step.superstep_id,
                        executor_id,
                    )
                )

    async def _abort_failed(self, step: Superstep) -> None:
        assert step.failure is not None
        executor_id, error = step.failure
        info = ErrorInfo.of(error)
        self._write_through = False  # the marker and the run's end go in one batch
        for sibling in sorted(step.in_flight):
            self.log(
                ExecutorFailed,
                superstep_id=step.superstep_id,
                executor_id=sibling,
                error=ErrorInfo(
                    type="asyncio.CancelledError", message=f"cancelled: {executor_id!r} failed"
                ),
            )
        self.log(SuperstepAborted, superstep_id=step.superstep_id, reason="failed", error=info)
        self.log(RunFailed, error=info, executor_id=executor_id, superstep_id=step.superstep_id)
        self._open_superstep_id = None
        self.finished = True
        self.flush()
        if self._emit is not None:
            await self._emit(
                WorkflowEvent(
                    "executor_failed",
                    self.run_id,
                    step.index,
                    step.superstep_id,
                    executor_id,
                    error=error,
                )
            )
            await self._emit(
                WorkflowEvent(
                    "failed", self.run_id, step.index, step.superstep_id, executor_id, error=error
                )
            )
        raise error

    def _commit(self, step: Superstep) -> dict[str, list[Any]]:
        """Close the superstep as committed; open the next one in the same batch if there is one."""
        step.closed = "committed"
        inbox = self._next_inbox(step)
        self.log(SuperstepCommitted, superstep_id=step.superstep_id)
        if not inbox:
            self.log(RunCompleted, supersteps=step.index)
            self._open_superstep_id = None
        elif step.index >= self.workflow.max_supersteps:
            error = self._convergence_error(step.index, inbox)
            self.log(RunFailed, error=ErrorInfo.of(error))
            self._open_superstep_id = None
            self.finished = True
        else:
            self._open_superstep_id = self.workflow._ids()
            self.log(SuperstepStarted, superstep_id=self._open_superstep_id, index=step.index + 1)
        self.flush()
        self._open_superstep = None
        return inbox

    def _next_inbox(self, step: Superstep) -> dict[str, list[Any]]:
        inbox: dict[str, list[Any]] = {}
        for sent in step.sent:
            for target in sent.delivery.targets:
                inbox.setdefault(target, []).append(sent.message)
            for group in sent.delivery.fan_ins:
                buffer = self._fan_in.setdefault(group, {})
                buffer.setdefault(sent.source, []).append(sent.message)
        for group, buffer in self._fan_in.items():
            if all(buffer.get(source) for source in group.sources):
                gathered = [m for source in group.sources for m in buffer[source]]
                buffer.clear()
                inbox.setdefault(group.target, []).append(gathered)
        return inbox

    def _convergence_error(self, index: int, inbox: dict[str, list[Any]]) -> ConvergenceError:
        return ConvergenceError(
            f"run {self.run_id} of {self.workflow.instance_id!r} did not converge within "
            f"max_supersteps={self.workflow.max_supersteps}: after superstep {index}, messages "
            f"were still pending for {', '.join(sorted(inbox))}"
        )

    def _record_cancellation(self, reason: AbortReason) -> None:
        """Abort the open superstep and close the run; called while the cancellation unwinds."""
        self._write_through = False  # the marker and the run's end go in one batch
        step = self._open_superstep
        if step is not None:
            step.closed = f"aborted ({reason})"
        superstep_id = self._open_superstep_id
        if superstep_id is not None:
            self.log(SuperstepAborted, superstep_id=superstep_id, reason=reason)
        if reason == "cancelled":
            self.log(RunCancelled, superstep_id=superstep_id)
        else:
            self.log(RunAbandoned, reason="abandoned", superstep_id=superstep_id)
        self._open_superstep_id = None
        self.finished = True
        # The cancellation must still propagate; if this append fails, the next run closes the run.
        with contextlib.suppress(StoreError):
            self.flush()

    def _close_unfinished(self, run_id: str, superstep_id: str | None, reason: AbortReason) -> None:
        """Close a run found unfinished in the log (dropped stream, dead process)."""
        fields: dict[str, Any] = {"run_id": run_id}
        if superstep_id is not None:
            self._log_for(SuperstepAborted, superstep_id=superstep_id, reason=reason, **fields)
        self._log_for(
            RunAbandoned,
            reason="crashed" if reason == "crashed" else "abandoned",
            superstep_id=superstep_id,
            closed_by=self.run_id,
            **fields,
        )

    def _log_for(self, cls: type[EventBase], **fields: Any) -> None:
        """Buffer the next event of the stream (of this run, or of a run this one closes).

        The runner's own fields are trusted, so the event is constructed without re-validation
        (the store's mapper validates on the way back); only the injected clock is checked.
        """
        timestamp = self.workflow._clock()
        if timestamp.tzinfo is None:
            raise ExecutionError(f"the workflow's clock returned a naive datetime: {timestamp!r}")
        fields.update(
            instance_id=self.workflow.instance_id,
            position=self._version + len(self._buffer) + 1,
            timestamp=timestamp,
        )
        event = trusted_event(cls, fields)
        self._buffer.append(event if event is not None else cls.model_validate(fields))


async def _cancel_and_wait(step: Superstep, tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel executor tasks and wait until all have finished, even if cancelled again."""
    step.cancelling = True
    for task in tasks:
        task.cancel()
    remaining = set(tasks)
    interrupted = False
    while remaining:
        try:
            _, remaining = await asyncio.wait(remaining)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError


def process_owner() -> str:
    """``host:pid`` of this process, recorded in ``RunStarted.owner``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def presumed_reason(owner: str) -> AbortReason:
    """Presume why a run stopped: crashed if its process is provably gone, else abandoned."""
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return "abandoned"
    pid = int(pid_text)
    if pid == os.getpid():
        return "abandoned"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "crashed"
    except PermissionError:
        return "abandoned"
    return "abandoned"
