"""One superstep of a run: what its handlers stage, send and yield, and how it closed.

``WorkflowContext`` hands a handler's calls to its ``Superstep``; the superstep refuses them once
it is closed, encodes what it accepts and logs it through its ``Run``.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any, Literal

from kernel._base._errors import DefinitionError, StateWriteRejectedError
from kernel._define._graph import OutputKind
from kernel._log._events import (
    CustomEventAdded,
    ErrorInfo,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    InfoRequested,
    MessageStaged,
    OutputYielded,
    StateStaged,
)
from kernel._log._requests import PendingRequest
from kernel._run._algo import Delivery, Router, Sent
from kernel._run._emit import FRAMEWORK_EVENT_TYPES, WorkflowEvent, WorkflowEventSource

if TYPE_CHECKING:
    from kernel._run._runner import Run

__all__ = ["Superstep", "SuperstepOutcome"]

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


class Superstep:
    """One superstep of a run: its staged writes, messages and outputs, and whether it is closed."""

    def __init__(self, run: Run, index: int, superstep_id: str) -> None:
        self._run = run
        self.router: Router = run.router
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
        # What every event of the superstep's hot path needs, made once per superstep.
        self._codec = run.codec
        self._record = run.record
        self._staged_head = run.head(StateStaged, superstep_id)
        self.invoked_head = run.head(ExecutorInvoked, superstep_id)
        self.completed_head = run.head(ExecutorCompleted, superstep_id)

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def instance_id(self) -> str:
        return self._run.instance.instance_id

    @property
    def run_kwargs(self) -> dict[str, Any]:
        return self._run.kwargs

    def _refuse_if_closed(self, executor_id: str, what: str) -> None:
        if self.outcome is None and self.inline_task is not None and self.inline_task.cancelling():
            # The handler runs in the run's own task, and that task is being cancelled.
            self.outcome = SuperstepOutcome(self._run.cancel_reason or "cancelled")
        if self.outcome is not None:
            raise StateWriteRejectedError(
                f"{what} by executor {executor_id!r} refused: superstep {self.index} "
                f"({self.superstep_id}) of run {self.run_id} is already {self.outcome}; "
                "it will never count"
            )

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
        wire = self._run.instance.committed(key, _MISSING)
        return default if wire is _MISSING else self._run.codec.decode(wire)

    async def route(self, source: str, message: Any, target_id: str | None) -> Delivery:
        """Where ``message`` goes (conditions evaluated, async ones awaited); refused if closed."""
        self._refuse_if_closed(source, "message")
        delivery = await self.router.route(source, message, target_id)
        self._refuse_if_closed(source, "message")  # it may have closed while routing
        return delivery

    def send(self, source: str, message: Any, target_id: str | None, delivery: Delivery) -> None:
        """Stage ``message``, routed to ``delivery`` (from ``router.cached`` or ``route``)."""
        if self.outcome is not None or self.inline_task is not None:
            self._refuse_if_closed(source, "message")
        wire = self._codec.encode(message, what=f"message from {source!r}")
        dropped = delivery.dropped  # a drop is recorded, and never delivered
        self._record(
            MessageStaged,
            {
                **self._run.head(MessageStaged, self.superstep_id),
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

    def output(self, executor_id: str, value: Any, designation: OutputKind | None = None) -> None:
        """Stage a yielded value, designated as the graph says (or as ``designation`` says: a
        sub-workflow's intermediate outputs stay intermediate in its parent)."""
        self._refuse_if_closed(executor_id, "output")
        wire = self._run.codec.encode(value, what=f"output of {executor_id!r}")
        kind = designation or self.router.graph.outputs.classify(executor_id)
        self._run.log(
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
        run = self._run
        payload = event.data
        error = None
        if isinstance(payload, BaseException):
            error, wire = ErrorInfo.of(payload), None
        else:
            wire = run.codec.encode(payload, what=f"data of the {kind!r} event of {executor_id!r}")
        run.log(
            CustomEventAdded,
            superstep_id=self.superstep_id,
            executor_id=executor_id,
            event_type=kind,
            data=wire,
            error=error,
        )
        shown = event.replace(
            run_id=run.run_id,
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
        run = self._run
        wire = run.codec.encode(data, what=f"request of {executor_id!r}")
        if request_id is None:
            request_id = run.instance.new_id()
        name = _type_name(response_type)
        run.log(
            InfoRequested,
            superstep_id=self.superstep_id,
            request_id=request_id,
            executor_id=executor_id,
            data=wire,
            response_type=name,
        )
        self.requested.append(
            PendingRequest(request_id, executor_id, data, name, run.run_id, self.superstep_id)
        )
        return request_id

    def fail(self, executor_id: str, error: BaseException) -> None:
        """Record an executor's failure; the first one closes the superstep."""
        self.in_flight.discard(executor_id)
        self._run.log(
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
