"""``RunContext``: what a functional workflow's function (and its steps) may ask of its run.

Agent Framework's ``RunContext`` in shape: ``request_info`` (human input), ``add_event``,
``get_state`` / ``set_state`` and ``is_streaming``. A context made by the runner is bound to one
*segment* (one execution of the function, in one superstep: see ``kernel._ops._segment``) and
hands every call to it, through ``SegmentPort``; a context made by hand (``RunContext("name")``)
keeps its state in a dict, so that a step can be called with one outside any run, as in AF.

``Interrupted`` is how ``request_info`` stops the function when its answer is not known yet: a
``BaseException``, so that ``except Exception`` in the function does not swallow it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol, Union

from kernel._base._errors import WorkflowArgumentError
from kernel._define._signatures import matches
from kernel._define._step import step_key
from kernel._define._stream import WorkflowEvent

__all__ = [
    "ACTIVE_RUN_CONTEXT",
    "Interrupted",
    "RunContext",
    "SegmentPort",
    "coerce_response",
    "get_run_context",
]

ACTIVE_RUN_CONTEXT: ContextVar[RunContext | None] = ContextVar("steplog_run_context", default=None)
"""The context of the functional workflow running in this context (None: none)."""

RESERVED_PREFIX = "_"


class Interrupted(BaseException):
    """``request_info`` asked for an answer the run does not have yet: the function stops here,
    and its segment ends waiting for input. Never raised out of a run."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"the workflow waits for a response to request {request_id!r}")
        self.request_id = request_id


class SegmentPort(Protocol):
    """What a bound ``RunContext`` hands its calls to: the segment it belongs to."""

    streaming: bool

    @property
    def run_kwargs(self) -> dict[str, Any]: ...

    async def request_info(self, data: Any, response_type: Any, request_id: str | None) -> Any: ...

    async def add_event(self, event: WorkflowEvent[Any]) -> None: ...

    def get_state(self, key: str, default: Any) -> Any: ...

    def set_state(self, key: str, value: Any) -> None: ...


