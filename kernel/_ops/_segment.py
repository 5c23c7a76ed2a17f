"""The executor that runs a functional workflow's function on the graph runner, and one
execution of it: a *segment*.

A functional workflow is a one-executor graph (``WorkflowFunction``). Every superstep of its
runs executes the function from the top, in one handler invocation: a fresh run's first
superstep takes the run's message; a continuation's (after an answer, or ``resume()`` after a
crash) takes the message its lineage started with, read from the log. The superstep is the
segment's commit boundary: what the function stages (state, outputs, custom events, requests)
counts once it commits, which it does when the function returns or stops for input
(``Interrupted``), and never when it fails, is cancelled or its process dies.

What survives a segment that does not commit is what was durable at once: the recorded steps
(``@step``). The executor's steps are keyed across its lineage (``step_scope = "lineage"``), so a
re-execution is served every call the lineage completed, in any segment. Answers are not
recorded again: each is the ``ResponseReceived`` of the run that delivered it, and a segment
reads its lineage's from the log.

Request ids. The function names its requests (``auto::N``, or the id it gives); in the log they
are ``<id>@<lineage>`` (``request_id_in_log``), because an instance's request ids must be unique
across its runs and every lineage counts its ``auto::N`` from 0. The functional workflow maps
them back for its caller.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Never

from kernel._base._errors import DefinitionError, StateWriteRejectedError
from kernel._define._context import WorkflowContext, port_of
from kernel._define._executor import Executor, handler, response_handler
from kernel._define._step import (
    ACTIVE_CALL,
    ACTIVE_HOST,
    AfterFailure,
    Identity,
    StepCall,
    is_run_context,
)
from kernel._define._stream import WorkflowEvent
from kernel._ops._runcontext import ACTIVE_RUN_CONTEXT, Interrupted, RunContext, coerce_response
from kernel._run._steps import StepsHost
from kernel._run._superstep import Superstep

__all__ = [
    "FunctionShape",
    "Segment",
    "WorkflowFunction",
    "request_id_in_log",
    "request_id_of",
]

_MISSING: Any = object()


def request_id_in_log(request_id: str, lineage: str) -> str:
    """The id a functional workflow's request has in the log: unique across the instance."""
    return f"{request_id}@{lineage}"


def request_id_of(logged: str, lineage: str) -> str | None:
    """The function's own id of request ``logged`` of ``lineage`` (None: not one of its)."""
    suffix = f"@{lineage}"
    if logged.endswith(suffix) and len(logged) > len(suffix):
        return logged[: -len(suffix)]
    return None


@dataclass(frozen=True, slots=True)
class FunctionShape:
    """How a ``@workflow`` function takes its arguments: the parameters that receive the
    ``RunContext`` (annotated so, or named ``ctx``) and the one that receives the run's message
    (``message``: ``(name, keyword_only)``, None if it takes none)."""

    contexts: tuple[tuple[str, bool], ...]
    message: tuple[str, bool] | None

    @classmethod
    def of(cls, func: Callable[..., Any]) -> FunctionShape:
        """Raises ``DefinitionError`` (a ``ValueError``) for a function that is not async, or
        that has more than one parameter besides its contexts (AF refuses it too)."""
        name = getattr(func, "__name__", repr(func))
        if not inspect.iscoroutinefunction(func):
            raise DefinitionError(
                f"@workflow can only decorate async functions, but {name!r} is not a coroutine "
                "function"
            )
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            hints = {}
        contexts: list[tuple[str, bool]] = []
        others: list[tuple[str, bool]] = []
        for pname, param in inspect.signature(func).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            where = (pname, param.kind is param.KEYWORD_ONLY)
            if is_run_context(hints.get(pname, param.annotation)) or pname == "ctx":
                contexts.append(where)
            else:
                others.append(where)
        if len(others) > 1:
            raise DefinitionError(
                f"@workflow function {name!r} declares multiple non-RunContext parameters "
                f"({[n for n, _ in others]}); at most one is supported: it receives the message "
                "given to run(). Combine the inputs into one object or dict."
            )
        return cls(tuple(contexts), others[0] if others else None)


