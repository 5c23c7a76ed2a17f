"""What a streaming run hands its consumer: ``WorkflowEvent``s, through an ``Emit``.

A run nobody streams gets ``silent``, which builds nothing: the runner never checks whether
anyone is listening.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["Emit", "Put", "WorkflowEvent", "WorkflowEventType", "emitter", "silent"]

WorkflowEventType = Literal[
    "started",
    "superstep_started",
    "executor_invoked",
    "executor_completed",
    "executor_failed",
    "output",
    "intermediate",
    "request_info",
    "superstep_completed",
    "failed",
    "cancelled",
    "completed",
    "awaiting_input",
]


@dataclass(frozen=True)
class WorkflowEvent:
    """What a streaming run yields. ``type`` says what happened; the other fields say where.

    ``data`` holds the output for ``output`` and ``intermediate`` events and the request for
    ``request_info`` events (whose ``request_id`` is what a response answers); ``error`` the
    exception for ``executor_failed`` and ``failed``. A run that ends with requests unanswered
    ends with ``awaiting_input`` instead of ``completed``.
    """

    type: WorkflowEventType
    run_id: str
    superstep: int | None = None
    superstep_id: str | None = None
    executor_id: str | None = None
    data: Any = None
    error: BaseException | None = None
    request_id: str | None = None


Put = Callable[[WorkflowEvent], Awaitable[None]]
"""Where a streaming run's events go (the stream's queue ``put``)."""


class Emit(Protocol):
    """Hands the consumer one ``WorkflowEvent`` of the run: ``await emit("output", 2, ...)``."""

    def __call__(
        self,
        type: WorkflowEventType,
        superstep: int | None = None,
        superstep_id: str | None = None,
        executor_id: str | None = None,
        data: Any = None,
        error: BaseException | None = None,
        request_id: str | None = None,
    ) -> Awaitable[None]: ...


def emitter(run_id: str, put: Put) -> Emit:
    """The ``Emit`` of a streamed run: builds each event and awaits ``put(event)``.

    The arguments are ``Emit``'s, in ``WorkflowEvent``'s order after ``run_id``: they are passed on
    as given, and the signature is declared once, on ``Emit``. Events are handed over first come,
    first served (a fair lock): parallel executors reach the consumer in the order they logged
    their events, which is what ``replay`` gives back, and an event once logged is handed over
    even if the executor that logged it is cancelled before its turn.
    """
    outbox: deque[WorkflowEvent] = deque()
    turn = asyncio.Lock()

    async def emit(type: WorkflowEventType, *where: Any, **fields: Any) -> None:
        # Queued at once, so that an executor cancelled while it waits for its turn (a sibling
        # failed) still has its event handed over, by whoever emits next.
        outbox.append(WorkflowEvent(type, run_id, *where, **fields))
        async with turn:
            while outbox:
                await put(outbox[0])
                outbox.popleft()

    return emit


async def silent(type: WorkflowEventType, *where: Any, **fields: Any) -> None:
    """The ``Emit`` of a run nobody streams: builds nothing, hands nothing over.

    A plain function, not an object: this is awaited a few times per superstep of every run.
    """
