"""The superstep runner: drives one run of a workflow and writes its facts to the log.

A ``Run`` knows its instance only through a ``RunnerContext`` (``kernel._run._instance``); where
messages go and what the next superstep receives is the step algebra of ``kernel._run._algo``. The
loop starts from a ``Position`` (next superstep's index, inbox, fan-in buffers), so a run can be
driven on from wherever its log says it stands.

The module is a little over 450 lines because every path that closes a superstep (commit, failure,
cancellation, a batch the store refuses) is here, side by side: they must write the same markers.

The rules it keeps, by construction:

* Every superstep ends with exactly one marker, ``SuperstepCommitted`` or ``SuperstepAborted``.
  The superstep's id is fresh for every superstep of every run, so a marker can only ever decide
  the writes staged in its own superstep.
* A superstep is *closed* the moment its outcome is decided (the first executor failure, a
  cancellation, the commit). From then on ``set_state``, ``send_message`` and ``yield_output``
  raise ``StateWriteRejectedError``; nothing reaches the log for it except its marker.
* Only the run's own cancellation is a cancellation (its task cancelled, or the runner cancelling
  a closing superstep's executors). A ``CancelledError`` out of a handler otherwise (a sub-task it
  awaited was cancelled by someone else) is that executor's failure, raised as ``ExecutionError``.
* A cancellation that reaches an awaited run (``await wf.run(...)``, in its caller's task) once
  the batch holding the run's end is durable comes too late: the run is over, as the log says,
  and its caller gets its result (the cancellation is withdrawn, ``Task.uncancel``). A blocking
  handler delivers its caller's timeout only when it returns; if the run's last commit is then
  in flight, the log says completed, and so does the caller.
* The abort is appended before the caller sees the failure or the cancellation. A superstep's
  closing events (its marker, and the run's end or the next superstep's start) go in one batch; if
  the store cannot encode that batch, the superstep's events are appended one by one (as
  ``"write"`` durability would have), leaving out what cannot be stored, and the superstep is
  closed as aborted all the same.
* Committed state is never computed here: the context folds every appended batch into its view.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kernel._base._errors import (
    ConvergenceError,
    EncodingError,
    ExecutionError,
    PendingRequestsError,
    ResumeError,
    RoutingError,
    RunInProgressError,
    StoreError,
)
from kernel._define._context import WorkflowContext
from kernel._define._stream import WorkflowEvent, WorkflowRunState
from kernel._log._events import (
    AbortReason,
    ErrorInfo,
    EventBase,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    ResponseReceived,
    RunAbandoned,
    RunAwaitingInput,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SuperstepAborted,
    SuperstepCommitted,
    SuperstepStarted,
    trusted_event,
)
from kernel._log._requests import PendingRequest, Response
from kernel._run._algo import Position
from kernel._run._emit import Emit, Put, emitter, framework_event, silent
from kernel._run._hooks import HookChain, RunInfo, RunStatus, SuperstepInfo, chain_hooks
from kernel._run._ledger import (
    Continuation,
    Ledger,
    answer,
    check_responses,
    continued_run,
    waiting,
)
from kernel._run._superstep import RunScope, Superstep, SuperstepOutcome

if TYPE_CHECKING:
    from kernel._log._fold import OpenRun
    from kernel._run._instance import LeaseHold, RunnerContext

__all__ = ["Continuation", "Run", "RunResult", "unfinished_closing"]  # Continuation: _ledger's


_FINAL_STATES = {
    "completed": WorkflowRunState.IDLE,
    "awaiting_input": WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
}


@dataclass
class RunResult:
    """The outcome of a run that completed, or stopped waiting for responses to its requests.

    For a run that continues another, ``outputs`` and ``supersteps`` count from the start of the
    run it continues (its whole lineage), so a resumed run reports what an uninterrupted run of
    the same workflow would.

    Like AF's ``WorkflowRunResult``, it is also the sequence of the run's events: iterating it,
    ``len`` and indexing give the events a streaming consumer of this run got (without
    ``started`` and the ``status`` events, which ``status_timeline()`` gives; ``run(...,
    include_status_events=True)`` keeps them in). They are read back from the log the first
    time they are asked for (``replay``), so a run nobody asks costs nothing more.
    """

    run_id: str
    status: Literal["completed", "awaiting_input"]
    supersteps: int
    outputs: list[Any] = field(default_factory=list)
    pending_requests: list[PendingRequest] = field(default_factory=list)
    intermediate_outputs: list[Any] = field(default_factory=list)
    include_status_events: bool = field(default=False, repr=False, compare=False)
    _source: Callable[[], list[WorkflowEvent]] | None = field(
        default=None, repr=False, compare=False
    )
    _events: list[WorkflowEvent] | None = field(default=None, repr=False, compare=False)

    def events(self) -> list[WorkflowEvent]:
        """Every event of the run's stream, ``started`` and ``status`` events included."""
        if self._events is None:
            if self._source is None:
                raise ExecutionError(
                    f"the events of run {self.run_id} are not at hand: this RunResult was not "
                    "returned by a run; read them with replay(store, run_id)"
                )
            self._events = self._source()
        return list(self._events)

    def _shown(self) -> list[WorkflowEvent]:
        keep = self.include_status_events
        return [e for e in self.events() if e.type != "started" and (keep or e.type != "status")]

    def __iter__(self) -> Iterator[WorkflowEvent]:
        return iter(self._shown())

    def __len__(self) -> int:
        return len(self._shown())

    def __getitem__(self, index: int) -> WorkflowEvent:
        return self._shown()[index]

    def __bool__(self) -> bool:
        return True

    def get_outputs(self) -> list[Any]:
        """The workflow outputs yielded in committed supersteps, in order (of the whole
        lineage)."""
        return list(self.outputs)

    def get_intermediate_outputs(self) -> list[Any]:
        """The intermediate outputs (``intermediate_output_from=``) of committed supersteps, in
        order (of the whole lineage)."""
        return list(self.intermediate_outputs)

    def get_final_state(self) -> WorkflowRunState:
        """``IDLE`` for a completed run, ``IDLE_WITH_PENDING_REQUESTS`` for one waiting for
        responses: the state of the run's last ``status`` event."""
        return _FINAL_STATES[self.status]

    def status_timeline(self) -> list[WorkflowEvent]:
        """The run's ``status`` events, in order."""
        return [e for e in self.events() if e.type == "status"]

    def get_request_info_events(self) -> list[WorkflowEvent]:
        """The requests still waiting for a response, as ``request_info`` events."""
        return [
            framework_event(
                "request_info",
                self.run_id,
                executor_id=request.executor_id,
                superstep_id=request.superstep_id,
                data=request.data,
                request_id=request.request_id,
                response_type=request.response_type or None,
            )
            for request in self.pending_requests
        ]