class WorkflowFunction(Executor):
    """The one executor of a functional workflow (its id is the workflow's name): each message it
    receives runs the function once (a segment). ``streaming`` is set by the functional workflow
    for each run (``RunContext.is_streaming()``); ``response_types`` keeps, in this process, the
    type each request asked for (by its id in the log), so that a response of the wrong type can
    be refused before it is recorded."""

    step_scope = "lineage"  # steps are served across the whole lineage: the function runs again

    def __init__(self, func: Callable[..., Awaitable[Any]], name: str) -> None:
        self.func = func
        self.shape = FunctionShape.of(func)
        self.order = list(inspect.signature(func).parameters)
        self.streaming = False
        self.response_types: dict[str, Any] = {}
        self._last_superstep: str | None = None
        super().__init__(id=name, type="FunctionalWorkflow")

    @handler
    async def begin(self, message: Any, ctx: WorkflowContext[Never, Any]) -> None:
        """The run's message: the function's first execution (or its retry after a crash)."""
        await self._execute(ctx, message, continued=False)

    @response_handler
    async def answered(
        self, original_request: Any, response: Any, ctx: WorkflowContext[Never, Any]
    ) -> None:
        """An answer: the function runs again from the top, with every answer of its lineage."""
        await self._execute(ctx, None, continued=True)

    def arguments(self, ctx: RunContext, message: Any) -> tuple[list[Any], dict[str, Any]]:
        """The arguments of a call of the function, in its parameters' order."""
        shape = self.shape
        given = {name: (ctx, kw) for name, kw in shape.contexts}
        if shape.message is not None:
            given[shape.message[0]] = (message, shape.message[1])
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name in self.order:
            if name in given:
                value, keyword_only = given[name]
                if keyword_only:
                    kwargs[name] = value
                else:
                    args.append(value)
        return args, kwargs

    async def _execute(
        self, ctx: WorkflowContext[Any, Any], message: Any, *, continued: bool
    ) -> None:
        step = port_of(ctx)
        inner = ACTIVE_HOST.get()
        if not isinstance(step, Superstep) or not isinstance(inner, StepsHost):
            raise DefinitionError(
                f"the functional workflow {self.id!r} runs only as its own workflow's executor"
            )
        if step.superstep_id == self._last_superstep:
            return  # answers delivered together: the first invocation ran with all of them
        self._last_superstep = step.superstep_id
        answers: dict[str, Any] = {}
        if continued:
            message, answers = self._from_log(step, ctx.run_id, inner.lineage)
        await Segment(self, ctx, step, inner, answers).run(message)

    @staticmethod
    def _from_log(step: Superstep, run_id: str, lineage: str) -> tuple[Any, dict[str, Any]]:
        """The message the lineage of run ``run_id`` started with, and the answers its runs
        recorded (wire values, by the function's request ids)."""
        host = step.host
        # the whole lineage, from its first run: a snapshot's pruned ledger does not reach it
        ledger = host.full_ledger()
        chain, _ = ledger.lineage(run_id, None, host.origin_ledger)
        started = chain[0][0].started
        message = host.codec.decode(started.input, what="the input message of the lineage")
        answers: dict[str, Any] = {}
        for line, _ in chain:
            for response in line.responses:
                own = request_id_of(response.request_id, lineage)
                if own is not None:
                    answers[own] = response.value
        return message, answers


@dataclass(slots=True)
class _Open:
    """A step call running live in a segment: its task, and the automatic request ids used
    before it started."""

    task: asyncio.Task[Any] | None
    auto_before: int


