"""Recorded steps: ``@step`` marks an async function whose calls inside a running workflow are
recorded in the log, and served from it when the same work is attempted again.

The decorator is Agent Framework's functional ``step`` in shape (``name``, ``replay_key``, an
injected ``RunContext``); what a call does inside a run is asked of the ``StepHost`` the runner
sets for each handler invocation (``ACTIVE_HOST``): this module never knows the runner. Outside a
run a step is its plain function.

A call's identity, as AF makes it: the step's name and either its ``replay_key`` (hashed) or its
canonical bound arguments (``None``, ``bool``, ``int``, finite ``float`` and ``complex``,
``str``, ``bytes``, and lists, tuples, frozensets and ``str``-keyed mappings of them,
type-preserving), with the occurrence of that identity in the invocation. Arguments outside that
set (or a container that holds itself) have no identity: such a call is keyed by its
order among the step's calls, and refused (``ValueError``) in a task other than the handler's,
where order is not stable.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import math
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, overload

import orjson

from kernel._base._errors import DefinitionError
from kernel._codec._valuetypes import value_classes
from kernel._define._executor import require_storable

__all__ = [
    "ACTIVE_CALL",
    "ACTIVE_HOST",
    "AfterFailure",
    "Identity",
    "StepCall",
    "StepHost",
    "StepWrapper",
    "current_call",
    "identity_digest",
    "is_run_context",
    "report_usage",
    "step",
    "step_key",
]

R = TypeVar("R")

AfterFailure = Literal["reuse", "rerun"]
"""What a retry does with a step recorded by an attempt whose handler *failed*: serve it
(``"reuse"``, the default: nothing is done twice) or call it again (``"rerun"``: its output may
be what failed the handler). After a crash, a cancellation, a lost lease or a dropped stream a
recorded step is always served."""

Identity = tuple[Literal["auto", "explicit", "order"], str]
"""How a call is identified: by canonical arguments (``auto``: their SHA-256), by its
``replay_key`` (``explicit``: its SHA-256), or by its order among the step's calls (``order``)."""

_UNSUPPORTED = object()


def _canonical(value: Any, open_: frozenset[int] = frozenset()) -> Any:
    """A type-preserving JSON tree of ``value``, or ``_UNSUPPORTED`` (also for a container that
    holds itself: ``open_`` are the ids of the containers being walked)."""
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", value]
    if kind is float:
        return ["float", value.hex()] if math.isfinite(value) else _UNSUPPORTED
    if kind is complex:
        parts = (value.real, value.imag)
        if not all(map(math.isfinite, parts)):
            return _UNSUPPORTED
        return ["complex", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind is frozenset:  # no order of its own: its items' trees, sorted by their JSON
        trees = [_canonical(item, open_) for item in value]
        if any(tree is _UNSUPPORTED for tree in trees):
            return _UNSUPPORTED
        return ["frozenset", sorted(trees, key=orjson.dumps)]
    if kind is list or kind is tuple or isinstance(value, Mapping):
        if id(value) in open_:
            return _UNSUPPORTED  # it holds itself
        inner = open_ | {id(value)}
        if isinstance(value, Mapping):
            pairs = []
            for key, item in value.items():
                tree = _canonical(item, inner) if type(key) is str else _UNSUPPORTED
                if tree is _UNSUPPORTED:
                    return _UNSUPPORTED
                pairs.append([key, tree])
            return ["mapping", f"{kind.__module__}.{kind.__qualname__}", pairs]
        items = []
        for item in value:
            tree = _canonical(item, inner)
            if tree is _UNSUPPORTED:
                return _UNSUPPORTED
            items.append(tree)
        return ["list" if kind is list else "tuple", items]
    return _UNSUPPORTED


def _positional_shape(
    signature: inspect.Signature,
) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]] | None:
    """For a signature whose parameters are all positional-only or positional-or-keyword: their
    names, and the trailing ones' defaults (name, default); None for any other signature."""
    names: list[str] = []
    defaults: list[tuple[str, Any]] = []
    for param in signature.parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            return None
        names.append(param.name)
        if param.default is not param.empty:
            defaults.append((param.name, param.default))
    return tuple(names), tuple(defaults)


def identity_digest(value: Any) -> str | None:
    """The SHA-256 of ``value``'s canonical form as compact JSON text, or None when it has none.

    The text is Agent Framework's (no ASCII escapes, no spaces), so the digest is the one AF's
    step keys use. orjson writes it, except for what orjson refuses and JSON holds all the same
    (an integer past 64 bits, a lone surrogate in a string): the standard library writes the
    same text then, a lone surrogate passed through as its code point's bytes.
    """
    tree = _canonical(value)
    if tree is _UNSUPPORTED:
        return None
    try:
        text = orjson.dumps(tree)
    except orjson.JSONEncodeError:
        text = json.dumps(tree, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )
    return hashlib.sha256(text).hexdigest()


