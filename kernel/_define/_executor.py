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

import asyncio
import collections.abc
import functools
import inspect
import threading
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, overload

import typing_extensions

from kernel._base._errors import DefinitionError
from kernel._codec._valuetypes import storable_hint, unstorable_class
from kernel._define._context import WorkflowContext
from kernel._log._requests import Response

__all__ = [
    "Executor",
    "FunctionExecutor",
    "HandlerSpec",
    "ResponseHandlerSpec",
    "WorkflowMessage",
    "check_storable_types",
    "executor",
    "handler",
    "response_handler",
]

_HANDLER_MARK = "__steplog_handler__"
_RESPONSE_MARK = "__steplog_response_handler__"
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
_TYPEVARS: tuple[type, ...] = (type(typing.TypeVar("_T")), type(typing_extensions.TypeVar("_T")))
_METHOD_SHAPE = "(self, message: T, ctx: WorkflowContext[U, V])"
_FUNCTION_SHAPE = "(message: T) or (message: T, ctx: WorkflowContext[U])"
_CONTEXT_SHAPES = "WorkflowContext, WorkflowContext[T] or WorkflowContext[T, U]"


@dataclass(frozen=True)
class _HandlerOptions:
    input: Any = None
    output: Any = None
    workflow_output: Any = None

    @property
    def explicit(self) -> bool:
        return self.input is not None or self.output is not None or self.workflow_output is not None


@dataclass(frozen=True)
class WorkflowMessage:
    """A message with where it came from, as ``can_handle`` takes it (AF's ``WorkflowMessage``).

    ``Executor.can_handle`` takes either a bare message or one of these, and looks at ``data``.
    """

    data: Any
    source_id: str
    target_id: str | None = None


