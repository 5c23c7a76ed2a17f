"""A store that refuses an append never costs the run its end, nor the instance its view.

Each case makes the store fail on one chosen append (a ``StoreError``, as a lost connection would)
and checks the log and the instance afterwards: the superstep that was really open is the one
aborted, the run ends in the log, the instance can run again, and what was committed before
still reads back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kernel import (
    EventBase,
    Executor,
    MemoryStore,
    RunInProgressError,
    StoreError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from kernel.testing import LogBuilder
from tests.kernel.helpers import Router, Sink, kinds, of_type


class FlakyStore(MemoryStore):
    """A memory store that refuses the first append holding an event ``refuse`` picks."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: Callable[[EventBase], bool] = lambda event: False

    def append(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> list[int]:
        if any(self.refuse(event) for event in events):
            self.refuse = lambda event: False
            raise StoreError("the connection was lost")
        return super().append(instance_id, events, expected_version=expected_version)


class Counter(Executor):
    """Stages ``n`` and sends ``n - 1`` until it reaches 0."""

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("n", n)
        if n > 0:
            await ctx.send_message(n - 1)


def counter(store: MemoryStore, durability: str = "superstep") -> Any:
    node = Counter("counter")
    return (
        WorkflowBuilder(start_executor=node, store=store, durability=durability)  # type: ignore[arg-type]
        .add_edge(node, node)
        .build()
    )


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_a_refused_append_keeps_what_was_committed_before(durability):
    store = FlakyStore()
    wf = counter(store, durability)
    await wf.run(0)
    assert wf.committed_state() == {"n": 0}

    store.refuse = lambda event: event.type == "superstep_committed"
    with pytest.raises(StoreError):
        await wf.run(3)

    assert wf.committed_state() == {"n": 0}  # the same object's view, not only a fresh one's
    await wf.run(1)
    assert wf.committed_state() == {"n": 0}
    assert kinds(wf.events())[-1] == "run_completed"


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_a_refused_commit_aborts_the_superstep_that_was_open(durability):
    store = FlakyStore()
    wf = counter(store, durability)
    store.refuse = lambda event: event.type == "superstep_committed"

    with pytest.raises(StoreError):
        await wf.run(2)

    events = wf.events()
    started = [e.superstep_id for e in of_type(events, "superstep_started")]
    (aborted,) = of_type(events, "superstep_aborted")
    assert aborted.superstep_id == started[-1]  # a superstep that started, not a next one
    assert (aborted.reason, kinds(events)[-1]) == ("failed", "run_failed")
    assert of_type(events, "superstep_committed") == []


async def test_a_refused_last_commit_still_ends_the_run():
    store = FlakyStore()
    wf = counter(store)
    store.refuse = lambda event: event.type == "run_completed"

    with pytest.raises(StoreError):
        await wf.run(0)

    assert kinds(wf.events())[-2:] == ["superstep_aborted", "run_failed"]
    await wf.run(0)  # the instance is free: nothing of the failed run is open
    assert wf.committed_state() == {"n": 0}


async def test_a_store_error_in_one_parallel_executor_aborts_the_superstep():
    store = FlakyStore()
    source, a, b = Router("source"), Sink("a"), Sink("b")
    wf = (
        WorkflowBuilder(start_executor=source, store=store, durability="write")
        .add_fan_out_edges(source, [a, b])
        .build()
    )
    store.refuse = lambda event: event.type == "executor_invoked" and event.executor_id == "b"

    with pytest.raises(StoreError, match="connection was lost"):
        await wf.run(1)

    events = wf.events()
    assert of_type(events, "superstep_committed")[-1].superstep_id != (
        of_type(events, "superstep_aborted")[0].superstep_id
    )
    assert kinds(events)[-2:] == ["superstep_aborted", "run_failed"]
    assert wf.committed_state() == {}  # a's write never counts: its superstep aborted


async def test_a_stream_that_fails_before_its_first_superstep_frees_the_instance():
    wf = counter(MemoryStore())
    stream = wf.run("not an int", stream=True)
    with pytest.raises(Exception, match="no handler"):
        async for _ in stream:
            pass
    try:
        result = await wf.run(0)  # the stream object still exists
    except RunInProgressError:  # pragma: no cover - the regression
        pytest.fail("a stream that never started keeps the instance busy")
    assert result.status == "completed"


@pytest.mark.parametrize("owner", ["{host}:99999999999999999999", "{host}:4294967296", "{host}:²"])
async def test_an_unfinished_run_with_a_strange_owner_is_closed_as_abandoned(owner):
    import socket

    store = MemoryStore()
    log = LogBuilder("i")
    log.start_run(owner=owner.format(host=socket.gethostname()))
    log.start_superstep()
    log.append_to(store)
    wf = WorkflowBuilder(start_executor=Counter("counter"), store=store, instance_id="i").build()

    await wf.run(0)

    (closed,) = of_type(wf.events(), "run_abandoned")
    assert closed.reason == "abandoned"
