"""Human input that waits in the log: request_info, response handlers, run(responses=...)."""

from __future__ import annotations

import pytest

from kernel import (
    ResponseError,
    WorkflowBuilder,
    open_store,
)
from tests.durable.helpers import Approval, AsksThenFails, reopen, reviewing


async def test_a_request_waits_in_the_log_and_a_later_process_answers_it(store_url: str) -> None:
    store = open_store(store_url)
    first = await reviewing(store).run("v1")
    assert first.status == "awaiting_input"
    (request,) = first.pending_requests
    assert request.data == Approval("v1")
    assert [e.request_id for e in first.get_request_info_events()] == [request.request_id]
    assert [e.type for e in reviewing(store).events()][-1] == "run_awaiting_input"

    later = reviewing(reopen(store_url, store))
    assert [r.request_id for r in later.pending_requests()] == [request.request_id]
    assert later.checkpoints()[-1].status == "awaiting_input"
    revised = await later.run(responses={request.request_id: "shorter"})
    assert revised.status == "awaiting_input"
    (again,) = revised.pending_requests
    assert again.data == Approval("v1 (shorter)")
    events = [e async for e in later.run(responses={again.request_id: "approve"}, stream=True)]
    assert [e.data for e in events if e.type == "output"] == ["v1 (shorter)"]
    assert events[-1].type == "completed"
    assert later.committed_state() == {"draft": "v1", "approved": "v1 (shorter)"}


async def test_bad_responses_are_refused_and_nothing_is_appended(store_url: str) -> None:
    store = open_store(store_url)
    wf = reviewing(store)
    (request,) = (await wf.run("v1")).pending_requests
    before = len(wf.events())
    with pytest.raises(ResponseError, match="must be a str; got a int"):
        await wf.run(responses={request.request_id: 42})
    with pytest.raises(ResponseError, match="no pending request 'nope'"):
        await wf.run(responses={"nope": "approve"})
    assert len(wf.events()) == before
    await wf.run(responses={request.request_id: "approve"})
    with pytest.raises(ResponseError, match="already answered"):
        await wf.run(responses={request.request_id: "approve"})


async def test_a_request_of_an_aborted_superstep_is_never_delivered(store_url: str) -> None:
    start = AsksThenFails("flaky")
    wf = WorkflowBuilder(start_executor=start, store=open_store(store_url)).build()
    with pytest.raises(RuntimeError):
        await wf.run("v1")
    assert wf.pending_requests() == []
    assert [e.type for e in wf.events() if e.type == "info_requested"] == ["info_requested"]
