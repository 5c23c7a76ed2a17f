"""Walking between a parent superstep and its sub-workflows: blame, time travel and history
inside a child, and the links back, with the verdict the parent's log gives each link.

On memory and SQLite.
"""

from __future__ import annotations

import asyncio

import pytest

from kernel import EventStore, WorkflowBuilder
from projections import (
    AtSuperstep,
    blame_keys,
    forks_of,
    history_of,
    parent_of,
    state_at,
    subworkflows_of,
)
from tests.kernel.test_subworkflows import (
    Boom,
    Fragile,
    Sibling,
    Watched,
    asking_parent,
    fragile_parent,
)

pytestmark = pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)


async def test_from_a_parent_superstep_to_its_child_and_back(store: EventStore) -> None:
    wf = asking_parent(store, instance_id="parent")
    await wf.run("ann@example.com")
    (request,) = wf.pending_requests()
    await wf.run(responses={request.request_id: True})

    asked, answered = subworkflows_of(store, "parent")
    assert (asked.verdict, answered.verdict) == ("committed", "committed")
    assert asked.requests == (request.request_id,)
    assert answered.continues == asked.child_instance
    # Only one superstep's children, when asked for it.
    assert subworkflows_of(store, "parent", superstep_id=asked.parent_superstep) == [asked]

    # Inside the child that took the answer: blame and time travel as in any instance.
    blame = blame_keys(store, answered.child_instance, ["ok"])
    (write,) = blame.writes("ok")
    assert (write.status, write.value, write.run_id) == ("committed", True, answered.child_run)
    child_events = store.read(answered.child_instance)
    assert state_at(child_events, AtSuperstep(write.superstep_id)).values["ok"] is True
    # The first child's email came to the answering child with the fork.
    (inherited,) = blame_keys(store, answered.child_instance, ["email"]).writes("email")
    assert inherited.origin_instance == asked.child_instance

    # And back: the child names the parent superstep that ran it, whose state is at hand.
    assert parent_of(store, answered.child_instance) == answered
    assert parent_of(store, asked.child_instance) == asked
    parent_then = state_at(wf.events(), AtSuperstep(answered.parent_superstep))
    assert parent_then.decoded() == {"started": "ann@example.com"}  # the sink's write is next
    assert parent_of(store, "parent") is None

    # History: the answering child is a fork of the asking one, and each child has its run.
    assert [fork.instance_id for fork in forks_of(store, asked.child_instance)] == [
        answered.child_instance
    ]
    history = history_of(store, answered.child_instance)
    assert history.forked_from is not None
    assert history.forked_from.origin_instance == asked.child_instance
    assert [run.run_id for run in history.runs()] == [answered.child_run]


async def test_a_link_in_an_aborted_superstep_says_so_from_both_ends(store: EventStore) -> None:
    done = asyncio.Event()
    inner = WorkflowBuilder(start_executor=Fragile()).build()
    wf = fragile_parent(store, Sibling(done), sub=Watched(inner, done))
    with pytest.raises(Boom):
        await wf.run("fine")
    (link,) = subworkflows_of(store, wf.instance_id)
    assert link.verdict == "aborted"
    assert parent_of(store, link.child_instance) == link
    # The child's own state is committed in its own log, whatever the parent's verdict.
    (write,) = blame_keys(store, link.child_instance, ["seen"]).writes("seen")
    assert write.status == "committed"
