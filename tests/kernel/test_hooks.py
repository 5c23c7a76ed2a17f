"""``RunHooks``: the calls a run makes as it goes, in order, and what a hook that raises does."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Never

import pytest

from kernel import (
    DEFAULT_STORE_ENV,
    DefinitionError,
    EventStore,
    ExecutionError,
    Executor,
    RunHooks,
    RunInfo,
    SuperstepInfo,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowExecutor,
    handler,
    open_store,
    response_handler,
)
from tests.kernel.helpers import kinds


class Recorder(RunHooks):
    """Writes each call into ``calls`` (shared between recorders, to see their order)."""

    def __init__(self, calls: list[tuple[Any, ...]] | None = None, name: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = [] if calls is None else calls
        self.name = name
        self.runs: list[RunInfo] = []

    def _add(self, *call: Any) -> None:
        self.calls.append((self.name, *call) if self.name else call)

    def run_started(self, run: RunInfo) -> None:
        self.runs.append(run)
        self._add("run_started", run.instance_id)

    def run_ended(self, run: RunInfo, status: str, error: BaseException | None) -> None:
        self._add("run_ended", status, _kind(error))

    def superstep_started(self, step: SuperstepInfo) -> None:
        self._add("superstep_started", step.index)

    def superstep_committed(self, step: SuperstepInfo) -> None:
        self._add("superstep_committed", step.index)

    def superstep_aborted(self, step: SuperstepInfo, reason: str, error: Any) -> None:
        self._add("superstep_aborted", step.index, reason, _kind(error))

    def executor_invoked(self, step: SuperstepInfo, executor_id: str, message: Any) -> None:
        self._add("executor_invoked", step.index, executor_id, message)

    def executor_completed(self, step: SuperstepInfo, executor_id: str) -> None:
        self._add("executor_completed", step.index, executor_id)

    def executor_failed(self, step: SuperstepInfo, executor_id: str, error: BaseException) -> None:
        self._add("executor_failed", step.index, executor_id, _kind(error))

    def message_sent(
        self, step: SuperstepInfo, source: str, message: Any, targets: tuple[str, ...]
    ) -> None:
        self._add("message_sent", step.index, source, message, targets)


def _kind(error: BaseException | None) -> str | None:
    return None if error is None else type(error).__name__


class Add(Executor):
    """Sends ``n + 1`` on."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n + 1)


