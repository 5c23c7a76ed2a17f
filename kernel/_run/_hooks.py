"""``RunHooks``: the one seam where code outside the kernel follows a run as it goes.

A run calls its hooks at its boundaries: run started and ended, superstep started, committed or
aborted, executor invoked, completed or failed, message sent. Hooks are handed to a workflow
(``WorkflowBuilder.with_hooks``), never registered globally; tracing, metrics or step recording
plug in here instead of editing the runner. They see values (ids, indexes, the messages and
errors themselves), never the runner's objects.

``HookChain`` is how the runner calls several hooks as one: in the order given, every hook
called even when one raises, and what a hook raises wrapped in ``ExecutionError`` naming it.
``RunHookCalls`` is one run's side of it: which run and superstep it reported opened (so each
gets its one closing call), and what hooks raised while the run was ending. What the runner does
with a hook's error is written in ``RunHooks``'s docstring (and docs/hooks.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kernel._base._errors import DefinitionError, ExecutionError
from kernel._log._events import AbortReason

__all__ = [
    "HookChain",
    "RunHookCalls",
    "RunHooks",
    "RunInfo",
    "RunStatus",
    "StepInfo",
    "SuperstepInfo",
    "chain_hooks",
]

RunStatus = Literal["completed", "awaiting_input", "failed", "cancelled", "abandoned"]
"""How a run ended, as ``run_ended`` is told: the run's end in the log (``RunCompleted``,
``RunAwaitingInput``, ``RunFailed``, ``RunCancelled``, ``RunAbandoned``)."""


@dataclass(frozen=True, slots=True)
class SuperstepInfo:
    """One superstep, as hooks see it: its instance and run, its index in the run (from 1, counted
    across continuations) and its id (``superstep_id`` of its events in the log)."""

    instance_id: str
    run_id: str
    index: int
    superstep_id: str


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run, as hooks see it.

    ``continues`` is the run it continues (``resume()``, ``run(responses=...)``,
    ``run(checkpoint_id=...)``), None for a run started with a message. A sub-workflow's run (a
    *child*, run by a ``WorkflowExecutor``) has ``parent``, the parent's superstep it runs in, and
    ``parent_executor_id``, the executor that runs it; both are None for any other run.
    """

    instance_id: str
    run_id: str
    workflow_name: str
    continues: str | None = None
    parent: SuperstepInfo | None = None
    parent_executor_id: str | None = None


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One call of a recorded step (``@step``), as hooks see it once it is over.

    ``executor_id`` is the executor whose handler called it, ``name`` the step's name, ``key`` its
    identity in the attempt and ``step_key`` its idempotency key; ``call`` its call index in the
    invocation. ``reused`` says it was served from the log (``position``: the record served),
    else it ran for ``duration`` seconds and returned, or raised ``error``; ``position`` is then
    the stream position of its ``StepRecorded``. ``usage`` are the token counts it reported.
    """

    executor_id: str
    name: str
    key: str
    step_key: str
    call: int
    duration: float
    reused: bool
    position: int | None = None
    error: BaseException | None = None
    usage: dict[str, int] | None = None


class RunHooks:
    """Calls a run makes as it goes; subclass it and override the ones you need.

    Every method does nothing by default. Give hooks to a workflow with
    ``WorkflowBuilder(...).with_hooks(hooks, ...)``: every run of that workflow calls them, in the
    order given (a run with a message, ``resume()``, ``run(responses=...)`` alike), and so does
    every sub-workflow run it makes (a child runs with its parent's hooks, not those of the
    workflow it wraps). Nothing is global: two workflows have their own hooks.

    The calls, for a run that starts: ``run_started``; for each superstep ``superstep_started``,
    then for each message delivered ``executor_invoked``, the handler's ``message_sent`` calls,
    and ``executor_completed`` or ``executor_failed``; then ``superstep_committed`` or
    ``superstep_aborted``; and last ``run_ended``. Each ``*_started`` or ``*_invoked`` call is
    followed by exactly one closing call (an executor the runner cancels gets ``executor_failed``
    with a ``CancelledError``), and the closing calls come after the log holds what they say:
    ``superstep_committed`` once the commit is durable, ``run_ended`` once the run's end is.
    A run refused before it starts (``PendingRequestsError``, ``RunInProgressError``, ...) calls
    nothing.

    Hooks are called synchronously, on the run's event loop (``executor_*`` and ``message_sent``
    in the executor's task): they must not block. They observe; they cannot change what a
    handler sees. What one raises is never swallowed (an ``Exception``; a ``BaseException``
    such as ``KeyboardInterrupt`` unwinds the run as usual):

    * raised in ``executor_invoked``, ``message_sent`` or ``executor_completed``, it is that
      executor's failure, as if its handler had raised it (wrapped in ``ExecutionError`` naming
      the hook): the log records ``ExecutorFailed``, the superstep's abort and ``RunFailed``,
      and the run raises it;
    * raised in ``run_started``, ``superstep_started`` or a ``superstep_committed`` that leaves
      the run going, it fails the run: the open superstep's ``SuperstepAborted`` and
      ``RunFailed`` are appended, and the run raises it;
    * raised in a call made while the run is ending (``executor_failed``, ``superstep_aborted``,
      the last ``superstep_committed``, ``run_ended``), it cannot change how the run ends, as
      the log has it: the run's own error is raised with the hook's error added as a note, and a
      run that completed (or waits for input) raises the hook's error instead of returning.

    Whatever hooks do, every superstep still gets its marker and the run its end in the log.
    """

    def run_started(self, run: RunInfo) -> None:
        """The run's ``RunStarted`` is in the log and its first superstep is about to run."""

    def run_ended(self, run: RunInfo, status: RunStatus, error: BaseException | None) -> None:
        """The run is over: ``status`` is its end in the log; ``error`` what the run raises
        (None when it completed or waits for input). A run that lost its instance's lease to
        another process ends ``abandoned`` (the other process records it) with the
        ``RunInProgressError`` it raises."""

    def superstep_started(self, step: SuperstepInfo) -> None:
        """Superstep ``step`` is open in the log; its executors are about to run."""

    def superstep_committed(self, step: SuperstepInfo) -> None:
        """``step``'s ``SuperstepCommitted`` is durable: what it staged counts."""

    def superstep_aborted(
        self, step: SuperstepInfo, reason: AbortReason, error: BaseException | None
    ) -> None:
        """``step`` closed without committing (its ``SuperstepAborted`` has ``reason``): nothing it
        staged counts. ``error`` is the failure (None for a cancellation)."""

    def executor_invoked(self, step: SuperstepInfo, executor_id: str, message: Any) -> None:
        """``executor_id``'s handler is about to run on ``message`` (a response's value, for a
        response handler)."""

    def executor_completed(self, step: SuperstepInfo, executor_id: str) -> None:
        """``executor_id``'s handler returned (recorded as ``ExecutorCompleted`` right after)."""

    def executor_failed(self, step: SuperstepInfo, executor_id: str, error: BaseException) -> None:
        """``executor_id``'s handler raised ``error``, or the runner cancelled it (a sibling
        failed, or the run was cancelled: ``error`` is then an ``asyncio.CancelledError``)."""

    def step_finished(self, step: SuperstepInfo, call: StepInfo) -> None:
        """A recorded step called by a handler of ``step`` is over: it was served from the log,
        or it ran and its ``StepRecorded`` is durable. What the hook raises fails the executor
        once its handler returns, as ``message_sent``'s does."""

    def message_sent(
        self, step: SuperstepInfo, source: str, message: Any, targets: tuple[str, ...]
    ) -> None:
        """``source`` sent ``message`` to ``targets`` (staged: delivered next superstep if ``step``
        commits). A message no edge delivers is not reported."""