@dataclass(slots=True, eq=False)
class StepCall:
    """One call of a step inside a run, as its host opened it.

    ``key`` is its identity in the attempt (stable across attempts); ``step_key`` the idempotency
    key an external system can deduplicate on; ``call`` its index among the invocation's step
    calls; ``digest`` its arguments' digest. A step may add token counts to ``usage`` (see
    ``report_usage``); they are recorded with its result.
    """

    name: str
    key: str
    step_key: str
    call: int
    digest: str | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    reused: int | None = None
    """Set by ``lookup`` when the call is served: the position of the record served."""
    auto_request_ids: int = 0
    """How many automatic request ids the call used (a functional workflow counts them before
    ``finished``); set by ``lookup`` from the record when the call is served."""
    result_types: tuple[type, ...] = ()
    """The classes the step's return annotation names: a served result is rebuilt as them."""
    arguments: dict[str, Any] | None = None
    """For a step that records its arguments (``record_arguments``), set when the call is about
    to run: its bound arguments, defaults applied, without its ``RunContext`` parameter; the
    host's ``started`` puts their wire form (through the codec) in their place."""


class StepHost(Protocol):
    """What a step call asks of the run it is called in (the runner implements it, one per
    handler invocation)."""

    def open(
        self, name: str, identity: Identity, digest: str | None, concurrent_ok: bool
    ) -> StepCall:
        """Name the call: its key (occurrences counted), step key and call index. Raises
        ``ValueError`` for an explicit key used twice in the invocation, or an ``order`` identity
        outside the handler's own task; ``StateWriteRejectedError`` once the superstep closed."""
        ...

    def lookup(self, call: StepCall, after_failure: AfterFailure) -> tuple[bool, Any]:
        """``(True, result)`` when an earlier attempt recorded this call and it may be served."""
        ...

    async def served(self, call: StepCall, result: Any) -> None:
        """The call was served from the log: note it (and tell the stream)."""
        ...

    async def started(self, call: StepCall) -> None:
        """The call is about to run (tell the stream). Raises ``StateWriteRejectedError`` if the
        superstep closed meanwhile (the call does not run); or, when the run may not call it (a
        rerun, which has no record of it), the refusal, recorded as its error."""
        ...

    async def finished(self, call: StepCall, result: Any, error: BaseException | None) -> None:
        """The call returned ``result`` or raised ``error``: record it, durable at once."""
        ...


ACTIVE_HOST: contextvars.ContextVar[StepHost | None] = contextvars.ContextVar(
    "steplog_step_host", default=None
)
"""The host of the handler invocation running in this context (None: not in a run)."""

ACTIVE_CALL: contextvars.ContextVar[StepCall | None] = contextvars.ContextVar(
    "steplog_step_call", default=None
)
"""The step call running in this context (None: not inside a step)."""


def current_call() -> StepCall | None:
    """The recorded step call running in this context, if any."""
    return ACTIVE_CALL.get()


def step_key() -> str:
    """The idempotency key of the recorded step running now: the same on every attempt at the
    same call (a retry after a crash, a resume, a re-execution), different for every other call.

    Hand it to an external system that deduplicates (a payment provider's idempotency key, a
    mail relay's message id): it closes the window between doing the work and recording it.
    Raises ``RuntimeError`` outside a recorded step (outside a run a step records nothing).
    """
    call = ACTIVE_CALL.get()
    if call is None:
        raise RuntimeError("step_key() is known only inside a @step called in a running workflow")
    return call.step_key


def is_run_context(annotation: Any) -> bool:
    """Whether a parameter annotated ``annotation`` receives the run's context (its class says
    so with ``__steplog_run_context__ = True``, as the functional ``RunContext`` does)."""
    return getattr(annotation, "__steplog_run_context__", False) is True