class Run:
    """One run on a workflow instance. ``drive`` executes it; ``log`` and ``flush`` write the log.

    ``instance`` is all the run knows of its workflow (see ``RunnerContext``); its supersteps know
    the run only through the ``RunScope`` it hands them. It calls the instance's hooks
    (``RunHooks``) as it goes.
    """

    def __init__(
        self,
        instance: RunnerContext,
        message: Any,
        kwargs: dict[str, Any],
        continuation: Continuation | None = None,
    ) -> None:
        self.instance = instance
        self.message = message
        self.kwargs = kwargs
        self.continuation = continuation
        self.codec = instance.codec
        self.router = instance.router
        self.run_id = instance.new_id()
        self.finished = False
        self.cancel_reason: AbortReason | None = None
        self.task: asyncio.Task[Any] | None = None
        self.previous: Run | None = None  # a run this one replaced and must let finish first
        self.outputs: list[Any] = []  # of committed supersteps, in order
        self.intermediate_outputs: list[Any] = []  # likewise
        self.result: RunResult | None = None
        # The run executes in its caller's task and is awaited there (``_run_inline``), not
        # streamed nor nested in a parent's superstep: its end is its caller's outcome.
        self.awaited = False
        self.first_position = 0  # the stream's length before the run's first event
        self.last_position = 0  # the position of its last event, once it returned
        self.include_status_events = False
        # Set by the workflow: a run with a message may leave pending requests unanswerable.
        self.supersede_requests = False
        # Set by the workflow: lets a result read the run's events back from the log.
        self.bind_log: Callable[[Run, RunResult], None] | None = None
        self._asked = False  # a request_info was emitted: the stream said so in a status
        # Events logged right after this run's ``RunStarted`` (a sub-workflow's link to its parent).
        self.preamble: list[tuple[type[EventBase], dict[str, Any]]] = []
        # Set by a sub-workflow: the parent superstep it runs in, and the executor running it.
        self.parent: tuple[SuperstepInfo, str] | None = None
        self._hooks: HookChain | None = chain_hooks(instance.hooks)
        self._run_info: RunInfo | None = None  # once ``run_started`` was called
        self._hooked_step: SuperstepInfo | None = None  # started, not yet committed or aborted
        self._late_hook_errors: list[BaseException] = []
        self._continues: str | None = None
        self._end_status: RunStatus | None = None  # the run's end, once logged
        self._emit: Emit = silent
        self._clock = instance.clock
        self._instance_id = instance.instance_id
        self._buffer: list[EventBase] = []
        self._version = 0
        self._open_superstep: Superstep | None = None
        self._open_superstep_id: str | None = None
        self._write_through = instance.durability == "write"
        self._taken_over = False
        self._keeper: LeaseHold | None = None
        self._lost_lease: RunInProgressError | None = None

    # -- the log ------------------------------------------------------------------------------

    def log(self, cls: type[EventBase], **fields: Any) -> None:
        """Create the next event of this run; append it now in "write" durability."""
        fields["run_id"] = self.run_id
        self._log_for(cls, fields)
        if self._write_through:
            self.flush()

    def head(self, cls: type[EventBase], superstep_id: str) -> dict[str, Any]:
        """The fields every event of ``cls`` in superstep ``superstep_id`` of this run has alike,
        in declared order, with position and time left for ``record`` to set. A superstep makes
        its heads once; each event is then one dict, ``{**head, <its own fields>}``."""
        return {
            **_envelope(cls),
            "instance_id": self._instance_id,
            "position": 0,
            "timestamp": None,
            "run_id": self.run_id,
            "superstep_id": superstep_id,
        }

    def record(self, cls: type[EventBase], data: dict[str, Any]) -> None:
        """``log`` on a superstep's hot path: ``data`` holds every field of the event (from a
        ``head``) but its position and time, which are set here. It becomes the event's own."""
        self._stamp(cls, data)
        if self._write_through:
            self.flush()

    def flush(self) -> None:
        """Append the buffered events as one atomic batch (dropped if the append fails)."""
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self.instance.append(batch, expected_version=self._version)
        self._version += len(batch)

    def _flush_closing(
        self, opened: int, reclose: Callable[[EncodingError], None] | None = None
    ) -> EncodingError | None:
        """Append the buffer: the superstep's events before index ``opened``, then its closing.

        If the store cannot encode the batch, append the superstep's events one at a time (leaving
        out those it cannot encode), then the closing again, or what ``reclose(error)`` logs.
        Returns the encoding error in that case, None when the batch went in whole.
        """
        batch = self._buffer
        try:
            self.flush()
        except EncodingError as error:
            return self._reflush(batch, opened, reclose, error)
        return None

    async def _flush_commit(
        self, opened: int, reclose: Callable[[EncodingError], None]
    ) -> tuple[EncodingError | None, int]:
        """``_flush_closing`` for a superstep's commit batch, through the store's group commit
        where it has one. Returns the encoding error (as ``_flush_closing``) and how many times
        this task was cancelled while the batch was in flight: the batch cannot be taken back,
        so its outcome is awaited first, and the caller records it before the cancellation
        unwinds (or withdraws it: ``_commit``)."""
        batch, self._buffer = self._buffer, []
        try:
            pending = self.instance.append_commit(batch, expected_version=self._version)
        except EncodingError as error:
            return self._reflush(batch, opened, reclose, error), 0
        cancels = 0
        if pending is not None:
            try:
                await asyncio.shield(pending)
            except asyncio.CancelledError:
                cancels = 1
                while not pending.done():
                    try:
                        await asyncio.wait((pending,))
                    except asyncio.CancelledError:
                        cancels += 1
                if pending.exception() is not None:
                    raise  # nothing landed: unwind as the cancellation it is
        self._version += len(batch)
        return None, cancels

    def _reflush(
        self,
        batch: list[EventBase],
        opened: int,
        reclose: Callable[[EncodingError], None] | None,
        refused: EncodingError,
    ) -> EncodingError:
        """After the store refused to encode ``batch``: its superstep's events one at a time
        (those it can encode), then the closing again, or what ``reclose(refused)`` logs."""
        for event in batch[:opened]:
            self._buffer = [event.model_copy(update={"position": self._version + 1})]
            with contextlib.suppress(EncodingError):
                self.flush()
        self._buffer = []
        if reclose is not None:
            reclose(refused)
        else:
            for event in batch[opened:]:
                position = self._version + len(self._buffer) + 1
                self._buffer.append(event.model_copy(update={"position": position}))
        self.flush()
        return refused

    # -- driving ------------------------------------------------------------------------------

    async def drive(self, put: Put | None = None) -> RunResult:
        """Execute the run to its end, handing ``WorkflowEvent``s to ``put`` if given.

        Raises what the run raised, after the log records it.
        """
        if put is not None:
            self._emit = emitter(self.run_id, put)
        self._keeper = keeper = self.instance.lease_keeper()
        try:
            await self._settle_previous()
            self._taken_over = await keeper.acquire()
            keeper.start_heartbeat(self._lease_lost)
            if self.continuation is None:
                position = self._start()
            else:
                position = self._continue(self.continuation)
        except BaseException:
            self.finished = True  # nothing of the run is open: the instance is free again
            await keeper.release()
            raise
        try:
            result = await self._supersteps(position)
            self.last_position = self._version
            if self.bind_log is not None:
                self.bind_log(self, result)
            self.result = result
        except asyncio.CancelledError as cancelled:
            lost = self._lost_lease
            if lost is not None:  # the run is not ours to close any more: its taker closes it
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # the cancellation was ours, not the caller's
                if self._hooks is not None:
                    self._end_hooks("abandoned", lost)
                raise lost from None
            if not self.finished:
                self._record_end(self.cancel_reason or "cancelled")
            if self._hooks is not None:
                self._end_hooks(self._end_status or "cancelled", cancelled)
            raise
        except BaseException as error:  # SystemExit from a handler, a store error mid-superstep
            if not self.finished:
                self._record_end("failed", error)
            if self._hooks is not None:
                self._end_hooks(self._end_status or "failed", error)
            raise
        finally:
            self.finished = True
            await keeper.release()
        if self._hooks is not None:
            late = self._end_hooks(result.status, None)
            if late is not None:  # the run is over, as the log says; its hooks failed
                raise late
        return result

    # -- hooks --------------------------------------------------------------------------------

    def _late_hook(self, name: str, *args: Any) -> None:
        """Call hook ``name`` while the run is ending: what it raises cannot change how the run
        ends (the log has it), so it is kept for ``_end_hooks``, never dropped."""
        try:
            getattr(self._hooks, name)(*args)
        except Exception as error:
            self._late_hook_errors.append(error)

    def _hook_aborted(self, reason: AbortReason, error: BaseException | None) -> None:
        """``superstep_aborted`` for the superstep whose ``superstep_started`` was called."""
        step, self._hooked_step = self._hooked_step, None
        if step is not None:
            self._late_hook("superstep_aborted", step, reason, error)

    def _hook_failed(self, step: Superstep, executor_id: str, error: BaseException) -> None:
        """``executor_failed`` for a handler that raised ``error``; a ``message_sent`` hook's
        error, if any, is added to it as a note."""
        lost = step.hook_failures.pop(executor_id, None)
        if lost is not None:
            error.add_note(f"and a hook failed before: {lost}")
        self._late_hook("executor_failed", step.info, executor_id, error)

    def _hook_completed(self, step: Superstep, executor_id: str) -> bool:
        """After ``executor_id``'s handler returned: fail it with what a ``message_sent`` hook
        raised, else call ``executor_completed`` (what that raises fails it too). Returns
        whether the executor completed."""
        hooks = self._hooks
        assert hooks is not None
        error = step.hook_failures.pop(executor_id, None)
        if error is None:
            try:
                hooks.executor_completed(step.info, executor_id)
                return True
            except Exception as raised:
                error = raised
        step.fail(executor_id, error)
        self._late_hook("executor_failed", step.info, executor_id, error)
        return False

    def _end_hooks(self, status: RunStatus, error: BaseException | None) -> BaseException | None:
        """Call ``run_ended`` (if ``run_started`` was called), then deal with what hooks raised
        while the run was ending: added as notes to ``error``, the run's own, if it has one;
        else the first of them is returned, for the run to raise (the others as its notes)."""
        run, self._run_info = self._run_info, None
        if run is not None:
            self._late_hook("run_ended", run, status, error)
        late, self._late_hook_errors = self._late_hook_errors, []
        if not late:
            return None
        if error is not None:
            for hook_error in late:
                error.add_note(f"and while the run ended: {hook_error}")
            return None
        for hook_error in late[1:]:
            late[0].add_note(f"and: {hook_error}")
        return late[0]

    def _ended(self) -> None:
        """The run's end is in the log: give the instance's lease up at once, before the last
        events reach the consumer (who may take its time, or drop the stream)."""
        self.finished = True
        self.give_up_lease()

    def give_up_lease(self) -> None:
        """Release the instance's lease now (its stream was dropped): the run is as good as gone."""
        if self._keeper is not None:
            self._keeper.release_now()

    def _lease_lost(self) -> None:
        """The heartbeat found the lease taken over: another process judged this one gone and
        closes the run. Stop at once, appending nothing more (the version check would refuse it
        anyway); the run raises ``RunInProgressError`` naming the new holder."""
        task = self.task
        if task is None or task.done() or self.finished:
            return
        instance = self.instance
        self._lost_lease = RunInProgressError(
            f"run {self.run_id} lost the lease on instance {instance.instance_id!r}: another "
            "process took it over (this one looked dead, or its lease expired), and closes the "
            "run; nothing more of it was appended"
        )
        self.cancel_reason = self.cancel_reason or "abandoned"
        task.cancel()

    def _unfinished_reason(self, owner: str) -> AbortReason:
        """Why the run found open stopped: ``crashed`` if this run took the lease over from a
        dead or expired holder, else what its owner's process says."""
        return "crashed" if self._taken_over else self.instance.presumed_reason(owner)

    def _start(self) -> Position:
        """Check the input, close a run the log shows unfinished, and append the run's start.

        Returns the position of the run's first superstep, which is open in the log.
        """
        instance = self.instance
        graph = self.router.graph
        start = graph.executors[graph.start]
        if not start.can_handle(self.message):
            raise RoutingError(
                f"start executor {start.id!r} has no handler for a message of type "
                f"{type(self.message).__qualname__}"
            )
        wire_input = self.codec.encode(self.message, what="the run's input message")
        head = instance.catch_up()
        if head.requests_may_wait and not self.supersede_requests:
            head, ledger = instance.catch_up_ledger()
            self._refuse_if_waiting(ledger)
        self._log_start(head, input=wire_input)
        self._open_superstep_id = instance.new_id()
        self.log(SuperstepStarted, superstep_id=self._open_superstep_id, index=1)
        self.flush()
        return Position.start(start.id, self.message)

    def _refuse_if_waiting(self, ledger: Ledger) -> None:
        """Refuse a run with a new message while something waits on the instance's last run
        (``waiting``: requests without a response, or responses recorded that only ``resume()``
        delivers): it continues nothing, so they would be dropped. Nothing silent:
        ``PendingRequestsError`` names them and says how to go on with them or anyway."""
        found = waiting(ledger)
        if not found:
            return
        where = f"instance {self.instance.instance_id!r}"
        parts: list[str] = []
        ways: list[str] = []
        requests = found.requests
        if requests:
            shown = ", ".join(
                f"{rid} (from {r.get('executor_id')!r}, run {r.get('run_id')})"
                for rid, r in list(requests.items())[:5]
            )
            more = f" and {len(requests) - 5} more" if len(requests) > 5 else ""
            parts.append(f"{len(requests)} request(s) waiting for a response: {shown}{more}")
            ways.append(
                "answer them with run(responses={request_id: value}) (or 'steplog respond RUN "
                "REQUEST_ID JSON' and resume())"
            )
        responses = found.responses
        if responses:
            shown = ", ".join(
                f"to {r.request_id} (recorded by run {r.run_id} at position {r.position})"
                for r in responses[:5]
            )
            more = f" and {len(responses) - 5} more" if len(responses) > 5 else ""
            parts.append(f"{len(responses)} recorded response(s) not yet delivered: {shown}{more}")
            ways.append("deliver the recorded response(s) with resume()")
        how = "; ".join(ways)
        raise PendingRequestsError(
            f"{where} has {' and '.join(parts)}. A run with a new message continues nothing and "
            f"would drop them, so none was started. {how[0].upper()}{how[1:]}; or start the "
            "new run anyway, giving them up, with run(message, supersede_requests=True) (a fork "
            "of the latest checkpoint can still go on with them)",
            request_ids=tuple(requests),
            responded_ids=tuple(r.request_id for r in responses),
        )

    def _log_start(self, head: OpenRun, **fields: Any) -> None:
        """Buffer the closing of the run ``head`` shows unfinished, if any, then ``RunStarted``
        with this run's arguments and ``fields``. Raises ``EncodingError`` (buffering nothing)
        for an argument the log cannot store."""
        instance = self.instance
        wire_kwargs = {
            k: self.codec.encode(v, what=f"run argument {k!r}") for k, v in self.kwargs.items()
        }
        self._version = self.first_position = head.version
        if head.run_id is not None:
            reason = self._unfinished_reason(head.owner)
            self._close_unfinished(head.run_id, head.superstep_id, reason)
        self.log(
            RunStarted,
            workflow_name=instance.workflow_name,
            kwargs=wire_kwargs,
            owner=instance.owner,
            durability=instance.durability,
            sensitive_keys=list(instance.sensitive_keys),
            **fields,
        )
        for cls, extra in self.preamble:
            self.log(cls, **extra)

    def _continue(self, plan: Continuation) -> Position:
        """Close a run the log shows unfinished, then start a run that continues one from its
        latest checkpoint, recording and delivering ``plan.responses``.

        Everything is checked before anything is appended: a refusal (``ResumeError``,
        ``ResponseError``, ``ConvergenceError`` past ``max_supersteps``) leaves the log as it
        was. Returns the position of the run's first superstep, which is open in the log.
        """
        instance = self.instance
        head, ledger = instance.catch_up_ledger()
        self._version = head.version
        line, checkpoint = continued_run(ledger, plan, instance.workflow_name)
        standing = ledger.standing(
            line, checkpoint, router=self.router, codec=self.codec, origin=instance.origin_ledger
        )
        answers = check_responses(ledger, standing.position, plan.responses, self.router.graph)
        wire = [
            (rid, self.codec.encode(value, what=f"the response to request {rid!r}"))
            for rid, (_, value) in answers.items()
        ]
        position = answer(standing.position, list(answers.values()))
        if not position.inbox:
            if position.requests:
                pending = ", ".join(position.requests)
                raise ResumeError(
                    f"run {line} of {instance.instance_id!r} is waiting for responses to its "
                    f"requests ({pending}); continue it with run(responses={{request_id: value}})"
                )
            raise ResumeError(
                f"run {line} of {instance.instance_id!r} has nothing left to do after its "
                "latest checkpoint: it completed; start a new run with a message"
            )
        if position.index > instance.max_supersteps:
            raise ConvergenceError(
                f"run {line} of {instance.instance_id!r} cannot be continued: its next superstep "
                f"would be {position.index}, past max_supersteps={instance.max_supersteps}"
            )
        if not self.kwargs:  # a continuation runs with its lineage's arguments
            self.kwargs = {k: self.codec.decode(v) for k, v in standing.kwargs.items()}
        self._continues = line
        self._log_start(head, continues=line, checkpoint=checkpoint)
        for request_id, value in wire:
            self.log(ResponseReceived, request_id=request_id, value=value)
        self.outputs = list(standing.outputs)
        self.intermediate_outputs = list(standing.intermediate_outputs)
        self._open_superstep_id = instance.new_id()
        self.log(SuperstepStarted, superstep_id=self._open_superstep_id, index=position.index)
        self.flush()
        return position

    async def _settle_previous(self) -> None:
        """Wait for a dropped stream's run to record its abort before this run appends anything."""
        previous, self.previous = self.previous, None
        if previous is None:
            return
        task = previous.task
        if task is not None and not task.done():
            try:
                loop = task.get_loop()
            except RuntimeError:
                loop = None
            if loop is asyncio.get_running_loop():
                previous.cancel_reason = previous.cancel_reason or "abandoned"
                task.cancel()
                await asyncio.wait({task})

    async def _supersteps(self, position: Position) -> RunResult:
        """Run supersteps from ``position`` (whose superstep is open in the log) to the end."""
        emit, hooks = self._emit, self._hooks
        scope = RunScope(
            self.run_id,
            self.instance,
            self.kwargs,
            self.router,
            hooks,
            self.log,
            self.record,
            self.head,
            self._cancel_reason,
        )
        if hooks is not None:
            parent, parent_executor = self.parent or (None, None)
            self._run_info = run = RunInfo(
                self._instance_id,
                self.run_id,
                self.instance.workflow_name,
                self._continues,
                parent,
                parent_executor,
            )
            hooks.run_started(run)  # what it raises fails the run (recorded by ``drive``)
        await emit("started")
        await emit("status", state=WorkflowRunState.IN_PROGRESS)
        while True:
            superstep_id = self._open_superstep_id
            assert superstep_id is not None
            step = Superstep(scope, position.index, superstep_id)
            self._open_superstep = step
            if hooks is not None:
                self._hooked_step = step.info
                hooks.superstep_started(step.info)
            await emit("superstep_started", step.index, superstep_id)
            await self._execute(step, position.inbox)
            try:
                position = await self._commit(step, position)
            except EncodingError as refused:  # recorded: the superstep aborted, the run failed
                await emit("status", state=WorkflowRunState.FAILED)
                await emit("failed", step.index, superstep_id, error=refused)
                raise
            if emit is not silent:
                await self._emit_committed(step)
            await emit("superstep_completed", step.index, superstep_id)
            if not position.inbox:
                if position.requests:
                    await emit("status", state=WorkflowRunState.IDLE_WITH_PENDING_REQUESTS)
                    await emit("awaiting_input", step.index)
                    pending = list(position.requests.values())
                    return RunResult(
                        self.run_id,
                        "awaiting_input",
                        step.index,
                        self.outputs,
                        pending,
                        self.intermediate_outputs,
                    )
                await emit("status", state=WorkflowRunState.IDLE)
                await emit("completed", step.index)
                return RunResult(
                    self.run_id,
                    "completed",
                    step.index,
                    self.outputs,
                    intermediate_outputs=self.intermediate_outputs,
                )
            if step.index >= self.instance.max_supersteps:
                error = self._convergence_error(step.index, position)
                await emit("status", state=WorkflowRunState.FAILED)
                await emit("failed", step.index, error=error)
                raise error

    def _cancel_reason(self) -> AbortReason | None:
        return self.cancel_reason

    async def _emit_committed(self, step: Superstep) -> None:
        """A committed superstep's outputs (``output`` or ``intermediate``, as designated; hidden
        ones not at all) and custom events, in the order they were made, then its requests;
        after the run's first request, the status says requests are pending."""
        emit, index, superstep_id = self._emit, step.index, step.superstep_id
        custom = step.custom
        shown = 0
        for made, (source, value, kind) in enumerate(step.outputs):
            while shown < len(custom) and custom[shown][0] <= made:
                await emit(custom[shown][1])
                shown += 1
            if kind != "hidden":
                await emit(kind, index, superstep_id, source, value)
        for _, event in custom[shown:]:
            await emit(event)
        for request in step.requested:
            await emit(
                "request_info",
                index,
                superstep_id,
                request.executor_id,
                data=request.data,
                request_id=request.request_id,
                response_type=request.response_type or None,
            )
        if step.requested and not self._asked:
            self._asked = True
            await emit("status", state=WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS)

    async def _execute(self, step: Superstep, inbox: dict[str, list[Any]]) -> None:
        if len(inbox) == 1:
            ((executor_id, messages),) = inbox.items()
            step.inline_task = task = asyncio.current_task()
            await self._invoke_all(step, executor_id, messages, inline=True)
            if task is not None and task.cancelling():
                # The run was cancelled and the handler swallowed it (and then returned, or
                # failed, say on a refused write): the run is cancelled all the same.
                raise asyncio.CancelledError
        else:
            loop = asyncio.get_running_loop()
            tasks = {
                loop.create_task(
                    self._invoke_all(step, eid, msgs, inline=False), name=f"steplog:{eid}"
                )
                for eid, msgs in inbox.items()
            }
            pending = tasks
            escaped: BaseException | None = None  # not a handler's failure: the store's, say
            try:
                # One turn of the loop runs every task's first step (they were scheduled before
                # this task's own resumption). Handlers that never await are all done by then,
                # and the superstep goes on without a completion callback per task. Otherwise
                # wait from the whole set, the finished ones included: the wake-up comes at the
                # same turn of the loop as it would have without this first look.
                await asyncio.sleep(0)
                if all(task.done() for task in tasks):
                    pending = set()
                    escaped = _escaped(tasks)
                while pending and step.failure is None and escaped is None:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    escaped = _escaped(done)
            except asyncio.CancelledError:
                if step.outcome is None:
                    step.outcome = SuperstepOutcome(self.cancel_reason or "cancelled")
                await _cancel_and_wait(step, pending)
                raise
            if escaped is not None and step.failure is None:
                step.outcome = SuperstepOutcome.FAILED  # siblings' writes are refused from now
            if pending:
                await _cancel_and_wait(step, pending)
            if escaped is not None and step.failure is None:
                raise escaped  # the run records the abort and its end (see ``drive``)
        if step.failure is not None:
            await self._abort_failed(step)

    async def _invoke_all(
        self, step: Superstep, executor_id: str, messages: list[Any], *, inline: bool
    ) -> None:
        executor = self.router.graph.executors[executor_id]
        emit, hooks = self._emit, self._hooks
        streaming = emit is not silent  # awaiting ``silent`` does nothing, and costs a coroutine
        record, in_flight = self.record, step.in_flight
        superstep_id = step.superstep_id
        for message in messages:
            if step.outcome is not None:
                return
            record(ExecutorInvoked, {**step.invoked_head, "executor_id": executor_id})
            in_flight.add(executor_id)
            if streaming or hooks is not None:
                given = message.value if isinstance(message, Response) else message
            if streaming:
                await emit("executor_invoked", step.index, superstep_id, executor_id, given)
                sent_before = len(step.sent)
            try:
                if hooks is not None:  # what it raises is the executor's failure
                    hooks.executor_invoked(step.info, executor_id, given)
                await executor.execute(message, WorkflowContext(step, executor_id))
            except asyncio.CancelledError as error:
                if _cancelled_by_runner(step, inline=inline):
                    if hooks is not None:
                        self._late_hook("executor_failed", step.info, executor_id, error)
                    raise
                stray = _stray_cancellation(executor_id, error)
                step.fail(executor_id, stray)
                if hooks is not None:
                    self._late_hook("executor_failed", step.info, executor_id, stray)
                return
            except Exception as error:
                step.fail(executor_id, error)
                if hooks is not None:
                    self._hook_failed(step, executor_id, error)
                return
            if _cancelled_by_runner(step, inline=inline):
                # It swallowed the cancellation and returned: recorded as cancelled.
                if hooks is not None:
                    cancelled = asyncio.CancelledError()
                    self._late_hook("executor_failed", step.info, executor_id, cancelled)
                return
            if hooks is not None and not self._hook_completed(step, executor_id):
                return  # a hook failed it
            in_flight.discard(executor_id)
            record(ExecutorCompleted, {**step.completed_head, "executor_id": executor_id})
            if streaming:
                # Its own messages since it was invoked: its invocations run one after another.
                mine = [s.message for s in step.sent[sent_before:] if s.source == executor_id]
                await emit(
                    "executor_completed", step.index, superstep_id, executor_id, mine or None
                )

    async def _abort_failed(self, step: Superstep) -> None:
        assert step.failure is not None
        executor_id, error = step.failure
        info = ErrorInfo.of(error)
        self._write_through = False  # the marker and the run's end go in one batch
        opened = len(self._buffer)
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
        self._end_status = "failed"
        self._open_superstep_id = None
        self.finished = True
        self._flush_closing(opened)
        self._ended()
        if self._hooks is not None:
            self._hook_aborted("failed", error)
        emit = self._emit
        await emit("status", state=WorkflowRunState.FAILED)
        await emit("executor_failed", step.index, step.superstep_id, executor_id, error=error)
        await emit("failed", step.index, step.superstep_id, executor_id, error=error)
        raise error

    async def _commit(self, step: Superstep, position: Position) -> Position:
        """Close the superstep as committed, and open the next one or end the run.

        In "superstep" durability the superstep's events and its closing go in one batch.

        Returns the run's position after the superstep. Raises ``EncodingError`` (after recording
        the superstep as aborted and the run as failed) if the store cannot encode the batch.
        """
        step.outcome = SuperstepOutcome.COMMITTED
        after = position.after(step.sent, step.requested)
        opened = len(self._buffer)  # in "write" durability, 0: the closing goes in as it is made
        # What the log holds moves on only once it is appended: if an append fails, the run's
        # end is recorded against the superstep that is really open, and only if it is open.
        self.log(SuperstepCommitted, superstep_id=step.superstep_id)
        if self._write_through:
            self._open_superstep_id = None  # the marker is in the log
        next_id = None
        if not after.inbox and after.requests:
            self.log(RunAwaitingInput, supersteps=step.index, requests=list(after.requests))
            self._end_status = "awaiting_input"
        elif not after.inbox:
            self.log(RunCompleted, supersteps=step.index)
            self._end_status = "completed"
        elif step.index >= self.instance.max_supersteps:
            error = self._convergence_error(step.index, after)
            self.log(RunFailed, error=ErrorInfo.of(error))
            self._end_status = "failed"
        else:
            next_id = self.instance.new_id()
            self.log(SuperstepStarted, superstep_id=next_id, index=step.index + 1)
        reclose = functools.partial(self._log_unstorable, step)
        if self._write_through:  # the marker is in the log already: append the rest as it is
            refused, cancels = self._flush_closing(opened, reclose), 0
        else:
            refused, cancels = await self._flush_commit(opened, reclose)
        self._open_superstep = None
        if refused is not None:
            self.finished = True
            if self._hooks is not None:
                self._hook_aborted("failed", refused)
            raise refused
        self._open_superstep_id = next_id
        if next_id is None:
            self._ended()
        if step.outputs:
            for _, value, kind in step.outputs:
                if kind == "output":
                    self.outputs.append(value)
                elif kind == "intermediate":
                    self.intermediate_outputs.append(value)
        if self._hooks is not None:
            self._hooked_step = None
            if next_id is not None and not cancels:  # the run goes on: a hook's error fails it
                self._hooks.superstep_committed(step.info)
            else:
                self._late_hook("superstep_committed", step.info)
        if cancels:  # the commit landed while this task was being cancelled
            if next_id is not None or not self.awaited:
                raise asyncio.CancelledError  # the next superstep is aborted as cancelled
            _withdraw(cancels)  # too late: the run's end is durable, its caller gets the result
        return after

    def _log_unstorable(self, step: Superstep, error: EncodingError) -> None:
        """The closing of a superstep whose commit batch the store could not encode."""
        step.outcome = SuperstepOutcome.FAILED
        info = ErrorInfo.of(error)
        self.log(SuperstepAborted, superstep_id=step.superstep_id, reason="failed", error=info)
        self.log(RunFailed, error=info, superstep_id=step.superstep_id)
        self._end_status = "failed"
        self._open_superstep_id = None

    def _convergence_error(self, index: int, position: Position) -> ConvergenceError:
        return ConvergenceError(
            f"run {self.run_id} of {self.instance.instance_id!r} did not converge within "
            f"max_supersteps={self.instance.max_supersteps}: after superstep {index}, messages "
            f"were still pending for {', '.join(sorted(position.inbox))}"
        )

    def _record_end(self, reason: AbortReason, error: BaseException | None = None) -> None:
        """Abort the open superstep and close the run, while a cancellation (``error`` None) or an
        exception that escaped the superstep's own handling unwinds (``reason`` "failed")."""
        self._write_through = False  # the marker and the run's end go in one batch
        opened = len(self._buffer)
        step = self._open_superstep
        if step is not None and step.superstep_id == self._open_superstep_id:
            step.outcome = SuperstepOutcome(reason)  # even "committed": its commit never landed
        superstep_id = self._open_superstep_id
        info = None if error is None else ErrorInfo.of(error)
        if superstep_id is not None:
            self.log(SuperstepAborted, superstep_id=superstep_id, reason=reason, error=info)
        if info is not None:
            self.log(RunFailed, error=info, superstep_id=superstep_id)
            self._end_status = "failed"
        elif reason == "cancelled":
            self.log(RunCancelled, superstep_id=superstep_id)
            self._end_status = "cancelled"
        else:
            self.log(RunAbandoned, reason="abandoned", superstep_id=superstep_id)
            self._end_status = "abandoned"
        self._open_superstep_id = None
        self.finished = True
        # What unwinds must still propagate; if this append fails, the next run closes the run.
        with contextlib.suppress(StoreError, EncodingError):
            self._flush_closing(opened)
            self._ended()
        hooked = self._hooked_step
        if hooked is not None:
            if hooked.superstep_id == superstep_id:
                self._hook_aborted(reason, error)
            else:  # its marker went in already ("write" durability), as committed
                self._hooked_step = None
                self._late_hook("superstep_committed", hooked)

    def _close_unfinished(self, run_id: str, superstep_id: str | None, reason: AbortReason) -> None:
        """Close a run found unfinished in the log (dropped stream, dead process)."""
        for cls, fields in unfinished_closing(run_id, superstep_id, reason, self.run_id):
            self._log_for(cls, fields)

    def _log_for(self, cls: type[EventBase], fields: dict[str, Any]) -> None:
        """Buffer the next event of the stream (of this run, or of a run this one closes)."""
        data = {
            **_envelope(cls),
            "instance_id": self._instance_id,
            "position": 0,
            "timestamp": None,
            **fields,
        }
        self._stamp(cls, data)

    def _stamp(self, cls: type[EventBase], data: dict[str, Any]) -> None:
        """Give ``data`` the next position and the time, and buffer it as an event of ``cls``.

        The runner's own fields are trusted, so the event is constructed without re-validation
        (the store's mapper validates on the way back); only the injected clock is checked.
        ``data`` starts with the envelope, so a caller that gives every other field of ``cls``
        hands ``trusted_event`` a complete set, which it takes as the event's own without filling
        in defaults: that is every event of a superstep's hot path.
        """
        timestamp = self._clock()
        if timestamp.tzinfo is None:
            raise ExecutionError(f"the workflow's clock returned a naive datetime: {timestamp!r}")
        data["position"] = self._version + len(self._buffer) + 1
        data["timestamp"] = timestamp
        event = trusted_event(cls, data)
        self._buffer.append(event if event is not None else cls.model_validate(data))


