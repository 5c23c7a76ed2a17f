"""``Workflow``: a built graph bound to an instance stream, and the stream handle of a run."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import replace
from typing import Any, Literal, overload

from kernel._base._errors import ExecutionError, ResumeError, RunInProgressError
from kernel._define._definition import DefinitionView
from kernel._define._graph import Graph
from kernel._log._events import AbortReason, EventBase
from kernel._log._requests import PendingRequest
from kernel._ops._fork import record_fork
from kernel._ops._replay import replay_events
from kernel._ops._settings import InstanceSettings, WorkflowInstance
from kernel._run._emit import WorkflowEvent
from kernel._run._instance import Durability, read_ledger
from kernel._run._ledger import (
    Checkpoint,
    CheckpointStatus,
    HistoryNeeded,
    Ledger,
    Standing,
    continued_run,
)
from kernel._run._runner import Continuation, Run, RunResult
from kernel._store._eventstore import EventStore
from kernel._store._owner import presumed_reason

__all__ = ["Durability", "RunStream", "Workflow"]

_NO_MESSAGE: Any = object()


class Workflow(DefinitionView):
    """A workflow graph bound to one instance's stream in a store. Made by ``WorkflowBuilder``.

    One instance runs one run at a time; state persists across runs of the same instance and is
    always the fold of the instance's log. Its definition is read through ``DefinitionView``
    (``executors``, ``get_start_executor()``, ``to_dict()``, ...); its instance's settings are
    ``settings`` (an ``InstanceSettings``), which a fork or a sub-workflow derives its own from.
    """

    def __init__(
        self,
        graph: Graph,
        *,
        store: EventStore,
        settings: InstanceSettings | None = None,
        **options: Any,
    ) -> None:
        """Bind ``graph`` to an instance of ``store`` with ``settings``.

        Instead of ``settings``, its fields may be given as keywords, as before there was an
        ``InstanceSettings``: ``instance_id``, ``name``, ``max_supersteps``, ``durability``,
        ``clock``, ``id_factory`` (all required), ``lease`` and ``sensitive_keys``. Raises
        ``DefinitionError`` for an invalid instance id, ``TypeError`` for an unknown keyword or
        for keywords given with ``settings``.
        """
        if settings is None:
            if "lease" in options and options["lease"] is None:
                del options["lease"]  # the keyword form's default
            settings = InstanceSettings(**options)
        elif options:
            raise TypeError(
                f"Workflow() takes settings= or their fields, not both: {sorted(options)}"
            )
        self.graph = graph
        self.store = store
        self.settings = settings
        self._instance = WorkflowInstance(store, graph, settings)
        self._active: Run | None = None
        self._active_stream: weakref.ref[RunStream] | None = None

    @property
    def instance_id(self) -> str:
        """The instance's stream id in the store."""
        return self.settings.instance_id

    @property
    def name(self) -> str:
        """The workflow's name, recorded in each ``RunStarted``."""
        return self.settings.name

    @property
    def sensitive_keys(self) -> tuple[str, ...]:
        """The patterns of the state keys declared sensitive, recorded in each ``RunStarted``."""
        return self.settings.sensitive_keys

    @property
    def max_supersteps(self) -> int:
        return self.settings.max_supersteps

    @property
    def durability(self) -> Durability:
        return self.settings.durability

    # -- running ------------------------------------------------------------------------------

    @overload
    def run(
        self,
        message: Any = ...,
        *,
        stream: Literal[False] = False,
        checkpoint_id: str | None = None,
        responses: Mapping[str, Any] | None = None,
        include_status_events: bool = False,
        supersede_requests: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult]: ...
    @overload
    def run(
        self,
        message: Any = ...,
        *,
        stream: Literal[True],
        checkpoint_id: str | None = None,
        responses: Mapping[str, Any] | None = None,
        include_status_events: bool = False,
        supersede_requests: bool = False,
        **kwargs: Any,
    ) -> RunStream: ...

    def run(
        self,
        message: Any = _NO_MESSAGE,
        *,
        stream: bool = False,
        checkpoint_id: str | None = None,
        responses: Mapping[str, Any] | None = None,
        include_status_events: bool = False,
        supersede_requests: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult] | RunStream:
        """Run the workflow on ``message``, or continue it from the log.

        ``await wf.run(msg)`` returns a ``RunResult`` when the run completes (or stops waiting for
        responses to its requests), and re-raises an executor's exception (or
        ``ConvergenceError``) after the log records the abort.
        ``wf.run(msg, stream=True)`` returns an async iterator of ``WorkflowEvent``; if the run
        fails, the iterator yields ``executor_failed`` and ``failed`` and then raises.
        ``kwargs`` are recorded in ``RunStarted`` and offered to handlers as ``ctx.run_kwargs``.
        ``include_status_events=True`` keeps the ``status`` events among the ``RunResult``'s
        events (as AF's; ``status_timeline()`` has them either way).

        Instead of a message: ``checkpoint_id=`` continues the run from that checkpoint (one of
        ``checkpoints()``; it must be the instance's latest, else ``ResumeError``: fork it), and
        ``responses={request_id: value}`` answers pending requests and continues (with or without
        ``checkpoint_id``). A continuation first closes a run left open by a dead process.

        A run with a message continues nothing, so the requests the instance's last run left
        waiting could no longer be answered, and responses recorded for it (``record_response``,
        ``steplog respond``) that only ``resume()`` delivers would be dropped: it is refused
        (``PendingRequestsError``, naming them; nothing appended) while any wait, unless
        ``supersede_requests=True`` gives them up (they stay in the log, and a fork of the
        checkpoint that holds them can go on with them).

        Raises ``RunInProgressError`` if this workflow object is still running another run.
        """
        continuation = None
        if checkpoint_id is not None or responses:
            if message is not _NO_MESSAGE:
                raise ResumeError(
                    "run() takes a message, or checkpoint_id/responses to continue a run, not both"
                )
            continuation = Continuation(None, checkpoint_id, dict(responses or {}))
        elif message is _NO_MESSAGE:
            raise ResumeError(
                "run() needs a message, or checkpoint_id= or responses= to continue a run"
            )
        return self._launch(
            message,
            kwargs,
            continuation,
            stream=stream,
            statuses=include_status_events,
            supersede=supersede_requests,
        )

    @overload
    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: Literal[False] = False,
        responses: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult]: ...
    @overload
    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: Literal[True],
        responses: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> RunStream: ...

    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: bool = False,
        responses: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult] | RunStream:
        """Continue run ``run_id`` (default: the instance's last run) where it stopped: after a
        crash, a failure, a cancellation or a dropped stream, from its latest checkpoint.

        A new run is recorded that ``continues`` it; its result counts outputs and supersteps
        from the start of the original run. Raises ``ResumeError`` (appending nothing) when the
        run has nothing left to do, or when another run committed after it (fork instead).
        ``kwargs`` default to the original run's.
        """
        plan = Continuation(run_id, None, dict(responses or {}))
        return self._launch(_NO_MESSAGE, kwargs, plan, stream=stream)

    def _launch(
        self,
        message: Any,
        kwargs: dict[str, Any],
        continuation: Continuation | None,
        *,
        stream: bool,
        statuses: bool = False,
        supersede: bool = False,
    ) -> Coroutine[Any, Any, RunResult] | RunStream:
        self._check_idle()
        run = Run(self._instance, message, kwargs, continuation)
        run.include_status_events = statuses
        run.supersede_requests = supersede
        run.bind_log = functools.partial(_bind_log, self.store, self.instance_id)
        if stream:
            handle = RunStream(run)
            self._replace_active(run, handle)
            return handle
        return self._run_inline(run)

    async def _run_inline(self, run: Run) -> RunResult:
        self._check_idle()
        self._replace_active(run, None)
        run.task = asyncio.current_task()
        run.awaited = True
        try:
            return await run.drive()
        finally:
            if self._active is run:
                self._active = None

    def _replace_active(self, run: Run, handle: RunStream | None) -> None:
        previous = self._active
        if previous is not None and not previous.finished:
            run.previous = previous
        self._active = run
        self._active_stream = weakref.ref(handle) if handle is not None else None

    def _check_idle(self) -> None:
        active = self._active
        if active is None or active.finished:
            return
        if self._active_stream is not None and self._active_stream() is None:
            return  # its stream was dropped: the next run settles it
        raise RunInProgressError(
            f"instance {self.instance_id!r} is still running run {active.run_id}; await it, or "
            "close its stream with aclose(), before starting another"
        )

    # -- the view of the log ------------------------------------------------------------------

    def committed_state(self) -> dict[str, Any]:
        """The committed user state of this instance, read from the log (values decoded)."""
        decode = self.store.codec.decode
        return {key: decode(value) for key, value in self._instance.committed_values().items()}

    def events(self) -> list[EventBase]:
        """Every event of this instance's stream, in order."""
        return self.store.read(self.instance_id)

    # -- checkpoints, requests, forks ---------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        """Every committed superstep of this instance, oldest first: the points a run can be
        continued from. Only the last one can be (``status`` says whether and how); the others
        are ``superseded``, and ``fork`` branches from them. Read from the log; writes nothing.

        The list is the whole log's; the last one's status comes from the instance's snapshot
        and the log after it (``_latest_status``), as a run started now would see it."""
        head, current = self._instance.catch_up_ledger()
        ledger = read_ledger(self.store, self.instance_id, upto=head.version)
        found = [
            Checkpoint(
                step.superstep_id,
                self.instance_id,
                step.run_id,
                step.index,
                step.timestamp,
                step.position,
            )
            for step in ledger.checkpoints
        ]
        forked = ledger.forked
        if not found and forked is not None and forked.checkpoint is not None:
            origin = self._instance.origin_ledger(forked).find(forked.checkpoint)
            if origin is not None:
                found.append(
                    Checkpoint(
                        origin.superstep_id,
                        forked.origin_instance,
                        origin.run_id,
                        origin.index,
                        origin.timestamp,
                        origin.position,
                    )
                )
        if found:
            try:
                status = self._latest_status(current)
            except HistoryNeeded:  # the snapshot's ledger does not reach that far back
                status = self._latest_status(ledger)
            found[-1] = replace(found[-1], status=status)
        return found

    def _latest_status(self, ledger: Ledger) -> CheckpointStatus:
        line = ledger.last_run()
        if (
            line is not None
            and line.end is None
            and presumed_reason(line.started.owner) != "crashed"
        ):
            return "running"  # open, and its process may be alive
        standing = self._standing(ledger)
        if standing is None:
            return "foreign"
        if standing.position.inbox:
            return "resumable"
        return "awaiting_input" if standing.position.requests else "completed"

    def _standing(self, ledger: Ledger) -> Standing | None:
        """Where the instance's last run stands now (None if no run was ever started)."""
        try:
            run_id, checkpoint = continued_run(ledger, Continuation(), self.name)
        except ResumeError:
            return None
        return ledger.standing(
            run_id,
            checkpoint,
            router=self._instance.router,
            codec=self.store.codec,
            origin=self._instance.origin_ledger,
        )

    def pending_requests(self) -> list[PendingRequest]:
        """The requests of this instance's last run still waiting for a response, in the order
        they were made; ``run(responses={request_id: value})`` answers them."""
        _, ledger = self._instance.catch_up_ledger()  # from the snapshot and the log after it
        try:
            standing = self._standing(ledger)
        except HistoryNeeded:
            standing = self._standing(self._instance.full_ledger())
        return [] if standing is None else list(standing.position.requests.values())

    def fork(self, *, at: Any, instance_id: str) -> Workflow:
        """Start instance ``instance_id`` whose committed state is this instance's at ``at``.

        ``at`` is a point of this instance's log: a stream position (int), a superstep or run id
        (just after the superstep's marker, or the run's last event), a datetime (the last event
        stamped at or before it), or a point object of ``projections`` (``AtPosition``,
        ``AtSuperstep``, ``AtTime``). The new instance's first event, ``InstanceForked``, records
        the origin; this instance is never modified. The fork can be run with a new message, or
        continued from the origin's checkpoint at that point (``resume()``). Raises
        ``ExecutionError`` if ``instance_id`` already has events.
        """
        record_fork(
            self.store,
            self.instance_id,
            at,
            instance_id,
            clock=self.settings.clock,
            workflow_name=self.name,
        )
        settings = self.settings.for_instance(instance_id)
        return Workflow(self.graph, store=self.store, settings=settings)

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, instance={self.instance_id!r}, store={self.store.url!r})"