@dataclass(frozen=True)
class HandlerSpec:
    """A resolved handler: the method's name, the message types it accepts and what it may send.

    ``accepts``, ``sends`` and ``yields`` are the runtime classes (None: anything, or not
    declared; ``()``: nothing); ``input_type``, ``output_types`` and ``workflow_output_types`` are
    the types as declared (``list[int]``, ``Any``), as AF's executors list them.
    """

    name: str
    accepts: tuple[type, ...] | None  # None: anything
    sends: tuple[type, ...] | None  # None: unknown or anything
    yields: tuple[type, ...] | None
    input_type: Any = Any
    output_types: tuple[Any, ...] = ()
    workflow_output_types: tuple[Any, ...] = ()
    _shallow: bool = field(default=True, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_shallow", _is_shallow(self.input_type))

    def accepts_message(self, message: object) -> bool:
        """Whether the handler takes ``message``: its class, and for a generic or ``Literal``
        annotation its items or value (a ``list[int]`` handler does not take ``["a"]``)."""
        if self.accepts is None:
            return True
        if not isinstance(message, self.accepts):
            return False
        return self._shallow or _matches(message, self.input_type)

    def accepts_type(self, kind: type) -> bool:
        return self.accepts is None or any(_is_subtype(kind, t) for t in self.accepts)


@dataclass(frozen=True)
class ResponseHandlerSpec:
    """A resolved response handler: the request and response types it takes (None: anything),
    and what it may send and yield (as ``HandlerSpec``)."""

    name: str
    requests: tuple[type, ...] | None
    responses: tuple[type, ...] | None
    sends: tuple[type, ...] | None = None
    yields: tuple[type, ...] | None = None
    output_types: tuple[Any, ...] = ()
    workflow_output_types: tuple[Any, ...] = ()

    def takes(self, request: object, response: object) -> bool:
        return (self.requests is None or isinstance(request, self.requests)) and (
            self.responses is None or isinstance(response, self.responses)
        )

    def takes_request(self, request: object) -> bool:
        return self.requests is None or isinstance(request, self.requests)


@dataclass(frozen=True)
class _ResponseOptions:
    request: Any = None
    response: Any = None
    output: Any = None
    workflow_output: Any = None


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
        _refuse_descriptor(fn, "@response_handler")
        if not inspect.iscoroutinefunction(cast(Any, fn)):
            raise DefinitionError(
                f"response handler {fn.__qualname__} must be an async function (async def)"
            )
        options = _ResponseOptions(request, response, output, workflow_output)
        _response_spec(fn.__name__, fn, options, strict=False)
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
        _refuse_descriptor(fn, "@handler")
        if not inspect.iscoroutinefunction(cast(Any, fn)):
            raise DefinitionError(
                f"handler {fn.__qualname__} must be an async function (async def); a sync "
                "function can be an executor of its own with @executor (it runs in a worker "
                "thread)"
            )
        options = _HandlerOptions(input, output, workflow_output)
        _spec(fn.__name__, fn, options, method=True, strict=False)  # checks what it can now
        setattr(fn, _HANDLER_MARK, options)
        return fn

    return mark(func) if func is not None else mark


class Executor:
    """A node of the workflow graph. Subclass it and decorate async methods with ``@handler``.

    ``type`` (or ``type_``) names the kind of executor in ``to_dict()``; it defaults to the class
    name. The handlers are resolved here, so a missing handler, two handlers for one type or an
    annotation that cannot be resolved raise ``DefinitionError`` when the executor is made.
    """

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
                options = getattr(member, _HANDLER_MARK, None)
                if options is None or name in seen:
                    continue
                seen.add(name)
                spec = _spec(name, member, options, method=True, strict=True)
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
                    spec = _response_spec(name, member, options, strict=True)
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


class FunctionExecutor(Executor):
    """An executor made from one function ``(message)`` or ``(message, ctx)``; see ``@executor``.

    The function may be async, or sync: a sync function runs in a worker thread (so it does not
    hold up the event loop, which renews the run's lease), and the ``ctx`` it gets runs each call
    on the event loop and waits for it, so it calls ``ctx.send_message(...)`` and
    ``ctx.yield_output(...)`` without ``await``. What the function returns is not used: send
    messages with ``ctx.send_message``.

    ``id`` defaults to the function's name; ``input=``, ``output=`` and ``workflow_output=``
    override the annotations (see ``handler``). Raises ``DefinitionError`` (a ``ValueError``) for
    a bad signature, a ``staticmethod`` or ``classmethod``, or a generator function.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        id: str | None = None,
        *,
        input: Any = None,
        output: Any = None,
        workflow_output: Any = None,
    ) -> None:
        _refuse_descriptor(func, "@executor")
        if not callable(func):
            raise DefinitionError(f"an executor function must be callable, got {func!r}")
        name = getattr(func, "__qualname__", repr(func))
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise DefinitionError(
                f"executor function {name} is a generator, whose body would never run: send "
                "each item with ctx.send_message (or yield it with ctx.yield_output) instead"
            )
        marked = getattr(func, _HANDLER_MARK, None) or _HandlerOptions()
        self._options = _HandlerOptions(
            input if input is not None else marked.input,
            output if output is not None else marked.output,
            workflow_output if workflow_output is not None else marked.workflow_output,
        )
        self.func = func
        self._is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - an object with an async __call__
        )
        self._takes_ctx = len(_positional(func, _FUNCTION_SHAPE, f"executor function {name}")) == 2
        super().__init__(id or getattr(func, "__name__", None) or "FunctionExecutor")

    def _discover(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]]:
        name = getattr(self.func, "__name__", self.id)
        spec = _spec(name, self.func, self._options, method=False, strict=True)
        assert spec is not None
        return [(spec, self._call)]

    async def _call(self, message: Any, ctx: WorkflowContext[Any, Any]) -> None:
        func = self.func
        if self._is_async:
            await (func(message, ctx) if self._takes_ctx else func(message))
            return
        if self._takes_ctx:
            result = await asyncio.to_thread(func, message, _thread_context(ctx))
        else:
            result = await asyncio.to_thread(func, message)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise DefinitionError(
                f"executor function {getattr(func, '__qualname__', func)!r} is not async but "
                "returned an awaitable, which would never run: define it with async def"
            )


@overload
def executor(func: Callable[..., Any], /) -> FunctionExecutor: ...
@overload
def executor(
    *,
    id: str | None = None,
    input: Any = None,
    output: Any = None,
    workflow_output: Any = None,
) -> Callable[[Callable[..., Any]], FunctionExecutor]: ...


def executor(
    func: Callable[..., Any] | None = None,
    /,
    *,
    id: str | None = None,
    input: Any = None,
    output: Any = None,
    workflow_output: Any = None,
) -> FunctionExecutor | Callable[[Callable[..., Any]], FunctionExecutor]:
    """Turn a function ``(message: T)`` or ``(message: T, ctx: WorkflowContext[...])``, async
    or sync, into a ``FunctionExecutor`` (see there). ``@executor`` and ``@executor(id=...,
    input=..., output=..., workflow_output=...)`` both work.

    >>> @executor(id="shout", input=str, output=str)
    ... def shout(text, ctx):
    ...     ctx.send_message(text.upper())  # sync: no await
    >>> shout.id, shout.input_types, shout.output_types
    ('shout', [<class 'str'>], [<class 'str'>])
    """

    def make(fn: Callable[..., Any]) -> FunctionExecutor:
        return FunctionExecutor(
            fn, id=id, input=input, output=output, workflow_output=workflow_output
        )

    return make(func) if func is not None else make


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
            shown = ", ".join(_type_name(t) for t in declared)
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


# -- a sync function's context -------------------------------------------------------------------


class _ThreadContext(WorkflowContext[Any, Any]):
    """The ``ctx`` of a sync function in its worker thread: each public call runs on the event
    loop (where the superstep lives), and the thread waits for it. A coroutine method
    (``send_message``) is run to its end, so the function calls it without ``await``."""

    __slots__ = ("_loop", "_loop_thread")

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or not callable(attr):
            return attr
        if threading.get_ident() == object.__getattribute__(self, "_loop_thread"):
            return attr  # on the loop itself: the plain context
        return functools.partial(_on_loop, object.__getattribute__(self, "_loop"), attr)


def _thread_context(ctx: WorkflowContext[Any, Any]) -> WorkflowContext[Any, Any]:
    proxy = object.__new__(_ThreadContext)
    for cls in WorkflowContext.__mro__:
        slots = getattr(cls, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot != "__weakref__" and hasattr(ctx, slot):
                object.__setattr__(proxy, slot, getattr(ctx, slot))
    object.__setattr__(proxy, "_loop", asyncio.get_running_loop())
    object.__setattr__(proxy, "_loop_thread", threading.get_ident())
    return proxy


def _on_loop(
    loop: asyncio.AbstractEventLoop, method: Callable[..., Any], /, *a: Any, **k: Any
) -> Any:
    async def call() -> Any:
        result = method(*a, **k)
        return await result if inspect.isawaitable(result) else result

    return asyncio.run_coroutine_threadsafe(call(), loop).result()


# -- signatures and annotations ------------------------------------------------------------------


def _refuse_descriptor(func: object, decorator: str) -> None:
    if isinstance(func, staticmethod | classmethod):
        kind = "staticmethod" if isinstance(func, staticmethod) else "classmethod"
        raise DefinitionError(
            f"{decorator} cannot be used with @{kind}: use @executor on a plain function, or "
            "@handler on instance methods of an Executor subclass"
        )


def _positional(func: Any, shape: str, where: str) -> list[inspect.Parameter]:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as error:
        raise DefinitionError(f"{where} has no signature to read: {error}") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not all(p.kind in positional for p in params):
        raise DefinitionError(
            f"{where} must have {shape}, all positional; it has ({_params_text(params)})"
        )
    return params


def _params_text(params: list[inspect.Parameter]) -> str:
    return ", ".join(str(p).split(":")[0].split("=")[0] for p in params)


def _spec(
    name: str, func: Any, options: _HandlerOptions, *, method: bool, strict: bool
) -> HandlerSpec | None:
    """Check a handler's signature and resolve its types. With ``strict=False`` (when it is
    defined), annotations that cannot be resolved yet are left for later (None is returned)."""
    qualname = getattr(func, "__qualname__", name)
    where = f"handler {qualname}" if method else f"executor function {qualname}"
    shape = _METHOD_SHAPE if method else _FUNCTION_SHAPE
    params = _positional(func, shape, where)
    own = params[1:] if method else params
    if (method and len(own) != 2) or (not method and len(own) not in (1, 2)):
        raise DefinitionError(
            f"{where} must have {shape}; it has ({_params_text(params)}), "
            f"{len(params)} parameter(s)"
        )
    message, ctx = own[0], (own[1] if len(own) == 2 else None)
    if options.input is None and message.annotation is inspect.Parameter.empty:
        raise DefinitionError(
            f"{where} must have a type annotation for the message parameter {message.name!r} "
            f"({message.name}: Any takes anything), or name its type with input=..."
        )
    if ctx is not None and ctx.annotation is inspect.Parameter.empty and not options.explicit:
        raise DefinitionError(
            f"{where}: parameter {ctx.name!r} must have a WorkflowContext annotation "
            f"({_CONTEXT_SHAPES}: T is what it sends, U what it yields), or name the types with "
            "input=..., output=..., workflow_output=..."
        )
    hints = _hints(func, where, strict)
    resolved = [_explicit(v, func, where, strict) for v in (options.input, options.output)]
    resolved.append(_explicit(options.workflow_output, func, where, strict))
    if hints is None or any(r is _LATER for r in resolved):
        return None
    explicit_in, explicit_out, explicit_wf = resolved
    message_type = explicit_in if explicit_in is not None else hints.get(message.name, Any)
    if _has_typevar(message_type):
        raise DefinitionError(
            f"{where} takes a type variable ({message_type!r}) as its message type, which says "
            "nothing about the messages it takes: name concrete types with input=..., output=..."
        )
    ctx_args: tuple[Any, ...] | None = () if ctx is None else None  # None: not declared
    if ctx is not None and ctx.annotation is not inspect.Parameter.empty:
        ctx_args = _context_args(hints.get(ctx.name, ctx.annotation), ctx.name, where)
    sends = _declared(explicit_out, ctx_args, 0)
    yields = _declared(explicit_wf, ctx_args, 1)
    return HandlerSpec(
        name,
        _types_of(message_type),
        None if sends is None else _types_of(sends),
        None if yields is None else _types_of(yields),
        message_type,
        _members(sends),
        _members(yields),
    )


_LATER = object()  # an explicit type given as text that cannot be resolved yet


def _explicit(value: Any, func: Any, where: str, strict: bool) -> Any:
    if not isinstance(value, str):
        if _has_typevar(value):
            raise DefinitionError(
                f"{where} names a type variable ({value!r}) as an explicit type: name concrete "
                "types"
            )
        return value
    holder = types.SimpleNamespace(__annotations__={"value": value})
    try:
        namespace = getattr(_annotated(func), "__globals__", None)
        resolved = typing.get_type_hints(holder, globalns=namespace)
    except NameError as error:
        if not strict:
            return _LATER
        raise DefinitionError(
            f"cannot resolve the type {value!r} named by {where}: {error}; define it at module "
            "level before the executor is made, or pass the class itself"
        ) from None
    except SyntaxError as error:
        raise DefinitionError(
            f"{where} names the type {value!r}, which is not valid: {error}"
        ) from None
    return _explicit(resolved["value"], func, where, strict)


def _declared(explicit: Any, ctx_args: tuple[Any, ...] | None, index: int) -> Any:
    """What a handler declares it sends (index 0) or yields (1): None when it does not say."""
    if explicit is not None:
        return explicit
    if ctx_args is None:
        return None
    return ctx_args[index] if len(ctx_args) > index else typing_extensions.Never


def _context_args(annotation: Any, param: str, where: str) -> tuple[Any, ...] | None:
    """The type arguments of a ``WorkflowContext`` annotation; None for a bare one (which says
    nothing about what the handler sends). Refuses any other annotation."""
    origin = get_origin(annotation) or annotation
    if not (isinstance(origin, type) and issubclass(origin, WorkflowContext)):
        raise DefinitionError(
            f"{where}: parameter {param!r} must be annotated as {_CONTEXT_SHAPES} (T is what "
            f"it sends, U what it yields), got {_type_name(annotation)}"
        )
    args = get_args(annotation)
    if not args:
        return None
    if len(args) > 2:
        raise DefinitionError(
            f"{where}: parameter {param!r} must be {_CONTEXT_SHAPES}, got {len(args)} type "
            "arguments"
        )
    for arg in args:
        if _has_typevar(arg):
            raise DefinitionError(
                f"{where}: parameter {param!r} holds a type variable ({arg!r}), which says "
                "nothing about what it sends: name concrete types with output=..., "
                "workflow_output=..."
            )
    return args


def _members(declared: Any) -> tuple[Any, ...]:
    """A declared type as AF lists it: the members of a union, nothing for ``Never``."""
    if declared is None or _is_never(declared):
        return ()
    if get_origin(declared) is Union or get_origin(declared) is types.UnionType:
        return tuple(m for m in get_args(declared) if not _is_never(m))
    return (declared,)


def _is_never(annotation: Any) -> bool:
    return (
        annotation is typing.NoReturn
        or getattr(annotation, "__name__", None) == "Never"
        or (annotation is typing_extensions.Never)
    )


def _response_spec(
    name: str, func: Any, options: _ResponseOptions, *, strict: bool
) -> ResponseHandlerSpec | None:
    qualname = getattr(func, "__qualname__", name)
    where = f"response handler {qualname}"
    shape = "(self, original_request, response, ctx)"
    params = _positional(func, shape, where)
    if len(params) != 4:
        raise DefinitionError(
            f"{where} must have {shape}; it has ({_params_text(params)}), "
            f"{len(params)} parameter(s)"
        )
    hints = _hints(func, where, strict)
    explicit = [
        _explicit(value, func, where, strict)
        for value in (options.request, options.response, options.output, options.workflow_output)
    ]
    if hints is None or any(r is _LATER for r in explicit):
        return None
    request, response, ctx = params[1:]
    ctx_args: tuple[Any, ...] | None = None
    if ctx.annotation is not inspect.Parameter.empty:
        ctx_args = _context_args(hints.get(ctx.name, ctx.annotation), ctx.name, where)
    request_type = explicit[0] if explicit[0] is not None else hints.get(request.name, Any)
    response_type = explicit[1] if explicit[1] is not None else hints.get(response.name, Any)
    sends, yields = _declared(explicit[2], ctx_args, 0), _declared(explicit[3], ctx_args, 1)
    return ResponseHandlerSpec(
        name,
        _types_of(request_type),
        _types_of(response_type),
        None if sends is None else _types_of(sends),
        None if yields is None else _types_of(yields),
        _members(sends),
        _members(yields),
    )


def _hints(func: Any, where: str, strict: bool) -> dict[str, Any] | None:
    """The resolved annotations; None (not ``strict``) when one names a class not defined yet."""
    try:
        return typing.get_type_hints(_annotated(func))
    except TypeError:  # not a function, class or module: the annotations as written
        params = inspect.signature(func).parameters.values()
        return {p.name: p.annotation for p in params if p.annotation is not p.empty}
    except (NameError, AttributeError) as error:
        if not strict:
            return None
        raise DefinitionError(
            f"cannot resolve the annotations of {where}: {error}; define the types at module "
            "level before the executor is made, or name them with input=..., output=..."
        ) from error


def _annotated(func: Any) -> Any:
    """Where a callable's annotations are: the function under a partial, an object's
    ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.isfunction(func) or inspect.ismethod(func) or isinstance(func, type):
        return func
    return getattr(type(func), "__call__", func)  # noqa: B004 - where its annotations are


