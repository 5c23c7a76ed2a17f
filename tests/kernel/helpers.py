"""Small helpers for reading a workflow's log in assertions, and executors shared by tests."""

from __future__ import annotations

import asyncio
from typing import Any

from kernel import (
    EventBase,
    Executor,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    Workflow,
    WorkflowContext,
    handler,
)


def of_type(events: list[EventBase], kind: str) -> list[Any]:
    """The events of one ``type``, in log order."""
    return [e for e in events if e.type == kind]


def kinds(events: list[EventBase]) -> list[str]:
    return [e.type for e in events]


def markers(wf: Workflow) -> dict[str, str]:
    """superstep id -> "committed" or "aborted:<reason>": its first marker (the final one)."""
    found: dict[str, str] = {}
    for event in wf.events():
        if isinstance(event, SuperstepCommitted):
            found.setdefault(event.superstep_id, "committed")
        elif isinstance(event, SuperstepAborted):
            found.setdefault(event.superstep_id, f"aborted:{event.reason}")
    return found


def staged(wf: Workflow, key: str) -> list[StateStaged]:
    """Every StateStaged event for ``key``."""
    return [e for e in wf.events() if isinstance(e, StateStaged) and e.key == key]


def fate_of(wf: Workflow, key: str) -> list[str]:
    """For each staged write of ``key``, its superstep's marker (or "none")."""
    found = markers(wf)
    return [found.get(e.superstep_id, "none") for e in staged(wf, key)]


class Router(Executor):
    """Sends every message on, unchanged."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Sink(Executor):
    """Stages the message under its own id and yields ``"<id>:<message>"``."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[Any, str]) -> None:
        ctx.set_state(self.id, n)
        await ctx.yield_output(f"{self.id}:{n}")


class FailsAfter(Executor):
    """Waits until ``go`` is set (by a sibling in the same superstep), then raises
    ``ValueError(reason)``."""

    def __init__(self, id: str, go: asyncio.Event, reason: str) -> None:
        super().__init__(id)
        self.go = go
        self.reason = reason

    @handler
    async def run(self, message: Any, ctx: WorkflowContext[Any]) -> None:
        await self.go.wait()
        raise ValueError(self.reason)
