"""AgentExecutor: a turn's model calls and tool calls are recorded steps, and the conversation is
state, so a turn killed half way resumes without paying or doing anything twice.

The agent is ``fakes.trip_agent``: a planned model (no network) asks for three tools in turn
(``search_flights``, ``hold_seat``, ``send_email``), one per model call, then answers: four model
calls and three tool calls a turn, each counted in files. A turn is interrupted in this process by
cancelling its run (after tool 2 is recorded, or inside it), and in a real process killed with
SIGKILL (``agent_worker``) on SQLite and PostgreSQL, then resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agent_framework", reason="the agents extra (agent-framework-core) is needed")

from agent_framework import (
    Agent,
    AgentResponse,
    AgentResponseUpdate,
    AgentRunInputs,
    AgentSession,
    BaseAgent,
    Message,
    MiddlewareFailure,
    ResponseStream,
    tool,
)

from kernel import (
    DefinitionError,
    EventStore,
    RunHooks,
    StepInfo,
    StepRecorded,
    SuperstepInfo,
    Workflow,
    WorkflowBuilder,
    open_store,
)
from kernel.agents import (
    AgentExecutor,
    AgentExecutorRequest,
    AgentExecutorResponse,
    prompt_options,
    usage_counts,
)
from tests.agents import agent_worker
from tests.agents.fakes import FINAL, Counts, PlannedChatClient, trip_agent

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("search_flights", "hold_seat", "send_email")
TURN = agent_worker.TURN


def calls(counts: Counts) -> dict[str, int]:
    return {name: counts[name] for name in ("model", *TOOLS)}


def steps(wf: Workflow) -> list[StepRecorded]:
    return [e for e in wf.events() if isinstance(e, StepRecorded)]


def prompt(counts: Counts, index: int = -1) -> list[list[str]]:
    """The roles and texts of a model call's prompt (the last one by default)."""
    loaded: list[list[str]] = json.loads(counts.notes("prompts")[index])
    return loaded


@pytest.fixture
def counts(tmp_path: Path) -> Counts:
    return Counts(tmp_path / "counts")


def trip(store: EventStore, counts: Counts, **kwargs: Any) -> Workflow:
    """The trip agent's workflow on ``store``: a new agent, executor and workflow each time."""
    hooks = kwargs.pop("hooks", ())
    agent = trip_agent(counts, kwargs.pop("on_hold", None))
    executor = AgentExecutor(agent, **kwargs)
    builder = WorkflowBuilder(start_executor=executor, store=store, instance_id="trip")
    return builder.with_hooks(*hooks).build() if hooks else builder.build()


