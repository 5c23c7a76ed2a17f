"""Functional workflows: Agent Framework's ``@workflow`` (1.23, experimental) on the log.

A ``@workflow`` async function is a ``FunctionalWorkflowDefinition``; ``build(store=...,
instance_id=...)`` binds it to an instance, as ``WorkflowBuilder`` binds a graph (the same
arguments, and the same ``InstanceSettings`` checks: it is a ``WorkflowBuilder`` underneath),
and gives a ``FunctionalWorkflow``: a one-executor ``Workflow`` whose executor runs the function
(``kernel._ops._segment``), with AF's ``run()``.

What the caller sees is translated from the graph run's stream, so that it is AF's functional
stream: the runner's scaffolding (``superstep_started``/``superstep_completed``, and the
function executor's own ``executor_invoked``/``executor_completed``/``executor_failed``) is
left out, the steps' ``executor_*`` events carry the step's name, and request ids are the
function's own (``auto::0``), not their unique form in the log (``auto::0@<lineage>``). A result's
outputs are the outputs of its run (AF's), where a graph ``RunResult`` counts its lineage's.
"""

from __future__ import annotations

import functools
import logging
import typing
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

from kernel._base._clock import Clock, IdFactory
from kernel._base._errors import DefinitionError, RunInProgressError, WorkflowArgumentError
from kernel._codec._valuetypes import value_classes
from kernel._define._stream import WorkflowEvent
from kernel._log._events import EventBase
from kernel._log._requests import PendingRequest
from kernel._ops._builder import WorkflowBuilder
from kernel._ops._runcontext import coerce_response
from kernel._ops._segment import WorkflowFunction, request_id_in_log, request_id_of
from kernel._ops._settings import InstanceSettings
from kernel._ops._workflow import Durability, RunStream, Workflow
from kernel._run._hooks import RunHooks
from kernel._run._instance import read_ledger
from kernel._run._ledger import Checkpoint, Ledger, RunLine, waiting
from kernel._run._result import RunResult
from kernel._store._eventstore import EventStore

__all__ = ["FunctionalRunStream", "FunctionalWorkflow", "FunctionalWorkflowDefinition", "workflow"]

logger = logging.getLogger(__name__)

_BUILTIN_TYPES: dict[str, type] = {
    t.__qualname__: t for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set)
}
"""Response types known by their logged names alone (``_type_name`` logs builtins bare)."""


