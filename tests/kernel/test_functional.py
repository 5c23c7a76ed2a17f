"""Functional workflows (``@workflow``) on the log: each execution of the function is one
superstep, its steps are served from the log when it runs again (after a crash, a cancellation,
an answer), its state counts only when that superstep commits, and its requests keep the
function's ids while the log keeps them unique.

AF's own tests of the functional API, re-told, are in tests/af/test_af_functional.py.
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
    DefinitionError,
    FunctionalWorkflow,
    PendingRequestsError,
    RunContext,
    RunInProgressError,
    WorkflowArgumentError,
    WorkflowEvent,
    get_run_context,
    open_store,
    record_response,
    step,
    workflow,
)
from tests.kernel import functional_worker
from tests.kernel.functional_worker import checkout, executions
from tests.kernel.helpers import fate_of, kinds, of_type

WORKER = Path(functional_worker.__file__)
ROOT = Path(__file__).resolve().parents[2]


class Calls:
    """Counts the executions of each step."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


def recorded(wf: FunctionalWorkflow) -> list[tuple[str, int | None]]:
    """``(name, reused)`` of every ``StepRecorded`` of the instance, in order."""
    return [(e.name, e.reused) for e in of_type(wf.events(), "step_recorded")]


def shown(result: Any) -> list[tuple[str, str | None]]:
    return [(e.type, e.executor_id) for e in result]


# -- one superstep per execution ------------------------------------------------------------------


async def test_a_function_runs_in_one_superstep_and_its_steps_are_recorded(store_url):
    calls = Calls()

    @step
    async def add_one(x: int) -> int:
        calls("add_one")
        return x + 1

    @step
    async def double(x: int) -> int:
        calls("double")
        return x * 2

    @workflow
    async def pipeline(x: int) -> int:
        return await double(await add_one(x))

    store = open_store(store_url)
    try:
        wf = pipeline.build(store=store, instance_id="p")
        result = await wf.run(5)

        assert result.get_outputs() == [12]
        assert shown(result) == [
            ("executor_invoked", "add_one"),
            ("executor_completed", "add_one"),
            ("executor_invoked", "double"),
            ("executor_completed", "double"),
            ("output", "pipeline"),
            ("completed", None),
        ]
        assert [c.index for c in wf.checkpoints()] == [1]
        assert recorded(wf) == [("add_one", None), ("double", None)]
        assert kinds(wf.events()).count("superstep_committed") == 1
        assert calls.counts == {"add_one": 1, "double": 1}
    finally:
        store.close()


# -- served on resume after a crash ---------------------------------------------------------------


async def test_steps_completed_before_a_cancellation_are_served_on_resume(store_url):
    calls = Calls()
    inside = asyncio.Event()
    release = asyncio.Event()

    @step
    async def fetch(x: int) -> int:
        calls("fetch")
        return x + 1

    @step
    async def slow(x: int) -> int:
        calls("slow")
        inside.set()
        await release.wait()
        return x * 10

    @workflow
    async def wf_def(x: int, ctx: RunContext) -> int:
        ctx.set_state("seen", x)
        return await slow(await fetch(x))

    store = open_store(store_url)
    try:
        wf = wf_def.build(store=store, instance_id="c")
        task = asyncio.ensure_future(wf.run(1))
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert wf.committed_state() == {}  # the cancelled execution's write never counts
        assert fate_of(wf.workflow, "seen") == ["aborted:cancelled"]

        release.set()
        result = await wf.resume()

        assert result.get_outputs() == [20]
        assert calls.counts == {"fetch": 1, "slow": 2}  # slow never completed: it runs again
        assert shown(result)[:3] == [
            ("executor_bypassed", "fetch"),
            ("executor_invoked", "slow"),
            ("executor_completed", "slow"),
        ]
        fetched = [e for e in of_type(wf.events(), "step_recorded") if e.name == "fetch"]
        assert [e.reused for e in fetched] == [None, fetched[0].position]
        assert wf.committed_state() == {"seen": 1}
    finally:
        store.close()