class Out(Executor):
    """Stages and yields the message."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
        ctx.set_state(self.id, n)
        await ctx.yield_output(n)


class Fails(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never]) -> None:
        raise ValueError(f"{self.id} failed on {n}")


class Waits(Executor):
    """Says it ``entered``, then waits for ``go`` (never set: until cancelled)."""

    def __init__(self, id: str, go: asyncio.Event) -> None:
        super().__init__(id)
        self.go = go
        self.entered = asyncio.Event()

    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never]) -> None:
        self.entered.set()
        await self.go.wait()


def chain(*hooks: RunHooks, second: Executor | None = None, **kw: Any) -> Workflow:
    """add -> out (or ``second``)."""
    add = Add("add")
    builder = WorkflowBuilder(start_executor=add, **{"instance_id": "hooked", **kw})
    return builder.add_edge(add, second or Out("out")).with_hooks(*hooks).build()


async def test_a_two_superstep_run_calls_each_hook_in_order() -> None:
    hooks = Recorder()
    wf = chain(hooks)
    result = await wf.run(1)
    assert hooks.calls == [
        ("run_started", "hooked"),
        ("superstep_started", 1),
        ("executor_invoked", 1, "add", 1),
        ("message_sent", 1, "add", 2, ("out",)),
        ("executor_completed", 1, "add"),
        ("superstep_committed", 1),
        ("superstep_started", 2),
        ("executor_invoked", 2, "out", 2),
        ("executor_completed", 2, "out"),
        ("superstep_committed", 2),
        ("run_ended", "completed", None),
    ]
    (run,) = hooks.runs
    assert run == RunInfo("hooked", result.run_id, "add")


async def test_a_fan_out_brackets_each_executor_inside_its_superstep() -> None:
    hooks = Recorder()
    add, left, right = Add("add"), Out("left"), Out("right")
    wf = (
        WorkflowBuilder(start_executor=add)
        .add_fan_out_edges(add, [left, right])
        .with_hooks(hooks)
        .build()
    )
    await wf.run(1)
    assert hooks.calls[:6] == [
        ("run_started", wf.instance_id),
        ("superstep_started", 1),
        ("executor_invoked", 1, "add", 1),
        ("message_sent", 1, "add", 2, ("left", "right")),
        ("executor_completed", 1, "add"),
        ("superstep_committed", 1),
    ]
    second = hooks.calls[6:-1]
    assert (second[0], second[-1]) == (("superstep_started", 2), ("superstep_committed", 2))
    for executor_id in ("left", "right"):
        mine = [call for call in second if executor_id in call]
        assert mine == [
            ("executor_invoked", 2, executor_id, 2),
            ("executor_completed", 2, executor_id),
        ]
    assert len(second) == 6
    assert hooks.calls[-1] == ("run_ended", "completed", None)


async def test_a_failure_calls_executor_failed_then_superstep_aborted() -> None:
    hooks = Recorder()
    wf = chain(hooks, second=Fails("bad"))
    with pytest.raises(ValueError, match="bad failed on 2"):
        await wf.run(1)
    assert hooks.calls[-4:] == [
        ("executor_invoked", 2, "bad", 2),
        ("executor_failed", 2, "bad", "ValueError"),
        ("superstep_aborted", 2, "failed", "ValueError"),
        ("run_ended", "failed", "ValueError"),
    ]
    assert kinds(wf.events())[-2:] == ["superstep_aborted", "run_failed"]


async def test_a_sibling_cancelled_by_a_failure_gets_executor_failed_first() -> None:
    hooks = Recorder()
    add, waits, bad = Add("add"), Waits("waits", asyncio.Event()), Fails("bad")
    wf = (
        WorkflowBuilder(start_executor=add)
        .add_fan_out_edges(add, [waits, bad])
        .with_hooks(hooks)
        .build()
    )
    with pytest.raises(ValueError, match="bad failed on 2"):
        await wf.run(1)
    closing = hooks.calls[-4:]
    assert sorted(closing[:2]) == [
        ("executor_failed", 2, "bad", "ValueError"),
        ("executor_failed", 2, "waits", "CancelledError"),
    ]
    assert closing[2:] == [
        ("superstep_aborted", 2, "failed", "ValueError"),
        ("run_ended", "failed", "ValueError"),
    ]


async def test_a_cancelled_run_closes_every_call_it_opened() -> None:
    hooks, waits = Recorder(), Waits("waits", asyncio.Event())
    wf = chain(hooks, second=waits)
    task = asyncio.create_task(wf.run(1))
    await waits.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hooks.calls[-3:] == [
        ("executor_failed", 2, "waits", "CancelledError"),
        ("superstep_aborted", 2, "cancelled", None),
        ("run_ended", "cancelled", "CancelledError"),
    ]
    assert kinds(wf.events())[-2:] == ["superstep_aborted", "run_cancelled"]


class RaisesIn(Recorder):
    """Records every call, and raises ``RuntimeError`` in ``method`` (at superstep ``at``)."""

    def __init__(self, method: str, at: int | None = None, calls: list[Any] | None = None):
        super().__init__(calls)
        self.method, self.at = method, at

    def _add(self, *call: Any) -> None:
        super()._add(*call)
        if call[0] == self.method and (self.at is None or call[1] == self.at):
            raise RuntimeError(f"hook broke in {self.method}")


@pytest.mark.parametrize("method", ["executor_invoked", "message_sent", "executor_completed"])
async def test_a_hook_raising_about_an_executor_fails_that_executor(method: str) -> None:
    hooks = RaisesIn(method)
    wf = chain(hooks)
    with pytest.raises(ExecutionError, match=rf"hook RaisesIn\.{method} raised RuntimeError"):
        await wf.run(1)
    events = wf.events()
    assert kinds(events)[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]
    assert events[-3].executor_id == "add"
    assert "hook broke" in events[-1].error.message
    closing = (  # its one closing call: executor_completed, if that is what raised
        ("executor_completed", 1, "add")
        if method == "executor_completed"
        else ("executor_failed", 1, "add", "ExecutionError")
    )
    assert hooks.calls[-3:] == [
        closing,
        ("superstep_aborted", 1, "failed", "ExecutionError"),
        ("run_ended", "failed", "ExecutionError"),
    ]


async def test_an_executor_gets_one_closing_call_when_a_hook_raises_in_executor_completed():
    """Issue 22 review: with a hook raising in ``executor_completed``, the next hook was told
    ``executor_completed`` and then ``executor_failed`` for the same invocation."""
    calls: list[tuple[Any, ...]] = []
    broken, after = RaisesIn("executor_completed", calls=calls), Recorder(calls, "after")
    wf = chain(broken, after)
    with pytest.raises(ExecutionError, match=r"RaisesIn\.executor_completed"):
        await wf.run(1)
    mine = [call[1:] for call in calls if call[0] == "after"]
    closing = [c for c in mine if c[0] in ("executor_completed", "executor_failed")]
    opening = [c for c in mine if c[0] == "executor_invoked"]
    assert len(closing) == len(opening) == 1
    assert kinds(wf.events())[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]


class Swallows(Executor):
    """Sends, and swallows whatever ``send_message`` raises."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        with contextlib.suppress(Exception):  # the point: it cannot hide a hook's error
            await ctx.send_message(n + 1)