class FunctionalWorkflowDefinition:
    """What ``@workflow`` makes of an async function: a definition, with no instance yet.

    ``name`` (the function's name by default) names the workflow, its one executor and its
    outputs' source; ``description`` is kept. The function takes at most one parameter besides
    its ``RunContext`` ones (annotated ``RunContext``, or named ``ctx``): the run's message.
    Raises ``DefinitionError`` (a ``ValueError``) for one that takes more, or is not async.
    """

    def __init__(
        self,
        func: Callable[..., Awaitable[Any]],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        WorkflowFunction(func, name or func.__name__)  # checks the function and the name
        if description is not None and not isinstance(description, str):
            raise DefinitionError(f"description must be a string, got {description!r}")
        self._func = func
        self.name: str = name or func.__name__
        self.description = description
        functools.update_wrapper(self, func)  # type: ignore[arg-type]  # AF's: name, doc

    def build(
        self,
        *,
        store: EventStore | None = None,
        instance_id: str | None = None,
        max_supersteps: int | None = None,
        max_iterations: int | None = None,
        durability: Durability = "superstep",
        clock: Clock | None = None,
        id_factory: IdFactory | None = None,
        sensitive_keys: Iterable[str] = (),
        hooks: Iterable[RunHooks] = (),
        types: Iterable[Any] = (),
        checkpoint_storage: Any = None,
    ) -> FunctionalWorkflow:
        """Bind the workflow to an instance of ``store``: a ``FunctionalWorkflow``.

        The arguments are ``WorkflowBuilder``'s, checked by it (``DefinitionError``): ``store``
        (default ``open_store()``), ``instance_id`` (default a fresh one: each ``build()`` is
        its own caller or session, as in AF), ``max_supersteps``/``max_iterations`` (every
        execution of the function is one superstep; default 100), ``durability``, ``clock``,
        ``id_factory``, ``sensitive_keys``; ``hooks`` as ``with_hooks``; ``types`` as
        ``register_types`` (the classes the function's annotations name are registered too).
        AF's ``checkpoint_storage`` is refused (``DefinitionError``): the instance's log is its
        checkpoint storage.
        """
        if checkpoint_storage is not None:
            raise DefinitionError(
                "checkpoint_storage= is Agent Framework's CheckpointStorage, which steplog does "
                "not take: the instance's log is where its checkpoints are (checkpoints() lists "
                "them); give store= and instance_id= instead"
            )
        function = WorkflowFunction(self._func, self.name)
        builder = self._builder(
            function,
            store=store,
            instance_id=instance_id,
            max_supersteps=max_supersteps,
            max_iterations=max_iterations,
            durability=durability,
            clock=clock,
            id_factory=id_factory,
            sensitive_keys=sensitive_keys,
        )
        builder.with_hooks(*hooks)
        self._register(builder, types)
        return FunctionalWorkflow(self, builder.build(), function)

    def _builder(self, function: WorkflowFunction, **options: Any) -> WorkflowBuilder:
        return WorkflowBuilder(
            start_executor=function, name=self.name, description=self.description, **options
        )

    def _register(self, builder: WorkflowBuilder, types: Iterable[Any]) -> None:
        try:
            hints = list(typing.get_type_hints(self._func).values())
        except Exception:
            hints = []
        builder.register_types(*types, *value_classes(*hints))

    def _bind(self, store: EventStore, settings: InstanceSettings) -> FunctionalWorkflow:
        """This workflow on the instance ``settings`` name (a fork's), with its own executor."""
        function = WorkflowFunction(self._func, self.name)
        builder = self._builder(function, store=store)
        self._register(builder, ())
        graph = builder.build().graph
        return FunctionalWorkflow(self, Workflow(graph, store=store, settings=settings), function)

    def __repr__(self) -> str:
        return f"FunctionalWorkflowDefinition({self.name!r})"


@overload
def workflow(func: Callable[..., Awaitable[Any]], /) -> FunctionalWorkflowDefinition: ...
@overload
def workflow(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Awaitable[Any]]], FunctionalWorkflowDefinition]: ...