class StepWrapper(Generic[R]):
    """What ``@step`` returns: the function, recorded when called inside a running workflow.

    ``name`` names it in the log (the function's ``__name__`` by default). A parameter annotated
    ``RunContext`` (or named ``ctx``) receives the run's context, and is no part of the call's
    identity: the run's context is injected when the caller does not pass one. A graph handler
    has none to inject: it may pass its own (by keyword or in its place), else the parameter's
    default applies (none: Python's ``TypeError`` for the missing argument, never a silent
    None). ``after_failure`` is the retry policy after a failed handler (``AfterFailure``).
    ``record_arguments`` records each call's bound arguments beside its result (see ``step``).
    """

    def __init__(
        self,
        func: Callable[..., Awaitable[R]],
        *,
        name: str | None = None,
        replay_key: Callable[..., str] | None = None,
        after_failure: AfterFailure = "reuse",
        record_arguments: bool = False,
    ) -> None:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"@step can only decorate async functions, but "
                f"'{getattr(func, '__name__', func)}' is not a coroutine function."
            )
        if after_failure not in ("reuse", "rerun"):
            raise DefinitionError(
                f"@step after_failure must be 'reuse' or 'rerun', got {after_failure!r}"
            )
        if type(record_arguments) is not bool:
            raise DefinitionError(
                f"@step record_arguments must be True or False, got {record_arguments!r}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise DefinitionError(f"@step name must be a non-empty string, got {name!r}")
        if name is not None:
            require_storable(name, "a @step name")  # it is in every record of the step
        self._func = func
        self.name: str = name or func.__name__
        self.after_failure: AfterFailure = after_failure
        self.record_arguments = record_arguments
        self._replay_key = replay_key
        self._signature = inspect.signature(func)
        functools.update_wrapper(self, func)
        self._ctx_param: str | None = None
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            hints = {}
        for pname, param in self._signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if is_run_context(hints.get(pname, param.annotation)) or pname == "ctx":
                self._ctx_param = pname
                break
        self._identity_signature = self._signature.replace(
            parameters=[p for p in self._signature.parameters.values() if p.name != self._ctx_param]
        )
        # What a served result is rebuilt as: the enums, models and dataclasses the return
        # annotation names are the step's own declaration, as a handler's annotations are its.
        returns = hints.get("return", self._signature.return_annotation)
        self.result_types: tuple[type, ...] = tuple(value_classes(returns))
        self._positional = _positional_shape(self._identity_signature)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self.__call__, instance)

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The call's arguments by name, defaults applied, without the context parameter, and
        whether the caller passed the context itself (a graph handler may: it has no
        ``RunContext`` to inject). The arguments are bound as AF binds them, without the context
        parameter; only a call that does not bind so is bound with it.

        A call of positional arguments only, of a function whose parameters (the context's
        aside) are all positional (``_positional_shape``), and as many as they take, is bound by
        zipping, which gives ``bind``'s mapping without ``bind``."""
        shape = self._positional
        if shape is not None and not kwargs:
            names, defaults = shape
            given_ = len(args)
            if given_ == len(names):
                return dict(zip(names, args, strict=True)), False
            if len(names) - len(defaults) <= given_ < len(names):
                arguments = dict(zip(names, args, strict=False))
                for name, default in defaults[given_ - len(names) :]:
                    arguments[name] = default
                return arguments, False
        try:
            bound = self._identity_signature.bind(*args, **kwargs)
            given = False
        except TypeError:
            if self._ctx_param is None:
                raise
            bound = self._signature.bind(*args, **kwargs)  # raises for a call that does not fit
            given = self._ctx_param in bound.arguments
        bound.apply_defaults()
        arguments = bound.arguments
        if given:
            arguments = {k: v for k, v in arguments.items() if k != self._ctx_param}
        return arguments, given

    def _identity(
        self, arguments: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Identity, str | None]:
        auto = identity_digest(arguments)
        digest = auto if arguments else None
        if self._replay_key is not None:
            explicit = self._replay_key(*args, **kwargs)
            if not isinstance(explicit, str) or not explicit:
                raise ValueError(f"@step '{self.name}' replay_key must return a non-empty string.")
            try:
                named = explicit.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"@step '{self.name}' replay_key returned {explicit!r}, which is not valid "
                    "Unicode (a lone surrogate): it must be text UTF-8 can encode."
                ) from None
            return ("explicit", hashlib.sha256(named).hexdigest()), digest
        if auto is None:
            return ("order", ""), digest
        return ("auto", auto), digest

    def _with_ctx(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Put ``ctx`` where the function declares it, without taking a positional argument."""
        name = self._ctx_param
        if name is None:
            return args, dict(kwargs)
        out: list[Any] = []
        given = list(args)
        call_kwargs = dict(kwargs)
        for param in self._signature.parameters.values():
            if param.name == name:
                if param.kind is param.KEYWORD_ONLY:
                    call_kwargs[name] = ctx
                else:
                    out.append(ctx)
                continue
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and given:
                out.append(given.pop(0))
            elif param.kind is param.VAR_POSITIONAL:
                out.extend(given)
                given = []
        out.extend(given)
        return tuple(out), call_kwargs

    async def __call__(self, *args: Any, **kwargs: Any) -> R:
        host = ACTIVE_HOST.get()
        if host is None:
            return await self._func(*args, **kwargs)
        arguments, ctx_given = self._bound(args, kwargs)
        identity, digest = self._identity(arguments, args, kwargs)
        call = host.open(self.name, identity, digest, identity[0] != "order")
        call.args, call.kwargs, call.result_types = args, kwargs, self.result_types
        found, value = host.lookup(call, self.after_failure)
        if found:
            await host.served(call, value)
            return typing.cast(R, value)
        if self.record_arguments:
            call.arguments = dict(arguments)
        run_ctx = getattr(host, "run_context", None)
        if self._ctx_param is not None and not ctx_given and run_ctx is not None:
            args, kwargs = self._with_ctx(args, kwargs, run_ctx)
        await host.started(call)
        token = ACTIVE_CALL.set(call)
        call.started = time.perf_counter()
        try:
            result = await self._func(*args, **kwargs)
        except Exception as error:
            ACTIVE_CALL.reset(token)
            await host.finished(call, None, error)
            raise
        except BaseException:
            ACTIVE_CALL.reset(token)
            raise
        ACTIVE_CALL.reset(token)
        await host.finished(call, result, None)
        return result

    def __repr__(self) -> str:
        return f"<step {self.name!r}>"


@overload
def step(func: Callable[..., Awaitable[R]], /) -> StepWrapper[R]: ...


@overload
def step(
    *,
    name: str | None = None,
    replay_key: Callable[..., str] | None = None,
    after_failure: AfterFailure = "reuse",
    record_arguments: bool = False,
) -> Callable[[Callable[..., Awaitable[R]]], StepWrapper[R]]: ...


def step(
    func: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    replay_key: Callable[..., str] | None = None,
    after_failure: AfterFailure = "reuse",
    record_arguments: bool = False,
) -> StepWrapper[Any] | Callable[[Callable[..., Awaitable[Any]]], StepWrapper[Any]]:
    """Mark an async function as a recorded step: ``@step`` or ``@step(name=..., ...)``.

    Called inside a running workflow (a ``@workflow`` function, or a graph executor's handler),
    a step's call is recorded in the log when it returns (``StepRecorded``, durable at once), and
    a later attempt at the same work (the superstep retried after a crash, a cancellation, a lost
    lease or a dropped stream; a functional workflow re-executed on resume or after an answer) is
    served the recorded result instead of calling it. Outside a run it is the plain function.

    ``replay_key(*args, **kwargs)`` names each logical call when its arguments cannot (opaque
    objects), or when equal arguments do not mean interchangeable results; it must return a
    non-empty ``str`` unique among the calls of one invocation (a duplicate raises
    ``ValueError``). ``after_failure`` chooses what a retry after a *failed* handler does with
    the recorded call (``"reuse"``, the default, or ``"rerun"``); see docs/recovery.md. Inside a
    step, ``step_key()`` is its idempotency key. Raises ``TypeError`` for a function that is not
    async.

    With ``record_arguments=True`` each call that runs also records what it was called with
    (``StepRecorded.arguments``: its bound arguments, defaults applied, without its
    ``RunContext`` parameter, through the codec, taken before it runs), so that a reader can
    show them; a call served from the log records none. Off by default: arguments may be large
    or secret, and their digest is the call's identity either way. A call whose arguments the
    codec cannot store does not run: it raises ``EncodingError``, recorded as its error.
    """
    options: dict[str, Any] = {
        "name": name,
        "replay_key": replay_key,
        "after_failure": after_failure,
        "record_arguments": record_arguments,
    }
    if func is not None:
        return StepWrapper(func, **options)

    def decorate(fn: Callable[..., Awaitable[Any]]) -> StepWrapper[Any]:
        return StepWrapper(fn, **options)

    return decorate


def report_usage(**counts: int) -> None:
    """Add token counts (``input_tokens=...``, ``output_tokens=...``) to the recorded step
    running now; they are recorded with its result (``StepRecorded.usage``). Outside a recorded
    step it does nothing. Raises ``TypeError`` for a count that is not a non-negative ``int``."""
    call = ACTIVE_CALL.get()
    for name, count in counts.items():
        if type(count) is not int or count < 0:
            raise TypeError(f"usage {name!r} must be a non-negative int, got {count!r}")
    if call is not None:
        for name, count in counts.items():
            call.usage[name] = call.usage.get(name, 0) + count
