"""A scripted chat client and tools that count their calls, for AgentExecutor's tests (no network).

``Counts`` keeps counts in files under a directory, one line per call, so that they survive a
process killed with SIGKILL and can be read by the process that resumes it.

``PlannedChatClient`` is a deterministic model: it answers from the prompt it is given, not from
how many times it was called, as a real model would after a restart. While the prompt holds fewer
tool results than its plan has calls, it asks for the next planned tool; then it answers with its
final text. Each answer reports token usage. It is an AF chat client with AF's layers (tool loop,
chat middleware), as AF's own clients are.

The three tools of a trip: ``search_flights``, ``hold_seat`` (returns a hold named by its
idempotency key, ``step_key()``), ``send_email``. Each counts its call before it returns;
``hold_seat`` also notes the idempotency key it saw, and runs the ``on_hold`` callback given after
counting (a test blocks or kills the process there).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    FunctionTool,
    Message,
    tool,
)

from kernel import step_key

PLAN: list[tuple[str, dict[str, Any]]] = [
    ("search_flights", {"to": "Lisbon"}),
    ("hold_seat", {"flight": "TP123"}),
    ("send_email", {"to": "ana@example.com", "body": "Your seat on TP123 is held."}),
]
FINAL = "Booked: TP123, and Ana knows."


class Counts:
    """Call counts kept in files under ``root`` (one line per call)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def bump(self, name: str, note: str = "") -> None:
        with (self.root / name).open("a") as file:
            file.write(note.replace("\n", " ") + "\n")

    def __getitem__(self, name: str) -> int:
        return len(self.notes(name))

    def notes(self, name: str) -> list[str]:
        path = self.root / name
        return path.read_text().splitlines() if path.exists() else []


def tool_results(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages for c in m.contents if c.type == "function_result")


class PlannedChatClient(
    FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], BaseChatClient[Any]
):
    """A model that follows ``plan``, then says ``final``; counts its calls as ``model`` and
    notes each prompt (roles and texts, as JSON) as a line of ``prompts``."""

    def __init__(
        self,
        counts: Counts,
        plan: Sequence[tuple[str, dict[str, Any]]] = PLAN,
        final: str = FINAL,
    ) -> None:
        super().__init__()
        self.counts = counts
        self.plan = list(plan)
        self.final = final

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any
    ) -> Any:
        if stream:  # the same answer, as a stream of its updates

            async def updates() -> AsyncIterator[ChatResponseUpdate]:
                for update in (await self._answer(messages)).to_updates():
                    yield update

            return self._build_response_stream(updates())
        return self._answer(messages)

    async def _answer(self, messages: Sequence[Message]) -> ChatResponse:
        self.counts.bump("model")
        prompt = [[m.role, m.text] for m in messages]
        self.counts.bump("prompts", json.dumps(prompt))
        done = tool_results(messages)
        usage = {"input_token_count": 100 + 10 * len(messages), "output_token_count": 7}
        usage["total_token_count"] = usage["input_token_count"] + 7
        if done < len(self.plan):
            name, arguments = self.plan[done]
            call = Content.from_function_call(
                call_id=f"call-{done + 1}", name=name, arguments=arguments
            )
            reply = Message("assistant", [call])
        else:
            reply = Message("assistant", [self.final])
        return ChatResponse(messages=[reply], usage_details=usage)  # type: ignore[arg-type]


def trip_tools(
    counts: Counts, on_hold: Callable[[], Awaitable[None]] | None = None
) -> list[FunctionTool]:
    """The three tools of a trip, counting their calls in ``counts``."""

    @tool
    async def search_flights(to: str) -> str:
        """Find a flight."""
        counts.bump("search_flights")
        return f"TP123 to {to}"

    @tool
    async def hold_seat(flight: str) -> str:
        """Hold a seat on a flight."""
        key = step_key()
        counts.bump("hold_seat", key)
        if on_hold is not None:
            await on_hold()
        return f"hold {key[:8]} on {flight}"

    @tool
    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        counts.bump("send_email", to)
        return f"sent to {to}"

    return [search_flights, hold_seat, send_email]


def trip_agent(
    counts: Counts, on_hold: Callable[[], Awaitable[None]] | None = None, **client: Any
) -> Agent:
    """An agent with the planned model and the trip's tools."""
    return Agent(
        client=PlannedChatClient(counts, **client),
        name="travel",
        instructions="Book the trip.",
        tools=trip_tools(counts, on_hold),
    )
