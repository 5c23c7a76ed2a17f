"""``Workflow``: a built graph bound to an instance stream, and the stream handle of a run."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal, overload

from kernel._algo import Router
from kernel._clock import Clock, IdFactory
from kernel._emit import WorkflowEvent
from kernel._errors import RunInProgressError
from kernel._events import AbortReason, EventBase
from kernel._graph import Graph
from kernel._instance import Durability, InstanceContext
from kernel._owner import process_owner
from kernel._runner import Run, RunResult
from kernel._store import EventStore

__all__ = ["Durability", "RunStream", "Workflow"]


class Workflow:
    """A workflow graph bound to one instance's stream in a store. Made by ``WorkflowBuilder``.

    One instance runs one run at a time; state persists across runs of the same instance and is
    always the fold of the instance's log.
    """

    def __init__(
        self,
        graph: Graph,
        *,
        store: EventStore,
        instance_id: str,
        name: str,
        max_supersteps: int,
        durability: Durability,
        clock: Clock,
        id_factory: IdFactory,
    ) -> None:
        self.graph = graph
        self.store = store
        self._instance = InstanceContext(
            store,
            instance_id,
            workflow_name=name,
            router=Router(graph),
            max_supersteps=max_supersteps,
            durability=durability,
            clock=clock,
            id_factory=id_factory,
            owner=process_owner(),
        )
        self._active: Run | None = None
        self._active_stream: weakref.ref[RunStream] | None = None

    @property
    def instance_id(self) -> str:
        """The instance's stream id in the store."""
        return self._instance.instance_id

    @property
    def name(self) -> str:
        """The workflow's name, recorded in each ``RunStarted``."""
        return self._instance.workflow_name

    @property
    def max_supersteps(self) -> int:
        return self._instance.max_supersteps

    @property
    def durability(self) -> Durability:
        return self._instance.durability

    # -- running ------------------------------------------------------------------------------

    @overload
    def run(
        self, message: Any, *, stream: Literal[False] = False, **kwargs: Any
    ) -> Coroutine[Any, Any, RunResult]: ...
    @overload
    def run(self, message: Any, *, stream: Literal[True], **kwargs: Any) -> RunStream: ...

    def run(
        self, message: Any, *, stream: bool = False, **kwargs: Any
    ) -> Coroutine[Any, Any, RunResult] | RunStream:
        """Run the workflow on ``message``.

        ``await wf.run(msg)`` returns a ``RunResult`` when the run completes, and re-raises an
        executor's exception (or ``ConvergenceError``) after the log records the abort.
        ``wf.run(msg, stream=True)`` returns an async iterator of ``WorkflowEvent``; if the run
        fails, the iterator yields ``executor_failed`` and ``failed`` and then raises.
        ``kwargs`` are recorded in ``RunStarted`` and offered to handlers as ``ctx.run_kwargs``.

        Raises ``RunInProgressError`` if this workflow object is still running another run.
        """
        self._check_idle()
        run = Run(self._instance, message, kwargs)
        if stream:
            handle = RunStream(run)
            self._replace_active(run, handle)
            return handle
        return self._run_inline(run)

    async def _run_inline(self, run: Run) -> RunResult:
        self._check_idle()
        self._replace_active(run, None)
        run.task = asyncio.current_task()
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
    # If the loop is closed, the next run closes this one from the log.
    with contextlib.suppress(RuntimeError):
        task.get_loop().call_soon_threadsafe(task.cancel)