_HOOKED = tuple(
    name for name, value in vars(RunHooks).items() if callable(value) and not name.startswith("_")
)


class HookChain(RunHooks):
    """Several ``RunHooks`` called as one, in the order given.

    Each call reaches every hook that overrides the method (the others are skipped), even when
    one raises; then the first hook's error is raised, wrapped in ``ExecutionError`` naming the
    hook and the call (the hook's exception is its ``__cause__``; the others are added as notes).
    """

    def __init__(self, hooks: tuple[RunHooks, ...]) -> None:
        self.hooks = hooks
        for name in _HOOKED:
            default = getattr(RunHooks, name)
            calls = tuple(
                (hook, getattr(hook, name))
                for hook in hooks
                if getattr(type(hook), name, default) is not default
            )
            setattr(self, name, _caller(name, calls))

    def __repr__(self) -> str:
        return f"HookChain({', '.join(repr(hook) for hook in self.hooks)})"


def _caller(name: str, calls: tuple[tuple[RunHooks, Callable[..., None]], ...]) -> Any:
    """The method ``name`` of a chain: each of ``calls`` in order, then the first error."""

    def call(*args: Any) -> None:
        failure: ExecutionError | None = None
        for hook, method in calls:
            try:
                method(*args)
            except Exception as error:
                wrapped = ExecutionError(
                    f"hook {type(hook).__qualname__}.{name} raised "
                    f"{type(error).__qualname__}: {error}"
                )
                wrapped.__cause__ = error
                if failure is None:
                    failure = wrapped
                else:
                    failure.add_note(str(wrapped))
        if failure is not None:
            raise failure

    return call


