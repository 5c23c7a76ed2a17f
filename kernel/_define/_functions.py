"""Function executors: ``@executor`` turns a function ``(message: T)`` or ``(message: T, ctx)``,
async or sync, into a ``FunctionExecutor``.

A sync function runs in a worker thread, so it does not hold up the event loop; the ``ctx`` it is
given (``_ThreadContext``) runs each call on the event loop and waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, overload

from kernel._base._errors import DefinitionError
from kernel._define._context import WorkflowContext
from kernel._define._executor import HANDLER_MARK, Executor
from kernel._define._signatures import (
    FUNCTION_SHAPE,
    HandlerOptions,
    HandlerSpec,
    handler_spec,
    positional_params,
    refuse_descriptor,
)

__all__ = ["FunctionExecutor", "executor"]


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
        refuse_descriptor(func, "@executor")
        if not callable(func):
            raise DefinitionError(f"an executor function must be callable, got {func!r}")
        name = getattr(func, "__qualname__", repr(func))
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise DefinitionError(
                f"executor function {name} is a generator, whose body would never run: send "
                "each item with ctx.send_message (or yield it with ctx.yield_output) instead"
            )
        marked = getattr(func, HANDLER_MARK, None) or HandlerOptions()
        self._options = HandlerOptions(
            input if input is not None else marked.input,
            output if output is not None else marked.output,
            workflow_output if workflow_output is not None else marked.workflow_output,
        )
        self.func = func
        self._is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - an object with an async __call__
        )
        self._takes_ctx = (
            len(positional_params(func, FUNCTION_SHAPE, f"executor function {name}")) == 2
        )
        super().__init__(id or getattr(func, "__name__", None) or "FunctionExecutor")

    def _discover(self) -> list[tuple[HandlerSpec, Callable[..., Awaitable[Any]]]]:
        name = getattr(self.func, "__name__", self.id)
        spec = handler_spec(name, self.func, self._options, method=False, strict=True)
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
