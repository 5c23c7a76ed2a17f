"""Agent Framework's tests of its functional API (``@workflow``, ``@step``, ``RunContext``),
re-told against steplog.

Each test here has the name of one test of AF's
``python/packages/core/tests/workflow/test_functional_workflow.py`` (the version that matches
AF 1.23's ``_functional.py``: workflows built from a ``FunctionalWorkflowDefinition``, steps with
``replay_key``) and checks what it checks, in its own words. Names come from ``kernel``. Lines
that had to change for steplog are marked ``# port:`` with the reason; the commonest:

* AF replays a *completed* run by restoring its last checkpoint from a ``CheckpointStorage``
  (``run(checkpoint_id=...)``). steplog's checkpoints are the log's, and a completed run has
  nothing left to continue; the same replay is the function running again after an answer: the
  ported function asks ``"again"`` before it returns, and the answer re-executes it, its steps
  served from the log.

The workflows are built without ``store=``, as AF's: ``default_store`` runs each test on memory
and on a SQLite file. docs/porting.md ("Functional workflows") counts these tests and lists
every AF test not here, with the reason.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    EncodingError,
    FunctionalWorkflow,
    FunctionalWorkflowDefinition,
    RunContext,
    RunResult,
    StepWrapper,
    WorkflowEvent,
    WorkflowEventSource,
    WorkflowRunState,
    get_run_context,
    step,
    workflow,
)

pytestmark = pytest.mark.usefixtures("default_store")

FUNCTIONAL_LOGGER = "kernel._ops._functional"  # port: AF logs on agent_framework's own logger


def built(
    func: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """``@built``: a workflow definition, built at once (AF's test helper does the same)."""

    def make(fn: Callable[..., Awaitable[Any]]) -> FunctionalWorkflow:
        return workflow(name=name, description=description)(fn).build()

    return make(func) if func is not None else make


async def again(ctx: RunContext) -> None:
    """port: where AF restores the final checkpoint, the function waits for an answer instead."""
    await ctx.request_info("again?", response_type=str, request_id="again")


async def replay(wf: FunctionalWorkflow, message: Any) -> tuple[RunResult, RunResult]:
    """The first run (up to ``again``) and its replay (the answer): AF's initial run and its
    restore from the final checkpoint."""
    first = await wf.run(message)
    assert first.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    return first, await wf.run(responses={"again": "yes"})


@step
async def add_one(x: int) -> int:
    return x + 1


@step
async def double(x: int) -> int:
    return x * 2


@step
async def to_upper(s: str) -> str:
    return s.upper()


@step(name="custom_name")
async def named_step(x: int) -> int:
    return x + 10


@step
async def failing_step(x: int) -> int:
    raise ValueError(f"step failed with {x}")


class TestBasicExecution:
    async def test_simple_sequential_pipeline(self):
        @built
        async def pipeline(x: int) -> int:
            return await double(await add_one(x))

        result = await pipeline.run(5)
        assert isinstance(result, RunResult)
        assert result.get_outputs() == [12]

    async def test_workflow_with_string_data(self):
        @built
        async def shout(text: str) -> str:
            return await to_upper(text)

        assert (await shout.run("hello")).get_outputs() == ["HELLO"]

    async def test_workflow_returns_result(self):
        @built
        async def simple(x: int) -> int:
            return await add_one(x)

        assert (await simple.run(10)).get_outputs() == [11]

    async def test_workflow_name_defaults_to_function_name(self):
        @built
        async def my_pipeline(x: int) -> int:
            return x

        assert my_pipeline.name == "my_pipeline"

    async def test_workflow_custom_name(self):
        @built(name="custom_wf", description="A test workflow")
        async def wf(x: int) -> int:
            return x

        assert (wf.name, wf.description) == ("custom_wf", "A test workflow")


class TestEventEmission:
    async def test_step_events_emitted(self):
        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        kinds = [e.type for e in await pipeline.run(5)]
        assert {"executor_invoked", "executor_completed", "output"} <= set(kinds)

    async def test_step_events_carry_executor_id(self):
        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        result = await pipeline.run(5)
        (invoked,) = [e for e in result if e.type == "executor_invoked"]
        (completed,) = [e for e in result if e.type == "executor_completed"]
        assert invoked.executor_id == completed.executor_id == "add_one"
        assert completed.data == 6

    async def test_status_events_in_timeline(self):
        @built
        async def pipeline(x: int) -> int:
            return x

        states = [e.state for e in (await pipeline.run(1)).status_timeline()]
        assert WorkflowRunState.IN_PROGRESS in states
        assert WorkflowRunState.IDLE in states

    async def test_final_state_is_idle(self):
        @built
        async def pipeline(x: int) -> int:
            return x

        assert (await pipeline.run(1)).get_final_state() == WorkflowRunState.IDLE

    async def test_custom_event(self):
        @built
        async def pipeline(x: int, ctx: RunContext) -> int:
            await ctx.add_event(WorkflowEvent("intermediate", executor_id="pipeline", data="c"))
            return x

        result = await pipeline.run(1)
        assert [e.data for e in result if e.type == "intermediate"] == ["c"]


class TestParallelExecution:
    async def test_parallel_tasks_with_gather(self):
        @step
        async def slow_add(x: int) -> int:
            await asyncio.sleep(0.01)
            return x + 1

        @step
        async def slow_double(x: int) -> int:
            await asyncio.sleep(0.01)
            return x * 2

        @built
        async def parallel_wf(x: int) -> list[int]:
            a, b = await asyncio.gather(slow_add(x), slow_double(x))
            return [a, b]

        assert (await parallel_wf.run(5)).get_outputs() == [[6, 10]]

    async def test_parallel_events_all_emitted(self):
        @step
        async def task_a(x: int) -> int:
            return x + 1

        @step
        async def task_b(x: int) -> int:
            return x * 2

        @built
        async def par_wf(x: int) -> tuple[int, int]:
            a, b = await asyncio.gather(task_a(x), task_b(x))
            return (a, b)

        kinds = [e.type for e in await par_wf.run(3)]
        assert kinds.count("executor_invoked") == kinds.count("executor_completed") == 2


class TestHITL:
    async def test_workflow_definition_builds_isolated_pending_continuations(self):
        @workflow
        async def review_wf(doc: str, ctx: RunContext) -> str:
            return f"{doc}:{await ctx.request_info(doc, response_type=str)}"

        assert not hasattr(review_wf, "run")
        caller_a, caller_b = review_wf.build(), review_wf.build()
        paused = await caller_a.run("caller-a")
        request_id = paused.get_request_info_events()[0].request_id

        with pytest.raises(ValueError, match="no pending request_info events"):
            await caller_b.run(responses={request_id: "caller-b-response"})
        done = await caller_a.run(responses={request_id: "caller-a-response"})
        assert done.get_outputs() == ["caller-a:caller-a-response"]

    async def test_build_does_not_inherit_checkpoint_storage_by_default(self):
        @workflow
        async def review_wf(doc: str) -> str:
            return doc

        with pytest.raises(ValueError, match="checkpoint_storage"):
            await review_wf.build().run(checkpoint_id="missing")

    async def test_request_info_interrupts(self):
        @built
        async def review_wf(doc: str, ctx: RunContext) -> str:
            got = await ctx.request_info({"draft": doc}, response_type=str, request_id="req1")
            return f"Final: {got}"

        result = await review_wf.run("my doc")
        assert result.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        assert [e.request_id for e in result.get_request_info_events()] == ["req1"]

    async def test_request_info_resume(self):
        @built
        async def review_wf(doc: str, ctx: RunContext) -> str:
            got = await ctx.request_info({"draft": doc}, response_type=str, request_id="req1")
            return f"Final: {got}"

        await review_wf.run("my doc")
        result = await review_wf.run(responses={"req1": "Looks great!"})
        assert result.get_outputs() == ["Final: Looks great!"]
        assert result.get_final_state() == WorkflowRunState.IDLE

    async def test_request_info_resume_rejects_response_type_mismatch(self):
        @built
        async def typed_wf(data: str, ctx: RunContext) -> str:
            answer = await ctx.request_info("number", response_type=int, request_id="typed")
            return f"{answer}:{type(answer).__name__}"

        await typed_wf.run("input")
        with pytest.raises(ValueError, match="Response type mismatch for request ID typed"):
            await typed_wf.run(responses={"typed": "not-an-int"})

    async def test_request_info_resume_coerces_json_like_response(self):
        @dataclass
        class Decision:
            approved: bool

        @built
        async def typed_wf(data: str, ctx: RunContext) -> str:
            decision = await ctx.request_info("d", response_type=Decision, request_id="decision")
            return f"{decision.approved}:{type(decision).__name__}"

        await typed_wf.run("input")
        result = await typed_wf.run(responses={"decision": {"approved": True}})
        assert result.get_outputs() == ["True:Decision"]

    async def test_fresh_message_while_pending_requests_warns(self, caplog):
        @built
        async def review_wf(doc: str, ctx: RunContext) -> str:
            return await ctx.request_info({"draft": doc}, response_type=str, request_id="req1")

        await review_wf.run("my doc")
        with caplog.at_level(logging.WARNING):
            await review_wf.run("another doc")
        assert "request_info event(s) are still pending" in caplog.text
        assert "a fresh message" in caplog.text

    async def test_responses_while_pending_requests_does_not_warn(self, caplog):
        @built
        async def review_wf(doc: str, ctx: RunContext) -> str:
            return await ctx.request_info({"draft": doc}, response_type=str, request_id="req1")

        await review_wf.run("my doc")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = await review_wf.run(responses={"req1": "Looks great!"})
        assert result.get_final_state() == WorkflowRunState.IDLE
        assert "still pending" not in caplog.text

    async def test_untyped_ctx_parameter(self):
        @built
        async def review_wf(doc: str, ctx) -> str:  # type: ignore[no-untyped-def]
            return "Final: " + await ctx.request_info(doc, response_type=str, request_id="req1")

        paused = await review_wf.run("my doc")
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        assert (await review_wf.run(responses={"req1": "LGTM"})).get_outputs() == ["Final: LGTM"]

    async def test_multiple_sequential_interrupts(self):
        @built
        async def multi_hitl(data: str, ctx: RunContext) -> str:
            r1 = await ctx.request_info("step1", response_type=str, request_id="r1")
            r2 = await ctx.request_info("step2", response_type=str, request_id="r2")
            return f"{r1}+{r2}"

        first = await multi_hitl.run("start")
        assert [e.request_id for e in first.get_request_info_events()] == ["r1"]
        second = await multi_hitl.run(responses={"r1": "A"})
        assert [e.request_id for e in second.get_request_info_events()] == ["r2"]
        third = await multi_hitl.run(responses={"r1": "A", "r2": "B"})
        assert third.get_outputs() == ["A+B"]

    async def test_request_info_auto_generates_id(self):
        @built
        async def auto_id_wf(x: int, ctx: RunContext) -> None:
            await ctx.request_info("need data", response_type=str)

        (event,) = (await auto_id_wf.run(1)).get_request_info_events()
        assert event.request_id


class TestErrorHandling:
    async def test_step_failure_propagates(self):
        @built
        async def failing_wf(x: int) -> None:
            await failing_step(x)

        with pytest.raises(ValueError, match="step failed with 42"):
            await failing_wf.run(42)

    async def test_step_failure_emits_executor_failed(self):
        @built
        async def failing_wf(x: int) -> None:
            await failing_step(x)

        events = await _read_until_raised(failing_wf.run(42, stream=True), ValueError)
        (failed,) = [e for e in events if e.type == "executor_failed"]
        assert failed.executor_id == "failing_step"

    async def test_workflow_failure_emits_failed_status(self):
        @built
        async def bad_wf(x: int) -> None:
            raise RuntimeError("workflow broke")

        events = await _read_until_raised(bad_wf.run(42, stream=True), RuntimeError)
        assert len([e for e in events if e.type == "failed"]) == 1
        assert WorkflowRunState.FAILED in [e.state for e in events if e.type == "status"]

    async def test_invalid_params_message_and_responses(self):
        @built
        async def wf(x: int) -> None:
            pass

        with pytest.raises(ValueError, match="Cannot provide both"):
            await wf.run("hello", responses={"r1": "val"})

    async def test_invalid_params_message_and_checkpoint(self):
        @built
        async def wf(x: int) -> None:
            pass

        with pytest.raises(ValueError, match="Cannot provide both"):
            await wf.run("hello", checkpoint_id="abc")

    async def test_invalid_params_nothing(self):
        @built
        async def wf(x: int) -> None:
            pass

        with pytest.raises(ValueError, match="Must provide at least one"):
            await wf.run()


async def _read_until_raised(stream: Any, error: type[BaseException]) -> list[WorkflowEvent]:
    """The events of ``stream``, read until it raises ``error`` (which it must)."""
    events: list[WorkflowEvent] = []

    async def read() -> None:
        async for event in stream:
            events.append(event)

    with pytest.raises(error):
        await read()
    return events


class TestStreaming:
    async def test_streaming_yields_events(self):
        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        kinds = {e.type async for e in pipeline.run(5, stream=True)}
        assert {"started", "executor_invoked", "executor_completed", "output"} <= kinds

    async def test_streaming_final_response(self):
        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        final = await pipeline.run(5, stream=True).get_final_response()
        assert isinstance(final, RunResult)
        assert final.get_outputs() == [6]

    async def test_streaming_context_reports_streaming(self):
        seen: list[bool] = []

        @built
        async def wf(x: int, ctx: RunContext) -> int:
            seen.append(ctx.is_streaming())
            return x

        await wf.run(1, stream=True).get_final_response()
        await wf.run(1)
        assert seen == [True, False]

    async def test_abandoned_stream_finalizes_without_event_loop_error(self):
        loop = asyncio.get_running_loop()
        errors: list[Any] = []
        previous = loop.get_exception_handler()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))

        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        try:
            stream = pipeline.run(5, stream=True)
            async for _event in stream:
                break
            del stream
            gc.collect()
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            loop.set_exception_handler(previous)
        assert errors == []
        assert (await pipeline.run(6)).get_outputs() == [7]

    async def test_started_event_origin_is_framework_after_origin_manager_closes(self):
        @built
        async def pipeline(x: int) -> int:
            return await add_one(x)

        stream = pipeline.run(5, stream=True)
        started = await anext(aiter(stream))
        assert (started.type, started.origin) == ("started", WorkflowEventSource.FRAMEWORK)
        await stream.get_final_response()


