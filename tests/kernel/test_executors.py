"""Executors and functions as AF writes them: explicit types, sync and one-parameter functions,
the declared types an executor lists, and each bad signature refused when it is written.

A bad signature is refused when the handler is defined (``@handler``, ``@executor``), an
annotation that names a class defined later when the executor is made, and every refusal is a
``DefinitionError`` that is also the ``ValueError`` AF raises.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Never, TypeVar, Union

import pytest

from kernel import (
    DefinitionError,
    EventStore,
    Executor,
    ExecutorFailed,
    FunctionExecutor,
    MessageStaged,
    OutputYielded,
    RunFailed,
    StateStaged,
    StateWriteRejectedError,
    SuperstepAborted,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowMessage,
    executor,
    handler,
    response_handler,
)
from tests.kernel.helpers import kinds, markers, of_type

T = TypeVar("T")


@dataclass
class Note:
    text: str


@dataclass
class Reply:
    text: str


# -- refused when defined ------------------------------------------------------------------------


def define_unannotated_message() -> None:
    class E(Executor):
        @handler
        async def run(self, message, ctx: WorkflowContext) -> None:  # type: ignore[no-untyped-def]
            pass


def define_three_parameters() -> None:
    class E(Executor):
        @handler
        async def run(self, message: str, other: str, ctx: WorkflowContext) -> None:
            pass


def define_unannotated_ctx() -> None:
    class E(Executor):
        @handler
        async def run(self, message: str, ctx) -> None:  # type: ignore[no-untyped-def]
            pass


def define_ctx_of_another_type() -> None:
    class E(Executor):
        @handler
        async def run(self, message: str, ctx: str) -> None:
            pass


def define_sync_handler() -> None:
    class E(Executor):
        @handler  # type: ignore[type-var]
        def run(self, message: str, ctx: WorkflowContext) -> None:
            pass


def define_typevar_message() -> None:
    class E(Executor, Generic[T]):
        @handler
        async def run(self, message: T, ctx: WorkflowContext) -> None:
            pass


def define_typevar_output() -> None:
    class E(Executor, Generic[T]):
        @handler
        async def run(self, message: str, ctx: WorkflowContext[T]) -> None:
            pass


def define_function_without_parameters() -> None:
    @executor
    async def run() -> None:
        pass


def define_function_with_three_parameters() -> None:
    @executor
    async def run(message: str, ctx: WorkflowContext, extra: int) -> None:
        pass


def define_function_unannotated() -> None:
    @executor
    def run(message):  # type: ignore[no-untyped-def]
        pass


def define_function_keyword_only() -> None:
    @executor
    async def run(message: str, *, ctx: WorkflowContext) -> None:
        pass


def define_staticmethod() -> None:
    class Holder:
        @executor  # type: ignore[arg-type]
        @staticmethod
        async def run(message: str) -> None:
            pass


def define_generator() -> None:
    @executor
    def run(message: str, ctx: WorkflowContext[str]):  # type: ignore[no-untyped-def]
        yield message


def define_response_handler_with_two_parameters() -> None:
    class E(Executor):
        @handler
        async def run(self, message: str, ctx: WorkflowContext) -> None:
            pass

        @response_handler
        async def answer(self, response: str, ctx: WorkflowContext) -> None:
            pass


REFUSED_WHEN_DEFINED: list[tuple[Callable[[], None], str]] = [
    (define_unannotated_message, "type annotation for the message parameter 'message'"),
    (define_three_parameters, "must have (self, message: T, ctx: WorkflowContext[U, V])"),
    (define_unannotated_ctx, "parameter 'ctx' must have a WorkflowContext annotation"),
    (define_ctx_of_another_type, "must be annotated as WorkflowContext"),
    (define_sync_handler, "must be an async function"),
    (define_typevar_message, "type variable"),
    (define_typevar_output, "type variable"),
    (define_function_without_parameters, "must have (message: T) or (message: T, ctx"),
    (define_function_with_three_parameters, "it has (message, ctx, extra)"),
    (define_function_unannotated, "type annotation for the message parameter"),
    (define_function_keyword_only, "all positional"),
    (define_staticmethod, "cannot be used with @staticmethod"),
    (define_generator, "is a generator"),
    (define_response_handler_with_two_parameters, "(self, original_request, response, ctx)"),
]


@pytest.mark.parametrize(
    ("define", "says"), REFUSED_WHEN_DEFINED, ids=[d.__name__ for d, _ in REFUSED_WHEN_DEFINED]
)
def test_a_bad_signature_is_refused_when_it_is_defined_as_a_value_error(
    define: Callable[[], None], says: str
) -> None:
    with pytest.raises(DefinitionError) as caught:
        define()
    assert isinstance(caught.value, ValueError)  # what AF code catches
    assert says in str(caught.value)


# -- refused when made ---------------------------------------------------------------------------


def test_an_executor_without_handlers_or_with_two_for_one_type_is_refused_when_made() -> None:
    class Empty(Executor):
        pass

    class Twice(Executor):
        @handler
        async def first(self, message: str, ctx: WorkflowContext) -> None:
            pass

        @handler
        async def second(self, message: str, ctx: WorkflowContext) -> None:
            pass

    with pytest.raises(DefinitionError, match="has no @handler methods"):
        Empty("empty")
    with pytest.raises(DefinitionError, match="two handlers for str, first and second"):
        Twice("twice")
    with pytest.raises(ValueError, match="non-empty string"):
        Twice("")


class UsesALaterClass(Executor):
    @handler
    async def run(self, message: DefinedLater, ctx: WorkflowContext[DefinedLater]) -> None:
        await ctx.send_message(message)


@dataclass
class DefinedLater:
    n: int


def test_an_annotation_naming_a_later_class_resolves_when_the_executor_is_made() -> None:
    made = UsesALaterClass("later")
    assert made.input_types == [DefinedLater]
    assert made.output_types == [DefinedLater]


def test_an_annotation_that_never_resolves_is_refused_when_the_executor_is_made() -> None:
    class Unresolved(Executor):  # defining it is fine: the class may come later
        @handler
        async def run(self, message: NeverDefined, ctx: WorkflowContext) -> None:  # type: ignore[name-defined]  # noqa: F821
            pass

    with pytest.raises(DefinitionError, match="cannot resolve the annotations of handler"):
        Unresolved("x")


# -- declared types ------------------------------------------------------------------------------


def test_an_executor_lists_the_types_its_handlers_declare() -> None:
    class Mixed(Executor):
        @handler
        async def text(self, message: str, ctx: WorkflowContext[int | str, Note]) -> None:
            pass

        @handler
        async def numbers(self, message: list[int], ctx: WorkflowContext[Never, bool]) -> None:
            pass

        @handler
        async def silent(self, message: Note, ctx: WorkflowContext) -> None:
            pass

        @response_handler
        async def answer(self, request: str, response: int, ctx: WorkflowContext[float]) -> None:
            pass

    mixed = Mixed("mixed")
    assert mixed.input_types == [str, list[int], Note]
    assert mixed.output_types == [int, str, float]
    assert mixed.workflow_output_types == [Note, bool]
    assert mixed.to_dict() == {"id": "mixed", "type": "Mixed"}
    assert Mixed("typed", type="custom").to_dict() == {"id": "typed", "type": "custom"}


def test_a_bare_context_declares_nothing_and_any_is_kept() -> None:
    @executor
    async def bare(message: Any, ctx: WorkflowContext) -> None:
        pass

    @executor
    async def anything(message: str, ctx: WorkflowContext[Any, Any]) -> None:
        pass

    assert (bare.input_types, bare.output_types, bare.workflow_output_types) == ([Any], [], [])
    assert (anything.output_types, anything.workflow_output_types) == ([Any], [Any])


def test_explicit_types_override_their_own_annotation_only() -> None:
    @executor(id="explicit", input=bytes, output=float)
    async def both(message: str, ctx: WorkflowContext[int, bool]) -> None:
        pass

    @executor(input=Union[str, int], workflow_output="Note | Reply")  # noqa: UP007 - AF spells it so
    async def texts(message, ctx: WorkflowContext) -> None:  # type: ignore[no-untyped-def]
        pass

    def plain(message, ctx):  # type: ignore[no-untyped-def]
        pass

    built = FunctionExecutor(plain, "built", input=dict, output=list, workflow_output="Note")

    assert both.id == "explicit"
    assert (both.input_types, both.output_types, both.workflow_output_types) == (
        [bytes],
        [float],
        [bool],
    )
    assert texts.input_types == [Union[str, int]]  # noqa: UP007
    assert texts.workflow_output_types == [Note, Reply]
    assert texts.can_handle("a")
    assert texts.can_handle(1)
    assert not texts.can_handle(1.5)
    assert (built.id, built.input_types, built.output_types) == ("built", [dict], [list])
    assert built.workflow_output_types == [Note]


def test_explicit_types_on_a_handler_need_no_annotations() -> None:
    class Explicit(Executor):
        @handler(input=str, output=Note, workflow_output=Reply)
        async def run(self, message, ctx) -> None:  # type: ignore[no-untyped-def]
            pass

    made = Explicit("explicit")
    assert (made.input_types, made.output_types, made.workflow_output_types) == (
        [str],
        [Note],
        [Reply],
    )


def test_can_handle_takes_a_workflow_message_and_checks_items_and_literals() -> None:
    class Picky(Executor):
        @handler
        async def ints(self, message: list[int], ctx: WorkflowContext) -> None:
            pass

        @handler
        async def pairs(self, message: dict[str, Note], ctx: WorkflowContext) -> None:
            pass

        @handler
        async def go(self, message: Literal["go"], ctx: WorkflowContext) -> None:
            pass

    picky = Picky("picky")
    assert picky.can_handle([1, 2])
    assert picky.can_handle(WorkflowMessage([3], source_id="a"))
    assert not picky.can_handle(["a"])
    assert not picky.can_handle([1, "a"])
    assert picky.can_handle({"k": Note("x")})
    assert not picky.can_handle({"k": 1})
    assert picky.can_handle("go")
    assert not picky.can_handle("stop")
    assert not picky.can_handle(WorkflowMessage(2.5, source_id="a"))


# -- running -------------------------------------------------------------------------------------


async def test_handlers_are_chosen_by_the_items_of_a_generic_message(store: EventStore) -> None:
    class Sorter(Executor):
        @handler
        async def ints(self, message: list[int], ctx: WorkflowContext) -> None:
            ctx.set_state("ints", message)

        @handler
        async def texts(self, message: list[str], ctx: WorkflowContext) -> None:
            ctx.set_state("texts", message)

    wf = WorkflowBuilder(start_executor=Sorter("sorter"), store=store).build()
    await wf.run(["a", "b"])
    await wf.run([1, 2])
    assert wf.committed_state() == {"ints": [1, 2], "texts": ["a", "b"]}


async def test_sync_functions_run_in_a_worker_thread_and_their_ctx_calls_are_logged(
    store: EventStore,
) -> None:
    threads: list[bool] = []

    @executor(id="upper")
    def upper(text: str, ctx: WorkflowContext[str]) -> None:
        threads.append(threading.current_thread() is threading.main_thread())
        ctx.set_state("seen", text)
        ctx.send_message(text.upper())  # no await: the call runs on the loop, and returns

    @executor(id="reverse", input=str, workflow_output=str)
    def reverse(text, ctx):  # type: ignore[no-untyped-def]
        ctx.yield_output(text[::-1] + ctx.get_state("seen"))

    wf = WorkflowBuilder(start_executor=upper, store=store).add_edge(upper, reverse).build()
    result = await wf.run("abc")

    assert result.outputs == ["CBAabc"]
    assert threads == [False]
    assert wf.committed_state() == {"seen": "abc"}
    events = wf.events()
    assert [e.key for e in events if isinstance(e, StateStaged)] == ["seen"]
    assert [e.message for e in events if isinstance(e, MessageStaged)] == ["ABC"]
    assert [e.value for e in events if isinstance(e, OutputYielded)] == ["CBAabc"]
    assert set(markers(wf).values()) == {"committed"}


async def test_one_parameter_functions_run_as_terminal_executors(store: EventStore) -> None:
    seen: list[str] = []

    @executor(id="fan")
    async def fan(text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(text)

    @executor(id="async_sink")
    async def async_sink(text: str) -> None:
        seen.append(f"async:{text}")

    @executor(id="sync_sink")
    def sync_sink(text: str) -> str:
        seen.append(f"sync:{text}")
        return "returned values are not messages"

    wf = (
        WorkflowBuilder(start_executor=fan, store=store)
        .add_fan_out_edges(fan, [async_sink, sync_sink])
        .build()
    )
    result = await wf.run("x")

    assert result.status == "completed"
    assert sorted(seen) == ["async:x", "sync:x"]
    completed = {e.executor_id for e in of_type(wf.events(), "executor_completed")}
    assert completed == {"fan", "async_sink", "sync_sink"}
    assert not of_type(wf.events(), "message_staged")[1:]  # only fan's message


async def test_a_failing_sync_function_aborts_its_superstep_and_its_writes(
    store: EventStore,
) -> None:
    @executor(id="fails")
    def fails(n: int, ctx: WorkflowContext) -> None:
        ctx.set_state("before", n)
        raise RuntimeError("sync failure")

    wf = WorkflowBuilder(start_executor=fails, store=store).build()
    with pytest.raises(RuntimeError, match="sync failure"):
        await wf.run(1)

    assert wf.committed_state() == {}
    events = wf.events()
    assert [e.key for e in events if isinstance(e, StateStaged)] == ["before"]
    assert set(markers(wf).values()) == {"aborted:failed"}
    assert [e.error.message for e in events if isinstance(e, ExecutorFailed)] == ["sync failure"]
    assert kinds(events)[-2:] == ["superstep_aborted", "run_failed"]


async def test_a_sync_function_returning_a_coroutine_fails_its_run(store: EventStore) -> None:
    async def later(n: int) -> None:
        pass

    @executor(id="lazy")
    def lazy(n: int, ctx: WorkflowContext) -> Any:
        return later(n)

    wf = WorkflowBuilder(start_executor=lazy, store=store).build()
    with pytest.raises(DefinitionError, match="returned an awaitable"):
        await wf.run(1)
    assert len(of_type(wf.events(), "superstep_aborted")) == 1
    assert isinstance(wf.events()[-1], RunFailed)
    assert isinstance(wf.events()[-2], SuperstepAborted)


def test_an_edge_from_a_function_without_ctx_can_never_deliver() -> None:
    @executor
    async def quiet(text: str) -> None:
        pass

    @executor
    async def after(text: str, ctx: WorkflowContext) -> None:
        pass

    with pytest.raises(DefinitionError, match="can never deliver"):
        WorkflowBuilder(start_executor=quiet).add_edge(quiet, after).build()


async def test_a_sync_function_still_running_after_its_run_is_cancelled_writes_nothing(
    store: EventStore,
) -> None:
    started, resume, finished = threading.Event(), threading.Event(), threading.Event()
    refused: list[BaseException] = []

    @executor(id="slow")
    def slow(n: int, ctx: WorkflowContext[int]) -> None:
        started.set()
        resume.wait(timeout=30)
        try:
            ctx.set_state("late", n)
        except StateWriteRejectedError as error:
            refused.append(error)
        finally:
            finished.set()

    wf = WorkflowBuilder(start_executor=slow, store=store).build()
    task = asyncio.create_task(wf.run(1))
    await asyncio.to_thread(started.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    resume.set()
    await asyncio.to_thread(finished.wait, 30)  # its write ran on the loop, and was refused

    assert len(refused) == 1
    assert "refused" in str(refused[0])
    assert not [e for e in wf.events() if isinstance(e, StateStaged)]
    assert set(markers(wf).values()) == {"aborted:cancelled"}
    assert kinds(wf.events())[-1] == "run_cancelled"


async def test_a_response_handler_takes_explicit_types_and_what_it_sends_counts_for_edges(
    store: EventStore,
) -> None:
    class Asker(Executor):
        @handler
        async def ask(self, message: str, ctx: WorkflowContext[Never]) -> None:
            await ctx.request_info(message, int)

        @response_handler(request=str, response=int, output=Note)
        async def answered(self, original, response, ctx) -> None:  # type: ignore[no-untyped-def]
            await ctx.send_message(Note(f"{original}={response}"))

    @executor(id="after")
    async def after(note: Note, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(note.text)

    asker = Asker("asker")
    assert asker.output_types == [Note]
    assert asker.response_handlers[0].requests == (str,)
    assert asker.response_handlers[0].responses == (int,)
    # Only the response handler sends: the edge is accepted because it declares a Note.
    wf = WorkflowBuilder(start_executor=asker, store=store).add_edge(asker, after).build()
    asked = await wf.run("q")
    (request,) = asked.pending_requests
    answered = await wf.run(responses={request.request_id: 42})
    assert answered.outputs == ["q=42"]


async def test_a_callable_object_and_a_partial_are_executor_functions_too(
    store: EventStore,
) -> None:
    class Doubler:
        async def __call__(self, n: int, ctx: WorkflowContext[int]) -> None:
            await ctx.send_message(n * 2)

    def record(key: str, n: int, ctx: WorkflowContext) -> None:
        ctx.set_state(key, n)

    doubler = FunctionExecutor(Doubler(), "doubler")
    recorder = FunctionExecutor(functools.partial(record, "got"), "recorder")
    assert (doubler.input_types, doubler.output_types) == ([int], [int])
    assert recorder.input_types == [int]
    wf = WorkflowBuilder(start_executor=doubler, store=store).add_edge(doubler, recorder).build()
    await wf.run(21)
    assert wf.committed_state() == {"got": 42}
