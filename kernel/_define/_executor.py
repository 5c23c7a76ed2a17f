"""Executors: the nodes of a workflow graph, and the ``@handler`` and ``@executor`` decorators.

A handler is an async method ``(self, message: T, ctx: WorkflowContext[Out, WorkflowOut])``. A
function executor is a function ``(message: T)`` or ``(message: T, ctx: WorkflowContext[...])``,
async or not: a sync one runs in a worker thread, and its ``ctx`` calls run on the event loop.

The message annotation (or ``input=``) decides which messages a handler receives; the
``WorkflowContext`` parameters (or ``output=`` and ``workflow_output=``) declare what it may send
and yield, which ``build()`` uses to reject edges that can never deliver. Each explicit type
overrides its own annotation only; ``input=``, ``output=`` and ``workflow_output=`` take a type, a
union, or its text (``"Order | None"``, resolved in the function's module).

When each mistake is refused (always a ``DefinitionError``, which is also a ``ValueError``):

- a bad signature (parameters, a missing annotation, a ``ctx`` that is not a ``WorkflowContext``,
  a type variable): when the handler is defined (``@handler``, ``@executor``,
  ``FunctionExecutor(...)``);
- annotations that name a class not defined yet, two handlers for the same type, no handler at
  all: when the executor is made (``Executor.__init__``);
- a declared type whose values can never be stored in the log: by ``build()`` (the classes are
  all defined by then), see ``check_storable_types``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast, overload

from kernel._base._errors import DefinitionError
from kernel._codec._valuetypes import storable_hint, unstorable_class
from kernel._define._context import WorkflowContext
from kernel._define._signatures import (
    HandlerOptions,
    HandlerSpec,
    ResponseHandlerSpec,
    ResponseOptions,
    handler_spec,
    refuse_descriptor,
    response_spec,
    type_name,
)
from kernel._log._requests import Response

__all__ = [
    "HANDLER_MARK",
    "Executor",
    "WorkflowMessage",
    "check_storable_types",
    "handler",
    "response_handler",
]

HANDLER_MARK = "__steplog_handler__"
_RESPONSE_MARK = "__steplog_response_handler__"
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class WorkflowMessage:
    """A message with where it came from, as ``can_handle`` takes it (AF's ``WorkflowMessage``).

    ``Executor.can_handle`` takes either a bare message or one of these, and looks at ``data``.
    """

    data: Any
    source_id: str
    target_id: str | None = None


@overload
def response_handler(func: F, /) -> F: ...
@overload
def response_handler(
    *, request: Any = None, response: Any = None, output: Any = None, workflow_output: Any = None
) -> Callable[[F], F]: ...


def response_handler(
    func: F | None = None,
    /,
    *,
    request: Any = None,
    response: Any = None,
    output: Any = None,
    workflow_output: Any = None,
) -> F | Callable[[F], F]:
    """Mark an async method ``(self, original_request: Req, response: Resp, ctx)`` of an
    ``Executor`` as the handler of responses to its ``ctx.request_info`` requests.

    The annotations of ``original_request`` and ``response`` (or ``request=`` and
    ``response=``) decide which requests and responses it takes; a response of another type is
    refused when it is given (``ResponseError``). ``output=`` and ``workflow_output=`` override
    what ``ctx``'s annotation says it sends and yields. A bad signature raises
    ``DefinitionError`` here, when the class is defined.
    """

    def mark(fn: F) -> F:
        refuse_descriptor(fn, "@response_handler")
        if not inspect.iscoroutinefunction(cast(Any, fn)):
            raise DefinitionError(
                f"response handler {fn.__qualname__} must be an async function (async def)"
            )
        options = ResponseOptions(request, response, output, workflow_output)
        response_spec(fn.__name__, fn, options, strict=False)
        setattr(fn, _RESPONSE_MARK, options)
        return fn

    return mark(func) if func is not None else mark


@overload
def handler(func: F, /) -> F: ...
@overload
def handler(
    *, input: Any = None, output: Any = None, workflow_output: Any = None
) -> Callable[[F], F]: ...


def handler(
    func: F | None = None, /, *, input: Any = None, output: Any = None, workflow_output: Any = None
) -> F | Callable[[F], F]:
    """Mark an async method ``(self, message: T, ctx: WorkflowContext[U, V])`` of an
    ``Executor`` as a message handler.

    The message type comes from the annotation of the message parameter, or from ``input=``
    (several types as a union, or as text resolved in the method's module); ``output=`` and
    ``workflow_output=`` override what ``ctx``'s annotation says it sends and yields.

    Raises ``DefinitionError`` (a ``ValueError``) right away, when the class is defined, for a
    method that is not async, that does not take ``(message, ctx)``, whose message has no type
    (annotate it, ``Any`` for anything, or give ``input=``), whose ``ctx`` is not annotated as a
    ``WorkflowContext`` (unless explicit types are given), or whose types hold a type variable.

    >>> from kernel import WorkflowContext
    >>> class Upper(Executor):
    ...     @handler
    ...     async def run(self, text: str, ctx: WorkflowContext[str]) -> None:
    ...         await ctx.send_message(text.upper())
    >>> Upper("upper").input_types, Upper("upper").output_types
    ([<class 'str'>], [<class 'str'>])
    """

    def mark(fn: F) -> F:
        refuse_descriptor(fn, "@handler")
        if not inspect.iscoroutinefunction(cast(Any, fn)):
            raise DefinitionError(
                f"handler {fn.__qualname__} must be an async function (async def); a sync "
                "function can be an executor of its own with @executor (it runs in a worker "
                "thread)"
            )
        options = HandlerOptions(input, output, workflow_output)
        handler_spec(fn.__name__, fn, options, method=True, strict=False)  # checks what it can now
        setattr(fn, HANDLER_MARK, options)
        return fn

    return mark(func) if func is not None else mark


class Executor:
    """A node of the workflow graph. Subclass it and decorate async methods with ``@handler``.

    ``type`` (or ``type_``) names the kind of executor in ``to_dict()``; it defaults to the class
    name. The handlers are resolved here, so a missing handler, two handlers for one type or an
    annotation that cannot be resolved raise ``DefinitionError`` when the executor is made.
    """

    handlers_are_alternatives: ClassVar[bool] = False
    """Whether the handlers are alternative ways in, of which a workflow uses some (an
    ``AgentExecutor`` takes a request, another agent's response, a text, a message or a list):
    ``build()`` then does not require an incoming edge to feed each handler, only that what each
    edge carries has a handler (the edge check)."""

    def __init__(self, id: str, *, type: str | None = None, type_: str | None = None) -> None:
        if not isinstance(id, str) or not id:
            raise DefinitionError(f"an executor id must be a non-empty string, got {id!r}")
        require_storable(id, "an executor id")
        self.id = id
        self.type = type or type_ or self.__class__.__name__
        self._handlers: list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]] | None = None
        self._response_handlers: (
            list[tuple[ResponseHandlerSpec, Callable[..., Awaitable[Any]]]] | None
        ) = None
        self._resolved()
        self.response_handlers  # noqa: B018 - resolves them, raising DefinitionError now

    @property
    def handlers(self) -> list[HandlerSpec]:
        """The executor's handlers, resolved from their annotations."""
        return [spec for spec, _ in self._resolved()]

    @property
    def input_types(self) -> list[Any]:
        """The message types the handlers take, as declared (one entry per handler)."""
        return _unique(spec.input_type for spec in self.handlers)

    @property
    def output_types(self) -> list[Any]:
        """The types the handlers (and response handlers) declare they send, union members
        apart; ``[]`` when none declares any."""
        specs: list[HandlerSpec | ResponseHandlerSpec] = [*self.handlers]
        specs.extend(self.response_handlers)
        return _unique(t for spec in specs for t in spec.output_types)

    @property
    def workflow_output_types(self) -> list[Any]:
        """The types the handlers (and response handlers) declare they yield as workflow
        outputs, union members apart; ``[]`` when none declares any."""
        specs: list[HandlerSpec | ResponseHandlerSpec] = [*self.handlers]
        specs.extend(self.response_handlers)
        return _unique(t for spec in specs for t in spec.workflow_output_types)

    def _resolved(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]]:
        if self._handlers is None:
            found = self._discover()
            if not found:
                raise DefinitionError(
                    f"executor {self.id!r} ({self.__class__.__qualname__}) has no @handler "
                    "methods: decorate an async method (self, message: T, ctx: WorkflowContext) "
                    "with @handler"
                )
            _refuse_duplicates(self, [spec for spec, _ in found])
            self._handlers = found
        return self._handlers

    def _discover(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]]:
        found = []
        seen: set[str] = set()
        for cls in self.__class__.__mro__:
            for name, member in vars(cls).items():
                options = getattr(member, HANDLER_MARK, None)
                if options is None or name in seen:
                    continue
                seen.add(name)
                spec = handler_spec(name, member, options, method=True, strict=True)
                assert spec is not None
                found.append((spec, getattr(self, name)))
        return found

    @property
    def response_handlers(self) -> list[ResponseHandlerSpec]:
        """The executor's ``@response_handler`` methods, resolved from their annotations."""
        if self._response_handlers is None:
            found = []
            seen: set[str] = set()
            for cls in self.__class__.__mro__:
                for name, member in vars(cls).items():
                    options = getattr(member, _RESPONSE_MARK, None)
                    if options is None or name in seen:
                        continue
                    seen.add(name)
                    spec = response_spec(name, member, options, strict=True)
                    assert spec is not None
                    found.append((spec, getattr(self, name)))
            self._response_handlers = found
        return [spec for spec, _ in self._response_handlers]

    def can_handle(self, message: object) -> bool:
        """Whether some handler accepts ``message`` (a bare message or a ``WorkflowMessage``)."""
        if isinstance(message, WorkflowMessage):
            message = message.data
        return any(spec.accepts_message(message) for spec, _ in self._resolved())

    def to_dict(self) -> dict[str, Any]:
        """The executor as the graph's description shows it: ``{"id": ..., "type": ...}``."""
        return {"id": self.id, "type": self.type}

    async def execute(self, message: object, ctx: WorkflowContext[Any, Any]) -> None:
        """Run the first handler that accepts ``message`` (for a ``Response``, the first response
        handler that takes its request and value)."""
        if isinstance(message, Response):
            self.response_handlers  # noqa: B018 - resolves them
            assert self._response_handlers is not None
            request = message.request.data
            for rspec, rmethod in self._response_handlers:
                if rspec.takes(request, message.value):
                    await rmethod(request, message.value, ctx)
                    return
            raise DefinitionError(
                f"executor {self.id!r} has no response handler for a "
                f"{type(request).__qualname__} request answered with a "
                f"{type(message.value).__qualname__}"
            )
        for spec, method in self._resolved():
            if spec.accepts_message(message):
                await method(message, ctx)
                return
        kind = type(message).__qualname__
        raise DefinitionError(f"executor {self.id!r} has no handler for a message of type {kind}")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(id={self.id!r})"


def check_storable_types(executor: Executor) -> None:
    """Refuse an executor whose handlers declare a type whose values the log can never store.

    Every message, output and state value is written to the log; a handler that accepts, sends
    or yields a plain class (no dataclass, pydantic model, enum or named tuple; see
    ``ValueCodec``) would fail at its first message. ``build()`` calls this for every executor,
    once all classes are defined. Raises ``DefinitionError`` naming the handler, the type and how
    to make it storable.
    """
    roles: list[tuple[str, str, tuple[Any, ...]]] = []
    for spec in executor.handlers:
        roles.append((spec.name, "accepts", (spec.input_type,)))
        roles.append((spec.name, "sends", spec.output_types))
        roles.append((spec.name, "yields", spec.workflow_output_types))
    for rspec in executor.response_handlers:
        roles.append((rspec.name, "takes", (*(rspec.requests or ()), *(rspec.responses or ()))))
        roles.append((rspec.name, "sends", rspec.output_types))
        roles.append((rspec.name, "yields", rspec.workflow_output_types))
    for name, role, declared in roles:
        found = unstorable_class(*declared)
        if found is not None:
            shown = ", ".join(type_name(t) for t in declared)
            raise DefinitionError(
                f"handler {executor.id}.{name} {role} {shown}, but values of "
                f"{found.__module__}.{found.__qualname__} cannot be stored in the log (every "
                f"message, output and state value is): {storable_hint(found)}"
            )


def require_storable(text: str, what: str) -> None:
    """Refuse text the log cannot store (a lone surrogate): it is written into every event."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DefinitionError(
            f"{what} must be valid Unicode text, got {text!r} (a lone surrogate at index "
            f"{error.start})"
        ) from None


def _refuse_duplicates(executor: Executor, specs: list[HandlerSpec]) -> None:
    """Two handlers for the same declared type: the second could never receive a message."""
    first: dict[str, str] = {}
    for spec in specs:
        key = repr(spec.input_type)
        if key in first:
            raise DefinitionError(
                f"executor {executor.id!r} ({executor.__class__.__qualname__}) has two handlers "
                f"for {type_name(spec.input_type)}, {first[key]} and {spec.name}: the second "
                "would never receive a message; merge them, or give them different types"
            )
        first[key] = spec.name


def _unique(items: typing.Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if not any(item == seen for seen in out):
            out.append(item)
    return out