def _start(url: str, counts: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), url, str(counts), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line.strip() == "READY", f"worker said {line!r}"
    return worker


async def test_a_segment_lost_with_its_process_is_resumed_serving_its_steps(
    durable_store_url, tmp_path, monkeypatch
):
    counts = tmp_path / "counts"
    worker = _start(durable_store_url, counts, "crash")  # killed inside charge
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    assert executions(counts) == {"fetch": 1, "reserve": 1, "charge": 1}

    monkeypatch.setattr(functional_worker, "COUNTS", counts)
    store = open_store(durable_store_url)
    try:
        wf = checkout.build(store=store, instance_id="checkout")
        result = await wf.resume()

        assert result.get_outputs() == ["fetched o-1, approved, reserved o-1, charged o-1"]
        # fetch (first execution) and reserve (recorded by the lost one) are served
        assert executions(counts) == {"fetch": 1, "reserve": 1, "charge": 2}
        lost = [e for e in of_type(wf.events(), "superstep_aborted")]
        assert [e.reason for e in lost] == ["crashed"]
        assert ("reserve", None) in recorded(wf)
    finally:
        store.close()


async def test_human_input_is_answered_in_another_process(durable_store_url, tmp_path, monkeypatch):
    counts = tmp_path / "counts"
    worker = _start(durable_store_url, counts, "pause")
    assert worker.wait(timeout=30) == 0

    monkeypatch.setattr(functional_worker, "COUNTS", counts)
    store = open_store(durable_store_url)  # another process's store, opened afresh
    try:
        wf = checkout.build(store=store, instance_id="checkout")
        (waiting,) = wf.pending_requests()
        assert (waiting.request_id, waiting.data) == ("auto::0", {"approve": "o-1"})
        assert wf.committed_state() == {"fetched": "fetched o-1"}

        result = await wf.run(responses={"auto::0": "approved"})

        assert result.get_outputs() == ["fetched o-1, approved, reserved o-1, charged o-1"]
        assert executions(counts) == {"fetch": 1, "reserve": 1, "charge": 1}
        (answer,) = of_type(wf.events(), "response_received")
        assert answer.request_id.startswith("auto::0@")  # unique in the log
    finally:
        store.close()


# -- human input ----------------------------------------------------------------------------------


async def test_several_rounds_of_input_each_answer_given_once():
    calls = Calls()

    @step
    async def draft(topic: str) -> str:
        calls("draft")
        return f"draft on {topic}"

    @step
    async def review(text: str, ctx: RunContext) -> str:
        calls("review")
        return await ctx.request_info({"review": text}, response_type=str)

    @workflow
    async def writer(topic: str, ctx: RunContext) -> str:
        text = await draft(topic)
        verdict = await review(text)  # auto::0, asked inside a step
        title = await ctx.request_info("a title?", response_type=str)  # auto::1
        tone = await ctx.request_info("a tone?", response_type=str, request_id="tone")
        return f"{title}: {text} ({verdict}, {tone})"

    wf = writer.build(store=open_store("memory://"))
    first = await wf.run("ducks")
    assert [r.request_id for r in first.get_request_info_events()] == ["auto::0"]
    second = await wf.run(responses={"auto::0": "ok"})
    assert [r.request_id for r in second.get_request_info_events()] == ["auto::1"]
    # the answer to auto::0 is in the log: it need not be given again (AF needs it again)
    third = await wf.run(responses={"auto::1": "Ducks"})
    assert [r.request_id for r in third.get_request_info_events()] == ["tone"]
    # giving the earlier answers again, as AF's callers do, is the same
    last = await wf.run(responses={"auto::0": "ok", "auto::1": "Ducks", "tone": "dry"})

    assert last.get_outputs() == ["Ducks: draft on ducks (ok, dry)"]
    assert calls.counts == {"draft": 1, "review": 2}  # review: asked, then answered
    # review was served twice after it completed, and the ids after it stayed the same
    assert [r.auto_request_ids for r in of_type(wf.events(), "step_recorded")] == [
        0,
        0,
        1,
        0,
        0,
        0,
        0,
    ]