class CancelAfter(RunHooks):
    """Cancels the run's task once a call of ``name`` is recorded (not served)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.task: asyncio.Future[Any] | None = None

    def step_finished(self, step: SuperstepInfo, call: StepInfo) -> None:
        if call.name == self.name and not call.reused and self.task is not None:
            self.task.cancel()
            self.task = None


async def cancelled(run: Awaitable[Any], hooks: CancelAfter | None = None) -> None:
    task = asyncio.ensure_future(run)
    if hooks is not None:
        hooks.task = task
    with pytest.raises(asyncio.CancelledError):
        await task


# -- one turn ----------------------------------------------------------------------------------


async def test_a_turn_records_each_model_call_and_tool_call_with_its_token_usage(
    store: EventStore, counts: Counts
) -> None:
    wf = trip(store, counts)
    result = await wf.run(TURN)
    (output,) = result.get_outputs()
    assert isinstance(output, AgentResponse)
    assert output.text == FINAL
    assert calls(counts) == {"model": 4, "search_flights": 1, "hold_seat": 1, "send_email": 1}
    recorded = steps(wf)
    assert [s.name for s in recorded] == [
        "model_call", "search_flights", "model_call", "hold_seat", "model_call", "send_email",
        "model_call",
    ]  # fmt: skip
    assert {s.executor_id for s in recorded} == {"travel"}
    assert all(s.error is None and s.reused is None for s in recorded)
    models = [s for s in recorded if s.name == "model_call"]
    assert [s.usage for s in models] == [
        {"input_tokens": n, "output_tokens": 7, "total_tokens": n + 7} for n in (110, 130, 150, 170)
    ]
    assert [s.result["messages"][0]["contents"][0]["name"] for s in models[:3]] == list(TOOLS)
    (hold,) = [s for s in recorded if s.name == "hold_seat"]
    (key,) = counts.notes("hold_seat")
    assert hold.step_key == key
    assert hold.result["contents"][0]["text"] == f"hold {key[:8]} on TP123"


async def test_a_model_call_records_its_prompt_and_a_tool_call_its_arguments(
    store: EventStore, counts: Counts
) -> None:
    wf = trip(store, counts)
    await wf.run(TURN)
    recorded = steps(wf)
    models = [s for s in recorded if s.name == "model_call"]
    sent = [s.arguments["messages"] for s in models if s.arguments is not None]
    assert len(sent) == 4
    # The messages as the codec stores AF's Message (a tagged object): what the model was sent.
    said = [[(m["v"]["role"], Message.from_dict(m["v"]).text) for m in prompt] for prompt in sent]
    assert said[0] == [("user", TURN)]
    assert [[role for role, _ in p] for p in said] == [
        ["user"], ["user", "assistant", "tool"], ["user", *["assistant", "tool"] * 2],
        ["user", *["assistant", "tool"] * 3],
    ]  # fmt: skip
    assert [[text for _, text in p] for p in said[1:]] == [
        [t for _, t in json.loads(line)] for line in counts.notes("prompts")[1:]
    ]  # what the fake model noted it was given
    options = models[0].arguments["options"]
    assert options["tools"] == list(TOOLS)  # the tools by name, not as objects
    assert options["instructions"] == "Book the trip."
    tools = {s.name: s.arguments for s in recorded if s.name in TOOLS}
    assert tools == {
        "search_flights": {"call_id": "call-1", "arguments": '{"to":"Lisbon"}'},
        "hold_seat": {"call_id": "call-2", "arguments": '{"flight":"TP123"}'},
        "send_email": {
            "call_id": "call-3",
            "arguments": '{"body":"Your seat on TP123 is held.","to":"ana@example.com"}',
        },
    }


def test_prompt_options_show_every_option_as_json() -> None:
    class Schema:
        pass

    shown = prompt_options(
        {"temperature": 0.2, "tools": [{"name": "a"}, Schema], "response_format": Schema,
         "seed": None, "metadata": {"k": ["v", 1]}, "odd": Schema()}
    )  # fmt: skip
    assert shown == {
        "temperature": 0.2, "tools": ["a", "Schema"], "response_format": "Schema", "seed": None,
        "metadata": {"k": ["v", 1]}, "odd": "<Schema>",
    }  # fmt: skip


async def test_the_conversation_is_state_and_the_next_turn_starts_from_it(
    store: EventStore, counts: Counts
) -> None:
    wf = trip(store, counts)
    await wf.run(TURN)
    conversation = wf.committed_state()["agent:travel"]
    assert [m.role for m in conversation["full_conversation"]] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert conversation["cache"] == []
    # Anew: another agent object, another executor, another workflow object.
    again = trip(store, counts)
    await again.run("And a hotel?")
    assert prompt(counts)[0] == ["user", TURN]
    assert prompt(counts)[-2:] == [["assistant", FINAL], ["user", "And a hotel?"]]


async def test_a_failed_turn_leaves_no_trace_in_the_conversation(
    store: EventStore, counts: Counts
) -> None:
    async def refuse() -> None:
        raise MiddlewareFailure("the seat service is down")

    wf = trip(store, counts, on_hold=refuse)
    with pytest.raises(MiddlewareFailure):
        await wf.run(TURN)
    assert wf.committed_state() == {}
    again = trip(store, counts)
    await again.run("Just Lisbon, please.")
    assert prompt(counts)[0] == ["user", "Just Lisbon, please."]  # the failed turn is not there


# -- a turn interrupted in this process --------------------------------------------------------


async def test_a_turn_cancelled_after_tool_2_resumes_with_tools_1_and_2_served(
    store: EventStore, counts: Counts
) -> None:
    hooks = CancelAfter("hold_seat")
    wf = trip(store, counts, hooks=[hooks])
    await cancelled(wf.run(TURN), hooks)
    assert calls(counts) == {"model": 2, "search_flights": 1, "hold_seat": 1, "send_email": 0}
    result = await wf.resume()
    assert [o.text for o in result.get_outputs()] == [FINAL]
    assert calls(counts) == {"model": 4, "search_flights": 1, "hold_seat": 1, "send_email": 1}
    resumed = steps(wf)[4:]
    assert [(s.name, s.reused is not None) for s in resumed] == [
        ("model_call", True), ("search_flights", True), ("model_call", True), ("hold_seat", True),
        ("model_call", False), ("send_email", False), ("model_call", False),
    ]  # fmt: skip
    assert [s.reused for s in resumed[:4]] == [s.position for s in steps(wf)[:4]]


async def test_a_turn_cancelled_inside_tool_2_runs_it_again_under_the_same_step_key(
    store: EventStore, counts: Counts
) -> None:
    first = asyncio.Event()

    async def hang_once() -> None:
        if not first.is_set():
            first.set()
            await asyncio.Event().wait()

    wf = trip(store, counts, on_hold=hang_once)
    task = asyncio.ensure_future(wf.run(TURN))
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await wf.resume()
    assert [o.text for o in result.get_outputs()] == [FINAL]
    assert calls(counts) == {"model": 4, "search_flights": 1, "hold_seat": 2, "send_email": 1}
    first_key, second_key = counts.notes("hold_seat")
    assert first_key == second_key  # an external system can deduplicate the two attempts


async def test_a_streamed_turn_yields_its_updates_and_resumes_as_a_plain_one_does(
    store: EventStore, counts: Counts
) -> None:
    hooks = CancelAfter("hold_seat")
    wf = trip(store, counts, hooks=[hooks])

    async def stream(events: Any) -> list[Any]:
        return [e.data async for e in events if e.type == "output"]

    await cancelled(stream(wf.run(TURN, stream=True)), hooks)
    assert calls(counts) == {"model": 2, "search_flights": 1, "hold_seat": 1, "send_email": 0}
    outputs = await stream(wf.resume(stream=True))
    assert all(isinstance(o, AgentResponseUpdate) for o in outputs)
    assert outputs[-1].text == FINAL
    assert calls(counts) == {"model": 4, "search_flights": 1, "hold_seat": 1, "send_email": 1}
    served = [s.name for s in steps(wf) if s.reused is not None]
    assert served == ["model_call", "search_flights", "model_call", "hold_seat"]
    # A resumed turn need not be streamed as its first attempt was.
    await wf.run("And a hotel?")
    assert prompt(counts)[-2:] == [["assistant", FINAL], ["user", "And a hotel?"]]


# -- a turn killed in a real process -----------------------------------------------------------


def worker(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.agents.agent_worker", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)


def said(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["crash-after", "crash-inside"])
def test_a_turn_killed_in_tool_2_resumes_in_a_new_process_and_the_next_turn_remembers(
    durable_store_url: str, counts: Counts, point: str
) -> None:
    url, where = durable_store_url, str(counts.root)
    killed(worker(point, url, "trip", where))
    assert calls(counts) == {"model": 2, "search_flights": 1, "hold_seat": 1, "send_email": 0}
    assert said(worker("resume", url, "trip", where)) == [FINAL]
    again = 1 if point == "crash-after" else 2  # killed inside it, hold_seat ran again
    assert calls(counts) == {"model": 4, "search_flights": 1, "hold_seat": again, "send_email": 1}
    assert len(set(counts.notes("hold_seat"))) == 1  # under one idempotency key
    store = open_store(url)
    try:
        recorded = [e for e in store.read("trip") if isinstance(e, StepRecorded)]
    finally:
        store.close()
    served = [s.name for s in recorded if s.reused is not None]
    assert served == ["model_call", "search_flights", "model_call"] + (
        ["hold_seat"] if point == "crash-after" else []
    )
    paid = [s.usage for s in recorded if s.name == "model_call" and s.reused is None]
    assert len(paid) == 4
    assert all(u and u["input_tokens"] > 0 for u in paid)
    # The next turn, in a third process, starts from the conversation in the log.
    assert said(worker("turn", url, "trip", where, "And a hotel?")) == [FINAL]
    assert prompt(counts)[0] == ["user", TURN]
    assert prompt(counts)[-2:] == [["assistant", FINAL], ["user", "And a hotel?"]]


# -- what it takes, sends and yields -----------------------------------------------------------


class Echo(BaseAgent):
    """An agent without a chat client: answers with the texts it was given; counts its runs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[list[str]] = []

    def run(  # type: ignore[override]
        self,
        messages: AgentRunInputs | None = None,
        *,
        stream: bool = False,
        session: AgentSession | None = None,
        **kwargs: Any,
    ) -> Awaitable[AgentResponse[Any]] | ResponseStream[AgentResponseUpdate, AgentResponse[Any]]:
        texts = [m.text for m in messages or []]  # type: ignore[union-attr]
        self.seen.append(texts)
        assert session is not None
        session.state["turns"] = session.state.get("turns", 0) + 1

        async def answer() -> AgentResponse[Any]:
            reply = Message("assistant", [f"{self.name} heard {' / '.join(texts)}"])
            return AgentResponse(messages=[reply], usage_details={"output_token_count": 3})

        return answer()


