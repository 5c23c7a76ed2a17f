"""The superstep runner: drives one run of a workflow and writes its facts to the log.

A ``Run`` knows its instance only through a ``RunnerContext`` (``kernel._run._instance``); where
messages go and what the next superstep receives is the step algebra of ``kernel._run._algo``. The
loop starts from a ``Position`` (next superstep's index, inbox, fan-in buffers), so a run can be
driven on from wherever its log says it stands.

The module is nearly 800 lines because every path that closes a superstep (commit, failure,
cancellation, a batch the store refuses) and every way a run starts (a message, a continuation)
is here, side by side: they must write the same markers and make the same hook calls. What
stands alone is apart: the log writer (``_writer``), the tasks and who cancelled them
(``_tasks``), the hooks (``_hooks``), the result (``_result``), a superstep (``_superstep``).

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel._base._errors import (
    ConvergenceError,
    EncodingError,
    PendingRequestsError,
    ResumeError,
    RoutingError,
    RunInProgressError,
    StoreError,
)
from kernel._define._context import WorkflowContext
from kernel._define._step import ACTIVE_HOST
from kernel._define._stream import WorkflowRunState
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
)
from kernel._log._requests import PendingRequest, Response
from kernel._run._algo import Position
from kernel._run._emit import Emit, Put, emitter, silent
from kernel._run._hooks import RunHookCalls, RunInfo, RunStatus, SuperstepInfo, chain_hooks
from kernel._run._ledger import (
    Continuation,
    HistoryNeeded,
    Ledger,
    Standing,
    answer,
    check_responses,
    continued_run,
    waiting,
)
from kernel._run._result import RunResult
from kernel._run._steps import StepBook, StepsHost
from kernel._run._superstep import RunScope, Superstep, SuperstepOutcome
from kernel._run._tasks import (
    cancel_and_wait,
    cancelled_by_runner,
    escaped_error,
    stray_cancellation,
    withdraw,
)
from kernel._run._writer import RunLog, unfinished_closing

if TYPE_CHECKING:
    from kernel._log._fold import OpenRun
    from kernel._run._instance import LeaseHold, RunnerContext

__all__ = ["Continuation", "Run", "RunResult", "unfinished_closing"]  # Continuation: _ledger's


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
        *,
        steps: StepBook | None = None,
    ) -> None:
        """A run of ``instance`` on ``message`` (with ``kwargs``), or continuing a run by
        ``continuation``.

        ``steps`` is the one seam for serving recorded steps from elsewhere than the log (what
        ``rerun`` gives its scratch run: the recorded run's calls): a run with a message is
        served from it instead of beginning an empty book. A continuation always takes its
        lineage's book from the log, so the two are not given together (``ValueError``).
        """
        if steps is not None and continuation is not None:
            raise ValueError("a continuation is served its lineage's steps from the log")
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
        chain = chain_hooks(instance.hooks)
        self._hooks = None if chain is None else RunHookCalls(chain)
        self._continues: str | None = None
        self._end_status: RunStatus | None = None  # the run's end, once logged
        self._emit: Emit = silent
        self._instance_id = instance.instance_id
        # The log writer; ``log``, ``record``, ``head`` and ``flush`` are its, for the supersteps.
        self.writer = writer = RunLog(instance, self.run_id)
        self.log, self.record, self.head, self.flush = (
            writer.log,
            writer.record,
            writer.head,
            writer.flush,
        )
        self._open_superstep: Superstep | None = None
        self._open_superstep_id: str | None = None
        self._taken_over = False
        self._keeper: LeaseHold | None = None
        self._lost_lease: RunInProgressError | None = None
        # The recorded steps of the run's lineage (a fresh run begins one: it has none, unless
        # it is given a book; a continuation takes its lineage's in ``_continue``).
        self.steps = steps if steps is not None else StepBook(self.run_id)

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
            self.last_position = self.writer.version
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
                    self._hooks.run_ended("abandoned", lost)
                raise lost from None
            if not self.finished:
                self._record_end(self.cancel_reason or "cancelled")
            if self._hooks is not None:
                self._hooks.run_ended(self._end_status or "cancelled", cancelled)
            raise
        except BaseException as error:  # SystemExit from a handler, a store error mid-superstep
            if not self.finished:
                self._record_end("failed", error)
            if self._hooks is not None:
                self._hooks.run_ended(self._end_status or "failed", error)
            raise
        finally:
            self.finished = True
            await keeper.release()
        if self._hooks is not None:
            late = self._hooks.run_ended(result.status, None)
            if late is not None:  # the run is over, as the log says; its hooks failed
                raise late
        return result

    # -- hooks --------------------------------------------------------------------------------

    def _hook_completed(self, step: Superstep, executor_id: str) -> bool:
        """After ``executor_id``'s handler returned: fail it with what a ``message_sent`` hook
        raised (the hooks' closing call is then ``executor_failed``), else call
        ``executor_completed``; what that raises fails the executor too, but every hook has had
        its one closing call by then (the chain calls each hook even when one raises), so none
        gets another. Returns whether the executor completed."""
        hooks = self._hooks
        assert hooks is not None
        error = step.hook_failures.pop(executor_id, None)
        if error is not None:
            step.fail(executor_id, error)
            hooks.executor_failed(step.info, executor_id, error)
            return False
        try:
            hooks.chain.executor_completed(step.info, executor_id)
        except Exception as raised:
            step.fail(executor_id, raised)
            return False
        return True

    def _ended(self) -> None:
        """The run's end is in the log: snapshot the instance's view while the lease is still
        this run's, then give the lease up at once, before the last events reach the consumer
        (who may take its time, or drop the stream)."""
        self.finished = True
        if self._lost_lease is None:
            self.instance.take_snapshot(every=False)
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
        head, ledger = instance.catch_up_ledger()  # from a snapshot and the log's tail
        if head.requests_may_wait and not self.supersede_requests:
            try:
                self._refuse_if_waiting(ledger)
            except HistoryNeeded:
                self._refuse_if_waiting(instance.full_ledger())
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
        self.writer.version = self.first_position = head.version
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
        self.writer.version = head.version
        try:
            line, checkpoint, standing, answers, steps = self._plan(ledger, plan)
        except HistoryNeeded:  # the snapshot's ledger does not reach that far back: the log does
            line, checkpoint, standing, answers, steps = self._plan(instance.full_ledger(), plan)
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
        self.steps = steps
        self._log_start(head, continues=line, checkpoint=checkpoint)
        for request_id, value in wire:
            self.log(ResponseReceived, request_id=request_id, value=value)
        self.outputs = list(standing.outputs)
        self.intermediate_outputs = list(standing.intermediate_outputs)
        self._open_superstep_id = instance.new_id()
        self.log(SuperstepStarted, superstep_id=self._open_superstep_id, index=position.index)
        self.flush()
        return position

    def _plan(
        self, ledger: Ledger, plan: Continuation
    ) -> tuple[str, str | None, Standing, dict[str, tuple[PendingRequest, Any]], StepBook]:
        """What ``plan`` continues, per ``ledger``: the run and its checkpoint, its standing
        there, the requests ``plan.responses`` answer, and the lineage's recorded steps."""
        instance = self.instance
        line, checkpoint = continued_run(ledger, plan, instance.workflow_name)
        standing = ledger.standing(
            line, checkpoint, router=self.router, codec=self.codec, origin=instance.origin_ledger
        )
        answers = check_responses(ledger, standing.position, plan.responses, self.router.graph)
        return line, checkpoint, standing, answers, ledger.step_book(line)

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
            None if hooks is None else hooks.chain,
            self.log,
            self.record,
            self.head,
            self._cancel_reason,
            self._append_now,
            self.steps,
            emit,
        )
        if hooks is not None:
            parent, parent_executor = self.parent or (None, None)
            run = RunInfo(
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
                hooks.superstep_started(step.info)
            await emit("superstep_started", step.index, superstep_id)
            await self._execute(step, position.inbox)
            try:
                position = await self._commit(step, position)
            except EncodingError as refused:  # recorded: the superstep aborted, the run failed
                await emit("status", state=WorkflowRunState.FAILED)
                await emit("failed", step.index, superstep_id, error=refused)
                raise
            if self._open_superstep_id is not None:  # the run goes on: a snapshot every K
                self.instance.take_snapshot(every=True)
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

    async def _append_now(
        self, cls: type[EventBase], data: dict[str, Any], superstep_id: str
    ) -> int | None:
        """Append an event of superstep ``superstep_id`` at once, with what the run buffered
        before it (durable when this returns, whatever the durability; through the store's group
        commit where it has one); its position, or None when the superstep's closing is logged
        already (nothing more of it may be appended). If the store refuses, its error is raised,
        and what was buffered stays buffered (``RunLog.append_now``)."""
        if self.finished or self._open_superstep_id != superstep_id:
            return None
        return await self.writer.append_now(cls, data)

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
                    escaped = escaped_error(tasks)
                while pending and step.failure is None and escaped is None:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    escaped = escaped_error(done)
            except asyncio.CancelledError:
                if step.outcome is None:
                    step.outcome = SuperstepOutcome(self.cancel_reason or "cancelled")
                await cancel_and_wait(step, pending)
                raise
            if escaped is not None and step.failure is None:
                step.outcome = SuperstepOutcome.FAILED  # siblings' writes are refused from now
            if pending:
                await cancel_and_wait(step, pending)
            if escaped is not None and step.failure is None:
                raise escaped  # the run records the abort and its end (see ``drive``)
        if step.failure is not None:
            await self._abort_failed(step)

    async def _invoke_all(
        self, step: Superstep, executor_id: str, messages: list[Any], *, inline: bool
    ) -> None:
        """Deliver ``messages`` to ``executor_id``, one invocation after another, with the host
        its recorded steps talk to set for them (``ACTIVE_HOST``)."""
        executor = self.router.graph.executors[executor_id]
        host = step.steps_host(executor_id, getattr(executor, "step_scope", "superstep"))
        token = ACTIVE_HOST.set(host)
        try:
            await self._invoke_each(step, executor, messages, inline, host)
        finally:
            ACTIVE_HOST.reset(token)

    async def _invoke_each(
        self,
        step: Superstep,
        executor: Any,
        messages: list[Any],
        inline: bool,
        host: StepsHost,
    ) -> None:
        executor_id = executor.id
        emit, hooks = self._emit, self._hooks
        streaming = emit is not silent
        record, in_flight = self.record, step.in_flight
        superstep_id = step.superstep_id
        for invocation, message in enumerate(messages):
            if step.outcome is not None:
                return
            host.begin(invocation)
            record(ExecutorInvoked, {**step.invoked_head, "executor_id": executor_id})
            in_flight.add(executor_id)
            if streaming or hooks is not None:
                given = message.value if isinstance(message, Response) else message
            if streaming:
                await emit("executor_invoked", step.index, superstep_id, executor_id, given)
                sent_before = len(step.sent)
            try:
                if hooks is not None:  # what it raises is the executor's failure
                    hooks.chain.executor_invoked(step.info, executor_id, given)
                await executor.execute(message, WorkflowContext(step, executor_id))
            except asyncio.CancelledError as error:
                if cancelled_by_runner(step, inline=inline):
                    if hooks is not None:
                        hooks.executor_failed(step.info, executor_id, error)
                    raise
                stray = stray_cancellation(executor_id, error)
                step.fail(executor_id, stray)
                if hooks is not None:
                    hooks.executor_failed(step.info, executor_id, stray)
                return
            except Exception as error:
                step.fail(executor_id, error)
                if hooks is not None:
                    also = step.hook_failures.pop(executor_id, None)
                    hooks.executor_failed(step.info, executor_id, error, also)
                return
            except BaseException as error:  # SystemExit and the like: they unwind the run
                if hooks is not None:
                    hooks.executor_failed(step.info, executor_id, error)
                raise
            if cancelled_by_runner(step, inline=inline):
                # It swallowed the cancellation and returned: recorded as cancelled.
                if hooks is not None:
                    hooks.executor_failed(step.info, executor_id, asyncio.CancelledError())
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
        self.writer.write_through = False  # the marker and the run's end go in one batch
        opened = len(self.writer.buffer)
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
        self.writer.flush_closing(opened)
        self._ended()
        if self._hooks is not None:
            self._hooks.superstep_aborted("failed", error)
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
        opened = len(
            self.writer.buffer
        )  # in "write" durability, 0: the closing goes in as it is made
        # What the log holds moves on only once it is appended: if an append fails, the run's
        # end is recorded against the superstep that is really open, and only if it is open.
        self.log(SuperstepCommitted, superstep_id=step.superstep_id)
        if self.writer.write_through:
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
        if self.writer.write_through:  # the marker is in the log already: append the rest as it is
            refused, cancels = self.writer.flush_closing(opened, reclose), 0
        else:
            refused, cancels = await self.writer.flush_commit(opened, reclose)
        self._open_superstep = None
        if refused is not None:
            self.finished = True
            if self._hooks is not None:
                self._hooks.superstep_aborted("failed", refused)
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
        if self._hooks is not None:  # if the run goes on, a hook's error fails it
            going_on = next_id is not None and not cancels
            self._hooks.superstep_committed(step.info, going_on=going_on)
        if cancels:  # the commit landed while this task was being cancelled
            if next_id is not None or not self.awaited:
                raise asyncio.CancelledError  # the next superstep is aborted as cancelled
            withdraw(cancels)  # too late: the run's end is durable, its caller gets the result
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
        self.writer.write_through = False  # the marker and the run's end go in one batch
        opened = len(self.writer.buffer)
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
            self.writer.flush_closing(opened)
            self._ended()
        hooked = None if self._hooks is None else self._hooks.step
        if hooked is not None and self._hooks is not None:
            if hooked.superstep_id == superstep_id:
                self._hooks.superstep_aborted(reason, error)
            else:  # its marker went in already ("write" durability), as committed
                self._hooks.superstep_committed(hooked, going_on=False)

    def _close_unfinished(self, run_id: str, superstep_id: str | None, reason: AbortReason) -> None:
        """Close a run found unfinished in the log (dropped stream, dead process)."""
        for cls, fields in unfinished_closing(run_id, superstep_id, reason, self.run_id):
            self.writer.log_for(cls, fields)
