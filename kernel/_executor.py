"""Executors: the nodes of a workflow graph, and the ``@handler`` and ``@executor`` decorators.

A handler is an async method ``(self, message: T, ctx: WorkflowContext[Out, WorkflowOut])``. The
message annotation decides which messages it receives; the ``WorkflowContext`` parameters declare
what it may send and yield, which ``build()`` uses to reject edges that can never deliver.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast, get_args, get_origin, overload

from kernel._errors import DefinitionError
from kernel._requests import Response

if TYPE_CHECKING:
    from kernel._context import WorkflowContext

__all__ = [
    "Executor",
    "FunctionExecutor",
    "HandlerSpec",
    "ResponseHandlerSpec",
    "executor",
    "handler",
    "response_handler",
]

_HANDLER_MARK = "__steplog_handler__"
_RESPONSE_MARK = "__steplog_response_handler__"
F = TypeVar("F", bound=Callable[..., Awaitable[None]])


@dataclass(frozen=True)
class _HandlerOptions:
    input: Any = None
    output: Any = None
    workflow_output: Any = None


@dataclass(frozen=True)
class HandlerSpec:
    """A resolved handler: the method's name, the message types it accepts and what it may send."""

    name: str
    accepts: tuple[type, ...] | None  # None: anything
    sends: tuple[type, ...] | None  # None: unknown or anything
    yields: tuple[type, ...] | None

    def accepts_message(self, message: object) -> bool:
        return self.accepts is None or isinstance(message, self.accepts)

    def accepts_type(self, kind: type) -> bool:
        return self.accepts is None or any(_is_subtype(kind, t) for t in self.accepts)


@dataclass(frozen=True)
class ResponseHandlerSpec:
    """A resolved response handler: the request and response types it takes (None: anything)."""

    name: str
    requests: tuple[type, ...] | None
    responses: tuple[type, ...] | None

    def takes(self, request: object, response: object) -> bool:
        return (self.requests is None or isinstance(request, self.requests)) and (
            self.responses is None or isinstance(response, self.responses)
        )

    def takes_request(self, request: object) -> bool:
        return self.requests is None or isinstance(request, self.requests)


def response_handler(func: F, /) -> F:
    """Mark an async method ``(self, original_request: Req, response: Resp, ctx)`` of an
    ``Executor`` as the handler of responses to its ``ctx.request_info`` requests.

    The annotations of ``original_request`` and ``response`` decide which requests and responses
    it takes; a response of another type is refused when it is given (``ResponseError``).
    """
    if not inspect.iscoroutinefunction(cast(Any, func)):
        raise DefinitionError(f"response handler {func.__qualname__} must be an async function")
    setattr(func, _RESPONSE_MARK, True)
    return func


@overload
def handler(func: F, /) -> F: ...
@overload
def handler(
    *, input: Any = None, output: Any = None, workflow_output: Any = None
) -> Callable[[F], F]: ...


def handler(
    func: F | None = None, /, *, input: Any = None, output: Any = None, workflow_output: Any = None
) -> F | Callable[[F], F]:
    """Mark an async method of an ``Executor`` as a message handler.

    The message type comes from the annotation of the method's message parameter, or from
    ``input=`` (useful when the annotation cannot be resolved, or to accept several types).
    """

    def mark(fn: F) -> F:
        if not inspect.iscoroutinefunction(cast(Any, fn)):
            raise DefinitionError(f"handler {fn.__qualname__} must be an async function")
        setattr(fn, _HANDLER_MARK, _HandlerOptions(input, output, workflow_output))
        return fn

    return mark(func) if func is not None else mark


class Executor:
    """A node of the workflow graph. Subclass it and decorate async methods with ``@handler``."""

    def __init__(self, id: str) -> None:
        if not isinstance(id, str) or not id:
            raise DefinitionError(f"an executor id must be a non-empty string, got {id!r}")
        require_storable(id, "an executor id")
        self.id = id
        self._handlers: list[tuple[HandlerSpec, Callable[..., Awaitable[None]]]] | None = None
        self._response_handlers: (
            list[tuple[ResponseHandlerSpec, Callable[..., Awaitable[None]]]] | None
        ) = None

    @property
    def handlers(self) -> list[HandlerSpec]:
        """The executor's handlers, resolved from their annotations."""
        return [spec for spec, _ in self._resolved()]

    def _resolved(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[None]]]]:
        if self._handlers is None:
            self._handlers = self._discover()
            if not self._handlers:
                raise DefinitionError(
                    f"executor {self.id!r} ({type(self).__qualname__}) has no @handler methods"
                )
        return self._handlers

    def _discover(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[None]]]]:
        found = []
        seen: set[str] = set()
        for cls in type(self).__mro__:
            for name, member in vars(cls).items():
                options = getattr(member, _HANDLER_MARK, None)
                if options is None or name in seen:
                    continue
                seen.add(name)
                bound = getattr(self, name)
                found.append((_spec(name, member, options, skip_self=True), bound))
        return found

    @property
    def response_handlers(self) -> list[ResponseHandlerSpec]:
        """The executor's ``@response_handler`` methods, resolved from their annotations."""
        if self._response_handlers is None:
            found = []
            seen: set[str] = set()
            for cls in type(self).__mro__:
                for name, member in vars(cls).items():
                    if not getattr(member, _RESPONSE_MARK, False) or name in seen:
                        continue
                    seen.add(name)
                    found.append((_response_spec(name, member), getattr(self, name)))
            self._response_handlers = found
        return [spec for spec, _ in self._response_handlers]

    def can_handle(self, message: object) -> bool:
        """Whether some handler accepts ``message``."""
        return any(spec.accepts_message(message) for spec, _ in self._resolved())

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
        return f"{type(self).__name__}(id={self.id!r})"