async def test_an_agent_without_a_chat_client_is_recorded_as_one_run_with_its_session(
    store: EventStore,
) -> None:
    agent = Echo(name="echo")
    hooks = CancelAfter("agent_run")
    wf = WorkflowBuilder(start_executor=AgentExecutor(agent), store=store)
    built = wf.with_hooks(hooks).build()
    await cancelled(built.run("hello"), hooks)
    result = await built.resume()
    assert [o.text for o in result.get_outputs()] == ["echo heard hello"]
    assert agent.seen == [["hello"]]  # served on resume: the agent ran once
    (ran, served) = steps(built)
    assert (ran.name, ran.usage, served.reused) == ("agent_run", {"output_tokens": 3}, ran.position)
    session = built.committed_state()["agent:echo"]["agent_session"]
    assert session["state"] == {"turns": 1}  # the session the run left, restored from its record


async def test_requests_collect_messages_until_one_asks_for_an_answer() -> None:
    agent = Echo(name="echo")
    wf = WorkflowBuilder(start_executor=AgentExecutor(agent)).build()
    await wf.run(AgentExecutorRequest([Message("user", ["one"])], should_respond=False))
    assert agent.seen == []
    result = await wf.run(AgentExecutorRequest([Message("user", ["two"])]))
    assert agent.seen == [["one", "two"]]
    assert [o.text for o in result.get_outputs()] == ["echo heard one / two"]
    await wf.run([Message("user", ["three"]), "four"])
    await wf.run(Message("user", ["five"]))
    assert agent.seen[1:] == [["three", "four"], ["five"]]


