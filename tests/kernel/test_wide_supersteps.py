"""The wide-superstep hot path: events the runner builds without validation, the instance view
folded a batch at a time, and executor tasks that finish in their first step."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from kernel import (
    CommittedState,
    EventBase,
    Executor,
    MemoryStore,
    OpenRun,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    handler,
)
from kernel._base._clock import system_clock
from kernel._run._instance import InstanceContext
from kernel.testing import LogBuilder, ticking_clock
from tests.kernel.helpers import kinds, markers


class Source(Executor):
    @handler
    async def start(self, n: int, ctx: WorkflowContext[int]) -> None:
        ctx.set_state("round", n)
        await ctx.send_message(n)


class Worker(Executor):
    """Writes two keys; awaits first when ``pause``; raises ``fail`` when given."""

    def __init__(self, id: str, pause: bool = False, fail: BaseException | None = None) -> None:
        super().__init__(id)
        self.pause = pause
        self.fail = fail
        self.cancelled = False

    @handler
    async def work(self, n: int, ctx: WorkflowContext[int]) -> None:
        if self.pause:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail is not None:
            raise self.fail
        ctx.set_state(f"{self.id}.a", n)
        ctx.delete_state(f"{self.id}.b")


def fan_out(store: Any, workers: list[Worker], **options: Any) -> Any:
    source = Source("source")
    builder = WorkflowBuilder(start_executor=source, store=store, **options)
    for worker in workers:
        builder = builder.add_edge(source, worker)
    return builder.build()


def revalidated(event: EventBase) -> EventBase:
    return type(event).model_validate(event.model_dump())


@pytest.mark.parametrize("durability", ["superstep", "write"])
async def test_every_event_a_wide_run_builds_is_the_event_validation_makes(durability):
    store = MemoryStore()
    appended: list[EventBase] = []
    append = store.append

    def keep(instance_id: str, batch: Any, **kw: Any) -> Any:
        appended.extend(batch)
        return append(instance_id, batch, **kw)

    store.append = keep  # type: ignore[method-assign]
    wf = fan_out(store, [Worker(f"w{i}") for i in range(4)], durability=durability)

    await wf.run(3)

    assert len(appended) == store.version(wf.instance_id) > 0
    for event in appended:
        again = revalidated(event)
        assert type(again) is type(event)
        assert again == event
        assert again.model_dump() == event.model_dump()
    assert wf.committed_state() == {"round": 3, **{f"w{i}.a": 3 for i in range(4)}}
    assert appended == wf.events()


async def test_an_error_escaping_a_finished_executor_task_fails_the_superstep():
    # Not a handler's failure (those are caught and recorded): a BaseException that is not an
    # Exception escapes the executor's task, which is already done when the runner first looks.
    class Escape(BaseException):
        pass

    store = MemoryStore()
    wf = fan_out(store, [Worker("w0"), Worker("w1", fail=Escape("out"))])

    with pytest.raises(Escape):
        await wf.run(1)

    assert list(markers(wf).values()) == ["committed", "aborted:failed"]
    assert kinds(wf.events())[-1] == "run_failed"
    assert wf.committed_state() == {"round": 1}


async def test_a_failure_cancels_siblings_still_waiting_after_the_first_turn():
    store = MemoryStore()
    waiting = Worker("w0", pause=True)
    wf = fan_out(store, [waiting, Worker("w1", fail=ValueError("bad"))])

    with pytest.raises(ValueError, match="bad"):
        await wf.run(1)

    assert waiting.cancelled
    assert list(markers(wf).values()) == ["committed", "aborted:failed"]
    failed = [e for e in wf.events() if e.type == "executor_failed"]
    assert {e.executor_id for e in failed} == {"w0", "w1"}
    assert wf.committed_state() == {"round": 1}


async def test_executors_that_await_and_that_do_not_commit_together():
    store = MemoryStore()
    wf = fan_out(store, [Worker("w0", pause=True), Worker("w1"), Worker("w2", pause=True)])

    await wf.run(2)

    assert wf.committed_state() == {"round": 2, "w0.a": 2, "w1.a": 2, "w2.a": 2}
    assert set(markers(wf).values()) == {"committed"}


async def test_a_streamed_wide_superstep_reports_every_invocation():
    wf = fan_out(MemoryStore(), [Worker(f"w{i}") for i in range(3)])

    seen = [(e.type, e.executor_id) async for e in wf.run(1, stream=True)]

    invoked = {eid for kind, eid in seen if kind == "executor_invoked"}
    completed = {eid for kind, eid in seen if kind == "executor_completed"}
    assert invoked == completed == {"source", "w0", "w1", "w2"}


@pytest.mark.parametrize("cuts", [(), (1,), (2, 3), (4, 9), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)])
def test_the_instance_view_folds_any_batching_of_a_log_to_the_full_fold(cuts):
    log = LogBuilder("view", clock=ticking_clock(), ids=counter_ids("id"))
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("k", 1)
    log.complete()
    log.commit()
    log.start_superstep()
    log.invoke("a")
    log.write("k", 2)
    log.write("j", 3)  # a batch may end on a write: the view's version still moves to it
    log.complete()
    log.commit()
    log.complete_run()
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("k", 4)
    events = log.events()
    store = MemoryStore()
    view = InstanceContext(
        store,
        "view",
        workflow_name="w",
        router=None,  # type: ignore[arg-type]
        max_supersteps=10,
        durability="superstep",
        clock=system_clock,
        id_factory=counter_ids("x"),
        owner="here:1",
    )
    bounds = [0, *cuts, len(events)]
    for start, end in itertools.pairwise(bounds):
        view.append(events[start:end], expected_version=start)
        head, full = view.catch_up(), OpenRun().apply_all(events[:end])
        assert (head.version, head.run_id, head.superstep_id, head.index) == (
            full.version,
            full.run_id,
            full.superstep_id,
            full.index,
        )
        assert view.committed_values() == CommittedState().apply_all(events[:end]).values