def workflow(
    func: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> (
    FunctionalWorkflowDefinition
    | Callable[[Callable[..., Awaitable[Any]]], FunctionalWorkflowDefinition]
):
    """Make an async function a functional workflow: ``@workflow`` or ``@workflow(name=...,
    description=...)``. Returns a ``FunctionalWorkflowDefinition``; its ``build(store=...,
    instance_id=...)`` gives a ``FunctionalWorkflow`` to run (see docs/porting.md, "Functional
    workflows")."""
    if func is not None:
        return FunctionalWorkflowDefinition(func, name=name, description=description)

    def decorate(fn: Callable[..., Awaitable[Any]]) -> FunctionalWorkflowDefinition:
        return FunctionalWorkflowDefinition(fn, name=name, description=description)

    return decorate


@dataclass(frozen=True, slots=True)
class _Lineage:
    """Where an instance's last run stands, in the function's request ids: its lineage, the
    requests waiting for an answer (wire data, as the log recorded them), the answers recorded
    so far (wire values), and whether answers recorded without a run (``steplog respond``)
    still wait for ``resume()`` to deliver them."""

    lineage: str | None
    pending: dict[str, dict[str, Any]]
    answered: dict[str, Any]
    undelivered: bool = False


class FunctionalWorkflow:
    """A functional workflow bound to an instance: made by ``FunctionalWorkflowDefinition.build``.

    ``run(message)`` runs the function; a ``RunContext.request_info`` it cannot answer yet ends
    the run waiting for input, and ``run(responses={request_id: value})`` (in this process or
    another, on the same instance) runs it again from the top, its completed steps served from
    the log. ``resume()`` continues a run that crashed, failed or was cancelled, the same way.
    ``checkpoints()`` and ``fork(at=..., instance_id=...)`` are the ``Workflow``'s; ``workflow``
    is the one-executor ``Workflow`` underneath (its log, state and requests in their graph form).
    One run at a time (``RunInProgressError``, a ``RuntimeError``).
    """

    def __init__(
        self,
        definition: FunctionalWorkflowDefinition,
        workflow: Workflow,
        function: WorkflowFunction,
    ) -> None:
        self._definition = definition
        self.workflow = workflow
        self._function = function
        self._active: weakref.ref[FunctionalRunStream] | None = None

    @property
    def name(self) -> str:
        return self._definition.name

    @property
    def description(self) -> str | None:
        return self._definition.description

    @property
    def instance_id(self) -> str:
        return self.workflow.instance_id

    @property
    def store(self) -> EventStore:
        return self.workflow.store

    # -- running -------------------------------------------------------------------------------

    @overload
    def run(
        self,
        message: Any = None,
        *,
        stream: Literal[False] = False,
        responses: Mapping[str, Any] | None = None,
        checkpoint_id: str | None = None,
        checkpoint_storage: Any = None,
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult]: ...
    @overload
    def run(
        self,
        message: Any = None,
        *,
        stream: Literal[True],
        responses: Mapping[str, Any] | None = None,
        checkpoint_id: str | None = None,
        checkpoint_storage: Any = None,
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> FunctionalRunStream: ...

    def run(
        self,
        message: Any = None,
        *,
        stream: bool = False,
        responses: Mapping[str, Any] | None = None,
        checkpoint_id: str | None = None,
        checkpoint_storage: Any = None,
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult] | FunctionalRunStream:
        """Run the function on ``message``, or continue it with ``responses`` (by the
        function's request ids) or from ``checkpoint_id`` (the instance's latest checkpoint), or
        both: give at least one of the three, and a message alone. ``await run(...)`` returns a
        ``RunResult``; ``run(..., stream=True)`` a ``FunctionalRunStream``. ``kwargs`` are the
        run's arguments (``RunContext.run_kwargs``).

        Refused before anything is appended, with ``WorkflowArgumentError`` (a ``ValueError``,
        as AF's): a message with responses or a checkpoint, nothing to run, a message to a
        function that takes none, responses while no request is pending or that answer none of
        the pending ones, an answer that differs from the one recorded for the same request, a
        response not of the type its request asked for, an unknown ``checkpoint_id``, and AF's
        ``checkpoint_storage``. A message while requests are pending gives them up (AF warns so,
        and so does this, on ``kernel._ops._functional``'s logger); while answers recorded with
        ``steplog respond`` wait for ``resume()``, it is refused (``PendingRequestsError``).
        ``RunInProgressError`` while a run of this object is still going.
        """
        if message is not None and responses is not None:
            raise WorkflowArgumentError(
                "Cannot provide both 'message' and 'responses'. Use one or the other."
            )
        if message is not None and checkpoint_id is not None:
            raise WorkflowArgumentError(
                "Cannot provide both 'message' and 'checkpoint_id'. Use one or the other."
            )
        if message is None and responses is None and checkpoint_id is None:
            raise WorkflowArgumentError(
                "Must provide at least one of: 'message' (new run), 'responses' (send "
                "responses), or 'checkpoint_id' (continue from a checkpoint)."
            )
        if checkpoint_storage is not None:
            raise WorkflowArgumentError(
                "checkpoint_storage= is Agent Framework's CheckpointStorage, which steplog does "
                "not take: the instance's log is its checkpoint storage, and checkpoint_id= "
                "names one of checkpoints()"
            )
        self._check_idle()
        where = self._where()
        if message is not None:
            if self._function.shape.message is None:
                raise WorkflowArgumentError(
                    f"@workflow function {self.name!r} has no non-RunContext parameter to "
                    "receive a message, but run() was given one. Add a first parameter to the "
                    "function, or give no message."
                )
            if where.pending:
                logger.warning(
                    "Workflow %s received a fresh message while %d request_info event(s) are "
                    "still pending from an unfinished request/response cycle (%s); the new run "
                    "gives them up (a fork of the checkpoint that holds them can still answer "
                    "them).",
                    self.name,
                    len(where.pending),
                    ", ".join(sorted(where.pending)),
                )
            self._function.streaming = stream
            inner = self.workflow.run(
                message,
                stream=True,
                include_status_events=include_status_events,
                # AF gives pending requests up with a warning; answers recorded with `steplog
                # respond` are steplog's own, and the run refuses to drop them (PendingRequests)
                supersede_requests=not where.undelivered,
                **kwargs,
            )
            return self._launch(inner, inner.run_id, stream, include_status_events)
        if checkpoint_id is not None and checkpoint_id not in {
            c.checkpoint_id for c in self.workflow.checkpoints()
        }:
            raise WorkflowArgumentError(
                f"checkpoint {checkpoint_id!r} is not a checkpoint of instance "
                f"{self.instance_id!r} (checkpoints() lists them); Agent Framework's "
                "checkpoint_storage= is not taken: the instance's log is its checkpoint storage"
            )
        logged = None if responses is None else self._answers(where, responses)
        self._function.streaming = stream
        inner = self.workflow.run(
            stream=True,
            responses=logged,
            checkpoint_id=checkpoint_id,
            include_status_events=include_status_events,
            **kwargs,
        )
        return self._launch(inner, where.lineage or inner.run_id, stream, include_status_events)

    @overload
    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: Literal[False] = False,
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult]: ...
    @overload
    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: Literal[True],
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> FunctionalRunStream: ...

    def resume(
        self,
        run_id: str | None = None,
        *,
        stream: bool = False,
        include_status_events: bool = False,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, RunResult] | FunctionalRunStream:
        """Continue run ``run_id`` (default: the instance's last) after a crash, a failure, a
        cancellation or a dropped stream: the function runs again from the top, and the steps
        its lineage completed are served from the log (``Workflow.resume``; its errors)."""
        self._check_idle()
        _, line = self._line(read_ledger(self.store, self.instance_id), run_id)
        lineage = None if line is None else line.lineage
        self._function.streaming = stream
        inner = self.workflow.resume(run_id, stream=True, **kwargs)
        return self._launch(inner, lineage or inner.run_id, stream, include_status_events)

    def _launch(
        self, inner: RunStream, lineage: str, stream: bool, statuses: bool
    ) -> Coroutine[Any, Any, RunResult] | FunctionalRunStream:
        shown = FunctionalRunStream(inner, _Translation(self.name, lineage), statuses)
        self._active = weakref.ref(shown)
        if stream:
            return shown
        return shown.get_final_response()

    def _check_idle(self) -> None:
        active = None if self._active is None else self._active()
        if active is not None and not active.done:
            raise RunInProgressError(
                f"Workflow is already running. Concurrent executions are not allowed: run "
                f"{active.run_id} of functional workflow {self.name!r} (instance "
                f"{self.instance_id!r}) is still going; await it, or close its stream with "
                "aclose(), before starting another"
            )

    # -- requests and answers ------------------------------------------------------------------

    def _where(self) -> _Lineage:
        ledger = read_ledger(self.store, self.instance_id)
        source, line = self._line(ledger, None)
        if line is None:
            return _Lineage(None, {}, {})
        lineage = line.lineage
        pending = {}
        left = waiting(ledger)
        for logged, request in left.requests.items():
            own = request_id_of(logged, lineage)
            if own is not None:
                pending[own] = request
        answered = {}
        chain, _ = source.lineage(line.run_id, None, self._origin)
        for run, _ in chain:
            for response in run.responses:
                own = request_id_of(response.request_id, lineage)
                if own is not None:
                    answered[own] = response.value
        return _Lineage(lineage, pending, answered, bool(left.responses))

    def _line(self, ledger: Ledger, run_id: str | None) -> tuple[Ledger, RunLine | None]:
        """Run ``run_id`` (default: the last), and the ledger it is in: a fork that has not
        run yet goes on with its origin's run."""
        if run_id is not None:
            return ledger, ledger.runs.get(run_id)
        line, forked = ledger.last_run(), ledger.forked
        if line is None and forked is not None and forked.origin_run is not None:
            origin = self._origin(forked)
            return origin, origin.runs.get(forked.origin_run)
        return ledger, line

    def _origin(self, forked: Any) -> Ledger:
        return read_ledger(self.store, forked.origin_instance, upto=forked.origin_position)

    def _answers(self, where: _Lineage, responses: Mapping[str, Any]) -> dict[str, Any]:
        """``responses`` by the ids of the log, checked (see ``run``)."""
        given = list(responses)
        if not where.pending:
            raise WorkflowArgumentError(
                f"responses={given!r} do not correspond to any pending request on workflow "
                f"{self.name!r}. The workflow has no pending request_info events, so there is "
                "nothing to resume. Start a fresh run with 'message'."
            )
        if not set(given) & set(where.pending):
            raise WorkflowArgumentError(
                f"responses={given!r} do not answer any of the currently-pending requests on "
                f"workflow {self.name!r} ({sorted(where.pending)!r}). Provide a response keyed "
                "by one of the pending request_ids."
            )
        assert where.lineage is not None
        codec = self.store.codec
        logged: dict[str, Any] = {}
        for request_id, value in responses.items():
            request = where.pending.get(request_id)
            if request is not None:
                asked = self._response_type(request)
                if asked is not None:
                    coerce_response(value, asked, request_id)  # WorkflowArgumentError
                if value is None:
                    logger.warning(
                        "Response for request_id=%r is None. If this is intentional, consider "
                        "using a sentinel value instead.",
                        request_id,
                    )
                logged[request_id_in_log(request_id, where.lineage)] = value
                continue
            recorded = where.answered.get(request_id, _NOT_ANSWERED)
            if recorded is _NOT_ANSWERED:
                raise WorkflowArgumentError(
                    f"request {request_id!r} is neither pending nor answered in the current run "
                    f"of workflow {self.name!r} (pending: {sorted(where.pending)!r}); steplog "
                    "records a response only to a request that was made"
                )
            if not _same_answer(codec, recorded, value):
                raise WorkflowArgumentError(
                    f"request {request_id!r} was answered already, with "
                    f"{codec.decode(recorded)!r}: a request takes one answer, and the log keeps "
                    "the first. Give the same value again, or leave it out."
                )
        return logged

    def _response_type(self, request: Mapping[str, Any]) -> Any:
        """The type a pending request asked for, when this process knows it: the live type if
        the function made the request here, else a builtin or registered class by its logged
        name; None when neither (the run then checks the answer)."""
        live = self._function.response_types.get(request["request_id"], _NOT_ANSWERED)
        if live is not _NOT_ANSWERED:
            return live
        name = request.get("response_type") or ""
        known = _BUILTIN_TYPES.get(name)
        if known is not None:
            return known
        for cls in self.store.codec.registered.values():
            if f"{cls.__module__}.{cls.__qualname__}" == name:
                return cls
        return None

    def pending_requests(self) -> list[PendingRequest]:
        """The requests the function waits for an answer to, by its own request ids."""
        where = self._where()
        codec = self.store.codec
        return [
            PendingRequest(
                own,
                request["executor_id"],
                codec.decode(request["data"]),
                request["response_type"],
                request["run_id"],
                request["superstep_id"],
            )
            for own, request in where.pending.items()
        ]

    # -- the instance --------------------------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        """The instance's checkpoints, oldest first (``Workflow.checkpoints``): one per
        execution of the function that committed."""
        return self.workflow.checkpoints()

    def committed_state(self) -> dict[str, Any]:
        """The instance's committed workflow state (``RunContext.set_state``'s)."""
        return self.workflow.committed_state()

    def events(self) -> list[EventBase]:
        """Every event of the instance's stream, in order."""
        return self.workflow.events()

    def fork(self, *, at: Any, instance_id: str) -> FunctionalWorkflow:
        """Start instance ``instance_id`` from this one's log at ``at`` (``Workflow.fork``):
        the same functional workflow, on the fork."""
        forked = self.workflow.fork(at=at, instance_id=instance_id)
        return self._definition._bind(self.store, forked.settings)

    def __repr__(self) -> str:
        return f"FunctionalWorkflow({self.name!r}, instance={self.instance_id!r})"