async def test_a_chained_agent_takes_the_first_ones_conversation() -> None:
    first, second = Echo(name="first"), Echo(name="second")
    a, b = AgentExecutor(first), AgentExecutor(second, context_mode="last_agent")
    sent: list[AgentExecutorResponse] = []

    class Sent(RunHooks):
        def message_sent(
            self, step: SuperstepInfo, source: str, message: Any, targets: Any
        ) -> None:
            sent.append(message)

    wf = WorkflowBuilder(start_executor=a).add_edge(a, b).with_hooks(Sent()).build()
    result = await wf.run("hi")
    assert second.seen == [["first heard hi"]]
    assert [o.text for o in result.get_outputs()] == [
        "first heard hi",
        "second heard first heard hi",
    ]
    assert isinstance(sent[0], AgentExecutorResponse)
    assert [m.text for m in sent[0].full_conversation] == ["hi", "first heard hi"]


def test_its_id_is_the_agents_name_and_a_bad_context_mode_is_refused() -> None:
    assert AgentExecutor(Echo(name="echo")).id == "echo"
    assert AgentExecutor(Echo(name="echo"), id="other").state_key == "agent:other"
    with pytest.raises(DefinitionError, match="context_filter must be provided"):
        AgentExecutor(Echo(name="echo"), context_mode="custom")
    with pytest.raises(ValueError, match="context_mode must be one of"):
        AgentExecutor(Echo(name="echo"), context_mode="everything")  # type: ignore[arg-type]


def test_the_module_exports_afs_own_message_classes_and_its_names_sorted() -> None:
    import agent_framework

    from kernel import agents
    from tests.test_exported_members import ruff_order

    assert agents.__all__ == sorted(agents.__all__, key=ruff_order)
    assert AgentExecutorRequest is agent_framework.AgentExecutorRequest
    assert AgentExecutorResponse is agent_framework.AgentExecutorResponse
    # Only kernel.agents imports agent_framework: the kernel stands without the extra.
    check = "import sys, kernel, projections; print('agent_framework' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_token_counts_are_named_as_steps_record_them() -> None:
    details = {
        "input_token_count": 5,
        "output_token_count": 2,
        "cache_read_input_token_count": 1,
        "total_token_count": None,
        "provider_cost": 9,
    }
    assert usage_counts(details) == {
        "input_tokens": 5,
        "output_tokens": 2,
        "cache_read_input_tokens": 1,
        "provider_cost": 9,
    }


# -- a tool that asks for approval -------------------------------------------------------------


async def test_an_approval_asked_in_one_process_is_answered_in_another(
    durable_store_url: str, counts: Counts
) -> None:
    @tool(approval_mode="always_require")
    async def cancel_booking(code: str) -> str:
        """Cancel a booking."""
        counts.bump("cancel_booking")
        return f"{code} cancelled"

    def build() -> Workflow:
        client = PlannedChatClient(
            counts, plan=[("cancel_booking", {"code": "TP123"})], final="Done."
        )
        agent = Agent(client=client, name="travel", tools=[cancel_booking])
        store = open_store(durable_store_url)
        executor = AgentExecutor(agent)
        return WorkflowBuilder(start_executor=executor, store=store, instance_id="trip").build()

    wf = build()
    asked = (await wf.run("Cancel TP123")).get_request_info_events()
    assert [(e.data.type, e.data.function_call.name) for e in asked] == [
        ("function_approval_request", "cancel_booking")
    ]
    assert counts["cancel_booking"] == 0
    later = build()  # another agent and executor, the store opened again
    (request,) = later.pending_requests()
    answer = {request.request_id: request.data.to_function_approval_response(True)}
    result = await later.run(responses=answer)
    assert [o.text for o in result.get_outputs()] == ["Done."]
    assert counts["cancel_booking"] == 1
    assert "cancel_booking" in [s.name for s in steps(later)]
    later.store.close()