async def test_request_ids_stay_the_functions_while_the_log_keeps_them_unique():
    @workflow
    async def ask(n: int, ctx: RunContext) -> str:
        return await ctx.request_info(f"q{n}", response_type=str, request_id="req1")

    wf = ask.build(store=open_store("memory://"))
    for n in (1, 2):
        paused = await wf.run(n)
        assert [r.request_id for r in paused.get_request_info_events()] == ["req1"]
        (event,) = [e for e in paused if e.type == "request_info"]
        assert (event.request_id, event.data) == ("req1", f"q{n}")
        done = await wf.run(responses={"req1": f"a{n}"})
        assert done.get_outputs() == [f"a{n}"]

    logged = [e.request_id for e in of_type(wf.events(), "info_requested")]
    assert len(set(logged)) == 2
    assert all(r.startswith("req1@") for r in logged)


async def test_requests_made_together_are_answered_in_any_order():
    calls = Calls()
    slow_started = asyncio.Event()

    @step
    async def slow(x: int) -> int:
        calls("slow")
        slow_started.set()
        await asyncio.sleep(0)
        return x + 1

    @step(replay_key=lambda who, ctx=None: who)
    async def ask(who: str, ctx: RunContext) -> str:
        await slow_started.wait()
        return await ctx.request_info(f"{who}?", response_type=str, request_id=who)

    @workflow
    async def together(x: int) -> list[Any]:
        return list(await asyncio.gather(slow(x), ask("ann"), ask("bob")))

    wf = together.build(store=open_store("memory://"))
    first = await wf.run(1)
    assert sorted(r.request_id for r in first.get_request_info_events()) == ["ann", "bob"]
    assert recorded(wf) == [("slow", None)]  # it ran beside the requests, and finished

    second = await wf.run(responses={"bob": "B"})
    assert [r.request_id for r in second.get_request_info_events()] == ["ann"]
    last = await wf.run(responses={"ann": "A"})

    assert last.get_outputs() == [[2, "A", "B"]]
    assert calls.counts == {"slow": 1}


async def test_two_answers_delivered_together_run_the_function_once():
    runs = Calls()
    both_asking = asyncio.Event()
    asking: list[str] = []

    @step(replay_key=lambda who, ctx=None: who)
    async def ask(who: str, ctx: RunContext) -> str:
        asking.append(who)
        if len(asking) == 2:
            both_asking.set()
        await both_asking.wait()  # both calls are running when the first request stops the run
        return await ctx.request_info(f"{who}?", response_type=str, request_id=who)

    @workflow
    async def both(x: int) -> list[Any]:
        runs("function")
        return list(await asyncio.gather(ask("a"), ask("b")))

    wf = both.build(store=open_store("memory://"))
    first = await wf.run(1)
    assert sorted(r.request_id for r in first.get_request_info_events()) == ["a", "b"]
    asking.clear()
    both_asking.clear()
    result = await wf.run(responses={"a": "A", "b": "B"})

    assert result.get_outputs() == [["A", "B"]]
    assert runs.counts == {"function": 2}  # once per run, not once per answer
    assert shown(result).count(("output", "both")) == 1


async def test_an_answer_recorded_by_steplog_respond_is_delivered_by_resume_never_dropped():
    @workflow
    async def ask(x: int, ctx: RunContext) -> str:
        return await ctx.request_info("q", response_type=str, request_id="q")

    store = open_store("memory://")
    wf = ask.build(store=store, instance_id="answered-elsewhere")
    paused = await wf.run(1)
    (logged,) = [e.request_id for e in of_type(wf.events(), "info_requested")]
    record_response(store, paused.run_id, logged, "from the command line")  # steplog respond

    with pytest.raises(PendingRequestsError, match="resume"):
        await wf.run(2)  # a new message would drop the recorded answer: refused
    assert (await wf.resume()).get_outputs() == ["from the command line"]


