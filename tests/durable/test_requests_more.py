"""Human input at the edges: several requests at once, partial answers, responses whose delivery
crashed, response handlers chosen by type, and responses given to a streamed run.

Every test runs on memory, SQLite and PostgreSQL (``store_url``); where a later process matters,
the answer is given through a new ``Workflow`` on a freshly opened store (``reopen``), and the one
real crash is a process killed with SIGKILL (``durable_store_url``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernel import (
    ConvergenceError,
    EventStore,
    Executor,
    PendingRequestsError,
    ResponseError,
    ResumeError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    open_store,
    response_handler,
)
from tests.durable.helpers import reopen

ROOT = Path(__file__).resolve().parents[2]


def of_type(wf: Workflow, kind: str) -> list[Any]:
    return [e for e in wf.events() if e.type == kind]


def run_ends(wf: Workflow) -> list[str]:
    """Each run's start and end, in log order."""
    return [e.type for e in wf.events() if e.type.startswith("run_")]


@dataclass
class Question:
    asker: str
    text: str


# -- parallel executors, each asking ------------------------------------------------------------


class Split(Executor):
    @handler
    async def split(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(topic)


class Asker(Executor):
    """Asks one question about the topic; its answer is its output (and, with ``forward``, its
    message onward)."""

    def __init__(self, id: str, *, forward: bool = False) -> None:
        super().__init__(id)
        self.forward = forward

    @handler
    async def ask(self, topic: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.request_info(Question(self.id, f"{topic}?"), str)

    @response_handler
    async def answered(
        self, request: Question, answer: str, ctx: WorkflowContext[str, str]
    ) -> None:
        ctx.set_state(f"answer:{self.id}", answer)
        await ctx.yield_output(f"{self.id}:{answer}")
        if self.forward:
            await ctx.send_message(f"{self.id}:{answer}")


class Join(Executor):
    @handler
    async def join(self, answers: list[str], ctx: WorkflowContext[Any, str]) -> None:
        ctx.set_state("joined", sorted(answers))
        await ctx.yield_output("+".join(sorted(answers)))


def panel(store: EventStore, *, join: bool = False) -> Workflow:
    """``split`` fans out to askers ``a`` and ``b``, which ask in the same superstep; with
    ``join``, their answers meet in a fan-in."""
    split, a, b = Split("split"), Asker("a", forward=join), Asker("b", forward=join)
    builder = WorkflowBuilder(start_executor=split, store=store, instance_id="panel")
    builder.add_fan_out_edges(split, [a, b])
    if join:
        builder.add_fan_in_edges([a, b], Join("join"))
    return builder.build()


def by_asker(wf: Workflow) -> dict[str, str]:
    """Pending request ids, by the executor that asked."""
    return {r.executor_id: r.request_id for r in wf.pending_requests()}


async def test_parallel_executors_each_ask_and_the_run_waits_for_all(store_url: str) -> None:
    store = open_store(store_url)
    result = await panel(store).run("lunch")
    assert result.status == "awaiting_input"
    assert sorted((r.executor_id, r.data) for r in result.pending_requests) == [
        ("a", Question("a", "lunch?")),
        ("b", Question("b", "lunch?")),
    ]
    assert len({r.superstep_id for r in result.pending_requests}) == 1  # one superstep asked both
    later = panel(reopen(store_url, store))
    assert by_asker(later) == {r.executor_id: r.request_id for r in result.pending_requests}
    (waiting,) = of_type(later, "run_awaiting_input")
    assert sorted(waiting.requests) == sorted(by_asker(later).values())
    assert later.checkpoints()[-1].status == "awaiting_input"


async def test_a_partial_answer_runs_what_it_can_and_waits_for_the_rest(store_url: str) -> None:
    store = open_store(store_url)
    wf = panel(store)
    await wf.run("lunch")
    ids = by_asker(wf)
    first = await panel(reopen(store_url, store)).run(responses={ids["a"]: "yes"})
    assert first.status == "awaiting_input"
    assert [r.request_id for r in first.pending_requests] == [ids["b"]]
    assert first.get_outputs() == ["a:yes"]
    later = panel(reopen(store_url, store))
    assert by_asker(later) == {"b": ids["b"]}
    with pytest.raises(ResponseError, match="already answered"):
        await later.run(responses={ids["a"]: "no"})
    last = await later.run(responses={ids["b"]: "no"})
    assert last.status == "completed"
    assert last.get_outputs() == ["a:yes", "b:no"]  # counted over the whole lineage
    assert later.committed_state() == {"answer:a": "yes", "answer:b": "no"}
    assert run_ends(later) == ["run_started", "run_awaiting_input"] * 2 + [
        "run_started",
        "run_completed",
    ]


async def test_a_fan_in_waits_across_runs_for_the_answer_still_missing(store_url: str) -> None:
    store = open_store(store_url)
    wf = panel(store, join=True)
    await wf.run("lunch")
    ids = by_asker(wf)
    partial = await wf.run(responses={ids["b"]: "pasta"})
    assert partial.status == "awaiting_input"  # the fan-in holds b's message, a is still asked
    assert "joined" not in wf.committed_state()
    later = panel(reopen(store_url, store), join=True)
    done = await later.run(responses={ids["a"]: "soup"})
    assert done.status == "completed"
    assert done.get_outputs() == ["b:pasta", "a:soup", "a:soup+b:pasta"]
    assert later.committed_state()["joined"] == ["a:soup", "b:pasta"]


async def test_both_answers_in_one_call_run_their_handlers_in_one_superstep(
    store_url: str,
) -> None:
    wf = panel(open_store(store_url))
    await wf.run("lunch")
    ids = by_asker(wf)
    result = await wf.run(responses={ids["b"]: "no", ids["a"]: "yes"})
    assert result.status == "completed"
    assert sorted(result.get_outputs()) == ["a:yes", "b:no"]
    started = of_type(wf, "run_started")[-1]
    invoked = [e for e in of_type(wf, "executor_invoked") if e.run_id == started.run_id]
    assert sorted(e.executor_id for e in invoked) == ["a", "b"]
    assert len({e.superstep_id for e in invoked}) == 1
    received = [e.request_id for e in of_type(wf, "response_received")]
    assert received == [ids["b"], ids["a"]]  # recorded in the order given


async def test_a_sibling_failure_voids_the_request_and_resume_asks_again(store_url: str) -> None:
    class Fickle(Asker):
        broken = True

        @handler
        async def ask(self, topic: str, ctx: WorkflowContext[str, str]) -> None:
            if Fickle.broken:
                await asyncio.sleep(0)  # let the sibling ask first
                raise RuntimeError("asker b is down")
            await ctx.request_info(Question(self.id, f"{topic}?"), str)

    def build(store: EventStore) -> Workflow:
        split, a, b = Split("split"), Asker("a"), Fickle("b")
        return (
            WorkflowBuilder(start_executor=split, store=store, instance_id="panel")
            .add_fan_out_edges(split, [a, b])
            .build()
        )

    store = open_store(store_url)
    wf = build(store)
    with pytest.raises(RuntimeError, match="asker b is down"):
        await wf.run("lunch")
    (voided,) = [e.request_id for e in of_type(wf, "info_requested")]  # a asked, b failed
    assert wf.pending_requests() == []
    with pytest.raises(ResponseError, match="no pending request"):
        await wf.run(responses={voided: "yes"})
    Fickle.broken = False
    resumed = await build(reopen(store_url, store)).resume()
    assert resumed.status == "awaiting_input"
    asked = {r.executor_id: r.request_id for r in resumed.pending_requests}
    assert sorted(asked) == ["a", "b"]
    assert voided not in asked.values()


# -- a response whose delivery did not commit ---------------------------------------------------


@dataclass
class Approval:
    draft: str


class Editor(Executor):
    """Asks for approval; its response handler is broken while ``Editor.broken`` is set."""

    broken = False
    delivered: list[str] = []  # a test probe: what each delivery carried

    @handler
    async def draft(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.request_info(Approval(text), str)

    @response_handler
    async def decided(self, request: Approval, answer: str, ctx: WorkflowContext[str, str]) -> None:
        Editor.delivered.append(answer)
        ctx.set_state("decision", answer)
        if Editor.broken:
            raise RuntimeError("the response handler crashed")
        await ctx.yield_output(f"{request.draft}:{answer}")


def editing(store: EventStore) -> Workflow:
    return WorkflowBuilder(start_executor=Editor("editor"), store=store, instance_id="ed").build()


@pytest.fixture
def editor_probe() -> Any:
    Editor.broken = False
    Editor.delivered = []
    yield Editor
    Editor.broken = False
    Editor.delivered = []


async def test_a_response_whose_handler_failed_is_delivered_again_by_resume(
    store_url: str, editor_probe: Any
) -> None:
    store = open_store(store_url)
    wf = editing(store)
    (request,) = (await wf.run("v1")).pending_requests
    Editor.broken = True
    with pytest.raises(RuntimeError, match="response handler crashed"):
        await wf.run(responses={request.request_id: "approve"})
    assert wf.committed_state() == {}  # the handler's write was in the aborted superstep
    # the response is recorded: it waits to be delivered, and cannot be replaced
    (recorded,) = of_type(wf, "response_received")
    assert recorded.request_id == request.request_id
    assert wf.pending_requests() == []
    assert wf.checkpoints()[-1].status == "resumable"
    before = len(wf.events())
    with pytest.raises(ResponseError, match="already answered"):
        await wf.run(responses={request.request_id: "reject"})
    assert len(wf.events()) == before
    # a new message would drop the response that waits for resume(): refused (issue 21)
    with pytest.raises(PendingRequestsError, match=r"resume\(\)") as refused:
        await wf.run("v2")
    assert refused.value.responded_ids == (request.request_id,)
    assert len(wf.events()) == before

    Editor.broken = False  # the fixed executor, in a later process
    fixed = editing(reopen(store_url, store))
    result = await fixed.resume()
    assert result.status == "completed"
    assert result.get_outputs() == ["v1:approve"]
    assert Editor.delivered == ["approve", "approve"]
    assert fixed.committed_state() == {"decision": "approve"}
    assert len(of_type(fixed, "response_received")) == 1  # delivered again, not recorded again
    starts = of_type(fixed, "run_started")
    assert starts[2].continues == starts[1].run_id


async def test_a_response_stream_closed_before_its_superstep_committed_is_resumed(
    store_url: str, editor_probe: Any
) -> None:
    gate = asyncio.Event()

    class Slow(Editor):
        @response_handler
        async def decided(
            self, request: Approval, answer: str, ctx: WorkflowContext[str, str]
        ) -> None:
            Editor.delivered.append(answer)
            gate.set()
            await asyncio.Event().wait()  # never finishes: the stream is closed meanwhile

    store = open_store(store_url)
    slow = WorkflowBuilder(start_executor=Slow("editor"), store=store, instance_id="ed").build()
    (request,) = (await slow.run("v1")).pending_requests
    stream = slow.run(responses={request.request_id: "approve"}, stream=True)
    seen = []
    async for event in stream:
        seen.append(event.type)
        if event.type == "executor_invoked":
            await gate.wait()
            break
    await stream.aclose()
    assert seen == ["started", "status", "superstep_started", "executor_invoked"]
    assert run_ends(slow)[-1] == "run_cancelled"
    result = await editing(reopen(store_url, store)).resume()
    assert result.get_outputs() == ["v1:approve"]
    assert Editor.delivered == ["approve", "approve"]


def _answer_and_die(url: str, request_id: str) -> None:
    """Run in a child process: deliver ``request_id``'s response, and be killed (SIGKILL) inside
    the response handler, before its superstep can commit."""

    class Doomed(Editor):
        @response_handler
        async def decided(
            self, request: Approval, answer: str, ctx: WorkflowContext[str, str]
        ) -> None:
            ctx.set_state("decision", answer)
            os.kill(os.getpid(), signal.SIGKILL)

    store = open_store(url)
    wf = WorkflowBuilder(start_executor=Doomed("editor"), store=store, instance_id="ed").build()
    asyncio.run(wf.run(responses={request_id: "approve"}))


async def test_a_response_whose_process_was_killed_is_delivered_by_resume(
    durable_store_url: str, editor_probe: Any
) -> None:
    store = open_store(durable_store_url)
    wf = editing(store)
    (request,) = (await wf.run("v1")).pending_requests
    code = (
        "import sys; from tests.durable.test_requests_more import _answer_and_die; "
        "_answer_and_die(sys.argv[1], sys.argv[2])"
    )
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", code, durable_store_url, request.request_id],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert run_ends(wf)[-1] == "run_started"  # the killed continuation is still open
    assert [e.request_id for e in of_type(wf, "response_received")] == [request.request_id]

    result = await editing(reopen(durable_store_url, store)).resume()
    assert result.get_outputs() == ["v1:approve"]
    assert Editor.delivered == ["approve"]
    (closed,) = of_type(wf, "run_abandoned")
    assert closed.reason == "crashed"
    aborted = of_type(wf, "superstep_aborted")
    assert [a.reason for a in aborted] == ["crashed"]
    assert wf.committed_state() == {"decision": "approve"}


# -- choosing the response handler --------------------------------------------------------------


@dataclass
class Quantity:
    item: str


@dataclass
class Pick:
    options: list[str]


class Clerk(Executor):
    """Asks three things at once; each response goes to the handler for its request's type and,
    for a ``Pick``, the response's type (an index or a name)."""

    @handler
    async def order(self, item: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.request_info(Approval(item), str)
        await ctx.request_info(Quantity(item), int)
        await ctx.request_info(Pick(["red", "blue"]), int | str)

    @response_handler
    async def on_approval(self, request: Approval, answer: str, ctx: WorkflowContext) -> None:
        ctx.set_state("approval", answer)

    @response_handler
    async def on_quantity(self, request: Quantity, count: int, ctx: WorkflowContext) -> None:
        ctx.set_state("quantity", count)

    @response_handler
    async def on_pick_index(self, request: Pick, index: int, ctx: WorkflowContext) -> None:
        ctx.set_state("colour", request.options[index])
        ctx.set_state("picked_by", "index")

    @response_handler
    async def on_pick_name(self, request: Pick, name: str, ctx: WorkflowContext) -> None:
        ctx.set_state("colour", name)
        ctx.set_state("picked_by", "name")


def clerk(store: EventStore) -> Workflow:
    return WorkflowBuilder(start_executor=Clerk("clerk"), store=store, instance_id="shop").build()


async def test_each_response_goes_to_the_handler_for_its_request_type(store_url: str) -> None:
    store = open_store(store_url)
    wf = clerk(store)
    pending = (await wf.run("mug")).pending_requests
    ids = {type(r.data).__name__: r.request_id for r in pending}
    assert [type(r.data).__name__ for r in pending] == ["Approval", "Quantity", "Pick"]
    before = len(wf.events())
    with pytest.raises(ResponseError, match="must be a int; got a str"):
        await wf.run(responses={ids["Quantity"]: "ten"})
    with pytest.raises(ResponseError, match="must be a str; got a int"):
        await wf.run(responses={ids["Approval"]: 1})
    with pytest.raises(ResponseError, match="must be a int or str; got a float"):
        await wf.run(responses={ids["Pick"]: 1.0})
    assert len(wf.events()) == before
    later = clerk(reopen(store_url, store))
    result = await later.run(responses={ids["Pick"]: 1, ids["Quantity"]: 3, ids["Approval"]: "ok"})
    assert result.status == "completed"
    assert later.committed_state() == {
        "approval": "ok",
        "quantity": 3,
        "colour": "blue",
        "picked_by": "index",
    }


async def test_the_response_type_chooses_between_handlers_of_one_request_type(
    store_url: str,
) -> None:
    wf = clerk(open_store(store_url))
    pending = (await wf.run("mug")).pending_requests
    pick = next(r.request_id for r in pending if isinstance(r.data, Pick))
    result = await wf.run(responses={pick: "green"})
    assert result.status == "awaiting_input"  # the other two still wait
    assert wf.committed_state() == {"colour": "green", "picked_by": "name"}


# -- streaming with responses -------------------------------------------------------------------


class Negotiator(Executor):
    """Asks for a price until the answer is at least 10; then yields the deal."""

    @handler
    async def open(self, item: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.request_info(Quantity(item), int)

    @response_handler
    async def offered(self, request: Quantity, price: int, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("last_offer", price)
        if price < 10:
            await ctx.request_info(Quantity(f"{request.item} (more)"), int)
        else:
            await ctx.yield_output(f"{request.item} for {price}")


def negotiation(store: EventStore) -> Workflow:
    return WorkflowBuilder(
        start_executor=Negotiator("negotiator"), store=store, instance_id="deal"
    ).build()


async def test_a_streamed_continuation_shows_new_requests_and_ends_waiting(store_url: str) -> None:
    store = open_store(store_url)
    events = [e async for e in negotiation(store).run("lamp", stream=True)]
    assert [e.type for e in events][-5:] == [
        "request_info",
        "status",  # IN_PROGRESS_PENDING_REQUESTS
        "superstep_completed",
        "status",  # IDLE_WITH_PENDING_REQUESTS
        "awaiting_input",
    ]
    (asked,) = [e for e in events if e.type == "request_info"]
    assert asked.data == Quantity("lamp")
    assert asked.executor_id == "negotiator"

    later = negotiation(reopen(store_url, store))
    stream = later.run(responses={asked.request_id: 5}, stream=True)
    seen = [e async for e in stream]
    assert [e.type for e in seen] == [
        "started",
        "status",
        "superstep_started",
        "executor_invoked",
        "executor_completed",
        "request_info",
        "status",
        "superstep_completed",
        "status",
        "awaiting_input",
    ]
    assert [e.state for e in seen if e.type == "status"] == [
        WorkflowRunState.IN_PROGRESS,
        WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS,
        WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
    ]
    assert seen[2].superstep == 2  # the continuation's first superstep follows the checkpoint
    again = seen[5]
    assert again.data == Quantity("lamp (more)")
    assert again.request_id != asked.request_id
    assert [r.request_id for r in later.pending_requests()] == [again.request_id]

    # resume() takes responses too, and streams the same way
    final = [e async for e in later.resume(stream=True, responses={again.request_id: 12})]
    assert [(e.type, e.data) for e in final if e.type in ("output", "request_info")] == [
        ("output", "lamp (more) for 12")
    ]
    assert final[-1].type == "completed"
    assert final[2].superstep == 3
    assert later.committed_state() == {"last_offer": 12}
    assert later.checkpoints()[-1].status == "completed"


async def test_responses_in_a_stream_are_checked_before_anything_is_appended(
    store_url: str,
) -> None:
    wf = negotiation(open_store(store_url))
    (request,) = (await wf.run("lamp")).pending_requests
    before = len(wf.events())
    stream = wf.run(responses={request.request_id: "cheap"}, stream=True)
    with pytest.raises(ResponseError, match="must be a int"):
        async for _ in stream:
            pass
    assert len(wf.events()) == before
    assert [r.request_id for r in wf.pending_requests()] == [request.request_id]


# -- which requests a continuation can answer ---------------------------------------------------


async def test_responses_with_a_checkpoint_id_answer_only_from_the_latest(store_url: str) -> None:
    store = open_store(store_url)
    wf = panel(store)
    await wf.run("lunch")
    ids = by_asker(wf)
    first = wf.checkpoints()[0]
    before = len(wf.events())
    with pytest.raises(ResumeError, match=r"not the latest.*[Ff]ork"):
        await wf.run(checkpoint_id=first.checkpoint_id, responses={ids["a"]: "yes"})
    assert len(wf.events()) == before
    later = panel(reopen(store_url, store))
    latest = later.checkpoints()[-1]
    assert latest.status == "awaiting_input"
    result = await later.run(checkpoint_id=latest.checkpoint_id, responses={ids["a"]: "yes"})
    assert result.get_outputs() == ["a:yes"]
    assert [r.request_id for r in result.pending_requests] == [ids["b"]]
    started = of_type(later, "run_started")[-1]
    assert started.checkpoint == latest.checkpoint_id


async def test_a_new_message_while_requests_wait_is_refused_naming_them(store_url: str) -> None:
    """A run with a message continues nothing, so it would leave the requests waiting
    unanswerable: it is refused, naming them and how to answer them, and nothing is appended
    (issue 21: the requests used to disappear without a word). The requests stay answerable."""
    store = open_store(store_url)
    wf = panel(store)
    await wf.run("lunch")
    old = by_asker(wf)
    before = len(wf.events())
    with pytest.raises(PendingRequestsError) as refused:
        await wf.run("dinner")
    message = str(refused.value)
    assert old["a"] in message
    assert old["b"] in message
    assert "run(responses=" in message
    assert "supersede_requests=True" in message
    assert set(refused.value.request_ids) == set(old.values())
    with pytest.raises(PendingRequestsError):
        [e async for e in wf.run("dinner", stream=True)]
    assert len(wf.events()) == before
    again = panel(reopen(store_url, store))
    assert by_asker(again) == old
    answered = await again.run(responses={old["a"]: "soup", old["b"]: "salad"})
    assert sorted(answered.get_outputs()) == ["a:soup", "b:salad"]
    assert (await again.run("dinner")).status == "awaiting_input"  # nothing waits any more


async def test_a_new_message_supersedes_the_pending_requests_and_a_fork_can_answer_them(
    store_url: str,
) -> None:
    """Asked to (``supersede_requests=True``), a run started with a message makes the previous
    run's unanswered requests unanswerable on this instance (Agent Framework keeps them pending
    across a fresh run); the checkpoint that holds them can still be forked and answered there."""
    store = open_store(store_url)
    wf = panel(store)
    await wf.run("lunch")
    old = by_asker(wf)
    asked_at = wf.checkpoints()[-1]
    dinner = await wf.run("dinner", supersede_requests=True)
    assert dinner.status == "awaiting_input"
    new = by_asker(wf)
    assert sorted(new) == ["a", "b"]
    assert set(new.values()).isdisjoint(old.values())
    before = len(wf.events())
    with pytest.raises(ResponseError, match="no pending request"):
        await wf.run(responses={old["a"]: "soup"})
    assert len(wf.events()) == before
    fork = panel(reopen(store_url, store)).fork(at=asked_at.checkpoint_id, instance_id="lunch")
    assert by_asker(fork) == old
    answered = await fork.run(responses={old["a"]: "soup", old["b"]: "salad"})
    assert sorted(answered.get_outputs()) == ["a:soup", "b:salad"]
    assert by_asker(wf) == new  # the origin is untouched


# -- the superstep limit across responses -------------------------------------------------------


async def test_a_response_past_max_supersteps_is_a_convergence_error(store_url: str) -> None:
    """Superstep indexes run on across a run's continuations (as Agent Framework's iteration
    count does across responses), so ``max_supersteps`` bounds the whole lineage: a response that
    would need superstep ``max_supersteps + 1`` fails with ``ConvergenceError`` (AF raises its
    ``WorkflowConvergenceException`` there) and its handler does not run."""
    store = open_store(store_url)
    ran: list[int] = []

    class Looper(Negotiator):
        @response_handler
        async def offered(
            self, request: Quantity, price: int, ctx: WorkflowContext[str, str]
        ) -> None:
            ran.append(ctx.superstep)
            await ctx.request_info(Quantity(request.item), int)

    wf = WorkflowBuilder(
        start_executor=Looper("negotiator"), store=store, instance_id="deal", max_supersteps=2
    ).build()
    (request,) = (await wf.run("lamp")).pending_requests
    (request,) = (await wf.run(responses={request.request_id: 1})).pending_requests
    assert ran == [2]
    before = len(wf.events())
    with pytest.raises(ConvergenceError, match="max_supersteps=2"):
        await wf.run(responses={request.request_id: 2})
    assert ran == [2]
    assert len(wf.events()) == before  # refused: nothing appended
    committed = {e.superstep_id for e in of_type(wf, "superstep_committed")}
    indexes = [e.index for e in of_type(wf, "superstep_started") if e.superstep_id in committed]
    assert max(indexes) == 2