class TestStepPassthrough:
    async def test_step_works_outside_workflow(self):
        assert await add_one(10) == 11

    async def test_named_step_outside_workflow(self):
        assert await named_step(5) == 15

    def test_step_wrapper_name(self):
        assert (add_one.name, named_step.name) == ("add_one", "custom_name")

    def test_step_wrapper_is_step_wrapper(self):
        assert isinstance(add_one, StepWrapper)
        assert isinstance(named_step, StepWrapper)


class TestStateManagement:
    async def test_get_set_state(self):
        @built
        async def stateful_wf(x: int, ctx: RunContext) -> int:
            ctx.set_state("counter", x)
            return ctx.get_state("counter")

        assert (await stateful_wf.run(42)).get_outputs() == [42]

    async def test_get_state_default(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            return ctx.get_state("missing", "default_val")

        assert (await wf.run(1)).get_outputs() == ["default_val"]


class TestCheckpointing:
    async def test_checkpoint_hitl_resume(self):
        @built
        async def hitl_wf(doc: str, ctx: RunContext) -> str:
            got = await ctx.request_info({"draft": doc}, response_type=str, request_id="req1")
            return f"Done: {got}"

        paused = await hitl_wf.run("draft text")
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        checkpoint_id = hitl_wf.checkpoints()[0].checkpoint_id  # port: the log's checkpoints
        result = await hitl_wf.run(checkpoint_id=checkpoint_id, responses={"req1": "Approved!"})
        assert result.get_outputs() == ["Done: Approved!"]

    async def test_checkpoint_without_storage_raises(self):
        @built
        async def wf(x: int) -> int:
            return x

        with pytest.raises(ValueError, match="checkpoint_storage"):
            await wf.run(checkpoint_id="nonexistent")

    async def test_checkpoint_preserves_state(self):
        @built
        async def stateful_wf(x: int, ctx: RunContext) -> str:
            ctx.set_state("key", "value")
            got = await ctx.request_info("need info", response_type=str, request_id="r1")
            return f"{ctx.get_state('key')}:{got}"

        paused = await stateful_wf.run(1)
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        checkpoint_id = stateful_wf.checkpoints()[0].checkpoint_id  # port: the log's checkpoints
        result = await stateful_wf.run(checkpoint_id=checkpoint_id, responses={"r1": "hello"})
        assert result.get_outputs() == ["value:hello"]

    async def test_per_step_checkpoint_enables_crash_recovery(self):
        calls = {"step1": 0, "step2": 0}

        @step(replay_key=lambda x: str(x))
        async def slow_step1(x: int) -> int:
            calls["step1"] += 1
            return x + 10

        @step(replay_key=lambda x: str(x))
        async def crashing_step2(x: int) -> int:
            calls["step2"] += 1
            if calls["step2"] == 1:
                raise RuntimeError("simulated crash")
            return x * 2

        @built
        async def crash_wf(x: int) -> int:
            return await crashing_step2(await slow_step1(x))

        with pytest.raises(RuntimeError, match="simulated crash"):
            await crash_wf.run(5)
        assert calls == {"step1": 1, "step2": 1}
        result = await crash_wf.resume()  # port: resume() goes on from the log
        assert result.get_outputs() == [30]
        assert calls == {"step1": 1, "step2": 2}


class TestStepReplayIdentity:
    async def test_checkpoint_restore_preserves_concurrent_step_invocations(self):
        predecessor_started, release, a_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        @step(replay_key=lambda value: f"predecessor:{value}")
        async def predecessor(value: str) -> str:
            predecessor_started.set()
            await release.wait()
            return value

        @step(replay_key=lambda value: value)
        async def shared_step(value: str) -> str:
            calls.append(value)
            if value == "B":
                release.set()
                await a_done.wait()
            else:
                a_done.set()
            return f"result:{value}"

        async def branch_a() -> str:
            await predecessor("A")
            return await shared_step("A")

        async def branch_b() -> str:
            await predecessor_started.wait()
            return await shared_step("B")

        @built
        async def parallel_workflow(_: str, ctx: RunContext) -> list[str]:
            found = list(await asyncio.gather(branch_a(), branch_b()))
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(parallel_workflow, "input")
        assert replayed.get_outputs() == [["result:A", "result:B"]]
        assert calls == ["B", "A"]

    async def test_same_named_wrappers_keep_distinct_concurrent_identities(self):
        predecessor_started, release, read_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        @step(replay_key=lambda value: f"predecessor:{value}")
        async def predecessor(value: str) -> str:
            predecessor_started.set()
            await release.wait()
            return value

        @step(name="authorization", replay_key=lambda value: f"read:{value}")
        async def read_check(value: str) -> str:
            calls.append("read")
            read_done.set()
            return f"read:{value}"

        @step(name="authorization", replay_key=lambda value: f"delete:{value}")
        async def delete_check(value: str) -> str:
            calls.append("delete")
            release.set()
            await read_done.wait()
            return f"delete:{value}"

        async def branch_a() -> str:
            await predecessor("same")
            return await read_check("same")

        async def branch_b() -> str:
            await predecessor_started.wait()
            return await delete_check("same")

        @built
        async def wf(_: str, ctx: RunContext) -> list[str]:
            found = list(await asyncio.gather(branch_a(), branch_b()))
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "input")
        assert replayed.get_outputs() == [["read:same", "delete:same"]]
        assert calls == ["delete", "read"]

    async def test_factory_generated_wrappers_use_canonical_default_identity(self):
        calls: list[str] = []

        def make_step(label: str) -> StepWrapper[str]:
            async def generated(value: str, label: str = label) -> str:
                calls.append(label)
                return f"{label}:{value}"

            return step(name="generated")(generated)

        first, second = make_step("first"), make_step("second")

        @built
        async def wf(value: str, ctx: RunContext) -> list[str]:
            found = list(await asyncio.gather(first(value), second(value)))
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "input")
        assert replayed.get_outputs() == [["first:input", "second:input"]]
        assert calls == ["first", "second"]

    async def test_factory_generated_wrappers_with_opaque_state_replay_with_explicit_keys(self):
        @dataclass
        class Token:
            label: str

        calls: list[str] = []

        def make_step(token: Token) -> StepWrapper[str]:
            async def generated(value: str) -> str:
                calls.append(token.label)
                return f"{token.label}:{value}"

            return step(name="generated", replay_key=lambda _value: token.label)(generated)

        first, second = make_step(Token("first")), make_step(Token("second"))

        @built
        async def wf(value: str, ctx: RunContext) -> list[str]:
            found = list(await asyncio.gather(first(value), second(value)))
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "input")
        assert replayed.get_outputs() == [["first:input", "second:input"]]
        assert calls == ["first", "second"]

    async def test_identical_generated_wrappers_do_not_cross_workflows(self):
        calls: list[str] = []

        def make_step() -> StepWrapper[str]:
            async def generated(value: str) -> str:
                calls.append(value)
                return value

            return step(name="generated")(generated)

        first, second = make_step(), make_step()

        @built(name="first_wf")
        async def first_wf(value: str, ctx: RunContext) -> str:
            found = await first(value)
            await again(ctx)  # port: replay after an answer
            return found

        @built(name="second_wf")
        async def second_wf(value: str, ctx: RunContext) -> str:
            found = await second(value)
            await again(ctx)  # port: replay after an answer
            return found

        _, first_replayed = await replay(first_wf, "first")
        _, second_replayed = await replay(second_wf, "second")
        assert first_replayed.get_outputs() == ["first"]
        assert second_replayed.get_outputs() == ["second"]
        assert calls == ["first", "second"]

    async def test_cyclic_arguments_use_sequential_fallback(self):
        calls: list[int] = []

        @step
        async def count_items(items: list[Any]) -> int:
            calls.append(len(items))
            return len(items)

        @built
        async def wf(_: str) -> int:
            cyclic: list[Any] = []  # port: made inside, since the log cannot hold it as input
            cyclic.append(cyclic)
            return await count_items(cyclic)

        assert (await wf.run("input")).get_outputs() == [1]
        assert calls == [1]

    async def test_cyclic_concurrent_arguments_require_replay_key(self):
        calls: list[int] = []

        @step
        async def count_items(items: list[Any]) -> int:
            calls.append(len(items))
            return len(items)

        @built
        async def wf(_: str) -> int:
            cyclic: list[Any] = []  # port: made inside, since the log cannot hold it as input
            cyclic.append(cyclic)
            return (await asyncio.gather(count_items(cyclic)))[0]

        with pytest.raises(ValueError, match="replay_key"):
            await wf.run("input")
        assert calls == []

    async def test_mutated_workflow_input_keeps_original_replay_identity(self):
        @step
        async def mutate(items: list[str]) -> list[str]:
            items.append("mutated")
            return items

        @built
        async def wf(items: list[str], ctx: RunContext) -> list[str]:
            found = await mutate(items)
            await again(ctx)  # port: replay after an answer
            return found

        message = ["original"]
        _, replayed = await replay(wf, message)
        assert message == ["original", "mutated"]
        assert replayed.get_outputs() == [["original", "mutated"]]
        assert len([e for e in replayed if e.type == "executor_bypassed"]) == 1

    async def test_repeated_automatic_identity_uses_occurrences(self):
        @step
        async def echo(value: str) -> str:
            return value

        @built
        async def wf(value: str, ctx: RunContext) -> list[str]:
            found = [await echo(value), await echo(value)]
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "same")
        assert replayed.get_outputs() == [["same", "same"]]
        assert len([e for e in replayed if e.type == "executor_bypassed"]) == 2

    async def test_automatic_identity_normalizes_bound_arguments(self):
        @step
        async def combine(first: int, second: int = 2) -> int:
            return first + second

        @built
        async def wf(_: str) -> list[int]:
            return [await combine(1), await combine(first=1, second=2)]

        await wf.run("x")
        # port: AF compares its private identities; the log records each call's digest
        digests = [e.digest for e in wf.events() if e.type == "step_recorded"]
        assert len(digests) == 2
        assert digests[0] == digests[1]

    async def test_automatic_identity_ignores_explicit_context_keyword(self):
        @step
        async def use_context(value: str, ctx: RunContext) -> str:
            return f"{value}:{ctx.get_state('marker')}"

        @built
        async def wf(value: str, ctx: RunContext) -> str:
            ctx.set_state("marker", "ok")
            found = await use_context(value, ctx=ctx)
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "input")
        assert replayed.get_outputs() == ["input:ok"]
        assert len([e for e in replayed if e.type == "executor_bypassed"]) == 1

    async def test_concurrent_opaque_arguments_require_replay_key(self):
        calls: list[str] = []

        @step
        async def use_lock(lock: Any, value: str) -> str:
            calls.append(value)
            return value

        @built
        async def wf(_: str) -> list[str]:
            locks = threading.Lock(), threading.Lock()
            return list(await asyncio.gather(use_lock(locks[0], "A"), use_lock(locks[1], "B")))

        with pytest.raises(ValueError, match="replay_key"):
            await wf.run("input")
        assert calls == []

    async def test_explicit_replay_key_supports_opaque_concurrent_arguments(self):
        calls: list[str] = []

        @step(replay_key=lambda _lock, value: value)
        async def use_lock(lock: Any, value: str) -> str:
            calls.append(value)
            return value

        @built
        async def wf(_: str, ctx: RunContext) -> list[str]:
            locks = threading.Lock(), threading.Lock()
            found = list(await asyncio.gather(use_lock(locks[0], "A"), use_lock(locks[1], "B")))
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, "input")
        assert replayed.get_outputs() == [["A", "B"]]
        assert calls == ["A", "B"]

    async def test_explicit_replay_key_must_be_non_empty(self):
        @step(replay_key=lambda _value: "")
        async def invalid_key(value: str) -> str:
            return value

        @built
        async def wf(value: str) -> str:
            return await invalid_key(value)

        with pytest.raises(ValueError, match="non-empty string"):
            await wf.run("input")

    async def test_explicit_replay_key_must_be_unique_per_run(self):
        @step(replay_key=lambda _value: "duplicate")
        async def duplicated(value: str) -> str:
            return value

        @built
        async def wf(value: str) -> list[str]:
            return [await duplicated(value), await duplicated(value)]

        with pytest.raises(ValueError, match="duplicate replay_key"):
            await wf.run("input")

    async def test_mutable_step_result_isolated_across_response_replay(self):
        calls: list[str] = []

        @step
        async def create_items() -> list[str]:
            calls.append("create")
            return []

        @built
        async def wf(_: str, ctx: RunContext) -> list[str]:
            items = await create_items()
            items.append("after")
            await ctx.request_info("continue", response_type=str, request_id="continue")
            return items

        paused = await wf.run("input")
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        resumed = await wf.run(responses={"continue": "yes"})
        assert resumed.get_outputs() == [["after"]]
        assert calls == ["create"]

    async def test_completed_event_isolated_from_mutable_result(self):
        @step
        async def create_items() -> list[str]:
            return []

        @built
        async def wf(_: str) -> list[str]:
            items = await create_items()
            items.append("after")
            return items

        result = await wf.run("input")
        (completed,) = [e for e in result if e.type == "executor_completed"]
        assert result.get_outputs() == [["after"]]
        assert completed.data == []

    async def test_task_tracking_preserves_existing_loop_factory(self):
        loop = asyncio.get_running_loop()
        original = loop.get_task_factory()
        created: list[asyncio.Future[Any]] = []

        def custom_factory(task_loop: Any, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
            task = asyncio.Task(coro, loop=task_loop, **kwargs)
            created.append(task)
            return task

        loop.set_task_factory(custom_factory)
        try:

            @step
            async def compute(value: int) -> int:
                return value + 1

            @built
            async def wf(value: int) -> int:
                return (await asyncio.gather(compute(value)))[0]

            assert (await wf.run(1)).get_outputs() == [2]
            assert created
            assert loop.get_task_factory() is custom_factory
        finally:
            loop.set_task_factory(original)


class TestControlFlow:
    async def test_if_else_branching(self):
        @dataclass
        class Classification:
            is_spam: bool

        @step
        async def classify(text: str) -> Classification:
            return Classification(is_spam="spam" in text.lower())

        @step
        async def process_normal(text: str) -> str:
            return f"processed: {text}"

        @step
        async def quarantine(text: str) -> str:
            return f"quarantined: {text}"

        @built
        async def email_pipeline(email: str) -> str:
            if (await classify(email)).is_spam:
                return await quarantine(email)
            return await process_normal(email)

        spam = await email_pipeline.run("Buy spam now!")
        assert spam.get_outputs() == ["quarantined: Buy spam now!"]
        normal = await email_pipeline.run("Hello friend")
        assert normal.get_outputs() == ["processed: Hello friend"]


class TestNestedWorkflows:
    async def test_nested_workflow_as_task(self):
        @step
        async def step_a(x: int) -> int:
            return x + 1

        @built
        async def inner_wf(x: int) -> int:
            return await step_a(x)

        @step
        async def call_inner(x: int) -> int:
            return (await inner_wf.run(x)).get_outputs()[0]

        @built
        async def outer_wf(x: int) -> int:
            return await call_inner(x)

        assert (await outer_wf.run(5)).get_outputs() == [6]


class TestConcurrencyGuard:
    async def test_concurrent_run_raises(self):
        @built
        async def slow_wf(x: int) -> int:
            await asyncio.sleep(0.01)
            return x

        stream = slow_wf.run(1, stream=True)
        with pytest.raises(RuntimeError, match="already running"):
            slow_wf.run(2, stream=True)
        await stream.get_final_response()

    async def test_run_after_completion(self):
        @built
        async def wf(x: int) -> int:
            return x

        assert (await wf.run(1)).get_outputs() == [1]
        assert (await wf.run(2)).get_outputs() == [2]


class TestDecoratorForms:
    def test_step_bare_decorator(self):
        @step
        async def my_step(x: int) -> int:
            return x

        assert isinstance(my_step, StepWrapper)
        assert my_step.name == "my_step"

    def test_step_with_name(self):
        @step(name="renamed")
        async def my_step(x: int) -> int:
            return x

        assert isinstance(my_step, StepWrapper)
        assert my_step.name == "renamed"

    def test_workflow_bare_decorator(self):
        @workflow
        async def my_wf(x: int) -> None:
            pass

        assert isinstance(my_wf, FunctionalWorkflowDefinition)
        assert my_wf.name == "my_wf"

    def test_workflow_with_params(self):
        @workflow(name="custom", description="desc")
        async def my_wf(x: int) -> None:
            pass

        assert isinstance(my_wf, FunctionalWorkflowDefinition)
        assert (my_wf.name, my_wf.description) == ("custom", "desc")


class TestIncludeStatusEvents:
    async def test_status_events_excluded_by_default(self):
        @built
        async def wf(x: int) -> int:
            return x

        assert [e for e in await wf.run(1) if e.type == "status"] == []

    async def test_status_events_included_when_requested(self):
        @built
        async def wf(x: int) -> int:
            return x

        result = await wf.run(1, include_status_events=True)
        assert [e for e in result if e.type == "status"]


class TestEdgeCases:
    async def test_workflow_with_no_tasks(self):
        @built
        async def no_tasks(x: int) -> int:
            return x * 2

        assert (await no_tasks.run(5)).get_outputs() == [10]

    async def test_workflow_with_no_output(self):
        @built
        async def silent_wf(x: int) -> None:
            pass

        assert (await silent_wf.run(5)).get_outputs() == []

    async def test_return_value_auto_yields_output(self):
        @built
        async def wf(x: int) -> int:
            return x * 3

        assert (await wf.run(5)).get_outputs() == [15]

    async def test_step_called_multiple_times(self):
        @built
        async def wf(x: int) -> int:
            return await add_one(await add_one(await add_one(x)))

        result = await wf.run(0)
        assert result.get_outputs() == [3]
        kinds = [e.type for e in result]
        assert kinds.count("executor_invoked") == kinds.count("executor_completed") == 3


class TestRecoveryAfterErrors:
    async def test_run_after_failure_is_allowed(self):
        @built
        async def wf(x: int) -> int:
            if x == 1:
                raise RuntimeError("boom")
            return x

        with pytest.raises(RuntimeError, match="boom"):
            await wf.run(1)
        assert (await wf.run(2)).get_outputs() == [2]

    async def test_step_sync_function_raises(self):
        with pytest.raises(TypeError, match="async functions"):

            @step  # type: ignore[arg-type]
            def not_async(x: int) -> int:
                return x


class TestWorkflowInterruptedIsBaseException:
    async def test_except_exception_does_not_catch_interrupt(self):
        caught: list[bool] = []

        @built
        async def wf(x: str, ctx: RunContext) -> str:
            try:
                return await ctx.request_info("need review", response_type=str, request_id="r1")
            except Exception:
                caught.append(True)
                return "caught!"

        result = await wf.run("data")
        assert result.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        assert result.get_outputs() == []
        assert caught == []


class TestExecutorBypassed:
    async def test_cached_step_emits_bypassed_event(self):
        calls: list[int] = []

        @step(replay_key=lambda x: str(x))
        async def tracked(x: int) -> int:
            calls.append(x)
            return x + 1

        @built
        async def wf(x: int, ctx: RunContext) -> int:
            found = await tracked(x)
            await again(ctx)  # port: replay after an answer
            return found

        first, replayed = await replay(wf, 5)
        assert calls == [5]
        assert {"executor_invoked", "executor_completed"} <= {e.type for e in first}
        assert "executor_bypassed" not in {e.type for e in first}
        kinds = {e.type for e in replayed}
        assert "executor_bypassed" in kinds
        assert not kinds & {"executor_invoked", "executor_completed"}
        assert replayed.get_outputs() == [6]

    async def test_bypassed_event_carries_cached_data(self):
        @step
        async def compute(x: int) -> int:
            return x * 10

        @built
        async def wf(x: int, ctx: RunContext) -> int:
            found = await compute(x)
            await again(ctx)  # port: replay after an answer
            return found

        _, replayed = await replay(wf, 3)
        (bypassed,) = [e for e in replayed if e.type == "executor_bypassed"]
        assert (bypassed.executor_id, bypassed.data) == ("compute", 30)


class TestRequestInfoInStep:
    async def test_step_with_run_context_injection(self):
        @step
        async def review_step(doc: str, ctx: RunContext) -> str:
            got = await ctx.request_info({"draft": doc}, response_type=str, request_id="s1")
            return f"reviewed: {got}"

        @built
        async def wf(doc: str) -> str:
            return await review_step(doc)

        paused = await wf.run("my doc")
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        assert [e.request_id for e in paused.get_request_info_events()] == ["s1"]
        assert (await wf.run(responses={"s1": "LGTM"})).get_outputs() == ["reviewed: LGTM"]

    async def test_step_works_outside_workflow_with_explicit_ctx(self):
        @step
        async def needs_ctx(data: str, ctx: RunContext) -> str:
            return f"{data}:{ctx.get_state('key', 'default')}"

        ctx = RunContext("test")
        ctx.set_state("key", "hello")
        assert await needs_ctx("data", ctx) == "data:hello"

    async def test_step_injects_ctx_before_user_positional_parameters(self):
        @step
        async def needs_ctx_first(ctx: RunContext, data: str) -> str:
            ctx.set_state("seen", data)
            return f"{data}:{ctx.get_state('seen')}"

        @built
        async def wf(data: str) -> str:
            return await needs_ctx_first(data)

        assert (await wf.run("draft")).get_outputs() == ["draft:draft"]

    async def test_get_run_context_inside_workflow(self):
        captured: list[Any] = []

        @step
        async def capture_ctx(x: int) -> int:
            captured.append(get_run_context())
            return x

        @built
        async def wf(x: int) -> int:
            return await capture_ctx(x)

        await wf.run(1)
        assert isinstance(captured[0], RunContext)

    async def test_get_run_context_outside_workflow(self):
        assert get_run_context() is None


@contextmanager
def warnings_of(name: str) -> Iterator[list[str]]:
    """The warnings logged on logger ``name`` while inside."""
    found: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record.getMessage())

    target, handler = logging.getLogger(name), Collect(logging.WARNING)
    target.addHandler(handler)
    try:
        yield found
    finally:
        target.removeHandler(handler)