async def test_an_answer_given_again_must_be_the_recorded_one():
    @workflow
    async def two(x: int, ctx: RunContext) -> str:
        a = await ctx.request_info("a?", response_type=str, request_id="a")
        b = await ctx.request_info("b?", response_type=str, request_id="b")
        return a + b

    wf = two.build(store=open_store("memory://"))
    await wf.run(1)
    await wf.run(responses={"a": "A"})
    before = len(wf.events())

    with pytest.raises(WorkflowArgumentError, match="answered already"):
        await wf.run(responses={"a": "other", "b": "B"})
    with pytest.raises(WorkflowArgumentError, match="neither pending nor answered"):
        await wf.run(responses={"c": "C", "b": "B"})
    assert len(wf.events()) == before  # nothing appended

    assert (await wf.run(responses={"a": "A", "b": "B"})).get_outputs() == ["AB"]


async def test_a_response_of_the_wrong_type_is_refused_before_it_is_recorded():
    @dataclass
    class Decision:
        approved: bool

    @workflow
    async def decide(x: int, ctx: RunContext) -> str:
        count = await ctx.request_info("how many?", response_type=int, request_id="n")
        decision = await ctx.request_info("ok?", response_type=Decision, request_id="d")
        return f"{count}:{decision.approved}"

    wf = decide.build(store=open_store("memory://"))
    await wf.run(1)
    before = len(wf.events())
    with pytest.raises(ValueError, match="Response type mismatch for request ID n"):
        await wf.run(responses={"n": "three"})
    assert len(wf.events()) == before

    await wf.run(responses={"n": 3})
    result = await wf.run(responses={"d": {"approved": True}})  # converted, as AF converts it
    assert result.get_outputs() == ["3:True"]


# -- the commit boundary --------------------------------------------------------------------------


async def test_a_failed_executions_writes_never_count_and_the_log_says_why(store_url):
    calls = Calls()

    @step
    async def reserve(n: int) -> int:
        calls("reserve")
        return n

    @workflow
    async def failing(n: int, ctx: RunContext) -> int:
        ctx.set_state("reserved", await reserve(n))
        if n > 0:
            raise RuntimeError("payment refused")
        return n

    store = open_store(store_url)
    try:
        wf = failing.build(store=store, instance_id="f")
        with pytest.raises(RuntimeError, match="payment refused"):
            await wf.run(1)

        assert wf.committed_state() == {}
        assert fate_of(wf.workflow, "reserved") == ["aborted:failed"]
        (aborted,) = of_type(wf.events(), "superstep_aborted")
        assert aborted.reason == "failed"
        assert aborted.error.message == "payment refused"
        assert recorded(wf) == [("reserve", None)]  # the step's record outlives the abort

        assert (await wf.run(0)).get_outputs() == [0]
        assert wf.committed_state() == {"reserved": 0}
    finally:
        store.close()


async def test_state_is_the_instances_and_reserved_keys_are_refused():
    @workflow
    async def counter(n: int, ctx: RunContext) -> int:
        total = ctx.get_state("total", 0) + n
        ctx.set_state("total", total)
        return total

    @workflow
    async def private(n: int, ctx: RunContext) -> None:
        ctx.set_state("_mine", n)

    wf = counter.build(store=open_store("memory://"))
    assert (await wf.run(2)).get_outputs() == [2]
    assert (await wf.run(3)).get_outputs() == [5]  # AF starts every run with empty state
    with pytest.raises(WorkflowArgumentError, match="reserved for framework"):
        await private.build(store=open_store("memory://")).run(1)


# -- identities -----------------------------------------------------------------------------------


async def test_identity_errors_are_afs():
    @step(replay_key=lambda n: "same")
    async def tagged(n: int) -> int:
        return n

    @step
    async def opaque(thing: object) -> str:
        return type(thing).__name__

    @workflow
    async def duplicated(n: int) -> list[int]:
        return [await tagged(n), await tagged(n + 1)]

    @workflow
    async def concurrent(n: int) -> list[str]:
        return list(await asyncio.gather(opaque(object()), opaque(object())))

    @workflow
    async def in_order(n: int) -> list[str]:
        return [await opaque(object()), await opaque(object())]

    store = open_store("memory://")
    with pytest.raises(ValueError, match="duplicate replay_key"):
        await duplicated.build(store=store).run(1)
    with pytest.raises(ValueError, match="Cannot derive a stable replay identity"):
        await concurrent.build(store=store).run(1)
    assert (await in_order.build(store=store).run(1)).get_outputs() == [["object", "object"]]