_NOT_ANSWERED: Any = object()


def _same_answer(codec: Any, recorded: Any, value: Any) -> bool:
    """Whether ``value`` is the answer ``recorded`` (a wire value) holds."""
    try:
        return bool(codec.decode(recorded) == value) or codec.encode(value) == recorded
    except Exception:
        return False


class _Translation:
    """The graph run's events as a functional workflow's caller sees them (see the module)."""

    def __init__(self, function_id: str, lineage: str) -> None:
        self.function_id = function_id
        self.lineage = lineage
        self._in_segment = False
        self._steps_so_named = 0  # steps named as the function, running now

    def __call__(self, event: WorkflowEvent[Any]) -> WorkflowEvent[Any] | None:
        kind = event.type
        if kind == "superstep_started":
            self._in_segment, self._steps_so_named = False, 0
            return None
        if kind == "superstep_completed":
            return None
        if event.executor_id == self.function_id:
            if kind == "executor_invoked":
                if not self._in_segment:
                    self._in_segment = True  # the runner invoking the function
                    return None
                self._steps_so_named += 1
            elif kind in ("executor_completed", "executor_failed"):
                if not self._steps_so_named:
                    self._in_segment = False  # the runner's end of the function's invocation
                    return None
                self._steps_so_named -= 1
        if kind == "request_info" and event.request_id is not None:
            own = request_id_of(event.request_id, self.lineage)
            if own is not None:
                return event.replace(request_id=own)
        return event