class TestNoneResponseHandling:
    async def test_none_response_logs_warning(self):
        @built
        async def wf(doc: str, ctx: RunContext) -> str:
            return f"got: {await ctx.request_info('q', response_type=str, request_id='r1')}"

        await wf.run("start")
        with warnings_of(FUNCTIONAL_LOGGER) as logged:
            result = await wf.run(responses={"r1": None})
        assert result.get_outputs() == ["got: None"]
        assert any("None" in line and "r1" in line for line in logged)

    async def test_none_response_is_returned(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            return f"value={await ctx.request_info('q', response_type=str, request_id='r1')}"

        await wf.run(1)
        assert (await wf.run(responses={"r1": None})).get_outputs() == ["value=None"]


class TestHITLInStepWithCaching:
    async def test_response_only_resume_restores_state_from_cached_step(self):
        seeds: list[str] = []

        @step(replay_key=lambda: "seed")
        async def seed_state(ctx: RunContext) -> str:
            seeds.append("seed")
            ctx.set_state("marker", "ok")
            return "seeded"

        @built
        async def wf(data: str, ctx: RunContext) -> str:
            value = await seed_state()
            answer = await ctx.request_info("question", response_type=str, request_id="r1")
            return f"{ctx.get_state('marker', 'MISSING')}:{value}:{answer}"

        await wf.run("input")
        result = await wf.run(responses={"r1": "ok"})
        assert seeds == ["seed"]
        assert result.get_outputs() == ["ok:seeded:ok"]

    async def test_preceding_step_bypassed_on_hitl_resume(self):
        calls: list[int] = []

        @step(replay_key=lambda x: str(x))
        async def step_a(x: int) -> int:
            calls.append(x)
            return x + 1

        @step
        async def step_b(val: int, ctx: RunContext) -> str:
            got = await ctx.request_info({"val": val}, response_type=str, request_id="r1")
            return f"{val}:{got}"

        @built
        async def wf(x: int) -> str:
            return await step_b(await step_a(x))

        await wf.run(5)
        result = await wf.run(responses={"r1": "ok"})
        assert calls == [5]
        assert result.get_outputs() == ["6:ok"]
        assert "executor_bypassed" in [e.type for e in result]

    async def test_hitl_step_with_checkpoint_full_lifecycle(self):
        @step
        async def compute(x: int) -> int:
            return x * 10

        @step
        async def review(val: int, ctx: RunContext) -> str:
            got = await ctx.request_info({"val": val}, response_type=str, request_id="rev")
            return f"reviewed({val}):{got}"

        @built
        async def wf(x: int, ctx: RunContext) -> str:
            found = await review(await compute(x))
            await again(ctx)  # port: replay after an answer, not from the final checkpoint
            return found

        paused = await wf.run(3)
        assert paused.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        await wf.run(responses={"rev": "LGTM"})  # port: the output comes after the replay
        replayed = await wf.run(responses={"again": "yes"})
        assert replayed.get_outputs() == ["reviewed(30):LGTM"]
        kinds = [e.type for e in replayed]
        assert kinds.count("executor_bypassed") == 2
        assert "executor_invoked" not in kinds

    async def test_none_response_in_step_request_info(self):
        @step
        async def needs_feedback(doc: str, ctx: RunContext) -> str:
            got = await ctx.request_info({"doc": doc}, response_type=str, request_id="r1")
            return f"got:{got}"

        @built
        async def wf(doc: str) -> str:
            return await needs_feedback(doc)

        await wf.run("draft")
        with warnings_of(FUNCTIONAL_LOGGER) as logged:
            result = await wf.run(responses={"r1": None})
        assert result.get_outputs() == ["got:None"]
        assert any("None" in line and "r1" in line for line in logged)

    async def test_step_hitl_does_not_emit_executor_failed(self):
        @step
        async def hitl_step(x: int, ctx: RunContext) -> str:
            return await ctx.request_info("need data", response_type=str, request_id="r1")

        @built
        async def wf(x: int) -> str:
            return await hitl_step(x)

        result = await wf.run(1)
        assert "executor_failed" not in [e.type for e in result]
        assert result.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


class TestDeterministicAutoRequestId:
    async def test_auto_request_id_roundtrips_on_resume(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            return f"got:{await ctx.request_info('need data', response_type=str)}"

        (request,) = (await wf.run(1)).get_request_info_events()
        result = await wf.run(responses={request.request_id: "hello"})
        assert result.get_final_state() == WorkflowRunState.IDLE
        assert result.get_outputs() == ["got:hello"]

    async def test_multiple_auto_ids_are_distinct_and_stable(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            a = await ctx.request_info("first", response_type=str)
            b = await ctx.request_info("second", response_type=str)
            return f"{a}/{b}"

        rid1 = (await wf.run(1)).get_request_info_events()[0].request_id
        rid2 = (await wf.run(responses={rid1: "A"})).get_request_info_events()[0].request_id
        assert rid1 != rid2
        assert (await wf.run(responses={rid1: "A", rid2: "B"})).get_outputs() == ["A/B"]

    async def test_cached_step_advances_auto_request_id_counter(self):
        calls: list[int] = []

        @step(replay_key=lambda value: str(value))
        async def first_review(value: int, ctx: RunContext) -> str:
            calls.append(value)
            return await ctx.request_info({"step": "first"}, response_type=str)

        @step
        async def second_review(value: int, ctx: RunContext) -> str:
            return await ctx.request_info({"step": "second"}, response_type=str)

        @built
        async def wf(value: int) -> str:
            return f"{await first_review(value)}/{await second_review(value)}"

        first_id = (await wf.run(1)).get_request_info_events()[0].request_id
        assert first_id == "auto::0"
        second = await wf.run(responses={first_id: "A"})
        second_id = second.get_request_info_events()[0].request_id
        assert second_id == "auto::1"
        ran = len(calls)
        final = await wf.run(responses={first_id: "A", second_id: "B"})
        assert len(calls) == ran
        assert final.get_outputs() == ["A/B"]


class TestPendingRequestsPruned:
    async def test_final_checkpoint_no_longer_claims_resolved_requests_pending(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            a = await ctx.request_info("q1", response_type=str, request_id="r1")
            b = await ctx.request_info("q2", response_type=str, request_id="r2")
            return f"{a}/{b}"

        await wf.run(1)
        await wf.run(responses={"r1": "A"})
        result = await wf.run(responses={"r1": "A", "r2": "B"})
        assert result.get_final_state() == WorkflowRunState.IDLE
        # port: the latest checkpoint's pending requests are the instance's
        assert wf.checkpoints()[-1].status == "completed"
        assert wf.pending_requests() == []


class TestArityValidation:
    def test_multi_non_ctx_param_rejected_at_decoration(self):
        with pytest.raises(ValueError, match="multiple non-RunContext parameters"):

            @workflow
            async def wf(a: str, b: str, ctx: RunContext) -> str:
                return f"{a}+{b}"

    async def test_ctx_only_workflow_with_message_raises_clear_error(self):
        @built
        async def wf(ctx: RunContext) -> str:
            return "no message used"

        with pytest.raises(ValueError, match="no non-RunContext parameter"):
            await wf.run("important input")

    def test_ctx_only_workflow_decoration_succeeds(self):
        @built
        async def wf(ctx: RunContext) -> str:
            return "ok"

        assert wf is not None


class TestStaleResponsesRejected:
    async def test_responses_after_clean_completion_raise(self):
        @built
        async def wf(x: int) -> int:
            return x * 2

        await wf.run(5)
        with pytest.raises(ValueError, match="no pending request_info"):
            await wf.run(responses={"stale": "x"})

    async def test_responses_mismatched_key_raises(self):
        @built
        async def wf(x: int, ctx: RunContext) -> str:
            return await ctx.request_info("q", response_type=str, request_id="r1")

        await wf.run(1)
        with pytest.raises(ValueError, match="do not answer"):
            await wf.run(responses={"definitely_not_r1": "x"})


class TestReservedStateKeys:
    async def test_underscore_key_rejected(self):
        @built
        async def wf(x: int, ctx: RunContext) -> int:
            ctx.set_state("_private", "user value")
            return x

        with pytest.raises(ValueError, match="reserved for framework"):
            await wf.run(1)

    async def test_normal_key_still_works(self):
        @built
        async def wf(x: int, ctx: RunContext) -> int:
            ctx.set_state("normal_key", "v")
            assert ctx.get_state("normal_key") == "v"
            return x

        assert (await wf.run(1)).get_outputs() == [1]


class TestDeepcopyOnCacheHit:
    async def test_step_with_non_deepcopyable_arg_replays(self):
        @step
        async def takes_lock(lock: Any, n: int) -> int:
            return n + 1

        @built
        async def wf(x: int) -> int:
            return await takes_lock(threading.Lock(), x)

        assert (await wf.run(5)).get_outputs() == [6]


class TestRunDocstringAllowsResponsesAndCheckpoint:
    def test_docstring_says_at_least_one(self):
        doc = FunctionalWorkflow.run.__doc__ or ""
        assert "at least one" in doc.lower()
        assert "Exactly one" not in doc


# -- steplog's side of the differences docs/porting.md lists -----------------------------------


async def test_a_step_result_must_be_storable():
    """AF: ``test_non_deepcopyable_result_succeeds_without_replay`` returns a lock; steplog
    records every step's result, so a result the log cannot hold fails its step."""

    @step
    async def create_lock() -> Any:
        return threading.Lock()

    @built
    async def wf(_: str) -> Any:
        return await create_lock()

    with pytest.raises(EncodingError):
        await wf.run("input")


async def test_a_step_keyed_by_its_arguments_ignores_the_state_its_function_closes_over():
    """AF: ``test_factory_generated_wrappers_with_opaque_state_require_replay_key`` refuses
    two steps whose functions close over opaque state; steplog's identity is the step's name and
    arguments (or ``replay_key``), so the two calls are occurrences 0 and 1 of one identity."""

    def make_step(label: str) -> StepWrapper[str]:
        async def generated(value: str) -> str:
            return f"{label}:{value}"

        return step(name="generated")(generated)

    first, second = make_step("first"), make_step("second")

    @built
    async def wf(value: str) -> list[str]:
        return list(await asyncio.gather(first(value), second(value)))

    assert (await wf.run("input")).get_outputs() == [["first:input", "second:input"]]


def test_checkpoint_storage_is_refused_at_build():
    """AF's ``build(checkpoint_storage=...)`` (``test_build_accepts_tenant_scoped_checkpoint
    _storage``): the log is the checkpoint storage."""

    @workflow
    async def review_wf(doc: str) -> str:
        return doc

    with pytest.raises(DefinitionError, match="checkpoint_storage"):
        review_wf.build(checkpoint_storage=object())
