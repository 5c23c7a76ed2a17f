"""Sub-workflows: ``WorkflowExecutor`` runs a workflow as one executor of another.

Each invocation runs the wrapped workflow as a run of its own instance (the *child*) in the
parent's store, named after the parent (``child_instance_id``). The two logs point at each other:

* the child's ``SubworkflowStarted`` (right after its ``RunStarted``) names the parent instance,
  run and superstep, and the executor;
* the parent's ``SubworkflowRan``, staged in that superstep, names the child instance and run,
  and the child's requests that were still waiting when its run ended.

What the child's run yields reaches the parent only through the invoking superstep: its outputs
become messages (or outputs) staged there, and its requests become ``SubWorkflowRequestMessage``
messages (or the parent's own requests), so the fold ignores all of it if that superstep aborts.
A child's own log is its own: what its run committed stays committed in the child instance, even
when the parent superstep that ran it aborts; nothing of the parent refers to it then.

A response (``SubWorkflowResponseMessage``, or the answer to a request the parent passed on) goes
to the child instance that holds the request, by the parent's *committed* ``SubworkflowRan``
links (``SubworkflowLinks``; a forked parent starts from its origin's) and what the running
superstep itself linked. That child is never continued in place: it is forked at its run's end
into a new child, which takes the response.
So a parent superstep that aborts after answering leaves the child as it was, and a retry of the
superstep answers the same request again, in a fork of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernel._base._errors import DefinitionError, EncodingError, ExecutionError, StoreError
from kernel._base._ids import MAX_ID_BYTES
from kernel._define._context import port_of
from kernel._define._executor import Executor
from kernel._define._signatures import HandlerSpec, ResponseHandlerSpec
from kernel._define._stream import WorkflowEvent
from kernel._log._events import InstanceForked, SubworkflowRan, SubworkflowStarted, SuperstepEvent
from kernel._log._fold import SuperstepFold, folds
from kernel._log._requests import PendingRequest, Response
from kernel._ops._settings import WorkflowInstance
from kernel._ops._workflow import Workflow
from kernel._run._ledger import Continuation
from kernel._run._runner import Run
from kernel._run._superstep import Superstep

if TYPE_CHECKING:
    from kernel._define._context import WorkflowContext
    from kernel._define._graph import Graph
    from kernel._store._eventstore import EventStore

__all__ = [
    "SubWorkflowRequestMessage",
    "SubWorkflowResponseMessage",
    "SubworkflowLinks",
    "WorkflowExecutor",
    "child_instance_id",
]


@dataclass
class SubWorkflowResponseMessage:
    """The answer to a sub-workflow's request, sent back to its ``WorkflowExecutor``.

    ``data`` is the response; ``source_event`` the ``request_info`` event of the request (its
    ``request_id`` says which request it answers). Make one with
    ``SubWorkflowRequestMessage.create_response``.
    """

    data: Any
    source_event: WorkflowEvent


@dataclass
class SubWorkflowRequestMessage:
    """A sub-workflow's request, sent by its ``WorkflowExecutor`` (``executor_id``) to the parent
    executors that handle this type, which may answer it (``create_response``, sent back to
    ``executor_id``) or ask outside in turn (``ctx.request_info``).

    ``source_event`` is the sub-workflow's ``request_info`` event (``data``, ``request_id``,
    ``executor_id`` of the requesting inner executor); ``response_type`` the name of the type it
    asked for.
    """

    source_event: WorkflowEvent
    executor_id: str
    response_type: str = ""

    def create_response(self, data: Any) -> SubWorkflowResponseMessage:
        """The response message answering this request with ``data``.

        Raises ``TypeError`` when the request named a class and ``data`` is not one of it.
        """
        wanted = self.response_type
        if wanted and _plain_class_name(wanted):
            names = {_class_name(kind) for kind in type(data).__mro__}
            if wanted not in names:
                raise TypeError(
                    f"the response to request {self.source_event.request_id} must be a "
                    f"{wanted}, got a {_class_name(type(data))}"
                )
        return SubWorkflowResponseMessage(data=data, source_event=self.source_event)


def child_instance_id(parent_instance: str, executor_id: str, token: str) -> str:
    """The instance id of a sub-workflow run by ``executor_id`` in ``parent_instance``:
    ``parent/executor/token``, ``token`` a fresh id from the parent's id factory. When that is
    longer than an instance id may be, the parent part is replaced by its hash."""
    candidate = f"{parent_instance}/{executor_id}/{token}"
    if len(candidate.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES:
        return candidate
    digest = hashlib.blake2b(
        f"{parent_instance}/{executor_id}".encode("utf-8", "surrogatepass"), digest_size=12
    ).hexdigest()
    return f"sub-{digest}/{token}"


class SubworkflowLinks(SuperstepFold):
    """A pure fold of a parent's log: which child instance holds each sub-workflow request still
    waiting, by the parent's committed ``SubworkflowRan`` links (of executor ``executor_id``, or
    of every executor when None).

    ``waiting`` maps a request id to ``(child_instance, child_run)``; ``links`` lists every
    committed link in log order.
    """

    __slots__ = ("executor_id", "links", "waiting")

    def __init__(self, executor_id: str | None = None) -> None:
        super().__init__()
        self.executor_id = executor_id
        self.waiting: dict[str, tuple[str, str]] = {}
        self.links: list[SubworkflowRan] = []

    @folds("subworkflow_ran")
    def _ran(self, event: SubworkflowRan) -> None:
        if self.executor_id is None or event.executor_id == self.executor_id:
            self._stage(event)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        for link in items:
            self.links.append(link)
            _relink(
                self.waiting, link.continues, link.child_instance, link.child_run, link.requests
            )


def _relink(
    waiting: dict[str, tuple[str, str]],
    replaced: str | None,
    child: str,
    run_id: str,
    requests: list[str],
) -> None:
    """The child ``replaced`` (if any) gave way to ``child``, whose run left ``requests``."""
    if replaced is not None:
        for request_id in [r for r, (holder, _) in waiting.items() if holder == replaced]:
            del waiting[request_id]
    for request_id in requests:
        waiting[request_id] = (child, run_id)


_LINK_TYPES = SubworkflowLinks.EVENT_TYPES | {"instance_forked"}


@dataclass
class _Overlay:
    """The links a running superstep made so far (not in the store yet, or not committed)."""

    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)


@dataclass
class _ChildRun:
    """What one run of a child produced: its outputs and the requests it made, in order."""

    outputs: list[tuple[str, Any]] = field(default_factory=list)  # (event type, value)
    requests: list[WorkflowEvent] = field(default_factory=list)
    pending: list[PendingRequest] = field(default_factory=list)


class WorkflowExecutor(Executor):
    """An executor that runs ``workflow`` as a sub-workflow, as Agent Framework's does.

    A message the wrapped workflow's start executor accepts starts a run of a new child
    instance (``parent/id/<fresh id>``) in the parent's store. When that run ends, each output it
    yielded is sent on as a message (or, with ``allow_direct_output=True``, yielded as an output
    of the parent), and each request it made is sent on as a ``SubWorkflowRequestMessage`` to
    the parent executors connected to this one that handle that type. A request that no such
    executor handles, or every request with ``propagate_request=True``, becomes a request of the
    parent run itself (same id and data): ``run(responses={request_id: value})`` on the parent
    answers it and continues the child.

    A ``SubWorkflowResponseMessage`` (or the answer to a passed-on request) continues the child
    that holds the request, in a fork of it (see the module's notes). A child's failure is this
    executor's failure: the parent superstep aborts and the parent run fails, and the child's
    own log ends failed. The wrapped workflow object is a template: its graph, name and
    ``max_supersteps`` are used, never its store or instance.
    """

    def __init__(
        self,
        workflow: Workflow,
        id: str,
        allow_direct_output: bool = False,
        propagate_request: bool = False,
    ) -> None:
        if not isinstance(workflow, Workflow):
            raise DefinitionError(
                f"WorkflowExecutor {id!r} wraps a Workflow (from WorkflowBuilder.build()), got "
                f"{type(workflow).__qualname__}"
            )
        self.workflow = workflow
        self.allow_direct_output = allow_direct_output
        self.propagate_request = propagate_request
        self._overlays: weakref.WeakKeyDictionary[Superstep, _Overlay] = weakref.WeakKeyDictionary()
        super().__init__(id)  # resolves the one handler through ``_discover``
        # The wrapped workflow's response handlers, as this executor's: a request passed on to
        # the parent run is answered with what they take, and anything else is refused before
        # it is recorded (``ResponseError``), as for any executor's request.
        self._response_handlers = [
            (ResponseHandlerSpec(spec.name, spec.requests, spec.responses), self._answer_response)
            for inner_executor in workflow.graph.executors.values()
            for spec in inner_executor.response_handlers
        ]

    # -- the executor's types -----------------------------------------------------------------

    def _discover(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]]:
        """One handler, made from the wrapped workflow: it takes what its start executor takes
        (and responses to its requests), and sends or yields what the workflow yields."""
        return [(self._spec(), self._dispatch)]

    def _spec(self) -> HandlerSpec:
        graph = self.workflow.graph
        start = graph.executors[graph.start]
        accepts: tuple[type, ...] | None = None
        starts = [spec.accepts for spec in start.handlers]
        if all(kinds is not None for kinds in starts):
            accepts = (*(k for kinds in starts if kinds is not None for k in kinds),)
            accepts = (*accepts, SubWorkflowResponseMessage)
        yields = _inner_yields(graph)
        asks = any(executor.response_handlers for executor in graph.executors.values())
        extra = (SubWorkflowRequestMessage,) if asks and not self.propagate_request else ()
        if self.allow_direct_output:
            sends: tuple[type, ...] | None = extra
            outputs = yields
        else:
            sends = None if yields is None else (*yields, *extra)
            outputs = ()
        return HandlerSpec(
            "_dispatch",
            accepts,
            sends,
            outputs,
            output_types=sends or (),
            workflow_output_types=outputs or (),
        )

    @property
    def input_types(self) -> list[type]:
        """The message types the wrapped workflow's start executor accepts ([object]: any)."""
        spec = self._handlers[0][0] if self._handlers else self._spec()
        return [object] if spec.accepts is None else list(spec.accepts[:-1])

    def value_types(self) -> list[Any]:
        """The classes the wrapped workflow stores (what its builder registered), and the
        message classes of sub-workflows: ``build()`` of the parent registers them too."""
        return [
            *self.workflow.store.codec.registered.values(),
            WorkflowEvent,
            SubWorkflowRequestMessage,
            SubWorkflowResponseMessage,
        ]

    # -- handling -----------------------------------------------------------------------------

    async def execute(self, message: object, ctx: WorkflowContext[Any, Any]) -> None:
        if isinstance(message, Response):
            await self._answer(ctx, message.request.request_id, message.value)
        elif isinstance(message, SubWorkflowResponseMessage):
            await self._answer(ctx, _request_id(message), message.data)
        elif self.can_handle(message):
            await self._start(ctx, message)
        else:
            raise DefinitionError(
                f"executor {self.id!r} (a sub-workflow) has no handler for a message of type "
                f"{type(message).__qualname__}"
            )

    async def _dispatch(self, message: Any, ctx: WorkflowContext[Any, Any]) -> None:
        await self.execute(message, ctx)

    async def _answer_response(
        self, request: Any, value: Any, ctx: WorkflowContext[Any, Any]
    ) -> None:  # never called: ``execute`` takes responses itself
        raise AssertionError("unreachable")

    async def _start(self, ctx: WorkflowContext[Any, Any], message: Any) -> None:
        step, host = _host(ctx)
        child_id = child_instance_id(host.instance_id, self.id, host.new_id())
        child = self._bind(host, child_id)
        produced = await self._run_child(
            step, child, message, None, dict(step.run_kwargs), None, base_version=0
        )
        await self._deliver(ctx, step, produced)

    async def _answer(self, ctx: WorkflowContext[Any, Any], request_id: str, value: Any) -> None:
        step, host = _host(ctx)
        holder = self._holder(step, host, request_id)
        if holder is None:
            raise ExecutionError(
                f"executor {self.id!r} got a response to request {request_id!r}, but none of its "
                "sub-workflows is waiting for it (it was answered already, or never made here)"
            )
        origin_id, origin_run = holder
        origin = self._bind(host, origin_id)
        child_id = child_instance_id(host.instance_id, self.id, host.new_id())
        child = origin.fork(at=origin_run, instance_id=child_id)
        plan = Continuation(None, None, {request_id: value})
        produced = await self._run_child(step, child, None, plan, {}, origin_id, base_version=1)
        await self._deliver(ctx, step, produced)

    def _holder(
        self, step: Superstep, host: WorkflowInstance, request_id: str
    ) -> tuple[str, str] | None:
        """The child (instance, run) holding ``request_id``: this superstep's own links first,
        then the parent's committed ones."""
        overlay = self._overlays.get(step)
        if overlay is not None and request_id in overlay.waiting:
            return overlay.waiting[request_id]
        found = self._committed_links(host.store, host.instance_id).get(request_id)
        if found is not None and overlay is not None and found[0] in overlay.replaced:
            return None
        return found

    def _committed_links(
        self, store: EventStore, instance_id: str, upto: int | None = None
    ) -> dict[str, tuple[str, str]]:
        """``SubworkflowLinks.waiting`` of this executor in ``instance_id``'s log (up to
        ``upto``); a fork starts from its origin's links at the point it was forked."""
        events = store.read(instance_id, upto=upto, types=_LINK_TYPES)
        links = SubworkflowLinks(self.id)
        first = events[0] if events else None
        if isinstance(first, InstanceForked):
            links.waiting = self._committed_links(
                store, first.origin_instance, first.origin_position
            )
        return links.apply_all(events).waiting

    def _bind(self, host: WorkflowInstance, instance_id: str) -> Workflow:
        """The wrapped workflow on instance ``instance_id`` of the parent's store."""
        inner = self.workflow
        host.store.codec.register(*inner.store.codec.registered.values())
        settings = inner.settings.for_child(instance_id, parent=host.settings)
        return Workflow(inner.graph, store=host.store, settings=settings)

    async def _run_child(
        self,
        step: Superstep,
        child: Workflow,
        message: Any,
        plan: Continuation | None,
        kwargs: dict[str, Any],
        continues: str | None,
        *,
        base_version: int,
    ) -> _ChildRun:
        """Run ``child`` to its end (or continue it by ``plan``), and link it both ways."""
        run = Run(child._instance, message, kwargs, plan)
        run.preamble = [
            (
                SubworkflowStarted,
                {
                    "parent_instance": step.instance_id,
                    "parent_run": step.run_id,
                    "parent_superstep": step.superstep_id,
                    "executor_id": self.id,
                },
            )
        ]
        run.parent = (step.info, self.id)
        run.task = asyncio.current_task()
        produced = _ChildRun()

        async def collect(event: WorkflowEvent) -> None:
            if event.type in ("output", "intermediate"):
                produced.outputs.append((event.type, event.data))
            elif event.type == "request_info":
                produced.requests.append(event)

        try:
            result = await run.drive(collect)
        except BaseException:
            # The child's run failed or was cancelled (its log says so): the parent records that
            # it ran, if it got as far as starting, and the failure goes on. A store error while
            # recording it must not hide what is unwinding.
            with contextlib.suppress(StoreError, EncodingError):
                if child._instance.catch_up().version > base_version:
                    self._link(step, child, run.run_id, [], continues)
            raise
        produced.pending = list(result.pending_requests)
        waiting = [request.request_id for request in produced.pending]
        self._link(step, child, run.run_id, waiting, continues)
        overlay = self._overlays.setdefault(step, _Overlay())
        if continues is not None:
            overlay.replaced.add(continues)
        _relink(overlay.waiting, continues, child.instance_id, run.run_id, waiting)
        return produced

    def _link(
        self,
        step: Superstep,
        child: Workflow,
        run_id: str,
        waiting: list[str],
        continues: str | None,
    ) -> None:
        """Log the parent's ``SubworkflowRan`` in ``step`` (refused by nothing: it is a fact of
        the superstep, which counts only if the superstep commits)."""
        step.log(
            SubworkflowRan,
            executor_id=self.id,
            child_instance=child.instance_id,
            child_run=run_id,
            requests=waiting,
            continues=continues,
        )

    async def _deliver(
        self, ctx: WorkflowContext[Any, Any], step: Superstep, produced: _ChildRun
    ) -> None:
        """Stage what the child's run yielded in the parent superstep: outputs, then requests."""
        for kind, value in produced.outputs:
            if kind == "intermediate":  # the child's intermediate outputs stay intermediate
                step.output(self.id, value, designation="intermediate")
            elif self.allow_direct_output:
                await ctx.yield_output(value)
            else:
                await ctx.send_message(value)
        if not produced.requests:
            return
        pending = {request.request_id: request for request in produced.pending}
        intercepted = not self.propagate_request and _intercepted(step.graph, self.id)
        for event in produced.requests:
            request = pending.get(event.request_id or "")
            response_type = request.response_type if request is not None else ""
            if intercepted:
                await ctx.send_message(SubWorkflowRequestMessage(event, self.id, response_type))
            else:
                await ctx.request_info(event.data, response_type, request_id=event.request_id)


def _host(ctx: WorkflowContext[Any, Any]) -> tuple[Superstep, WorkflowInstance]:
    """The superstep ``ctx`` runs in, and the instance its run runs on (``Superstep.host``)."""
    step = port_of(ctx)
    if isinstance(step, Superstep) and isinstance(step.host, WorkflowInstance):
        return step, step.host
    raise ExecutionError(
        "a WorkflowExecutor runs only in a Workflow bound to a store (its sub-workflow is "
        "logged in that store)"
    )


def _request_id(message: SubWorkflowResponseMessage) -> str:
    request_id = getattr(message.source_event, "request_id", None)
    if not isinstance(request_id, str) or not request_id:
        raise ExecutionError(
            "a SubWorkflowResponseMessage must carry the request_info event it answers "
            "(source_event with its request_id): make it with request.create_response(data)"
        )
    return request_id


def _intercepted(graph: Graph, executor_id: str) -> bool:
    """Whether an executor this one sends to has a handler for ``SubWorkflowRequestMessage``
    (declared as such: a handler of anything does not count)."""
    for group in graph.groups:
        if executor_id not in group.sources:
            continue
        for target in group.targets:
            for spec in graph.executors[target].handlers:
                if spec.accepts is not None and spec.accepts_type(SubWorkflowRequestMessage):
                    return True
    return False


def _inner_yields(graph: Graph) -> tuple[type, ...] | None:
    """The output types of the wrapped workflow's executors (None: not all declared)."""
    kinds: list[type] = []
    for executor in graph.executors.values():
        for spec in executor.handlers:
            if spec.yields is None:
                return None
            kinds.extend(k for k in spec.yields if k not in kinds)
    return tuple(kinds)


def _class_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _plain_class_name(name: str) -> bool:
    return all(part.isidentifier() for part in name.replace("<locals>", "x").split("."))