class FunctionalRunStream:
    """What ``FunctionalWorkflow.run(..., stream=True)`` returns: an async iterator of the run's
    events (AF's functional stream), and ``get_final_response()`` for its ``RunResult``. As a
    ``RunStream``: ``aclose()`` (or ``async with``) cancels an unfinished run, and a stream
    dropped unread is recorded as abandoned."""

    def __init__(self, inner: RunStream, translate: _Translation, statuses: bool) -> None:
        self._inner = inner
        self._translate = translate
        self._statuses = statuses
        self._events: list[WorkflowEvent[Any]] = []
        self.done = False

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    def __aiter__(self) -> AsyncIterator[WorkflowEvent[Any]]:
        return self

    async def __anext__(self) -> WorkflowEvent[Any]:
        while True:
            try:
                event = await self._inner.__anext__()
            except BaseException:
                self.done = True
                raise
            shown = self._translate(event)
            if shown is not None:
                self._events.append(shown)
                return shown

    async def get_final_response(self) -> RunResult:
        """The run's ``RunResult``, once its stream is read to the end (raises what the run
        raised): its events as streamed, its outputs, and its pending requests by the
        function's request ids."""
        async for _ in self:
            pass
        base = await self._inner.get_final_response()
        lineage = self._translate.lineage
        events = list(self._events)
        return RunResult(
            base.run_id,
            base.status,
            base.supersteps,
            [e.data for e in events if e.type == "output"],
            [
                replace(r, request_id=request_id_of(r.request_id, lineage) or r.request_id)
                for r in base.pending_requests
            ],
            [e.data for e in events if e.type == "intermediate"],
            include_status_events=self._statuses,
            _events=events,
        )

    async def aclose(self) -> None:
        """Stop the run if it is still going (recorded as ``cancelled``) and wait for it."""
        self.done = True
        await self._inner.aclose()

    async def __aenter__(self) -> FunctionalRunStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