async def test_a_handler_cannot_swallow_what_message_sent_raised() -> None:
    swallows = Swallows("add")
    wf = (
        WorkflowBuilder(start_executor=swallows)
        .add_edge(swallows, Out("out"))
        .with_hooks(RaisesIn("message_sent"))
        .build()
    )
    with pytest.raises(ExecutionError, match="message_sent"):
        await wf.run(1)
    assert kinds(wf.events())[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]


@pytest.mark.parametrize(("method", "at"), [("run_started", None), ("superstep_started", 2),
                                            ("superstep_committed", 1)])  # fmt: skip
async def test_a_hook_raising_while_the_run_goes_on_fails_the_run(method: str, at: Any) -> None:
    hooks = RaisesIn(method, at)
    wf = chain(hooks)
    with pytest.raises(ExecutionError, match=rf"RaisesIn\.{method}"):
        await wf.run(1)
    events = wf.events()
    assert kinds(events)[-2:] == ["superstep_aborted", "run_failed"]
    aborted = 1 if method == "run_started" else 2
    started = [e for e in events if e.type == "superstep_started"]
    assert events[-2].superstep_id == started[aborted - 1].superstep_id
    assert hooks.calls[-1] == ("run_ended", "failed", "ExecutionError")
    opened = hooks.calls.count(("superstep_started", 2))
    assert hooks.calls.count(("superstep_aborted", 2, "failed", "ExecutionError")) == opened


@pytest.mark.parametrize(("method", "at"), [("run_ended", None), ("superstep_committed", 2)])
async def test_a_hook_raising_once_the_run_is_over_is_raised_and_the_log_stands(
    method: str, at: Any
) -> None:
    hooks = RaisesIn(method, at)
    wf = chain(hooks)
    with pytest.raises(ExecutionError, match=rf"RaisesIn\.{method}"):
        await wf.run(1)
    assert kinds(wf.events())[-2:] == ["superstep_committed", "run_completed"]
    assert wf.committed_state() == {"out": 2}
    assert hooks.calls[-1] == ("run_ended", "completed", None)


async def test_a_hook_raising_while_a_run_fails_is_a_note_on_the_run_s_error() -> None:
    wf = chain(RaisesIn("executor_failed"), second=Fails("bad"))
    with pytest.raises(ValueError, match="bad failed") as raised:
        await wf.run(1)
    assert any("RaisesIn.executor_failed" in note for note in raised.value.__notes__)
    assert kinds(wf.events())[-2:] == ["superstep_aborted", "run_failed"]


