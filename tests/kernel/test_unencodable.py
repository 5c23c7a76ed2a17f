"""What cannot be written never costs the log its audit trail.

A write the log cannot hold is refused at ``set_state``, so the superstep is aborted and recorded
the same way whichever durability is used; an error message that cannot be stored as it is still
reaches the log; and if a batch of the runner's own still fails to encode, the superstep's abort
and the run's end are appended anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    EncodingError,
    EventBase,
    Executor,
    MemoryStore,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from tests.kernel.helpers import kinds, of_type


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


class WritesThenDoes(Executor):
    """Stages ``fine``, sends, then does ``action`` (a bad write, or a raise), then stages more."""

    def __init__(self, id: str, action: str) -> None:
        super().__init__(id)
        self.action = action

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("fine", n)
        if self.action == "deep value":
            ctx.set_state("deep", nested(300))
        elif self.action == "surrogate value":
            ctx.set_state("text", "half a pair: \ud800")
        elif self.action == "surrogate key":
            ctx.set_state("key \udc00", 1)
        elif self.action == "surrogate message":
            raise RuntimeError("cannot print \ud800 this")
        ctx.set_state("after", n)


ACTIONS = ["deep value", "surrogate value", "surrogate key", "surrogate message"]


async def log_of(store: Any, action: str, durability: str) -> tuple[Workflow, BaseException]:
    wf = WorkflowBuilder(
        start_executor=WritesThenDoes("writer", action),
        store=store,
        instance_id=f"{action}/{durability}",
        durability=durability,  # type: ignore[arg-type]
    ).build()
    with pytest.raises((EncodingError, RuntimeError)) as caught:
        await wf.run(1)
    return wf, caught.value


@pytest.mark.parametrize("action", ACTIONS)
async def test_a_refused_write_leaves_the_same_log_in_both_durability_modes(store, action):
    by_step, step_error = await log_of(store, action, "superstep")
    by_write, write_error = await log_of(store, action, "write")

    assert kinds(by_step.events()) == kinds(by_write.events())
    assert kinds(by_step.events()) == [
        "run_started",
        "superstep_started",
        "executor_invoked",
        "state_staged",
        "executor_failed",
        "superstep_aborted",
        "run_failed",
    ]
    assert type(step_error) is type(write_error)
    for wf in (by_step, by_write):
        assert [e.key for e in of_type(wf.events(), "state_staged")] == ["fine"]
        assert wf.committed_state() == {}


@pytest.mark.parametrize("action", ["deep value", "surrogate value", "surrogate key"])
async def test_a_write_the_log_cannot_hold_is_refused_at_set_state_naming_the_key(store, action):
    for durability in ("superstep", "write"):
        wf, error = await log_of(store, action, durability)
        assert isinstance(error, EncodingError)
        assert "state key" in str(error)
        (failed,) = of_type(wf.events(), "executor_failed")
        assert failed.error.type.endswith("EncodingError")


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_an_error_message_with_a_lone_surrogate_is_recorded_escaped(store, durability):
    wf, error = await log_of(store, "surrogate message", durability)

    assert isinstance(error, RuntimeError)
    (aborted,) = of_type(wf.events(), "superstep_aborted")
    assert aborted.error.message == "cannot print \\ud800 this"
    assert of_type(wf.events(), "run_failed")[0].error == aborted.error


async def test_an_error_whose_str_raises_is_recorded_by_its_type(store):
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no text for you")

    class Raises(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Any]) -> None:
            raise Unprintable

    wf = WorkflowBuilder(start_executor=Raises("raises"), store=store).build()
    with pytest.raises(Unprintable):
        await wf.run(1)

    (aborted,) = of_type(wf.events(), "superstep_aborted")
    assert aborted.error.type.endswith("Unprintable")
    assert "unprintable" in aborted.error.message
    assert kinds(wf.events())[-1] == "run_failed"


class RefusingStore(MemoryStore):
    """A store whose encoder refuses any event that stages the key ``poison``."""

    def append(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> list[int]:
        for event in events:
            if event.type == "state_staged" and event.key == "poison":  # type: ignore[attr-defined]
                raise EncodingError(f"cannot store event #{event.position}: refused")
        return super().append(instance_id, events, expected_version=expected_version)


class Poisons(Executor):
    def __init__(self, id: str, then: str = "return", started: asyncio.Event | None = None) -> None:
        super().__init__(id)
        self.then = then
        self.started = started

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("fine", n)
        ctx.set_state("poison", n)
        ctx.set_state("after", n)
        if self.then == "raise":
            raise LookupError("the handler's own failure")
        if self.started is not None:
            self.started.set()
            await asyncio.Event().wait()


async def test_a_commit_batch_that_fails_to_encode_is_recorded_as_an_abort():
    store = RefusingStore()
    wf = WorkflowBuilder(start_executor=Poisons("p"), store=store).build()

    with pytest.raises(EncodingError, match="refused"):
        await wf.run(1)

    events = wf.events()
    assert kinds(events) == [
        "run_started",
        "superstep_started",
        "executor_invoked",
        "state_staged",
        "state_staged",
        "executor_completed",
        "superstep_aborted",
        "run_failed",
    ]
    assert [e.key for e in of_type(events, "state_staged")] == ["fine", "after"]
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    (aborted,) = of_type(events, "superstep_aborted")
    assert (aborted.reason, aborted.error.type) == ("failed", "kernel.EncodingError")
    assert wf.committed_state() == {}


async def test_an_abort_batch_that_fails_to_encode_still_records_the_abort():
    store = RefusingStore()
    wf = WorkflowBuilder(start_executor=Poisons("p", then="raise"), store=store).build()

    with pytest.raises(LookupError):
        await wf.run(1)

    events = wf.events()
    assert kinds(events)[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]
    assert [e.key for e in of_type(events, "state_staged")] == ["fine", "after"]
    assert of_type(events, "run_failed")[0].error.message == "the handler's own failure"


async def test_a_cancellation_batch_that_fails_to_encode_still_records_the_cancellation():
    store = RefusingStore()
    started = asyncio.Event()
    wf = WorkflowBuilder(start_executor=Poisons("p", started=started), store=store).build()

    task = asyncio.create_task(wf.run(1))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    events = wf.events()
    assert kinds(events)[-2:] == ["superstep_aborted", "run_cancelled"]
    assert [e.key for e in of_type(events, "state_staged")] == ["fine", "after"]


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: WritesThenDoes("writer \ud800", "none"), "an executor id"),
        (
            lambda: WorkflowBuilder(start_executor=WritesThenDoes("w", "none"), name="\udfff"),
            "name",
        ),
        (
            lambda: WorkflowBuilder(
                start_executor=WritesThenDoes("w", "none"), instance_id="\ud800"
            ),
            "instance_id",
        ),
    ],
)
def test_names_the_log_cannot_store_are_refused_when_the_workflow_is_defined(make, what):
    with pytest.raises(DefinitionError, match=f"{what} must be valid Unicode text"):
        make().build()


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_an_exception_that_escapes_the_handlers_still_closes_the_superstep(store, durability):
    class Exits(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Any]) -> None:
            ctx.set_state("fine", n)
            raise SystemExit("leaving")

    wf = WorkflowBuilder(start_executor=Exits("exits"), store=store, durability=durability).build()
    with pytest.raises(SystemExit):
        await wf.run(1)

    assert kinds(wf.events())[-2:] == ["superstep_aborted", "run_failed"]
    (aborted,) = of_type(wf.events(), "superstep_aborted")
    assert (aborted.reason, aborted.error.type, aborted.error.message) == (
        "failed",
        "SystemExit",
        "leaving",
    )
    assert [e.key for e in of_type(wf.events(), "state_staged")] == ["fine"]
    assert wf.committed_state() == {}
