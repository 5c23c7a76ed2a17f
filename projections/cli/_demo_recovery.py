"""The demo's second act: a run killed mid-superstep, recovered, resumed; then a fork.

A child process runs a four-step order pipeline and kills itself with SIGKILL in the third
superstep, after staging a write. The parent recovers the instance (the superstep aborted as
``crashed``), resumes the run from its last checkpoint, and checks the result against an
uninterrupted run of the same workflow. Then it forks the instance at the first checkpoint and
runs the fork with a changed order, leaving the origin as it was.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from pydantic import BaseModel

from kernel import (
    EventStore,
    ExecutionError,
    Executor,
    RecoveredRun,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    recover,
)

__all__ = ["RecoveryOutcome", "run_recovery_act"]

KILL_ENV = "STEPLOG_DEMO_KILL_AT"
"""Set in the child: the superstep in which the pipeline kills its own process."""


class Step(BaseModel):
    """The pipeline's message: the order and the stage it has reached."""

    order: str
    quantity: int
    stage: int = 1


STAGES = ("reserved", "charged", "packed", "shipped")


class Pipeline(Executor):
    """One stage per superstep: records the stage and the running total, then moves on."""

    @handler
    async def advance(self, step: Step, ctx: WorkflowContext[Step, str]) -> None:
        name = STAGES[step.stage - 1]
        ctx.set_state(name, step.quantity)
        ctx.set_state("total", ctx.get_state("total", 0) + step.quantity * step.stage)
        if os.environ.get(KILL_ENV) == str(ctx.superstep):
            os.kill(os.getpid(), signal.SIGKILL)  # mid-superstep, its writes staged
        await ctx.yield_output(f"{step.order} {name}")
        if step.stage < len(STAGES):
            await ctx.send_message(step.model_copy(update={"stage": step.stage + 1}))


def pipeline(store: EventStore, instance_id: str) -> Workflow:
    node = Pipeline("pipeline")
    return (
        WorkflowBuilder(
            start_executor=node,
            store=store,
            instance_id=instance_id,
            name="orders",
            durability="write",  # each write lands as made: the killed superstep's stay, inert
        )
        .add_edge(node, node)
        .build()
    )


class RecoveryOutcome(BaseModel):
    """What the second act found."""

    instance_id: str
    killed_by: int
    recovered: list[str]
    resumed_outputs: list[Any]
    resumed_state: dict[str, Any]
    same_as_uninterrupted: bool
    fork_id: str
    fork_state: dict[str, Any]
    origin_unchanged: bool


async def run_recovery_act(store: EventStore, url: str, instance_id: str) -> RecoveryOutcome:
    """Kill a run in a child process, recover and resume it here, then fork the instance."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        url,
        instance_id,
        env={**os.environ, KILL_ENV: "3"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, errors = await child.communicate()
    returncode = child.returncode
    if returncode != -signal.SIGKILL:
        said = errors.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
        raise ExecutionError(
            f"the demo's child process was to be killed in superstep 3, but it exited with "
            f"status {returncode} ({said[0]})"
        )
    closed: list[RecoveredRun] = recover(store, instance_id)
    wf = pipeline(store, instance_id)
    resumed = await wf.resume()
    reference_store = open_store("memory://")
    reference_wf = pipeline(reference_store, "reference")
    reference = await reference_wf.run(Step(order="A-7", quantity=2))
    state = wf.committed_state()
    before_fork = wf.events()
    first = wf.checkpoints()[0]
    fork_id = f"{instance_id}-fork"  # the third of ``demo_instances``: checked free up front
    fork = wf.fork(at=first.checkpoint_id, instance_id=fork_id)
    await fork.run(Step(order="A-7", quantity=5, stage=2))
    return RecoveryOutcome(
        instance_id=instance_id,
        killed_by=int(signal.SIGKILL),
        recovered=[f"{c.run_id} superstep {c.superstep_id}" for c in closed],
        resumed_outputs=resumed.get_outputs(),
        resumed_state=state,
        same_as_uninterrupted=(
            resumed.get_outputs() == reference.get_outputs()
            and state == reference_wf.committed_state()
        ),
        fork_id=fork_id,
        fork_state=fork.committed_state(),
        origin_unchanged=wf.events() == before_fork,
    )


def child(url: str, instance_id: str) -> None:
    """The child process: runs the pipeline until it kills itself."""
    asyncio.run(pipeline(open_store(url), instance_id).run(Step(order="A-7", quantity=2)))


# Imported by name rather than run as ``__main__``, so the messages it logs name this module.
_CHILD = "import sys; from projections.cli._demo_recovery import child; child(*sys.argv[1:3])"
