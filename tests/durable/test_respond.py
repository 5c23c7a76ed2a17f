"""``record_response`` and ``fork_at``: answering and forking from the log alone, without the
workflow, as the runner and ``Workflow.fork`` would (then the workflow goes on from there)."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import (
    Executor,
    PendingRequestsError,
    ResponseError,
    ResumeError,
    WorkflowBuilder,
    WorkflowContext,
    fork_at,
    handler,
    open_store,
    record_response,
    response_handler,
)
from tests.durable.helpers import Approval, Tick, counting, reopen, reviewing


class TwoQuestions(Executor):
    """Asks two questions in one superstep; yields both answers once both came."""

    @handler
    async def ask(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.request_info(Approval(f"{text}-a"), str)
        await ctx.request_info(Approval(f"{text}-b"), int)

    @response_handler
    async def said(self, request: Approval, answer: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state(request.draft, answer)
        await ctx.yield_output(f"{request.draft}={answer}")

    @response_handler
    async def counted(self, request: Approval, answer: int, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state(request.draft, answer)
        await ctx.yield_output(f"{request.draft}={answer}")


def asking_two(store: Any) -> Any:
    return WorkflowBuilder(start_executor=TwoQuestions("two"), store=store, instance_id="q").build()


async def test_a_recorded_response_is_delivered_by_the_next_resume(store_url: str) -> None:
    store = open_store(store_url)
    first = await reviewing(store, "q").run("v1")
    (request,) = first.pending_requests
    recorded = record_response(store, request.run_id, request.request_id, "approve")

    events = store.read("q", after=recorded.first_position - 1)
    assert [e.type for e in events] == ["run_started", "response_received", "run_awaiting_input"]
    assert events[0].continues == request.run_id
    assert events[1].value == "approve"
    later = reviewing(reopen(store_url, store), "q")
    assert later.pending_requests() == []
    result = await later.resume()
    assert result.get_outputs() == ["v1"]
    assert later.committed_state() == {"draft": "v1", "approved": "v1"}


async def test_two_requests_answered_one_at_a_time_then_resumed(store_url: str) -> None:
    store = open_store(store_url)
    first = await asking_two(store).run("x")
    a, b = first.pending_requests
    one = record_response(store, a.run_id, a.request_id, "yes")
    with pytest.raises(ResponseError, match="already answered"):
        record_response(store, one.run_id, a.request_id, "again")
    with pytest.raises(ResponseError, match="must be a int; got a str"):
        record_response(store, one.run_id, b.request_id, "7")
    wf = asking_two(store)
    assert [r.request_id for r in wf.pending_requests()] == [b.request_id]
    record_response(store, one.run_id, b.request_id, 7)
    result = await wf.resume()
    assert sorted(result.get_outputs()) == ["x-a=yes", "x-b=7"]
    assert wf.committed_state() == {"x-a": "yes", "x-b": 7}


async def test_a_new_message_after_a_recorded_response_is_refused_until_resumed(
    store_url: str,
) -> None:
    """A response recorded for the next ``resume()`` waits as a request does: a run with a new
    message would continue nothing and drop it (issue 21: ``run("O-2")`` was accepted and the
    approval never delivered). It is refused, naming the response and ``resume()``; nothing is
    appended; ``resume()`` then delivers it, after which a new message runs."""
    store = open_store(store_url)
    first = await reviewing(store, "q").run("v1")
    (request,) = first.pending_requests
    recorded = record_response(store, request.run_id, request.request_id, "approve")
    version = store.version("q")
    wf = reviewing(reopen(store_url, store), "q")
    with pytest.raises(PendingRequestsError) as refused:
        await wf.run("O-2")
    message = str(refused.value)
    assert request.request_id in message
    assert recorded.run_id in message
    assert "resume()" in message
    assert "supersede_requests=True" in message
    assert refused.value.responded_ids == (request.request_id,)
    assert refused.value.request_ids == ()
    assert store.version("q") == version
    assert (await wf.resume()).get_outputs() == ["v1"]
    assert wf.committed_state() == {"draft": "v1", "approved": "v1"}
    assert (await wf.run("O-2")).status == "awaiting_input"


async def test_a_recorded_response_given_up_on_purpose(store_url: str) -> None:
    """``supersede_requests=True`` starts the new run anyway: the recorded response is given up
    (it stays in the log) and the new run asks afresh."""
    store = open_store(store_url)
    first = await reviewing(store, "q").run("v1")
    (request,) = first.pending_requests
    record_response(store, request.run_id, request.request_id, "approve")
    wf = reviewing(reopen(store_url, store), "q")
    second = await wf.run("O-2", supersede_requests=True)
    assert second.status == "awaiting_input"
    assert "approved" not in wf.committed_state()


async def test_refusals_append_nothing(store_url: str) -> None:
    store = open_store(store_url)
    first = await reviewing(store, "q").run("v1")
    (request,) = first.pending_requests
    version = store.version("q")
    with pytest.raises(ResponseError, match="no pending request 'nope'"):
        record_response(store, request.run_id, "nope", "approve")
    with pytest.raises(ResponseError, match="must be a str"):
        record_response(store, request.run_id, request.request_id, 3)
    with pytest.raises(ResumeError, match="has no run"):
        record_response(store, "other-run", request.request_id, "x", instance_id="q")
    assert store.version("q") == version


async def test_fork_at_appends_what_workflow_fork_appends(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(RuntimeError):
        await counting(store, fail_at=4).run(Tick(1))
    origin = counting(store)
    waiting = await reviewing(store).run("v1")
    assert waiting.status == "awaiting_input"
    reviewer = reviewing(store)
    points: list[tuple[Any, Any, str]] = [
        (origin, c.checkpoint_id, "count") for c in origin.checkpoints()
    ]
    points += [(origin, 3, "count"), (reviewer, store.version("r"), "r"), (reviewer, 2, "r")]
    for n, (wf, at, instance) in enumerate(points):
        by_workflow = wf.fork(at=at, instance_id=f"wf-{n}").events()[0]
        by_log = fork_at(store, instance, at, f"log-{n}")
        skip = {"instance_id", "timestamp"}
        assert by_log.model_dump(exclude=skip) == by_workflow.model_dump(exclude=skip), at
    resumed = await counting(store, "log-1").resume()
    assert resumed.get_outputs() == [1, 2, 3, 4, 5]
    with pytest.raises(Exception, match="already has events"):
        fork_at(store, "count", 3, "log-1")


async def test_a_forks_inherited_request_is_answered_on_the_fork(store_url: str) -> None:
    """Issue 21: a fork that has not run holds copies of its origin's waiting requests; with
    ``instance_id`` the fork, ``record_response`` answers the fork's copy (the origin's run goes
    on there, as ``run(responses=...)`` on the fork's workflow does), and the origin still waits.
    """
    store = open_store(store_url)
    first = await reviewing(store, "q").run("v1")
    (request,) = first.pending_requests
    fork_at(store, "q", store.version("q"), "q-b")
    recorded = record_response(
        store, request.run_id, request.request_id, "approve", instance_id="q-b"
    )
    assert recorded.instance_id == "q-b"
    started = store.read("q-b", after=recorded.first_position - 1)[0]
    assert started.continues == request.run_id
    origin = reviewing(store, "q")
    assert [r.request_id for r in origin.pending_requests()] == [request.request_id]
    fork = reviewing(reopen(store_url, store), "q-b")
    assert fork.pending_requests() == []
    assert (await fork.resume()).get_outputs() == ["v1"]
    assert fork.committed_state() == {"draft": "v1", "approved": "v1"}
    assert "approved" not in origin.committed_state()
    with pytest.raises(ResumeError, match="has no run 'nope'"):
        record_response(store, "nope", request.request_id, "x", instance_id="q-b")