def _refuse_duplicates(executor: Executor, specs: list[HandlerSpec]) -> None:
    """Two handlers for the same declared type: the second could never receive a message."""
    first: dict[str, str] = {}
    for spec in specs:
        key = repr(spec.input_type)
        if key in first:
            raise DefinitionError(
                f"executor {executor.id!r} ({executor.__class__.__qualname__}) has two handlers "
                f"for {_type_name(spec.input_type)}, {first[key]} and {spec.name}: the second "
                "would never receive a message; merge them, or give them different types"
            )
        first[key] = spec.name


def _unique(items: typing.Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if not any(item == seen for seen in out):
            out.append(item)
    return out


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and get_origin(annotation) is None:
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _has_typevar(annotation: Any) -> bool:
    if isinstance(annotation, _TYPEVARS):
        return True
    return any(_has_typevar(arg) for arg in get_args(annotation))


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
    if origin is Literal:
        return tuple({type(v) for v in get_args(annotation)})
    if origin is typing.Annotated:
        return _types_of(get_args(annotation)[0])
    if _is_never(annotation):
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


# -- matching a message against a declared type ----------------------------------------------

_ITEMS = (list, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_MAPPINGS = (dict, collections.abc.Mapping)


def _is_shallow(annotation: Any) -> bool:
    """Whether ``isinstance`` against ``_types_of`` decides the annotation on its own."""
    if annotation is Any or (isinstance(annotation, type) and get_origin(annotation) is None):
        return True
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return all(_is_shallow(arg) for arg in get_args(annotation))
    return annotation is None


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation``: classes by ``isinstance``, ``Literal`` by value,
    the items of lists, sets, tuples and dicts by their declared types. What cannot be checked
    at runtime (a protocol, a special form) is taken as a match."""
    if annotation is Any or annotation is object:
        return True
    if annotation is None:
        return value is None
    origin = get_origin(annotation)
    if origin is None:
        return isinstance(value, annotation) if isinstance(annotation, type) else True
    args = get_args(annotation)
    if origin is Union or origin is types.UnionType:
        return any(_matches(value, arg) for arg in args)
    if origin is Literal:
        return any(type(value) is type(member) and value == member for member in args)
    if origin is typing.Annotated:
        return _matches(value, args[0])
    if not isinstance(origin, type):
        return True
    try:
        if not isinstance(value, origin):
            return False
    except TypeError:
        return True
    return not args or _items_match(value, origin, args)


def _items_match(value: Any, origin: type, args: tuple[Any, ...]) -> bool:
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(item, args[0]) for item in value)
        if args == ((),):
            return len(value) == 0
        return len(value) == len(args) and all(map(_matches, value, args))
    if issubclass(origin, _MAPPINGS) and len(args) == 2:
        return all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
    if issubclass(origin, _ITEMS) and len(args) == 1 and not isinstance(value, str | bytes):
        return all(_matches(item, args[0]) for item in value)
    return True
