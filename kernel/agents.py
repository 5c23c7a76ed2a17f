"""Durable Agent Framework agents: ``AgentExecutor`` runs an AF agent inside a steplog superstep,
and every model call and every tool call of its turn is a recorded step.

This module is the ``agents`` extra (``pip install steplog[agents]``): it imports
``agent_framework`` and nothing else of the kernel imports it. Its ``AgentExecutor`` has Agent
Framework's name, constructor and handlers, and takes and sends AF's own ``AgentExecutorRequest``
and ``AgentExecutorResponse``; what differs is where the turn's work and the agent's memory are
kept:

* **Each model call is a step** (``model_call``): the chat client's ``ChatResponse`` is recorded in
  the log when the call returns, with its token usage (``StepRecorded.usage``: ``input_tokens``,
  ``output_tokens``, ``total_tokens``, ...), and its prompt (``StepRecorded.arguments``:
  ``messages``, the messages sent, and ``options``, the chat options as ``prompt_options`` shows
  them), so that a reader can show what was asked. A call is identified by its position among the
  model calls of the executor's invocations in the superstep: the n-th call of a retried turn is
  served the n-th recorded response, so a resumed turn pays for no call it made before (everything
  the call's prompt is built from was served or restored identically).
* **Each tool call is a step** named after the tool, identified by the model's ``call_id`` and the
  call's arguments (both recorded, ``StepRecorded.arguments``): a resumed turn is served the results
  of the tools that finished and runs only the others. Inside a tool, ``kernel.step_key()`` is the
  call's idempotency key.
* **The conversation is state**: the agent's session (its history), the messages waiting for the
  next turn and the last full conversation are kept under the state key ``agent:<executor id>``,
  written with ``ctx.set_state`` when the turn ends. It counts only if the superstep commits, so
  a turn that crashed, failed or was cancelled leaves no trace in it, and any process reading the
  log restores it.

Recording per call needs an ``agent_framework.Agent`` whose chat client runs chat middleware
(``ChatMiddlewareLayer``, which every AF chat client has); tools are recorded when it also runs
the tool loop (``FunctionInvocationLayer``). Any other agent's ``run`` is recorded whole, as one
step (``agent_run``) holding its response and its session afterwards.

Values cross the log through the store's codec: AF's ``Message``, ``Content``, ``AgentResponse``
and ``AgentSession`` serialize themselves (``to_dict``/``from_dict``), and ``build()`` registers
the ones the handlers name, so they read back as themselves; the recorded results are plain JSON
trees this module rebuilds with the AF class it expects. Decoding never imports anything a row
names. See docs/agents.md.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, cast

import orjson
from agent_framework import (
    Agent,
    AgentExecutorRequest,
    AgentExecutorResponse,
    AgentResponse,
    AgentResponseUpdate,
    AgentSession,
    ChatContext,
    ChatMiddleware,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    Message,
    MiddlewareFailure,
    ResponseStream,
    SupportsAgentRun,
)
from pydantic import BaseModel

from kernel import (
    DecodeError,
    DefinitionError,
    EncodingError,
    ExecutionError,
    Executor,
    ResponseError,
    WorkflowContext,
    handler,
    report_usage,
    response_handler,
    step,
)

__all__ = [
    "AGENT_RUN",
    "MODEL_CALL",
    "AgentExecutor",
    "AgentExecutorRequest",
    "AgentExecutorResponse",
    "prompt_options",
    "usage_counts",
]

ContextMode = Literal["full", "last_agent", "custom"]
AgentContext = WorkflowContext[AgentExecutorResponse, AgentResponse | AgentResponseUpdate]

MODEL_CALL = "model_call"
"""The step name of a model call (the chat client's response)."""
AGENT_RUN = "agent_run"
"""The step name of a whole agent run, for an agent whose calls cannot be recorded one by one."""

_TOKEN_COUNT = re.compile(r"^(?P<what>\w+)_token_count$")


def usage_counts(details: Mapping[str, Any] | None) -> dict[str, int]:
    """AF's ``UsageDetails`` as step usage: ``input_token_count`` becomes ``input_tokens`` (every
    ``*_token_count`` likewise), other counts keep their names; what is not a non-negative
    ``int`` (a provider's ``None``) is left out."""
    counts: dict[str, int] = {}
    for name, value in (details or {}).items():
        if type(value) is not int or value < 0:
            continue
        match = _TOKEN_COUNT.match(name)
        counts[f"{match['what']}_tokens" if match else name] = value
    return counts


def _report(details: Mapping[str, Any] | None) -> None:
    counts = usage_counts(details)
    if counts:
        report_usage(**counts)


# -- what a step records, and what is rebuilt from it ------------------------------------------


def prompt_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A model call's chat options as its record shows them (``StepRecorded.arguments``): the
    tools by name, a response format that is a class by its name, every other option as given
    when it is plain JSON (text, numbers, booleans, None, lists and text-keyed objects of them),
    else as ``"<TypeName>"``: never dropped, never an object the codec would refuse."""
    shown: dict[str, Any] = {}
    for name, value in (options or {}).items():
        if name == "tools" and isinstance(value, Sequence) and not isinstance(value, str):
            shown[name] = [_tool_name(tool) for tool in value]
        elif name == "response_format" and isinstance(value, type):
            shown[name] = value.__name__
        else:
            shown[name] = value if _plain(value) else f"<{type(value).__name__}>"
    return shown


def _tool_name(tool: Any) -> str:
    if isinstance(tool, Mapping):
        found = tool.get("name") or (tool.get("function") or {}).get("name")
    else:
        found = getattr(tool, "name", None) or getattr(tool, "__name__", None)
    return found if isinstance(found, str) else f"<{type(tool).__name__}>"


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain JSON (a tree of text, numbers, booleans and None)."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple):
        return all(_plain(item) for item in value)
    if type(value) is dict:
        return all(type(key) is str and _plain(item) for key, item in value.items())
    return False


def _tool_record(result: Any) -> dict[str, Any]:
    """A tool's result as recorded: its contents' ``to_dict()``, or the value itself (a tool
    that skips AF's result parsing), which the codec must be able to store."""
    if isinstance(result, list) and all(isinstance(item, Content) for item in result):
        return {"contents": [item.to_dict() for item in result]}
    return {"value": result}


def _tool_result(record: Any) -> Any:
    if not isinstance(record, dict) or not ("contents" in record or "value" in record):
        raise DecodeError(f"a recorded tool result must be contents or a value, got {record!r}")
    if "value" in record:
        return record["value"]
    return [Content.from_dict(item) for item in record["contents"]]


def _arguments_text(arguments: BaseModel | Mapping[str, Any] | None) -> str:
    """A tool call's arguments as canonical JSON text (sorted keys): part of its identity."""
    if isinstance(arguments, BaseModel):
        data: Any = arguments.model_dump(mode="json")
    else:
        data = dict(arguments or {})
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS, default=str).decode()


class _RecordedModelCalls(ChatMiddleware):
    """Chat middleware that makes each model call a recorded step (``model_call``): what is
    recorded is the call's ``ChatResponse``, streamed or not, and its prompt (the messages and
    the options, as its arguments: ``Message`` objects, so the call is identified by its order).
    A streamed call is consumed inside its step and handed on as the response's updates, one
    per message."""

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        live: list[ChatResponse] = []

        async def model_call(messages: list[Message], options: dict[str, Any]) -> dict[str, Any]:
            await call_next()
            if context.stream:
                stream = cast(ResponseStream[ChatResponseUpdate, ChatResponse], context.result)
                async for _ in stream:
                    pass
                response = await stream.get_final_response()
            else:
                response = cast(ChatResponse, context.result)
            live.append(response)
            _report(response.usage_details)
            return response.to_dict()

        prompt = list(context.messages), prompt_options(context.options)
        recorded = await step(name=MODEL_CALL, record_arguments=True)(model_call)(*prompt)
        response = live[0] if live else ChatResponse.from_dict(recorded)
        if context.stream:
            updates = response.to_updates()
            context.result = ResponseStream(_each(updates), finalizer=ChatResponse.from_updates)
        else:
            context.result = response


async def _each(items: Sequence[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


class _RecordedToolCalls(FunctionMiddleware):
    """Function middleware that makes each tool call a recorded step named after the tool."""

    async def process(
        self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        live: list[Any] = []

        async def tool_call(call_id: str, arguments: str) -> dict[str, Any]:
            await call_next()
            live.append(context.result)
            return _tool_record(context.result)

        call_id = str(context.metadata.get("call_id", ""))
        recorded = step(name=context.function.name, record_arguments=True)(tool_call)
        try:
            record = await recorded(call_id, _arguments_text(context.arguments))
        except EncodingError as unstorable:
            # The tool ran but its result cannot be stored: fail the turn, never hand the model
            # an error text in its place.
            raise MiddlewareFailure(str(unstorable)) from unstorable
        context.result = live[0] if live else _tool_result(record)


_RECORDERS = (_RecordedModelCalls(), _RecordedToolCalls())


def _records_calls(agent: SupportsAgentRun) -> bool:
    """Whether each model call of ``agent`` can be recorded: an AF ``Agent`` whose chat client
    runs chat middleware."""
    return isinstance(agent, Agent) and isinstance(agent.client, ChatMiddlewareLayer)


# -- the conversation, as state ----------------------------------------------------------------


class _Conversation:
    """What an AgentExecutor carries between turns, read from state and written back.

    ``cache``: messages waiting for the next turn; ``full``: the last turn's whole conversation;
    ``session``: the agent's session (its history); ``pending``: requests for input the agent is
    waiting on, in the order asked; ``answers``: the responses given so far, by request id.
    """

    __slots__ = ("answers", "cache", "full", "pending", "session")

    def __init__(
        self,
        session: AgentSession,
        cache: list[Message] | None = None,
        full: list[Message] | None = None,
        pending: dict[str, Content] | None = None,
        answers: dict[str, Content] | None = None,
    ) -> None:
        self.session = session
        self.cache = cache or []
        self.full = full or []
        self.pending = pending or {}
        self.answers = answers or {}

    def to_state(self) -> dict[str, Any]:
        return {
            "cache": self.cache,
            "full_conversation": self.full,
            "agent_session": self.session.to_dict(),
            "pending_requests": self.pending,
            "answers": self.answers,
        }

    @classmethod
    def from_state(cls, key: str, value: Any) -> _Conversation:
        """Rebuild it from the value under ``key``; raises ``DecodeError`` for a value of another
        shape (written by something else, or read without AF's classes registered)."""
        if not isinstance(value, dict):
            raise DecodeError(
                f"state {key!r} must be an AgentExecutor's conversation, got {value!r}"
            )
        try:
            session = AgentSession.from_dict(value["agent_session"])
        except Exception as error:
            raise DecodeError(f"state {key!r} holds no agent session: {error}") from error
        return cls(
            session,
            _typed(key, "cache", value.get("cache", []), Message),
            _typed(key, "full_conversation", value.get("full_conversation", []), Message),
            _typed_map(key, "pending_requests", value.get("pending_requests", {})),
            _typed_map(key, "answers", value.get("answers", {})),
        )


def _typed(key: str, field: str, items: Any, kind: type[Message]) -> list[Message]:
    if not isinstance(items, list) or not all(isinstance(item, kind) for item in items):
        raise DecodeError(
            f"state {key!r} field {field!r} must be a list of {kind.__name__} (is "
            f"agent_framework's {kind.__name__} registered with the store's codec?)"
        )
    return items


def _typed_map(key: str, field: str, items: Any) -> dict[str, Content]:
    if not isinstance(items, dict) or not all(isinstance(v, Content) for v in items.values()):
        raise DecodeError(
            f"state {key!r} field {field!r} must map request ids to Content (is "
            "agent_framework's Content registered with the store's codec?)"
        )
    return items


# -- the executor ------------------------------------------------------------------------------


class AgentExecutor(Executor):
    """Runs an Agent Framework agent as a steplog executor: its turns are durable.

    Made as AF's is: ``AgentExecutor(agent, *, session=None, id=None, context_mode=None,
    context_filter=None, ensure_trailing_user_turn=False)``. ``id`` defaults to the agent's
    name, then its id. ``session`` is the session the first turn starts from (a copy is used:
    the object given is never changed). ``context_mode`` says what an ``AgentExecutorResponse``
    from another agent adds to the conversation: its ``"full"`` conversation (the default), the
    ``"last_agent"``'s messages only, or what ``context_filter`` keeps (``"custom"``). With
    ``ensure_trailing_user_turn`` a turn whose messages end with the assistant's gets a
    ``"please continue."`` user message, for that call only.

    It takes an ``AgentExecutorRequest`` (its messages join the conversation; the agent answers
    if ``should_respond``), an ``AgentExecutorResponse``, a ``str``, a ``Message`` or a list of
    them. A turn yields the agent's ``AgentResponse`` as a workflow output (its
    ``AgentResponseUpdate``s when the run is streamed, ``ctx.is_streaming()``) and sends an
    ``AgentExecutorResponse`` (the response and the full conversation) along its edges; when the
    agent asks for input (a tool approval, a client-side tool call), each request is a
    ``request_info`` under the request's own id, and the turn goes on when every one is answered.

    Raises ``DefinitionError`` (a ``ValueError``) for an empty id or a bad context mode.
    """

    handlers_are_alternatives = True  # a workflow feeds it one or two of its five ways in

    def __init__(
        self,
        agent: SupportsAgentRun,
        *,
        session: AgentSession | None = None,
        id: str | None = None,
        context_mode: ContextMode | None = None,
        context_filter: Callable[[list[Message]], list[Message]] | None = None,
        ensure_trailing_user_turn: bool = False,
    ) -> None:
        executor_id = id or agent.name or agent.id
        if not executor_id:
            raise DefinitionError(
                "an AgentExecutor needs an id: give id=, or an agent with a name or an id"
            )
        mode = context_mode or "full"
        if mode not in ("full", "last_agent", "custom"):
            raise DefinitionError(
                f"context_mode must be one of 'full', 'last_agent' or 'custom', got {mode!r}"
            )
        if mode == "custom" and context_filter is None:
            raise DefinitionError("context_filter must be provided when context_mode is 'custom'")
        super().__init__(executor_id)
        self._agent = agent
        self._first_session = (session or agent.create_session()).to_dict()
        self._context_mode: ContextMode = mode
        self._context_filter = context_filter
        self._ensure_trailing_user_turn = ensure_trailing_user_turn

    @property
    def agent(self) -> SupportsAgentRun:
        """The agent this executor runs."""
        return self._agent

    @property
    def description(self) -> str | None:
        """The agent's description."""
        return self._agent.description

    @property
    def state_key(self) -> str:
        """The state key its conversation is kept under: ``agent:<id>``."""
        return f"agent:{self.id}"

    # -- handlers -----------------------------------------------------------------------------

    @handler
    async def run(self, request: AgentExecutorRequest, ctx: AgentContext) -> None:
        """Add the request's messages to the conversation; answer if ``should_respond``."""
        await self._turn(ctx, list(request.messages), respond=request.should_respond)

    @handler
    async def from_response(self, prior: AgentExecutorResponse, ctx: AgentContext) -> None:
        """Go on from another agent's response, as ``context_mode`` says, and answer."""
        if self._context_mode == "full":
            added = list(prior.full_conversation)
        elif self._context_mode == "last_agent":
            added = list(prior.agent_response.messages)
        else:
            assert self._context_filter is not None  # checked when made
            added = list(self._context_filter(list(prior.full_conversation)))
        await self._turn(ctx, added)

    @handler
    async def from_str(self, text: str, ctx: AgentContext) -> None:
        """A user's text: add it and answer."""
        await self._turn(ctx, [Message("user", [text])])

    @handler
    async def from_message(self, message: Message, ctx: AgentContext) -> None:
        """A message: add it and answer."""
        await self._turn(ctx, [message])

    @handler
    async def from_messages(self, messages: list[str | Message], ctx: AgentContext) -> None:
        """Texts (a user's) and messages: add them and answer."""
        added = [m if isinstance(m, Message) else Message("user", [m]) for m in messages]
        await self._turn(ctx, added)

    @response_handler
    async def handle_user_input_response(
        self, original_request: Content, response: Content, ctx: AgentContext
    ) -> None:
        """An answer to one of the agent's requests; when every request of the turn is
        answered, the agent goes on with the answers (in the order it asked)."""
        conversation = self._read(ctx)
        request_id = original_request.id
        if request_id is None or request_id not in conversation.pending:
            raise ResponseError(
                f"AgentExecutor {self.id!r} is waiting for no request {request_id!r}"
            )
        conversation.answers[request_id] = response
        if all(rid in conversation.answers for rid in conversation.pending):
            answers = [conversation.answers[rid] for rid in conversation.pending]
            conversation.pending.clear()
            conversation.answers.clear()
            conversation.cache = _answer_messages(answers)
            await self._respond(ctx, conversation)
        ctx.set_state(self.state_key, conversation.to_state())

    # -- a turn -------------------------------------------------------------------------------

    async def _turn(self, ctx: AgentContext, added: list[Message], *, respond: bool = True) -> None:
        conversation = self._read(ctx)
        conversation.cache.extend(added)
        if respond:
            await self._respond(ctx, conversation)
        ctx.set_state(self.state_key, conversation.to_state())

    def _read(self, ctx: AgentContext) -> _Conversation:
        """The conversation as committed (with this superstep's own writes): never an object a
        failed attempt may have changed."""
        value = ctx.get_state(self.state_key)
        if value is None:
            return _Conversation(AgentSession.from_dict(self._first_session))
        return _Conversation.from_state(self.state_key, value)

    async def _respond(self, ctx: AgentContext, conversation: _Conversation) -> None:
        messages = list(conversation.cache)
        if self._ensure_trailing_user_turn and messages and messages[-1].role == "assistant":
            messages.append(Message("user", ["please continue."]))
        streaming = ctx.is_streaming()
        response, updates = await self._run_agent(ctx, conversation, messages, streaming)
        for update in updates:  # a streamed turn's outputs: its updates, but requests for input
            if not update.user_input_requests:
                await ctx.yield_output(update)
        requests = list(response.user_input_requests)
        if requests:
            conversation.full = list(conversation.cache)
            for request in requests:
                if not request.id or request.id in conversation.pending:
                    raise ExecutionError(
                        f"AgentExecutor {self.id!r}: the agent asked for input with a missing or "
                        f"repeated request id {request.id!r}"
                    )
                conversation.pending[request.id] = request
            for request in requests:
                await ctx.request_info(request, Content, request_id=request.id)
            return
        if not streaming:
            await ctx.yield_output(response)
        conversation.full = [*conversation.cache, *response.messages]
        await ctx.send_message(AgentExecutorResponse(self.id, response, conversation.full))
        conversation.cache = []

    async def _run_agent(
        self,
        ctx: AgentContext,
        conversation: _Conversation,
        messages: list[Message],
        streaming: bool,
    ) -> tuple[AgentResponse, list[AgentResponseUpdate]]:
        """Run the agent on ``messages``: its response, and its updates when ``streaming``."""
        function_kwargs, client_kwargs = self._invocation_kwargs(ctx.run_kwargs)
        kwargs: dict[str, Any] = {
            "stream": streaming,
            "session": conversation.session,
            "function_invocation_kwargs": function_kwargs,
            "client_kwargs": client_kwargs,
        }
        if _records_calls(self._agent):
            return await _agent_run(self._agent, messages, middleware=list(_RECORDERS), **kwargs)
        session = conversation.session
        live: list[tuple[AgentResponse, list[AgentResponseUpdate]]] = []

        async def agent_run() -> dict[str, Any]:
            response, updates = await _agent_run(self._agent, messages, **kwargs)
            live.append((response, updates))
            _report(response.usage_details)
            recorded: dict[str, Any] = {
                "response": response.to_dict(),
                "session": session.to_dict(),
            }
            if streaming:
                recorded["updates"] = [update.to_dict() for update in updates]
            return recorded

        recorded = await step(name=AGENT_RUN)(agent_run)()
        if live:
            return live[0]
        conversation.session = AgentSession.from_dict(recorded["session"])
        response = AgentResponse.from_dict(recorded["response"])
        if not streaming:
            return response, []
        if "updates" not in recorded:  # recorded by an attempt that was not streamed
            return response, response.to_updates()
        return response, [AgentResponseUpdate.from_dict(u) for u in recorded["updates"]]

    def _invocation_kwargs(
        self, run_kwargs: Mapping[str, Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``function_invocation_kwargs`` and ``client_kwargs`` given to ``workflow.run``: the
        whole mapping, or, when it has a ``"__global__"`` entry or one under this executor's id,
        the global entry updated with this executor's."""
        found: list[dict[str, Any] | None] = []
        for name in ("function_invocation_kwargs", "client_kwargs"):
            given = run_kwargs.get(name)
            if not isinstance(given, Mapping):
                found.append(None)
            elif "__global__" in given or self.id in given:
                mine = {**(given.get("__global__") or {}), **(given.get(self.id) or {})}
                found.append(mine or None)
            else:
                found.append(dict(given))
        return found[0], found[1]


async def _agent_run(
    agent: SupportsAgentRun, messages: list[Message], **kwargs: Any
) -> tuple[AgentResponse, list[AgentResponseUpdate]]:
    """``agent.run(messages, **kwargs)``: its response, and, streamed, the updates it streamed
    (the response is the stream's final one, so the stream's result hooks run)."""
    run = cast(Callable[..., Any], agent.run)
    if not kwargs["stream"]:
        return await run(messages, **kwargs), []
    stream = run(messages, **kwargs)
    updates: list[AgentResponseUpdate] = [update async for update in stream]
    final = getattr(stream, "get_final_response", None)
    if callable(final):
        return await final(), updates
    return AgentResponse.from_updates(updates), updates


def _answer_messages(answers: Sequence[Content]) -> list[Message]:
    """The answers as the messages the agent goes on with: tool results as ``tool`` messages,
    errors as ``assistant`` ones, others (approvals) as ``user`` ones; consecutive answers of one
    role in one message."""
    messages: list[Message] = []
    for answer in answers:
        role = (
            "tool"
            if answer.type == "function_result"
            else "assistant"
            if answer.type == "error"
            else "user"
        )
        if messages and messages[-1].role == role:
            messages[-1].contents.append(answer)
        else:
            messages.append(Message(role, [answer]))
    return messages