def chain_hooks(hooks: Iterable[RunHooks]) -> HookChain | None:
    """The chain of ``hooks`` (None when there are none: a run without hooks checks nothing
    else). Raises ``DefinitionError`` for an item that is not a ``RunHooks``, or one with an
    ``async def`` hook method (it would never run)."""
    found = tuple(hooks)
    for hook in found:
        if not isinstance(hook, RunHooks):
            raise DefinitionError(
                f"hooks must be RunHooks instances (subclass kernel.RunHooks), got "
                f"{type(hook).__qualname__}"
            )
        for name in _HOOKED:
            if inspect.iscoroutinefunction(getattr(type(hook), name, None)):
                raise DefinitionError(
                    f"hook {type(hook).__qualname__}.{name} is async: hooks are called on the "
                    "run's event loop and never awaited; define it with def (start a task from "
                    "it if it must await)"
                )
    return HookChain(found) if found else None


class RunHookCalls:
    """One run's calls to its hooks (``chain``), with what the run must remember of them.

    ``run`` and ``step`` are the run and superstep reported started and not yet closed. A call
    made while the run is ending (``late``) cannot change how it ends: what it raises is kept,
    never dropped, and ``run_ended`` deals with it. The other calls raise into the run.
    """

    __slots__ = ("_late", "chain", "run", "step")

    def __init__(self, chain: HookChain) -> None:
        self.chain = chain
        self.run: RunInfo | None = None
        self.step: SuperstepInfo | None = None
        self._late: list[BaseException] = []

    def late(self, name: str, *args: Any) -> None:
        """Call hook ``name``, keeping what it raises for ``run_ended``."""
        try:
            getattr(self.chain, name)(*args)
        except Exception as error:
            self._late.append(error)

    def run_started(self, run: RunInfo) -> None:
        self.run = run
        self.chain.run_started(run)

    def superstep_started(self, step: SuperstepInfo) -> None:
        self.step = step
        self.chain.superstep_started(step)

    def superstep_committed(self, step: SuperstepInfo, *, going_on: bool) -> None:
        """The commit of ``step`` is durable; ``going_on``: the run has a next superstep (then
        what the hook raises fails the run; else it is ``late``)."""
        self.step = None
        if going_on:
            self.chain.superstep_committed(step)
        else:
            self.late("superstep_committed", step)

    def superstep_aborted(self, reason: AbortReason, error: BaseException | None) -> None:
        """The superstep reported started closed without committing."""
        step, self.step = self.step, None
        if step is not None:
            self.late("superstep_aborted", step, reason, error)

    def executor_failed(
        self,
        step: SuperstepInfo,
        executor_id: str,
        error: BaseException,
        also: BaseException | None = None,
    ) -> None:
        """``executor_id`` failed with ``error``; ``also``, a hook's error it failed after, is
        added to ``error`` as a note."""
        if also is not None:
            error.add_note(f"and a hook failed before: {also}")
        self.late("executor_failed", step, executor_id, error)

    def run_ended(self, status: RunStatus, error: BaseException | None) -> BaseException | None:
        """Call ``run_ended`` (if ``run_started`` was), then deal with what hooks raised while
        the run was ending: added as notes to ``error``, the run's own, if it has one; else the
        first of them is returned, for the run to raise (the others as its notes)."""
        run, self.run = self.run, None
        if run is not None:
            self.late("run_ended", run, status, error)
        late, self._late = self._late, []
        if not late:
            return None
        if error is not None:
            for hook_error in late:
                error.add_note(f"and while the run ended: {hook_error}")
            return None
        for hook_error in late[1:]:
            late[0].add_note(f"and: {hook_error}")
        return late[0]


# The public classes report the package that exports them, not this private module.
for _cls in (RunHooks, RunInfo, StepInfo, SuperstepInfo):
    _cls.__module__ = "kernel"
del _cls
