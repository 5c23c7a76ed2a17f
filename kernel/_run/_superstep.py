"""One superstep of a run: what its handlers stage, send and yield, and how it closed.

``WorkflowContext`` hands a handler's calls to its ``Superstep`` (which implements the definition
layer's ``SuperstepPort``); the superstep refuses them once it is closed, encodes what it accepts
and logs it through the sink its run handed it, a ``RunScope``. It never holds the run: as
LangGraph's task runner is handed ``submit`` and ``put_writes``, a superstep is handed the
callables that log, and the values it reads.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kernel._base._errors import DefinitionError, StateWriteRejectedError
from kernel._define._graph import Graph, OutputKind
from kernel._define._stream import FRAMEWORK_EVENT_TYPES, WorkflowEvent, WorkflowEventSource
from kernel._log._events import (
    AbortReason,
    CustomEventAdded,
    ErrorInfo,
    EventBase,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    InfoRequested,
    MessageStaged,
    OutputYielded,
    StateStaged,
    StepRecorded,
)
from kernel._log._requests import PendingRequest
from kernel._run._algo import Delivery, Router, Sent
from kernel._run._emit import silent
from kernel._run._hooks import HookChain, SuperstepInfo
from kernel._run._steps import StepBook, StepsHost

if TYPE_CHECKING:
    from kernel._run._instance import RunnerContext

__all__ = ["RunScope", "Superstep", "SuperstepOutcome"]

_MISSING = object()


class SuperstepOutcome(enum.Enum):
    """How a superstep closed: committed, or aborted for one of the ``AbortReason``s."""

    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"
    CRASHED = "crashed"

    def __str__(self) -> str:
        return "committed" if self is SuperstepOutcome.COMMITTED else f"aborted ({self.value})"


@dataclass(frozen=True, slots=True, eq=False)
class RunScope:
    """What a run hands each of its supersteps, made once per run: who the run is, where it runs,
    and the sink for what its supersteps stage. Never the run itself.

    ``log(cls, **fields)`` buffers the run's next event (``run_id`` set; appended at once in
    "write" durability). ``record(cls, data)`` does the same on a superstep's hot path, for
    ``data`` made from ``head(cls, superstep_id)`` (every field of the event but its position
    and time). ``cancel_reason()`` is why the run is being cancelled, if it is (None: by its
    caller). ``hooks`` are the run's hooks (None: none). ``append_now(cls, data, superstep_id)``
    appends an event at once (with what is buffered before it) while that superstep is open in the
    log, and returns (an awaitable of) its position once it is durable (None once its closing is
    logged); ``steps`` is the book of the
    lineage's recorded steps, and ``emit`` hands the stream an event.
    """

    run_id: str
    instance: RunnerContext
    kwargs: dict[str, Any]
    router: Router
    hooks: HookChain | None
    log: Callable[..., None]
    record: Callable[[type[EventBase], dict[str, Any]], None]
    head: Callable[[type[EventBase], str], dict[str, Any]]
    cancel_reason: Callable[[], AbortReason | None]
    append_now: Callable[[type[EventBase], dict[str, Any], str], Awaitable[int | None]]
    steps: StepBook
    emit: Any


class Superstep:
    """One superstep of a run: its staged writes, messages and outputs, and whether it is closed.

    Besides ``SuperstepPort`` (what a handler's context calls), an executor that runs a nested
    run in the superstep (``WorkflowExecutor``, through ``port_of(ctx)``) reads ``host`` (the
    instance the run runs on: its store, settings and hooks), ``graph`` and ``info``, logs the
    facts of the superstep with ``log`` and stages outputs with a designation of its own
    (``output``).
    """

    def __init__(self, scope: RunScope, index: int, superstep_id: str) -> None:
        self._scope = scope
        self.router: Router = scope.router
        self.run_id = scope.run_id
        self.instance_id = scope.instance.instance_id
        self.index = index
        self.superstep_id = superstep_id
        self.outcome: SuperstepOutcome | None = None  # None while open
        self.staged: dict[str, tuple[str, Any]] = {}
        self.sent: list[Sent] = []
        self.outputs: list[tuple[str, Any, OutputKind]] = []  # executor, value, designation
        self.requested: list[PendingRequest] = []
        self.custom: list[tuple[int, WorkflowEvent]] = []  # (outputs yielded before it, event)
        self.failure: tuple[str, BaseException] | None = None
        self.in_flight: set[str] = set()
        self.cancelling = False
        self.inline_task: asyncio.Task[Any] | None = None
        self._info: SuperstepInfo | None = None
        self.hooks = scope.hooks
        # Hook errors of ``message_sent``, by sender: its handler fails with them when it returns.
        self.hook_failures: dict[str, BaseException] = {}
        # What every event of the superstep's hot path needs, made once per superstep.
        self._codec = scope.instance.codec
        self._record = scope.record
        self._staged_head = scope.head(StateStaged, superstep_id)
        self._sent_head = scope.head(MessageStaged, superstep_id)
        self.invoked_head = scope.head(ExecutorInvoked, superstep_id)
        self.completed_head = scope.head(ExecutorCompleted, superstep_id)

    @property
    def run_kwargs(self) -> dict[str, Any]:
        return self._scope.kwargs

    @property
    def streaming(self) -> bool:
        return self._scope.emit is not silent

    @property
    def info(self) -> SuperstepInfo:
        """The superstep as hooks see it (made when first asked: a run without hooks never
        does)."""
        info = self._info
        if info is None:
            info = self._info = SuperstepInfo(
                self.instance_id, self.run_id, self.index, self.superstep_id
            )
        return info

    # -- for an executor that runs a nested run in this superstep ----------------------------

    @property
    def host(self) -> RunnerContext:
        """The instance the run runs on (a nested run is logged in its store)."""
        return self._scope.instance

    @property
    def graph(self) -> Graph:
        """The graph of the running workflow."""
        return self.router.graph

    def log(self, cls: type[EventBase], **fields: Any) -> None:
        """Log a fact of this superstep (``SubworkflowRan``): ``superstep_id`` is set, and like
        everything the superstep stages it counts only if the superstep commits. Refused by
        nothing, not even a closed superstep: it records what happened."""
        self._scope.log(cls, superstep_id=self.superstep_id, **fields)

    # -- recorded steps --------------------------------------------------------------------

    def steps_host(self, executor_id: str, scope: Any) -> StepsHost:
        """The host of ``executor_id``'s recorded steps in this superstep."""
        run = self._scope
        superstep_id = self.superstep_id

        async def append_now(data: dict[str, Any]) -> int | None:
            if self.outcome is SuperstepOutcome.COMMITTED:
                return None  # its commit batch is sealed, and may be on its way to the store
            return await run.append_now(StepRecorded, data, superstep_id)

        live = run.instance.live_steps
        return StepsHost(
            self, executor_id, scope, run.steps, append_now, run.emit, self._codec, live
        )

    def step_head(self) -> dict[str, Any]:
        """What every ``StepRecorded`` of this superstep has alike."""
        return self._scope.head(StepRecorded, self.superstep_id)

    def record_served(self, data: dict[str, Any]) -> None:
        """Stage the note that a step call was served from the log (``reused``): it is no work
        done, so it goes in with the superstep's other events."""
        self._record(StepRecorded, data)

    def refuse_if_closed(self, executor_id: str, what: str) -> None:
        """Raise ``StateWriteRejectedError`` if the superstep is closed."""
        self._refuse_if_closed(executor_id, what)

    def closed_error(self, executor_id: str, what: str) -> StateWriteRejectedError:
        """The refusal of ``what`` by ``executor_id`` once the superstep closed."""
        return StateWriteRejectedError(
            f"{what} by executor {executor_id!r} refused: superstep {self.index} "
            f"({self.superstep_id}) of run {self.run_id} is already {self.outcome or 'closed'}; "
            "it will never count"
        )

    # -- what a handler's context calls (``SuperstepPort``) ---------------------------------

    def _refuse_if_closed(self, executor_id: str, what: str) -> None:
        if self.outcome is None and self.inline_task is not None and self.inline_task.cancelling():
            # The handler runs in the run's own task, and that task is being cancelled.
            self.outcome = SuperstepOutcome(self._scope.cancel_reason() or "cancelled")
        if self.outcome is not None:
            raise self.closed_error(executor_id, what)

    def stage(self, executor_id: str, key: str, op: Literal["set", "delete"], value: Any) -> None:
        if self.outcome is not None or self.inline_task is not None:  # else open: no message
            self._refuse_if_closed(executor_id, f"write of state key {key!r}")
        if not isinstance(key, str) or not key:
            raise TypeError(f"state keys must be non-empty strings, got {key!r}")
        codec = self._codec
        if not key.isascii():
            codec.encode(key, what=f"the name of state key {key!r}")
        wire = None if op == "delete" else codec.encode(value, what=f"state key {key!r}")
        self._record(
            StateStaged,
            {**self._staged_head, "executor_id": executor_id, "key": key, "op": op, "value": wire},
        )
        self.staged[key] = (op, value)

    def read(self, key: str, default: Any) -> Any:
        staged = self.staged.get(key)
        if staged is not None:
            return default if staged[0] == "delete" else staged[1]
        wire = self._scope.instance.committed(key, _MISSING)
        return default if wire is _MISSING else self._codec.decode(wire)

    def send_routed(self, source: str, message: Any, target_id: str | None) -> bool:
        """Stage ``message`` if its route is cached (see ``Router.cached``); else False."""
        delivery = self.router.cached(source, message, target_id)
        if delivery is None:
            return False
        self.send(source, message, target_id, delivery)
        return True

    async def route_and_send(self, source: str, message: Any, target_id: str | None) -> None:
        """Route ``message`` (conditions evaluated, async ones awaited), then stage it; refused if
        closed, before routing or while it routed."""
        self._refuse_if_closed(source, "message")
        delivery = await self.router.route(source, message, target_id)
        self._refuse_if_closed(source, "message")  # it may have closed while routing
        self.send(source, message, target_id, delivery)

    def send(self, source: str, message: Any, target_id: str | None, delivery: Delivery) -> None:
        """Stage ``message``, routed to ``delivery``."""
        if self.outcome is not None or self.inline_task is not None:
            self._refuse_if_closed(source, "message")
        wire = self._codec.encode(message, what=f"message from {source!r}")
        dropped = delivery.dropped  # a drop is recorded, and never delivered
        self._record(
            MessageStaged,
            {
                **self._sent_head,
                "source": source,
                "target": target_id,
                "targets": list(delivery.logged),
                "message": wire,
                "gathered": (
                    {g.target: list(g.sources) for g in delivery.fan_ins}
                    if delivery.fan_ins
                    else {}
                ),
                "dropped": dropped,
            },
        )
        if dropped is None:
            self.sent.append(Sent(source, message, delivery))
            if self.hooks is not None:
                self._hook_sent(source, message, delivery.logged)

    def _hook_sent(self, source: str, message: Any, targets: tuple[str, ...]) -> None:
        """Call ``message_sent``; what it raises fails ``source`` once its handler returns (it is
        kept here, not raised into the handler, which could swallow it)."""
        assert self.hooks is not None
        try:
            self.hooks.message_sent(self.info, source, message, targets)
        except Exception as error:
            self.hook_failures.setdefault(source, error)

    def output(self, executor_id: str, value: Any, designation: OutputKind | None = None) -> None:
        """Stage a yielded value, designated as the graph says (or as ``designation`` says: a
        sub-workflow's intermediate outputs stay intermediate in its parent)."""
        self._refuse_if_closed(executor_id, "output")
        wire = self._codec.encode(value, what=f"output of {executor_id!r}")
        kind = designation or self.router.graph.outputs.classify(executor_id)
        self._scope.log(
            OutputYielded,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            value=wire,
            designation=kind,
        )
        self.outputs.append((executor_id, value, kind))

    def add_event(self, executor_id: str, event: WorkflowEvent) -> None:
        """Record a custom event; it reaches the caller once this superstep commits."""
        if not isinstance(event, WorkflowEvent):
            raise DefinitionError(
                f"executor {executor_id!r} added a {type(event).__qualname__} with add_event; "
                "it takes a WorkflowEvent, e.g. WorkflowEvent('progress', data)"
            )
        kind = event.type
        if not isinstance(kind, str) or not kind:
            raise DefinitionError(
                f"executor {executor_id!r} added an event whose type is {kind!r}: "
                "give it a non-empty str type"
            )
        if kind in FRAMEWORK_EVENT_TYPES:
            hint = "use ctx.yield_output" if kind in ("output", "intermediate") else "pick another"
            raise DefinitionError(
                f"executor {executor_id!r} added a {kind!r} event: that type is the runner's "
                f"own ({hint}); a custom event needs a type of its own, e.g. 'progress'"
            )
        self._refuse_if_closed(executor_id, f"{kind!r} event")
        payload = event.data
        error = None
        if isinstance(payload, BaseException):
            error, wire = ErrorInfo.of(payload), None
        else:
            wire = self._codec.encode(
                payload, what=f"data of the {kind!r} event of {executor_id!r}"
            )
        self._scope.log(
            CustomEventAdded,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            event_type=kind,
            data=wire,
            error=error,
        )
        shown = event.replace(
            run_id=self.run_id,
            superstep=self.index,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            origin=WorkflowEventSource.EXECUTOR,
        )
        self.custom.append((len(self.outputs), shown))

    def request(
        self, executor_id: str, data: Any, response_type: Any, request_id: str | None = None
    ) -> str:
        """Stage a request for input; return its id. Refused (``DefinitionError``) unless the
        executor has a response handler for the request's type and ``response_type``."""
        self._refuse_if_closed(executor_id, "request")
        executor = self.router.graph.executors[executor_id]
        wanted = response_type if isinstance(response_type, type) else None
        if not any(
            spec.takes_request(data)
            and (wanted is None or spec.responses is None or issubclass(wanted, spec.responses))
            for spec in executor.response_handlers
        ):
            raise DefinitionError(
                f"executor {executor_id!r} requested a {type(data).__qualname__} answered by "
                f"{_type_name(response_type)}, but has no @response_handler taking them"
            )
        scope = self._scope
        wire = self._codec.encode(data, what=f"request of {executor_id!r}")
        if request_id is None:
            request_id = scope.instance.new_id()
        name = _type_name(response_type)
        scope.log(
            InfoRequested,
            superstep_id=self.superstep_id,
            request_id=request_id,
            executor_id=executor_id,
            data=wire,
            response_type=name,
        )
        self.requested.append(
            PendingRequest(request_id, executor_id, data, name, self.run_id, self.superstep_id)
        )
        return request_id

    def fail(self, executor_id: str, error: BaseException) -> None:
        """Record an executor's failure; the first one closes the superstep."""
        self.in_flight.discard(executor_id)
        self._scope.log(
            ExecutorFailed,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            error=ErrorInfo.of(error),
        )
        if self.failure is None:
            self.failure = (executor_id, error)
            self.outcome = SuperstepOutcome.FAILED


def _type_name(kind: Any) -> str:
    """How a response type is named in the log: ``module.Qualname``, or its repr."""
    if kind is None:
        return ""
    if isinstance(kind, str):
        return kind  # a name already (a sub-workflow's request, passed on)
    if isinstance(kind, type):
        module = kind.__module__
        return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return repr(kind)