@functools.cache
def _envelope(cls: type[EventBase]) -> dict[str, Any]:
    """The fields every event of ``cls`` has alike: its ``type`` and ``schema_version``."""
    fields = cls.model_fields
    return {"type": fields["type"].default, "schema_version": fields["schema_version"].default}


def _escaped(done: set[asyncio.Task[None]]) -> BaseException | None:
    """An exception that escaped one of the finished executor tasks ``done``, if any."""
    return next((t.exception() for t in done if not t.cancelled() and t.exception()), None)


def _withdraw(cancels: int) -> None:
    """Withdraw ``cancels`` cancellation requests of this task, which reached it after its run's
    end was durable: the run is over, and its caller gets the run's outcome, as the log has it.

    A handler that blocks the event loop (``time.sleep``) holds back its caller's timeout
    (``asyncio.wait_for``, ``asyncio.timeout``) until it returns; the cancellation then reaches
    the run wherever it next waits. If that is the group commit of its last superstep, the run
    has ended in the log whatever the cancellation does; raising it would tell the caller the
    run was cancelled (or timed out) while the log says it completed. So the run returns its
    result, as ``asyncio.wait_for`` does for an awaitable that finished despite its cancellation.
    """
    task = asyncio.current_task()
    assert task is not None
    for _ in range(cancels):
        task.uncancel()