class _End:
    pass


class _Raise:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class RunStream:
    """The async iterator returned by ``run(..., stream=True)``.

    The run executes in a task of its own, handing events over one at a time. If the consuming
    task is cancelled, the run is aborted (``cancelled``) and ``RunCancelled`` is in the log before
    the cancellation propagates. If the stream is dropped without ``aclose()``, the run is aborted
    (``abandoned``) as soon as the stream is garbage-collected, and at the latest by the next run.
    """

    def __init__(self, run: Run) -> None:
        self._run = run
        self._queue: asyncio.Queue[WorkflowEvent | _End | _Raise] = asyncio.Queue(maxsize=1)
        self._done = False
        weakref.finalize(self, _abandon, run)

    @property
    def run_id(self) -> str:
        return self._run.run_id

    def __aiter__(self) -> AsyncIterator[WorkflowEvent]:
        return self

    async def __anext__(self) -> WorkflowEvent:
        if self._done:
            raise StopAsyncIteration
        if self._run.task is None:
            # The task must not reference the stream, or a dropped stream would never be collected.
            self._run.task = asyncio.create_task(
                _produce(self._run, self._queue), name=f"steplog-run:{self._run.run_id}"
            )
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            await _stop(self._run, "cancelled")
            raise
        if isinstance(item, _End):
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, _Raise):
            self._done = True
            raise item.error
        return item

    async def get_final_response(self) -> RunResult:
        """The run's ``RunResult`` (AF's ``ResponseStream.get_final_response``): reads the rest
        of the stream first, if it was not read to the end, and raises what the run raised."""
        if not self._done:
            async for _ in self:
                pass
        result = self._run.result
        if result is None:
            raise ExecutionError(
                f"run {self._run.run_id} ended without a result: it was closed, cancelled or "
                "failed before its end"
            )
        return result

    async def aclose(self) -> None:
        """Stop the run if it is still going (recorded as ``cancelled``) and wait for it."""
        self._done = True
        await _stop(self._run, "cancelled")

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _produce(run: Run, queue: asyncio.Queue[WorkflowEvent | _End | _Raise]) -> None:
    try:
        await run.drive(queue.put)
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # handed to the consumer, who re-raises it
        await queue.put(_Raise(error))
        return
    await queue.put(_End())


