"""The vocabulary of a run's stream: ``WorkflowEvent``, its types, states and error details.

A handler adds its own events with ``ctx.add_event(WorkflowEvent(...))``, so the vocabulary belongs
to the definition layer; the runner's emitters that build and hand over the stream's events live
in ``kernel._run._emit``.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal

from typing_extensions import TypeVar

__all__ = [
    "FRAMEWORK_EVENT_TYPES",
    "WorkflowErrorDetails",
    "WorkflowEvent",
    "WorkflowEventSource",
    "WorkflowEventType",
    "WorkflowRunState",
]

DataT = TypeVar("DataT", default=Any)

WorkflowEventType = Literal[
    "started",
    "status",
    "superstep_started",
    "executor_invoked",
    "executor_completed",
    "executor_failed",
    "executor_bypassed",
    "output",
    "intermediate",
    "data",
    "request_info",
    "warning",
    "error",
    "superstep_completed",
    "failed",
    "cancelled",
    "completed",
    "awaiting_input",
    "group_chat",
    "handoff_sent",
    "magentic_orchestrator",
]
"""The ``type`` of the events steplog emits, and of the events AF names. A custom event added
with ``ctx.add_event`` may have any other type string too."""

FRAMEWORK_EVENT_TYPES: frozenset[str] = frozenset(
    {
        "started",
        "status",
        "superstep_started",
        "executor_invoked",
        "executor_completed",
        "executor_failed",
        "output",
        "intermediate",
        "request_info",
        "superstep_completed",
        "failed",
        "cancelled",
        "completed",
        "awaiting_input",
    }
)
"""The event types only the runner emits: ``ctx.add_event`` refuses them."""


class WorkflowRunState(enum.StrEnum):
    """Where a run stands, as its ``status`` events say (AF's names and values).

    A stream says ``IN_PROGRESS`` right after ``started``, ``IN_PROGRESS_PENDING_REQUESTS`` after
    the run's first ``request_info``, and at its end ``IDLE`` (completed),
    ``IDLE_WITH_PENDING_REQUESTS`` (waiting for responses) or ``FAILED``. ``STARTED`` and
    ``CANCELLED`` are never in a stream (a cancelled consumer reads no more events); ``CANCELLED``
    is the state of a run whose log ends cancelled, abandoned or crashed.
    """

    STARTED = "STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    IN_PROGRESS_PENDING_REQUESTS = "IN_PROGRESS_PENDING_REQUESTS"
    IDLE = "IDLE"
    IDLE_WITH_PENDING_REQUESTS = "IDLE_WITH_PENDING_REQUESTS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class WorkflowEventSource(enum.StrEnum):
    """Who made an event: the runner (``FRAMEWORK``) or an executor's code (``EXECUTOR``)."""

    FRAMEWORK = "FRAMEWORK"
    EXECUTOR = "EXECUTOR"


@dataclass(frozen=True)
class WorkflowErrorDetails:
    """A failure as ``failed`` and ``executor_failed`` events describe it (AF's fields).

    ``error_type`` is the exception's class name, ``message`` its text. ``traceback`` is always
    None: the log keeps the type and message only, and a replayed stream must equal the live one.
    """

    error_type: str
    message: str
    traceback: str | None = None
    executor_id: str | None = None
    extra: dict[str, Any] | None = None

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        *,
        include_sensitive_data: bool = True,
        executor_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> WorkflowErrorDetails:
        """The details of ``exc``; without sensitive data, the message is the class name."""
        name = type(exc).__name__
        message = str(exc) if include_sensitive_data else name
        return cls(name, message, None, executor_id, extra)


class _ErrorField:
    """``WorkflowEvent.error``: AF's factory on the class, steplog's field on an event."""

    def __get__(self, event: Any, owner: Any) -> Any:
        if event is None:
            return _error_event
        return event._error


def _error_event(exception: Exception) -> WorkflowEvent[Exception]:
    """``WorkflowEvent.error(exception)``: an ``error`` event (a non-fatal error of an executor)."""
    return WorkflowEvent("error", exception)


@dataclass(init=False, repr=False, eq=False)
class WorkflowEvent(Generic[DataT]):
    """What a streaming run yields, and what a ``RunResult`` holds: one class for every event,
    told apart by ``type`` (AF's unified event; ``WorkflowEvent[T]`` types its ``data``).

    ``data`` holds the output (``output``), the request (``request_info``), the message an
    executor received (``executor_invoked``) or the list of messages it sent
    (``executor_completed``, None if it sent none), the details of a failure
    (``executor_failed``), or a custom event's payload. ``state`` is set on ``status`` events,
    ``details`` on ``failed`` and ``executor_failed``. ``origin`` says whether the runner
    (``FRAMEWORK``) or an executor (``EXECUTOR``, the default) made it.

    steplog's fields say where: ``run_id``, ``superstep`` (AF's ``iteration``), ``superstep_id``,
    ``executor_id``; ``error`` is the exception of ``executor_failed`` and ``failed``;
    ``request_id`` is what a response answers (None on other events). A run that ends with
    requests unanswered ends with ``awaiting_input`` instead of ``completed``; either is followed
    by the final ``status``. Events compare equal when their fields are equal.

    Build custom events with the constructor or a factory (``WorkflowEvent("progress", 50)``,
    ``WorkflowEvent.warning("low")``) and hand them to ``ctx.add_event``.
    """

    __slots__ = (
        "_error",
        "_request_type",
        "_response_type",
        "data",
        "details",
        "executor_id",
        "origin",
        "request_id",
        "run_id",
        "state",
        "superstep",
        "superstep_id",
        "type",
    )

    _COMPARED: ClassVar[tuple[str, ...]] = (
        "type",
        "run_id",
        "superstep",
        "superstep_id",
        "executor_id",
        "data",
        "error",
        "request_id",
        "state",
        "details",
        "origin",
    )

    type: str
    data: DataT
    run_id: str | None
    superstep: int | None
    superstep_id: str | None
    executor_id: str | None
    request_id: str | None
    state: WorkflowRunState | None
    details: WorkflowErrorDetails | None
    origin: WorkflowEventSource
    # Not fields: the codec stores an event (a sub-workflow's request carries one) by its
    # fields, and a type or an exception is not storable.
    if TYPE_CHECKING:
        _error: BaseException | None
        _request_type: builtins.type[Any] | None
        _response_type: builtins.type[Any] | str | None

    def __init__(
        self,
        type: WorkflowEventType | str,
        data: DataT | None = None,
        *,
        origin: WorkflowEventSource | None = None,
        state: WorkflowRunState | None = None,
        details: WorkflowErrorDetails | None = None,
        executor_id: str | None = None,
        request_id: str | None = None,
        source_executor_id: str | None = None,
        request_type: builtins.type[Any] | None = None,
        response_type: builtins.type[Any] | str | None = None,
        iteration: int | None = None,
        run_id: str | None = None,
        superstep: int | None = None,
        superstep_id: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        put = object.__setattr__
        put(self, "type", type)
        put(self, "data", data)
        put(self, "origin", origin if origin is not None else WorkflowEventSource.EXECUTOR)
        put(self, "state", state)
        put(self, "details", details)
        put(self, "executor_id", executor_id if executor_id is not None else source_executor_id)
        put(self, "request_id", request_id)
        put(self, "superstep", superstep if superstep is not None else iteration)
        put(self, "run_id", run_id)
        put(self, "superstep_id", superstep_id)
        put(self, "_error", error)
        if request_type is None and type == "request_info":
            request_type = builtins.type(data)
        put(self, "_request_type", request_type)
        put(self, "_response_type", response_type)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"WorkflowEvent is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"WorkflowEvent is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkflowEvent):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._COMPARED)

    __hash__ = None  # type: ignore[assignment]  # data may be anything

    def __copy__(self) -> WorkflowEvent[DataT]:
        clone = object.__new__(type(self))
        for name in WorkflowEvent.__slots__:
            object.__setattr__(clone, name, getattr(self, name))
        extra = getattr(self, "__dict__", None)
        if extra is not None:  # a subclass's own attributes
            object.__setattr__(clone, "__dict__", dict(extra))
        return clone

    def replace(self, **fields: Any) -> WorkflowEvent[DataT]:
        """A copy (of the same class) with ``fields`` changed."""
        clone = self.__copy__()
        for name, value in fields.items():
            slot = "_error" if name == "error" else name
            if slot not in WorkflowEvent.__slots__ or slot.startswith("_r"):
                raise TypeError(f"WorkflowEvent has no field {name!r}")
            object.__setattr__(clone, slot, value)
        return clone

    def __repr__(self) -> str:
        parts = [f"type={self.type!r}"]
        for name in ("state", "executor_id", "superstep", "request_id", "data", "error"):
            value = getattr(self, name)
            if value is not None:
                shown = value.value if isinstance(value, enum.Enum) else value
                parts.append(f"{name}={shown!r}")
        return f"WorkflowEvent({', '.join(parts)})"

    # -- AF's accessors ----------------------------------------------------------------------

    @property
    def iteration(self) -> int | None:
        """AF's name for ``superstep``: the index of the event's superstep, from 1."""
        return self.superstep

    @property
    def source_executor_id(self) -> str:
        """The executor that made a ``request_info`` event's request (``RuntimeError`` on other
        events, as AF)."""
        if self.type != "request_info" or self.executor_id is None:
            raise self._not_a_request("source_executor_id")
        return self.executor_id

    @property
    def request_type(self) -> builtins.type[Any]:
        """The type of a ``request_info`` event's data (``RuntimeError`` on other events)."""
        if self.type != "request_info" or self._request_type is None:
            raise self._not_a_request("request_type")
        return self._request_type

    @property
    def response_type(self) -> builtins.type[Any] | str:
        """The response type a ``request_info`` event asked for: the type, in a live stream; its
        recorded name (``module.Qualname``), when rebuilt from the log (``RuntimeError`` on
        other events)."""
        if self.type != "request_info" or self._response_type is None:
            raise self._not_a_request("response_type")
        return self._response_type

    def _not_a_request(self, name: str) -> RuntimeError:
        """The error of reading ``name``, a field of ``request_info`` events only, on this one."""
        return RuntimeError(f"{name} is only set on request_info events, not on {self.type!r}")

    # -- AF's factories ----------------------------------------------------------------------

    @classmethod
    def started(cls, data: Any = None) -> WorkflowEvent[Any]:
        return cls("started", data)

    @classmethod
    def status(cls, state: WorkflowRunState, data: Any = None) -> WorkflowEvent[Any]:
        return cls("status", data, state=state)

    @classmethod
    def failed(cls, details: WorkflowErrorDetails, data: Any = None) -> WorkflowEvent[Any]:
        return cls("failed", data, details=details)

    @classmethod
    def warning(cls, message: str) -> WorkflowEvent[str]:
        return WorkflowEvent("warning", message)

    error = _ErrorField()
    """On an event: the exception of ``executor_failed`` and ``failed`` (None on others). On the
    class, AF's factory: ``WorkflowEvent.error(exception)`` is an ``error`` event, a non-fatal
    error an executor reports; added with ``ctx.add_event``, the log keeps the exception's type
    and message, and a replay gives it back as a ``RecordedError``."""

    @classmethod
    def emit(cls, executor_id: str, data: Any) -> WorkflowEvent[Any]:
        """A ``data`` event (AF's older way to stream intermediate results)."""
        return cls("data", data, executor_id=executor_id)

    @classmethod
    def request_info(
        cls,
        request_id: str,
        source_executor_id: str,
        request_data: Any,
        response_type: builtins.type[Any] | str,
    ) -> WorkflowEvent[Any]:
        return cls(
            "request_info",
            request_data,
            request_id=request_id,
            source_executor_id=source_executor_id,
            response_type=response_type,
        )

    @classmethod
    def superstep_started(cls, iteration: int, data: Any = None) -> WorkflowEvent[Any]:
        return cls("superstep_started", data, iteration=iteration)

    @classmethod
    def superstep_completed(cls, iteration: int, data: Any = None) -> WorkflowEvent[Any]:
        return cls("superstep_completed", data, iteration=iteration)

    @classmethod
    def executor_invoked(cls, executor_id: str, data: Any = None) -> WorkflowEvent[Any]:
        return cls("executor_invoked", data, executor_id=executor_id)

    @classmethod
    def executor_completed(cls, executor_id: str, data: Any = None) -> WorkflowEvent[Any]:
        return cls("executor_completed", data, executor_id=executor_id)

    @classmethod
    def executor_failed(
        cls, executor_id: str, details: WorkflowErrorDetails
    ) -> WorkflowEvent[WorkflowErrorDetails]:
        return WorkflowEvent("executor_failed", details, executor_id=executor_id, details=details)

    @classmethod
    def executor_bypassed(cls, executor_id: str, data: Any = None) -> WorkflowEvent[Any]:
        return cls("executor_bypassed", data, executor_id=executor_id)