async def test_two_hooks_are_called_in_order_and_both_even_when_the_first_raises() -> None:
    calls: list[tuple[Any, ...]] = []
    first, second = Recorder(calls, "first"), Recorder(calls, "second")
    await chain(first, second).run(1)
    assert [call[0] for call in calls] == ["first", "second"] * (len(calls) // 2)
    assert [c[1:] for c in calls[::2]] == [c[1:] for c in calls[1::2]]

    calls.clear()
    broken = RaisesIn("run_started", calls=calls)
    with pytest.raises(ExecutionError, match=r"RaisesIn\.run_started"):
        await chain(broken, Recorder(calls, "after")).run(1)
    assert calls[:2] == [("run_started", "hooked"), ("after", "run_started", "hooked")]
    assert calls[-1] == ("after", "run_ended", "failed", "ExecutionError")


async def test_hooks_belong_to_their_workflow_not_to_the_process() -> None:
    mine, theirs = Recorder(), Recorder()
    store = open_store("memory://")
    ours = chain(mine, store=store)
    other = WorkflowBuilder(start_executor=Out("solo"), store=store, instance_id="other")
    await ours.run(1)
    await other.with_hooks(theirs).build().run(5)
    await chain(store=store, instance_id="bare").run(1)  # no hooks: nothing called
    assert {run.instance_id for run in mine.runs} == {"hooked"}
    assert [call[0] for call in theirs.calls].count("run_started") == 1
    assert theirs.runs[0].instance_id == "other"
    assert ("executor_invoked", 1, "solo", 5) in theirs.calls
    assert all(call[0] != "executor_invoked" or call[2] != "solo" for call in mine.calls)


def test_only_run_hooks_are_taken() -> None:
    with pytest.raises(DefinitionError, match="RunHooks"):
        WorkflowBuilder(start_executor=Out("out")).with_hooks(object())  # type: ignore[arg-type]


# -- continuations and sub-workflows -------------------------------------------------------------


class Asks(Executor):
    """Asks for a number, then yields what it is given."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.request_info(n, int)

    @response_handler
    async def answer(self, asked: int, given: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(asked + given)


async def test_a_continuation_after_a_response_and_a_resume_call_the_same_hooks() -> None:
    hooks = Recorder()
    wf = WorkflowBuilder(start_executor=Asks("asks")).with_hooks(hooks).build()
    first = await wf.run(1)
    assert hooks.calls[-2:] == [("superstep_committed", 1), ("run_ended", "awaiting_input", None)]
    hooks.calls.clear()
    (request,) = first.pending_requests
    second = await wf.run(responses={request.request_id: 41})
    assert second.get_outputs() == [42]
    assert hooks.calls == [
        ("run_started", wf.instance_id),
        ("superstep_started", 2),
        ("executor_invoked", 2, "asks", 41),
        ("executor_completed", 2, "asks"),
        ("superstep_committed", 2),
        ("run_ended", "completed", None),
    ]
    assert [run.continues for run in hooks.runs] == [None, first.run_id]


async def test_a_resumed_run_calls_its_hooks_and_names_the_run_it_continues(
    store: EventStore,
) -> None:
    hooks = Recorder()
    go = asyncio.Event()
    waits = Waits("waits", go)
    wf = chain(hooks, second=waits, store=store)
    task = asyncio.create_task(wf.run(1))
    await waits.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    hooks.calls.clear()
    go.set()
    await wf.resume()
    assert hooks.calls == [
        ("run_started", "hooked"),
        ("superstep_started", 2),
        ("executor_invoked", 2, "waits", 2),
        ("executor_completed", 2, "waits"),
        ("superstep_committed", 2),
        ("run_ended", "completed", None),
    ]
    assert hooks.runs[1].continues == hooks.runs[0].run_id


async def test_a_sub_workflow_s_run_calls_its_parent_s_hooks_inside_the_parent_executor() -> None:
    hooks, ignored = Recorder(), Recorder()
    inner = WorkflowBuilder(start_executor=Out("inner"), name="inner").with_hooks(ignored).build()
    add, sub = Add("add"), WorkflowExecutor(inner, id="sub")
    wf = WorkflowBuilder(start_executor=add).add_edge(add, sub).with_hooks(hooks).build()
    await wf.run(1)
    assert ignored.calls == []
    start = hooks.calls.index(("executor_invoked", 2, "sub", 2))
    end = hooks.calls.index(("executor_completed", 2, "sub"))
    assert [call[0] for call in hooks.calls[start + 1 : end]] == [
        "run_started",
        "superstep_started",
        "executor_invoked",
        "executor_completed",
        "superstep_committed",
        "run_ended",
    ]
    parent, child = hooks.runs
    assert child.workflow_name == "inner"
    assert child.parent is not None
    assert child.parent.run_id == parent.run_id
    assert (child.parent.index, child.parent_executor_id) == (2, "sub")
    assert child.instance_id.startswith(f"{parent.instance_id}/sub/")


def test_the_hooks_doc_example_prints_what_its_comments_say(tmp_path, monkeypatch, capsys):
    from tests.docs.test_docs import ROOT, promised_output, python_blocks

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DEFAULT_STORE_ENV, raising=False)
    example, *more = python_blocks(ROOT / "docs" / "hooks.md")
    promised = promised_output(example)
    assert len(promised) == 2
    namespace = {"__name__": "doc_hooks"}  # a doc's blocks run one after another, as tests/docs
    exec(compile(example, "hooks.md[example 1]", "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == promised
    for number, block in enumerate(more, start=2):  # StepInfo's, and any added later
        exec(compile(block, f"hooks.md[example {number}]", "exec"), namespace)
        assert capsys.readouterr().out.splitlines() == promised_output(block)


def test_an_async_hook_method_is_refused_rather_than_never_run() -> None:
    class Late(RunHooks):
        async def run_started(self, run: Any) -> None:  # never awaited: refused
            pass

    with pytest.raises(DefinitionError, match=r"Late\.run_started is async"):
        WorkflowBuilder(start_executor=Add("add")).with_hooks(Late())
