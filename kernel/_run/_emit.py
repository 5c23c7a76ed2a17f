"""What a streaming run hands its consumer: ``WorkflowEvent``s, through an ``Emit``.

A run nobody streams gets ``silent``, which builds nothing: the runner never checks whether
anyone is listening. The events themselves (``WorkflowEvent`` and its types) are the definition
layer's vocabulary (``kernel._define._stream``), re-exported here for the runner's modules.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from kernel._define._stream import (
    FRAMEWORK_EVENT_TYPES,
    WorkflowErrorDetails,
    WorkflowEvent,
    WorkflowEventSource,
    WorkflowEventType,
    WorkflowRunState,
)
from kernel._log._events import ErrorInfo

__all__ = [
    "FRAMEWORK_EVENT_TYPES",
    "Emit",
    "Put",
    "WorkflowErrorDetails",
    "WorkflowEvent",
    "WorkflowEventSource",
    "WorkflowEventType",
    "WorkflowRunState",
    "emitter",
    "framework_event",
    "silent",
]


Put = Callable[[WorkflowEvent], Awaitable[None]]
"""Where a streaming run's events go (the stream's queue ``put``)."""


class Emit(Protocol):
    """Hands the consumer one ``WorkflowEvent`` of the run: ``await emit("output", 2, ...)``,
    or an event already made (a custom event, its fields set): ``await emit(event)``."""

    def __call__(
        self,
        type: WorkflowEventType | WorkflowEvent,
        superstep: int | None = None,
        superstep_id: str | None = None,
        executor_id: str | None = None,
        data: Any = None,
        error: BaseException | None = None,
        request_id: str | None = None,
        *,
        state: WorkflowRunState | None = None,
        response_type: Any = None,
    ) -> Awaitable[None]: ...


def framework_event(
    type: WorkflowEventType,
    run_id: str,
    superstep: int | None = None,
    superstep_id: str | None = None,
    executor_id: str | None = None,
    data: Any = None,
    error: BaseException | None = None,
    request_id: str | None = None,
    *,
    state: WorkflowRunState | None = None,
    response_type: Any = None,
    info: ErrorInfo | None = None,
) -> WorkflowEvent:
    """An event of the runner (``origin`` ``FRAMEWORK``), as the live stream and ``replay`` both
    make it: a failure's ``details`` come from its ``ErrorInfo`` (``info``, or made from
    ``error``), and an ``executor_failed`` event's data is its details."""
    details = None
    if error is not None and type in ("failed", "executor_failed"):
        recorded = info if info is not None else ErrorInfo.of(error)
        details = WorkflowErrorDetails(recorded.type.rsplit(".", 1)[-1], recorded.message)
        if type == "executor_failed":
            data = details
    return WorkflowEvent(
        type,
        data,
        origin=WorkflowEventSource.FRAMEWORK,
        state=state,
        details=details,
        executor_id=executor_id,
        request_id=request_id,
        response_type=response_type,
        run_id=run_id,
        superstep=superstep,
        superstep_id=superstep_id,
        error=error,
    )


def emitter(run_id: str, put: Put) -> Emit:
    """The ``Emit`` of a streamed run: builds each event and awaits ``put(event)``.

    The arguments are ``Emit``'s, in ``framework_event``'s order after ``run_id``: they are passed
    on as given, and the signature is declared once, on ``Emit``. Events are handed over first
    come, first served (a fair lock): parallel executors reach the consumer in the order they
    logged their events, which is what ``replay`` gives back, and an event once logged is handed
    over even if the executor that logged it is cancelled before its turn.
    """
    outbox: deque[WorkflowEvent] = deque()
    turn = asyncio.Lock()

    async def emit(type: WorkflowEventType | WorkflowEvent, *where: Any, **fields: Any) -> None:
        # Queued at once, so that an executor cancelled while it waits for its turn (a sibling
        # failed) still has its event handed over, by whoever emits next.
        if isinstance(type, WorkflowEvent):
            outbox.append(type)
        else:
            outbox.append(framework_event(type, run_id, *where, **fields))
        async with turn:
            while outbox:
                await put(outbox[0])
                outbox.popleft()

    return emit


async def silent(type: WorkflowEventType | WorkflowEvent, *where: Any, **fields: Any) -> None:
    """The ``Emit`` of a run nobody streams: builds nothing, hands nothing over.

    A plain function, not an object: this is awaited a few times per superstep of every run.
    """