class Segment:
    """One execution of a functional workflow's function, in one superstep.

    It is the ``StepHost`` of the function's steps (each call is handed on to the runner's
    ``StepsHost``, with the automatic request ids it used, and its results are copied for the
    stream so that the function mutating them later changes no event), and the ``SegmentPort``
    of its ``RunContext``. Once a request stops the function, the steps already running (in
    tasks of ``asyncio.gather``, say) finish and are recorded; nothing new starts: any other call
    raises the same stop.
    """

    def __init__(
        self,
        function: WorkflowFunction,
        ctx: WorkflowContext[Any, Any],
        step: Superstep,
        inner: StepsHost,
        answers: dict[str, Any],
    ) -> None:
        self.function = function
        self.ctx = ctx
        self.step = step
        self.inner = inner
        self.lineage = inner.lineage
        self.answers = answers
        self.codec = step.host.codec
        self.streaming = function.streaming
        self.run_context = RunContext.bound(function.id, self)
        self.auto = 0  # the next automatic request id's number
        self.requested: set[str] = set()
        self.interrupted: Interrupted | None = None
        self.over = False
        self.calls: dict[StepCall, _Open] = {}
        self._changed = asyncio.Event()

    # -- the execution ---------------------------------------------------------------------

    async def run(self, message: Any) -> None:
        """Run the function once: yield its result, or stop with its requests staged."""
        host_token = ACTIVE_HOST.set(self)
        ctx_token = ACTIVE_RUN_CONTEXT.set(self.run_context)
        try:
            try:
                args, kwargs = self.function.arguments(self.run_context, message)
                result = await self.function.func(*args, **kwargs)
            except BaseException as raised:
                if self.interrupted is None or not _paused(raised):
                    raise
            else:
                if self.interrupted is None:
                    if result is not None:
                        await self.ctx.yield_output(result)
                    return
            await self._settle()
        finally:
            self.over = True
            ACTIVE_RUN_CONTEXT.reset(ctx_token)
            ACTIVE_HOST.reset(host_token)

    async def _settle(self) -> None:
        """Wait until the step calls still running (in other tasks) have finished, or their
        tasks have ended: they are recorded, as AF lets them finish."""
        current = asyncio.current_task()
        while True:
            for call, opened in list(self.calls.items()):
                if opened.task is None or opened.task is current or opened.task.done():
                    del self.calls[call]  # unwound by the stop, or its task is over
            if not self.calls:
                return
            self._changed.clear()
            await self._changed.wait()

    def _check_entry(self) -> None:
        """Refuse a call once the function stopped (see the class)."""
        if self.over:
            if self.interrupted is not None:
                raise Interrupted(self.interrupted.request_id)
            raise StateWriteRejectedError(
                f"the execution of functional workflow {self.function.id!r} in superstep "
                f"{self.step.superstep_id} is over: nothing more of it counts"
            )
        if self.interrupted is not None and ACTIVE_CALL.get() not in self.calls:
            raise Interrupted(self.interrupted.request_id)

    # -- SegmentPort: what its RunContext asks -------------------------------------------------

    @property
    def run_kwargs(self) -> dict[str, Any]:
        return self.ctx.run_kwargs

    async def request_info(self, data: Any, response_type: Any, request_id: str | None) -> Any:
        self._check_entry()
        if request_id is None:
            request_id = f"auto::{self.auto}"
            self.auto += 1
        wire = self.answers.get(request_id, _MISSING)
        if wire is not _MISSING:
            value = self.codec.decode(wire, what=f"the response to request {request_id!r}")
            return coerce_response(value, response_type, request_id)
        if request_id not in self.requested:
            self.requested.add(request_id)
            logged = request_id_in_log(request_id, self.lineage)
            self.function.response_types[logged] = response_type
            await self.ctx.request_info(data, response_type, request_id=logged)
        if self.interrupted is None:
            self.interrupted = Interrupted(request_id)
        raise Interrupted(request_id)

    async def add_event(self, event: WorkflowEvent[Any]) -> None:
        self._check_entry()
        kind = getattr(event, "type", None)
        if kind == "output":
            await self.ctx.yield_output(event.data)
        elif kind == "intermediate":
            self.step.output(self.function.id, event.data, "intermediate")
        else:
            await self.ctx.add_event(event)  # refuses the runner's own types

    def get_state(self, key: str, default: Any) -> Any:
        self._check_entry()
        return self.ctx.get_state(key, default)

    def set_state(self, key: str, value: Any) -> None:
        self._check_entry()
        self.ctx.set_state(key, value)

    # -- StepHost: what its steps ask ----------------------------------------------------------

    def open(
        self, name: str, identity: Identity, digest: str | None, concurrent_ok: bool
    ) -> StepCall:
        self._check_entry()
        return self.inner.open(name, identity, digest, concurrent_ok)

    def lookup(self, call: StepCall, after_failure: AfterFailure) -> tuple[bool, Any]:
        return self.inner.lookup(call, after_failure)

    async def served(self, call: StepCall, result: Any) -> None:
        if self.over:
            return
        self.auto += call.auto_request_ids  # as many as running it used
        await self.inner.served(call, _snapshot(result))

    async def started(self, call: StepCall) -> None:
        await self.inner.started(call)  # may refuse the call (a rerun's instance)
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(self._task_done)
        self.calls[call] = _Open(task, self.auto)

    async def finished(self, call: StepCall, result: Any, error: BaseException | None) -> None:
        opened = self.calls.pop(call, None)
        self._changed.set()
        if self.over:
            return  # the superstep is closed: nothing more of this execution is recorded
        if opened is not None and error is None:
            call.auto_request_ids = self.auto - opened.auto_before
        await self.inner.finished(call, _snapshot(result) if error is None else None, error)

    def _task_done(self, _task: asyncio.Task[Any]) -> None:
        self._changed.set()


def _paused(raised: BaseException) -> bool:
    """Whether ``raised`` is the function stopping for input: an ``Interrupted``, or a group of
    them only (``asyncio.TaskGroup``). A group that also holds a failure raises the failure."""
    if isinstance(raised, Interrupted):
        return True
    if not isinstance(raised, BaseExceptionGroup):
        return False
    stops, rest = raised.split(Interrupted)
    if rest is not None:
        raise rest from None
    return stops is not None


def _snapshot(value: Any) -> Any:
    """A deep copy of ``value`` for the stream (``value`` itself if it cannot be copied)."""
    try:
        return copy.deepcopy(value)
    except Exception:
        return value
