"""A message no edge delivers: dropped, as AF drops it, and the run goes on; unlike AF, the drop is
recorded (``MessageStaged.dropped``) and shown by history and ``steplog log``. A drop in a
superstep that aborts is inert like the rest of it. ``strict_routing=True`` fails the run."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from kernel import (
    DropReason,
    Executor,
    MessageStaged,
    RoutingError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel.testing import LogBuilder
from projections import DroppedMessage, Projector, SuperstepRecord, fold_history, history_of
from projections.cli import main
from tests.kernel.helpers import markers, of_type


class Sender(Executor):
    """Sends what ``plan`` says for the input: (message, target_id) pairs; then maybe fails."""

    def __init__(self, id: str, *, fail: bool = False) -> None:
        super().__init__(id)
        self.fail = fail

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int | str]) -> None:
        ctx.set_state(f"{self.id}.seen", n)
        await ctx.send_message(n)
        await ctx.send_message("not a number")  # no target of this sender takes a str
        await ctx.send_message(n + 1, target_id="far")  # not connected to this sender
        if self.fail:
            raise RuntimeError("boom after sending")


class Lone(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        await ctx.send_message(n)  # no outgoing edge
        await ctx.yield_output(n)


class Last(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state(f"{self.id}.seen", n)
        await ctx.yield_output(n)


def chain(store: Any, *, fail: bool = False, strict: bool = False, instance: str = "i") -> Any:
    """sender -> near -> far: the sender's str and its message for "far" go nowhere."""
    sender, near, far = Sender("sender", fail=fail), Last("near"), Last("far")
    return (
        WorkflowBuilder(
            start_executor=sender, store=store, instance_id=instance, strict_routing=strict
        )
        .add_edge(sender, near)
        .add_edge(near, far)
        .build()
    )


def drops_of(events: list[Any]) -> list[tuple[str, str | None, DropReason | None, Any]]:
    return [
        (e.source, e.target, e.dropped, e.message)
        for e in of_type(events, "message_staged")
        if e.dropped is not None
    ]


async def test_undeliverable_messages_are_dropped_recorded_and_the_run_goes_on(store):
    wf = chain(store)

    result = await wf.run(1)

    assert result.status == "completed"
    assert result.get_outputs() == [1]
    assert wf.committed_state() == {"sender.seen": 1, "near.seen": 1}
    events = store.read("i")  # as the store gives it back
    assert drops_of(events) == [
        ("sender", None, "type_mismatch", "not a number"),
        ("sender", "far", "target_mismatch", 2),
    ]
    assert all(e.targets == [] for e in of_type(events, "message_staged") if e.dropped)
    assert set(markers(wf).values()) == {"committed"}

    history = fold_history(events)
    run = history.runs()[0]
    first = history.supersteps(run.run_id)[0]
    assert [(d.source, d.target, d.reason, d.message) for d in first.dropped] == drops_of(events)
    assert run.dropped == list(first.dropped)
    assert [d.position for d in run.dropped] == [
        e.position for e in of_type(events, "message_staged") if e.dropped
    ]


async def test_a_message_from_an_executor_without_edges_is_dropped_as_no_edges(store):
    wf = WorkflowBuilder(start_executor=Lone("lone"), store=store, instance_id="l").build()

    result = await wf.run(7)

    assert result.get_outputs() == [7]
    assert drops_of(wf.events()) == [("lone", None, "no_edges", 7)]
    assert [d.reason for d in history_of(store, "l").runs()[0].dropped] == ["no_edges"]


async def test_a_drop_in_a_superstep_that_aborts_is_inert(store):
    wf = chain(store, fail=True)

    with pytest.raises(RuntimeError, match="boom after sending"):
        await wf.run(1)

    assert len(drops_of(wf.events())) == 2  # recorded as staged ...
    assert set(markers(wf).values()) == {"aborted:failed"}
    history = fold_history(wf.events())
    run = history.runs()[0]
    step = history.supersteps(run.run_id)[0]
    assert (step.status, len(step.dropped)) == ("aborted", 2)
    assert run.dropped == []  # ... but no drop happened: the superstep never counted
    assert wf.committed_state() == {}