async def test_equal_calls_are_told_apart_by_their_occurrence_and_ctx_is_no_part_of_it():
    calls = Calls()

    @step
    async def echo(value: str, ctx: RunContext) -> str:
        calls("echo")
        assert ctx is get_run_context()
        return value

    @workflow
    async def twice(value: str, ctx: RunContext) -> list[str]:
        first = await echo(value)
        second = await echo(value, ctx=ctx)  # given by hand: the same identity
        await ctx.request_info("more?", response_type=str, request_id="more")
        return [first, second]

    wf = twice.build(store=open_store("memory://"))
    await wf.run("x")
    result = await wf.run(responses={"more": "no"})

    assert result.get_outputs() == [["x", "x"]]
    assert calls.counts == {"echo": 2}
    assert [e.type for e in result if e.executor_id == "echo"] == ["executor_bypassed"] * 2


async def test_bytes_complex_numbers_and_frozensets_have_identities_as_in_af():
    @step
    async def show(value: Any) -> str:
        return type(value).__name__

    @workflow
    async def kinds_of(_: str) -> list[str]:  # concurrent calls need an identity
        values = (b"raw", 1 + 2j, frozenset({"b", "a"}))
        return list(await asyncio.gather(*(show(v) for v in values)))

    result = await kinds_of.build(store=open_store("memory://")).run("x")
    assert result.get_outputs() == [["bytes", "complex", "frozenset"]]


async def test_a_step_named_as_its_workflow_keeps_its_events():
    @step(name="same")
    async def inner(x: int) -> int:
        return x + 1

    @workflow(name="same")
    async def outer(x: int) -> int:
        return await inner(x)

    result = await outer.build(store=open_store("memory://")).run(1)
    assert shown(result) == [
        ("executor_invoked", "same"),
        ("executor_completed", "same"),
        ("output", "same"),
        ("completed", None),
    ]


# -- the caller's side ----------------------------------------------------------------------------


async def test_run_arguments_are_checked_before_anything_is_appended():
    @workflow
    async def wf_def(x: int, ctx: RunContext) -> str:
        return await ctx.request_info("q", response_type=str, request_id="r1")

    @workflow
    async def no_message(ctx: RunContext) -> str:
        return "nothing to take"

    wf = wf_def.build(store=open_store("memory://"))
    cases = [
        ({"message": 1, "responses": {"r1": "a"}}, "Cannot provide both 'message' and 'resp"),
        ({"message": 1, "checkpoint_id": "c"}, "Cannot provide both 'message' and 'check"),
        ({}, "Must provide at least one of"),
        ({"responses": {"r1": "a"}}, "no pending request_info events"),
        ({"message": 1, "checkpoint_storage": object()}, "steplog does not take"),
        ({"checkpoint_id": "missing"}, "checkpoint_storage"),
    ]
    for kwargs, message in cases:
        with pytest.raises(WorkflowArgumentError, match=message):
            wf.run(**kwargs)
    assert wf.events() == []
    with pytest.raises(WorkflowArgumentError, match="no non-RunContext parameter"):
        no_message.build(store=open_store("memory://")).run("input")

    await wf.run(1)
    before = len(wf.events())
    with pytest.raises(WorkflowArgumentError, match="do not answer any"):
        wf.run(responses={"other": "a"})
    assert len(wf.events()) == before
    with pytest.raises(DefinitionError, match="multiple non-RunContext parameters"):
        workflow(lambda_two)


async def lambda_two(a: int, b: int) -> int:
    return a + b


