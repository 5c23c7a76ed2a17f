"""Resume from the log: checkpoints, continuing a run in a new Workflow object, refusals."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import (
    Executor,
    ResponseError,
    ResumeError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    response_handler,
)
from tests.durable.helpers import Approval, Counter, Tick, counting, reopen


async def test_a_failed_run_resumes_in_a_new_workflow_to_the_uninterrupted_result(
    store_url: str,
) -> None:
    store = open_store(store_url)
    with pytest.raises(RuntimeError, match="boom at 3"):
        await counting(store, fail_at=3).run(Tick(1))
    fresh = counting(reopen(store_url, store))
    checkpoints = fresh.checkpoints()
    assert [c.index for c in checkpoints] == [1, 2]
    assert checkpoints[-1].status == "resumable"
    assert all(c.status == "superseded" for c in checkpoints[:-1])
    result = await fresh.run(checkpoint_id=checkpoints[-1].checkpoint_id)
    assert result.status == "completed"
    assert result.get_outputs() == [1, 2, 3, 4, 5]
    assert result.supersteps == 5
    assert fresh.committed_state() == {"count": 5}
    started = [e for e in fresh.events() if e.type == "run_started"]
    assert started[1].continues == started[0].run_id
    assert started[1].checkpoint == checkpoints[-1].checkpoint_id
    assert fresh.checkpoints()[-1].status == "completed"


async def test_resume_continues_the_named_run_and_streams_only_new_events(store_url: str) -> None:
    store = open_store(store_url)
    wf = counting(store, fail_at=4)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    failed_run = next(e for e in wf.events() if e.type == "run_started").run_id
    fresh = counting(reopen(store_url, store))
    seen = [(e.type, e.superstep, e.data) async for e in fresh.resume(failed_run, stream=True)]
    assert [s for t, s, _ in seen if t == "superstep_started"] == [4, 5]
    assert [d for t, _, d in seen if t == "output"] == [4, 5]
    assert seen[-1][0] == "completed"


async def test_an_older_checkpoint_is_refused_with_a_pointer_to_fork(store_url: str) -> None:
    store = open_store(store_url)
    wf = counting(store, fail_at=4)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    first = wf.checkpoints()[0]
    before = len(wf.events())
    with pytest.raises(ResumeError, match=r"not the latest committed superstep.*fork"):
        await wf.run(checkpoint_id=first.checkpoint_id)
    with pytest.raises(ResumeError, match="no checkpoint 'nope'"):
        await wf.run(checkpoint_id="nope")
    assert len(wf.events()) == before


async def test_a_completed_run_has_nothing_to_resume(store_url: str) -> None:
    wf = counting(open_store(store_url))
    await wf.run(Tick(1))
    before = len(wf.events())
    with pytest.raises(ResumeError, match="nothing left to do"):
        await wf.resume()
    assert len(wf.events()) == before


async def test_a_run_superseded_by_a_later_commit_is_refused(store_url: str) -> None:
    store = open_store(store_url)
    wf = counting(store, fail_at=3)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    first_run = next(e for e in wf.events() if e.type == "run_started").run_id
    await counting(store).run(Tick(10))  # commits after the failed run
    with pytest.raises(ResumeError, match=r"cannot be continued.*[Ff]ork"):
        await counting(store).resume(first_run)


async def test_fork_at_a_checkpoint_resumes_in_the_fork_and_leaves_the_origin(
    store_url: str,
) -> None:
    store = open_store(store_url)
    wf = counting(store, fail_at=4)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    origin_events = wf.events()
    second = wf.checkpoints()[1]
    fork = counting(store).fork(at=second.checkpoint_id, instance_id="count-fork")
    assert fork.committed_state() == {"count": 2}
    assert fork.checkpoints()[-1].checkpoint_id == second.checkpoint_id
    result = await fork.resume()
    assert result.get_outputs() == [1, 2, 3, 4, 5]
    assert fork.committed_state() == {"count": 5}
    assert wf.events() == origin_events
    again = await fork.run(Tick(7))
    assert again.get_outputs() == [7]


async def test_only_the_last_run_goes_on_and_an_answered_request_stays_answered(
    store_url: str,
) -> None:
    class Asker(Executor):
        """Asks once; its response handler fails the first time (the answer is recorded)."""

        failed = False

        @handler
        async def ask(self, text: str, ctx: WorkflowContext[str, str]) -> None:
            await ctx.request_info(Approval(text), str)

        @response_handler
        async def answered(self, request: Approval, answer: str, ctx: WorkflowContext) -> None:
            if not Asker.failed:
                Asker.failed = True
                raise RuntimeError("flaky")
            await ctx.yield_output(f"{request.draft}: {answer}")

    store = open_store(store_url)
    wf = WorkflowBuilder(start_executor=Asker("asker"), store=store, instance_id="a").build()
    waiting = await wf.run("v1")
    (request,) = waiting.pending_requests
    with pytest.raises(RuntimeError, match="flaky"):
        await wf.run(responses={request.request_id: "yes"})
    before = len(wf.events())
    with pytest.raises(ResumeError, match="only an instance's last run goes on"):
        await wf.resume(waiting.run_id, responses={request.request_id: "no"})
    with pytest.raises(ResponseError, match="already answered"):
        await wf.run(responses={request.request_id: "no"})
    assert len(wf.events()) == before
    done = await wf.resume()  # the recorded answer is delivered again
    assert done.get_outputs() == ["v1: yes"]


async def test_a_resumed_fork_keeps_the_run_arguments(store_url: str) -> None:
    seen: list[dict[str, Any]] = []

    class Noting(Counter):
        @handler
        async def tick(self, tick: Tick, ctx: WorkflowContext[Tick, int]) -> None:
            seen.append(dict(ctx.run_kwargs))
            await super().tick(tick, ctx)

    store = open_store(store_url)
    node = Noting("counter", 3, fail_at=2)
    wf = WorkflowBuilder(start_executor=node, store=store, instance_id="k").add_edge(node, node)
    workflow = wf.build()
    with pytest.raises(RuntimeError):
        await workflow.run(Tick(1), mode="x")
    node.fail_at = None
    fork = workflow.fork(at=workflow.checkpoints()[-1].checkpoint_id, instance_id="k-fork")
    await fork.resume()
    assert seen == [{"mode": "x"}] * 4  # 1, 2 (failed), then 2 and 3 in the fork


async def test_fork_takes_the_time_travel_points_and_refuses_inside_a_superstep() -> None:
    from projections import AtPosition, AtSuperstep, AtTime, InsideSuperstep

    store = open_store("memory://")
    wf = counting(store, limit=3)
    await wf.run(Tick(1))
    first, second, _ = wf.checkpoints()
    at_step = wf.fork(at=AtSuperstep(second.checkpoint_id), instance_id="f1")
    assert at_step.committed_state() == {"count": 2}
    by_index = wf.fork(at=AtSuperstep(run_id=first.run_id, index=1), instance_id="f2")
    assert by_index.committed_state() == {"count": 1}
    at_position = wf.fork(at=AtPosition(first.position), instance_id="f3")
    assert at_position.committed_state() == {"count": 1}
    at_time = wf.fork(at=AtTime(second.timestamp), instance_id="f4")
    assert at_time.committed_state() == {"count": 2}
    with pytest.raises(ResumeError, match="inside a superstep"):
        wf.fork(at=InsideSuperstep(second.checkpoint_id), instance_id="f5")
    with pytest.raises(ResumeError, match="outside instance 'count'"):
        wf.fork(at=999, instance_id="f6")
    assert store.read("f5") == []
    assert store.read("f6") == []