async def _stop(run: Run, reason: AbortReason) -> None:
    """Cancel a run's task; wait until it has recorded its end, even if cancelled again."""
    task = run.task
    if task is None or task.done():
        run.finished = True
        return
    if not run.finished:
        run.cancel_reason = run.cancel_reason or reason
    task.cancel()
    interrupted = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            interrupted = True
    if not task.cancelled() and task.exception() is not None:
        task.exception()  # retrieved: the consumer already has it or does not want it
    if interrupted:
        raise asyncio.CancelledError


def _bind_log(store: EventStore, instance_id: str, run: Run, result: RunResult) -> None:
    """Let ``result`` read its run's events back from the log (``replay``) when asked for."""
    after, upto = run.first_position, run.last_position

    def events() -> list[WorkflowEvent]:
        return replay_events(store, store.read(instance_id, after=after, upto=upto), run.run_id)

    result.include_status_events = run.include_status_events
    result._source = events


def _abandon(run: Run) -> None:
    """Finalizer of a dropped stream: abort its run as ``abandoned``."""
    task = run.task
    if task is None:
        run.finished = True  # never iterated: nothing was appended
        return
    if task.done():
        return
    if not run.finished:
        run.cancel_reason = run.cancel_reason or "abandoned"
    # The lease goes now: a run started next (by any workflow object) closes this one in the log
    # as abandoned, and this run's own late abort is refused by the version check.
    run.give_up_lease()
    # If the loop is closed, the next run closes this one from the log.
    with contextlib.suppress(RuntimeError):
        task.get_loop().call_soon_threadsafe(task.cancel)
