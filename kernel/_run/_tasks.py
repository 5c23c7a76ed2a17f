"""The tasks of a run: its executors' tasks in a superstep, and the run's own task.

Who cancelled what decides how a superstep closes: only the run's own cancellation (its task
cancelled, or the runner cancelling a closing superstep's executor tasks) is a cancellation; a
``CancelledError`` out of a handler otherwise is that executor's failure. And a cancellation
that reaches the run after its end is durable comes too late, and is withdrawn.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kernel._base._errors import ExecutionError

if TYPE_CHECKING:
    from kernel._run._superstep import Superstep

__all__ = [
    "cancel_and_wait",
    "cancelled_by_runner",
    "escaped_error",
    "stray_cancellation",
    "withdraw",
]


def escaped_error(done: set[asyncio.Task[None]]) -> BaseException | None:
    """An exception that escaped one of the finished executor tasks ``done``, if any."""
    return next((t.exception() for t in done if not t.cancelled() and t.exception()), None)


def withdraw(cancels: int) -> None:
    """Withdraw ``cancels`` cancellation requests of this task, which reached it after its run's
    end was durable: the run is over, and its caller gets the run's outcome, as the log has it.

    A handler that blocks the event loop (``time.sleep``) holds back its caller's timeout
    (``asyncio.wait_for``, ``asyncio.timeout``) until it returns; the cancellation then reaches
    the run wherever it next waits. If that is the group commit of its last superstep, the run
    has ended in the log whatever the cancellation does; raising it would tell the caller the
    run was cancelled (or timed out) while the log says it completed. So the run returns its
    result, as ``asyncio.wait_for`` does for an awaitable that finished despite its cancellation.
    """
    task = asyncio.current_task()
    assert task is not None
    for _ in range(cancels):
        task.uncancel()


def cancelled_by_runner(step: Superstep, *, inline: bool) -> bool:
    """Whether the task running a handler of ``step`` was cancelled by steplog: inline, the run's
    own task was cancelled (by its caller, a dropped stream, a lost lease); in an executor task,
    the runner cancelled it to close the superstep (a sibling failed, the run was cancelled).

    A ``CancelledError`` that comes out of a handler otherwise is the handler's failure: something
    it awaited was cancelled by someone else, or it cancelled its own executor task.
    """
    if inline:
        task = step.inline_task  # the run's own task
        return task is not None and task.cancelling() > 0
    return step.cancelling


def stray_cancellation(executor_id: str, error: asyncio.CancelledError) -> ExecutionError:
    """The failure recorded (and raised to the caller) for a handler that raised ``CancelledError``
    although steplog did not cancel it; the ``CancelledError`` is its ``__cause__``."""
    stray = ExecutionError(
        f"executor {executor_id!r} raised asyncio.CancelledError although its run was not "
        "cancelled: a task or future it awaited was cancelled by someone else, or it cancelled "
        "its own task. It is recorded as a failure of the executor, not as a cancellation"
    )
    stray.__cause__ = error
    return stray


async def cancel_and_wait(step: Superstep, tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel executor tasks and wait until all have finished, even if cancelled again."""
    step.cancelling = True
    for task in tasks:
        task.cancel()
    remaining = set(tasks)
    interrupted = False
    while remaining:
        try:
            _, remaining = await asyncio.wait(remaining)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