async def test_one_run_at_a_time_and_a_dropped_stream_frees_the_workflow():
    release = asyncio.Event()

    @workflow
    async def waits(x: int) -> int:
        await release.wait()
        return x

    wf = waits.build(store=open_store("memory://"))
    stream = wf.run(1, stream=True)
    with pytest.raises(RunInProgressError, match="already running"):  # a RuntimeError, as AF's
        wf.run(2)
    async for event in stream:
        if event.type == "status":
            break
    del stream  # dropped unread: the run is recorded as abandoned
    release.set()
    assert (await wf.run(3)).get_outputs() == [3]
    assert "run_abandoned" in kinds(wf.events())


async def test_the_stream_is_afs_functional_stream():
    @step
    async def add_one(x: int) -> int:
        return x + 1

    @step
    async def fails(x: int) -> int:
        raise ValueError(f"bad {x}")

    @workflow
    async def ok(x: int, ctx: RunContext) -> int:
        await ctx.add_event(WorkflowEvent("progress", 1))
        return await add_one(x)

    @workflow
    async def broken(x: int) -> int:
        return await fails(x)

    store = open_store("memory://")
    events = [e async for e in ok.build(store=store).run(1, stream=True)]
    assert [(e.type, e.executor_id, e.state) for e in events] == [
        ("started", None, None),
        ("status", None, "IN_PROGRESS"),
        ("executor_invoked", "add_one", None),
        ("executor_completed", "add_one", None),
        ("progress", "ok", None),
        ("output", "ok", None),
        ("status", None, "IDLE"),
        ("completed", None, None),
    ]
    seen: list[tuple[str, str | None]] = []

    async def read(stream: Any) -> None:
        async for event in stream:
            seen.append((event.type, event.executor_id))

    with pytest.raises(ValueError, match="bad 1"):
        await read(broken.build(store=store).run(1, stream=True))
    assert [s for s in seen if s[0].startswith("executor")] == [
        ("executor_invoked", "fails"),
        ("executor_failed", "fails"),
    ]
    assert ("failed", "broken") in seen


async def test_a_step_result_changed_later_leaves_its_event_and_record_as_they_were():
    @step
    async def items() -> list[str]:
        return []

    @workflow
    async def grows(_: str, ctx: RunContext) -> list[str]:
        found = await items()
        found.append("after")
        await ctx.request_info("go on?", response_type=str, request_id="go")
        return found

    wf = grows.build(store=open_store("memory://"))
    first = await wf.run("x")
    (completed,) = [e for e in first if e.type == "executor_completed"]
    assert completed.data == []
    result = await wf.run(responses={"go": "yes"})
    assert result.get_outputs() == [["after"]]  # served [] again, not the changed list


async def test_a_fork_goes_on_with_the_forks_own_answers():
    @workflow
    async def ask(x: int, ctx: RunContext) -> str:
        return await ctx.request_info("q", response_type=str, request_id="q")

    store = open_store("memory://")
    wf = ask.build(store=store, instance_id="origin")
    await wf.run(1)
    fork = wf.fork(at=wf.checkpoints()[-1].checkpoint_id, instance_id="fork")

    assert [r.request_id for r in fork.pending_requests()] == ["q"]
    assert (await fork.run(responses={"q": "in the fork"})).get_outputs() == ["in the fork"]
    assert (await wf.run(responses={"q": "in the origin"})).get_outputs() == ["in the origin"]


def test_a_workflow_needs_an_async_function_and_keeps_afs_names():
    def plain(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="async"):
        workflow(plain)  # type: ignore[arg-type]

    @workflow(name="named", description="what it does")
    async def anything(x: int) -> int:
        return x

    wf = anything.build(store=open_store("memory://"), instance_id="i")
    assert (wf.name, wf.description, wf.workflow.name) == ("named", "what it does", "named")
    assert not hasattr(anything, "run")
    with pytest.raises(DefinitionError, match="checkpoint_storage"):
        anything.build(checkpoint_storage=object())


def test_a_run_context_made_by_hand_keeps_its_own_state():
    ctx = RunContext("by hand")
    ctx.set_state("k", 1)
    assert ctx.get_state("k") == 1
    assert get_run_context() is None
    with pytest.raises(RuntimeError, match="made by hand"):
        asyncio.run(ctx.request_info("q", response_type=str))
