"""``checkpoint_statuses``: what the log alone says of each checkpoint, without the workflow.
Where it says something, it is what ``Workflow.checkpoints()`` says; it says something for
runs that completed, wait for input, or failed in a superstep, and every older checkpoint is
``superseded``; where only the graph could tell (a response recorded from the log), None."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import (
    EventStore,
    checkpoint_statuses,
    logged_checkpoints,
    open_store,
    record_response,
)
from tests.durable.helpers import Tick, counting, reviewing


def _compared(store: EventStore, instance: str, wf: Any) -> list[Any]:
    """The log's statuses, each checked against the workflow's where the log says one."""
    before = store.version(instance)
    logged = checkpoint_statuses(store, instance)
    assert store.version(instance) == before  # reading wrote nothing
    known = wf.checkpoints()
    assert list(logged) == [c.checkpoint_id for c in known]
    for checkpoint in known:
        said = logged[checkpoint.checkpoint_id]
        assert said is None or said == checkpoint.status, checkpoint
    # the checkpoints themselves, from the same one fold: the workflow's, with those statuses
    listed = logged_checkpoints(store, instance)
    assert [
        (c.checkpoint_id, c.instance_id, c.run_id, c.index, c.timestamp, c.position) for c in listed
    ] == [
        (c.checkpoint_id, c.instance_id, c.run_id, c.index, c.timestamp, c.position) for c in known
    ]
    assert [c.status for c in listed] == list(logged.values())
    assert [c.latest for c in listed] == [i == len(known) - 1 for i in range(len(known))]
    return list(logged.values())


async def test_a_failed_run_then_resumed_to_its_end(store_url):
    store = open_store(store_url)
    with pytest.raises(RuntimeError):
        await counting(store, fail_at=3).run(Tick(1))
    assert _compared(store, "count", counting(store)) == ["superseded", "resumable"]
    await counting(store).resume()
    statuses = _compared(store, "count", counting(store))
    assert statuses[-1] == "completed"
    assert set(statuses[:-1]) == {"superseded"}
    assert len(statuses) == 5


async def test_a_run_waiting_for_input_and_answered(store_url):
    store = open_store(store_url)
    (request,) = (await reviewing(store).run("v1")).pending_requests
    assert _compared(store, "r", reviewing(store)) == ["awaiting_input"]
    record_response(store, request.run_id, request.request_id, "approve", instance_id="r")
    # the response run committed nothing: whether messages wait needs the graph
    assert _compared(store, "r", reviewing(store)) == [None]
    assert reviewing(store).checkpoints()[-1].status == "resumable"
    await reviewing(store).resume()
    assert _compared(store, "r", reviewing(store)) == ["superseded", "completed"]


def test_an_instance_without_checkpoints_has_none(store_url):
    store = open_store(store_url)
    assert checkpoint_statuses(store, "nothing") == {}
    assert logged_checkpoints(store, "nothing") == []


async def test_a_fork_that_committed_nothing_lists_the_origins_checkpoint(store_url):
    store = open_store(store_url)
    origin = counting(store)
    await origin.run(Tick(1))
    second = origin.checkpoints()[1]
    origin.fork(at=second.checkpoint_id, instance_id="f")
    (mark,) = logged_checkpoints(store, "f")
    forked = store.read("f", upto=1)[0]
    assert (mark.checkpoint_id, mark.instance_id, mark.run_id, mark.index) == (
        second.checkpoint_id,
        "count",
        second.run_id,
        None,  # the index is in the origin's log
    )
    assert (mark.position, mark.timestamp, mark.latest) == (
        second.position,
        forked.timestamp,
        True,
    )
    assert mark.status == checkpoint_statuses(store, "f")[second.checkpoint_id]