def _cancelled_by_runner(step: Superstep, *, inline: bool) -> bool:
    """Whether the task running a handler of ``step`` was cancelled by steplog: inline, the run's
    own task was cancelled (by its caller, a dropped stream, a lost lease); in an executor task,
    the runner cancelled it to close the superstep (a sibling failed, the run was cancelled).

    A ``CancelledError`` that comes out of a handler otherwise is the handler's failure: something
    it awaited was cancelled by someone else, or it cancelled its own executor task.
    """
    if inline:
        task = step.inline_task  # the run's own task
        return task is not None and task.cancelling() > 0
    return step.cancelling


def _stray_cancellation(executor_id: str, error: asyncio.CancelledError) -> ExecutionError:
    """The failure recorded (and raised to the caller) for a handler that raised ``CancelledError``
    although steplog did not cancel it; the ``CancelledError`` is its ``__cause__``."""
    stray = ExecutionError(
        f"executor {executor_id!r} raised asyncio.CancelledError although its run was not "
        "cancelled: a task or future it awaited was cancelled by someone else, or it cancelled "
        "its own task. It is recorded as a failure of the executor, not as a cancellation"
    )
    stray.__cause__ = error
    return stray


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


def unfinished_closing(
    run_id: str, superstep_id: str | None, reason: AbortReason, closed_by: str | None
) -> list[tuple[type[EventBase], dict[str, Any]]]:
    """The events that close a run found unfinished: its open superstep's abort, and its end.

    ``closed_by`` is who closes it: the run that does, or ``recover@`` and its lease holder.
    """
    closing: list[tuple[type[EventBase], dict[str, Any]]] = []
    if superstep_id is not None:
        closing.append(
            (
                SuperstepAborted,
                {"run_id": run_id, "superstep_id": superstep_id, "reason": reason},
            )
        )
    ended = "crashed" if reason == "crashed" else "abandoned"
    closing.append(
        (
            RunAbandoned,
            {
                "run_id": run_id,
                "reason": ended,
                "superstep_id": superstep_id,
                "closed_by": closed_by,
            },
        )
    )
    return closing
