"""Handler signatures: how a handler's message, output and workflow-output types are read from
its annotations or given explicitly (``input=``, ``output=``, ``workflow_output=``), and checked.

``handler_spec`` and ``response_spec`` read a handler's signature into a ``HandlerSpec`` or
``ResponseHandlerSpec``: once when it is defined (``strict=False``: annotations naming a class not
defined yet are left for later) and again when its executor is made (``strict=True``). A bad
signature raises ``DefinitionError``. A spec also answers whether a message fits the declared
type (``HandlerSpec.accepts_message``), down to the items of a ``list[int]`` or a ``Literal``.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import typing_extensions

from kernel._base._errors import DefinitionError
from kernel._define._context import WorkflowContext

__all__ = [
    "FUNCTION_SHAPE",
    "HandlerOptions",
    "HandlerSpec",
    "ResponseHandlerSpec",
    "ResponseOptions",
    "handler_spec",
    "matches",
    "positional_params",
    "refuse_descriptor",
    "response_spec",
    "type_name",
]

_TYPEVARS: tuple[type, ...] = (type(typing.TypeVar("_T")), type(typing_extensions.TypeVar("_T")))
_METHOD_SHAPE = "(self, message: T, ctx: WorkflowContext[U, V])"
FUNCTION_SHAPE = "(message: T) or (message: T, ctx: WorkflowContext[U])"
_CONTEXT_SHAPES = "WorkflowContext, WorkflowContext[T] or WorkflowContext[T, U]"


@dataclass(frozen=True)
class HandlerOptions:
    """The types ``@handler`` or ``@executor`` was given (None: not given, the annotation
    decides)."""

    input: Any = None
    output: Any = None
    workflow_output: Any = None

    @property
    def explicit(self) -> bool:
        return self.input is not None or self.output is not None or self.workflow_output is not None


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
        return self._shallow or matches(message, self.input_type)

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
class ResponseOptions:
    """The types ``@response_handler`` was given (None: not given, the annotation decides)."""

    request: Any = None
    response: Any = None
    output: Any = None
    workflow_output: Any = None


def refuse_descriptor(func: object, decorator: str) -> None:
    if isinstance(func, staticmethod | classmethod):
        kind = "staticmethod" if isinstance(func, staticmethod) else "classmethod"
        raise DefinitionError(
            f"{decorator} cannot be used with @{kind}: use @executor on a plain function, or "
            "@handler on instance methods of an Executor subclass"
        )


def positional_params(func: Any, shape: str, where: str) -> list[inspect.Parameter]:
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


def handler_spec(
    name: str, func: Any, options: HandlerOptions, *, method: bool, strict: bool
) -> HandlerSpec | None:
    """Check a handler's signature and resolve its types. With ``strict=False`` (when it is
    defined), annotations that cannot be resolved yet are left for later (None is returned)."""
    qualname = getattr(func, "__qualname__", name)
    where = f"handler {qualname}" if method else f"executor function {qualname}"
    shape = _METHOD_SHAPE if method else FUNCTION_SHAPE
    params = positional_params(func, shape, where)
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
            f"it sends, U what it yields), got {type_name(annotation)}"
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


def response_spec(
    name: str, func: Any, options: ResponseOptions, *, strict: bool
) -> ResponseHandlerSpec | None:
    qualname = getattr(func, "__qualname__", name)
    where = f"response handler {qualname}"
    shape = "(self, original_request, response, ctx)"
    params = positional_params(func, shape, where)
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


def type_name(annotation: Any) -> str:
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


def matches(value: Any, annotation: Any) -> bool:
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
        return any(matches(value, arg) for arg in args)
    if origin is Literal:
        return any(type(value) is type(member) and value == member for member in args)
    if origin is typing.Annotated:
        return matches(value, args[0])
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
            return all(matches(item, args[0]) for item in value)
        if args == ((),):
            return len(value) == 0
        return len(value) == len(args) and all(map(matches, value, args))
    if issubclass(origin, _MAPPINGS) and len(args) == 2:
        return all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if issubclass(origin, _ITEMS) and len(args) == 1 and not isinstance(value, str | bytes):
        return all(matches(item, args[0]) for item in value)
    return True