class RunContext:
    """The handle of a functional workflow's function (``@workflow``) on its run: human input,
    custom events and workflow state. It is injected into a parameter annotated ``RunContext``
    or named ``ctx`` (in the function, and in a ``@step``), and ``get_run_context()`` returns it
    anywhere inside the run.

    * ``await request_info(data, response_type, request_id=None)`` returns the answer to the
      request, once given: the first time, the run stops there and waits for input
      (``run(responses={request_id: value})``); the function then runs again from the top, its
      recorded steps are served from the log, and this call returns the answer, converted to
      ``response_type`` as AF converts it (a mapping into a dataclass or pydantic model, an int
      into a float, lists into tuples and sets). Without ``request_id`` the id is
      ``auto::N``, N counting the automatic ids in call order. A wrong type raises
      ``WorkflowArgumentError`` (a ``ValueError``).
    * ``get_state(key, default)`` / ``set_state(key, value)``: the instance's workflow state,
      staged like a handler's writes: they count only if the segment commits (see
      docs/porting.md, "Functional workflows"). Keys starting with ``_`` are refused
      (``WorkflowArgumentError``), as AF refuses them.
    * ``await add_event(event)`` adds a custom event; AF's ``output`` and ``intermediate``
      events are the function's outputs (``intermediate`` ones designated so).
    * ``is_streaming()``, ``run_kwargs``, and ``step_key`` (the idempotency key of the recorded
      step running now).

    ``RunContext(workflow_name)`` made by hand keeps its state in a dict and has no run:
    ``request_info`` raises ``RuntimeError`` there.
    """

    __steplog_run_context__ = True  # a @step parameter annotated with it receives the context

    def __init__(
        self,
        workflow_name: str,
        *,
        streaming: bool = False,
        run_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.workflow_name = workflow_name
        self._streaming = streaming
        self._run_kwargs = dict(run_kwargs or {})
        self._segment: SegmentPort | None = None
        self._state: dict[str, Any] = {}
        self._events: list[WorkflowEvent[Any]] = []

    @classmethod
    def bound(cls, workflow_name: str, segment: SegmentPort) -> RunContext:
        """The context of a running segment."""
        ctx = cls(workflow_name)
        ctx._segment = segment
        return ctx

    async def request_info(
        self, request_data: Any, response_type: Any, *, request_id: str | None = None
    ) -> Any:
        """The answer to a request for input (see the class); raises ``RuntimeError`` outside a
        run, ``TypeError`` for a ``request_id`` that is not a non-empty ``str``."""
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise TypeError(f"request_id must be a non-empty str, got {request_id!r}")
        if self._segment is None:
            raise RuntimeError(
                "request_info needs a running functional workflow; this RunContext was made by hand"
            )
        return await self._segment.request_info(request_data, response_type, request_id)

    async def add_event(self, event: WorkflowEvent[Any]) -> None:
        """Add ``event`` to the run's stream (see the class)."""
        if self._segment is None:
            self._events.append(event)
            return
        await self._segment.add_event(event)

    def get_state(self, key: str, default: Any = None) -> Any:
        """The value of workflow state ``key`` (this segment's writes included), or
        ``default``."""
        if self._segment is None:
            return self._state.get(key, default)
        return self._segment.get_state(key, default)

    def set_state(self, key: str, value: Any) -> None:
        """Stage ``key = value``: it counts once the segment commits. Raises
        ``WorkflowArgumentError`` for a key starting with ``_`` (AF keeps those for itself)."""
        if isinstance(key, str) and key.startswith(RESERVED_PREFIX):
            raise WorkflowArgumentError(
                f"State key {key!r} starts with '_', which is reserved for framework "
                "bookkeeping in Agent Framework's functional workflows; steplog refuses it too, "
                "so that a workflow ported either way keeps its state. Use a key without the "
                "leading underscore."
            )
        if self._segment is None:
            self._state[key] = value
            return
        self._segment.set_state(key, value)

    def is_streaming(self) -> bool:
        """Whether the run was started with ``stream=True``."""
        return self._segment.streaming if self._segment is not None else self._streaming

    @property
    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the run (a continuation has its lineage's)."""
        if self._segment is None:
            return dict(self._run_kwargs)
        return self._segment.run_kwargs

    @property
    def step_key(self) -> str:
        """The idempotency key of the recorded step running now (``kernel.step_key()``):
        ``RuntimeError`` outside one."""
        return step_key()

    def __repr__(self) -> str:
        bound = "running" if self._segment is not None else "by hand"
        return f"RunContext({self.workflow_name!r}, {bound})"


def get_run_context() -> RunContext | None:
    """The ``RunContext`` of the functional workflow running here, or None outside one."""
    return ACTIVE_RUN_CONTEXT.get()


# -- answers, converted to the type asked for ------------------------------------------------


def coerce_response(value: Any, response_type: Any, request_id: str) -> Any:
    """``value`` converted to ``response_type`` where JSON lost the type (as AF converts a
    response), then checked against it. ``None`` is returned as it is (AF allows it). Raises
    ``WorkflowArgumentError`` when the value does not fit."""
    if value is None or response_type is None:
        return value
    converted = _convert(value, response_type)
    if not matches(converted, response_type):
        raise WorkflowArgumentError(
            f"Response type mismatch for request ID {request_id}: expected {response_type}, "
            f"got {type(value)}"
        )
    return converted


def _convert(value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` if a lossless conversion exists, else ``value`` unchanged."""
    if matches(value, kind):
        return value
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union or origin is types.UnionType:
        for member in args:
            converted = _convert(value, member)
            if matches(converted, member):
                return converted
        return value
    if origin is not None:
        return _convert_items(value, origin, args)
    if not isinstance(kind, type):
        return value
    if kind is float and type(value) is int:
        return float(value)
    if isinstance(value, Mapping):
        if dataclasses.is_dataclass(kind):
            return _dataclass_from(value, kind)
        validate = getattr(kind, "model_validate", None)
        if callable(validate):
            try:
                return validate(dict(value))
            except Exception:
                return value
    return value


def _convert_items(value: Any, origin: Any, args: tuple[Any, ...]) -> Any:
    """A list, tuple, set or dict ``value`` with its items converted to ``args``."""
    item = args[0] if args else Any
    if origin is list and isinstance(value, list):
        return [_convert(v, item) for v in value]
    if origin in (set, frozenset) and isinstance(value, list | set | frozenset):
        try:
            return origin(_convert(v, item) for v in value)
        except TypeError:  # an item that cannot be hashed: it was no set
            return value
    if origin is tuple and isinstance(value, list | tuple):
        kinds = (item,) * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(kinds) != len(value):
            return value
        return tuple(_convert(v, k) for v, k in zip(value, kinds, strict=True))
    if origin is dict and isinstance(value, Mapping):
        key_kind, value_kind = args if len(args) == 2 else (Any, Any)
        return {_convert(k, key_kind): _convert(v, value_kind) for k, v in value.items()}
    return value


def _dataclass_from(data: Mapping[str, Any], kind: type) -> Any:
    """The dataclass ``kind`` built from ``data``'s fields (each converted to its annotation);
    ``data`` unchanged if a field is unknown or the class refuses them."""
    try:
        hints = typing.get_type_hints(kind)
    except Exception:
        hints = {}
    names = {f.name for f in dataclasses.fields(kind) if f.init}
    fields: dict[str, Any] = {}
    for name, item in data.items():
        if name not in names:
            return data
        annotation = hints.get(name, Any)
        converted = _convert(item, annotation)
        if not matches(converted, annotation):
            return data
        fields[name] = converted
    try:
        return kind(**fields)
    except Exception:
        return data