async def test_strict_routing_fails_the_run_with_a_routing_error_and_records_no_drop(store):
    wf = chain(store, strict=True)

    with pytest.raises(RoutingError, match="which no target connected to it handles"):
        await wf.run(1)

    assert drops_of(wf.events()) == []
    assert set(markers(wf).values()) == {"aborted:failed"}
    assert of_type(wf.events(), "run_failed")[0].error.type == "kernel.RoutingError"
    assert history_of(store, "i").runs()[0].dropped == []


async def test_a_resumed_run_delivers_what_was_delivered_and_nothing_that_was_dropped(store):
    class Asks(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
            await ctx.send_message(n, target_id="nowhere")  # dropped
            await ctx.send_message(n)

    class Waits(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
            await ctx.yield_output(n * 10)

    asks = Asks("asks")
    wf = (
        WorkflowBuilder(start_executor=asks, store=store, instance_id="r", max_supersteps=1)
        .add_edge(asks, Waits("waits"))
        .build()
    )
    with pytest.raises(Exception, match="max_supersteps"):
        await wf.run(4)

    again = (
        WorkflowBuilder(start_executor=Asks("asks"), store=store, instance_id="r")
        .add_edge("asks", Waits("waits"))
        .build()
    )
    result = await again.resume()

    assert result.get_outputs() == [40]
    assert [d[2] for d in drops_of(again.events())] == ["target_mismatch"]


async def test_the_history_view_agrees_with_the_fold_on_drops(store):
    await chain(store, instance="v").run(1)
    projector = Projector(store, ["history"], page_size=3)
    projector.catch_up()

    viewed = projector.history("v")

    assert viewed == history_of(store, "v")
    assert [d.reason for d in viewed.runs()[0].dropped] == ["type_mismatch", "target_mismatch"]
    assert [len(s.dropped) for s in viewed.supersteps()] == [2, 0]


def test_a_superstep_row_written_before_drops_were_recorded_reads_as_none_dropped():
    step = SuperstepRecord("s", "r", 1, _time(), 2, status="committed")
    row = step.to_row()
    del row["dropped"]

    assert SuperstepRecord.from_row(row).dropped == ()
    drop = DroppedMessage("a", None, "no_edges", {"x": 1}, 5)
    with_drop = SuperstepRecord("s", "r", 1, _time(), 2, dropped=(drop,))
    assert SuperstepRecord.from_row(with_drop.to_row()) == with_drop


def test_a_logged_drop_reason_outside_drop_reason_is_refused():
    log = LogBuilder("x")
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    fields = log.send(1, dropped="no_edges").model_dump()

    with pytest.raises(ValidationError, match="dropped"):
        MessageStaged.model_validate({**fields, "dropped": "lost_in_the_post"})


async def test_steplog_log_and_history_show_drops_and_whether_they_happened(
    sqlite_url, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "300")  # table cells whole, not folded
    with open_store(sqlite_url) as store:
        await chain(store, instance="ok").run(1)
        with pytest.raises(RuntimeError):
            await chain(store, fail=True, instance="bad").run(1)

    assert main(["--store", sqlite_url, "log", "ok", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    dropped = [line for line in lines if line.get("dropped")]
    assert [(d["dropped"], d["counts"]) for d in dropped] == [
        ("type_mismatch", True),
        ("target_mismatch", True),
    ]
    assert main(["--store", sqlite_url, "log", "bad", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["counts"] for line in lines if line.get("dropped")] == [False, False]

    assert main(["--store", sqlite_url, "log", "ok"]) == 0
    table = capsys.readouterr().out
    assert "type_mismatch" in table
    assert "dropped" in table

    assert main(["--store", sqlite_url, "history", "ok"]) == 0
    out = capsys.readouterr().out
    assert "messages dropped" in out
    assert "no connected target handles its type" in out
    assert "no edge joins its sender to the target it named" in out
    assert main(["--store", sqlite_url, "history", "bad"]) == 0
    out = capsys.readouterr().out
    assert "messages dropped" in out
    assert "no (aborted)" in out


def _time() -> datetime:
    return datetime(2025, 1, 1, tzinfo=UTC)
