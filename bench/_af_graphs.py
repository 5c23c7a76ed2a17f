"""The same workflows in Microsoft Agent Framework (the bench extra pins 1.23.0).

Its ``ctx.set_state`` writes the workflow's shared state, committed at the end of each superstep;
``max_iterations`` bounds the supersteps. No ``from __future__ import annotations``: AF reads the
handlers' annotations to type-check edges.
"""

from typing import Any

from agent_framework import (
    Executor,
    FileCheckpointStorage,
    InMemoryCheckpointStorage,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowConvergenceException,
    handler,
)

__all__ = [
    "RESUME_WORKFLOW_NAME",
    "FileCheckpointStorage",
    "InMemoryCheckpointStorage",
    "WorkflowConvergenceException",
    "fanout_workflow",
    "loop_workflow",
    "resumable_loop_workflow",
]

RESUME_WORKFLOW_NAME = "bench-resume"


class LoopStep(Executor):
    def __init__(self, id: str, n: int) -> None:
        super().__init__(id=id)
        self.n = n

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, dict]) -> None:
        if message >= self.n:
            await ctx.yield_output(
                {"count": message, "state": {"a": ctx.get_state("a"), "b": ctx.get_state("b")}}
            )
            return
        ctx.set_state("a", message)
        ctx.set_state("b", message)
        await ctx.send_message(message + 1)


def loop_workflow(n: int, checkpoint_storage: Any = None) -> Any:
    a, b = LoopStep("a", n), LoopStep("b", n)
    return (
        WorkflowBuilder(
            max_iterations=n + 10, start_executor=a, checkpoint_storage=checkpoint_storage
        )
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )


def resumable_loop_workflow(n: int, max_iterations: int, checkpoint_storage: Any) -> Any:
    """The loop under a fixed name, with its own superstep limit.

    Checkpoints are found by workflow name (``get_latest(workflow_name=...)``), so the workflow
    that resumes must carry the name of the one that checkpointed. A run stopped by
    ``max_iterations`` before ``n`` leaves its last superstep's checkpoint with the next message
    pending: the resumable point of the resume benchmark.
    """
    a, b = LoopStep("a", n), LoopStep("b", n)
    return (
        WorkflowBuilder(
            name=RESUME_WORKFLOW_NAME,
            max_iterations=max_iterations,
            start_executor=a,
            checkpoint_storage=checkpoint_storage,
        )
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )


class FanSource(Executor):
    def __init__(self, id: str, rounds: int, keys: list[str]) -> None:
        super().__init__(id=id)
        self.rounds = rounds
        self.keys = keys

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, dict]) -> None:
        if message >= self.rounds:
            state = {k: ctx.get_state(k) for k in self.keys}
            await ctx.yield_output({"count": message, "state": state})
            return
        ctx.set_state("round", message)
        await ctx.send_message(message)


class FanWorker(Executor):
    def __init__(self, id: str, keys: int) -> None:
        super().__init__(id=id)
        self.keys = keys

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int]) -> None:
        for k in range(self.keys):
            ctx.set_state(f"{self.id}.k{k}", message)
        if self.id == "w0":
            await ctx.send_message(message + 1)


def fanout_workflow(rounds: int, width: int, keys: int) -> Any:
    names = ["round"] + [f"w{i}.k{k}" for i in range(width) for k in range(keys)]
    source = FanSource("source", rounds, names)
    workers = [FanWorker(f"w{i}", keys) for i in range(width)]
    return (
        WorkflowBuilder(max_iterations=2 * rounds + 10, start_executor=source)
        .add_fan_out_edges(source, workers)
        .add_edge(workers[0], source)
        .build()
    )