class FunctionExecutor(Executor):
    """An executor made from one async function ``(message, ctx)``; see ``@executor``."""

    def __init__(self, func: Callable[..., Awaitable[None]], *, id: str | None = None) -> None:
        if not inspect.iscoroutinefunction(func):
            raise DefinitionError(f"executor function {func.__qualname__} must be async")
        super().__init__(id or func.__name__)
        options = getattr(func, _HANDLER_MARK, None) or _HandlerOptions()
        self._handlers = [(_spec(func.__name__, func, options, skip_self=False), func)]
        self.func = func


@overload
def executor(func: Callable[..., Awaitable[None]], /) -> FunctionExecutor: ...
@overload
def executor(
    *, id: str | None = None
) -> Callable[[Callable[..., Awaitable[None]]], FunctionExecutor]: ...


def executor(
    func: Callable[..., Awaitable[None]] | None = None, /, *, id: str | None = None
) -> FunctionExecutor | Callable[[Callable[..., Awaitable[None]]], FunctionExecutor]:
    """Turn an async function ``(message: T, ctx: WorkflowContext[...])`` into an executor."""

    def make(fn: Callable[..., Awaitable[None]]) -> FunctionExecutor:
        return FunctionExecutor(fn, id=id)

    return make(func) if func is not None else make


def require_storable(text: str, what: str) -> None:
    """Refuse text the log cannot store (a lone surrogate): it is written into every event."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DefinitionError(
            f"{what} must be valid Unicode text, got {text!r} (a lone surrogate at index "
            f"{error.start})"
        ) from None


# -- annotations -------------------------------------------------------------------------------


def _spec(name: str, func: Any, options: _HandlerOptions, *, skip_self: bool) -> HandlerSpec:
    params = list(inspect.signature(func).parameters.values())
    if skip_self:
        params = params[1:]
    if len(params) < 2:
        raise DefinitionError(
            f"handler {func.__qualname__} must take (message, ctx), got {len(params)} parameter(s)"
        )
    hints = _hints(func)
    message_type = options.input if options.input is not None else hints.get(params[0].name, Any)
    ctx_type = hints.get(params[1].name)
    ctx_args = get_args(ctx_type) if ctx_type is not None else ()
    sends = options.output if options.output is not None else (ctx_args[0] if ctx_args else Any)
    yields = (
        options.workflow_output
        if options.workflow_output is not None
        else (ctx_args[1] if len(ctx_args) > 1 else Any)
    )
    return HandlerSpec(name, _types_of(message_type), _types_of(sends), _types_of(yields))


def _response_spec(name: str, func: Any) -> ResponseHandlerSpec:
    params = list(inspect.signature(func).parameters.values())[1:]
    if len(params) < 3:
        raise DefinitionError(
            f"response handler {func.__qualname__} must take (original_request, response, ctx), "
            f"got {len(params)} parameter(s)"
        )
    hints = _hints(func)
    return ResponseHandlerSpec(
        name, _types_of(hints.get(params[0].name, Any)), _types_of(hints.get(params[1].name, Any))
    )


def _hints(func: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except NameError as error:
        raise DefinitionError(
            f"cannot resolve the annotations of handler {func.__qualname__}: {error}; define the "
            "types at module level, or name them with @handler(input=..., output=...)"
        ) from error


def _types_of(annotation: Any) -> tuple[type, ...] | None:
    """The runtime classes an annotation stands for; None for 'anything'."""
    if annotation is Any or annotation is object or annotation is inspect.Parameter.empty:
        return None
    if annotation is None or annotation is type(None):
        return (type(None),)
    if isinstance(annotation, tuple):
        merged: list[type] = []
        for item in annotation:
            inner = _types_of(item)
            if inner is None:
                return None
            merged.extend(inner)
        return tuple(merged)
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return _types_of(get_args(annotation))
    if origin is typing.Literal:
        return tuple({type(v) for v in get_args(annotation)})
    if getattr(annotation, "__name__", None) == "Never" or annotation is typing.NoReturn:
        return ()
    if origin is not None and isinstance(origin, type):
        return (origin,)
    if isinstance(annotation, type):
        return (annotation,)
    return None


def _is_subtype(kind: type, target: type) -> bool:
    try:
        return issubclass(kind, target)
    except TypeError:
        return False
